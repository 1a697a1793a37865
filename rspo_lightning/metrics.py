"""What an iteration logs: pure functions of its data (rollout, replay, update and held-out
metrics), the stopwatch of its stages (``perf/*_s``), and ``IterationLog``, the LightningModule
mixin that writes everything logged during one RL iteration once, at step = iteration."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch

from rspo_lightning.advantages import AdvantageResult
from rspo_lightning.batching import FlatTurns
from rspo_lightning.distributed import merge_over_ranks
from rspo_lightning.types import IterationBatch, TrainBatch, Trajectory


class Iteration(NamedTuple):
    """What one trained iteration logs: its batch, flat turns, trained rows, estimator result and
    advantages before an advantage-placed penalty, update statistics, stage seconds and generated tokens."""

    batch: IterationBatch
    flat: FlatTurns
    train: TrainBatch
    result: AdvantageResult
    raw: torch.Tensor
    stats: dict[str, float]
    seconds: dict[str, float]
    tokens: int


class Stopwatch:
    """Seconds per stage: ``with watch("rollout"): ...`` adds the block's wall time to
    ``watch.seconds["rollout"]``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


REPEAT_WINDOW = 4  # turns back that ``<prefix>/repeat_visits`` looks (RSPOLoop's exploration_window default)


def repeat_counts(trajectories: Sequence[Trajectory], window: int = REPEAT_WINDOW) -> tuple[int, int]:
    """(turns whose anchor already occurred in the previous ``window`` turns of the same episode,
    turns): the counts behind ``repeat_visit_rate``."""
    repeats = turns = 0
    for traj in trajectories:
        anchors = [t.anchor for t in traj.turns]
        for i, a in enumerate(anchors):
            repeats += a in anchors[max(0, i - window) : i]
        turns += len(anchors)
    return repeats, turns


def repeat_visit_rate(trajectories: Sequence[Trajectory], window: int = REPEAT_WINDOW) -> float:
    """Exploration metric: fraction of turns whose anchor already occurred in the previous
    ``window`` turns of the same episode (lower = less looping; the paper's repeated visits of a
    state within a window)."""
    repeats, turns = repeat_counts(trajectories, window)
    return repeats / turns if turns else 0.0


def rollout_sums(trajectories: Sequence[Trajectory], prefix: str) -> dict[str, list[float]]:
    """This rank's ``{metric: [sum, count]}`` of ``rollout_metrics`` (``merge_over_ranks`` adds ranks)."""
    n = len(trajectories)
    repeats, turns = repeat_counts(trajectories)
    sums = {
        f"{prefix}/success_rate": [sum(t.success for t in trajectories), n],
        f"{prefix}/score": [sum(t.score for t in trajectories), n],
        f"{prefix}/episode_len": [turns, n],
        f"{prefix}/invalid_rate": [sum(t.num_invalid for t in trajectories), turns],
        f"{prefix}/truncated_rate": [sum(turn.response_cut for t in trajectories for turn in t.turns), turns],
        f"{prefix}/dense_return": [sum(turn.dense_reward for t in trajectories for turn in t.turns), n],
        f"{prefix}/progress": [sum(t.turns[-1].progress if t.turns else t.initial_progress for t in trajectories), n],
        f"{prefix}/repeat_visits": [repeats, turns],
    }
    for t in trajectories:
        if t.task_type:
            acc = sums.setdefault(f"{prefix}/success_rate/{t.task_type}", [0, 0])
            acc[0] += t.success
            acc[1] += 1
    return {k: [float(s), float(c)] for k, (s, c) in sums.items()}


def rollout_metrics(trajectories: Sequence[Trajectory], prefix: str) -> dict[str, float]:
    """``<prefix>/success_rate``, ``score``, ``episode_len``, ``invalid_rate``, ``truncated_rate``
    (turns whose response the token budget cut), ``dense_return``, ``progress``, ``repeat_visits``
    (``repeat_visit_rate``, every run: GRPO's looping beside RSPO's) and ``success_rate/<task
    type>`` over every rank's episodes (a collective: every rank calls it, with or without
    episodes; a metric nothing counted is left out)."""
    merged = merge_over_ranks(rollout_sums(trajectories, prefix))
    return {k: v[0] / v[1] for k, v in merged.items() if v[1] > 0}


