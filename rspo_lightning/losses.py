"""Policy and critic losses: pure functions over padded ``[N, L]`` token tensors.

N = turn samples, L = padded length; ``response_mask`` marks the tokens trained on. Log-probs
are aligned to the token they score and only read where the mask is set, so padding may hold
anything (0, -inf, garbage) without producing NaN in the loss or its gradient.
The paper -> code map and deviations: docs/algorithms.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_KINDS = ("k1", "k3", "low_var_kl")
CLIP_MODES = ("additive", "multiplicative")


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` where ``mask`` is non-zero (``mask`` may be bool or float weights).

    Entries outside the mask are never read (NaN/inf there do not leak); an empty mask gives 0,
    with a zero (not NaN) gradient.
    """
    mask = mask.to(x.dtype)
    x = torch.where(mask != 0, x, torch.zeros_like(x))
    if dim is None:
        total, count = (x * mask).sum(), mask.sum()
    else:
        total, count = (x * mask).sum(dim), mask.sum(dim)
    nonempty = count != 0
    return torch.where(nonempty, total / torch.where(nonempty, count, torch.ones_like(count)), 0.0)


def aggregate(loss_mat: Tensor, mask: Tensor, agg: str = "token-mean") -> Tensor:
    """Reduce a per-token loss ``[N, L]`` to a scalar.

    ``"token-mean"``: sum over all response tokens / number of response tokens.
    ``"seq-mean-token-mean"``: mean over each row's tokens, then mean over rows.
    ``"seq-mean-token-sum"``: sum over each row's tokens, then mean over rows.
    The row means skip rows without response tokens; an all-empty batch gives 0.
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {list(AGGREGATIONS)}, got {agg!r}")
    if agg == "token-mean":
        return masked_mean(loss_mat, mask)
    mask = mask.to(loss_mat.dtype)
    has_tokens = mask.sum(-1) != 0
    if agg == "seq-mean-token-mean":
        per_row = masked_mean(loss_mat, mask, dim=-1)
    else:
        per_row = (torch.where(mask != 0, loss_mat, torch.zeros_like(loss_mat)) * mask).sum(-1)
    return masked_mean(per_row, has_tokens)


def _per_row(x: Tensor | float, name: str, n: int, like: Tensor) -> Tensor | float:
    """A float, or an ``[N]`` / ``[N, L]`` tensor made broadcastable against ``[N, L]``."""
    if not isinstance(x, Tensor):
        return float(x)
    x = x.to(device=like.device, dtype=like.dtype)
    if x.dim() == 0:
        return x
    if x.dim() == 1:
        if x.shape[0] != n:
            raise ValueError(
                f"{name} must have one entry per row (N={n}), got shape {tuple(x.shape)}"
            )
        return x.unsqueeze(-1)
    if x.shape != like.shape:
        raise ValueError(f"{name} must be [N] or [N, L]={tuple(like.shape)}, got {tuple(x.shape)}")
    return x


def clipped_surrogate(
    logprobs: Tensor,
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    eps_low: float | Tensor = 0.2,
    eps_high: float | Tensor = 0.2,
    agg: str = "token-mean",
    max_centre: float | None = None,
    clip_mode: str = "additive",
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with a generalised clip centre (RSPO's off-policy replay).

    Per token: rho = exp(logp - logp_behaviour), c = exp(logp_old - logp_behaviour), capped to
    min(c, max_centre) when ``max_centre`` is set, and
    L = -min(rho A, clip(rho, lower, upper) A) with

    - ``clip_mode="additive"`` (default): [max(c - eps_low, 0), c + eps_high];
    - ``clip_mode="multiplicative"``: [max(c (1 - eps_low), 0), c (1 + eps_high)], a trust region
      relative to c, so a replay token with small c keeps a proportionally narrow window.

    On-policy rows have behaviour = old, so c = 1, both modes give [1 - eps_low, 1 + eps_high] and
    this is exactly PPO (Schulman et al., arXiv 1707.06347). Since rho > 0, a lower bound of 0
    never binds: with the additive window and c <= eps_low, an A < 0 token is not clipped from
    below at all (only the multiplicative window, c (1 - eps_low) > 0, still clips it).

    Args:
        logprobs: ``[N, L]`` log-probs under the current policy (the only input with a gradient).
        old_logprobs: ``[N, L]`` log-probs under the policy before this update.
        behaviour_logprobs: ``[N, L]`` log-probs under the policy that generated the tokens.
        advantages: ``[N]`` per-turn or ``[N, L]`` per-token advantage.
        response_mask: ``[N, L]`` 1 on the tokens trained on.
        eps_low: lower clip half-width, a float or ``[N]`` per turn (A²TGPO's adaptive clip).
        eps_high: upper clip half-width, a float or ``[N]`` per turn.
        agg: ``"token-mean"`` | ``"seq-mean-token-mean"`` | ``"seq-mean-token-sum"``.
        max_centre: cap on the clip centre c (> 0), so a replay token whose old policy likes it
            far more than its behaviour policy did cannot get a window (and gradient) many times
            an on-policy token's; None = no cap. It does not change rho.
        clip_mode: ``"additive"`` (c ± eps) or ``"multiplicative"`` (c · (1 ± eps)).

    Returns:
        ``(loss, stats)``: the scalar loss and detached diagnostics: ``clip_frac`` (fraction of
        response tokens where the clipped term was the active, strictly smaller, minimum),
        ``approx_kl`` (k3 estimate of KL(old || current): mean of (r - 1) - log r with
        r = exp(logp - logp_old)), ``ratio_mean`` (mean of rho, the ratio to behaviour) and
        ``centre_mean`` (mean of the clip centre c after the ``max_centre`` cap; 1 on-policy).
    """
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {list(AGGREGATIONS)}, got {agg!r}")
    if clip_mode not in CLIP_MODES:
        raise ValueError(f"clip_mode must be one of {list(CLIP_MODES)}, got {clip_mode!r}")
    if max_centre is not None:
        is_number = isinstance(max_centre, (int, float)) and not isinstance(max_centre, bool)
        if not (is_number and max_centre > 0):
            raise ValueError(
                f"max_centre must be > 0 or None, got {max_centre!r}; pass e.g. 2.0 to cap the "
                f"clip centre at twice the on-policy one, or None for no cap"
            )
    shape = logprobs.shape
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [N, L], got shape {tuple(shape)}")
    for name, t in (
        ("old_logprobs", old_logprobs),
        ("behaviour_logprobs", behaviour_logprobs),
        ("response_mask", response_mask),
    ):
        if t.shape != shape:
            raise ValueError(
                f"{name} must match logprobs' shape {tuple(shape)}, got {tuple(t.shape)}"
            )
    n = shape[0]
    mask = response_mask.to(logprobs.dtype)
    on = mask != 0
    zero = torch.zeros_like(logprobs)
    adv = _per_row(advantages.detach(), "advantages", n, logprobs)
    lo = _per_row(eps_low, "eps_low", n, logprobs)
    hi = _per_row(eps_high, "eps_high", n, logprobs)

    old = old_logprobs.detach().to(logprobs.dtype)
    behaviour = behaviour_logprobs.detach().to(logprobs.dtype)
    # Mask before exp: padding may hold -inf, and exp(nan) would poison the gradient.
    rho = torch.exp(torch.where(on, logprobs - behaviour, zero))
    centre = torch.exp(torch.where(on, old - behaviour, zero))
    if max_centre is not None:
        centre = centre.clamp(max=float(max_centre))
    if clip_mode == "additive":
        lower, upper = centre - lo, centre + hi
    else:
        lower, upper = centre * (1.0 - lo), centre * (1.0 + hi)
    lower = lower.clamp(min=0.0)  # a ratio is never negative; rho > 0 never falls below it
    clipped = torch.minimum(torch.maximum(rho, lower), upper)
    adv = torch.where(on, adv, zero)  # padding rows may carry NaN advantages
    surr = rho * adv
    surr_clipped = clipped * adv
    loss_mat = -torch.minimum(surr, surr_clipped)
    loss = aggregate(loss_mat, mask, agg)

    with torch.no_grad():
        log_ratio_old = torch.where(on, logprobs - old, zero)
        k3 = torch.expm1(log_ratio_old) - log_ratio_old
        stats = {
            "clip_frac": masked_mean((surr_clipped < surr).to(logprobs.dtype), mask),
            "approx_kl": masked_mean(k3, mask),
            "ratio_mean": masked_mean(rho, mask),
            "centre_mean": masked_mean(centre, mask),
        }
    return loss, stats


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(current || reference) from sampled-token log-probs.

    ``"k1"``: logp - ref. ``"k3"``: exp(ref - logp) - (ref - logp) - 1 (Schulman's unbiased,
    non-negative estimator). ``"low_var_kl"``: k3 clamped as verl does (log-ratio to [-20, 20],
    result to [-10, 10]).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kind must be one of {list(KL_KINDS)}, got {kind!r}")
    if kind == "k1":
        return logprobs - ref_logprobs
    diff = ref_logprobs - logprobs
    if kind == "low_var_kl":
        diff = diff.clamp(-20.0, 20.0)
        return (torch.expm1(diff) - diff).clamp(-10.0, 10.0)
    return torch.expm1(diff) - diff


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy ``[...]`` of the categorical distribution at each position of ``logits [..., V]``.

    Computed from log_softmax (stable for large logits); half-precision input is upcast to
    float32. Logits of -inf (tokens excluded by constrained decoding) contribute 0, with a
    finite gradient.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    logp = logp.masked_fill(~torch.isfinite(logp), 0.0)
    return -(p * logp).sum(-1)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip_range: float = 0.2
) -> Tensor:
    """Clipped critic loss (PPO2): 0.5 max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2).

    All inputs ``[N]``; returns the mean over rows.
    """
    if not values.shape == old_values.shape == returns.shape:
        raise ValueError(
            f"values, old_values and returns must share a shape, got {tuple(values.shape)}, "
            f"{tuple(old_values.shape)}, {tuple(returns.shape)}"
        )
    old = old_values.detach()
    target = returns.detach()
    clipped = old + (values - old).clamp(-clip_range, clip_range)
    return 0.5 * torch.maximum((values - target) ** 2, (clipped - target) ** 2).mean()


