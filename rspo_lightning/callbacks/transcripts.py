"""TranscriptLogger: a few full episodes as TensorBoard text, escaped so model text can't inject markup."""

from __future__ import annotations

import html

import lightning.pytorch as pl

from rspo_lightning.types import Trajectory


def render_transcript(traj: Trajectory, tokenizer=None, max_chars: int = 2000) -> str:
    """Markdown of one episode; every piece of env/model text is HTML-escaped and truncated."""

    def esc(text: str) -> str:
        text = str(text)
        if len(text) > max_chars:
            text = text[:max_chars] + " [...]"
        return html.escape(text).replace("\n", "  \n")

    lines = [
        f"**task** {esc(traj.task.split)}/{traj.task.task_id} ({esc(traj.task_type)}) — "
        f"success: {traj.success}, score: {traj.score:.2f}, turns: {len(traj.turns)}  "
    ]
    for i, turn in enumerate(traj.turns):
        response = tokenizer.decode(turn.response_ids, skip_special_tokens=True) if tokenizer is not None else ""
        lines.append(f"**{i + 1}. observation:** {esc(turn.observation)}  ")
        lines.append(f"**response:** `{esc(response)}` → **action:** {esc(turn.action)} "
                     f"({'valid' if turn.valid else 'INVALID'}, reward {turn.outcome_reward:g})  ")
    return "\n".join(lines)


class TranscriptLogger(pl.Callback):
    """Writes a few training episodes as TensorBoard text every ``every_n_iterations``.

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
        experiment = getattr(trainer.logger, "experiment", None)
        if experiment is None or not hasattr(experiment, "add_text"):
            return
        chosen = sorted(trajs, key=lambda t: not t.success)[: self.num_episodes]
        tok = getattr(pl_module, "tokenizer", None)
        for i, traj in enumerate(chosen):
            experiment.add_text(f"transcripts/episode_{i}", render_transcript(traj, tok, self.max_chars), global_step=iteration)
