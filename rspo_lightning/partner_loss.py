"""The swap-partner auxiliary loss (``algorithm.swap``; off by default): each sample also learns
from a partner sample's advantage. Not RSPO's reward swap (``rspo/loop.py``), which swaps the
*reward* agent B trained on for the outcome reward; this is the seed article's other reading of
"reward swap", kept as an optional regulariser."""

from __future__ import annotations

import torch
from torch import Tensor

from rspo_lightning import choices
from rspo_lightning.losses import clipped_surrogate

PARTNER_STRATEGIES = ("knn", "bucket", "random")
PARTNER_WEIGHTINGS = ("uniform", "softmax")


def partner_coefficient(step: int, lam: float, warmup_steps: int) -> float:
    """Coefficient of the swap-partner loss at ``step``: linear from 0 (step 0) to ``lam``
    (step ``warmup_steps`` and after); ``warmup_steps = 0`` gives ``lam`` from the start."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}; use 0 for no warm-up")
    if warmup_steps == 0:
        return float(lam)
    return float(lam) * min(1.0, step / warmup_steps)


def _find_partners(
    n: int,
    pool: Tensor,
    participants: Tensor,
    strategy: str,
    num_partners: int,
    embeddings: Tensor | None,
    rewards: Tensor | None,
    num_buckets: int | None,
    weighting: str,
    temperature: float,
    generator: torch.Generator | None,
) -> list[tuple[list[int], list[float]]]:
    """Partners S(i) (drawn from ``pool``) and weights w_ij of every sample; empty lists for
    samples outside ``participants``. Computed on the CPU in float64."""
    others = [j for j in range(n) if pool[j]]
    active = [i for i in range(n) if participants[i]]
    out: list[tuple[list[int], list[float]]] = [([], []) for _ in range(n)]
    if strategy == "knn":
        e = embeddings.detach().to("cpu", torch.float64)
        e = e / e.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        sim = e @ e.T
        for i in active:
            cand = torch.tensor([j for j in others if j != i], dtype=torch.long)
            if len(cand) == 0:
                continue
            # stable sort: equal similarities go to the lower index
            order = torch.sort(sim[i, cand], descending=True, stable=True).indices[:num_partners]
            chosen = cand[order]
            if weighting == "softmax":
                w = torch.softmax(sim[i, chosen] / temperature, dim=0).tolist()
            else:
                w = [1.0 / len(chosen)] * len(chosen)
            out[i] = (chosen.tolist(), w)
        return out
    if strategy == "bucket":
        r = rewards.detach().to("cpu", torch.float64)
        if num_buckets is None:
            key = r  # equal reward
        else:
            q = torch.arange(1, num_buckets, dtype=torch.float64) / num_buckets
            bounds = torch.quantile(r[pool], q) if num_buckets > 1 else torch.empty(0, dtype=torch.float64)
            key = torch.searchsorted(bounds, r, right=True).to(torch.float64)
        for i in active:
            mates = [j for j in others if j != i and key[j] == key[i]]
            out[i] = (mates, [])
    else:  # random
        for i in active:
            out[i] = ([j for j in others if j != i], [])
    # bucket / random: up to num_partners drawn uniformly without replacement, uniform weights
    for i in active:
        mates = out[i][0]
        if len(mates) > num_partners:
            pick = torch.randperm(len(mates), generator=generator)[:num_partners].sort().values.tolist()
            mates = [mates[k] for k in pick]
        out[i] = (mates, [1.0 / len(mates)] * len(mates) if mates else [])
    return out


def partner_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    embeddings: Tensor | None = None,
    rewards: Tensor | None = None,
    strategy: str = "knn",
    num_partners: int = 1,
    beta_s: float = 1.0,
    p_swap: float = 1.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: str = "token-mean",
    weighting: str = "uniform",
    temperature: float = 1.0,
    num_buckets: int | None = None,
    behaviour_logprobs: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Swap-partner auxiliary loss: sample j's tokens trained with a similar sample i's advantage.

    The seed article's reading of "reward swap" (docs/design.md §8; not the RSPO paper's replay of an
    explorer's relabelled trajectories, which is ``rspo/loop.py``). For each sample i, with
    probability ``p_swap`` it participates, and its partners S(i) are:

    - ``knn``: the ``num_partners`` others with the highest cosine similarity of ``embeddings``
      (ties to the lower index);
    - ``bucket``: others in i's reward bucket, ``num_buckets=None`` = exactly equal reward (0/1
      outcomes), else quantile buckets: the ``num_buckets - 1`` quantiles of the rewards of
      samples with response tokens cut the line, bucket = how many cuts are <= the reward; up to ``num_partners`` of
      them drawn uniformly;
    - ``random``: ``num_partners`` others drawn uniformly.

    L_swap = (1/|P|) Σ_{i∈P} Σ_{j∈S(i)} w_ij · ℓ_j(β_s·A_i), P = participating samples with at
    least one partner, ℓ_j(a) the PPO-clip term of sample j's ratio with advantage a, reduced over
    j's tokens. w_ij = 1/|S(i)|, or with ``weighting="softmax"`` (knn only) the softmax of the
    partners' cosine similarities / ``temperature``.

    Implementation: one row per pair (i, j) holding j's tokens and the advantage s_ij·β_s·A_i,
    s_ij = w_ij·(#pairs/|P|), reduced by ``clipped_surrogate`` with ``agg`` (the clip term is
    positively homogeneous in the advantage, so scaling A scales the term). With
    ``seq-mean-token-mean`` this is the formula above with ℓ_j = mean over j's tokens; with
    ``seq-mean-token-sum``, the sum over j's tokens; ``token-mean`` divides the pairs' summed
    token terms by the pairs' token count (the same as seq-mean when all rows are equally long).
    Samples without response tokens neither participate nor serve as partners.

    Args:
        logprobs: ``[N, L]`` log-probs under the current policy (the only input with a gradient).
        old_logprobs: ``[N, L]`` log-probs before this update (the ratio's denominator).
        advantages: ``[N]`` per-sample advantage A_i.
        response_mask: ``[N, L]`` 1 on the tokens trained on.
        embeddings: ``[N, D]`` state embeddings (``knn``).
        rewards: ``[N]`` rewards that define the buckets (``bucket``).
        strategy: ``knn`` | ``bucket`` | ``random``.
        num_partners: most partners per sample (k).
        beta_s: scale β_s of the borrowed advantage.
        p_swap: probability that a sample participates.
        eps_low, eps_high: clip half-widths.
        agg: ``token-mean`` | ``seq-mean-token-mean`` | ``seq-mean-token-sum``.
        weighting: ``uniform`` | ``softmax`` (knn only).
        temperature: softmax temperature of ``weighting="softmax"``.
        num_buckets: quantile buckets of ``bucket``; None = equal-reward buckets.
        behaviour_logprobs: ``[N, L]`` for replay rows (generalised clip centre, as in
            ``clipped_surrogate``); None = ``old_logprobs`` (PPO).
        generator: torch RNG of the participation draws and partner sampling (CPU).

    Returns:
        ``(loss, stats)``; the loss is 0 (with a zero gradient) when no sample has a partner.
        Stats (detached): ``swap_frac`` (share of samples in P), ``num_pairs``, ``clip_frac``.
    """
    if strategy not in PARTNER_STRATEGIES:
        raise ValueError(f"strategy must be one of {list(PARTNER_STRATEGIES)}, got {strategy!r}")
    if weighting not in PARTNER_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {list(PARTNER_WEIGHTINGS)}, got {weighting!r}")
    if weighting == "softmax" and strategy != "knn":
        raise ValueError(
            f"weighting='softmax' weighs partners by similarity and needs strategy='knn', got {strategy!r}"
        )
    choices.check("agg", agg, choices.LossAgg)
    if num_partners < 1:
        raise ValueError(f"num_partners must be >= 1, got {num_partners}")
    if not 0.0 <= p_swap <= 1.0:
        raise ValueError(f"p_swap must be in [0, 1], got {p_swap}")
    if not (beta_s == beta_s and abs(beta_s) != float("inf")):
        raise ValueError(f"beta_s must be finite, got {beta_s}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if num_buckets is not None and num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1 or None (equal-reward buckets), got {num_buckets}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [N, L], got shape {tuple(logprobs.shape)}")
    n = logprobs.shape[0]
    behaviour = old_logprobs if behaviour_logprobs is None else behaviour_logprobs
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("behaviour_logprobs", behaviour),
        ("response_mask", response_mask),
    ):
        if t.shape != logprobs.shape:
            raise ValueError(f"{name} must match logprobs' shape {tuple(logprobs.shape)}, got {tuple(t.shape)}")
    if advantages.shape != (n,):
        raise ValueError(f"advantages must be [N]=({n},) (one per sample), got {tuple(advantages.shape)}")
    if strategy == "knn":
        if embeddings is None or embeddings.dim() != 2 or embeddings.shape[0] != n:
            got = None if embeddings is None else tuple(embeddings.shape)
            raise ValueError(f"strategy='knn' needs embeddings [N, D] with N={n}, got {got}")
    if strategy == "bucket":
        if rewards is None or rewards.shape != (n,):
            got = None if rewards is None else tuple(rewards.shape)
            raise ValueError(f"strategy='bucket' needs rewards [N]=({n},), got {got}")

    on = response_mask != 0
    pool = on.any(-1).cpu()  # samples with response tokens
    participants = pool & (torch.rand(n, generator=generator) < p_swap) if p_swap < 1.0 else pool
    partners = _find_partners(
        n,
        pool,
        participants,
        strategy,
        num_partners,
        embeddings,
        rewards,
        num_buckets,
        weighting,
        temperature,
        generator,
    )
    rows_i, rows_j, weights = [], [], []
    for i, (mates, w) in enumerate(partners):
        rows_i += [i] * len(mates)
        rows_j += mates
        weights += w
    num_participating = sum(1 for mates, _ in partners if mates)
    zero = logprobs.new_zeros(())
    if not rows_j:
        loss = torch.where(on, logprobs, torch.zeros_like(logprobs)).sum() * 0.0
        return loss, {"swap_frac": zero, "num_pairs": zero, "clip_frac": zero}

    device = logprobs.device
    i_idx = torch.tensor(rows_i, dtype=torch.long, device=device)
    j_idx = torch.tensor(rows_j, dtype=torch.long, device=device)
    scale = torch.tensor(weights, dtype=torch.float64) * (len(rows_j) / num_participating)
    adv = beta_s * advantages.detach()[i_idx].to(torch.float64) * scale.to(device)
    loss, stats = clipped_surrogate(
        logprobs[j_idx],
        old_logprobs[j_idx],
        behaviour[j_idx],
        adv.to(logprobs.dtype),
        response_mask[j_idx],
        eps_low=eps_low,
        eps_high=eps_high,
        agg=agg,
    )
    return loss, {
        "swap_frac": zero + num_participating / n,
        "num_pairs": zero + len(rows_j),
        "clip_frac": stats["clip_frac"],
    }
