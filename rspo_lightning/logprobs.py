"""Scoring a ``TrainBatch`` before the update: what a model gives its response tokens, in chunks
over the rows, and the critic's values (docs/design.md §3, "score").

Functions of (model, batch, settings) that return tensors; none writes into the batch it reads
(the module builds the next stage's batch from their results with ``dataclasses.replace``).
With several ranks every chunk loop runs in lock-step (``distributed.lockstep``): a rank past
its own rows forwards ``dummy_batch`` so that sharded forwards stay collective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from rspo_lightning.batching import positions_from_mask
from rspo_lightning.distributed import lockstep, merge_over_ranks
from rspo_lightning.losses import response_token_logprobs
from rspo_lightning.types import TrainBatch


class Forward(NamedTuple):
    """One forward of a policy over a batch's rows (response window ``[n, T]``).

    Args:
        logprobs: ``[n, T]`` log-probs of the response tokens (0 off ``response_mask``).
        entropy: ``[n, T]`` entropy of the (temperature-scaled, constrained) next-token distribution.
        values: ``[n]`` shared value head's V(s) at the last prompt token, or None.
        state: ``[n, H]`` hidden state at the last prompt token (float32), or None.
    """

    logprobs: Tensor
    entropy: Tensor
    values: Tensor | None = None
    state: Tensor | None = None


def forward(
    model: nn.Module,
    batch: TrainBatch,
    temperature: float,
    device: torch.device | str = "cpu",
    *,
    value_head: nn.Module | None = None,
    with_state: bool = False,
) -> Forward:
    """``model``'s log-probs and entropies of ``batch``'s response tokens; with ``value_head`` its
    values, with ``with_state`` the hidden state they read. Only the last ``T + 1`` logits are
    computed (rows are left-padded so that every response ends at the last column)."""
    ids = batch.input_ids.to(device)
    attn = batch.attention_mask.to(device)
    window = batch.response_mask.shape[1]
    hidden_needed = value_head is not None or with_state
    out = model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=positions_from_mask(attn),
        logits_to_keep=window + 1,
        use_cache=False,
        output_hidden_states=hidden_needed,
    )
    values = state = None
    if hidden_needed:
        hidden = out.hidden_states[-1]
        state = hidden[torch.arange(len(ids), device=hidden.device), batch.value_positions.to(hidden.device)].float()
        values = value_head(state) if value_head is not None else None
    allowed = batch.allowed_ids.to(device) if batch.allowed_ids is not None else None
    lp, ent = response_token_logprobs(out.logits[:, :-1].float(), ids[:, -window:], temperature, allowed)
    mask = batch.response_mask.to(device)
    zero = torch.zeros_like(lp)
    return Forward(torch.where(mask, lp, zero), torch.where(mask, ent, zero), values, state if with_state else None)


def dummy_batch(
    pad_id: int, *, with_ref: bool = False, with_values: bool = False, with_critic_rows: bool = False
) -> TrainBatch:
    """One two-token row with one response token: what a rank forwards (at weight 0) when another
    rank has more chunks or micro-batches than it has."""
    zero = torch.zeros(1)
    return TrainBatch(
        input_ids=torch.full((1, 2), pad_id, dtype=torch.long),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        response_mask=torch.ones(1, 1, dtype=torch.bool),
        behaviour_logprobs=torch.zeros(1, 1),
        old_logprobs=torch.zeros(1, 1),
        advantages=zero,
        returns=zero,
        clip_scale=torch.ones(1),
        is_replay=torch.zeros(1, dtype=torch.bool),
        value_positions=torch.zeros(1, dtype=torch.long),
        ref_logprobs=torch.zeros(1, 1) if with_ref else None,
        old_values=zero if with_values else None,
        critic_rows=[[pad_id]] if with_critic_rows else None,
    )


def chunked_logprobs(
    model: nn.Module,
    batch: TrainBatch,
    rows: Tensor,
    temperature: float,
    chunk_size: int,
    dummy: TrainBatch,
    device: torch.device | str = "cpu",
) -> Tensor:
    """``[len(rows), T]`` log-probs of ``batch``'s rows ``rows`` under ``model`` (aligned to the
    batch's response window; a chunk's own window may be narrower), ``chunk_size`` rows per forward."""
    chunks = list(rows.split(chunk_size)) if len(rows) else []
    window = batch.response_mask.shape[1]
    out = torch.zeros(len(rows), window, dtype=torch.float32)  # whatever the default dtype (bf16-true sets it)
    start = 0
    for chunk in lockstep(chunks, device):
        if chunk is None:
            forward(model, dummy, temperature, device)
            continue
        lp = forward(model, batch.select(chunk), temperature, device).logprobs.float().cpu()
        out[start : start + len(chunk), window - lp.shape[1] :] = lp
        start += len(chunk)
    return out


class Scores(NamedTuple):
    """What scoring gives a batch: ``old_logprobs`` ``[N, T]`` (the policy before the update),
    ``behaviour_logprobs`` ``[N, T]`` (on-policy rows := old, so the generalised clip centre
    c = π_old / π_behaviour is exactly 1 there; replayed rows keep the behaviour policy's), and
    ``ref_logprobs`` ``[N, T]`` (the frozen reference) or None without a KL term."""

    old_logprobs: Tensor
    behaviour_logprobs: Tensor
    ref_logprobs: Tensor | None


@torch.no_grad()
def score(
    policy: nn.Module,
    batch: TrainBatch,
    temperature: float,
    chunk_size: int,
    dummy: TrainBatch,
    *,
    recompute_old: bool = True,
    reference: contextlib.AbstractContextManager | None = None,
    device: torch.device | str = "cpu",
) -> tuple[Scores, dict[str, float]]:
    """Old (and reference) log-probs of ``batch`` by no-grad forwards in eval mode, and the
    behaviour/old mismatch of the on-policy rows when old log-probs are recomputed
    (``logprob_mismatch``; empty otherwise). Without ``recompute_old`` only replayed rows are
    scored; on-policy rows keep their behaviour log-probs as old. ``reference`` yields the KL
    reference model when entered."""
    all_rows = torch.arange(len(batch))
    rows = all_rows if recompute_old else all_rows[batch.is_replay]
    was_training = policy.training
    policy.eval()
    try:
        ref_logprobs = None
        if reference is not None:
            with reference as ref:
                ref_logprobs = chunked_logprobs(ref, batch, all_rows, temperature, chunk_size, dummy, device)
        old = batch.behaviour_logprobs.clone()
        old[rows] = chunked_logprobs(policy, batch, rows, temperature, chunk_size, dummy, device)
    finally:
        if was_training:
            policy.train()
    on_policy = ~batch.is_replay
    mismatch = (
        logprob_mismatch(old[on_policy], batch.behaviour_logprobs[on_policy], batch.response_mask[on_policy])
        if recompute_old
        else {}
    )
    behaviour = torch.where(on_policy[:, None], old, batch.behaviour_logprobs)
    return Scores(old, behaviour, ref_logprobs), mismatch


def logprob_mismatch(old: Tensor, behaviour: Tensor, mask: Tensor) -> dict[str, float]:
    """``rollout/logprob_mismatch_{max,mean}``: |rollout behaviour log-prob − training forward|
    over the masked response tokens of every rank: ~1e-6 with the hf backend; vLLM's kernels
    differ from the trainer's."""
    delta = (old - behaviour).abs()[mask]
    merged = merge_over_ranks(
        {"delta": [float(delta.sum()), float(delta.numel()), float(delta.max()) if delta.numel() else 0.0]}
    )
    total, count, peak = merged["delta"]
    return {"rollout/logprob_mismatch_max": peak, "rollout/logprob_mismatch_mean": total / max(count, 1.0)}


@torch.no_grad()
def critic_values(
    value_fn: Callable[[TrainBatch], Tensor],
    batch: TrainBatch,
    chunk_size: int,
    dummy: TrainBatch,
    device: torch.device | str = "cpu",
) -> Tensor:
    """V(s) ``[N]`` of every row before the update, ``value_fn(rows) -> [n]`` over chunks of
    ``chunk_size`` rows (lock-step over ranks)."""
    chunks = list(torch.arange(len(batch)).split(chunk_size)) if len(batch) else []
    out = [value_fn(batch.select(c) if c is not None else dummy).cpu() for c in lockstep(chunks, device)]
    return torch.cat(out[: len(chunks)]) if chunks else torch.zeros(0)
