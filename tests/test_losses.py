"""Losses against values worked out by hand (never by calling the code under test)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from rspo_lightning.losses import (
    aggregate,
    clipped_surrogate,
    kl_penalty,
    masked_mean,
    value_loss,
)

LOG = math.log


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def close(actual, expected):
    assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=1e-9, atol=1e-9)


# Two rows, three positions; row 1's last position is padding.
# Ratios to old (= behaviour, on-policy): row 0 (1.5, 0.5, 1.1), row 1 (1.5, 0.5, pad).
# Row 0, A = 2: surr (3, 1, 2.2); clip(r, 0.8, 1.2) = (1.2, 0.8, 1.1) -> clipped (2.4, 1.6, 2.2)
#   min (2.4, 1, 2.2) -> loss terms (-2.4, -1, -2.2); clipped term active only at token 0.
# Row 1, A = -1: surr (-1.5, -0.5); clipped (-1.2, -0.8) -> min (-1.5, -0.8) -> terms (1.5, 0.8);
#   clipped term active only at token 1.
ON_POLICY_TERMS = [[-2.4, -1.0, -2.2], [1.5, 0.8]]


def on_policy_batch():
    old = t([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]])
    ratios = t([[1.5, 0.5, 1.1], [1.5, 0.5, 1.0]])
    logp = (old + ratios.log()).requires_grad_(True)
    mask = t([[1, 1, 1], [1, 1, 0]])
    return logp, old, old.clone(), t([2.0, -1.0]), mask


def test_on_policy_equals_ppo_by_hand():
    logp, old, behaviour, adv, mask = on_policy_batch()
    loss, stats = clipped_surrogate(logp, old, behaviour, adv, mask)
    close(loss, (-2.4 - 1.0 - 2.2 + 1.5 + 0.8) / 5)
    close(stats["clip_frac"], 2 / 5)
    k3 = lambda r: (r - 1) - LOG(r)  # noqa: E731
    close(stats["approx_kl"], (2 * k3(1.5) + 2 * k3(0.5) + k3(1.1)) / 5)
    close(stats["ratio_mean"], (1.5 + 0.5 + 1.1 + 1.5 + 0.5) / 5)
    loss.backward()
    # d/dlogp of -(r*A)/5 where the unclipped term is active: -r*A/5; clipped tokens: 0
    close(logp.grad, [[0.0, -0.5 * 2 / 5, -1.1 * 2 / 5], [1.5 * 1 / 5, 0.0, 0.0]])


def test_aggregations():
    logp, old, behaviour, adv, mask = on_policy_batch()
    row0, row1 = ON_POLICY_TERMS
    loss, _ = clipped_surrogate(logp, old, behaviour, adv, mask, agg="seq-mean-token-mean")
    close(loss, (sum(row0) / 3 + sum(row1) / 2) / 2)
    loss, _ = clipped_surrogate(logp, old, behaviour, adv, mask, agg="seq-mean-token-sum")
    close(loss, (sum(row0) + sum(row1)) / 2)
    with pytest.raises(ValueError, match="agg"):
        clipped_surrogate(logp, old, behaviour, adv, mask, agg="sum")


def test_generalised_centre_off_policy():
    # behaviour logp 0 everywhere; old = log 1.5 -> centre c = 1.5; clip range [1.3, 1.7].
    # rho = (2.0, 1.0, 1.6). PPO around 1 would clip to [0.8, 1.2] instead.
    behaviour = t([[0.0, 0.0, 0.0]])
    old = t([[LOG(1.5)] * 3])
    logp = t([[LOG(2.0), LOG(1.0), LOG(1.6)]])
    mask = t([[1, 1, 1]])
    # A = +1: surr (2, 1, 1.6); clipped (1.7, 1.3, 1.6); min (1.7, 1, 1.6)
    loss, stats = clipped_surrogate(logp, old, behaviour, t([1.0]), mask)
    close(loss, -(1.7 + 1.0 + 1.6) / 3)
    close(stats["clip_frac"], 1 / 3)
    close(stats["ratio_mean"], (2.0 + 1.0 + 1.6) / 3)
    k3 = lambda r: (r - 1) - LOG(r)  # noqa: E731  (ratio to old = rho / c)
    close(stats["approx_kl"], (k3(2.0 / 1.5) + k3(1.0 / 1.5) + k3(1.6 / 1.5)) / 3)
    # A = -1: surr (-2, -1, -1.6); clipped (-1.7, -1.3, -1.6); min (-2, -1.3, -1.6)
    loss, stats = clipped_surrogate(logp, old, behaviour, t([-1.0]), mask)
    close(loss, (2.0 + 1.3 + 1.6) / 3)
    close(stats["clip_frac"], 1 / 3)
    # asymmetric eps: eps_low 0.1, eps_high 0.3 -> range [1.4, 1.8]; A = +1:
    # clipped (1.8, 1.4, 1.6) -> min (1.8, 1.0, 1.6)
    loss, _ = clipped_surrogate(logp, old, behaviour, t([1.0]), mask, eps_low=0.1, eps_high=0.3)
    close(loss, -(1.8 + 1.0 + 1.6) / 3)


def test_per_turn_eps_tensor():
    # one token per row, on-policy. Rows 0-1: ratio 1.5, A = +1, eps_high (0.1, 0.3)
    #   -> clipped at 1.1 and 1.3. Rows 2-3: ratio 0.5, A = -1, eps_low (0.1, 0.3)
    #   -> clipped at 0.9 and 0.7: surr -0.5 vs clipped -0.9 / -0.7 -> min -0.9 / -0.7.
    old = t([[0.0], [0.0], [0.0], [0.0]])
    logp = t([[LOG(1.5)], [LOG(1.5)], [LOG(0.5)], [LOG(0.5)]])
    adv = t([1.0, 1.0, -1.0, -1.0])
    eps = t([0.1, 0.3, 0.1, 0.3])
    mask = torch.ones(4, 1, dtype=torch.float64)
    loss, stats = clipped_surrogate(logp, old, old, adv, mask, eps_low=eps, eps_high=eps)
    close(loss, (-1.1 - 1.3 + 0.9 + 0.7) / 4)
    close(stats["clip_frac"], 1.0)


def test_token_level_advantages():
    old = t([[0.0, 0.0]])
    logp = t([[LOG(1.1), LOG(1.1)]])
    adv = t([[1.0, -2.0]])  # per token; ratio 1.1 inside [0.8, 1.2]: terms (-1.1, 2.2)
    loss, _ = clipped_surrogate(logp, old, old, adv, t([[1, 1]]))
    close(loss, (-1.1 + 2.2) / 2)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_fully_masked_row_is_ignored_and_finite(agg):
    # row 0 as in the on-policy batch; row 1 fully masked and full of -inf / huge numbers
    old = t([[-1.0, -2.0, -0.5], [float("-inf"), 50.0, 0.0]])
    behaviour = t([[-1.0, -2.0, -0.5], [float("-inf"), -50.0, 0.0]])
    logp = t([[-1.0 + LOG(1.5), -2.0 + LOG(0.5), -0.5 + LOG(1.1)], [float("-inf"), 80.0, 0.0]])
    logp.requires_grad_(True)
    mask = t([[1, 1, 1], [0, 0, 0]])
    loss, stats = clipped_surrogate(logp, old, behaviour, t([2.0, float("nan")]), mask, agg=agg)
    row0 = ON_POLICY_TERMS[0]
    expected = {
        "token-mean": sum(row0) / 3,
        "seq-mean-token-mean": sum(row0) / 3,
        "seq-mean-token-sum": sum(row0),
    }[agg]
    close(loss, expected)
    assert all(torch.isfinite(v) for v in stats.values())
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    close(logp.grad[1], [0.0, 0.0, 0.0])


def test_all_masked_batch_gives_zero():
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 3)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        loss, stats = clipped_surrogate(logp, logp.detach(), logp.detach(), t([1.0, 1.0]), mask, agg=agg)
        close(loss, 0.0)
        loss.backward()
        assert torch.isfinite(logp.grad).all()
        close(stats["clip_frac"], 0.0)


def single_token_rows(centre, ratios):
    """One response token per row: behaviour logp 0, old logp log(centre) (so c = centre),
    current logp log(ratio) (so rho = ratio); the current log-probs require a gradient."""
    n = len(ratios)
    behaviour = torch.zeros(n, 1, dtype=torch.float64)
    old = t([[LOG(centre)]] * n)
    logp = t([[LOG(r)] for r in ratios]).requires_grad_(True)
    return logp, old, behaviour, torch.ones(n, 1, dtype=torch.float64)


def test_additive_clip_with_centre_below_eps_low():
    # c = 0.1, eps 0.2: window [max(0.1 - 0.2, 0), 0.1 + 0.2] = [0, 0.3].
    # row 0: rho 0.05, A -1: clip 0.05 (above 0) -> min(-0.05, -0.05) -> term 0.05, unclipped
    # row 1: rho 0.5,  A +1: clip 0.3 -> min(0.5, 0.3) = 0.3 -> term -0.3, clipped
    # row 2: rho 0.5,  A -1: clip 0.3 -> min(-0.5, -0.3) = -0.5 -> term 0.5, unclipped
    # row 3: rho 0.2,  A +1: inside -> term -0.2, unclipped
    logp, old, behaviour, mask = single_token_rows(0.1, [0.05, 0.5, 0.5, 0.2])
    loss, stats = clipped_surrogate(logp, old, behaviour, t([-1.0, 1.0, -1.0, 1.0]), mask)
    close(loss, (0.05 - 0.3 + 0.5 - 0.2) / 4)
    close(stats["clip_frac"], 1 / 4)
    close(stats["centre_mean"], 0.1)
    close(stats["ratio_mean"], (0.05 + 0.5 + 0.5 + 0.2) / 4)
    loss.backward()
    # unclipped token: d(-rho A / 4)/dlogp = -rho A / 4; clipped token: exactly 0
    close(logp.grad, [[0.05 / 4], [0.0], [0.5 / 4], [-0.2 / 4]])


def test_multiplicative_clip_with_centre_below_eps_low():
    # c = 0.1, eps 0.2: window [0.1 * 0.8, 0.1 * 1.2] = [0.08, 0.12].
    # row 0: rho 0.05, A -1: clip 0.08 -> min(-0.05, -0.08) = -0.08 -> term 0.08, clipped
    #   (the additive window [0, 0.3] leaves this token unclipped)
    # row 1: rho 0.5,  A +1: clip 0.12 -> term -0.12, clipped
    # row 2: rho 0.1,  A +1: inside -> term -0.1, unclipped
    # row 3: rho 0.1,  A -1: inside -> term 0.1, unclipped
    logp, old, behaviour, mask = single_token_rows(0.1, [0.05, 0.5, 0.1, 0.1])
    adv = t([-1.0, 1.0, 1.0, -1.0])
    loss, stats = clipped_surrogate(logp, old, behaviour, adv, mask, clip_mode="multiplicative")
    close(loss, (0.08 - 0.12 - 0.1 + 0.1) / 4)
    close(stats["clip_frac"], 2 / 4)
    close(stats["centre_mean"], 0.1)
    loss.backward()
    close(logp.grad, [[0.0], [0.0], [-0.1 / 4], [0.1 / 4]])


# c = 2: rho (3.0, 1.0, 1.0, 3.0, 2.3) with A (+1, -1, +1, -1, +1)
BIG_CENTRE_RATIOS = [3.0, 1.0, 1.0, 3.0, 2.3]
BIG_CENTRE_ADV = [1.0, -1.0, 1.0, -1.0, 1.0]


def test_additive_clip_with_centre_above_one():
    # window [2 - 0.2, 2 + 0.2] = [1.8, 2.2]
    # row 0: 3.0, +1: clip 2.2 -> min(3, 2.2) -> -2.2, clipped
    # row 1: 1.0, -1: clip 1.8 -> min(-1, -1.8) -> 1.8, clipped
    # row 2: 1.0, +1: clip 1.8 -> min(1, 1.8) -> -1.0, unclipped
    # row 3: 3.0, -1: clip 2.2 -> min(-3, -2.2) -> 3.0, unclipped
    # row 4: 2.3, +1: clip 2.2 -> -2.2, clipped
    logp, old, behaviour, mask = single_token_rows(2.0, BIG_CENTRE_RATIOS)
    loss, stats = clipped_surrogate(logp, old, behaviour, t(BIG_CENTRE_ADV), mask)
    close(loss, (-2.2 + 1.8 - 1.0 + 3.0 - 2.2) / 5)
    close(stats["clip_frac"], 3 / 5)
    close(stats["centre_mean"], 2.0)
    loss.backward()
    close(logp.grad, [[0.0], [0.0], [-1.0 / 5], [3.0 / 5], [0.0]])


def test_multiplicative_clip_with_centre_above_one():
    # window [2 * 0.8, 2 * 1.2] = [1.6, 2.4]
    # row 0: 3.0, +1: clip 2.4 -> -2.4, clipped
    # row 1: 1.0, -1: clip 1.6 -> min(-1, -1.6) -> 1.6, clipped
    # row 2: 1.0, +1: -> -1.0, unclipped
    # row 3: 3.0, -1: clip 2.4 -> min(-3, -2.4) -> 3.0, unclipped
    # row 4: 2.3, +1: inside [1.6, 2.4] -> -2.3, unclipped
    logp, old, behaviour, mask = single_token_rows(2.0, BIG_CENTRE_RATIOS)
    loss, stats = clipped_surrogate(logp, old, behaviour, t(BIG_CENTRE_ADV), mask, clip_mode="multiplicative")
    close(loss, (-2.4 + 1.6 - 1.0 + 3.0 - 2.3) / 5)
    close(stats["clip_frac"], 2 / 5)
    loss.backward()
    close(logp.grad, [[0.0], [0.0], [-1.0 / 5], [3.0 / 5], [-2.3 / 5]])


def test_multiplicative_equals_additive_on_policy():
    # c = 1: both windows are [0.8, 1.2]; the on-policy batch's hand-computed loss
    logp, old, behaviour, adv, mask = on_policy_batch()
    loss, stats = clipped_surrogate(logp, old, behaviour, adv, mask, clip_mode="multiplicative")
    close(loss, (-2.4 - 1.0 - 2.2 + 1.5 + 0.8) / 5)
    close(stats["clip_frac"], 2 / 5)
    close(stats["centre_mean"], 1.0)


def test_max_centre_caps_the_centre():
    # raw c = 2, max_centre 1 -> c = 1, additive window [0.8, 1.2]; rho itself is unchanged
    # row 0: rho 3.0, +1: clip 1.2 -> -1.2, clipped
    # row 1: rho 1.0, -1: inside -> 1.0, unclipped
    # row 2: rho 0.5, -1: clip 0.8 -> min(-0.5, -0.8) -> 0.8, clipped
    # row 3: rho 1.1, +1: inside -> -1.1, unclipped
    logp, old, behaviour, mask = single_token_rows(2.0, [3.0, 1.0, 0.5, 1.1])
    adv = t([1.0, -1.0, -1.0, 1.0])
    loss, stats = clipped_surrogate(logp, old, behaviour, adv, mask, max_centre=1.0)
    close(loss, (-1.2 + 1.0 + 0.8 - 1.1) / 4)
    close(stats["clip_frac"], 2 / 4)
    close(stats["centre_mean"], 1.0)
    close(stats["ratio_mean"], (3.0 + 1.0 + 0.5 + 1.1) / 4)
    loss.backward()
    close(logp.grad, [[0.0], [1.0 / 4], [0.0], [-1.1 / 4]])
    # multiplicative with the cap at 1.5: window [1.2, 1.8]
    # rho 3.0 +1 -> -1.8 (clipped); 1.0 -1 -> clip 1.2 -> 1.2 (clipped);
    # 0.5 -1 -> clip 1.2 -> 1.2 (clipped); 1.1 +1 -> min(1.1, 1.2) -> -1.1 (unclipped)
    loss, stats = clipped_surrogate(logp, old, behaviour, adv, mask, max_centre=1.5, clip_mode="multiplicative")
    close(loss, (-1.8 + 1.2 + 1.2 - 1.1) / 4)
    close(stats["clip_frac"], 3 / 4)
    close(stats["centre_mean"], 1.5)


def test_max_centre_leaves_smaller_centres_alone():
    # rows with c = 0.5 and c = 2, cap 1: centres (0.5, 1.0), windows [0.3, 0.7] and [0.8, 1.2]
    # row 0: rho 0.6, +1: inside -> -0.6 ; row 1: rho 1.1, +1: inside -> -1.1
    behaviour = t([[0.0], [0.0]])
    old = t([[LOG(0.5)], [LOG(2.0)]])
    logp = t([[LOG(0.6)], [LOG(1.1)]])
    mask = t([[1], [1]])
    loss, stats = clipped_surrogate(logp, old, behaviour, t([1.0, 1.0]), mask, max_centre=1.0)
    close(loss, (-0.6 - 1.1) / 2)
    close(stats["centre_mean"], (0.5 + 1.0) / 2)
    close(stats["clip_frac"], 0.0)
    # without the cap row 1's window is [1.8, 2.2]: min(1.1, 1.8) -> -1.1, still unclipped
    _, stats = clipped_surrogate(logp, old, behaviour, t([1.0, 1.0]), mask)
    close(stats["centre_mean"], (0.5 + 2.0) / 2)


def test_bad_clip_options_name_the_value():
    logp, old, behaviour, mask = single_token_rows(1.0, [1.0])
    for bad in (0, -1, 0.0, float("nan")):
        with pytest.raises(ValueError, match=f"max_centre must be > 0 or None, got {bad!r}"):
            clipped_surrogate(logp, old, behaviour, t([1.0]), mask, max_centre=bad)
    with pytest.raises(ValueError, match=r"clip_mode must be one of \['additive', 'multiplicative'\], got 'mul'"):
        clipped_surrogate(logp, old, behaviour, t([1.0]), mask, clip_mode="mul")


def test_shape_mismatch_names_argument():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="old_logprobs"):
        clipped_surrogate(x, torch.zeros(2, 2), x, torch.zeros(2), x)
    with pytest.raises(ValueError, match="eps_low"):
        clipped_surrogate(x, x, x, torch.zeros(2), x, eps_low=torch.zeros(3))
    with pytest.raises(ValueError, match="advantages"):
        clipped_surrogate(x, x, x, torch.zeros(5), x)


def test_masked_mean_and_aggregate():
    x = t([[1.0, 2.0, 100.0], [4.0, float("nan"), float("inf")]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    close(masked_mean(x, mask), (1 + 2 + 4) / 3)
    close(masked_mean(x, mask, dim=-1), [1.5, 4.0])
    close(masked_mean(x, torch.zeros_like(mask)), 0.0)
    close(aggregate(x, mask, "token-mean"), 7 / 3)
    close(aggregate(x, mask, "seq-mean-token-mean"), (1.5 + 4.0) / 2)
    close(aggregate(x, mask, "seq-mean-token-sum"), (3.0 + 4.0) / 2)


def test_kl_penalty_by_hand():
    logp, ref = t([LOG(0.5)]), t([LOG(0.25)])
    close(kl_penalty(logp, ref, "k1"), [LOG(2)])
    # ref - logp = -log 2: exp(-log 2) - (-log 2) - 1 = 0.5 + log 2 - 1
    close(kl_penalty(logp, ref, "k3"), [0.5 + LOG(2) - 1])
    close(kl_penalty(logp, ref, "low_var_kl"), [0.5 + LOG(2) - 1])
    close(kl_penalty(t([0.0]), t([0.0]), "k3"), [0.0])
    # far apart: ref - logp = 30 -> k3 = e^30 - 31; low_var_kl clamps to 10
    far_logp, far_ref = t([-30.0]), t([0.0])
    close(kl_penalty(far_logp, far_ref, "k3"), [math.exp(30) - 31])
    close(kl_penalty(far_logp, far_ref, "low_var_kl"), [10.0])
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(logp, ref, "k2")


def test_value_loss_by_hand():
    # row 0: (1 - 2)^2 = 1 ; clip(1, 0.3, 0.7) = 0.7 -> (0.7 - 2)^2 = 1.69 ; max 1.69
    # row 1: (0 - 0)^2 = 0 ; clip(0, 0.3, 0.7) = 0.3 -> 0.09 ; max 0.09
    loss = value_loss(t([1.0, 0.0]), t([0.5, 0.5]), t([2.0, 0.0]), clip_range=0.2)
    close(loss, 0.5 * (1.69 + 0.09) / 2)
    # inside the clip range both terms agree: 0.5 * mean((0.6-1)^2, (0.4-0)^2)
    close(value_loss(t([0.6, 0.4]), t([0.5, 0.5]), t([1.0, 0.0])), 0.5 * (0.16 + 0.16) / 2)
