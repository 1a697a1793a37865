"""Advantage estimators against values worked out by hand (never by calling the code under test)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from rspo_lightning.advantages import (
    ESTIMATORS,
    GROUP_RELATIVE,
    AdvantageResult,
    a2tgpo_advantages,
    check_estimator_kwargs,
    compute_advantages,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
    proxmo_advantages,
    rloo_advantages,
    success_rate_weights,
    tfidf_cosine_similarity,
)

EPS = 1e-6


def flat(trajs):
    """[(group, traj, rewards, extra)] -> rewards, traj_index, group_index, turn_index, extras."""
    rewards, traj, group, turn, extra = [], [], [], [], []
    for g, t, rs, ex in trajs:
        for k, r in enumerate(rs):
            rewards.append(r)
            traj.append(t)
            group.append(g)
            turn.append(k)
            extra.append(ex[k] if ex is not None else None)
    return (
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(traj),
        torch.tensor(group),
        torch.tensor(turn),
        extra,
    )


def check(actual, expected):
    assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------------- GRPO/RLOO
# group 0: R = 1 (3 turns, outcome on the last), 0 (2 turns), 0.5 (2 turns)
# group 1: R = 2 (dense rewards 1 + 1), 0 (1 turn)
TWO_GROUPS = [
    (0, 0, [0.0, 0.0, 1.0], None),
    (0, 1, [0.0, 0.0], None),
    (0, 2, [0.0, 0.5], None),
    (1, 3, [1.0, 1.0], None),
    (1, 4, [0.0], None),
]


def broadcast(per_traj, lengths):
    return [a for a, n in zip(per_traj, lengths) for _ in range(n)]


LENGTHS = [3, 2, 2, 2, 1]


def test_grpo_std_two_groups_multi_turn():
    r, ti, gi, tu, _ = flat(TWO_GROUPS)
    # group 0: mean 0.5, deviations (0.5, -0.5, 0), unbiased std sqrt((0.25+0.25+0)/2) = 0.5
    # group 1: mean 1, deviations (1, -1), unbiased std sqrt((1+1)/1) = sqrt(2)
    g0 = [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.0]
    g1 = [1 / (math.sqrt(2) + EPS), -1 / (math.sqrt(2) + EPS)]
    check(grpo_advantages(r, ti, gi, tu).advantages, broadcast(g0 + g1, LENGTHS))


def test_grpo_mean_norm():
    r, ti, gi, tu, _ = flat(TWO_GROUPS)
    check(grpo_advantages(r, ti, gi, tu, norm="mean").advantages, broadcast([0.5, -0.5, 0, 1, -1], LENGTHS))


def test_traj_index_may_restart_in_every_group():
    r, _, gi, tu, _ = flat(TWO_GROUPS)
    local = torch.tensor(broadcast([0, 1, 2, 0, 1], LENGTHS))
    check(grpo_advantages(r, local, gi, tu, norm="mean").advantages, broadcast([0.5, -0.5, 0, 1, -1], LENGTHS))


def test_rloo_two_groups():
    r, ti, gi, tu, _ = flat(TWO_GROUPS)
    # 1 - (0 + 0.5)/2, 0 - (1 + 0.5)/2, 0.5 - (1 + 0)/2 ; 2 - 0, 0 - 2
    check(rloo_advantages(r, ti, gi, tu).advantages, broadcast([0.75, -0.75, 0.0, 2.0, -2.0], LENGTHS))


def test_zero_variance_and_singleton_groups_give_zeros():
    trajs = [
        (0, 0, [0.0, 0.1], None),  # R = 0.1
        (0, 1, [0.1], None),  # R = 0.1
        (0, 2, [0.05, 0.05], None),  # R = 0.1
        (1, 3, [1.0, 0.0], None),  # the only trajectory of group 1
        (2, 4, [0.1, 0.2], None),  # R = 0.30000000000000004 in float64
        (2, 5, [0.3], None),  # R = 0.3: equal in exact arithmetic, so ~0 (1e-11), never NaN
    ]
    r, ti, gi, tu, _ = flat(trajs)
    for norm in ("std", "mean"):
        out = grpo_advantages(r, ti, gi, tu, norm=norm).advantages
        assert torch.isfinite(out).all()
        check(out, [0.0] * 10)
    check(rloo_advantages(r, ti, gi, tu).advantages, [0.0] * 10)


# episode_stats="steps": each turn sample carries its trajectory's return R(tau).
# group 0: traj 0 has 1 turn, R = 1; traj 1 has 3 turns, R = 0 -> samples (1, 0, 0, 0)
# group 1: traj 2 has 2 turns, R = 0.5; traj 3 has 1 turn, R = 2 -> samples (0.5, 0.5, 2)
# group 2: traj 4, one turn, R = 5 -> one sample
# group 3: traj 5, three turns, R = 0.1 -> samples (0.1, 0.1, 0.1), one trajectory
STEP_GROUPS = [
    (0, 0, [1.0], None),
    (0, 1, [0.0, 0.0, 0.0], None),
    (1, 2, [0.0, 0.5], None),
    (1, 3, [2.0], None),
    (2, 4, [5.0], None),
    (3, 5, [0.0, 0.0, 0.1], None),
]


def test_grpo_step_statistics_by_hand():
    r, ti, gi, tu, _ = flat(STEP_GROUPS)
    # group 0: mean (1 + 0 + 0 + 0)/4 = 0.25 -> deviations (0.75, -0.25, -0.25, -0.25);
    #   unbiased std sqrt((0.5625 + 3 * 0.0625) / 3) = sqrt(0.25) = 0.5
    # group 1: mean (0.5 + 0.5 + 2)/3 = 1 -> deviations (-0.5, -0.5, 1);
    #   unbiased std sqrt((0.25 + 0.25 + 1) / 2) = sqrt(0.75)
    # groups 2 and 3: one sample / all samples equal -> 0
    s1 = math.sqrt(0.75)
    expected_std = (
        [0.75 / (0.5 + EPS)]
        + [-0.25 / (0.5 + EPS)] * 3
        + [-0.5 / (s1 + EPS)] * 2
        + [1 / (s1 + EPS)]
        + [0.0]
        + [0.0] * 3
    )
    check(grpo_advantages(r, ti, gi, tu, episode_stats="steps").advantages, expected_std)
    expected_mean = [0.75, -0.25, -0.25, -0.25, -0.5, -0.5, 1.0, 0.0, 0.0, 0.0, 0.0]
    check(grpo_advantages(r, ti, gi, tu, norm="mean", episode_stats="steps").advantages, expected_mean)
    # trajectory statistics (default): group 0 mean 0.5, std sqrt(0.5); group 1 mean 1.25,
    #   deviations (-0.75, 0.75), std sqrt(1.125)
    s0, s1t = math.sqrt(0.5), math.sqrt(1.125)
    expected_traj = (
        [0.5 / (s0 + EPS)] + [-0.5 / (s0 + EPS)] * 3 + [-0.75 / (s1t + EPS)] * 2 + [0.75 / (s1t + EPS)] + [0.0] * 4
    )
    check(grpo_advantages(r, ti, gi, tu).advantages, expected_traj)
    check(grpo_advantages(r, ti, gi, tu, episode_stats="trajectory").advantages, expected_traj)


def test_rloo_step_statistics_by_hand():
    r, ti, gi, tu, _ = flat(STEP_GROUPS)
    # group 0, sum of the samples' R = 1, count 4:
    #   traj 0's sample: 1 - (1 - 1)/3 = 1 ; traj 1's samples: 0 - (1 - 0)/3 = -1/3
    # group 1, sum = 3, count 3:
    #   traj 2's samples: 0.5 - (3 - 0.5)/2 = -0.75 ; traj 3's: 2 - (3 - 2)/2 = 1.5
    # group 2: one sample -> 0 ; group 3: one trajectory, all samples R = 0.1 -> 0
    expected = [1.0, -1 / 3, -1 / 3, -1 / 3, -0.75, -0.75, 1.5, 0.0, 0.0, 0.0, 0.0]
    out = rloo_advantages(r, ti, gi, tu, episode_stats="steps").advantages
    check(out, expected)
    assert (out[7:] == 0).all()  # exactly 0, not a rounding residue
    # trajectory statistics (default): 1 - 0, 0 - 1 ; 0.5 - 2, 2 - 0.5 ; 0 ; 0
    expected_traj = [1.0, -1.0, -1.0, -1.0, -1.5, -1.5, 1.5, 0.0, 0.0, 0.0, 0.0]
    check(rloo_advantages(r, ti, gi, tu).advantages, expected_traj)
    check(rloo_advantages(r, ti, gi, tu, episode_stats="trajectory").advantages, expected_traj)


def test_step_statistics_option_is_validated():
    r, ti, gi, tu, _ = flat(STEP_GROUPS)
    msg = r"episode_stats must be one of \['trajectory', 'steps'\], got 'turns'"
    with pytest.raises(ValueError, match=msg):
        grpo_advantages(r, ti, gi, tu, episode_stats="turns")
    with pytest.raises(ValueError, match=msg):
        rloo_advantages(r, ti, gi, tu, episode_stats="turns")
    # through the registry, as the module passes algorithm.estimator_kwargs
    out = compute_advantages("rloo", rewards=r, traj_index=ti, group_index=gi, turn_index=tu, episode_stats="steps")
    check(out.advantages, [1.0, -1 / 3, -1 / 3, -1 / 3, -0.75, -0.75, 1.5, 0.0, 0.0, 0.0, 0.0])


def test_output_dtype_and_device_follow_rewards():
    r, ti, gi, tu, _ = flat(TWO_GROUPS)
    out = grpo_advantages(r.float(), ti, gi, tu).advantages
    assert out.dtype == torch.float32 and out.shape == (10,)


# ------------------------------------------------------------------------------------------ GAE


def test_gae_three_turns_by_hand():
    # trajectory 0: r = (0.5, 0, 1), V = (0.2, 0.4, 0.6), gamma 0.9, lambda 0.8 (gamma*lambda 0.72)
    # delta_2 = 1 + 0.9*0 - 0.6 = 0.4
    # delta_1 = 0 + 0.9*0.6 - 0.4 = 0.14
    # delta_0 = 0.5 + 0.9*0.4 - 0.2 = 0.66
    # A_2 = 0.4 ; A_1 = 0.14 + 0.72*0.4 = 0.428 ; A_0 = 0.66 + 0.72*0.428 = 0.96816
    # trajectory 1 (one turn): r = 1, V = 0.3 -> A = 0.7
    r, ti, gi, tu, _ = flat([(0, 0, [0.5, 0.0, 1.0], None), (0, 1, [1.0], None)])
    values = torch.tensor([0.2, 0.4, 0.6, 0.3], dtype=torch.float64)
    out = gae_advantages(r, ti, gi, tu, values=values, gamma=0.9, lam=0.8)
    assert isinstance(out, AdvantageResult) and out.clip_scale is None
    check(out.advantages, [0.96816, 0.428, 0.4, 0.7])
    check(out.returns, [0.96816 + 0.2, 0.428 + 0.4, 0.4 + 0.6, 0.7 + 0.3])


def test_gae_gamma_lambda_one_is_return_minus_value():
    r, ti, gi, tu, _ = flat([(0, 0, [1.0, 2.0, 3.0], None)])
    values = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    out = gae_advantages(r, ti, gi, tu, values=values)
    check(out.advantages, [6 - 1, 5 - 1, 3 - 1])
    check(out.returns, [6.0, 5.0, 3.0])


# ---------------------------------------------------------------------------------------- GiGPO
# gamma = 0.5. Returns-to-go R_t:
#   traj 0 (group 0): anchors s0 s1 s2, r (0, 0, 1) -> R_t (0.25, 0.5, 1),   R(tau) = 1
#   traj 1 (group 0): anchors s0 s1,    r (0, 0)    -> R_t (0, 0),          R(tau) = 0
#   traj 2 (group 0): anchors s0 s3,    r (0, 1)    -> R_t (0.5, 1),        R(tau) = 1
#   traj 3 (group 1): anchors s0 x,     r (0, 1)    -> R_t (0.5, 1),        R(tau) = 1
#   traj 4 (group 1): anchors y,        r (0)       -> R_t (0),             R(tau) = 0
GIGPO = [
    (0, 0, [0.0, 0.0, 1.0], ["s0", "s1", "s2"]),
    (0, 1, [0.0, 0.0], ["s0", "s1"]),
    (0, 2, [0.0, 1.0], ["s0", "s3"]),
    (1, 3, [0.0, 1.0], ["s0", "x"]),
    (1, 4, [0.0], ["y"]),
]
# Step groups: group0/s0 = rows (traj0 t0, traj1 t0, traj2 t0) with R_t (0.25, 0, 0.5):
#   mean 0.25, deviations (0, -0.25, 0.25), unbiased std sqrt(0.0625*2/2) = 0.25
# group0/s1 = (traj0 t1, traj1 t1) with R_t (0.5, 0): mean 0.25, deviations (0.25, -0.25),
#   unbiased std sqrt(0.0625*2/1) = sqrt(0.125)
# s2, s3, x, y and group1/s0 (NOT pooled with group0/s0) are singletons -> 0.
S1_STD = math.sqrt(0.125)
STEP_STD = [
    0.0, 0.25 / (S1_STD + EPS), 0.0,  # traj 0: s0, s1, s2
    -0.25 / (0.25 + EPS), -0.25 / (S1_STD + EPS),  # traj 1: s0, s1
    0.25 / (0.25 + EPS), 0.0,  # traj 2: s0, s3
    0.0, 0.0,  # traj 3 (group 1): s0 alone in its group, x
    0.0,  # traj 4: y
]  # fmt: skip
STEP_MEAN = [0.0, 0.25, 0.0, -0.25, -0.25, 0.25, 0.0, 0.0, 0.0, 0.0]
GIGPO_LENGTHS = [3, 2, 2, 2, 1]
# Episode, "trajectory" stats: group 0 returns (1, 0, 1): mean 2/3, deviations (1/3, -2/3, 1/3),
#   unbiased std sqrt((1/9 + 4/9 + 1/9)/2) = sqrt(1/3); group 1 returns (1, 0): deviations
#   (0.5, -0.5), std sqrt(0.5).
EP_TRAJ_STD = broadcast(
    [
        (1 / 3) / (math.sqrt(1 / 3) + EPS),
        (-2 / 3) / (math.sqrt(1 / 3) + EPS),
        (1 / 3) / (math.sqrt(1 / 3) + EPS),
        0.5 / (math.sqrt(0.5) + EPS),
        -0.5 / (math.sqrt(0.5) + EPS),
    ],
    GIGPO_LENGTHS,
)
EP_TRAJ_MEAN = broadcast([1 / 3, -2 / 3, 1 / 3, 0.5, -0.5], GIGPO_LENGTHS)
# Episode, "steps" stats: group 0 step samples carry (1,1,1, 0,0, 1,1): mean 5/7, deviations 2/7
#   and -5/7, unbiased std sqrt((5*(2/7)^2 + 2*(5/7)^2)/6) = sqrt(5/21); group 1 samples carry
#   (1,1, 0): mean 2/3, deviations 1/3 and -2/3, std sqrt((1/9+1/9+4/9)/2) = sqrt(1/3).
EP_STEPS_STD = broadcast(
    [
        (2 / 7) / (math.sqrt(5 / 21) + EPS),
        (-5 / 7) / (math.sqrt(5 / 21) + EPS),
        (2 / 7) / (math.sqrt(5 / 21) + EPS),
        (1 / 3) / (math.sqrt(1 / 3) + EPS),
        (-2 / 3) / (math.sqrt(1 / 3) + EPS),
    ],
    GIGPO_LENGTHS,
)
EP_STEPS_MEAN = broadcast([2 / 7, -5 / 7, 2 / 7, 1 / 3, -2 / 3], GIGPO_LENGTHS)


def _gigpo(**kw):
    r, ti, gi, tu, anchors = flat(GIGPO)
    return gigpo_advantages(r, ti, gi, tu, anchors=anchors, gamma=0.5, **kw).advantages


@pytest.mark.parametrize(
    "norm,episode_stats,episode,step",
    [
        ("std", "trajectory", EP_TRAJ_STD, STEP_STD),
        ("mean", "trajectory", EP_TRAJ_MEAN, STEP_MEAN),
        ("std", "steps", EP_STEPS_STD, STEP_STD),
        ("mean", "steps", EP_STEPS_MEAN, STEP_MEAN),
    ],
)
def test_gigpo_by_hand(norm, episode_stats, episode, step):
    out = _gigpo(norm=norm, episode_stats=episode_stats, omega=1.0)
    check(out, [e + s for e, s in zip(episode, step)])
    out = _gigpo(norm=norm, episode_stats=episode_stats, omega=0.5)
    check(out, [e + 0.5 * s for e, s in zip(episode, step)])


def test_gigpo_same_anchor_in_other_group_not_pooled():
    out = _gigpo(norm="mean", omega=1.0)
    # row 7 = traj 3 turn 0, anchor "s0" in group 1: only its episode advantage (0.5), no step
    # term. Pooled with group 0's s0 rows (0.25, 0, 0.5, 0.5) it would get 0.5 - 0.3125.
    assert out[7].item() == pytest.approx(0.5, abs=1e-12)
    # row 2 = traj 0 turn 2 ("s2", singleton step group): episode advantage only.
    assert out[2].item() == pytest.approx(1 / 3, abs=1e-12)


def test_gigpo_without_repeated_states_equals_grpo():
    trajs = [(g, t, rs, [f"u{t}_{k}" for k in range(len(rs))]) for g, t, rs, _ in TWO_GROUPS]
    r, ti, gi, tu, anchors = flat(trajs)
    out = gigpo_advantages(r, ti, gi, tu, anchors=anchors).advantages
    g0 = [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.0]
    g1 = [1 / (math.sqrt(2) + EPS), -1 / (math.sqrt(2) + EPS)]
    check(out, broadcast(g0 + g1, LENGTHS))
    check(out, grpo_advantages(r, ti, gi, tu).advantages.tolist())


# --------------------------------------------------------------------------------------- ProxMO
SIG = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
BETA = 0.05 / (SIG(1.0) - 0.5)  # |w - 1| is largest (sigmoid(1) - 1/2) at p = 0 or 1


def test_success_rate_weights():
    w_plus, w_minus = success_rate_weights(0.25)
    assert w_plus == pytest.approx(1 + BETA * (SIG(0.75**4) - 0.5), abs=1e-12)
    assert w_minus == pytest.approx(1 + BETA * (SIG(-(0.25**4)) - 0.5), abs=1e-12)
    # the extremes reach exactly +-target_range
    assert success_rate_weights(0.0)[0] == pytest.approx(1.05, abs=1e-12)
    assert success_rate_weights(1.0)[1] == pytest.approx(0.95, abs=1e-12)
    assert success_rate_weights(0.0, target_range=0.1)[0] == pytest.approx(1.1, abs=1e-12)
    assert success_rate_weights(1.0)[0] == pytest.approx(1.0, abs=1e-12)  # sigmoid(0) - 1/2 = 0
    assert success_rate_weights(0.0)[1] == pytest.approx(1.0, abs=1e-12)


def test_proxmo_episode_weights_for_known_success_rate():
    # 4 one-turn trajectories, one success: p = 0.25. norm="mean": A^E = (0.75, -0.25 x3).
    r, ti, gi, tu, anchors = flat([(0, t, [1.0 if t == 0 else 0.0], [f"a{t}"]) for t in range(4)])
    success = torch.tensor([True, False, False, False])
    out = proxmo_advantages(r, ti, gi, tu, anchors=anchors, success=success, norm="mean", omega=0.0).advantages
    w_plus = 1 + BETA * (SIG(0.75**4) - 0.5)
    w_minus = 1 + BETA * (SIG(-(0.25**4)) - 0.5)
    check(out, [0.75 * w_plus, -0.25 * w_minus, -0.25 * w_minus, -0.25 * w_minus])


def test_tfidf_cosine_by_hand():
    # docs "a b", "a c": n = 2; df(a) = 2, df(b) = df(c) = 1
    # idf(a) = log(3/3) + 1 = 1, idf(b) = idf(c) = log(3/2) + 1
    # cos = 1*1 / (1 + idf_b^2)
    idf_b = math.log(1.5) + 1
    cos = 1 / (1 + idf_b**2)
    check(tfidf_cosine_similarity(["a b", "a c"]), [[1.0, cos], [cos, 1.0]])
    # repeated tokens count: "a a" vs "a b" -> vectors (2, 0) and (1, idf_b) before L2 norm
    cos2 = 2 * 1 / (2 * math.sqrt(1 + idf_b**2))
    check(tfidf_cosine_similarity(["a a", "a b"]), [[1.0, cos2], [cos2, 1.0]])


def test_proxmo_soft_baseline_identical_and_disjoint_anchors():
    # one group, three one-turn trajectories; anchors "a b", "a b", "c d": S = [[1,1,0],[1,1,0],
    # [0,0,1]]; tau = 0.1 -> exp(S/tau) has entries e^10 and 1.
    # R = (1, 0, 0.5); success (T, F, F) -> p = 1/3.
    r, ti, gi, tu, anchors = flat([(0, 0, [1.0], ["a b"]), (0, 1, [0.0], ["a b"]), (0, 2, [0.5], ["c d"])])
    success = torch.tensor([True, False, False])
    out = proxmo_advantages(r, ti, gi, tu, anchors=anchors, success=success, norm="mean", tau=0.1).advantages
    e = math.exp(10)
    b01 = (e * 1 + e * 0 + 1 * 0.5) / (2 * e + 1)
    b2 = (1 * 1 + 1 * 0 + e * 0.5) / (e + 2)
    step = [1 - b01, 0 - b01, 0.5 - b2]
    w_plus = 1 + BETA * (SIG((2 / 3) ** 4) - 0.5)
    w_minus = 1 + BETA * (SIG(-((1 / 3) ** 4)) - 0.5)
    episode = [0.5 * w_plus, -0.5 * w_minus, 0.0 * w_minus]  # mean 0.5, deviations (.5, -.5, 0)
    check(out, [a + s for a, s in zip(episode, step)])


def test_proxmo_groups_are_separate_and_singletons_zero():
    # group 1 holds a single one-turn trajectory: W = [1], baseline = own return, A^S = 0,
    # and A^E = 0 (a group of one).
    r, ti, gi, tu, anchors = flat([(0, 0, [1.0], ["a"]), (0, 1, [0.0], ["b"]), (1, 2, [1.0], ["a"])])
    out = proxmo_advantages(
        r, ti, gi, tu, anchors=anchors, success=torch.tensor([1, 0, 1]), norm="mean", omega=1.0
    ).advantages
    assert out[2].item() == pytest.approx(0.0, abs=1e-12)
    e = math.exp(10)
    w_plus = 1 + BETA * (SIG(0.5**4) - 0.5)
    w_minus = 1 + BETA * (SIG(-(0.5**4)) - 0.5)
    b0 = (e * 1 + 1 * 0) / (e + 1)
    b1 = (1 * 1 + e * 0) / (e + 1)
    check(out, [0.5 * w_plus + (1 - b0), -0.5 * w_minus + (0 - b1), 0.0])


# --------------------------------------------------------------------------------------- A2TGPO
# group 0, three trajectories; signals per turn index (z-scored within (group, turn)):
#   turn 0: (0, 1, 2) -> mean 1, unbiased std 1 -> (-1, 0, 1) * K
#   turn 1: (5, 3, 4) -> mean 4, std 1 -> (1, -1, 0) * K
#   turn 2: (1, 1, 1) -> zero std -> 0
#   turn 3: (7) only traj 0 -> single element -> 0
# group 1, one trajectory with signals (3, 4): single elements -> 0, and A^E = 0.
K = 1 / (1 + EPS)
A2T = [
    (0, 0, [0.0, 0.0, 0.0, 1.0], [0.0, 5.0, 1.0, 7.0]),  # R = 1, ghat (-K, K, 0, 0)
    (0, 1, [0.0, 0.0, 0.0], [1.0, 3.0, 1.0]),  # R = 0, ghat (0, -K, 0)
    (0, 2, [0.0, 0.0, 1.0], [2.0, 4.0, 1.0]),  # R = 1, ghat (K, 0, 0)
    (1, 3, [0.0, 1.0], [3.0, 4.0]),
]
# episode advantage (std): returns (1, 0, 1): (1/3, -2/3, 1/3) / (sqrt(1/3) + 1e-6)
E_POS = (1 / 3) / (math.sqrt(1 / 3) + EPS)
E_NEG = (-2 / 3) / (math.sqrt(1 / 3) + EPS)


def _a2t(**kw):
    r, ti, gi, tu, signals = flat(A2T)
    return a2tgpo_advantages(r, ti, gi, tu, signals=torch.tensor(signals), gamma=0.5, **kw)


def test_a2tgpo_sqrt_normalised_accumulation():
    # gamma 0.5, sums S_t from t to the end, n_t = number of terms:
    # traj 0: t3 0/1; t2 0/sqrt2; t1 (K + 0.5*0)/sqrt3; t0 (-K + 0.5*K)/sqrt4 = -0.25K
    # traj 1: t2 0; t1 -K/sqrt2; t0 (0 + 0.5*(-K))/sqrt3
    # traj 2: t2 0; t1 0; t0 K/sqrt3
    out = _a2t()
    assert isinstance(out, AdvantageResult) and out.returns is None
    expected = [
        E_POS - 0.25 * K, E_POS + K / math.sqrt(3), E_POS, E_POS,
        E_NEG - 0.5 * K / math.sqrt(3), E_NEG - K / math.sqrt(2), E_NEG,
        E_POS + K / math.sqrt(3), E_POS, E_POS,
        0.0, 0.0,
    ]  # fmt: skip
    check(out.advantages, expected)


def test_a2tgpo_turn_group_size_stops_accumulation():
    # blocks of 2 turns: [t0, t1], [t2, t3]
    # traj 0: t1 K/1; t0 (-K + 0.5K)/sqrt2; t3 0; t2 0
    # traj 1: t1 -K/1; t0 (0 - 0.5K)/sqrt2; t2 0
    # traj 2: t1 0; t0 K/sqrt2; t2 0
    out = _a2t(turn_group_size=2)
    expected = [
        E_POS - 0.5 * K / math.sqrt(2), E_POS + K, E_POS, E_POS,
        E_NEG - 0.5 * K / math.sqrt(2), E_NEG - K, E_NEG,
        E_POS + K / math.sqrt(2), E_POS, E_POS,
        0.0, 0.0,
    ]  # fmt: skip
    check(out.advantages, expected)


def test_a2tgpo_signal_clip():
    # clip_scale, the multiplier of clip_eps_low/high: clamp(1 + kappa*ghat, 1 - delta, 1 + delta)
    # with kappa 0.5, delta 0.3: ghat = -K -> 1 - 0.5K ~ 0.5 -> clamped 0.7 ; 0 -> 1 ;
    # +K -> ~1.5 -> clamped 1.3
    out = _a2t(kappa=0.5, delta=0.3)
    check(out.clip_scale, [0.7, 1.3, 1, 1, 1, 0.7, 1, 1.3, 1, 1, 1, 1])
    # no clamping: kappa 0.2, delta 0.5 -> 1 -+ 0.2K
    out = _a2t(kappa=0.2, delta=0.5)
    lo, hi = 1 - 0.2 * K, 1 + 0.2 * K
    check(out.clip_scale, [lo, hi, 1, 1, 1, lo, 1, hi, 1, 1, 1, 1])


def test_a2tgpo_has_no_epsilon_of_its_own():
    # the configured clip_eps_low/high is the paper's epsilon; a2tgpo only scales it
    with pytest.raises(TypeError, match="epsilon"):
        _a2t(epsilon=0.2)


def test_a2tgpo_inverse_advantage_clip():
    out = _a2t(adaptive_clip="inverse_advantage", beta=2.0)
    adv = [
        E_POS - 0.25 * K, E_POS + K / math.sqrt(3), E_POS, E_POS,
        E_NEG - 0.5 * K / math.sqrt(3), E_NEG - K / math.sqrt(2), E_NEG,
        E_POS + K / math.sqrt(3), E_POS, E_POS,
        0.0, 0.0,
    ]  # fmt: skip
    check(out.clip_scale, [1 / (1 + 2.0 * abs(a)) for a in adv])


def test_a2tgpo_mean_norm_changes_only_episode_term():
    out = _a2t(norm="mean")
    # episode (1/3, -2/3, 1/3); turn terms as in the std case
    expected = [
        1 / 3 - 0.25 * K, 1 / 3 + K / math.sqrt(3), 1 / 3, 1 / 3,
        -2 / 3 - 0.5 * K / math.sqrt(3), -2 / 3 - K / math.sqrt(2), -2 / 3,
        1 / 3 + K / math.sqrt(3), 1 / 3, 1 / 3,
        0.0, 0.0,
    ]  # fmt: skip
    check(out.advantages, expected)


# ------------------------------------------------------------------------- registry, validation


def test_registry_and_compute_advantages():
    assert set(ESTIMATORS) == {"grpo", "rloo", "gae", "gigpo", "proxmo", "a2tgpo", "turn_return"}
    r, ti, gi, tu, _ = flat(TWO_GROUPS)
    out = compute_advantages("rloo", rewards=r, traj_index=ti, group_index=gi, turn_index=tu)
    assert isinstance(out, AdvantageResult) and out.returns is None and out.clip_scale is None
    check(out.advantages, broadcast([0.75, -0.75, 0.0, 2.0, -2.0], LENGTHS))
    with pytest.raises(ValueError, match="'ppo'.*a2tgpo.*gae.*gigpo.*grpo.*proxmo.*rloo.*turn_return"):
        compute_advantages("ppo", rewards=r)


def test_mismatched_lengths_name_the_argument():
    r, ti, gi, tu, anchors = flat(GIGPO)
    with pytest.raises(ValueError, match="traj_index"):
        grpo_advantages(r, ti[:-1], gi, tu)
    with pytest.raises(ValueError, match="group_index"):
        grpo_advantages(r, ti, gi[:-1], tu)
    with pytest.raises(ValueError, match="turn_index"):
        rloo_advantages(r, ti, gi, tu[:-1])
    with pytest.raises(ValueError, match="values"):
        gae_advantages(r, ti, gi, tu, values=torch.zeros(3))
    with pytest.raises(ValueError, match="anchors"):
        gigpo_advantages(r, ti, gi, tu, anchors=anchors[:-1])
    with pytest.raises(ValueError, match="success"):
        proxmo_advantages(r, ti, gi, tu, anchors=anchors, success=torch.ones(2))
    with pytest.raises(ValueError, match="signals"):
        a2tgpo_advantages(r, ti, gi, tu, signals=torch.zeros(2))


def test_bad_options_and_layouts_are_rejected():
    r, ti, gi, tu, anchors = flat(GIGPO)
    with pytest.raises(ValueError, match="norm"):
        grpo_advantages(r, ti, gi, tu, norm="zscore")
    with pytest.raises(ValueError, match="episode_stats"):
        gigpo_advantages(r, ti, gi, tu, anchors=anchors, episode_stats="turns")
    with pytest.raises(ValueError, match="adaptive_clip"):
        a2tgpo_advantages(r, ti, gi, tu, signals=r, adaptive_clip="fixed")
    with pytest.raises(ValueError, match="turn_group_size"):
        a2tgpo_advantages(r, ti, gi, tu, signals=r, turn_group_size=0)
    # trajectory 0's turns split by another trajectory
    order = torch.tensor([0, 3, 1, 2, 4, 5, 6, 7, 8, 9])
    with pytest.raises(ValueError, match="contiguous"):
        grpo_advantages(r[order], ti[order], gi[order], tu[order])
    with pytest.raises(ValueError, match="turn_index"):
        grpo_advantages(r, ti, gi, torch.zeros_like(tu))


# ------------------------------------------------------------------------------------ properties


@st.composite
def batches(draw):
    trajs, t = [], 0
    for g in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(1, 4))):
            n = draw(st.integers(1, 4))
            rs = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n, max_size=n))
            names = st.sampled_from(["a", "b", "a b", "c"])
            anchors = draw(st.lists(names, min_size=n, max_size=n))
            trajs.append((g, t, rs, anchors))
            t += 1
    return trajs


@settings(max_examples=60, deadline=None)
@given(batches())
def test_all_estimators_finite_and_group_relative(trajs):
    r, ti, gi, tu, anchors = flat(trajs)
    success = torch.zeros(len(r), dtype=torch.bool)
    outs = [
        grpo_advantages(r, ti, gi, tu).advantages,
        grpo_advantages(r, ti, gi, tu, episode_stats="steps").advantages,
        rloo_advantages(r, ti, gi, tu).advantages,
        rloo_advantages(r, ti, gi, tu, episode_stats="steps").advantages,
        gae_advantages(r, ti, gi, tu, values=torch.zeros_like(r)).advantages,
        gigpo_advantages(r, ti, gi, tu, anchors=anchors).advantages,
        proxmo_advantages(r, ti, gi, tu, anchors=anchors, success=success).advantages,
        a2tgpo_advantages(r, ti, gi, tu, signals=r).advantages,
    ]
    for out in outs:
        assert out.shape == r.shape and torch.isfinite(out).all()
    # GRPO (mean norm) sums to zero over each group's trajectories (first turn of each)
    mean_adv = grpo_advantages(r, ti, gi, tu, norm="mean").advantages
    first = torch.ones_like(tu, dtype=torch.bool)
    first[1:] = ti[1:] != ti[:-1]
    for g in gi.unique():
        sel = first & (gi == g)
        assert abs(mean_adv[sel].sum().item()) < 1e-9


# ------------------------------------------------------------------- contracts, kwargs checking


def test_registry_declares_each_estimators_contract():
    # name: (inputs, group_relative, needs_critic, needs_dense), written out by hand
    expected = {
        "grpo": ((), True, False, False),
        "rloo": ((), True, False, False),
        "gae": (("values",), False, True, False),
        "gigpo": (("anchors",), True, False, False),
        "proxmo": (("anchors", "success"), True, False, False),
        "a2tgpo": (("signals",), True, False, True),
        "turn_return": ((), True, False, False),
    }
    got = {n: (e.inputs, e.group_relative, e.needs_critic, e.needs_dense) for n, e in ESTIMATORS.items()}
    assert got == expected
    assert GROUP_RELATIVE == {"grpo", "rloo", "gigpo", "proxmo", "a2tgpo", "turn_return"}
    assert ESTIMATORS["turn_return"].tunables == ["gamma", "norm"]
    assert ESTIMATORS["a2tgpo"].tunables == [
        "adaptive_clip",
        "beta",
        "delta",
        "gamma",
        "kappa",
        "norm",
        "turn_group_size",
    ]
    assert ESTIMATORS["gae"].tunables == ["gamma", "lam"]
    assert ESTIMATORS["grpo"].tunables == ["episode_stats", "norm"]


def test_estimator_kwargs_check_names_the_key_the_nearest_and_the_accepted():
    check_estimator_kwargs("gigpo", {"gamma": 0.9, "omega": 0.5, "norm": "mean", "episode_stats": "steps"})
    with pytest.raises(ValueError) as err:
        check_estimator_kwargs("a2tgpo", {"epsilon": 0.2})
    assert str(err.value) == (
        "algorithm.estimator_kwargs: unknown key 'epsilon' for a2tgpo; it accepts "
        "['adaptive_clip', 'beta', 'delta', 'gamma', 'kappa', 'norm', 'turn_group_size']"
    )
    with pytest.raises(ValueError) as err:
        check_estimator_kwargs("gigpo", {"omgea": 1.0})
    assert str(err.value) == (
        "algorithm.estimator_kwargs: unknown key 'omgea' for gigpo (did you mean 'omega'?); it accepts "
        "['episode_stats', 'gamma', 'norm', 'omega']"
    )
    # what the module supplies from the batch cannot be set
    for name, key in (("gigpo", "anchors"), ("gae", "values"), ("grpo", "rewards"), ("rloo", "traj_index")):
        with pytest.raises(ValueError, match=f"key '{key}' for {name} is supplied by the module"):
            check_estimator_kwargs(name, {key: None})
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        check_estimator_kwargs("ppo", {})


def test_turn_return_advantages_by_hand():
    """RSPO's ``explorer_credit: turn``: one group, trajectory 0 with progress deltas (0, 0.5, 0.5),
    trajectory 1 with (0, 0); γ = 0.5. Returns-to-go: 0.5, 0.5 + 0.5·0.5 = 0.75, 0 + 0.5·0.75 =
    0.375 and 0, 0; their mean over the group's 5 turns is 1.625 / 5 = 0.325."""
    from rspo_lightning.advantages import turn_return_advantages

    rewards = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0])
    traj, group, turn = torch.tensor([0, 0, 0, 1, 1]), torch.zeros(5, dtype=torch.long), torch.tensor([0, 1, 2, 0, 1])
    centred = [0.375 - 0.325, 0.75 - 0.325, 0.5 - 0.325, -0.325, -0.325]
    got = turn_return_advantages(rewards, traj, group, turn, gamma=0.5, norm="mean").advantages
    assert got.tolist() == pytest.approx(centred, abs=1e-6)
    std = (sum(c * c for c in centred) / 4) ** 0.5  # unbiased: 0.425 / 4
    got = turn_return_advantages(rewards, traj, group, turn, gamma=0.5).advantages
    assert got.tolist() == pytest.approx([c / (std + 1e-6) for c in centred], abs=1e-5)
    # the telescoping the trajectory return has: both deltas of trajectory 0 sum to its final progress 1.0,
    # while per-turn credit ranks the turn that reached the subgoal first above the one before it
    assert got[1] > got[0]
    # a group whose returns-to-go are all equal gives 0
    flat_group = turn_return_advantages(
        torch.zeros(4), torch.tensor([0, 0, 1, 1]), torch.zeros(4, dtype=torch.long), torch.tensor([0, 1, 0, 1])
    )
    assert flat_group.advantages.tolist() == [0.0] * 4


