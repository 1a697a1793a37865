"""Checks of a run's configuration at ``setup``, before anything is played: a bad combination
fails at startup naming the value and the fix, never mid-run."""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from lightning.pytorch.strategies import DDPStrategy

from rspo_lightning import memory

log = logging.getLogger(__name__)

DENSE_HINT = (
    "set model.dense_reward, e.g. {class_path: rspo_lightning.rewards.EnvProgressReward} in YAML, or "
    "AgentRLModule(dense_reward=rspo_lightning.rewards.EnvProgressReward()) in Python"
)


def check_run(module: Any, trainer: Any) -> None:
    """Refuse what ``module`` (an ``AgentRLModule``) cannot run under ``trainer`` and its datamodule."""
    algo = module.algo
    if (
        module.critic is not None
        and isinstance(trainer.strategy, DDPStrategy)
        and not trainer.strategy._ddp_kwargs.get("find_unused_parameters", False)
    ):
        raise ValueError(
            "critic.kind: separate under trainer.strategy: ddp needs DDP's unused-parameter search (the "
            "critic and the policy step apart): use trainer.strategy: ddp_find_unused_parameters_true"
        )
    dm = getattr(trainer, "datamodule", None)
    group_size = getattr(dm, "group_size", None)
    if group_size is not None and group_size < 2 and module.estimator.group_relative:
        raise ValueError(
            f"data.group_size must be >= 2 for the group-relative estimator {algo.estimator!r}, got {group_size}; "
            "raise data.group_size or use algorithm.estimator: gae"
        )
    mode = getattr(dm, "reward_mode", "outcome")
    if mode != "outcome" and module.dense_reward is None:
        raise ValueError(f"data.reward_mode: {mode} needs a dense reward source: {DENSE_HINT}")
    if module.rollout_cfg.backend == "vllm" and not algo.recompute_old_logprobs:
        log.warning(
            "rollout.backend: vllm with algorithm.recompute_old_logprobs: false trains with vLLM's log-probs as "
            "the old policy's; its kernels differ from the trainer's (bf16 on GPUs: ~1e-2): keep it true"
        )
    check_step_knobs(trainer)
    if trainer.state.fn == "fit" and dm is not None and group_size is not None:
        rspo = any("RSPOLoop" in (k.__name__ for k in type(c).__mro__) for c in trainer.callbacks)
        check_memory(module, dm, rspo_snapshot=rspo)


