"""What ``AgentRLModule`` owns, built from its configs: the policy and its tokenizer, the frozen KL
reference, the critic (a value head on the policy or a separate model), the rollout engine, and
the optimizers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from rspo_lightning.advantages import ESTIMATORS
from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.critic import CriticConfig, SeparateCritic
from rspo_lightning.distributed import shard_fsdp2
from rspo_lightning.envs import make_env
from rspo_lightning.language_model import ValueHead, apply_lora, frozen_copy, hidden_size_of, load_policy
from rspo_lightning.prompts import template_texts
from rspo_lightning.rollout import RolloutConfig, RolloutEngine


class Models(NamedTuple):
    """``reference``: a frozen copy of the policy for the KL term (None without KL, and with LoRA,
    whose reference is the policy with its adapters disabled); ``value_head`` / ``critic``: the
    shared or the separate critic of an estimator that needs one (None otherwise)."""

    policy: nn.Module
    tokenizer: Any
    reference: nn.Module | None
    value_head: ValueHead | None
    critic: SeparateCritic | None
    engine: RolloutEngine


def build_models(
    policy: PolicyConfig, algo: AlgorithmConfig, critic: CriticConfig, rollout: RolloutConfig, env: EnvConfig | None
) -> Models:
    if env is None:
        raise ValueError(
            "AgentRLModule needs an env: in Python pass env=EnvConfig(...) (the CLI links model.env to data.env)"
        )
    corpus = None
    if policy.source == "tiny":  # a word-level vocabulary covering everything the env and the prompts can print
        corpus = (
            make_env(env.env_id, **env.kwargs).unwrapped.sample_texts() + template_texts() + [rollout.system_prompt]
        )
    model, tokenizer = load_policy(
        policy.source,
        gguf_file=policy.gguf_file,
        tiny=policy.tiny,
        corpus=corpus,
        trust_remote_code=policy.trust_remote_code,
    )
    if policy.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.config.use_cache = True
    reference = None
    if policy.lora is not None:
        model = apply_lora(model, policy.lora)
    elif algo.kl_coef > 0:
        reference = frozen_copy(model)
    value_head = separate = None
    needs_critic = ESTIMATORS[algo.estimator].needs_critic
    if needs_critic and critic.kind == "shared":
        value_head = ValueHead(hidden_size_of(model))
    elif needs_critic:
        separate = SeparateCritic(critic, model, tokenizer)
    return Models(
        model, tokenizer, reference, value_head, separate, RolloutEngine(model, tokenizer, rollout, env.kwargs)
    )


def build_optimizers(
    policy: nn.Module,
    value_head: nn.Module | None,
    critic: SeparateCritic | None,
    optim: OptimConfig,
    critic_cfg: CriticConfig,
):
    """``configure_optimizers``' answer: AdamW over the policy's trainable parameters (a shared
    value head as a second group at ``critic.lr``) with the per-iteration learning-rate schedule,
    and a separate critic's own AdamW."""
    groups = [{"params": [p for p in policy.parameters() if p.requires_grad]}]
    if value_head is not None:
        groups.append({"params": list(value_head.parameters()), "lr": critic_cfg.lr})
    opt = torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)
    sched = {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, optim.lr_factor), "interval": "step"}
    if critic is None:
        return {"optimizer": opt, "lr_scheduler": sched}
    critic_opt = torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=critic_cfg.lr)
    return [opt, critic_opt], [sched]


@contextlib.contextmanager
def reference_model(policy: nn.Module, reference: nn.Module | None, lora: bool) -> Iterator[nn.Module]:
    """The frozen KL reference: the LoRA ``policy`` with its adapters disabled while entered, or
    the frozen copy ``reference`` (resharded on exit under FSDP2)."""
    if lora:
        with policy.disable_adapter():
            yield policy
    else:
        try:
            yield reference
        finally:
            # FSDP2 leaves a root module's parameters unsharded after its forward (a backward would
            # need them next); the reference has no backward, so it gives them back here
            from torch.distributed.fsdp import FSDPModule

            if isinstance(reference, FSDPModule):
                reference.reshard()


def shard_models(modules: list[nn.Module | None], mesh, lora: bool = False) -> None:
    """FSDP2 (``ModelParallelStrategy``): ``fully_shard`` the policy, value head, critic and frozen
    KL reference over ``mesh`` (``distributed.shard_fsdp2``), in place."""
    if lora:
        raise ValueError(
            "policy.lora is not supported with ModelParallelStrategy (FSDP2): use trainer.strategy: ddp "
            "(the frozen base weights are then one copy per GPU) or configs/trainer/fsdp.yaml"
        )
    for module in modules:
        if module is not None:
            shard_fsdp2(module, mesh)


def summary_line(self) -> str:
    """What ``AgentRLModule`` ``self`` built, in one line (the CLI's stand-in for Lightning's model summary)."""
    trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
    total = sum(p.numel() for p in self.parameters())
    parts = [
        f"{type(self.policy).__name__} from {self.policy_cfg.source!r}",
        f"{trainable / 1e6:.2f}M of {total / 1e6:.2f}M parameters train",
    ]
    if self.value_head is not None or self.critic is not None:
        parts.append("critic: " + ("value head on the policy" if self.critic is None else "separate model"))
    if self._ref is not None:
        parts.append("frozen KL reference")
    return f"AgentRLModule: {', '.join(parts)}; estimator {self.algo.estimator}, backend {self.rollout_cfg.backend}"