def test_a2tgpo_clip_mode_is_renamed_adaptive_clip_by_the_config_only():
    from rspo_lightning.config import AlgorithmConfig

    with pytest.warns(FutureWarning, match="estimator_kwargs.clip_mode of a2tgpo is renamed adaptive_clip"):
        cfg = AlgorithmConfig(estimator="a2tgpo", estimator_kwargs={"clip_mode": "signal", "kappa": 0.5})
    assert cfg.estimator_kwargs == {"kappa": 0.5, "adaptive_clip": "signal"}
    r, ti, gi, tu = (torch.tensor(v) for v in ([1.0, 0.0], [0, 1], [0, 0], [0, 0]))
    with pytest.raises(TypeError, match="clip_mode"):  # the estimator itself takes the new name only
        a2tgpo_advantages(r, ti, gi, tu, signals=r, clip_mode="inverse_advantage")


def test_gigpo_step_penalty_lowers_the_invalid_steps_discounted_return_only():
    """verl-agent's placement (issue 46): the penalty comes off the invalid step's episode score
    and off its return-to-go *after* discounting, so it does not reach earlier turns through γ.
    Hand count, γ = 0.95, norm "mean" (centred only), step statistics; trajectory A wins
    (rewards 0, 0, 10) with an invalid turn 1 (penalty 0.1), trajectory B fails (0, 0, 0); turn t
    of both shares anchor s_t.
    Episode scores (step samples): A 10, 9.9, 10; B 0, 0, 0; mean 29.9 / 6 = 4.98333.
    Returns-to-go: A 0.9025 x 10 = 9.025, 0.95 x 10 - 0.1 = 9.4, 10; B 0, 0, 0; each step group
    {A_t, B_t} centred: ±4.5125, ±4.7, ±5.
    (The old placement took 0.1 off turn 1's reward before the scan: A's turn-0 return 8.93.)"""
    rewards = torch.tensor([0.0, 0.0, 10.0, 0.0, 0.0, 0.0])
    traj, group, turn = torch.tensor([0, 0, 0, 1, 1, 1]), torch.zeros(6, dtype=torch.long), torch.tensor([0, 1, 2] * 2)
    penalty = torch.tensor([0.0, 0.1, 0.0, 0.0, 0.0, 0.0])
    out = gigpo_advantages(
        rewards,
        traj,
        group,
        turn,
        anchors=["s0", "s1", "s2"] * 2,
        gamma=0.95,
        norm="mean",
        episode_stats="steps",
        step_penalty=penalty,
    )
    mean = 29.9 / 6
    episode = [10 - mean, 9.9 - mean, 10 - mean, -mean, -mean, -mean]
    step = [4.5125, 4.7, 5.0, -4.5125, -4.7, -5.0]
    assert out.advantages.tolist() == pytest.approx([e + s for e, s in zip(episode, step)], abs=1e-5)  # float32