SWAP_STRATEGIES = ("knn", "bucket", "random")
SWAP_WEIGHTINGS = ("uniform", "softmax")


def swap_lambda(step: int, lam: float, warmup_steps: int) -> float:
    """Coefficient of the swap-partner loss at ``step``: linear from 0 (step 0) to ``lam``
    (step ``warmup_steps`` and after); ``warmup_steps = 0`` gives ``lam`` from the start."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}; use 0 for no warm-up")
    if warmup_steps == 0:
        return float(lam)
    return float(lam) * min(1.0, step / warmup_steps)


def _swap_partners(
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


def swap_partner_loss(
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

    The seed article's reading of "reward swap" (DESIGN §8; not the RSPO paper's replay of an
    explorer's relabelled trajectories, which is ``callbacks/rspo.py``). For each sample i, with
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
    if strategy not in SWAP_STRATEGIES:
        raise ValueError(f"strategy must be one of {list(SWAP_STRATEGIES)}, got {strategy!r}")
    if weighting not in SWAP_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {list(SWAP_WEIGHTINGS)}, got {weighting!r}")
    if weighting == "softmax" and strategy != "knn":
        raise ValueError(f"weighting='softmax' weighs partners by similarity and needs strategy='knn', got {strategy!r}")
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {list(AGGREGATIONS)}, got {agg!r}")
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
    for name, t in (("old_logprobs", old_logprobs), ("behaviour_logprobs", behaviour), ("response_mask", response_mask)):
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
    partners = _swap_partners(n, pool, participants, strategy, num_partners, embeddings, rewards, num_buckets, weighting,
                              temperature, generator)
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
        logprobs[j_idx], old_logprobs[j_idx], behaviour[j_idx], adv.to(logprobs.dtype), response_mask[j_idx],
        eps_low=eps_low, eps_high=eps_high, agg=agg,
    )
    return loss, {
        "swap_frac": zero + num_participating / n,
        "num_pairs": zero + len(rows_j),
        "clip_frac": stats["clip_frac"],
    }
