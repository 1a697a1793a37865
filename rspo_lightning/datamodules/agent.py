"""AgentDataModule: streams *what to play* (task specs, sharded by rank) and *what to replay*.

Rollouts are generated in the module's ``training_step`` (never in a DataLoader): this module
says which tasks to play each iteration, holds RSPO's replay buffer D and mixes it in.
Lightning prefetches a batch one iteration ahead, so the loader yields the task groups only; the
iteration's batch is composed when it starts (``on_after_batch_transfer``, which Lightning calls
right before ``on_train_batch_start``), so D is always current: the planner's (RSPOLoop's)
frozen ``IterationPlan`` for the iteration, and ``plan.replay_share`` of its groups drawn from D.
Task ids of iteration ``n`` are a pure function of ``(seed, n)``, so a resumed run plays the same
tasks as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Iterator
from typing import Protocol

import lightning.pytorch as pl
from torch.utils.data import DataLoader, IterableDataset

from rspo_lightning import choices
from rspo_lightning.config import EnvConfig
from rspo_lightning.envs import make_env
from rspo_lightning.rspo.buffer import ReplayBuffer, mix_replay, replay_slots
from rspo_lightning.types import IterationBatch, IterationPlan, ReplayWeight, TaskSpec


class IterationPlanner(Protocol):
    """What decides each iteration's plan (RSPOLoop)."""

    def plan(self, iteration: int) -> IterationPlan: ...


def _identity(x):
    return x


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


class _TaskStream(IterableDataset):
    """Yields ``iterations_per_epoch`` IterationBatches for the epoch the datamodule is in."""

    def __init__(self, dm: AgentDataModule):
        self.dm = dm

    def __len__(self) -> int:
        return self.dm.iterations_per_epoch

    def __iter__(self) -> Iterator[IterationBatch]:
        dm = self.dm
        epoch = dm.trainer.current_epoch if dm.trainer is not None else 0
        start = epoch * dm.iterations_per_epoch
        # A run resumed from a mid-epoch checkpoint continues at the module's next iteration
        # (Lightning restarts a non-resumable loader from its first batch).
        module = dm.trainer.lightning_module if dm.trainer is not None else None
        done = getattr(module, "iteration", start)
        first = min(max(start, done if isinstance(done, int) else start), start + dm.iterations_per_epoch)
        for n in range(first, start + dm.iterations_per_epoch):
            yield dm.iteration_batch(n)


class _ValTasks(IterableDataset):
    def __init__(self, batches: list[IterationBatch]):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


