"""Held-out episodes: the validation, test and predict hooks of ``AgentRLModule`` (a mixin).

``validate`` plays every task of the validation splits once at ``val_temperature`` (and greedily
with ``val_greedy``) and logs ``val/*`` (``val_<split>/*`` for other splits); ``test`` plays the
env's test split where it has one as ``test/*``; ``predict`` plays the same tasks as ``test`` and
writes the episodes as trajectory JSONL into the run's folder
(``<run>/predictions/<split>-iteration<N>.jsonl``, or ``predict_path``), printing a summary line.
"""

from __future__ import annotations

import os

from rspo_lightning import metrics
from rspo_lightning.distributed import merge_over_ranks
from rspo_lightning.runtime import seed_rollout
from rspo_lightning.types import IterationBatch, Trajectory


class HeldOutEpisodes:
    """Needs ``engine``, ``tokenizer``, ``seed``, ``iteration``, ``val_temperature``, ``val_greedy``,
    ``predict_path`` and a ``_val_sums`` dict (``AgentRLModule`` has them)."""

    metric_prefix = staticmethod(metrics.metric_prefix)

    def _play_held_out(self, batch: IterationBatch, batch_idx: int, stage: str) -> list[Trajectory]:
        """Play each held-out task once (validation temperature; greedy too with ``val_greedy``),
        accumulating success and score under the stage's metric prefix; returns the sampled episodes."""
        prefix = metrics.metric_prefix(batch.tasks[0].split if batch.tasks else "valid_seen", stage)
        played: list[Trajectory] = []
        for tag, greedy in [("", False)] + ([("greedy_", True)] if self.val_greedy else []):
            # common random numbers: every held-out pass of a run samples with the same stream (the
            # run's seed and the batch of tasks, not the iteration), so identical weights score
            # identically and two checkpoints differ by their weights, not by sampling noise
            seed_rollout(self.seed, 0, f"{prefix}/{tag}{batch_idx}", self.global_rank)
            trajs = self.engine.collect(
                batch.tasks, batch.group_size, temperature=self.val_temperature, greedy=greedy, iteration=self.iteration
            )  # one episode per task, several for predict_samples
            trajs = [t for t in trajs if t.env_error is None]  # an env fault is not the agent's failure
            metrics.add_held_out(self._val_sums, trajs, prefix, tag)
            if not tag:
                played = trajs
        return played

    def validation_step(self, batch: IterationBatch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._play_held_out(batch, batch_idx, "val")

    def on_validation_epoch_end(self) -> None:
        merged, self._val_sums = merge_over_ranks(self._val_sums), {}  # ranks may hold different metrics
        values = {key: total / count for key, (total, count) in sorted(merged.items()) if count > 0}
        if self.trainer.sanity_checking:
            # A full sanity check (num_sanity_val_steps: -1) runs before any update: record it as step 0.
            # (a resumed fit's sanity check measures restored weights already logged: not again)
            if (
                self.logger is not None
                and values
                and self.trainer.num_sanity_val_steps == float("inf")
                and self.iteration == 0
            ):
                self.logger.log_metrics(values, step=0)
            self.initial_val_metrics = values
            return
        # the values are already means over every rank's episodes (merge_over_ranks): the all-rank
        # mean of identical values changes none of them (one process: Lightning drops sync_dist,
        # runtime.LIGHTNING_NOTICES)
        for k, v in values.items():
            self.log(k, v, prog_bar=k == "val/success_rate", add_dataloader_idx=False, sync_dist=True)
        if values:
            self.log("step", float(self.iteration), add_dataloader_idx=False, sync_dist=True)
        fn = str(getattr(self.trainer.state.fn, "value", self.trainer.state.fn))
        if (
            values and fn in ("validate", "test") and self.global_rank == 0
        ):  # Lightning's own table: verbose=False (cli.py)
            print(metrics.results_table(values, f"{fn}: agent A at iteration {self.iteration}"), flush=True)

    def test_step(self, batch: IterationBatch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._play_held_out(batch, batch_idx, "test")  # the env's test split (or the validation splits) as test/*

    def on_test_epoch_end(self) -> None:
        self.on_validation_epoch_end()

    def on_predict_start(self) -> None:
        self._predicted: list[Trajectory] = []

    def predict_step(self, batch: IterationBatch, batch_idx: int, dataloader_idx: int = 0) -> dict[str, float]:
        trajs = self._play_held_out(batch, batch_idx, "test")
        self._predicted.extend(trajs)
        return {"episodes": float(len(trajs)), "successes": float(sum(t.success for t in trajs))}

    def on_predict_end(self) -> None:
        """Write the episodes played as trajectory JSONL, one file per split, and print a summary
        line per split (success rate and the env's score)."""
        from rspo_lightning.trajectory_io import save_trajectories

        self._val_sums = {}
        by_split: dict[str, list[Trajectory]] = {}
        for t in self._predicted:
            by_split.setdefault(t.task.split, []).append(t)
        for split, trajs in by_split.items():
            path = self._prediction_path(split)
            n = save_trajectories(path, trajs, self.tokenizer)
            print(
                f"predict {split}: {n} episodes, success rate {sum(t.success for t in trajs) / max(n, 1):.3f}, "
                f"score {sum(t.score for t in trajs) / max(n, 1):.3f}, written to {path}",
                flush=True,
            )

    def _prediction_path(self, split: str) -> str:
        """``predict_path`` (a file: ``<stem>-<split>.jsonl`` beside it when several splits are
        played) or ``<run folder>/predictions/<split>-iteration<N>.jsonl``; never an existing file
        (``-2``, ``-3`` ... are added), so no earlier prediction is overwritten."""
        rank = "" if self.trainer.world_size == 1 else f".rank{self.global_rank}"
        if self.predict_path:
            stem = self.predict_path.removesuffix(".jsonl")
            base = stem if len({t.task.split for t in self._predicted}) == 1 else f"{stem}-{split}"
        else:
            run = getattr(self, "run_dir", None) or self.trainer.log_dir or self.trainer.default_root_dir
            base = os.path.join(run, "predictions", f"{split}-iteration{self.iteration}")
        path, n = f"{base}{rank}.jsonl", 1
        while os.path.exists(path):
            n += 1
            path = f"{base}-{n}{rank}.jsonl"
        return path
