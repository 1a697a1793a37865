"""TranscriptLogger: a few full episodes as Markdown text (TensorBoard's text plugin renders it).

Env and model text sits in fenced code blocks: Markdown shows a code block's content literally
(``<action>`` stays ``<action>``, HTML never runs), so nothing is escaped twice.
"""

from __future__ import annotations

import re

import lightning.pytorch as pl

from rspo_lightning.types import Trajectory


def _clip(text: str, max_chars: int) -> str:
    text = str(text)
    return text[:max_chars] + " [...]" if len(text) > max_chars else text


def fenced(text: str) -> str:
    """``text`` as a fenced code block, the fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def render_transcript(traj: Trajectory, tokenizer=None, max_chars: int = 2000) -> str:
    """Markdown of one episode: a header line, then per turn the observation, the model's
    response and the parsed action, each a fenced code block (truncated to ``max_chars``)."""
    split, task_id, task_type = (
        re.sub(r"[^\w.-]", "_", str(v)) for v in (traj.task.split, traj.task.task_id, traj.task_type)
    )
    lines = [
        f"**task** {split}/{task_id} ({task_type}) — success: {bool(traj.success)}, score: {traj.score:.2f}, "
        f"turns: {len(traj.turns)}",
        "",
    ]  # outside the code blocks: plain names only
    for i, turn in enumerate(traj.turns):
        response = tokenizer.decode(turn.response_ids, skip_special_tokens=True) if tokenizer is not None else ""
        lines += [
            f"**{i + 1}. observation**",
            "",
            fenced(_clip(turn.observation, max_chars)),
            "",
            f"**response** ({len(turn.response_ids)} tokens, CUT by the token budget)"
            if turn.response_cut
            else "**response**",
            "",
            fenced(_clip(response, max_chars)),
            "",
            f"**action** ({'valid' if turn.valid else 'INVALID'}, reward {turn.outcome_reward:g})",
            "",
            fenced(_clip(turn.action, max_chars)),
            "",
        ]
    return "\n".join(lines)


class TranscriptLogger(pl.Callback):
    """Writes a few training episodes every ``every_n_iterations`` through the logger's own text
    API where it has one (TensorBoard's ``add_text``, MLflow's ``log_text`` artifacts), else as
    Markdown files ``<log_dir>/transcripts/iteration<N>_episode<i>.md`` (CSVLogger, any other
    logger, or none: ``<default_root_dir>/transcripts``).

    Args:
        every_n_iterations: write transcripts every this many RL iterations.
        num_episodes: episodes per write (a success first when there is one).
        max_chars: longest text kept from any single observation/response.
    """

    def __init__(self, every_n_iterations: int = 10, num_episodes: int = 2, max_chars: int = 2000):
        if every_n_iterations < 1:
            raise ValueError(f"every_n_iterations must be >= 1, got {every_n_iterations}")
        self.every_n_iterations = every_n_iterations
        self.num_episodes = num_episodes
        self.max_chars = max_chars

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        iteration = getattr(pl_module, "iteration", trainer.global_step)
        trajs = list(getattr(pl_module, "last_trajectories", []))
        if not trajs or (iteration - 1) % self.every_n_iterations or trainer.global_rank != 0:
            return
        chosen = sorted(trajs, key=lambda t: not t.success)[: self.num_episodes]
        tok = getattr(pl_module, "tokenizer", None)
        for i, traj in enumerate(chosen):
            write_text(
                trainer,
                f"transcripts/episode_{i}",
                f"iteration{iteration}_episode{i}",
                render_transcript(traj, tok, self.max_chars),
                iteration,
            )


def write_text(trainer, tag: str, name: str, text: str, step: int) -> str:
    """Text through the first logger's text API, or a Markdown file ``<log_dir>/transcripts/<name>.md``;
    returns where it went."""
    import os

    logger = trainer.logger
    experiment = getattr(logger, "experiment", None) if logger is not None else None
    if experiment is not None and hasattr(experiment, "add_text"):  # TensorBoard
        experiment.add_text(tag, text, global_step=step)
        return "add_text"
    if experiment is not None and hasattr(experiment, "log_text") and getattr(logger, "run_id", None):  # MLflow
        experiment.log_text(logger.run_id, text, f"transcripts/{name}.md")
        return "log_text"
    root = (getattr(logger, "log_dir", None) if logger is not None else None) or trainer.default_root_dir
    folder = os.path.join(root, "transcripts")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.md")
    with open(path, "w") as f:
        f.write(text + "\n")
    return path