class AgentDataModule(pl.LightningDataModule):
    """Task groups to play each RL iteration, plus held-out validation tasks.

    Args:
        env: the environment (id + ``gymnasium.make`` kwargs); the module plays the same env.
        groups_per_iteration: task groups per iteration over all ranks (must divide by world size).
        group_size: episodes per task group (G); >= 2 for group-relative estimators.
        iterations_per_epoch: RL iterations per Lightning epoch (validation runs at epoch ends).
        train_split: split the training tasks come from.
        val_splits: splits validated on (``valid_seen`` and ``valid`` log as ``val/*``, others as ``val_<name>/*``).
        num_val_tasks: tasks per validation split (capped by the split size; None = all).
        val_groups_per_batch: validation tasks per ``validation_step`` (one batched rollout).
        seed: seed of task sampling; None = the run's ``seed_everything`` under the CLI, 0 otherwise.
        reward_mode: reward of the advantage: ``outcome`` (default), ``outcome+dense`` (reward
            shaping with the module's dense reward) or ``dense`` (the dense reward alone — the
            reward-hacking check). RSPOLoop overrides it per phase.
        dense_scale: multiplier of the dense reward in ``dense`` / ``outcome+dense``.
        predict_splits: what ``predict`` plays (None = what ``test`` plays); e.g. ``[train]`` to
            record episodes for a process reward model (capped at ``num_val_tasks`` tasks each).
        predict_samples: episodes ``predict`` plays per task (several: won and lost episodes of
            the same task, what a process reward model learns from).
    """

    def __init__(
        self,
        env: EnvConfig = EnvConfig(),
        groups_per_iteration: int = 16,
        group_size: int = 8,
        iterations_per_epoch: int = 10,
        train_split: str = "train",
        val_splits: list[str] = ["valid_seen", "valid_unseen"],
        num_val_tasks: int | None = 64,
        val_groups_per_batch: int = 64,
        seed: int | None = None,
        reward_mode: choices.RewardMode = "outcome",
        dense_scale: float = 1.0,
        predict_splits: list[str] | None = None,
        predict_samples: int = 1,
    ):
        super().__init__()
        if predict_samples < 1:
            raise ValueError(f"data.predict_samples must be >= 1 (episodes per task), got {predict_samples}")
        self.predict_splits = None if predict_splits is None else list(predict_splits)
        self.predict_samples = predict_samples
        choices.check("data.reward_mode", reward_mode, choices.RewardMode)
        if not dense_scale > 0:
            raise ValueError(f"data.dense_scale must be > 0, got {dense_scale}")
        self.reward_mode = reward_mode
        self.dense_scale = dense_scale
        self.replay: ReplayBuffer | None = None  # RSPO's D (attach_replay); in this module's checkpoint state
        self.planner: IterationPlanner | None = None  # decides each iteration's plan (RSPOLoop)
        if groups_per_iteration < 1:
            raise ValueError(f"data.groups_per_iteration must be >= 1, got {groups_per_iteration}")
        if group_size < 1:
            raise ValueError(f"data.group_size must be >= 1, got {group_size}")
        if iterations_per_epoch < 1:
            raise ValueError(f"data.iterations_per_epoch must be >= 1, got {iterations_per_epoch}")
        self.env = env
        self.groups_per_iteration = groups_per_iteration
        self.group_size = group_size
        self.iterations_per_epoch = iterations_per_epoch
        self.train_split = train_split
        self.val_splits = list(val_splits)
        self.num_val_tasks = num_val_tasks
        self.val_groups_per_batch = val_groups_per_batch
        self.seed = 0 if seed is None else seed
        self._num_tasks: dict[str, int] = {}
        self._probe_env()

    def _probe_env(self) -> None:
        env = make_env(self.env.env_id, **self.env.kwargs)  # fails at startup on a bad id/kwargs
        u = env.unwrapped
        for split in dict.fromkeys([self.train_split, *self.val_splits, *(self.predict_splits or [])]):
            if split not in getattr(u, "splits", (split,)):
                raise ValueError(f"split {split!r} is not offered by {self.env.env_id}; it has {list(u.splits)}")
            self._num_tasks[split] = int(u.num_tasks(split))
        if "test" in getattr(u, "splits", ()):
            self._num_tasks["test"] = int(u.num_tasks("test"))
        env.close()

    # -- rank sharding -------------------------------------------------------------------
    def _rank_world(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def setup(self, stage: str) -> None:
        _, world = self._rank_world()
        if self.groups_per_iteration % world:
            raise ValueError(
                f"data.groups_per_iteration ({self.groups_per_iteration}) must be divisible by the number of ranks ({world}); "
                f"use a multiple of {world}"
            )

    def iteration_tasks(self, n: int) -> list[TaskSpec]:
        """All ranks' task specs of iteration ``n`` (group ids unique over the run)."""
        total = self._num_tasks[self.train_split]
        rng = _rng("train", self.seed, n)
        ids = [rng.randrange(total) for _ in range(self.groups_per_iteration)]
        return [
            TaskSpec(self.env.env_id, self.train_split, tid, group_id=n * self.groups_per_iteration + g)
            for g, tid in enumerate(ids)
        ]

    def iteration_batch(self, n: int) -> IterationBatch:
        """This rank's task groups of iteration ``n`` (groups never split across ranks); its plan
        and replay are composed when the iteration starts (``compose``)."""
        rank, world = self._rank_world()
        return IterationBatch(tasks=self.iteration_tasks(n)[rank::world], group_size=self.group_size)

    def attach_replay(self, buffer: ReplayBuffer, planner: IterationPlanner) -> None:
        """Hold ``buffer`` as D (saved in this module's checkpoint state) and ask ``planner`` for
        each iteration's plan (RSPOLoop calls it in its ``setup``)."""
        self.replay, self.planner = buffer, planner

    def plan(self, n: int) -> IterationPlan:
        """Iteration ``n``'s plan: the planner's, else this module's reward settings."""
        if self.planner is not None:
            return self.planner.plan(n)
        return IterationPlan(reward_mode=self.reward_mode, dense_scale=self.dense_scale)

    def compose(self, batch: IterationBatch, n: int) -> IterationBatch:
        """Iteration ``n``'s batch: its plan, and ``plan.replay_share`` of the iteration's groups over
        all ranks drawn from D in place of on-policy groups (``rspo.buffer.mix_replay``). With
        ``slots: positive`` D may fill fewer slots: the replay weight is then α x filled / slots."""
        plan = self.plan(n)
        replay: list = []
        if plan.replay_share > 0 and self.replay is not None and len(self.replay):
            rank, world = self._rank_world()
            slots = replay_slots(
                plan.replay_share, self.groups_per_iteration, batch.group_size, self.replay.unit, rank, world
            )
            replay = self.replay.sample(slots)
            if self.replay.slots == "positive" and plan.replay_weight.rule == "alpha":
                fill = sum(len(g) for g in replay) / slots if slots else 0.0
                plan = dataclasses.replace(plan, replay_weight=ReplayWeight("alpha", plan.replay_weight.alpha * fill))
        tasks, replay = mix_replay(
            batch.tasks, replay, batch.group_size, join_online=bool(self.replay and self.replay.join_online)
        )
        return batch.replace(
            tasks=tasks, replay=replay, plan=plan, played=None if plan.episodes is None else list(plan.episodes)
        )

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Compose the iteration's batch (training batches only): called when the iteration
        starts, after the prefetch."""
        trainer = self.trainer
        if trainer is None or not trainer.training or not isinstance(batch, IterationBatch):
            return batch
        return self.compose(batch, trainer.lightning_module.iteration)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_TaskStream(self), batch_size=None, collate_fn=_identity)

    def val_tasks(self, split: str) -> list[TaskSpec]:
        total = self._num_tasks[split]
        n = total if self.num_val_tasks is None else min(self.num_val_tasks, total)
        return [TaskSpec(self.env.env_id, split, i, group_id=i) for i in range(n)]

    def test_splits(self) -> list[str]:
        """What ``test`` and ``predict`` play: the env's ``test`` split where it has one (Shop,
        WebShop), else the validation splits."""
        return ["test"] if "test" in self._num_tasks else list(self.val_splits)

    def _split_loaders(self, splits: list[str], group_size: int = 1) -> list[DataLoader]:
        rank, world = self._rank_world()
        loaders = []
        for split in splits:
            tasks = self.val_tasks(split)
            mine = tasks[rank::world]
            step = max(1, self.val_groups_per_batch)
            # Every rank yields as many batches as the rank with most tasks (empty ones past its own):
            # each validation batch is a lock-step rollout that all ranks must join.
            num_batches = -(-len(tasks[0::world]) // step)
            batches = [
                IterationBatch(tasks=mine[s * step : (s + 1) * step], group_size=group_size) for s in range(num_batches)
            ]
            loaders.append(DataLoader(_ValTasks(batches), batch_size=None, collate_fn=_identity))
        return loaders

    def val_dataloader(self) -> list[DataLoader]:
        return self._split_loaders(self.val_splits)

    def test_dataloader(self) -> list[DataLoader]:
        return self._split_loaders(self.test_splits())

    def predict_dataloader(self) -> list[DataLoader]:
        return self._split_loaders(self.predict_splits or self.test_splits(), self.predict_samples)

    def state_dict(self) -> dict:
        return {"seed": self.seed, **({"replay": self.replay.state_dict()} if self.replay is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state.get("seed", self.seed))
        if "replay" in state and self.replay is not None:
            self.replay.load_state_dict(state["replay"])
