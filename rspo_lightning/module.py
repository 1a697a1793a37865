"""AgentRLModule: the LightningModule that owns policy, value-head slot and reference model.

One ``training_step`` = one RL iteration (DESIGN §3):
rollout -> reward -> score (old/ref log-probs) -> advantage -> ppo_epochs x minibatches -> log.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import math
import os
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch.distributed.tensor import DTensor

from rspo_lightning import advantages as adv
from rspo_lightning import losses, partner_loss
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from rspo_lightning.batching import FlatTurns, flatten, make_train_batch, positions_from_mask
from rspo_lightning.checkpointing import AtomicCheckpointIO, IterationCheckpoint
from rspo_lightning.config import GROUP_RELATIVE, AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.critic import CriticConfig, SeparateCritic
from rspo_lightning.distributed import all_max, all_sum, gather_values, is_sharded, merge_over_ranks, shard_fsdp2, world_size
from rspo_lightning.envs import make_env
from rspo_lightning.losses import response_token_logprobs
from rspo_lightning.policy import ValueHead, apply_lora, frozen_copy, hidden_size_of, load_policy
from rspo_lightning.prompts import template_texts
from rspo_lightning.rewards import DenseReward, assign_dense_rewards
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.types import IterationBatch, Trajectory, TrainBatch


_HEAP_FROZEN = False  # by freeze_startup_heap, and not given back yet

log = logging.getLogger(__name__)


def freeze_startup_heap() -> None:
    """Leave the heap built so far (torch, transformers, the models, the envs: ~440k objects with
    the tiny model) out of every later garbage collection: a full collection then scans only what
    the run allocates, instead of pausing a rollout ~0.35 s every few iterations
    (docs/benchmarks.md). ``AgentRLModule.setup`` calls it, ``teardown`` gives the heap back.

    A heap this function froze for a run that crashed (Lightning runs no ``teardown`` hook after
    an exception) is given back first; a process that froze objects itself is left as it is.
    """
    global _HEAP_FROZEN
    unfreeze_startup_heap()
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True


def unfreeze_startup_heap() -> None:
    """Give the heap frozen by ``freeze_startup_heap`` back to the collector (no-op otherwise)."""
    global _HEAP_FROZEN
    if _HEAP_FROZEN:
        gc.unfreeze()
        _HEAP_FROZEN = False


def term_weights(on_size: float, off_size: float, replay_weight: float | None) -> tuple[float, float]:
    """Weights of the on-policy and the replayed part of a minibatch's policy loss, each part
    being the mean over its own rows/tokens. ``replay_weight`` α: (1 − α, α), J = (1 − α) J_on +
    α J_off; a minibatch holding one part alone gives it weight 1. None: the parts' shares of the
    pooled count, i.e. one token-mean over all rows (each part weighs its token share)."""
    if on_size <= 0 or off_size <= 0:
        return (1.0 if on_size > 0 else 0.0), (1.0 if off_size > 0 else 0.0)
    if replay_weight is None:
        total = on_size + off_size
        return on_size / total, off_size / total
    return 1.0 - replay_weight, replay_weight


class AgentRLModule(pl.LightningModule):
    """Multi-turn agent RL (GRPO/RLOO/GiGPO/... ) with rollouts inside ``training_step``.

    Args:
        policy: which language model acts and how it is loaded.
        algorithm: advantage estimator and PPO-style update settings.
        optim: optimizer and learning-rate schedule.
        rollout: generation and prompting settings of training rollouts.
        critic: the value function (built only for ``algorithm.estimator: gae``).
        env: environment config; None = take it from the datamodule (``data.env``).
        dense_reward: per-turn dense reward source (e.g. ``rspo_lightning.rewards.EnvProgressReward``);
            needed by A²TGPO (its per-turn signal) and by ``reward_mode: dense`` (RSPO's explorer).
        val_temperature: sampling temperature of validation episodes (verl-agent uses 0.4).
        val_greedy: also run greedy validation, logged as ``val/greedy_success_rate``.
        seed: seed of rollout sampling (tasks come from the datamodule's seed).
        predict_path: where ``predict`` writes its episodes (trajectory JSONL); None =
            ``<trainer.default_root_dir>/predictions.jsonl``.
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
        seed: int = 0,
        predict_path: str | None = None,
    ):
        super().__init__()
        # The dense source is an object (possibly a model): kept out of the checkpoint's
        # hyper-parameters, which hold only the config dataclasses allow-listed for weights_only loads.
        self.save_hyperparameters(ignore=["dense_reward"])
        self.policy_cfg, self.algo, self.optim_cfg, self.rollout_cfg = policy, algorithm, optim, rollout
        self.env_cfg = env
        self.critic_cfg = critic
        self.dense_reward = dense_reward
        if algorithm.estimator == "a2tgpo" and dense_reward is None:
            raise ValueError(
                "algorithm.estimator: a2tgpo needs a per-turn signal: set model.dense_reward, e.g. "
                "{class_path: rspo_lightning.rewards.EnvProgressReward} in YAML, or "
                "AgentRLModule(dense_reward=rspo_lightning.rewards.EnvProgressReward()) in Python"
            )
        self.val_temperature = val_temperature
        self.val_greedy = val_greedy
        self.seed = seed
        self.predict_path = predict_path
        self.automatic_optimization = False
        self.policy = None
        self.tokenizer = None
        self.value_head = None  # shared critic: value head on the policy backbone
        self.critic = None  # separate (asymmetric) critic with its own backbone and optimizer
        self._ref = None  # frozen reference model: not a submodule, so never checkpointed
        self.engine: RolloutEngine | None = None
        self.iteration = 0
        self.skipped_steps = 0  # optimizer steps skipped for a non-finite loss or gradient
        self.env_steps = 0  # environment steps of training rollouts so far, all ranks together
        self.episodes_dropped = 0  # training episodes left out because of environment faults (this rank)
        self.last_trajectories: list[Trajectory] = []
        self._val_sums: dict[str, list[float]] = {}  # validation metric -> [sum, count] on this rank
        self._iteration_metrics: dict[str, float] = {}  # logged in the current training iteration
        self._fsdp2_applied = False
        self._flat_sharded = False  # FSDP1: each rank holds a slice of every gradient

    # -- building ------------------------------------------------------------------------
    def _resolve_env(self) -> EnvConfig:
        if self.env_cfg is None:
            dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
            if dm is None or not hasattr(dm, "env"):
                raise ValueError("AgentRLModule needs an env: pass env=EnvConfig(...) or use a datamodule with an `env` attribute (AgentDataModule)")
            self.env_cfg = dm.env
        return self.env_cfg

    def configure_model(self) -> None:
        if self.policy is None:
            self._build_models()
        if self.device_mesh is not None and not self._fsdp2_applied:  # ModelParallelStrategy: FSDP2
            if self.policy_cfg.lora is not None:
                raise ValueError("policy.lora is not supported with ModelParallelStrategy (FSDP2): use trainer.strategy: ddp "
                                 "(the frozen base weights are then one copy per GPU) or configs/trainer/fsdp.yaml")
            for module in (self.policy, self.value_head, self.critic):
                if module is not None:
                    shard_fsdp2(module, self.device_mesh)
            self._fsdp2_applied = True

    def _build_models(self) -> None:
        env_cfg = self._resolve_env()
        corpus = None
        if self.policy_cfg.source == "tiny":
            env = make_env(env_cfg.env_id, **env_cfg.kwargs)
            corpus = env.unwrapped.sample_texts() + template_texts() + [self.rollout_cfg.system_prompt]
        self.policy, self.tokenizer = load_policy(
            self.policy_cfg.source,
            gguf_file=self.policy_cfg.gguf_file,
            tiny=self.policy_cfg.tiny,
            corpus=corpus,
            trust_remote_code=self.policy_cfg.trust_remote_code,
        )
        if self.policy_cfg.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        self.policy.config.use_cache = True
        if self.policy_cfg.lora is not None:
            self.policy = apply_lora(self.policy, self.policy_cfg.lora)
        elif self.algo.kl_coef > 0:
            # with LoRA the reference is the adapter-disabled policy. Held in __dict__, not registered
            # as a submodule: no optimizer, checkpoint, DDP or FSDP wrapping sees it (an unsharded
            # frozen copy on each rank).
            self.__dict__["_ref"] = frozen_copy(self.policy)
        if self.algo.estimator == "gae":
            if self.critic_cfg.kind == "shared":
                self.value_head = ValueHead(hidden_size_of(self.policy))
            else:
                self.critic = SeparateCritic(self.critic_cfg, self.policy, self.tokenizer)
        self.engine = RolloutEngine(self.policy, self.tokenizer, self.rollout_cfg, env_cfg.kwargs)

    def setup(self, stage: str) -> None:
        self.configure_model()
        strategy = self.trainer.strategy
        if (self.critic is not None and isinstance(strategy, DDPStrategy)
                and not strategy._ddp_kwargs.get("find_unused_parameters", False)):
            raise ValueError("critic.kind: separate under trainer.strategy: ddp needs DDP's unused-parameter search (the "
                             "critic and the policy step apart): use trainer.strategy: ddp_find_unused_parameters_true")
        if self.trainer.world_size > 1:  # every rank makes as many generate calls and turns as the busiest
            self.engine.lockstep = lambda calls: all_max(calls, self.device)
            self.engine.synced_gpus = is_sharded(self.trainer.strategy)
            self._flat_sharded = isinstance(self.trainer.strategy, FSDPStrategy)
        dm = getattr(self.trainer, "datamodule", None)
        group_size = getattr(dm, "group_size", None)
        if group_size is not None and group_size < 2 and self.algo.estimator in GROUP_RELATIVE:
            raise ValueError(
                f"data.group_size must be >= 2 for the group-relative estimator {self.algo.estimator!r}, got {group_size}; "
                "raise data.group_size or use algorithm.estimator: gae"
            )
        mode = getattr(dm, "reward_mode", "outcome")
        if mode != "outcome" and self.dense_reward is None:
            raise ValueError(f"data.reward_mode: {mode} needs a dense reward source: set model.dense_reward, e.g. "
                             "{class_path: rspo_lightning.rewards.EnvProgressReward} in YAML, or "
                             "AgentRLModule(dense_reward=rspo_lightning.rewards.EnvProgressReward()) in Python")

        if self.rollout_cfg.backend == "vllm" and not self.algo.recompute_old_logprobs:
            log.warning("rollout.backend: vllm with algorithm.recompute_old_logprobs: false trains with vLLM's log-probs as "
                        "the old policy's; its kernels differ from the trainer's (bf16 on GPUs: ~1e-2): keep it true")
        self._check_step_knobs()
        if type(strategy.checkpoint_io) is TorchCheckpointIO:  # written next to the file, renamed, checksummed
            strategy.checkpoint_io = AtomicCheckpointIO()
        freeze_startup_heap()

    def _check_step_knobs(self) -> None:
        """Lightning's step counters count optimizer steps (several per RL iteration, none in some):
        refuse the knobs that would silently mean something else than iterations."""
        trainer = self.trainer
        if trainer.state.fn == "fit" and trainer.max_steps not in (-1, None):
            raise ValueError(
                f"trainer.max_steps ({trainer.max_steps}) counts optimizer steps, not RL iterations (one iteration takes "
                f"ppo_epochs x minibatches steps, RSPO's collect iteration none); set the run length in iterations: "
                f"data.iterations_per_epoch x trainer.max_epochs (or the EnvStepBudget callback), and leave max_steps at -1")
        for cb in trainer.checkpoint_callbacks:
            if getattr(cb, "_every_n_train_steps", 0) and not isinstance(cb, IterationCheckpoint):
                raise ValueError(
                    f"ModelCheckpoint(every_n_train_steps={cb._every_n_train_steps}) counts optimizer steps, not RL iterations; "
                    "use rspo_lightning.checkpointing.IterationCheckpoint(every_n_iterations=N) (the CLI's checkpoint.every_n_iterations) "
                    "or every_n_epochs (an epoch is data.iterations_per_epoch iterations)")

    def teardown(self, stage: str) -> None:
        if self.engine is not None:  # envs and their worker processes; the next rollout builds new ones
            self.engine.close()
        unfreeze_startup_heap()

    def on_fit_start(self) -> None:
        if self.engine is not None:
            self.engine.env_errors = max(self.engine.env_errors, getattr(self, "_restored_env_errors", 0))
        if self._ref is not None:  # not a submodule, so the strategy's device/precision moves skip it
            self._ref.to(device=self.device, dtype=next(self.policy.parameters()).dtype)

    def set_env_kwargs(self, changes: dict) -> None:
        """Change environment keyword arguments mid-run (curriculum); new episodes use them."""
        env_cfg = self._resolve_env()
        env_cfg.kwargs = {**env_cfg.kwargs, **changes}
        make_env(env_cfg.env_id, **env_cfg.kwargs).close()  # a bad value fails here, not mid-rollout
        if self.engine is not None:
            self.engine.set_env_kwargs(env_cfg.kwargs)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # task specs and trajectories stay on the CPU; tensors move when used

    def configure_optimizers(self):
        oc = self.optim_cfg
        groups = [{"params": [p for p in self.policy.parameters() if p.requires_grad]}]
        if self.value_head is not None:
            groups.append({"params": list(self.value_head.parameters()), "lr": self.critic_cfg.lr})
        opt = torch.optim.AdamW(groups, lr=oc.lr, betas=oc.betas, weight_decay=oc.weight_decay)
        sched = {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, oc.lr_factor), "interval": "step"}
        if self.critic is None:
            return {"optimizer": opt, "lr_scheduler": sched}
        critic_opt = torch.optim.AdamW([p for p in self.critic.parameters() if p.requires_grad], lr=self.critic_cfg.lr)
        return [opt, critic_opt], [sched]

    # -- log-probs -----------------------------------------------------------------------
    def sequence_logprobs(self, model, batch: TrainBatch, temperature: float, with_entropy: bool = False,
                          with_values: bool = False, with_state: bool = False):
        """``(logprobs [n, T], entropy [n, T] or None, shared-head values [n] or None)`` of the response
        window; with ``with_state`` a fourth item, the hidden state at the last prompt token ``[n, H]``."""
        ids = batch.input_ids.to(self.device)
        attn = batch.attention_mask.to(self.device)
        window = batch.response_mask.shape[1]
        pos = positions_from_mask(attn)
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=window + 1, use_cache=False,
                    output_hidden_states=with_values or with_state)
        values = state = None
        if with_values or with_state:
            hidden = out.hidden_states[-1]
            state = hidden[torch.arange(len(ids), device=hidden.device), batch.value_positions.to(hidden.device)].float()
            values = self.value_head(state) if with_values else None
        logits = out.logits[:, :-1].float()
        allowed = batch.allowed_ids.to(self.device) if batch.allowed_ids is not None else None
        lp, ent = response_token_logprobs(logits, ids[:, -window:], temperature, allowed)
        mask = batch.response_mask.to(self.device)
        lp = torch.where(mask, lp, torch.zeros_like(lp))
        ent = torch.where(mask, ent, torch.zeros_like(ent))
        if with_state:
            return lp, (ent if with_entropy else None), values, state
        return lp, (ent if with_entropy else None), values

    @contextlib.contextmanager
    def reference_model(self):
        """The frozen KL reference: the LoRA policy with its adapters disabled, or a frozen copy."""
        if self.policy_cfg.lora is not None:
            with self.policy.disable_adapter():
                yield self.policy
        else:
            yield self._ref

    @torch.no_grad()
    def _score(self, batch: TrainBatch) -> dict[str, float]:
        """Fill ``old_logprobs`` (and ``ref_logprobs``) by no-grad forwards in chunks; returns
        the behaviour/old log-prob mismatch (when old log-probs are recomputed).

        On-policy rows get behaviour := old, so the generalised centre c = pi_old / pi_behaviour
        is exactly 1 there (plain PPO); replay rows keep their behaviour log-probs from B.
        """
        rows = torch.arange(len(batch))
        if not self.algo.recompute_old_logprobs:
            rows = rows[batch.is_replay]
        was_training = self.policy.training
        self.policy.eval()
        if self.algo.kl_coef > 0:
            batch.ref_logprobs = torch.zeros_like(batch.old_logprobs)
            with self.reference_model() as ref:
                self._fill_logprobs(ref, batch, torch.arange(len(batch)), batch.ref_logprobs)
        self._fill_logprobs(self.policy, batch, rows, batch.old_logprobs)
        if was_training:
            self.policy.train()
        on_policy = ~batch.is_replay
        mismatch = self._logprob_mismatch(batch, on_policy) if self.algo.recompute_old_logprobs else {}
        batch.behaviour_logprobs[on_policy] = batch.old_logprobs[on_policy]
        return mismatch

    def _logprob_mismatch(self, batch: TrainBatch, rows: torch.Tensor) -> dict[str, float]:
        """``rollout/logprob_mismatch_{max,mean}``: |rollout behaviour log-prob − training forward|
        over the on-policy response tokens (all ranks): ~1e-6 with the hf backend; vLLM's kernels
        differ from the trainer's."""
        mask = batch.response_mask[rows]
        delta = (batch.old_logprobs[rows] - batch.behaviour_logprobs[rows]).abs()[mask]
        ranks = gather_values([float(delta.sum()), float(delta.numel()), float(delta.max()) if delta.numel() else 0.0], self.device)
        return {"rollout/logprob_mismatch_max": float(ranks[:, 2].max()),
                "rollout/logprob_mismatch_mean": float(ranks[:, 0].sum() / ranks[:, 1].sum().clamp(min=1.0))}

    def _fill_logprobs(self, model, batch: TrainBatch, rows: torch.Tensor, target: torch.Tensor) -> None:
        """``target[rows]`` := log-probs under ``model``, in chunks (a chunk's window may be narrower).
        Every rank forwards as many chunks as the busiest one (dummies past its own)."""
        chunks = list(rows.split(self.algo.forward_batch_size)) if len(rows) else []
        for i in range(self._max(len(chunks))):
            if i >= len(chunks):
                self.sequence_logprobs(model, self._dummy_batch(), self.rollout_cfg.temperature)
                continue
            chunk = chunks[i]
            lp = self.sequence_logprobs(model, batch.select(chunk), self.rollout_cfg.temperature)[0].cpu()
            target[chunk] = 0.0
            target[chunk, target.shape[1] - lp.shape[1]:] = lp

    def _max(self, count: int) -> int:
        """``count`` agreed over ranks: the maximum, so that every rank runs as many collective steps."""
        return all_max(count, self.device) if world_size() > 1 else count

    def _sum(self, *values: float) -> list[float]:
        return all_sum(values, self.device)

    def _dummy_batch(self) -> TrainBatch:
        """One two-token row with one response token: what a rank forwards (at weight 0) when another
        rank has more chunks or micro-batches than it has."""
        pad, zero = self.engine.pad_id, torch.zeros(1)
        return TrainBatch(
            input_ids=torch.full((1, 2), pad, dtype=torch.long), attention_mask=torch.ones(1, 2, dtype=torch.long),
            response_mask=torch.ones(1, 1, dtype=torch.bool), behaviour_logprobs=torch.zeros(1, 1),
            old_logprobs=torch.zeros(1, 1), advantages=zero, returns=zero, clip_eps=torch.ones(1),
            is_replay=torch.zeros(1, dtype=torch.bool), value_positions=torch.zeros(1, dtype=torch.long),
            ref_logprobs=torch.zeros(1, 1) if self.algo.kl_coef > 0 else None,
            old_values=zero if self.algo.estimator == "gae" else None,
            critic_rows=[[pad]] if self.critic is not None else None,
        )

    # -- advantages ----------------------------------------------------------------------
    def compute_advantages(self, flat: FlatTurns, values: torch.Tensor | None = None):
        """Per-turn ``(advantages, clip multipliers or None, returns or None)`` of the estimator.

        Replayed rows that carry a collection-time ``replay_advantage`` (RSPO) train with it; the
        invalid-action penalty is then subtracted from every invalid turn.
        """
        advantages, clip_eps, returns = self._estimate(flat, values)
        if bool(flat.is_replay.any()):
            stored = [t.replay_advantage for t in flat.turns]
            has = torch.tensor([a is not None for a in stored]) & flat.is_replay
            if bool(has.any()):
                value = torch.tensor([0.0 if a is None else a for a in stored], dtype=advantages.dtype)
                advantages = torch.where(has, value, advantages)
        # Invalid-action penalty: applied after the estimator, to the invalid turn alone.
        advantages = advantages - self.algo.invalid_action_penalty * flat.invalid.float()
        return advantages, clip_eps, returns

    def _estimate(self, flat: FlatTurns, values: torch.Tensor | None = None):
        name = self.algo.estimator
        kw = dict(self.algo.estimator_kwargs)
        if name == "gae":
            kw["values"] = values
        if name in ("gigpo", "proxmo"):
            kw["anchors"] = flat.anchors
        if name == "proxmo":
            kw["success"] = flat.success
        if name == "a2tgpo":
            kw["signals"] = flat.dense
            kw["epsilon"] = 1.0  # returned clip_eps is then a multiplier of clip_eps_low/high
        result = adv.compute_advantages(name, rewards=flat.rewards, traj_index=flat.traj_index,
                                        group_index=flat.group_index, turn_index=flat.turn_index, **kw)
        clip_eps = getattr(result, "clip_eps", None)
        returns = getattr(result, "returns", None)
        advantages = result.advantages if isinstance(result, tuple) else result
        return advantages, clip_eps, returns

    def outcome_advantages(self, trajectories: list[Trajectory]) -> list[float] | None:
        """Each turn's advantage (trajectory/turn order) under the estimator with the outcome
        reward, over the groups as given, without the invalid-action penalty; None for a
        non-group-relative estimator (its replayed rows are scored by the critic when trained).
        RSPOLoop stores these with B's collected groups (``Turn.replay_advantage``)."""
        if self.algo.estimator not in GROUP_RELATIVE or not trajectories:
            return None
        flat = flatten(trajectories, "outcome")
        return self._estimate(flat)[0].tolist()

    @torch.no_grad()
    def critic_values(self, batch: TrainBatch) -> torch.Tensor:
        """V(s) ``[N]`` of every row before the update (shared head or separate critic); in lock-step
        over ranks like ``_fill_logprobs``."""
        chunks = list(torch.arange(len(batch)).split(self.algo.forward_batch_size)) if len(batch) else []
        out = []
        for i in range(self._max(len(chunks))):
            part = batch.select(chunks[i]) if i < len(chunks) else self._dummy_batch()
            if self.critic is not None:
                values = self.critic(part.critic_rows, self.device).cpu()
            else:  # through the policy's own forward (under FSDP2 its root unit holds the embeddings)
                values = self.sequence_logprobs(self.policy, part, self.rollout_cfg.temperature, with_values=True)[2].cpu()
            if i < len(chunks):
                out.append(values)
        return torch.cat(out) if out else torch.zeros(0)

    # -- the iteration -------------------------------------------------------------------
    def _seed_rollout(self, purpose: str) -> None:
        """Seed the sampling RNG from (seed, iteration, purpose, rank): a resumed run replays the
        same samples as an uninterrupted one, whatever ran before."""
        code = sum(ord(c) * 31 ** i for i, c in enumerate(purpose)) % 1_000_003
        torch.manual_seed(((self.seed * 1_000_003 + self.iteration) * 1_000_003 * 64 + code * 64 + self.global_rank) % (2**63 - 1))

    def collect(self, tasks: list, group_size: int, policy_tag: str = "A", purpose: str = "train",
                dense: bool = False) -> list[Trajectory]:
        """Play ``group_size`` episodes of every task with the current weights (the RSPO protocol).

        With ``dense`` the dense source scores every turn (``turn.dense_reward``); the episodes'
        environment steps are added to ``env_steps`` (all ranks).
        """
        self._seed_rollout(f"{purpose}/{policy_tag}")
        played = self.engine.collect(tasks, group_size, iteration=self.iteration, policy_tag=policy_tag)
        trajectories = self._drop_faulty(played)
        self.episodes_dropped += len(played) - len(trajectories)
        if dense:
            if self.dense_reward is None:
                raise ValueError("a dense reward mode needs a dense reward source: set model.dense_reward, e.g. "
                                 "{class_path: rspo_lightning.rewards.EnvProgressReward} in YAML, or "
                                 "AgentRLModule(dense_reward=rspo_lightning.rewards.EnvProgressReward()) in Python")
            assign_dense_rewards(self.dense_reward, trajectories)
        self.env_steps += int(self._sum(sum(len(t.turns) for t in trajectories))[0])
        return trajectories

    def _drop_faulty(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Leave out episodes whose environment failed. A group-relative estimator computes the
        group's baseline over its remaining episodes; a group left with fewer than 2 is dropped
        whole (no baseline)."""
        if not any(t.env_error is not None for t in trajectories):
            return trajectories
        clean = [t for t in trajectories if t.env_error is None]
        if self.algo.estimator not in GROUP_RELATIVE:
            return clean
        sizes: dict[int, int] = {}
        for t in clean:
            sizes[t.task.group_id] = sizes.get(t.task.group_id, 0) + 1
        return [t for t in clean if sizes[t.task.group_id] >= 2]

    def snapshot_trainable(self) -> dict:
        """Copies of every trainable parameter, the optimizers' and the schedulers' states (RSPO
        keeps agent A here while B trains; restored bitwise by ``restore_trainable``)."""
        scheds = self.lr_schedulers() if self._trainer is not None else None
        scheds = [] if scheds is None else (scheds if isinstance(scheds, list) else [scheds])
        return {
            "params": {n: p.detach().clone() for n, p in self.named_parameters() if p.requires_grad},
            "optimizers": [copy.deepcopy(getattr(o, "optimizer", o).state_dict()) for o in self._optimizers()],
            "schedulers": [copy.deepcopy(s.state_dict()) for s in scheds],
        }

    @torch.no_grad()
    def restore_trainable(self, snapshot: dict) -> None:
        params = dict(self.named_parameters())
        missing = set(snapshot["params"]) - set(params)
        if missing:
            raise ValueError(f"snapshot has parameters this module lacks: {sorted(missing)[:5]}")
        for name, value in snapshot["params"].items():
            params[name].copy_(value)
        for opt, state in zip(self._optimizers(), snapshot["optimizers"]):
            # the wrapped torch optimizer: LightningOptimizer.load_state_dict does not drop state
            # that the snapshot lacks (e.g. Adam moments created after an empty snapshot)
            getattr(opt, "optimizer", opt).load_state_dict(copy.deepcopy(state))
        scheds = self.lr_schedulers()
        scheds = [] if scheds is None else (scheds if isinstance(scheds, list) else [scheds])
        for sched, state in zip(scheds, snapshot["schedulers"]):
            sched.load_state_dict(copy.deepcopy(state))
        if self.engine is not None:
            self.engine.mark_weights_changed()

    def training_step(self, batch: IterationBatch, batch_idx: int) -> None:
        # With several ranks, every decision below that changes the number of collective steps
        # (generate calls, forwards, backwards, optimizer steps) is taken on all-rank counts, and a
        # rank with nothing of its own still takes part (docs/distributed.md).
        if self._sum(len(batch.tasks) + len(batch.replay))[0] == 0:  # nothing to play or train (e.g. RSPO's collect iteration)
            return self._skip_iteration()
        t0 = time.perf_counter()
        gen_tokens0 = self.engine.stats["generated_tokens"]
        dense = batch.reward_mode != "outcome" or self.algo.estimator == "a2tgpo"
        trajectories = self.collect(batch.tasks, batch.group_size, policy_tag=batch.policy_tag, dense=dense)
        rollout_s = time.perf_counter() - t0
        gen_tokens = self.engine.stats["generated_tokens"] - gen_tokens0
        self.last_trajectories = trajectories
        replay = [t for group in batch.replay for t in group]
        all_trajs = trajectories + replay
        if self._sum(len(all_trajs))[0] == 0:  # every episode lost to environment faults: nothing to train on
            return self._skip_iteration()

        t1 = time.perf_counter()
        flat = flatten(all_trajs, batch.reward_mode, batch.dense_scale)
        if flat.turns:
            train_batch = make_train_batch(flat, self.engine.pad_id, torch.zeros(len(flat.turns)))
        else:  # nothing of its own: this rank still takes part in the collective steps below
            train_batch = self._dummy_batch().select(torch.arange(0))
        values = None
        if self.algo.estimator == "gae":
            if self.critic is not None:
                train_batch.critic_rows = self.critic.input_ids(flat.turns)
            values = train_batch.old_values = self.critic_values(train_batch)
        t_adv = time.perf_counter()
        advantages = torch.zeros(0)
        if flat.turns:
            advantages, clip_eps, returns = self.compute_advantages(flat, values)
            train_batch.advantages = advantages.float()
            if clip_eps is not None:
                train_batch.clip_eps = clip_eps.float()
            if returns is not None:
                train_batch.returns = returns.float()
                var = returns.var()
                self.log("train/explained_variance", float(1 - (returns - values).var() / var) if var > 0 else 0.0, on_step=True)
        advantage_s = time.perf_counter() - t_adv
        if batch.replay:
            self._log_replay(advantages, flat)
        if (self.algo.drop_zero_advantage and self.algo.kl_coef == 0 and self.algo.entropy_coef == 0
                and self.algo.estimator != "gae"):
            train_batch = train_batch.select(torch.nonzero(advantages != 0).flatten())
        self.log("train/samples", float(len(train_batch)), on_step=True)
        stats = {}
        if self._sum(len(train_batch))[0] > 0:
            self.log_dict(self._score(train_batch), on_step=True)
            stats = self._update(train_batch, batch.replay_weight)
        update_s = time.perf_counter() - t1
        trained_tokens = int(train_batch.attention_mask.sum()) * self.algo.ppo_epochs

        self.iteration += 1
        self._log_rollout(trajectories, prefix="rollout" if batch.policy_tag == "A" else "rollout_b")
        for k, v in stats.items():
            self.log(f"train/{k}", v, on_step=True, prog_bar=k == "policy_loss")
        self.log_dict({
            "train/advantage_abs": advantages.abs().mean().item() if len(advantages) else 0.0,
            "train/lr": self._optimizers()[0].param_groups[0]["lr"],
            "perf/rollout_s": rollout_s,
            "perf/update_s": update_s,
            "perf/advantage_s": advantage_s,
            "rollout/env_steps": float(self.env_steps),
            "perf/rollout_tokens_per_s": gen_tokens / max(rollout_s, 1e-9),
            "perf/update_tokens_per_s": trained_tokens / max(update_s, 1e-9),
            "iteration": float(self.iteration),
            "train/skipped_steps": float(self.skipped_steps),
            "rollout/env_errors": float(self.engine.env_errors),
            "rollout/episodes_dropped": float(self.episodes_dropped),
            "step": float(self.iteration),  # Lightning's x-axis key: curves are plotted per RL iteration
        }, on_step=True)
        self.log("it", float(self.iteration), prog_bar=True, on_step=True, logger=False)

    def _skip_iteration(self) -> None:
        """Count an iteration that trained nothing and log its counters."""
        self.iteration += 1
        self.log_dict({"rollout/env_errors": float(self.engine.env_errors), "rollout/episodes_dropped": float(self.episodes_dropped),
                       "rollout/env_steps": float(self.env_steps), "step": float(self.iteration)}, on_step=True)

    def _optimizers(self):
        opts = self.optimizers()
        return opts if isinstance(opts, list) else [opts]

    def _update(self, batch: TrainBatch, replay_weight: float | None = None) -> dict[str, float]:
        """``ppo_epochs`` x minibatches of optimizer steps (one ``lr_scheduler`` step per iteration).

        Every rank takes the same number of optimizer steps and micro-batch backwards (DDP
        all-reduces gradients in each backward): a rank short of samples backwards a dummy at
        weight 0. Each loss term of a minibatch is normalised by its token (``token-mean``) or row
        count summed over ranks, times the world size, so DDP's / FSDP's gradient mean equals the
        gradient of one process on the union of the ranks' minibatches. With ``replay_weight`` α
        the policy loss is (1 − α) L_on + α L_off, the on-policy and the replayed rows each
        normalised by their own all-rank count (a minibatch holding only one part uses it whole).
        """
        opts = self._optimizers()
        opt = opts[0]
        critic_opt = opts[1] if len(opts) > 1 else None
        algo = self.algo
        n = len(batch)
        world = world_size()
        gen = torch.Generator().manual_seed(self.seed * 100003 + self.iteration)
        num_minibatches = self._max(math.ceil(n / algo.minibatch_size))
        sums: dict[str, float] = {}
        count = 0
        for _ in range(algo.ppo_epochs):
            perm = torch.randperm(n, generator=gen)
            for mb_idx in torch.tensor_split(perm, num_minibatches):
                opt.zero_grad()
                mb = batch.select(mb_idx)
                micro = algo.micro_batch_size or max(len(mb), 1)
                parts = [mb.select(torch.arange(s, min(len(mb), s + micro))) for s in range(0, len(mb), micro)]
                counts = gather_values([*self._loss_sizes(mb), len(parts), len(mb)], self.device)  # [world, 4]
                t_on, t_off = float(counts[:, 0].sum()), float(counts[:, 1].sum())
                num_parts, rows = int(counts[:, 2].max()), float(counts[:, 3].sum())
                w_on, w_off = term_weights(t_on, t_off, replay_weight)
                mb_stats: dict[str, float] = {}
                for i in range(num_parts):
                    own = i < len(parts)
                    part = parts[i] if own else self._dummy_batch()
                    s_on, s_off = self._loss_sizes(part) if own else (0.0, 0.0)
                    scale = {  # each term's weight: its part's share of the all-rank minibatch
                        "pg_on": w_on * s_on / max(t_on, 1.0), "pg_off": w_off * s_off / max(t_off, 1.0),
                        "pooled": (s_on + s_off) / max(t_on + t_off, 1.0),
                        "on": s_on / max(t_on, 1.0),
                    }
                    loss, st = self._loss(part, scale)
                    self.manual_backward(loss * world)
                    share = scale["pooled"]
                    for k, v in st.items():
                        mb_stats[k] = mb_stats.get(k, 0.0) + (float(v) * share if own else 0.0)
                norm = self._grad_norm([p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None])
                keys = sorted(mb_stats)
                agreed = self._sum(*(mb_stats[k] for k in keys), 0.0 if math.isfinite(norm) else 1.0)
                if agreed[-1] > 0 or not all(math.isfinite(v) for v in agreed):
                    # A non-finite loss or gradient on any rank never reaches the weights: every rank
                    # skips this step.
                    opt.zero_grad()
                    self.skipped_steps += 1
                    continue
                for k, v in zip(keys, agreed):
                    sums[k] = sums.get(k, 0.0) + v
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + norm
                if algo.max_grad_norm > 0 and self._flat_sharded:
                    # Lightning's norm clipping refuses FSDP1; its root module clips over all shards
                    self.trainer.strategy.model.clip_grad_norm_(algo.max_grad_norm)
                elif algo.max_grad_norm > 0:  # through Lightning, so precision plugins and strategies apply
                    self.clip_gradients(opt, gradient_clip_val=algo.max_grad_norm, gradient_clip_algorithm="norm")
                opt.step()
                if critic_opt is not None:
                    sums["value_loss"] = sums.get("value_loss", 0.0) + self._separate_critic_step(mb, critic_opt, rows)
                count += 1
        self.lr_schedulers().step()
        self.engine.mark_weights_changed()
        return {k: v / max(count, 1) for k, v in sums.items()}

    def _loss_sizes(self, batch: TrainBatch) -> tuple[float, float]:
        """What the loss of ``batch``'s on-policy and replayed rows averages over: response tokens
        (token-mean) or rows."""
        rep = batch.is_replay
        if self.algo.loss_agg == "token-mean":
            per_row = batch.response_mask.sum(-1).float()
            return float(per_row[~rep].sum()), float(per_row[rep].sum())
        return float((~rep).sum()), float(rep.sum())

    def _grad_norm(self, grads: list[torch.Tensor]) -> float:
        """Gradient norm over all ranks' shards (DTensor shards under FSDP2, flat shards under FSDP1)."""
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        if self._flat_sharded:
            return math.sqrt(self._sum(float(norm) ** 2)[0])
        return float(norm)

    def _separate_critic_step(self, mb: TrainBatch, critic_opt, rows: float) -> float:
        """One step of the asymmetric critic on ``mb``; its value loss is averaged over the ``rows``
        of the minibatch on all ranks (a rank without rows backwards a dummy at weight 0)."""
        critic_opt.zero_grad()
        part = mb if len(mb) else self._dummy_batch()
        values = self.critic(part.critic_rows, self.device)
        loss = losses.value_loss(values, part.old_values.to(self.device), part.returns.to(self.device), self.critic_cfg.value_clip)
        weight = len(mb) * world_size() / max(rows, 1.0)
        self.manual_backward(loss * self.critic_cfg.value_coef * weight)
        critic_opt.step()
        return float(loss) if len(mb) else 0.0

    def _loss(self, mb: TrainBatch, scale: dict[str, float] | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The weighted loss of one micro-batch and its diagnostics (means over its own rows).

        ``scale`` weighs each term by the micro-batch's share of the minibatch (``_update``):
        ``pg_on`` / ``pg_off`` the policy loss of the on-policy / replayed rows, ``on`` the terms
        estimated on the learner's own rows (KL and entropy with ``replay_regularisers: exclude``),
        ``pooled`` every other term. None: ``mb`` is a whole minibatch under one pooled mean.
        """
        if scale is None:
            s_on, s_off = self._loss_sizes(mb)
            w_on, w_off = term_weights(s_on, s_off, None)
            scale = {"pg_on": w_on, "pg_off": w_off, "pooled": 1.0, "on": 1.0}
        algo = self.algo
        dev = self.device
        shared_critic = self.value_head is not None
        swap = algo.swap
        out = self.sequence_logprobs(self.policy, mb, self.rollout_cfg.temperature, with_entropy=True,
                                     with_values=shared_critic, with_state=swap.coef > 0)
        logprobs, entropy, values = out[:3]
        state = out[3] if swap.coef > 0 else None
        mask = mb.response_mask.to(dev)
        rep = mb.is_replay.to(dev)[:, None]
        eps_scale = mb.clip_eps.to(dev)
        old, behaviour, advantages = mb.old_logprobs.to(dev), mb.behaviour_logprobs.to(dev), mb.advantages.to(dev)

        def surrogate(m):
            return losses.clipped_surrogate(
                logprobs, old, behaviour, advantages, m, eps_low=algo.clip_eps_low * eps_scale,
                eps_high=algo.clip_eps_high * eps_scale, agg=algo.loss_agg, max_centre=algo.clip_max_centre,
                clip_mode=algo.clip_mode)

        pg_loss, st = surrogate(mask)  # over every row: the logged policy loss and clip statistics
        if bool(rep.any()):
            pg_on, pg_off = surrogate(mask & ~rep)[0], surrogate(mask & rep)[0]
        else:  # no replayed rows (every iteration but RSPO's exploit ones): the pooled loss is the on-policy one
            pg_on, pg_off = pg_loss, torch.zeros_like(pg_loss)
        # critic warm-up: the actor does not move during the first iterations (verl's critic_warmup)
        actor_moves = self.iteration >= self.critic_cfg.warmup_iterations or self.algo.estimator != "gae"
        total = (scale["pg_on"] * pg_on + scale["pg_off"] * pg_off) * (1.0 if actor_moves else 0.0)
        stats = {"policy_loss": pg_loss.detach(), **{k: v.detach() for k, v in st.items()}}
        if shared_critic:
            v_loss = losses.value_loss(values, mb.old_values.to(dev), mb.returns.to(dev), self.critic_cfg.value_clip)
            total = total + scale["pooled"] * self.critic_cfg.value_coef * v_loss
            stats["value_loss"] = v_loss.detach()
        if algo.replay_regularisers == "exclude":  # KL and entropy on the learner's own samples only
            reg_mask, reg_scale = mask & ~rep, scale["on"]
        else:  # replay tokens weighted by c = pi_old / pi_behaviour (capped like the clip centre)
            centre = torch.exp(torch.where(mask, old - behaviour, torch.zeros_like(old)))
            if algo.clip_max_centre is not None:
                centre = centre.clamp(max=algo.clip_max_centre)
            reg_mask, reg_scale = torch.where(rep, centre, torch.ones_like(centre)) * mask, scale["pooled"]
        ent = losses.aggregate(entropy, reg_mask, algo.loss_agg)
        stats["entropy"] = ent.detach()
        if algo.entropy_coef > 0 and actor_moves:
            total = total - reg_scale * algo.entropy_coef * ent
        if mb.ref_logprobs is not None:
            kl = losses.aggregate(losses.kl_penalty(logprobs, mb.ref_logprobs.to(dev), kind=algo.kl_estimator), reg_mask, algo.loss_agg)
            stats["kl"] = kl.detach()
            if actor_moves:
                total = total + reg_scale * algo.kl_coef * kl
        if swap.coef > 0 and actor_moves:
            lam = partner_loss.partner_coefficient(self.iteration, swap.coef, swap.warmup_iterations)
            gen = torch.Generator().manual_seed(self.seed * 100003 + self.iteration)
            adv_rows = mb.advantages.to(dev)
            swap_loss, swap_stats = partner_loss.partner_loss(
                logprobs, mb.old_logprobs.to(dev), adv_rows, mask, embeddings=state.detach(), rewards=adv_rows,
                strategy=swap.strategy, num_partners=swap.num_partners, beta_s=swap.beta_s, p_swap=swap.p_swap,
                eps_low=algo.clip_eps_low, eps_high=algo.clip_eps_high, agg=algo.loss_agg,
                behaviour_logprobs=mb.behaviour_logprobs.to(dev), generator=gen)
            total = total + scale["pooled"] * lam * swap_loss
            stats["swap_loss"] = swap_loss.detach()
            stats["swap_frac"] = torch.as_tensor(swap_stats["swap_frac"]).detach()
        stats["loss"] = total.detach() / max(scale["pooled"], 1e-12)
        return total, stats

    # -- metrics -------------------------------------------------------------------------
    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """During a training iteration every logged value (the module's and the callbacks') is kept
        for this iteration only and written once, at its end, to every logger at step = iteration:
        a key not logged in an iteration has no point there (Lightning's logger connector would
        re-emit the last value of a key logged on an earlier step). Progress bar and
        ``callback_metrics`` are updated as usual."""
        trainer = self._trainer
        if trainer is not None and trainer.training and not trainer.sanity_checking and kwargs.get("logger", True) is not False:
            if name != "step":
                self._iteration_metrics[name] = float(value)
            kwargs["logger"] = False
        super().log(name, value, *args, **kwargs)

    def _flush_iteration_metrics(self) -> None:
        metrics, self._iteration_metrics = self._iteration_metrics, {}
        if metrics and self._trainer is not None:
            metrics["iteration"] = float(self.iteration)
            for logger in self.trainer.loggers:
                logger.log_metrics(metrics, step=self.iteration)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._flush_iteration_metrics()  # after the callbacks' on_train_batch_end (Lightning calls them first)

    def on_train_epoch_end(self) -> None:
        self._flush_iteration_metrics()  # what epoch-end callbacks (e.g. Curriculum) logged

    def _log_replay(self, advantages: torch.Tensor, flat: FlatTurns) -> None:
        """What the replayed rows contribute: their mean |advantage|, the fraction at exactly 0,
        and their share of the iteration's response tokens (this rank)."""
        rep = flat.is_replay
        if not bool(rep.any()):
            return
        a = (advantages + self.algo.invalid_action_penalty * flat.invalid.float())[rep]  # the estimator's, before the penalty
        tokens = torch.tensor([len(t.response_ids) for t in flat.turns], dtype=torch.float32)
        self.log_dict({
            "rspo/replay_adv_abs": float(a.abs().mean()),
            "rspo/replay_zero_frac": float((a == 0).float().mean()),
            "rspo/replay_token_share": float(tokens[rep].sum() / tokens.sum()),
        }, on_step=True)

    def _log_rollout(self, trajectories: list[Trajectory], prefix: str) -> None:
        won, played = self._sum(sum(t.success for t in trajectories), len(trajectories))  # every rank calls this
        if not trajectories:
            return
        n = len(trajectories)
        turns = sum(len(t.turns) for t in trajectories)
        # the success rate over all ranks; the other rollout values are this rank's
        self.log(f"{prefix}/success_rate", won / max(played, 1.0), on_step=True, on_epoch=False, batch_size=n)
        values = {
            f"{prefix}/score": sum(t.score for t in trajectories) / n,
            f"{prefix}/episode_len": turns / n,
            f"{prefix}/invalid_rate": sum(t.num_invalid for t in trajectories) / max(turns, 1),
            f"{prefix}/dense_return": sum(turn.dense_reward for t in trajectories for turn in t.turns) / n,
            f"{prefix}/progress": sum(t.turns[-1].progress if t.turns else t.initial_progress for t in trajectories) / n,
        }
        by_type: dict[str, list[bool]] = {}
        for t in trajectories:
            by_type.setdefault(t.task_type, []).append(t.success)
        for ty, s in by_type.items():
            if ty:
                values[f"{prefix}/success_rate/{ty}"] = sum(s) / len(s)
        self.log_dict(values, on_step=True, batch_size=n)
        self.log("sr", sum(t.success for t in trajectories) / n, prog_bar=True, on_step=True, logger=False)

    # -- validation ----------------------------------------------------------------------
    def _val_update(self, name: str, value: float) -> None:
        acc = self._val_sums.setdefault(name, [0.0, 0.0])
        acc[0] += float(value)
        acc[1] += 1.0

    @staticmethod
    def metric_prefix(split: str, stage: str = "val") -> str:
        """``val`` for valid_seen / valid, ``val_<name>`` for other validation splits; ``test`` for
        the test split, ``test_<name>`` for a validation split played by ``test``."""
        if stage == "val":
            return "val" if split in ("valid_seen", "valid") else f"val_{split.removeprefix('valid_')}"
        return "test" if split == "test" else f"test_{split.removeprefix('valid_')}"

    def _play_held_out(self, batch: IterationBatch, batch_idx: int, stage: str) -> list[Trajectory]:
        """Play each held-out task once (validation temperature; greedy too with ``val_greedy``),
        accumulating success and score under the stage's metric prefix; returns the sampled episodes."""
        split = batch.tasks[0].split if batch.tasks else "valid_seen"
        prefix = self.metric_prefix(split, stage)
        runs = [("", False)] + ([("greedy_", True)] if self.val_greedy else [])
        played: list[Trajectory] = []
        for tag, greedy in runs:
            self._seed_rollout(f"{prefix}/{tag}{batch_idx}")
            trajs = self.engine.collect(batch.tasks, 1, temperature=self.val_temperature, greedy=greedy, iteration=self.iteration)
            trajs = [t for t in trajs if t.env_error is None]  # an env fault is not the agent's failure
            for t in trajs:
                self._val_update(f"{prefix}/{tag}success_rate", t.success)
                self._val_update(f"{prefix}/{tag}score", t.score)
                if not tag and t.task_type:
                    self._val_update(f"{prefix}/success_rate/{t.task_type}", t.success)
            if not tag:
                played = trajs
        return played

    def validation_step(self, batch: IterationBatch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._play_held_out(batch, batch_idx, "val")

    def on_validation_epoch_end(self) -> None:
        # one all_gather of every rank's [sum, count] per metric: ranks may hold different metrics
        merged = merge_over_ranks(self._val_sums)
        self._val_sums = {}
        values = {key: total / count for key, (total, count) in sorted(merged.items()) if count > 0}
        if self.trainer.sanity_checking:
            # A full sanity check (num_sanity_val_steps: -1) runs before any update: record it as step 0.
            if self.logger is not None and values and math.isinf(self.trainer.num_sanity_val_steps):
                self.logger.log_metrics(values, step=0)
            self.initial_val_metrics = values
            return
        for k, v in values.items():
            self.log(k, v, prog_bar=k == "val/success_rate", add_dataloader_idx=False)
        if values:
            self.log("step", float(self.iteration), add_dataloader_idx=False)

    # `rspo-lightning test` plays the env's test split (or the validation splits) as test/*.
    def test_step(self, batch: IterationBatch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._play_held_out(batch, batch_idx, "test")

    def on_test_epoch_end(self) -> None:
        self.on_validation_epoch_end()

    # `rspo-lightning predict` plays the same tasks and writes the episodes as trajectory JSONL.
    def on_predict_start(self) -> None:
        self._predicted: list[Trajectory] = []

    def predict_step(self, batch: IterationBatch, batch_idx: int, dataloader_idx: int = 0) -> dict[str, float]:
        trajs = self._play_held_out(batch, batch_idx, "test")
        self._predicted.extend(trajs)
        return {"episodes": float(len(trajs)), "successes": float(sum(t.success for t in trajs))}

    def on_predict_end(self) -> None:
        from rspo_lightning.trajectory_io import save_trajectories

        self._val_sums = {}
        root = self.trainer.default_root_dir
        name = "predictions.jsonl" if self.trainer.world_size == 1 else f"predictions.rank{self.global_rank}.jsonl"
        path = self.predict_path or os.path.join(root, name)
        n = save_trajectories(path, self._predicted, self.tokenizer)
        won = sum(t.success for t in self._predicted)
        print(f"predict: {n} episodes, success rate {won / max(n, 1):.3f}, written to {path}")

    # -- checkpoint ----------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rspo_iteration"] = self.iteration
        checkpoint["rspo_skipped_steps"] = self.skipped_steps
        checkpoint["rspo_env_steps"] = self.env_steps
        checkpoint["rspo_episodes_dropped"] = self.episodes_dropped
        checkpoint["rspo_env_errors"] = self.engine.env_errors if self.engine is not None else 0
        if hasattr(self.dense_reward, "state_dict"):
            checkpoint["rspo_dense_reward"] = self.dense_reward.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # checkpoints written before the frozen models left the state dict still hold them
        frozen = ("_ref.", "critic.backbone.") if self.critic_cfg.freeze_backbone else ("_ref.",)
        if "state_dict" in checkpoint:
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith(frozen)}
        self.iteration = int(checkpoint.get("rspo_iteration", 0))
        self.skipped_steps = int(checkpoint.get("rspo_skipped_steps", 0))
        self.env_steps = int(checkpoint.get("rspo_env_steps", 0))
        self.episodes_dropped = int(checkpoint.get("rspo_episodes_dropped", 0))
        self._restored_env_errors = int(checkpoint.get("rspo_env_errors", 0))
        if "rspo_dense_reward" in checkpoint and hasattr(self.dense_reward, "load_state_dict"):
            self.dense_reward.load_state_dict(checkpoint["rspo_dense_reward"])
        self._agent_a_from_rspo_state(checkpoint)
        if self.engine is not None:  # the weights are loaded after this hook, before the next collect
            self.engine.mark_weights_changed()

    def _agent_a_from_rspo_state(self, checkpoint: dict) -> None:
        """A checkpoint written while RSPO's explorer B was active holds B's weights and A's in
        the RSPOLoop state. Unless this run fits with an RSPOLoop (which restores A itself at the
        end of B's phase), load A: validate / test / predict then measure agent A, and a fit
        without the loop continues A."""
        from rspo_lightning.callbacks.rspo import RSPOLoop

        snapshot = None
        for state in (checkpoint.get("callbacks") or {}).values():
            if isinstance(state, dict) and {"snapshot", "buffer", "counts"} <= state.keys() and state["snapshot"] is not None:
                snapshot = state["snapshot"]
        trainer = self._trainer
        fitting_with_loop = (trainer is not None and trainer.state.fn == "fit"
                             and any(isinstance(cb, RSPOLoop) for cb in trainer.callbacks))
        if snapshot is None or fitting_with_loop or "state_dict" not in checkpoint:
            return
        # tied weights (embeddings = LM head) appear once among the parameters, under every name in the state dict
        names = {p.data_ptr(): n for n, p in self.named_parameters()}
        merged = dict(checkpoint["state_dict"])
        for key, tensor in self.state_dict(keep_vars=True).items():
            source = names.get(tensor.data_ptr())
            if source in snapshot["params"] and key in merged:
                merged[key] = snapshot["params"][source]
        checkpoint["state_dict"] = merged
        if snapshot.get("optimizers") and "optimizer_states" in checkpoint:
            checkpoint["optimizer_states"] = snapshot["optimizers"]
        if snapshot.get("schedulers") and "lr_schedulers" in checkpoint:
            checkpoint["lr_schedulers"] = snapshot["schedulers"]
