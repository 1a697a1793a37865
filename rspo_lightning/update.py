"""The PPO-style update of one RL iteration (docs/design.md §3, "update"): ``ppo_epochs`` x minibatches of
optimizer steps over a scored ``TrainBatch``, and the loss of one micro-batch.

``ppo_update`` is a function of (batch, loss function, optimizer, config) and runs without a
Trainer; the module passes Lightning's backward and gradient clipping in. Under several ranks
every rank takes the same number of optimizer steps and micro-batch backwards: a rank short of
samples backwards ``dummy`` at weight 0. Under DDP gradients are synchronised once per optimizer
step: every micro-batch but the last runs inside ``no_sync`` (``algorithm.grad_sync``; FSDP2
reduce-scatters each backward by default, to keep its gradients sharded).

The loss is J = (1 − α) J_on + α J_off (RSPO; J = J_on otherwise), each part the mean over *all*
the iteration's rows of its kind (tokens under ``token-mean``), rows left out by
``drop_zero_advantage`` included: a zero-advantage row adds no gradient but counts in the mean, so
the drop only saves compute. The per-row weights are fixed once per iteration from all ranks'
counts (``Denominators``), never per minibatch, so a row's weight does not depend on the shuffle.
A minibatch's loss is its rows' share of J times the step scale max(N / B, 1) (N: the iteration's
rows over all ranks, B: ``minibatch_size`` x ranks), so one optimizer step sees the gradient scale
of a minibatch mean (clipping and Adam behave as before), the gradients of one epoch sum to
max(N / B, 1) ∇J, and an iteration that fits one minibatch takes exactly ∇J. Each backward is multiplied by the world size, so DDP's / FSDP's gradient mean equals
the gradient of one process on the union of the ranks' minibatches (docs/algorithms.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import NamedTuple

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from rspo_lightning import losses, partner_loss
from rspo_lightning.advantages import AdvantageResult
from rspo_lightning.config import AlgorithmConfig
from rspo_lightning.distributed import all_sum, gather_values, lockstep, lockstep_count, world_size
from rspo_lightning.logprobs import Forward
from rspo_lightning.types import TrainBatch


class Scale(NamedTuple):
    """Weights of one micro-batch's loss terms: its share of the (all-rank) minibatch.

    Args:
        pg_on: policy loss over the on-policy rows (times 1 − α with RSPO's ``replay_weight``).
        pg_off: policy loss over the replayed rows (times α).
        pooled: every term estimated over all rows (value loss, partner loss, KL/entropy with
            ``replay_regularisers: importance``).
        on: KL and entropy estimated on the learner's own rows (``replay_regularisers: exclude``).
    """

    pg_on: float = 1.0
    pg_off: float = 0.0
    pooled: float = 1.0
    on: float = 1.0


LossFn = Callable[[TrainBatch, Scale], "tuple[Tensor, dict[str, Tensor]]"]


def term_weights(on_size: float, off_size: float, replay_weight: float | None) -> tuple[float, float]:
    """Weights of the on-policy and the replayed part of an iteration's policy loss, each part
    being the mean over its own rows/tokens. ``replay_weight`` α: (1 − α, α), J = (1 − α) J_on +
    α J_off; an iteration holding one part alone gives it weight 1. None: the parts' shares of the
    pooled count, i.e. one token-mean over all rows (each part weighs its token share)."""
    if on_size <= 0 or off_size <= 0:
        return (1.0 if on_size > 0 else 0.0), (1.0 if off_size > 0 else 0.0)
    if replay_weight is None:
        total = on_size + off_size
        return on_size / total, off_size / total
    return 1.0 - replay_weight, replay_weight


def loss_sizes(batch: TrainBatch, loss_agg: str) -> tuple[float, float]:
    """What the loss of ``batch``'s on-policy and replayed rows averages over: response tokens
    (``token-mean``) or rows."""
    rep = batch.is_replay
    if loss_agg == "token-mean":
        per_row = batch.response_mask.sum(-1).float()
        return float(per_row[~rep].sum()), float(per_row[rep].sum())
    return float((~rep).sum()), float(rep.sum())


class Denominators(NamedTuple):
    """What the iteration's loss divides by, summed over ranks and over every row of the
    iteration (rows dropped for zero advantage included); fixed before the first minibatch.

    Args:
        on: size (tokens under ``token-mean``, else rows) of the on-policy rows.
        off: size of the replayed rows.
        rows: rows of every kind (the step scale's N).
    """

    on: float
    off: float
    rows: float

    def unit_weights(self, replay_weight: float | None, minibatch_rows: float) -> tuple[float, float]:
        """The weight of one on-policy and of one replayed unit (token under ``token-mean``, row
        otherwise) in an optimizer step's policy loss: ``max(N / B, 1) · w_part / D_part``
        (``minibatch_rows`` = B over all ranks); the same for every minibatch of the iteration."""
        w_on, w_off = term_weights(self.on, self.off, replay_weight)
        step = max(self.rows / max(minibatch_rows, 1.0), 1.0)  # N / B: a step's gradient on a minibatch mean's scale
        return step * w_on / max(self.on, 1.0), step * w_off / max(self.off, 1.0)


def denominators(batch: TrainBatch, loss_agg: str, device: torch.device | str = "cpu") -> Denominators:
    """``Denominators`` of ``batch`` (all the iteration's rows of this rank) over all ranks: one collective."""
    return Denominators(*all_sum([*loss_sizes(batch, loss_agg), float(len(batch))], device))


def pooled_scale(batch: TrainBatch, loss_agg: str) -> Scale:
    """The scale of ``batch`` taken as a whole minibatch under one pooled mean."""
    w_on, w_off = term_weights(*loss_sizes(batch, loss_agg), None)
    return Scale(pg_on=w_on, pg_off=w_off)


def micro_batch_loss(
    fwd: Forward,
    mb: TrainBatch,
    scale: Scale,
    algo: AlgorithmConfig,
    *,
    actor_moves: bool = True,
    value_clip: float = 0.2,
    value_coef: float = 0.0,
    partner_coef: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The weighted loss of one micro-batch from its forward ``fwd``, and its diagnostics (means
    over its own rows): the clipped surrogate (generalised clip centre for replayed rows; the
    on-policy and replayed parts weighted by ``scale``), the shared critic's value loss (when
    ``fwd.values`` is set), entropy bonus, KL to the reference (when ``mb.ref_logprobs`` is set)
    and the swap-partner loss at weight ``partner_coef`` (None: off). ``actor_moves`` False (critic warm-up)
    keeps every policy term at weight 0."""
    dev = fwd.logprobs.device
    logprobs, entropy = fwd.logprobs, fwd.entropy
    mask = mb.response_mask.to(dev)
    rep = mb.is_replay.to(dev)[:, None]
    clip_scale = mb.clip_scale.to(dev)
    old, behaviour, advantages = mb.old_logprobs.to(dev), mb.behaviour_logprobs.to(dev), mb.advantages.to(dev)

    def surrogate(m):
        return losses.clipped_surrogate(
            logprobs,
            old,
            behaviour,
            advantages,
            m,
            eps_low=algo.clip_eps_low * clip_scale,
            eps_high=algo.clip_eps_high * clip_scale,
            agg=algo.loss_agg,
            max_centre=algo.clip_max_centre,
            clip_mode=algo.clip_mode,
        )

    pg_loss, st = surrogate(mask)  # over every row: the logged policy loss and clip statistics
    if bool(rep.any()):
        pg_on, pg_off = surrogate(mask & ~rep)[0], surrogate(mask & rep)[0]
    else:  # no replayed rows (every iteration but RSPO's exploit ones): the pooled loss is the on-policy one
        pg_on, pg_off = pg_loss, torch.zeros_like(pg_loss)
    total = (scale.pg_on * pg_on + scale.pg_off * pg_off) * (1.0 if actor_moves else 0.0)
    stats = {"policy_loss": pg_loss.detach(), **{k: v.detach() for k, v in st.items()}}
    if fwd.values is not None:
        v_loss = losses.value_loss(fwd.values, mb.old_values.to(dev), mb.returns.to(dev), value_clip)
        total = total + scale.pooled * value_coef * v_loss
        stats["value_loss"] = v_loss.detach()
    if algo.replay_regularisers == "exclude":  # KL and entropy on the learner's own samples only
        reg_mask, reg_scale = mask & ~rep, scale.on
    else:  # replay tokens weighted by c = pi_old / pi_behaviour (capped like the clip centre)
        centre = torch.exp(torch.where(mask, old - behaviour, torch.zeros_like(old)))
        if algo.clip_max_centre is not None:
            centre = centre.clamp(max=algo.clip_max_centre)
        reg_mask, reg_scale = torch.where(rep, centre, torch.ones_like(centre)) * mask, scale.pooled
    ent = losses.aggregate(entropy, reg_mask, algo.loss_agg)
    stats["entropy"] = ent.detach()
    if algo.entropy_coef > 0 and actor_moves:
        total = total - reg_scale * algo.entropy_coef * ent
    if mb.ref_logprobs is not None:
        kl = losses.aggregate(
            losses.kl_penalty(logprobs, mb.ref_logprobs.to(dev), kind=algo.kl_estimator), reg_mask, algo.loss_agg
        )
        stats["kl"] = kl.detach()
        if actor_moves:
            total = total + reg_scale * algo.kl_coef * kl
    if partner_coef is not None and actor_moves:
        swap = algo.swap
        p_loss, p_stats = partner_loss.partner_loss(
            logprobs,
            old,
            advantages,
            mask,
            embeddings=fwd.state.detach(),
            rewards=advantages,
            strategy=swap.strategy,
            num_partners=swap.num_partners,
            beta_s=swap.beta_s,
            p_swap=swap.p_swap,
            eps_low=algo.clip_eps_low,
            eps_high=algo.clip_eps_high,
            agg=algo.loss_agg,
            behaviour_logprobs=behaviour,
            generator=generator,
        )
        total = total + scale.pooled * partner_coef * p_loss
        stats["swap_loss"] = p_loss.detach()
        stats["swap_frac"] = torch.as_tensor(p_stats["swap_frac"]).detach()
    stats["loss"] = total.detach() / max(scale.pooled, 1e-12)
    return total, stats


def grad_norm(grads: list[Tensor], flat_sharded: bool = False, device: torch.device | str = "cpu") -> float:
    """Gradient norm over all ranks' shards (DTensor shards under FSDP2; ``flat_sharded``: FSDP1's
    flat shards, one per rank)."""
    norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if flat_sharded:
        return math.sqrt(all_sum([float(norm) ** 2], device)[0])
    return float(norm)


def _default_clip(optimizer: torch.optim.Optimizer, max_norm: float) -> None:
    torch.nn.utils.clip_grad_norm_(
        [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None], max_norm
    )


class UpdateResult(NamedTuple):
    """``stats``: every loss diagnostic averaged over the optimizer steps taken (and ``grad_norm``);
    ``steps``: optimizer steps taken; ``skipped``: steps skipped for a non-finite loss or gradient."""

    stats: dict[str, float]
    steps: int
    skipped: int


def micro_batch_rows(lengths: Tensor, micro: int) -> list[Tensor]:
    """A minibatch's rows in micro-batches of ``micro``: one micro-batch holds them in order; several
    take them sorted by length (``lengths`` [n], stable), so each pads to rows of its own length
    (the loss is a weighted sum over micro-batches, so the grouping changes no gradient)."""
    n = len(lengths)
    order = torch.arange(n) if micro >= n else torch.argsort(lengths, stable=True)
    return [order[s : s + micro] for s in range(0, n, micro)]


def ppo_update(
    batch: TrainBatch,
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer,
    algo: AlgorithmConfig,
    *,
    dummy: TrainBatch,
    generator: torch.Generator,
    replay_weight: float | None = None,
    device: torch.device | str = "cpu",
    backward: Callable[[Tensor], None] = Tensor.backward,
    clip: Callable[[torch.optim.Optimizer, float], None] = _default_clip,
    flat_sharded: bool = False,
    critic_step: Callable[[TrainBatch, float], float] | None = None,
    den: Denominators | None = None,
    no_sync: Callable[[], AbstractContextManager] = contextlib.nullcontext,
) -> UpdateResult:
    """``algo.ppo_epochs`` passes over ``batch`` in minibatches of ``algo.minibatch_size`` rows
    (shuffled by ``generator``), each split into micro-batches of ``algo.micro_batch_size`` whose
    weighted losses ``loss_fn(part, scale)`` are backwarded, then one optimizer step.

    The policy loss is J (module docstring): with ``replay_weight`` α, (1 − α) J_on + α J_off,
    each part the mean over the iteration's rows of its kind as counted in ``den`` (None: the
    rows of ``batch``, i.e. nothing was dropped). A non-finite loss or gradient on any rank never
    reaches the weights: every rank skips that step. ``critic_step(minibatch, all-rank rows)``
    steps a separate critic after each policy step and returns its value loss. ``no_sync()``: the
    context every micro-batch but a minibatch's last runs in (forward and backward), so gradients
    accumulate locally and ranks synchronise once per optimizer step.
    """
    n = len(batch)
    world = world_size()
    den = den if den is not None else denominators(batch, algo.loss_agg, device)
    u_on, u_off = den.unit_weights(replay_weight, algo.minibatch_size * world)
    step = max(den.rows / (algo.minibatch_size * world), 1.0)  # for the terms estimated over every row
    num_minibatches = lockstep_count(math.ceil(n / algo.minibatch_size), device)
    sums: dict[str, float] = {}
    steps = skipped = 0
    for _ in range(algo.ppo_epochs):
        perm = torch.randperm(n, generator=generator)
        for mb_idx in torch.tensor_split(perm, num_minibatches):
            optimizer.zero_grad()
            mb = batch.select(mb_idx)
            micro = algo.micro_batch_size or max(len(mb), 1)
            parts = [mb.select(rows) for rows in micro_batch_rows(mb.attention_mask.sum(-1), micro)]
            counts = gather_values([*loss_sizes(mb, algo.loss_agg), len(mb)], device)  # [world, 3]
            t_on, t_off, rows = (float(counts[:, i].sum()) for i in range(3))  # for the diagnostics' means
            mb_stats: dict[str, float] = {}
            steps_here = list(lockstep(parts, device))
            for i, part in enumerate(steps_here):
                s_on, s_off = loss_sizes(part, algo.loss_agg) if part is not None else (0.0, 0.0)
                scale = Scale(
                    pg_on=u_on * s_on,
                    pg_off=u_off * s_off,
                    pooled=step * (s_on + s_off) / max(den.on + den.off, 1.0),
                    on=step * s_on / max(den.on, 1.0),
                )
                with no_sync() if i < len(steps_here) - 1 else contextlib.nullcontext():
                    loss, st = loss_fn(part if part is not None else dummy, scale)
                    backward(loss * world)
                share = (s_on + s_off) / max(t_on + t_off, 1.0)  # the part's share of the minibatch
                for k, v in st.items():
                    mb_stats[k] = mb_stats.get(k, 0.0) + (float(v) * share if part is not None else 0.0)
            norm = grad_norm(
                [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None],
                flat_sharded,
                device,
            )
            keys = sorted(mb_stats)
            agreed = all_sum([*(mb_stats[k] for k in keys), 0.0 if math.isfinite(norm) else 1.0], device)
            if agreed[-1] > 0 or not all(math.isfinite(v) for v in agreed):
                optimizer.zero_grad()
                skipped += 1
                continue
            for k, v in zip(keys, agreed):
                sums[k] = sums.get(k, 0.0) + v
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + norm
            if algo.max_grad_norm > 0:
                clip(optimizer, algo.max_grad_norm)
            optimizer.step()
            if critic_step is not None:
                sums["value_loss"] = sums.get("value_loss", 0.0) + critic_step(mb, rows)
            steps += 1
    return UpdateResult({k: v / max(steps, 1) for k, v in sums.items()}, steps, skipped)


def critic_step(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg,
    mb: TrainBatch,
    rows: float,
    *,
    dummy: TrainBatch,
    backward: Callable[[Tensor], None] = Tensor.backward,
    device: torch.device | str = "cpu",
) -> float:
    """One step of a separate (asymmetric) critic on minibatch ``mb`` (``cfg``: its ``CriticConfig``);
    the value loss is averaged over the ``rows`` of the minibatch on all ranks (a rank without rows
    backwards ``dummy`` at weight 0). Returns this rank's value loss."""
    optimizer.zero_grad()
    part = mb if len(mb) else dummy
    values = critic(part.critic_rows, device)
    loss = losses.value_loss(values, part.old_values.to(device), part.returns.to(device), cfg.value_clip)
    backward(loss * cfg.value_coef * len(mb) * world_size() / max(rows, 1.0))
    optimizer.step()
    return float(loss) if len(mb) else 0.0


def with_advantages(batch: TrainBatch, result: AdvantageResult) -> TrainBatch:
    """``batch`` with the estimator's advantages (returns, clip scales)."""
    return dataclasses.replace(
        batch,
        advantages=result.advantages.float(),
        **{
            name: value.float()
            for name, value in (("returns", result.returns), ("clip_scale", result.clip_scale))
            if value is not None
        },
    )


def trained_rows(batch: TrainBatch, algo: AlgorithmConfig, needs_critic: bool) -> TrainBatch:
    """``batch`` less the rows of zero advantage under ``drop_zero_advantage`` (when no KL,
    entropy or critic term needs them): a compute saving only, the loss's means still count
    them (``Denominators``)."""
    if algo.drop_zero_advantage and algo.kl_coef == 0 and algo.entropy_coef == 0 and not needs_critic:
        batch = batch.select(torch.nonzero(batch.advantages != 0).flatten())
    return batch


def lightning_clip(module, flat_sharded: bool) -> Callable[[torch.optim.Optimizer, float], None]:
    """``ppo_update``'s ``clip`` for a LightningModule: through Lightning (precision plugins and
    strategies apply), or, under FSDP1 (whose norm clipping Lightning refuses), the root module's
    clipping over all shards."""
    if flat_sharded:
        return lambda opt, norm: module.trainer.strategy.model.clip_grad_norm_(norm)
    return lambda opt, norm: module.clip_gradients(opt, gradient_clip_val=norm, gradient_clip_algorithm="norm")