def replay_metrics(estimator_advantages: torch.Tensor, flat: FlatTurns) -> dict[str, float]:
    """What the replayed rows carry (this rank, all replayed rows): their mean |advantage| (the
    estimator's, before an advantage-placed invalid-action penalty) and the fraction at exactly 0;
    empty without replayed rows. Their shares of the rows actually trained are
    ``rspo.diagnostics.replay_diagnostics``."""
    rep = flat.is_replay
    if not bool(rep.any()):
        return {}
    a = estimator_advantages[rep]
    return {"rspo/replay_adv_abs": float(a.abs().mean()), "rspo/replay_zero_frac": float((a == 0).float().mean())}


def explained_variance(returns: torch.Tensor, values: torch.Tensor) -> float:
    """1 − Var(returns − values) / Var(returns) (0 when the returns do not vary)."""
    var = returns.var()
    return float(1 - (returns - values).var() / var) if var > 0 else 0.0


def metric_prefix(split: str, stage: str = "val") -> str:
    """One scheme for every stage (``val``, ``test``): the stage's own name for the first split
    (``valid_seen``, ``valid`` or ``test``), ``<stage>_<name>`` for another (``val_unseen``,
    ``test_unseen``)."""
    return stage if split in ("valid_seen", "valid", "test") else f"{stage}_{split.removeprefix('valid_')}"


def results_table(values: dict[str, float], title: str) -> str:
    """The held-out results as one table: a row per metric, a column per split prefix (``val``,
    ``val_unseen``), each value once; names are never cut."""
    columns: dict[str, dict[str, float]] = {}
    for key, value in values.items():
        prefix, _, name = key.partition("/")
        if name:
            columns.setdefault(prefix, {})[name] = value
    rows = sorted({name for col in columns.values() for name in col}, key=lambda n: (n.count("/"), n))
    width = max([len("metric"), *map(len, rows)])
    widths = [max(len(c), 6) for c in columns]
    lines = [title, "  ".join(["metric".ljust(width), *(c.rjust(w) for c, w in zip(columns, widths))])]
    for name in rows:
        cells = [f"{columns[c][name]:.3f}" if name in columns[c] else "-" for c in columns]
        lines.append("  ".join([name.ljust(width), *(v.rjust(w) for v, w in zip(cells, widths))]))
    return "\n".join(lines)


def add_held_out(sums: dict[str, list[float]], trajectories: Sequence[Trajectory], prefix: str, tag: str = "") -> None:
    """Add held-out episodes to ``sums`` (``{metric: [sum, count]}``; ``merge_over_ranks`` adds them
    over ranks): success and score under ``<prefix>/<tag>``, success per task type for the sampled run."""

    def add(name: str, value: float) -> None:
        acc = sums.setdefault(name, [0.0, 0.0])
        acc[0] += float(value)
        acc[1] += 1.0

    for t in trajectories:
        add(f"{prefix}/{tag}success_rate", t.success)
        add(f"{prefix}/{tag}score", t.score)
        if not tag and t.task_type:
            add(f"{prefix}/success_rate/{t.task_type}", t.success)