def first_update_estimate(
    module: Any, dm: Any, rspo_snapshot: bool = False, *, policy: Any = None, tokenizer: Any = None, trainable=None
) -> tuple[memory.MemoryEstimate, int] | None:
    """``memory.estimate_update`` of ``module``'s first update under ``dm`` (its largest
    micro-batch, at the env's first task's prompt as rendered once its history window is full,
    plus the longest response) and that
    micro-batch's rows; None for a policy whose config does not name its shape. ``policy``,
    ``tokenizer`` and ``trainable`` (a count) stand in for the module's own when given."""
    policy = module.policy if policy is None else policy
    tokenizer = module.tokenizer if tokenizer is None else tokenizer
    from rspo_lightning.envs import make_env
    from rspo_lightning.prompts import HistoryEntry, action_response_ids, build_turn_prompt

    cfg = getattr(policy, "config", None)
    shape = [getattr(cfg, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")]
    if cfg is None or None in shape:
        return None
    layers, hidden, intermediate, vocab = shape
    heads = getattr(cfg, "num_attention_heads", 1)
    kv_width = (getattr(cfg, "head_dim", None) or hidden // heads) * (
        getattr(cfg, "num_key_value_heads", None) or heads
    )
    rollout = module.rollout_cfg
    env = make_env(module.env_cfg.env_id, **module.env_cfg.kwargs)
    try:  # the first task's prompt once its history window is full: the longest rows of an update
        try:
            observation, info = env.reset(options={"split": getattr(dm, "train_split", "train"), "task_id": 0})
        except Exception:  # a faulty env (its faults are counted in training): no estimate
            return None
        history, window = [], rollout.max_new_tokens
        for step in range(rollout.history_window + 1):
            prompt = len(build_turn_prompt(tokenizer, rollout, info, observation, history, step))
            admissible = info.get("admissible_actions")
            if rollout.constrained_decoding and admissible:
                window = max(window, *(len(ids) for ids in action_response_ids(tokenizer, list(admissible))))
            if step == rollout.history_window or not admissible:
                break
            try:  # any action fills the window; an env that cannot step here leaves the shorter prompt
                observation_next, _, terminated, truncated, info_next = env.step(admissible[0])
            except Exception:
                break
            history.append(HistoryEntry(observation, admissible[0]))
            observation, info = observation_next, info_next
            if terminated or truncated:
                break
        turns = rollout.max_turns or getattr(env.unwrapped, "max_steps", None) or 1
    finally:
        env.close()
    rows = min(
        module.algo.micro_batch_size or module.algo.minibatch_size, dm.groups_per_iteration * dm.group_size * turns
    )
    params = sum(p.numel() for p in policy.parameters())
    if trainable is None:
        trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    dtype_bytes = next(policy.parameters()).element_size()
    estimate = memory.estimate_update(
        params=params,
        trainable=trainable,
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        kv_width=kv_width,
        vocab=vocab,
        rows=rows,
        seq_len=prompt + window,
        window=window,
        dtype_bytes=dtype_bytes,
        reference_copy=module.algo.kl_coef > 0 and module.policy_cfg.lora is None,
        rspo_snapshot=rspo_snapshot,
    )
    return estimate, rows


def check_memory(module: Any, dm: Any, available: int | None = None, rspo_snapshot: bool = False) -> None:
    """Refuse a run whose first update cannot fit in ``available`` bytes (default: what the
    machine has available now), naming the estimate and the settings that cut it."""
    available = memory.available_bytes() if available is None else available
    found = first_update_estimate(module, dm, rspo_snapshot) if available is not None else None
    if found is None:
        return
    estimate, rows = found
    log.info("memory: the first update needs about %s", estimate.describe())
    if estimate.total <= available:
        return
    per_row = (estimate.activations + estimate.logits) / max(rows, 1) / 2**30
    fits = (
        int((available - estimate.total + estimate.activations + estimate.logits) / 2**30 // per_row) if per_row else 0
    )
    micro, minibatch = module.algo.micro_batch_size, module.algo.minibatch_size
    suggest = max(d for d in range(1, minibatch + 1) if minibatch % d == 0 and d <= max(1, min(fits, rows - 1)))
    raise ValueError(
        f"the first update needs about {estimate.describe()}, more than the {available / 2**30:.1f} GB available; "
        f"each row of a micro-batch costs about {per_row:.2f} GB: set --model.algorithm.micro_batch_size "
        f"{suggest} (now {micro if micro is not None else 'unset: the whole minibatch of ' + str(rows)})"
        + (", or train LoRA adapters (--model.policy.lora '{r: 16}')" if module.policy_cfg.lora is None else "")
    )


@runtime_checkable
class CountsIterations(Protocol):
    """A checkpoint callback that counts RL iterations, not optimizer steps (``IterationCheckpoint``)."""

    every_n_iterations: int


def check_step_knobs(trainer: Any) -> None:
    """Lightning's step counters count optimizer steps (several per RL iteration, none in some):
    refuse the knobs that would silently mean something else than iterations."""
    if trainer.state.fn == "fit" and trainer.max_steps not in (-1, None):
        raise ValueError(
            f"trainer.max_steps ({trainer.max_steps}) counts optimizer steps, not RL iterations (one iteration takes "
            f"ppo_epochs x minibatches steps, RSPO's collect iteration none); set the run length in iterations: "
            f"data.iterations_per_epoch x trainer.max_epochs (or the EnvStepBudget callback), and leave max_steps at -1"
        )
    for cb in trainer.checkpoint_callbacks:
        if getattr(cb, "_every_n_train_steps", 0) and not isinstance(cb, CountsIterations):
            raise ValueError(
                f"ModelCheckpoint(every_n_train_steps={cb._every_n_train_steps}) counts optimizer steps, not RL iterations; "
                "use rspo_lightning.callbacks.IterationCheckpoint(every_n_iterations=N) (the CLI's checkpoint.every_n_iterations) "
                "or every_n_epochs (an epoch is data.iterations_per_epoch iterations)"
            )
