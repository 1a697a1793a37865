"""Policy and critic losses: pure functions over padded ``[N, L]`` token tensors.

N = turn samples, L = padded length; ``response_mask`` marks the tokens trained on. Log-probs
are aligned to the token they score and only read where the mask is set, so padding may hold
anything (0, -inf, garbage) without producing NaN in the loss or its gradient.
The paper -> code map and deviations: docs/algorithms.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rspo_lightning import choices


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
    choices.check("agg", agg, choices.LossAgg)
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
            raise ValueError(f"{name} must have one entry per row (N={n}), got shape {tuple(x.shape)}")
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
    choices.check("agg", agg, choices.LossAgg)
    choices.check("clip_mode", clip_mode, choices.ClipMode)
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
            raise ValueError(f"{name} must match logprobs' shape {tuple(shape)}, got {tuple(t.shape)}")
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
    choices.check("kind", kind, choices.KlEstimator)
    if kind == "k1":
        return logprobs - ref_logprobs
    diff = ref_logprobs - logprobs
    if kind == "low_var_kl":
        diff = diff.clamp(-20.0, 20.0)
        return (torch.expm1(diff) - diff).clamp(-10.0, 10.0)
    return torch.expm1(diff) - diff


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip_range: float = 0.2) -> Tensor:
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


def response_token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    allowed_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``targets`` and entropies under ``softmax(logits / temperature)``.

    With ``allowed_ids`` (constrained decoding), positions that have allowed ids use the
    distribution renormalised over only those ids, as the sampler did:
    ``logprob = z_target - logsumexp(z_allowed)``, ``entropy = -sum_{a in allowed} p_a log p_a``,
    with ``z = logits / temperature``. Only ``[N, L, K]`` values are gathered; no ``[N, L, V]``
    mask is built. The target must be one of the allowed ids at a constrained position (not
    checked, to avoid a device sync).

    Args:
        logits: ``[N, L, V]`` next-token logits aligned with ``targets`` (position t predicts
            ``targets[:, t]``); computed in float32 when given in lower precision.
        targets: ``[N, L]`` int64 token ids; padding positions need any valid id (e.g. pad).
        temperature: sampling temperature (> 0) the behaviour policy used.
        allowed_ids: ``[N, L, K]`` int64 allowed ids padded with -1; a row of all -1 is an
            unconstrained position. None = unconstrained everywhere.

    Returns:
        ``(logprobs [N, L], entropy [N, L])``, float32.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}; greedy decoding is scored at temperature 1.")
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits [N, L, V] and targets [N, L] disagree: {tuple(logits.shape)} vs {tuple(targets.shape)}."
        )
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    log_norm = torch.logsumexp(z, dim=-1)  # [N, L]
    target_z = z.gather(-1, targets.unsqueeze(-1).long()).squeeze(-1)
    logprobs = target_z - log_norm
    entropy = log_norm - (torch.softmax(z, dim=-1) * z).sum(-1)
    if allowed_ids is None or allowed_ids.shape[-1] == 0:
        return logprobs, entropy

    if allowed_ids.shape[:-1] != targets.shape:
        raise ValueError(
            f"allowed_ids must be [N, L, K] with [N, L] = {tuple(targets.shape)}, got {tuple(allowed_ids.shape)}."
        )
    valid = allowed_ids >= 0  # [N, L, K]
    constrained = valid.any(-1)  # [N, L]
    # Unconstrained rows keep slot 0 "valid" (index 0) so every logsumexp stays finite: a NaN
    # in the branch torch.where discards would still poison the gradient.
    first_slot = torch.zeros_like(valid)
    first_slot[..., 0] = True
    valid = valid | (first_slot & ~constrained.unsqueeze(-1))
    allowed_z = z.gather(-1, allowed_ids.clamp(min=0).long())  # [N, L, K]
    masked_z = allowed_z.masked_fill(~valid, float("-inf"))
    allowed_log_norm = torch.logsumexp(masked_z, dim=-1)
    allowed_probs = torch.exp(masked_z - allowed_log_norm.unsqueeze(-1))
    allowed_entropy = allowed_log_norm - (allowed_probs * allowed_z.masked_fill(~valid, 0.0)).sum(-1)
    logprobs = torch.where(constrained, target_z - allowed_log_norm, logprobs)
    entropy = torch.where(constrained, allowed_entropy, entropy)
    return logprobs, entropy
