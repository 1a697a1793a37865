"""Groups whose rewards are all equal give exactly zero advantages under every group-relative
estimator (never NaN); GAE stays finite. (Non-finite losses/gradients skipping the optimizer
step: tests/test_module.py::test_non_finite_loss_skips_the_step_and_never_touches_the_weights.)"""

import pytest
import torch

from rspo_lightning.advantages import compute_advantages

# two groups of three 2-turn trajectories; every trajectory of a group has the same rewards
REWARDS = torch.tensor([0.0, 10.0] * 3 + [0.0, 0.0] * 3)
TRAJ = torch.arange(6).repeat_interleave(2)
GROUP = torch.tensor([0] * 6 + [1] * 6)
TURN = torch.tensor([0, 1] * 6)
ANCHORS = ["start", "room"] * 6


@pytest.mark.parametrize(
    "name,kw",
    [
        ("grpo", {}),
        ("grpo", {"norm": "mean"}),
        ("rloo", {}),
        ("gigpo", {"anchors": ANCHORS}),
        ("gigpo", {"anchors": ANCHORS, "norm": "mean", "episode_stats": "steps"}),
        ("a2tgpo", {"signals": torch.full((12,), 0.5)}),
    ],
)
def test_all_equal_rewards_give_exact_zeros(name, kw):
    adv = compute_advantages(
        name, rewards=REWARDS, traj_index=TRAJ, group_index=GROUP, turn_index=TURN, **kw
    ).advantages
    assert torch.isfinite(adv).all() and (adv == 0).all()


def test_proxmo_all_equal_rewards_leave_only_the_soft_baseline_leak():
    """ProxMO's soft step baseline puts weight e^0 / (3 e^(1/τ) + 3) on step samples with a
    dissimilar anchor: with R_t = 9.5 ('start', turn 0, γ = 0.95) and 10 ('room', turn 1) in
    group 0, A^S(start) = 9.5 − (e^10·9.5 + 10)/(e^10 + 1) = −0.5/(e^10 + 1) (τ = 0.1), and
    +0.5/(e^10 + 1) for 'room'; A^E = 0 (equal returns); group 1 (all zero) gives exact zeros."""
    import math

    out = compute_advantages(
        "proxmo",
        rewards=REWARDS,
        traj_index=TRAJ,
        group_index=GROUP,
        turn_index=TURN,
        anchors=ANCHORS,
        success=torch.tensor([True] * 6 + [False] * 6),
        tau=0.1,
        gamma=0.95,
    )
    leak = 0.5 / (math.exp(10) + 1)
    expected = torch.tensor([-leak, leak] * 3 + [0.0, 0.0] * 3)
    adv = out.advantages
    assert torch.isfinite(adv).all()
    assert torch.allclose(adv.double(), expected.double(), atol=1e-9, rtol=1e-4)


def test_a2tgpo_all_equal_signals_leave_the_clip_as_configured():
    """Equal signals in every (group, turn) cell give ghat = 0, so clip_scale = 1 exactly (signal
    mode), and equal returns give A = 0, so 1 / (1 + beta * 0) = 1 too (inverse_advantage)."""
    for mode in ("signal", "inverse_advantage"):
        out = compute_advantages(
            "a2tgpo",
            rewards=REWARDS,
            traj_index=TRAJ,
            group_index=GROUP,
            turn_index=TURN,
            signals=torch.full((12,), 0.5),
            adaptive_clip=mode,
        )
        assert (out.clip_scale == 1).all()


def test_gae_with_constant_rewards_is_finite():
    out = compute_advantages(
        "gae",
        rewards=REWARDS,
        traj_index=TRAJ,
        group_index=GROUP,
        turn_index=TURN,
        values=torch.zeros(12),
        gamma=0.9,
        lam=0.9,
    )
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
