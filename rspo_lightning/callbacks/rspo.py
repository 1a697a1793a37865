"""RSPOLoop: Reward-Swap Policy Optimization as a reusable Lightning callback (DESIGN §10).

One loop is ``2k + 1`` training batches (iterations); with ``k = 2`` the phases are::

    explore, explore, collect, exploit, exploit | (D cleared) explore, explore, ...

- **explore** (k iterations): at the loop's first iteration agent A's trainable state is
  snapshotted (parameters, optimizer and scheduler states); the module's weights are now agent
  B := A, trained on ``explorer_reward`` (``"dense"``: outcome + dense reward).
- **collect** (1 iteration, no update): B plays ``collect_groups`` task groups; every group
  enters the replay buffer D with its reward **swapped back to the outcome reward** (the dense
  reward of each stored turn is zeroed) and B's behaviour log-probs; then A is restored bitwise.
- **exploit** (k iterations): A trains on the outcome reward; each batch is (1 − α) fresh groups
  plus α groups sampled from D. Replay rows keep B's behaviour log-probs, so the module's
  generalised clip centres their ratio at c = π_old / π_B.

Mixing rule: of a batch's ``G`` groups (this rank's), ``round_half_up(α·G)`` are replaced by
replay groups (fewer when D holds fewer); e.g. G = 16, α = 1/8 gives exactly 2.

Ablations: ``explorer_reward="outcome"`` is RSPO_O (B trained on the outcome reward);
``replay_from="history"`` is RSPO_H (no B: every iteration is an exploit iteration and D holds
A's own groups of the previous iterations, FIFO up to ``capacity``).

Validation always measures A: if it runs while B is active, A is swapped in for it and B back
afterwards.

Reusable with any LightningModule that offers the ``RSPOAgent`` Protocol below and is fed
``IterationBatch``-like batches (mutable ``tasks``, ``group_size``, ``replay``,
``reward_mode``, ``policy_tag``); ``setup`` checks the Protocol and names what is missing.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any, Protocol, Sequence, runtime_checkable

import lightning.pytorch as pl

from rspo_lightning.replay import ReplayBuffer
from rspo_lightning.types import Trajectory

PHASE_CODE = {"explore": 0.0, "collect": 1.0, "exploit": 2.0}


@runtime_checkable
class RSPOAgent(Protocol):
    """What RSPOLoop needs from a LightningModule.

    Attributes:
        iteration: index of the next training batch (iterations done so far, all phases).
        dense_reward: the dense reward source used when a batch's ``reward_mode`` is ``"dense"``
            (RSPOLoop sets it when given one).
        last_trajectories: the on-policy trajectories played by the last ``training_step``.
    """

    iteration: int
    dense_reward: Any
    last_trajectories: list

    def collect(self, tasks: list, group_size: int, policy_tag: str = "A", purpose: str = "train") -> list[Trajectory]:
        """Play ``group_size`` episodes per task with the current weights; no update."""
        ...

    def snapshot_trainable(self) -> dict:
        """Copies of the trainable parameters and optimizer/scheduler states."""
        ...

    def restore_trainable(self, snapshot: dict) -> None:
        """Put a ``snapshot_trainable`` result back, bitwise."""
        ...


def check_rspo_agent(module: Any) -> None:
    """Raise TypeError naming every member of ``RSPOAgent`` that ``module`` lacks."""
    members = ["iteration", "dense_reward", "last_trajectories", "collect", "snapshot_trainable", "restore_trainable"]
    missing = [m for m in members if not hasattr(module, m)]
    if missing:
        raise TypeError(
            f"RSPOLoop needs a LightningModule offering the RSPOAgent protocol "
            f"(rspo_lightning.callbacks.rspo.RSPOAgent); {type(module).__name__} lacks {missing}"
        )


def repeat_visit_rate(trajectories: Sequence[Trajectory], window: int) -> float:
    """Exploration metric: fraction of turns whose anchor already occurred in the previous
    ``window`` turns of the same episode (lower = less looping)."""
    repeats = turns = 0
    for traj in trajectories:
        anchors = [t.anchor for t in traj.turns]
        for i, a in enumerate(anchors):
            repeats += a in anchors[max(0, i - window):i]
        turns += len(anchors)
    return repeats / turns if turns else 0.0


def replay_group_count(num_groups: int, offline_ratio: float) -> int:
    """Replay groups in a batch of ``num_groups``: α·G rounded half up."""
    return int(math.floor(offline_ratio * num_groups + 0.5))


def group_by_task(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    groups: dict[Any, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[(t.task.env_id, t.task.split, t.task.task_id, t.task.group_id)].append(t)
    return list(groups.values())


def swap_to_outcome(group: Sequence[Trajectory]) -> list[Trajectory]:
    """The reward swap: copies whose turns carry only the outcome reward (dense zeroed)."""
    return [dataclasses.replace(t, turns=[dataclasses.replace(turn, dense_reward=0.0) for turn in t.turns]) for t in group]


class RSPOLoop(pl.Callback):
    """The explore → collect → exploit loop of RSPO (arXiv 2607.04713).

    Args:
        k: iterations of B's exploration and of A's exploitation per loop (paper: 3).
        offline_ratio: α, the fraction of A's groups taken from the replay buffer (paper: 1/8).
        collect_groups: task groups B plays in the collect phase (None = all of the batch's).
        sampling: how D is sampled: ``reward`` (paper default), ``variance`` or ``random``.
        capacity: most groups D holds.
        dense_reward: dense reward source for B (None = the module's ``dense_reward``).
        explorer_reward: reward B trains on: ``dense`` (RSPO) or ``outcome`` (ablation RSPO_O).
        replay_from: ``explorer`` (RSPO) or ``history`` (ablation RSPO_H: A's own past groups).
        exploration_window: window of the repeated-anchor-visit metric.
        seed: seed of replay sampling.
    """

    def __init__(
        self,
        k: int = 3,
        offline_ratio: float = 0.125,
        collect_groups: int | None = None,
        sampling: str = "reward",
        capacity: int = 256,
        dense_reward: Any = None,
        explorer_reward: str = "dense",
        replay_from: str = "explorer",
        exploration_window: int = 4,
        seed: int = 0,
    ):
        if k < 1:
            raise ValueError(f"RSPOLoop k must be >= 1 (iterations per phase), got {k}")
        if not 0 <= offline_ratio < 1:
            raise ValueError(f"RSPOLoop offline_ratio must be in [0, 1), got {offline_ratio}; the paper uses 0.125")
        if collect_groups is not None and collect_groups < 1:
            raise ValueError(f"RSPOLoop collect_groups must be >= 1 or None (all groups of the batch), got {collect_groups}")
        if explorer_reward not in ("dense", "outcome"):
            raise ValueError(f"RSPOLoop explorer_reward must be 'dense' or 'outcome' (RSPO_O), got {explorer_reward!r}")
        if replay_from not in ("explorer", "history"):
            raise ValueError(f"RSPOLoop replay_from must be 'explorer' or 'history' (RSPO_H), got {replay_from!r}")
        if exploration_window < 1:
            raise ValueError(f"RSPOLoop exploration_window must be >= 1, got {exploration_window}")
        self.k, self.offline_ratio, self.collect_groups = k, offline_ratio, collect_groups
        self.dense_reward, self.explorer_reward, self.replay_from = dense_reward, explorer_reward, replay_from
        self.exploration_window = exploration_window
        self.buffer = ReplayBuffer(capacity=capacity, sampling=sampling, seed=seed)
        self.snapshot: dict | None = None  # agent A's trainable state while B trains
        self.counts = {"a_iterations": 0, "b_iterations": 0, "collected_groups": 0, "loops": 0}
        self._phase = "exploit"
        self._replay_frac = 0.0
        self.explored: list[Trajectory] = []

    # -- schedule -------------------------------------------------------------------------
    def phase_of(self, iteration: int) -> str:
        if self.replay_from == "history":
            return "exploit"
        pos = iteration % (2 * self.k + 1)
        return "explore" if pos < self.k else "collect" if pos == self.k else "exploit"

    # -- Lightning hooks ----------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        check_rspo_agent(pl_module)
        if self.dense_reward is not None:
            pl_module.dense_reward = self.dense_reward
        if self.replay_from == "explorer" and self.explorer_reward == "dense" and pl_module.dense_reward is None:
            raise ValueError(
                "RSPOLoop explorer_reward='dense' needs a dense reward source: pass "
                "dense_reward={class_path: rspo_lightning.rewards.EnvProgressReward} to the callback or set model.dense_reward "
                "(or use explorer_reward='outcome' for the RSPO_O ablation)"
            )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        n = pl_module.iteration
        self._phase = phase = self.phase_of(n)
        batch.replay = []
        if phase == "explore":
            if n % (2 * self.k + 1) == 0:  # a new loop: clear D, B := A
                self.buffer.clear()
                self.snapshot = pl_module.snapshot_trainable()
                self.counts["loops"] += 1
            batch.reward_mode, batch.policy_tag = self.explorer_reward, "B"
        elif phase == "collect":
            tasks = batch.tasks if self.collect_groups is None else batch.tasks[:self.collect_groups]
            played = pl_module.collect(tasks, batch.group_size, policy_tag="B", purpose="rspo_collect")
            for group in group_by_task(played):
                self.buffer.add_group(swap_to_outcome(group))
                self.counts["collected_groups"] += 1
            self.explored = played
            if self.snapshot is not None:
                pl_module.restore_trainable(self.snapshot)
            self.snapshot = None
            batch.tasks, batch.reward_mode, batch.policy_tag = [], "outcome", "B"  # no update in this iteration
        else:
            g = len(batch.tasks)
            replay = self.buffer.sample(min(replay_group_count(g, self.offline_ratio), len(self.buffer)))
            batch.tasks = batch.tasks[:g - len(replay)]
            batch.replay, batch.reward_mode, batch.policy_tag = replay, "outcome", "A"
        self._replay_frac = len(batch.replay) / max(len(batch.replay) + len(batch.tasks), 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        phase = self._phase
        if phase == "explore":
            self.counts["b_iterations"] += 1
        elif phase == "exploit":
            self.counts["a_iterations"] += 1
            if self.replay_from == "history":
                for group in group_by_task(pl_module.last_trajectories):
                    self.buffer.add_group(swap_to_outcome(group))
        played = self.explored if phase == "collect" else pl_module.last_trajectories
        pl_module.log_dict({
            "rspo/phase": PHASE_CODE[phase],
            "rspo/buffer_size": float(len(self.buffer)),
            "rspo/replay_frac": self._replay_frac,
            "rspo/buffer_success_rate": self.buffer.success_rate(),
            "rspo/a_iterations": float(self.counts["a_iterations"]),
            f"rspo/repeat_visits_{'A' if phase == 'exploit' else 'B'}": repeat_visit_rate(played, self.exploration_window),
        }, on_step=True)
        pl_module.log("phase", PHASE_CODE[phase], prog_bar=True, on_step=True, logger=False)
        self.explored = []

    # -- validation always measures agent A -----------------------------------------------------
    def on_validation_start(self, trainer, pl_module) -> None:
        self._b_state = None
        if self.snapshot is not None and not trainer.sanity_checking:  # B is active: swap A in
            self._b_state = pl_module.snapshot_trainable()
            pl_module.restore_trainable(self.snapshot)

    def on_validation_end(self, trainer, pl_module) -> None:
        if getattr(self, "_b_state", None) is not None:
            pl_module.restore_trainable(self._b_state)
            self._b_state = None

    # -- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"buffer": self.buffer.state_dict(), "snapshot": self.snapshot, "counts": dict(self.counts)}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.snapshot = state["snapshot"]
        self.counts = dict(state["counts"])
