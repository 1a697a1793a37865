"""RSPOLoop: Reward-Swap Policy Optimization as a reusable Lightning callback (docs/design.md §10).

One loop is ``2k + 1`` training batches (iterations); with ``k = 2`` the phases are::

    explore, explore, collect, exploit, exploit | (D cleared) explore, explore, ...

- **explore** (k iterations): at the loop's first iteration agent A's trainable state is
  snapshotted (parameters, optimizer and scheduler states); the module's weights are now agent
  B := A, trained on ``explorer_reward`` (``"dense"``: the dense reward alone, the paper's RSPO;
  ``"outcome+dense"``; ``"outcome"``: the RSPO_O ablation).
- **collect** (1 iteration, no update): B plays ``collect_groups`` task groups; every group
  enters the replay buffer D marked replayed, so that it trains on the **outcome reward** alone
  (the reward swap, ``batching.flatten``), with B's behaviour log-probs, and each turn's advantage
  under A's estimator over the full collected group (``Turn.replay_advantage``, when the module
  offers ``outcome_advantages``); then A is restored bitwise.
- **exploit** (k iterations): A trains on the outcome reward; each batch is (1 − α) fresh groups
  plus α groups' worth of items sampled from D (``replay_unit``: whole groups, or single
  trajectories that keep their collection-time advantage). Items whose advantage is 0 on every
  turn are never drawn. Replay rows keep B's behaviour log-probs, so the module's generalised
  clip centres their ratio at c = π_old / π_B; with ``offline_weighting="alpha"`` the loss is
  (1 − α) L_on + α L_off, each part normalised on its own.

Mixing rule (``replay_groups_per_rank``): of the iteration's ``G`` groups over all ranks,
``round_half_up(α·G)`` are replay groups, split over the ranks deterministically; e.g. G = 16,
α = 1/8 gives exactly 2 on 1, 2 or 8 ranks. The data module holds D and composes each
iteration's batch from the loop's frozen ``IterationPlan`` when the iteration starts
(``AgentDataModule.attach_replay`` / ``compose``); this callback decides the phase and plays
B's collection, nothing else.

Ablations: ``explorer_reward="outcome"`` is RSPO_O (B trained on the outcome reward);
``replay_from="history"`` is RSPO_H (no B: every iteration is an exploit iteration and D holds
A's own groups of the previous iterations, FIFO up to ``capacity``).

Validation always measures A: if it runs while B is active, A is swapped in for it and B back
afterwards.

Reusable with any LightningModule that offers the ``RSPOAgent`` Protocol below and reads each
``IterationBatch``'s ``plan``, with a data module that offers ``ReplayData``; ``setup`` checks
both and names what is missing. Extended (explorer variants) by subclassing: see
benchmarks/study_loop.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl

from rspo_lightning import choices
from rspo_lightning.metrics import repeat_visit_rate
from rspo_lightning.rspo.buffer import ReplayBuffer
from rspo_lightning.rspo.snapshot import (  # noqa: F401  (re-exported: the helpers any RSPOAgent can use)
    _optimizers,
    _schedulers,
    agent_a_into_checkpoint,
    restore_trainable,
    snapshot_trainable,
)
from rspo_lightning.types import IterationPlan, ReplayWeight, Trajectory

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
        """Play ``group_size`` episodes per task with the current weights; no update. Called with a
        ``temperature=`` keyword too when ``explorer_temperature`` is set."""
        ...

    # Optional: ``outcome_advantages(trajectories) -> list[float] | None``, one advantage per turn
    # (in trajectory/turn order) under the module's estimator with the outcome reward, or None when
    # the estimator is not group-relative. Stored in D; needed by ``replay_unit="trajectory"``.

    def snapshot_trainable(self) -> dict:
        """Copies of the trainable parameters and optimizer/scheduler states."""
        ...

    def restore_trainable(self, snapshot: dict) -> None:
        """Put a ``snapshot_trainable`` result back, bitwise."""
        ...


@runtime_checkable
class ReplayData(Protocol):
    """What RSPOLoop needs from the data module: to hold D and ask the loop for each iteration's
    plan (``AgentDataModule.attach_replay``), and to compose every batch from that plan."""

    def attach_replay(self, buffer: ReplayBuffer, planner: Any) -> None: ...


def check_rspo_agent(module: Any) -> None:
    """Raise TypeError naming every member of ``RSPOAgent`` that ``module`` lacks."""
    members = ["iteration", "dense_reward", "last_trajectories", "collect", "snapshot_trainable", "restore_trainable"]
    missing = [m for m in members if not hasattr(module, m)]
    if missing:
        raise TypeError(
            f"RSPOLoop needs a LightningModule offering the RSPOAgent protocol "
            f"(rspo_lightning.rspo.RSPOAgent); {type(module).__name__} lacks {missing}"
        )


def episode_metrics(trajectories: Sequence[Trajectory], prefix: str, window: int) -> dict[str, float]:
    """``<prefix>/success_rate``, ``progress`` (final subgoal progress) and ``repeat_visits`` of the
    episodes one policy played (this rank); empty without episodes."""
    if not trajectories:
        return {}
    n = len(trajectories)
    return {
        f"{prefix}/success_rate": sum(t.success for t in trajectories) / n,
        f"{prefix}/progress": sum(t.turns[-1].progress if t.turns else t.initial_progress for t in trajectories) / n,
        f"{prefix}/repeat_visits": repeat_visit_rate(trajectories, window),
    }


def scale_learning_rates(module: pl.LightningModule, scale: float) -> None:
    """Set every optimizer's learning rates to the scheduler's current ones times ``scale``."""
    for opt, sched in zip(_optimizers(module), _schedulers(module) or [None] * len(_optimizers(module))):
        opt = getattr(opt, "optimizer", opt)
        rates = sched.get_last_lr() if sched is not None else [g.get("initial_lr", g["lr"]) for g in opt.param_groups]
        for group, lr in zip(opt.param_groups, rates):
            group["lr"] = lr * scale


def check_length_neutral(source: Any, explorer_reward: str) -> None:
    """Under ``explorer_reward: dense`` no outcome bounds B's return: a dense source that pays a
    bonus per valid turn would let a long failure out-earn a short win. Refused at startup."""
    if (
        explorer_reward == "dense"
        and getattr(source, "grounding_mode", None) == "bonus"
        and getattr(source, "grounding", 0) > 0
    ):
        raise ValueError(
            f"RSPOLoop explorer_reward='dense' with {type(source).__name__}(grounding={source.grounding}, grounding_mode='bonus'): "
            f"with no outcome in B's reward, {source.grounding} per valid turn lets a long failure out-earn a short win. "
            "Use grounding_mode: penalty (the default: -grounding per invalid turn, the same per-turn contrast) or "
            "explorer_reward: outcome+dense"
        )


def group_by_task(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    groups: dict[Any, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[(t.task.env_id, t.task.split, t.task.task_id, t.task.group_id)].append(t)
    return list(groups.values())


class RSPOLoop(pl.Callback):
    """The explore → collect → exploit loop of RSPO (arXiv 2607.04713), and its ablations.

    Args:
        k: iterations of B's exploration per loop, and of A's exploitation (paper: 3).
        offline_ratio: α, the share of A's groups taken from the replay buffer and the weight of
            the replay part of the loss (paper: 1/8).
        collect_groups: task groups B plays in the collect phase (None = all of the batch's).
        sampling: how D is sampled: ``reward`` (paper default), ``variance`` or ``random``.
        capacity: most groups D holds.
        dense_reward: dense reward source for B (None = the module's ``dense_reward``; a
            ``NoisyReward`` for the dense-reward noise σ ablation).
        explorer_reward: reward B trains on: ``dense`` (the dense reward alone: the paper's RSPO),
            ``outcome+dense`` (reward shaping) or ``outcome`` (the RSPO_O ablation).
        replay_from: ``explorer`` (RSPO), ``history`` (ablation RSPO_H: A's own past groups, no
            B) or ``both`` (B's trajectories plus A's own groups of the current and the previous
            loop's exploit iterations).
        replay_unit: what one replay draw takes: ``group`` (a whole stored group) or
            ``trajectory`` (one trajectory); α·G groups' worth of trajectories fill the slots.
        replay_baseline: what a replayed trajectory's advantage is taken against: ``collected``
            (its full collected group, computed when stored; items whose advantage is 0 on every
            turn are never drawn) or ``online`` (A's own on-policy group on the same task in the
            iteration it is replayed: that group plays the replayed task, and the replay joins it).
        offline_weighting: ``alpha``: J = (1 − α) J_on + α J_off, each part the mean over the
            iteration's rows of its kind (the paper's J); ``tokens``: one pooled token-mean;
            ``signal`` (an adaptive α): the same J with α_t = the replayed rows' share of the
            iteration's signal-carrying tokens, recomputed every iteration
            (``rspo.diagnostics.iteration_alpha``; α still sets the replay slots). Logged as ``rspo/alpha``.
        exploration_window: window of the repeated-anchor-visit metric.
        seed: seed of replay sampling.
        collect_baseline: a diagnostic: after B's collection, the restored A plays the same tasks
            with the same group size, so B's collection success is compared with A's on the
            same tasks (``rollout_collect_a/*``, ``rspo/collect_minus_a`` = B's success minus
            A's). A's episodes are neither stored nor trained, and their environment steps are
            left out of the module's ``env_steps`` (the budget) and logged apart
            (``rspo/collect_baseline_env_steps``).

    The clip centre of replayed rows is the module's (``algorithm.clip_mode``, ``clip_max_centre``);
    the fair end of a budgeted run is ``at_loop_end`` (``EnvStepBudget``). Variants of the loop
    (B's learning rate, temperature, credit, a persistent B, ...) extend this class the way
    benchmarks/study_loop.py does: override ``plan``, the hooks, ``loop_length``/``phase_of``.
    """

    restores_agent_a = True  # snapshot.agent_a_into_checkpoint: a fit with the loop restores A itself

    def __init__(
        self,
        k: int = 3,
        offline_ratio: float = 0.125,
        collect_groups: int | None = None,
        sampling: choices.Sampling = "reward",
        capacity: int = 256,
        dense_reward: Any = None,
        explorer_reward: choices.ExplorerReward = "dense",
        replay_from: choices.ReplayFrom = "explorer",
        replay_unit: choices.ReplayUnit = "trajectory",
        replay_baseline: choices.ReplayBaseline = "collected",
        offline_weighting: choices.OfflineWeighting = "alpha",
        exploration_window: int = 4,
        seed: int = 0,
        collect_baseline: bool = False,
    ):
        if k < 1:
            raise ValueError(f"RSPOLoop k must be >= 1 (iterations per phase), got {k}")
        if not 0 <= offline_ratio < 1:
            raise ValueError(f"RSPOLoop offline_ratio must be in [0, 1), got {offline_ratio}; the paper uses 0.125")
        if collect_groups is not None and collect_groups < 1:
            raise ValueError(
                f"RSPOLoop collect_groups must be >= 1 or None (all groups of the batch), got {collect_groups}"
            )
        choices.check("RSPOLoop explorer_reward", explorer_reward, choices.ExplorerReward, " ('outcome' = RSPO_O)")
        choices.check("RSPOLoop replay_from", replay_from, choices.ReplayFrom, " (history = RSPO_H)")
        choices.check("RSPOLoop replay_baseline", replay_baseline, choices.ReplayBaseline)
        choices.check("RSPOLoop offline_weighting", offline_weighting, choices.OfflineWeighting)
        if exploration_window < 1:
            raise ValueError(f"RSPOLoop exploration_window must be >= 1, got {exploration_window}")
        self.k, self.offline_ratio, self.collect_groups = k, offline_ratio, collect_groups
        self.dense_reward, self.explorer_reward, self.replay_from = dense_reward, explorer_reward, replay_from
        self.offline_weighting, self.replay_baseline = offline_weighting, replay_baseline
        self.exploration_window, self.collect_baseline = exploration_window, collect_baseline
        # With the online baseline a replay's advantage is only known once A has played its task.
        self.buffer = ReplayBuffer(
            capacity=capacity,
            sampling=sampling,
            seed=seed,
            unit=replay_unit,
            skip_zero_advantage=replay_baseline == "collected",
            join_online=replay_baseline == "online",
        )
        self.snapshot: dict | None = None  # agent A's trainable state while B trains
        self.counts = {"a_iterations": 0, "b_iterations": 0, "collected_groups": 0, "loops": 0}
        self._phase = "exploit"
        self._replay_frac = 0.0
        self._advantages = None  # the module's outcome_advantages, if it offers one
        self.explored: list[Trajectory] = []
        self.baseline: list[Trajectory] = []  # A's episodes on the collection's tasks (collect_baseline)
        self._baseline_steps = 0

    # -- schedule -------------------------------------------------------------------------
    @property
    def loop_length(self) -> int:
        """Iterations of one loop: k explore + 1 collect + k exploit."""
        return 2 * self.k + 1

    def phase_of(self, iteration: int) -> str:
        if self.replay_from == "history":
            return "exploit"
        pos = iteration % self.loop_length
        return "explore" if pos < self.k else "collect" if pos == self.k else "exploit"

    def at_loop_end(self, iterations_done: int) -> bool:
        """Whether ``iterations_done`` iterations end a loop (A restored after a completed exploit
        phase): where ``EnvStepBudget`` may stop an RSPO run. Every iteration under RSPO_H."""
        return self.replay_from == "history" or iterations_done % self.loop_length == 0

    @property
    def replay_weight(self) -> ReplayWeight:
        """How A's J weighs the replayed rows (``offline_weighting``, α = ``offline_ratio``)."""
        return ReplayWeight(self.offline_weighting, self.offline_ratio)

    def plan(self, iteration: int) -> IterationPlan:
        """The frozen plan of ``iteration``: B on its reward in ``explore`` (and ``collect``, where
        it only plays), A on the outcome reward with ``offline_ratio`` of its groups from D in
        ``exploit``. The data module asks for it when the iteration starts (before this
        callback's ``on_train_batch_start``) and composes the batch with it."""
        phase = self.phase_of(iteration)
        if phase == "explore":
            return IterationPlan(phase, "B", self.explorer_reward, replay_weight=self.replay_weight)
        if phase == "collect":
            return IterationPlan(phase, "B", "outcome", replay_weight=self.replay_weight)
        return IterationPlan(phase, "A", "outcome", replay_weight=self.replay_weight, replay_share=self.offline_ratio)

    # -- Lightning hooks ----------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        check_rspo_agent(pl_module)
        if self.dense_reward is not None:
            pl_module.dense_reward = self.dense_reward
        if self.replay_from != "history" and self.explorer_reward != "outcome" and pl_module.dense_reward is None:
            raise ValueError(
                f"RSPOLoop explorer_reward={self.explorer_reward!r} needs a dense reward source: pass "
                "dense_reward={class_path: rspo_lightning.rewards.EnvProgressReward} (YAML) or "
                "RSPOLoop(dense_reward=rspo_lightning.rewards.EnvProgressReward()) (Python), or set model.dense_reward "
                "(or use explorer_reward='outcome' for the RSPO_O ablation)"
            )
        check_length_neutral(pl_module.dense_reward, self.explorer_reward)
        self._advantages = getattr(pl_module, "outcome_advantages", None)
        if self.buffer.unit == "trajectory" and self._advantages is None:
            raise TypeError(
                f"RSPOLoop replay_unit='trajectory' needs the module's outcome_advantages(trajectories) "
                f"(the advantage of each stored turn over its full group); {type(pl_module).__name__} lacks it: "
                "add it or use replay_unit='group'"
            )
        if trainer is None:  # checked alone (tests of the Protocol)
            return
        dm = trainer.datamodule
        if not isinstance(dm, ReplayData):
            raise TypeError(
                f"RSPOLoop needs a data module that holds the replay buffer D and mixes it into A's batches "
                f"(rspo_lightning.datamodules.AgentDataModule, or one offering rspo_lightning.rspo.loop.ReplayData's "
                f"attach_replay); the trainer's is {type(dm).__name__ if dm is not None else None}: pass "
                "trainer.fit(module, datamodule=AgentDataModule(...))"
            )
        dm.attach_replay(self.buffer, self)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        n, plan = pl_module.iteration, batch.plan
        self._phase = plan.phase
        if plan.phase == "explore" and n % self.loop_length == 0:
            self.begin_loop(pl_module, n)
        elif plan.phase == "collect":
            tasks = batch.tasks if self.collect_groups is None else batch.tasks[: self.collect_groups]
            temperature = {} if plan.temperature is None else {"temperature": plan.temperature}
            played = pl_module.collect(tasks, batch.group_size, policy_tag="B", purpose="rspo_collect", **temperature)
            self._store(played, count=True)
            self.explored = played
            self._restore_a(pl_module)
            if self.collect_baseline:
                self._play_baseline(pl_module, tasks, batch.group_size, temperature)
        replayed = sum(len(g) for g in batch.replay)
        played_n = len(batch.tasks) * batch.group_size if plan.updates and batch.played is None else 0
        self._replay_frac = replayed / max(replayed + played_n, 1)

    def _play_baseline(self, pl_module, tasks: list, group_size: int, temperature: dict) -> None:
        """A (restored) plays the collection's tasks: a diagnostic, its steps outside the budget."""
        before = getattr(pl_module, "env_steps", None)
        self.baseline = pl_module.collect(
            tasks, group_size, policy_tag="A", purpose="rspo_collect_baseline", **temperature
        )
        if before is not None:
            self._baseline_steps = pl_module.env_steps - before
            pl_module.env_steps = before

    def begin_loop(self, pl_module, n: int) -> None:
        """A new loop at iteration ``n``: D cleared (A's own recent groups stay under
        ``replay_from: both``), A's trainable state snapshotted, B := A."""
        self.buffer.retain(
            lambda g: self.replay_from == "both" and g[0].policy_tag == "A" and g[0].iteration >= n - self.loop_length
        )
        self.snapshot = pl_module.snapshot_trainable()
        self.counts["loops"] += 1

    def _restore_a(self, pl_module) -> None:
        if self.snapshot is not None:
            pl_module.restore_trainable(self.snapshot)
        self.snapshot = None

    def _store(self, trajectories: Sequence[Trajectory], count: bool) -> None:
        """Add the groups to D (marked replayed: they train on the outcome reward alone,
        ``batching.flatten``) with each turn's advantage under A's estimator over its full group,
        at collection time."""
        groups = [self.buffer.add_group(g) for g in group_by_task(trajectories)]
        if self._advantages is not None and groups:
            flat = [t for g in groups for t in g]
            values = self._advantages(flat)
            if values is not None:
                turns = [turn for t in flat for turn in t.turns]
                if len(values) != len(turns):
                    raise ValueError(f"outcome_advantages returned {len(values)} values for {len(turns)} turns")
                for turn, a in zip(turns, values):
                    turn.replay_advantage = float(a)
        self.counts["collected_groups"] += count * len(groups)

    def explored_iteration(self, pl_module, played: list[Trajectory], j: int, values: dict, reused: bool) -> None:
        """After B_j's explore iteration (``played``: its episodes; ``reused``: episodes played
        earlier, not B's own); ``values`` are logged. The paper's loop stores nothing here."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        phase, n = self._phase, pl_module.iteration - 1  # the iteration just done
        values: dict[str, float] = {}
        played = pl_module.last_trajectories
        if phase == "explore":
            self.counts["b_iterations"] += 1
            j = n % self.loop_length  # which of B's explore iterations: B_j played, then was updated
            reused = batch.played is not None  # episodes played earlier are logged as whoever played them
            if not reused:
                values.update(episode_metrics(played, f"rollout_b{j}", self.exploration_window))
            self.explored_iteration(pl_module, played, j, values, reused)
        elif phase == "collect":
            values.update(episode_metrics(self.explored, "rollout_collect", self.exploration_window))
            if self.collect_baseline and self.baseline and self.explored:
                values.update(episode_metrics(self.baseline, "rollout_collect_a", self.exploration_window))
                values["rspo/collect_minus_a"] = (
                    values["rollout_collect/success_rate"] - values["rollout_collect_a/success_rate"]
                )
                values["rspo/collect_baseline_env_steps"] = float(self._baseline_steps)
            self.baseline = []
        else:
            self.counts["a_iterations"] += 1
            if self.replay_from in ("history", "both"):
                self._store(played, count=False)
            values["rspo/repeat_visits_A"] = repeat_visit_rate(played, self.exploration_window)
        pl_module.log_dict(
            {
                **values,
                "rspo/phase": PHASE_CODE[phase],
                "rspo/buffer_size": float(len(self.buffer)),
                "rspo/buffer_signal_items": float(self.buffer.num_candidates()),
                "rspo/buffer_wins": float(self.buffer.num_wins()),
                "rspo/buffer_used_frac": self.buffer.used_fraction(),
                "rspo/replay_frac": self._replay_frac,
                "rspo/buffer_success_rate": self.buffer.success_rate(),
                "rspo/a_iterations": float(self.counts["a_iterations"]),
            },
            on_step=True,
        )
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
        return {"snapshot": self.snapshot, "counts": dict(self.counts)}  # D: the data module's state

    def load_state_dict(self, state: dict) -> None:
        if "buffer" in state:  # a checkpoint from before issue 45 kept D here: into the data module's D
            self.buffer.load_state_dict(state["buffer"])
        self.snapshot = state["snapshot"]
        self.counts = dict(state["counts"])
