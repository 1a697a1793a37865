"""AgentRLModule: the LightningModule that owns policy, value head and reference model, and runs
one RL iteration per ``training_step`` (docs/design.md §3):

collect (``RolloutEngine``) -> flatten (``batching``) -> score (``scoring``) -> advantages
(``credit.turn_advantages``) -> update (``update.ppo_update``) -> log (``metrics``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.strategies import FSDPStrategy

from rspo_lightning import advantages as adv
from rspo_lightning import credit, logprobs, metrics, partner_loss, update
from rspo_lightning.batching import FlatTurns, drop_faulty, flatten, make_train_batch
from rspo_lightning.build import build_models, build_optimizers, reference_model, shard_models, summary_line
from rspo_lightning.checkpointing import AtomicCheckpointIO, load_counters, save_counters
from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.critic import CriticConfig
from rspo_lightning.distributed import all_sum, fsdp2_modules, is_sharded, lockstep_count, no_gradient_sync
from rspo_lightning.envs import make_env
from rspo_lightning.evaluation import HeldOutEpisodes
from rspo_lightning.rewards import DenseReward, ReadsTokenIds, assign_dense_rewards
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.rspo import snapshot as agent_snapshot
from rspo_lightning.rspo.diagnostics import iteration_alpha, replay_diagnostics, replay_distance
from rspo_lightning.runtime import freeze_startup_heap, seed_rollout, unfreeze_startup_heap
from rspo_lightning.startup import DENSE_HINT, check_run
from rspo_lightning.types import IterationBatch, IterationPlan, TrainBatch, Trajectory


class AgentRLModule(HeldOutEpisodes, metrics.IterationLog, pl.LightningModule):
    """Multi-turn agent RL (GRPO/RLOO/GiGPO/... ) with rollouts inside ``training_step``.

    Logging: every ``self.log`` made during a training iteration, the module's and every
    callback's, is held by ``metrics.IterationLog`` and written once when the iteration ends, to
    every logger at step = iteration (a key not logged in an iteration has no point there).

    Args:
        policy: which language model acts and how it is loaded.
        algorithm: advantage estimator and PPO-style update settings.
        optim: optimizer and learning-rate schedule.
        rollout: generation and prompting settings of training rollouts.
        critic: the value function (built only for an estimator that needs one: ``gae``).
        env: the environment played (the CLI links it to ``data.env``: set it there).
        dense_reward: per-turn dense reward source (e.g. ``rspo_lightning.rewards.EnvProgressReward``);
            needed by A²TGPO (its per-turn signal) and by ``reward_mode: dense`` (RSPO's explorer).
        val_temperature: sampling temperature of validation episodes (verl-agent uses 0.4).
        val_greedy: also run greedy validation, logged as ``val/greedy_success_rate``.
        seed: seed of rollout sampling (tasks come from the datamodule's seed); None = the run's
            ``seed_everything`` under the CLI, 0 otherwise.
        predict_path: where ``predict`` writes its episodes (trajectory JSONL, never over an
            existing file); None = the run's folder, ``<run>/predictions/<split>-iteration<N>.jsonl``.
    """

    def __init__(
        self,
        policy: PolicyConfig = PolicyConfig(),
        algorithm: AlgorithmConfig = AlgorithmConfig(),
        optim: OptimConfig = OptimConfig(),
        rollout: RolloutConfig = RolloutConfig(),
        critic: CriticConfig = CriticConfig(),
        env: EnvConfig | None = None,
        dense_reward: DenseReward | None = None,
        val_temperature: float = 0.4,
        val_greedy: bool = False,
        seed: int | None = None,
        predict_path: str | None = None,
    ):
        super().__init__()
        # The dense source is an object (possibly a model): kept out of the checkpoint's
        # hyper-parameters, which hold only the config dataclasses allow-listed for weights_only loads.
        self.save_hyperparameters(ignore=["dense_reward"])
        self.policy_cfg, self.algo, self.optim_cfg, self.rollout_cfg = policy, algorithm, optim, rollout
        self.env_cfg, self.critic_cfg, self.dense_reward = env, critic, dense_reward
        self.estimator = adv.ESTIMATORS[algorithm.estimator]
        if self.estimator.needs_dense and dense_reward is None:
            raise ValueError(f"algorithm.estimator: {algorithm.estimator} needs a per-turn signal: {DENSE_HINT}")
        if not val_temperature > 0:  # transformers' sampler refuses 0 only at the first validation
            raise ValueError(
                f"model.val_temperature must be > 0, got {val_temperature}; for argmax validation set"
                " model.val_greedy: true (logged as val/greedy_success_rate beside the sampled one)"
            )
        self.val_temperature, self.val_greedy, self.predict_path = val_temperature, val_greedy, predict_path
        self.seed = 0 if seed is None else seed
        self.automatic_optimization = False
        self.policy = self.tokenizer = self.engine = None
        self.value_head = None  # shared critic: value head on the policy backbone
        self.critic = None  # separate (asymmetric) critic with its own backbone and optimizer
        self._ref = None  # frozen reference model: not a submodule, so never checkpointed
        self.iteration = 0
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite loss or gradient
        self.env_steps = 0  # environment steps of training rollouts so far, all ranks together
        self.episodes_dropped = 0  # training episodes left out because of environment faults (this rank)
        self.last_trajectories: list[Trajectory] = []
        self._val_sums: dict[str, list[float]] = {}  # validation metric -> [sum, count] on this rank
        self._iteration_metrics: dict[str, float] = {}  # logged in the current training iteration
        self._temperature: float | None = None  # the current iteration's sampling temperature (None: the rollout's)
        self._fsdp2_applied = False
        self._flat_sharded = False  # FSDP1: each rank holds a slice of every gradient

    # -- building ------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is None:
            self._build_models()
        if self.device_mesh is not None and not self._fsdp2_applied:  # ModelParallelStrategy: FSDP2
            if self._ref is not None:  # sharded like the policy, in the policy's dtype (fully_shard moves it)
                self._ref.to(dtype=next(self.policy.parameters()).dtype)
            shard_models(
                [self.policy, self.value_head, self.critic, self._ref],
                self.device_mesh,
                lora=self.policy_cfg.lora is not None,
            )
            self._fsdp2_applied = True

    def _build_models(self) -> None:
        built = build_models(self.policy_cfg, self.algo, self.critic_cfg, self.rollout_cfg, self.env_cfg)
        self.policy, self.tokenizer, self.value_head, self.critic, self.engine = (
            built.policy,
            built.tokenizer,
            built.value_head,
            built.critic,
            built.engine,
        )
        # the frozen reference in __dict__, not registered as a submodule: no optimizer, checkpoint,
        # DDP or FSDP1 wrapping sees it (an unsharded frozen copy on each rank); FSDP2 shards it in configure_model
        self.__dict__["_ref"] = built.reference

    def setup(self, stage: str) -> None:
        self.configure_model()
        strategy = self.trainer.strategy
        check_run(self, self.trainer)
        if isinstance(self.dense_reward, ReadsTokenIds):  # a learned reward reads the policy's token ids
            self.dense_reward.check_tokenizer(self.tokenizer)
        if self.trainer.world_size > 1:  # every rank makes as many generate calls and turns as the busiest
            self.engine.lockstep = lambda calls: lockstep_count(calls, self.device)
            self.engine.synced_gpus = is_sharded(strategy)
            self._flat_sharded = isinstance(strategy, FSDPStrategy)
        if type(strategy.checkpoint_io) is TorchCheckpointIO:  # written next to the file, renamed, checksummed
            strategy.checkpoint_io = AtomicCheckpointIO()
        freeze_startup_heap()

    def teardown(self, stage: str) -> None:
        if self.engine is not None:  # envs and their worker processes; the next rollout builds new ones
            self.engine.close()
        unfreeze_startup_heap()

    def on_fit_start(self) -> None:
        if self.trainer.is_global_zero:
            print(summary_line(self), flush=True)
        if self.engine is not None:
            self.engine.env_errors = max(self.engine.env_errors, getattr(self, "_restored_env_errors", 0))
        if self._ref is not None and not self._fsdp2_applied:  # not a submodule: the strategy's moves skip it
            self._ref.to(device=self.device, dtype=next(self.policy.parameters()).dtype)

    def set_env_kwargs(self, changes: dict) -> None:
        """Change environment keyword arguments mid-run (curriculum); new episodes use them."""
        self.env_cfg.kwargs = {**self.env_cfg.kwargs, **changes}
        make_env(self.env_cfg.env_id, **self.env_cfg.kwargs).close()  # a bad value fails here, not mid-rollout
        if self.engine is not None:
            self.engine.set_env_kwargs(self.env_cfg.kwargs)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # task specs and trajectories stay on the CPU; tensors move when used

    def configure_optimizers(self):
        return build_optimizers(self.policy, self.value_head, self.critic, self.optim_cfg, self.critic_cfg)

    def reference_model(self) -> contextlib.AbstractContextManager:
        """The frozen KL reference, entered (``models.reference_model``)."""
        return reference_model(self.policy, self._ref, lora=self.policy_cfg.lora is not None)

    # -- the iteration -------------------------------------------------------------------
    def training_step(self, batch: IterationBatch, batch_idx: int) -> None:
        # Every decision that changes the number of collective steps is taken on all-rank counts,
        # and a rank with nothing of its own still takes part (docs/distributed.md).
        plan = batch.plan
        if not plan.updates or self._all_ranks(len(batch.tasks) + len(batch.played or ()) + len(batch.replay)) == 0:
            return metrics.log_iteration(self)  # RSPO's collect: B played in RSPOLoop's hook
        watch, tokens = metrics.Stopwatch(), self.engine.stats["generated_tokens"]
        self._temperature = plan.temperature  # the rollouts' temperature, and the scores'
        with watch("rollout"):
            if batch.played is not None:  # episodes already played, with their rewards: no environment step
                self.last_trajectories = list(batch.played)
            else:
                dense = plan.reward_mode != "outcome" or self.estimator.needs_dense
                own = {} if plan.temperature is None else {"temperature": plan.temperature}
                self.last_trajectories = self.collect(
                    batch.tasks, batch.group_size, plan.policy_tag, dense=dense, **own
                )
        played = self.last_trajectories + [t for group in batch.replay for t in group]
        if self._all_ranks(len(played)) == 0:  # every episode lost to environment faults
            return metrics.log_iteration(self)
        with watch("update"):
            flat, train, result, raw, stats = self._learn(played, plan, watch, has_replay=bool(batch.replay))
        self.iteration += 1
        tokens = self.engine.stats["generated_tokens"] - tokens
        metrics.log_iteration(self, metrics.Iteration(batch, flat, train, result, raw, stats, watch.seconds, tokens))

    def _learn(self, played: list[Trajectory], plan: IterationPlan, watch: metrics.Stopwatch, has_replay: bool):
        """Flatten, credit, score and update on the iteration's episodes (on-policy then replayed)."""
        flat = flatten(played, plan.reward_mode, plan.dense_scale)
        train = self._train_batch(flat)
        with watch("advantage"):
            result, raw = credit.turn_advantages(
                flat, self.algo, train.old_values, credit=plan.credit, gamma=plan.credit_gamma
            )
        train = update.with_advantages(train, result)
        den = update.denominators(train, self.algo.loss_agg, self.device)  # J's means count every row
        alpha = iteration_alpha(plan.replay_weight, train, self.algo.loss_agg, self.device)
        probe, train = train, update.trained_rows(train, self.algo, self.estimator.needs_critic)
        stats = {"samples": float(len(train))}
        stats.update(replay_diagnostics(train, den, alpha, self.algo.loss_agg))
        if has_replay and alpha is not None:
            stats["rspo/alpha"] = alpha  # the α of this iteration's J (offline_weighting: signal sets it)
        if self._all_ranks(len(train)) > 0:
            train, mismatch = self.score(train)
            stats.update(replay_distance(train))  # after scoring: old log-probs are A's
            stats.update(self._update(train, alpha, den), **mismatch)
        else:  # nothing trains (every advantage 0): the rollout diagnostic over rows played
            stats.update(self._probe_mismatch(probe))
        return flat, train, result, raw, stats

    def collect(
        self,
        tasks: list,
        group_size: int,
        policy_tag: str = "A",
        purpose: str = "train",
        dense: bool = False,
        temperature: float | None = None,
    ) -> list[Trajectory]:
        """Play ``group_size`` episodes of every task with the current weights (the RSPO protocol).

        With ``dense`` the dense source scores every turn (``turn.dense_reward``); the episodes'
        environment steps are added to ``env_steps`` (all ranks). ``temperature``: None = the
        rollout's.
        """
        seed_rollout(self.seed, self.iteration, f"{purpose}/{policy_tag}", self.global_rank)
        played = self.engine.collect(
            tasks, group_size, iteration=self.iteration, policy_tag=policy_tag, temperature=temperature
        )
        trajectories = drop_faulty(played, self.estimator.group_relative)
        self.episodes_dropped += len(played) - len(trajectories)
        if dense:
            self._assign_dense(trajectories)
        self.env_steps += int(self._all_ranks(sum(len(t.turns) for t in trajectories)))
        return trajectories

    def _assign_dense(self, trajectories: list[Trajectory]) -> None:
        if self.dense_reward is None:
            raise ValueError(f"a dense reward mode needs a dense reward source: {DENSE_HINT}")
        assign_dense_rewards(self.dense_reward, trajectories)

    def outcome_advantages(self, trajectories: list[Trajectory]) -> list[float] | None:
        """RSPOLoop's stored advantages of B's groups (``credit.outcome_advantages``)."""
        return credit.outcome_advantages(trajectories, self.algo)

    @property
    def train_temperature(self) -> float:
        """The temperature the current iteration's rollouts were sampled at (and its rows are scored at)."""
        return self._temperature if self._temperature is not None else self.rollout_cfg.temperature

    def _dummy(self) -> TrainBatch:  # a rank without rows backwards this at weight 0
        needs = {"with_ref": self.algo.kl_coef > 0, "with_values": self.estimator.needs_critic}
        return logprobs.dummy_batch(self.engine.pad_id, **needs, with_critic_rows=self.critic is not None)

    def _all_ranks(self, count: int) -> float:
        return all_sum([count], self.device)[0]

    def score(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """``batch`` with its old (and reference) log-probs (``logprobs.score``), and the rollout's log-prob mismatch."""
        scores, mismatch = logprobs.score(
            self.policy,
            batch,
            self.train_temperature,
            self.algo.forward_batch_size,
            self._dummy(),
            recompute_old=self.algo.recompute_old_logprobs,
            device=self.device,
            reference=self.reference_model() if self.algo.kl_coef > 0 else None,
        )
        return dataclasses.replace(batch, **scores._asdict()), mismatch

    def _probe_mismatch(self, rows: TrainBatch) -> dict[str, float]:
        """``rollout/logprob_mismatch_*`` of the first ``forward_batch_size`` on-policy rows (no
        update follows); every rank takes part, a rank without rows with none."""
        if not self.algo.recompute_old_logprobs:
            return {}
        on_policy = torch.nonzero(~rows.is_replay).flatten()[: self.algo.forward_batch_size]
        return self.score(rows.select(on_policy))[1]

    def _train_batch(self, flat: FlatTurns) -> TrainBatch:
        """The padded rows of ``flat`` (none: this rank still takes part in the collective steps) with
        the critic's inputs and values V(s) before the update, when the estimator needs a critic."""
        batch = make_train_batch(flat, self.engine.pad_id) if flat.turns else self._dummy().select(torch.arange(0))
        if not self.estimator.needs_critic:
            return batch
        if self.critic is not None:
            batch = dataclasses.replace(batch, critic_rows=self.critic.input_ids(flat.turns))
        return dataclasses.replace(
            batch,
            old_values=logprobs.critic_values(
                self._values, batch, self.algo.forward_batch_size, self._dummy(), self.device
            ),
        )

    def _values(self, rows: TrainBatch) -> torch.Tensor:
        if self.critic is not None:
            return self.critic(rows.critic_rows, self.device)
        # through the policy's own forward (under FSDP2 its root unit holds the embeddings)
        return logprobs.forward(
            self.policy, rows, self.train_temperature, self.device, value_head=self.value_head
        ).values

    def _no_sync(self):
        """The context micro-batches before a minibatch's last run in (``algorithm.grad_sync``)."""
        strategy = self._trainer.strategy if self._trainer is not None else None
        once = self.algo.grad_sync == "step" or (self.algo.grad_sync == "auto" and not is_sharded(strategy))
        if not once:
            return contextlib.nullcontext
        return functools.partial(no_gradient_sync, strategy, fsdp2_modules(self))  # found once per update

    def _update(
        self, batch: TrainBatch, replay_weight: float | None = None, den: update.Denominators | None = None
    ) -> dict[str, float]:
        """``update.ppo_update`` with Lightning's backward and clipping; one scheduler step per iteration."""
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        result = update.ppo_update(
            batch,
            self.loss,
            opts[0],
            self.algo,
            dummy=self._dummy(),
            replay_weight=replay_weight,
            device=self.device,
            generator=torch.Generator().manual_seed(self.seed * 100003 + self.iteration),
            backward=self.manual_backward,
            clip=update.lightning_clip(self, self._flat_sharded),
            flat_sharded=self._flat_sharded,
            den=den,
            no_sync=self._no_sync(),
            critic_step=functools.partial(
                update.critic_step,
                self.critic,
                opts[1],
                self.critic_cfg,
                dummy=self._dummy(),
                backward=self.manual_backward,
                device=self.device,
            )
            if self.critic is not None
            else None,
        )
        self.skipped_steps += result.skipped
        self.lr_schedulers().step()
        self.engine.mark_weights_changed()
        return result.stats

    def loss(self, mb: TrainBatch, scale: update.Scale | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``update.micro_batch_loss`` of the policy's forward over ``mb``: the loss function
        ``update.ppo_update`` is given (``scale`` None: ``mb`` as one whole minibatch)."""
        swap = self.algo.swap
        fwd = logprobs.forward(
            self.policy, mb, self.train_temperature, self.device, value_head=self.value_head, with_state=swap.coef > 0
        )
        partner = (
            partner_loss.partner_coefficient(self.iteration, swap.coef, swap.warmup_iterations)
            if swap.coef > 0
            else None
        )
        return update.micro_batch_loss(
            fwd,
            mb,
            scale or update.pooled_scale(mb, self.algo.loss_agg),
            self.algo,
            partner_coef=partner,
            value_clip=self.critic_cfg.value_clip,
            value_coef=self.critic_cfg.value_coef,
            # critic warm-up: the actor does not move during the first iterations (verl's critic_warmup)
            actor_moves=self.iteration >= self.critic_cfg.warmup_iterations or not self.estimator.needs_critic,
            generator=torch.Generator().manual_seed(self.seed * 100003 + self.iteration),
        )

    def snapshot_trainable(self) -> dict:
        """RSPO's copy of agent A (``snapshot.snapshot_trainable``)."""
        return agent_snapshot.snapshot_trainable(self)

    def restore_trainable(self, snapshot: dict) -> None:
        agent_snapshot.restore_trainable(self, snapshot)
        if self.engine is not None:
            self.engine.mark_weights_changed()

    # -- checkpoint ----------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        save_counters(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        load_counters(self, checkpoint)
        agent_snapshot.agent_a_into_checkpoint(self, checkpoint)
        if self.engine is not None:  # the weights are loaded after this hook, before the next collect
            self.engine.mark_weights_changed()
