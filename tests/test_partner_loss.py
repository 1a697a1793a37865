"""Swap-partner auxiliary loss and its λ warm-up, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from rspo_lightning.partner_loss import partner_coefficient, partner_loss

LOG = math.log


def t(x):
    return torch.tensor(x, dtype=torch.float64)


def close(actual, expected):
    assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=1e-9, atol=1e-9)


# Three samples, one token each, on-policy (old = 0): ratios rho = (1.1, 1.5, 0.9).
# Embeddings: e0 = (1, 0), e1 = (0.8, 0.6), e2 = (0, 1) -> cos(0,1) = 0.8, cos(0,2) = 0, cos(1,2) = 0.6.
# kNN with k = 1: S(0) = {1}, S(1) = {0}, S(2) = {1}. Advantages A = (1, -1, 2).
RATIOS = [1.1, 1.5, 0.9]
EMB = [[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]
ADV = [1.0, -1.0, 2.0]


def batch(ratios=RATIOS):
    old = torch.zeros(len(ratios), 1, dtype=torch.float64)
    logp = t([[LOG(r)] for r in ratios]).requires_grad_(True)
    return logp, old, t(ADV[: len(ratios)]), torch.ones(len(ratios), 1, dtype=torch.float64)


def ppo(rho, a, eps=0.2):
    """-min(rho a, clip(rho, 1 - eps, 1 + eps) a), written out."""
    return -min(rho * a, min(max(rho, 1 - eps), 1 + eps) * a)


def test_knn_one_partner_by_hand():
    logp, old, adv, mask = batch()
    loss, stats = partner_loss(logp, old, adv, mask, embeddings=t(EMB), strategy="knn", num_partners=1)
    # pair (0 -> 1): rho 1.5, A 1 -> clipped at 1.2 -> -1.2
    # pair (1 -> 0): rho 1.1, A -1 -> -(-1.1) = 1.1 (inside the clip range)
    # pair (2 -> 1): rho 1.5, A 2 -> clipped 1.2 * 2 -> -2.4
    assert (ppo(1.5, 1), ppo(1.1, -1), ppo(1.5, 2)) == pytest.approx((-1.2, 1.1, -2.4))
    close(loss, (-1.2 + 1.1 - 2.4) / 3)
    close(stats["swap_frac"], 1.0)
    close(stats["num_pairs"], 3.0)
    close(stats["clip_frac"], 2 / 3)
    loss.backward()
    # Only sample 0's token is unclipped (partner of 1, A = -1): d/dlogp0 of rho0 / 3 = 1.1 / 3.
    close(logp.grad, [[1.1 / 3], [0.0], [0.0]])


def test_beta_scales_the_borrowed_advantage():
    logp, old, adv, mask = batch([1.1, 1.1, 1.1])  # all inside the clip range: terms linear in A
    loss, _ = partner_loss(logp, old, adv, mask, embeddings=t(EMB), num_partners=1, beta_s=0.5)
    # partners' ratios are all 1.1; borrowed advantages 0.5 * (1, -1, 2)
    close(loss, -(1.1 * 0.5 - 1.1 * 0.5 + 1.1 * 1.0) / 3)


def test_knn_two_partners_uniform_and_softmax():
    logp, old, adv, mask = batch()
    loss, _ = partner_loss(logp, old, adv, mask, embeddings=t(EMB), num_partners=2)
    # every sample's partners are the other two, weight 1/2
    expected = (
        0.5 * (ppo(1.5, 1) + ppo(0.9, 1)) + 0.5 * (ppo(1.1, -1) + ppo(0.9, -1)) + 0.5 * (ppo(1.1, 2) + ppo(1.5, 2))
    ) / 3
    close(loss, expected)

    loss, _ = partner_loss(
        logp, old, adv, mask, embeddings=t(EMB), num_partners=2, weighting="softmax", temperature=0.5
    )

    def sm(a, b):  # softmax weights of similarities a, b at temperature 0.5
        ea, eb = math.exp(a / 0.5), math.exp(b / 0.5)
        return ea / (ea + eb), eb / (ea + eb)

    w01, w02 = sm(0.8, 0.0)  # sample 0: partner 1 (cos 0.8), partner 2 (cos 0)
    w10, w12 = sm(0.8, 0.6)  # sample 1: partner 0, partner 2
    w21, w20 = sm(0.6, 0.0)  # sample 2: partner 1, partner 0
    expected = (
        (w01 * ppo(1.5, 1) + w02 * ppo(0.9, 1))
        + (w10 * ppo(1.1, -1) + w12 * ppo(0.9, -1))
        + (w21 * ppo(1.5, 2) + w20 * ppo(1.1, 2))
    ) / 3
    close(loss, expected)


def test_p_swap_zero_gives_zero_loss_with_a_zero_gradient():
    logp, old, adv, mask = batch()
    loss, stats = partner_loss(logp, old, adv, mask, embeddings=t(EMB), p_swap=0.0)
    assert loss.item() == 0.0 and stats["swap_frac"].item() == 0.0 and stats["num_pairs"].item() == 0.0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))


def test_p_swap_draws_participants_with_that_probability():
    n = 400
    logp = torch.zeros(n, 1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    _, stats = partner_loss(
        logp, logp, torch.ones(n, dtype=torch.float64), torch.ones(n, 1), strategy="random", p_swap=0.3, generator=gen
    )
    assert 0.22 < stats["swap_frac"].item() < 0.38  # binomial(400, 0.3): sd 0.023
    gen = torch.Generator().manual_seed(0)
    _, again = partner_loss(
        logp, logp, torch.ones(n, dtype=torch.float64), torch.ones(n, 1), strategy="random", p_swap=0.3, generator=gen
    )
    assert again["swap_frac"].item() == stats["swap_frac"].item()  # the generator makes it reproducible


def test_bucket_equal_rewards():
    logp, old, adv, mask = batch()
    # rewards (1, 0, 1): buckets {0, 2} and {1}; sample 1 has no partner and does not participate
    loss, stats = partner_loss(logp, old, adv, mask, rewards=t([1.0, 0.0, 1.0]), strategy="bucket")
    # pair (0 -> 2): rho 0.9, A 1 -> -0.9; pair (2 -> 0): rho 1.1, A 2 -> -2.2
    close(loss, (-0.9 - 2.2) / 2)
    close(stats["swap_frac"], 2 / 3)
    close(stats["num_pairs"], 2.0)


def test_bucket_quantiles():
    # rewards (0.1, 0.9, 0.2, 0.8), 2 buckets: the median 0.5 cuts them into {0, 2} and {1, 3}
    logp = t([[LOG(1.1)], [LOG(1.0)], [LOG(0.9)], [LOG(1.05)]])
    old = torch.zeros(4, 1, dtype=torch.float64)
    adv = t([1.0, 2.0, -1.0, 3.0])
    loss, _ = partner_loss(
        logp, old, adv, torch.ones(4, 1), rewards=t([0.1, 0.9, 0.2, 0.8]), strategy="bucket", num_buckets=2
    )
    # (0 -> 2): -0.9*1; (2 -> 0): -(1.1*-1) = 1.1; (1 -> 3): -1.05*2; (3 -> 1): -1.0*3
    close(loss, (-0.9 + 1.1 - 2.1 - 3.0) / 4)


def test_random_with_every_other_sample_as_partner():
    logp, old, adv, mask = batch()
    loss, _ = partner_loss(logp, old, adv, mask, strategy="random", num_partners=2)
    expected = (
        0.5 * (ppo(1.5, 1) + ppo(0.9, 1)) + 0.5 * (ppo(1.1, -1) + ppo(0.9, -1)) + 0.5 * (ppo(1.1, 2) + ppo(1.5, 2))
    ) / 3
    close(loss, expected)


def test_random_single_partner_is_never_the_sample_itself():
    # Sample i's own ratio 2.0 (clipped at 1.2) would give -1.2; its only other partner gives -1.0.
    logp = t([[LOG(2.0)], [LOG(1.0)]])
    old = torch.zeros(2, 1, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    loss, _ = partner_loss(logp, old, t([1.0, 0.0]), torch.ones(2, 1), strategy="random", generator=gen)
    # pair (0 -> 1): -1.0 * 1; pair (1 -> 0): A = 0 -> 0
    close(loss, -1.0 / 2)


def test_samples_without_tokens_are_not_partners():
    # Sample 1 (the nearest neighbour of 0 and of 2) has no response token: S(0) = {2}, S(2) = {0}.
    logp, old, adv, _ = batch()
    mask = t([[1.0], [0.0], [1.0]])
    loss, stats = partner_loss(logp, old, adv, mask, embeddings=t(EMB), num_partners=1)
    close(loss, (ppo(0.9, 1) + ppo(1.1, 2)) / 2)
    close(stats["swap_frac"], 2 / 3)


def test_seq_mean_token_mean_over_unequal_rows():
    # Sample 0 has two tokens (ratios 1.1, 0.9), sample 1 one token (ratio 1.0); random k=1:
    # the only partner of each is the other. (0 -> 1): A0 = 1 on 1.0 -> -1.0.
    # (1 -> 0): A1 = 2 on tokens (1.1, 0.9) -> mean(-2.2, -1.8) = -2.0.
    logp = t([[LOG(1.1), LOG(0.9)], [LOG(1.0), 0.0]])
    old = torch.zeros(2, 2, dtype=torch.float64)
    mask = t([[1, 1], [1, 0]])
    loss, _ = partner_loss(logp, old, t([1.0, 2.0]), mask, strategy="random", agg="seq-mean-token-mean")
    close(loss, (-1.0 - 2.0) / 2)
    loss, _ = partner_loss(logp, old, t([1.0, 2.0]), mask, strategy="random", agg="seq-mean-token-sum")
    close(loss, (-1.0 - 4.0) / 2)
    loss, _ = partner_loss(logp, old, t([1.0, 2.0]), mask, strategy="random", agg="token-mean")
    close(loss, (-1.0 - 2.2 - 1.8) / 3)  # pairs' token terms over the pairs' 3 tokens


def test_bad_arguments_name_the_value():
    logp, old, adv, mask = batch()
    with pytest.raises(ValueError, match="embeddings"):
        partner_loss(logp, old, adv, mask, strategy="knn")
    with pytest.raises(ValueError, match="rewards"):
        partner_loss(logp, old, adv, mask, strategy="bucket")
    with pytest.raises(ValueError, match="'nearest'"):
        partner_loss(logp, old, adv, mask, strategy="nearest")
    with pytest.raises(ValueError, match="p_swap must be in \\[0, 1\\], got 1.5"):
        partner_loss(logp, old, adv, mask, strategy="random", p_swap=1.5)
    with pytest.raises(ValueError, match="num_partners must be >= 1, got 0"):
        partner_loss(logp, old, adv, mask, strategy="random", num_partners=0)
    with pytest.raises(ValueError, match="softmax"):
        partner_loss(logp, old, adv, mask, strategy="random", weighting="softmax")
    with pytest.raises(ValueError, match="advantages must be"):
        partner_loss(logp, old, adv[:2], mask, strategy="random")


def test_partner_coefficient_warmup():
    assert partner_coefficient(0, 0.5, 10) == 0.0
    assert partner_coefficient(2, 0.5, 10) == pytest.approx(0.1)
    assert partner_coefficient(5, 0.5, 10) == pytest.approx(0.25)
    assert partner_coefficient(10, 0.5, 10) == 0.5
    assert partner_coefficient(50, 0.5, 10) == 0.5
    assert partner_coefficient(0, 0.5, 0) == 0.5
    with pytest.raises(ValueError, match="warmup_steps must be >= 0, got -1"):
        partner_coefficient(0, 0.5, -1)
