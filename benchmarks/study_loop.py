"""``StudyRSPOLoop``: the explorer variants the RSPO study measured (docs/rspo_study.md), as a
subclass of ``rspo_lightning.callbacks.RSPOLoop``. None measured better than the paper's loop, so
they live here, beside the study, not in the package; the class doubles as the example of
extending the callback in another project: change ``plan`` (what an iteration does), the hooks
(``begin_loop``, ``explored_iteration``, ``_restore_a``) and the schedule (``loop_length``,
``phase_of``), and keep extra state in ``state_dict``.

    --trainer.callbacks.class_path=study_loop.StudyRSPOLoop    (benchmarks/ on PYTHONPATH; rspo_study.py does it)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from rspo_lightning import choices
from rspo_lightning.callbacks import RSPOLoop
from rspo_lightning.rewards import assign_dense_rewards
from rspo_lightning.rspo.loop import episode_metrics, scale_learning_rates
from rspo_lightning.trajectory_io import trajectory_from_dict, trajectory_to_dict
from rspo_lightning.types import IterationPlan, Trajectory


class StudyRSPOLoop(RSPOLoop):
    """RSPOLoop with the study's levers (every default is the paper's loop).

    Args:
        exploit_k: A's exploit iterations per loop when they differ from B's (None = k).
        dense_scale: multiplier of the dense reward in B's reward.
        buffer_from: which of B's episodes enter D: ``collect`` (the collect iteration's) or
            ``explore+collect`` (also every explore iteration's, relabelled, with their behaviour
            log-probs and their advantage under A's estimator over their group).
        collect_phase: False drops the separate collect iteration: the last explore iteration's
            rollouts are the collection (a loop is then k + exploit_k iterations).
        replay_slots: ``signal`` (any item with a non-zero stored advantage), ``positive`` (only
            trajectories with a positive stored advantage; unfilled slots go back to on-policy
            groups and the replay weight becomes α x filled / slots) or ``positive_repeat``
            (positive trajectories drawn again until the slots are full); ``positive*`` need
            ``replay_unit: trajectory``.
        explorer_lr_scale: B's learning rate as a multiple of A's (A's schedule, scaled).
        explorer_temperature: B's sampling temperature (None = the rollout's); B's update scores
            its rows at the same temperature.
        explorer_credit: ``trajectory`` (the module's estimator on B's episode return) or ``turn``
            (each turn's discounted dense return-to-go normalised over its group, γ = ``explorer_gamma``).
        explorer_gamma: discount of ``explorer_credit: turn``.
        explorer_resync_every: B := A at the start of every n-th loop (1: every loop, the paper);
            in between B continues from the previous B's weights and optimizer state.
        reuse_a_episodes: B's first explore iteration of a loop trains on A's last exploit
            iteration's episodes, rescored with B's dense reward, instead of playing new ones
            (they cost no environment step and are not stored in D again).
        **kwargs: RSPOLoop's.
    """

    def __init__(
        self,
        *args,
        exploit_k: int | None = None,
        dense_scale: float = 1.0,
        buffer_from: choices.BufferFrom = "collect",
        collect_phase: bool = True,
        replay_slots: choices.ReplaySlots = "signal",
        explorer_lr_scale: float = 1.0,
        explorer_temperature: float | None = None,
        explorer_credit: choices.ExplorerCredit = "trajectory",
        explorer_gamma: float = 0.9,
        explorer_resync_every: int = 1,
        reuse_a_episodes: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if exploit_k is not None and exploit_k < 1:
            raise ValueError(f"RSPOLoop exploit_k must be >= 1 or None (= k, the paper), got {exploit_k}")
        if not (math.isfinite(dense_scale) and dense_scale > 0):
            raise ValueError(f"RSPOLoop dense_scale must be a finite number > 0, got {dense_scale!r}")
        choices.check("RSPOLoop buffer_from", buffer_from, choices.BufferFrom)
        choices.check("replay slots", replay_slots, choices.ReplaySlots)
        if not (math.isfinite(explorer_lr_scale) and explorer_lr_scale > 0):
            raise ValueError(f"RSPOLoop explorer_lr_scale must be a finite number > 0, got {explorer_lr_scale!r}")
        if explorer_temperature is not None and not explorer_temperature > 0:
            raise ValueError(
                f"RSPOLoop explorer_temperature must be > 0 or None (the rollout's), got {explorer_temperature!r}"
            )
        choices.check("RSPOLoop explorer_credit", explorer_credit, choices.ExplorerCredit)
        if not 0 <= explorer_gamma <= 1:
            raise ValueError(f"RSPOLoop explorer_gamma must be in [0, 1], got {explorer_gamma!r}")
        if explorer_resync_every < 1:
            raise ValueError(
                f"RSPOLoop explorer_resync_every must be >= 1 (1 = B := A every loop), got {explorer_resync_every}"
            )
        if reuse_a_episodes and self.k == 1 and not collect_phase:
            raise ValueError(
                "RSPOLoop reuse_a_episodes with k=1 and collect_phase=False leaves B no episode of its own to "
                "play: keep the collect phase (collect_phase=True) or use k >= 2"
            )
        if replay_slots != "signal" and self.buffer.unit != "trajectory":
            raise ValueError(
                f"replay slots={replay_slots!r} picks single trajectories by their stored advantage: it needs "
                "unit='trajectory' (RSPOLoop replay_unit: trajectory)"
            )
        if replay_slots != "signal" and self.replay_baseline == "online":
            raise ValueError(
                f"RSPOLoop replay_slots={replay_slots!r} picks trajectories by their stored advantage, which "
                "replay_baseline='online' does not keep: use replay_baseline='collected'"
            )
        self.exploit_k = self.k if exploit_k is None else exploit_k
        self.dense_scale, self.buffer_from, self.collect_phase = dense_scale, buffer_from, collect_phase
        self.buffer.slots = self.replay_slots = replay_slots
        self.explorer_lr_scale, self.explorer_temperature = explorer_lr_scale, explorer_temperature
        self.explorer_credit, self.explorer_gamma = explorer_credit, explorer_gamma
        self.explorer_resync_every, self.reuse_a_episodes = explorer_resync_every, reuse_a_episodes
        self.b_state: dict | None = None  # a persistent B's trainable state between its phases
        self.a_last: list[Trajectory] = []  # A's last exploit episodes, rescored (reuse_a_episodes)

    # -- schedule ----------------------------------------------------------------------------
    @property
    def loop_length(self) -> int:
        return self.k + (1 if self.collect_phase else 0) + self.exploit_k

    def phase_of(self, iteration: int) -> str:
        if self.replay_from == "history":
            return "exploit"
        pos = iteration % self.loop_length
        return "explore" if pos < self.k else "collect" if self.collect_phase and pos == self.k else "exploit"

    def plan(self, iteration: int) -> IterationPlan:
        plan = super().plan(iteration)
        if plan.phase == "collect":
            return dataclasses.replace(plan, temperature=self.explorer_temperature)
        if plan.phase != "explore":
            return plan
        reused = self.reuse_a_episodes and iteration % self.loop_length == 0 and bool(self.a_last)
        return dataclasses.replace(
            plan,
            dense_scale=self.dense_scale,
            temperature=None if reused else self.explorer_temperature,  # A's episodes keep the rollout's
            credit=self.explorer_credit,
            credit_gamma=self.explorer_gamma,
            episodes=tuple(self.a_last) if reused else None,
        )

    # -- hooks ---------------------------------------------------------------------------------
    def begin_loop(self, pl_module, n: int) -> None:
        super().begin_loop(pl_module, n)
        if self.b_state is not None and (self.counts["loops"] - 1) % self.explorer_resync_every:
            pl_module.restore_trainable(self.b_state)  # a persistent B continues

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if batch.plan.phase == "explore":
            if self.explorer_lr_scale != 1.0:  # B's rate: A's schedule, scaled (B's optimizer state is discarded)
                scale_learning_rates(pl_module, self.explorer_lr_scale)
            if batch.played is not None:
                self.a_last = []

    def _restore_a(self, pl_module) -> None:
        if self.snapshot is not None and self.explorer_resync_every > 1:
            self.b_state = pl_module.snapshot_trainable()
        super()._restore_a(pl_module)

    def explored_iteration(self, pl_module, played, j, values, reused) -> None:
        last = j == self.k - 1
        if not reused and (self.buffer_from == "explore+collect" or (last and not self.collect_phase)):
            self._store(played, count=True)
        if last and not self.collect_phase:  # the last explore iteration's episodes are the collection
            values.update(episode_metrics(played, "rollout_collect", self.exploration_window))
            self._restore_a(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        exploited = self._phase == "exploit"
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if exploited and self.reuse_a_episodes:
            self.a_last = self._rescored(pl_module, pl_module.last_trajectories)

    def _rescored(self, pl_module, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
        """Copies of A's episodes (their turns too) carrying B's dense reward."""
        copies = [
            dataclasses.replace(t, turns=[dataclasses.replace(turn, dense_reward=0.0) for turn in t.turns])
            for t in trajectories
        ]
        estimator = getattr(pl_module, "estimator", None)
        if self.explorer_reward != "outcome" or getattr(estimator, "needs_dense", False):
            assign_dense_rewards(pl_module.dense_reward, copies)
        return copies

    # -- checkpoint ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**super().state_dict(), "b_state": self.b_state, "a_last": [trajectory_to_dict(t) for t in self.a_last]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.b_state = state.get("b_state")
        self.a_last = [trajectory_from_dict(t) for t in state.get("a_last", [])]
