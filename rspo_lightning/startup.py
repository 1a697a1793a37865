"""Checks of a run's configuration at ``setup``, before anything is played: a bad combination
fails at startup naming the value and the fix, never mid-run."""

from __future__ import annotations

import logging
from typing import Any

from lightning.pytorch.strategies import DDPStrategy

from rspo_lightning.checkpointing import IterationCheckpoint

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
        if getattr(cb, "_every_n_train_steps", 0) and not isinstance(cb, IterationCheckpoint):
            raise ValueError(
                f"ModelCheckpoint(every_n_train_steps={cb._every_n_train_steps}) counts optimizer steps, not RL iterations; "
                "use rspo_lightning.checkpointing.IterationCheckpoint(every_n_iterations=N) (the CLI's checkpoint.every_n_iterations) "
                "or every_n_epochs (an epoch is data.iterations_per_epoch iterations)"
            )
