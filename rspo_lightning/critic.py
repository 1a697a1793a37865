"""Critics for PPO/GAE: a value head on the policy backbone, or an asymmetric critic.

The asymmetric critic (a separate backbone, any HF model, frozen by default, with a trainable
value head and its own optimizer) may read the environment's ``privileged`` full-state text
instead of the actor's observation, as in asymmetric actor-critic for robotics. V(s_t) is read
at the last prompt token of turn t.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rspo_lightning import choices
from rspo_lightning.batching import left_pad, positions_from_mask
from rspo_lightning.language_model import ValueHead, frozen_copy, hidden_size_of, load_policy
from rspo_lightning.prompts import PRIVILEGED_PREFIX, chat_prompt_ids
from rspo_lightning.serialization import checkpoint_safe
from rspo_lightning.types import Turn


@checkpoint_safe
@dataclass
class CriticConfig:
    """Value function of PPO (``algorithm.estimator: gae``).

    Args:
        kind: ``shared`` (value head on the policy's backbone) or ``separate`` (own backbone: the
            asymmetric critic).
        source: backbone of a separate critic: ``policy`` (a copy of the policy as loaded) or any
            ``model.policy.source`` value (local HF directory, ``.gguf`` path, ``smollm2``).
        freeze_backbone: keep a separate critic's backbone frozen (only its value head trains).
        privileged: a separate critic reads the env's ``privileged`` full-state text instead of
            the actor's prompt.
        lr: learning rate of the critic's own parameters (value head, unfrozen backbone).
        value_clip: clip range of the clipped value loss.
        value_coef: weight of the value loss.
        warmup_iterations: critic-only iterations before the actor moves (verl's critic_warmup).
    """

    kind: choices.CriticKind = "shared"
    source: str = "policy"
    freeze_backbone: bool = True
    privileged: bool = False
    lr: float = 1e-5
    value_clip: float = 0.2
    value_coef: float = 0.5
    warmup_iterations: int = 0

    def __post_init__(self) -> None:
        choices.check("critic.kind", self.kind, choices.CriticKind)
        if self.privileged and self.kind != "separate":
            raise ValueError("critic.privileged needs critic.kind: separate (a shared head sees the actor's prompt)")
        if self.lr <= 0:
            raise ValueError(f"critic.lr must be > 0, got {self.lr}")
        if self.warmup_iterations < 0:
            raise ValueError(f"critic.warmup_iterations must be >= 0, got {self.warmup_iterations}")


def last_token_hidden(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Final-layer hidden state ``[n, H]`` at ``positions`` of left-padded rows."""
    pos = positions_from_mask(attention_mask)
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else model
    out = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), positions.to(hidden.device)]


class SeparateCritic(nn.Module):
    """Asymmetric critic: its own backbone (+ tokenizer) and a value head.

    Args:
        config: critic settings.
        policy: the policy model (copied when ``config.source == "policy"``).
        policy_tokenizer: the policy's tokenizer (prompt ids are decoded with it when the critic
            has another tokenizer).
    """

    def __init__(self, config: CriticConfig, policy, policy_tokenizer):
        super().__init__()
        self.config = config
        self.policy_tokenizer = policy_tokenizer
        if config.source == "policy":
            backbone, self.tokenizer = frozen_copy(policy), policy_tokenizer
        else:
            backbone, self.tokenizer = load_policy(config.source)
        self.same_tokenizer = self.tokenizer is policy_tokenizer
        backbone.requires_grad_(not config.freeze_backbone)
        backbone.train(not config.freeze_backbone)
        if config.freeze_backbone:
            # held in __dict__, not registered, like the KL reference: no optimizer, checkpoint, DDP or
            # FSDP wrapping sees it (it is rebuilt from ``source`` on load); moved when used
            self.__dict__["backbone"] = backbone
        else:
            self.backbone = backbone
        self.head = ValueHead(hidden_size_of(backbone))

    def input_ids(self, turns: Sequence[Turn]) -> list[list[int]]:
        """The critic's prompt ids of each turn (privileged state text, or the actor's prompt)."""
        rows = []
        for t in turns:
            if self.config.privileged:
                text = t.privileged if t.privileged is not None else t.observation
                rows.append(chat_prompt_ids(self.tokenizer, f"{PRIVILEGED_PREFIX}\n{text}", None))
            elif self.same_tokenizer:
                rows.append(t.prompt_ids.tolist())
            else:
                text = self.policy_tokenizer.decode(t.prompt_ids, skip_special_tokens=True)
                rows.append(chat_prompt_ids(self.tokenizer, text, None))
        return rows

    def forward(self, rows: list[list[int]], device: torch.device) -> torch.Tensor:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids, attn = left_pad(rows, pad)
        positions = torch.full((len(rows),), ids.shape[1] - 1, dtype=torch.long)
        if self.config.freeze_backbone:
            self.backbone.to(device)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.config.freeze_backbone):
            hidden = last_token_hidden(self.backbone, ids.to(device), attn.to(device), positions)
        return self.head(hidden.float())
