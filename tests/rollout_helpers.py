"""Shared by the rollout tests of both backends (tests/test_rollout.py, tests/with_vllm/)."""

import torch

from rspo_lightning.losses import response_token_logprobs


def forward_logprobs(model, batch, temperature):
    """The training forward's log-probs of ``batch``'s response tokens (as the module scores them)."""
    ids, attn = batch.input_ids, batch.attention_mask
    window = batch.response_mask.shape[1]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=window + 1).logits[:, :-1]
    lp, _ = response_token_logprobs(logits, ids[:, -window:], temperature, batch.allowed_ids)
    return lp