def iteration_metrics(it: Iteration, ppo_epochs: int) -> dict[str, float]:
    """``train/*``, ``rspo/replay_*`` and ``perf/*`` of a trained iteration (update statistics that
    already name their group, e.g. ``rollout/logprob_mismatch_max``, keep their name)."""
    values = {k if "/" in k else f"train/{k}": v for k, v in it.stats.items()}
    if it.result.returns is not None:  # a critic's: no row was dropped, so the values line up
        values["train/explained_variance"] = explained_variance(it.result.returns, it.train.old_values)
    if it.batch.replay:
        values.update(replay_metrics(it.raw, it.flat))
    trained = int(it.train.attention_mask.sum()) * ppo_epochs
    played = [turn for turn, replayed in zip(it.flat.turns, it.flat.is_replay.tolist()) if not replayed]
    values.update(
        {
            # real (unpadded) tokens each stage computed on: what benchmarks/llm_speed.py turns into FLOP/s
            "perf/prompt_tokens": float(sum(len(turn.prompt_ids) for turn in played)),
            "perf/generated_tokens": float(it.tokens),
            "perf/update_tokens": float(trained),
            "perf/update_response_tokens": float(int(it.train.response_mask.sum()) * ppo_epochs),
            "train/advantage_abs": it.result.advantages.abs().mean().item() if len(it.result.advantages) else 0.0,
            **{f"perf/{k}_s": v for k, v in it.seconds.items()},
            "perf/rollout_tokens_per_s": it.tokens / max(it.seconds["rollout"], 1e-9),
            "perf/update_tokens_per_s": trained / max(it.seconds["update"], 1e-9),
        }
    )
    return values


class IterationLog:
    """LightningModule mixin (before ``pl.LightningModule`` in the bases) that needs an
    ``iteration`` counter."""

    _iteration_metrics: dict[str, float]

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """During a training iteration every logged value (the module's and the callbacks') is kept
        for this iteration only and written once, at its end, to every logger at step = iteration:
        a key not logged in an iteration has no point there (Lightning's logger connector would
        re-emit the last value of a key logged on an earlier step). Progress bar and
        ``callback_metrics`` are updated as usual."""
        trainer = self._trainer
        if (
            trainer is not None
            and trainer.training
            and not trainer.sanity_checking
            and kwargs.get("logger", True) is not False
        ):
            if name != "step":
                self._iteration_metrics[name] = float(value)
            kwargs["logger"] = False
        super().log(name, value, *args, **kwargs)

    def _flush_iteration_metrics(self) -> None:
        logged, self._iteration_metrics = self._iteration_metrics, {}
        if logged and self._trainer is not None:
            logged["iteration"] = float(self.iteration)
            for logger in self.trainer.loggers:
                logger.log_metrics(logged, step=self.iteration)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._flush_iteration_metrics()  # after the callbacks' on_train_batch_end (Lightning calls them first)

    def on_train_epoch_end(self) -> None:
        self._flush_iteration_metrics()  # what epoch-end callbacks (e.g. Curriculum) logged


def log_iteration(self, it: Iteration | None = None) -> None:
    """``AgentRLModule``'s log of one iteration (``self``: the module): its counters always; rollout, replay, advantage, loss and speed
    metrics when it trained (a skipped iteration counts and logs the counters only)."""
    if it is None:
        self.iteration += 1
    else:
        played, prefix = self.last_trajectories, "rollout" if it.batch.plan.policy_tag == "A" else "rollout_b"
        rollout = rollout_metrics(played, prefix)  # over all ranks' episodes, on every rank
        if rollout and it.batch.played is None:  # not re-used episodes
            self.log_dict(rollout, on_step=True, batch_size=max(len(played), 1))
            if (
                it.batch.plan.policy_tag == "A"
            ):  # the progress bar: agent A's training success (RSPO's B logs rollout_b/*)
                self.log("success_A", rollout[f"{prefix}/success_rate"], prog_bar=True, on_step=True, logger=False)
        values = iteration_metrics(it, self.algo.ppo_epochs)
        values.update(
            {
                "train/lr": self.lr_schedulers().optimizer.param_groups[0]["lr"],
                "iteration": float(self.iteration),
                "train/skipped_steps": float(self.skipped_steps),
            }
        )
        if "train/policy_loss" in values:
            self.log("train/policy_loss", values.pop("train/policy_loss"), prog_bar=True, on_step=True)
        self.log_dict(values, on_step=True)
        self.log("it", float(self.iteration), prog_bar=True, on_step=True, logger=False)
    self.log_dict(
        {
            "rollout/env_errors": float(self.engine.env_errors),
            "rollout/episodes_dropped": float(self.episodes_dropped),
            "rollout/env_steps": float(self.env_steps),
            "step": float(self.iteration),
        },
        on_step=True,
    )  # Lightning's x-axis key: one point per RL iteration
