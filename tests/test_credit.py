"""``credit``: a FlatTurns batch and the config through the estimators (invalid-action penalty
placement, replayed rows' stored advantages, the advantages RSPOLoop stores), by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

EPS = 1e-6  # the estimators' std epsilon (docs/algorithms.md)


def check32(actual, expected):
    """FlatTurns holds float32 rewards, so the results are float32."""
    assert actual.dtype == torch.float32
    assert_close(actual, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=1e-6)


def _turn(valid=True, reward=0.0, dense=0.0, stored=None, anchor="s"):
    from rspo_lightning.types import Turn

    return Turn(
        prompt_ids=torch.tensor([1, 2]),
        response_ids=torch.tensor([3]),
        behaviour_logprobs=torch.tensor([-1.0]),
        action="x",
        valid=valid,
        observation="o",
        anchor=anchor,
        outcome_reward=reward,
        dense_reward=dense,
        replay_advantage=stored,
    )


def _traj(group, turns, source="on_policy"):
    from rspo_lightning.types import TaskSpec, Trajectory

    task = TaskSpec("rspo/Household-v0", "train", group, group)
    return Trajectory(task=task, turns=turns, success=any(t.outcome_reward > 0 for t in turns), source=source)


def _penalty_batch():
    # group 0: T0 = (invalid, invalid, valid r=1), R = 1 ; T1 = (invalid, valid r=0), R = 0
    # group 1: T2 = (valid r=1), R = 1 ; T3 = (invalid, valid r=1), R = 1
    # dense rewards and a stored replay_advantage on on-policy turns must not matter
    return [
        _traj(0, [_turn(False, dense=0.3), _turn(False, stored=9.0), _turn(True, 1.0)]),
        _traj(0, [_turn(False), _turn(True, 0.0, dense=0.5)]),
        _traj(1, [_turn(True, 1.0)]),
        _traj(1, [_turn(False), _turn(True, 1.0)]),
    ]


def _algo(**kw):
    from rspo_lightning.config import AlgorithmConfig

    return AlgorithmConfig(
        **{"estimator": "grpo", "estimator_kwargs": {"norm": "mean"}, "invalid_action_penalty": 0.25, **kw}
    )


def test_turn_advantages_penalty_on_the_advantage():
    from rspo_lightning.batching import flatten
    from rspo_lightning.credit import turn_advantages

    flat_turns = flatten(_penalty_batch())
    result, estimator = turn_advantages(flat_turns, _algo(penalty_at="advantage"))
    # GRPO (mean): group 0 mean 0.5 -> T0 +0.5, T1 -0.5 ; group 1 equal returns -> 0
    check32(estimator, [0.5, 0.5, 0.5, -0.5, -0.5, 0.0, 0.0, 0.0])
    # then -0.25 on each invalid turn alone
    check32(result.advantages, [0.25, 0.25, 0.5, -0.75, -0.5, 0.0, -0.25, 0.0])
    assert result.returns is None and result.clip_scale is None
    # the default config places it here too; std norm: group 0 deviations +-0.5, std sqrt(0.5)
    result, _ = turn_advantages(flat_turns, _algo(estimator_kwargs={}))
    a = 0.5 / (math.sqrt(0.5) + EPS)
    check32(result.advantages, [a - 0.25, a - 0.25, a, -a - 0.25, -a, 0.0, -0.25, 0.0])


def test_turn_advantages_penalty_on_the_reward():
    from rspo_lightning.batching import flatten
    from rspo_lightning.credit import turn_advantages

    result, estimator = turn_advantages(flatten(_penalty_batch()), _algo(penalty_at="reward"))
    # rewards lose 0.25 per invalid turn: R(T0) = 1 - 0.5 = 0.5, R(T1) = -0.25 -> mean 0.125,
    # advantages +-0.375 ; R(T2) = 1, R(T3) = 0.75 -> mean 0.875, advantages +-0.125
    expected = [0.375] * 3 + [-0.375] * 2 + [0.125] + [-0.125] * 2
    check32(result.advantages, expected)
    check32(estimator, expected)  # nothing is added after the estimator


def test_turn_advantages_replayed_rows_take_their_stored_advantage():
    from rspo_lightning.batching import flatten
    from rspo_lightning.credit import turn_advantages

    trajs = _penalty_batch()[:2] + [
        # a replay group: T4 = (valid, stored 0.7; invalid r=1, stored -0.3), T5 = (valid r=0, none stored)
        _traj(0, [_turn(True, stored=0.7), _turn(False, 1.0, stored=-0.3)], source="replay"),
        _traj(0, [_turn(True, 0.0)], source="replay"),
    ]
    flat_turns = flatten(trajs)
    result, estimator = turn_advantages(flat_turns, _algo(penalty_at="advantage"))
    # replay group: R(T4) = 1, R(T5) = 0 -> +-0.5; T4's rows are overridden, T5 keeps -0.5;
    # the on-policy turn's stored 9.0 is ignored (not a replayed row)
    check32(estimator, [0.5, 0.5, 0.5, -0.5, -0.5, 0.7, -0.3, -0.5])
    check32(result.advantages, [0.25, 0.25, 0.5, -0.75, -0.5, 0.7, -0.55, -0.5])
    result, estimator = turn_advantages(flat_turns, _algo(penalty_at="reward"))
    # replay group rewards: R(T4) = 1 - 0.25 = 0.75, R(T5) = 0 -> mean 0.375, T5 -0.375
    check32(result.advantages, [0.375] * 3 + [-0.375] * 2 + [0.7, -0.3, -0.375])
    check32(estimator, result.advantages.tolist())


def test_turn_advantages_passes_values_and_signals_and_keeps_returns_and_clip_scale():
    from rspo_lightning.batching import flatten
    from rspo_lightning.credit import turn_advantages

    # gae, gamma = lam = 1: rewards (0, 1), V = (0.5, 0.5) -> A = (1 - 0.5, 1 - 0.5), returns (1, 1)
    flat_turns = flatten([_traj(0, [_turn(False), _turn(True, 1.0)])])
    values = torch.tensor([0.5, 0.5])
    result, estimator = turn_advantages(flat_turns, _algo(estimator="gae", estimator_kwargs={}), values)
    check32(estimator, [0.5, 0.5])
    check32(result.advantages, [0.25, 0.5])
    check32(result.returns, [1.0, 1.0])  # the critic's target is the estimator's
    # reward placement: rewards (-0.25, 1) -> A = (0.75 - 0.5, 0.5), returns (0.75, 1)
    result, _ = turn_advantages(flat_turns, _algo(estimator="gae", estimator_kwargs={}, penalty_at="reward"), values)
    check32(result.advantages, [0.25, 0.5])
    check32(result.returns, [0.75, 1.0])
    with pytest.raises(ValueError, match="needs critic values"):
        turn_advantages(flat_turns, _algo(estimator="gae", estimator_kwargs={}))
    # a2tgpo reads flat.dense: one-turn trajectories with signals (0, 1) in one (group, turn)
    # cell: mean 0.5, deviations -+0.5, unbiased std sqrt(0.5) -> ghat = -+g ;
    # clip_scale = clamp(1 -+ 0.5 g, 0.5, 1.5) (kappa 0.5, delta 0.5)
    g = 0.5 / (math.sqrt(0.5) + EPS)
    flat_turns = flatten([_traj(0, [_turn(True, 0.0, dense=0.0)]), _traj(0, [_turn(True, 0.0, dense=1.0)])])
    result, _ = turn_advantages(flat_turns, _algo(estimator="a2tgpo", estimator_kwargs={}))
    check32(result.clip_scale, [1 - 0.5 * g, 1 + 0.5 * g])
    check32(result.advantages, [-g, g])  # A^E = 0 (equal returns) + ghat / sqrt(1)


def test_outcome_advantages_leave_out_an_advantage_penalty_and_keep_a_reward_one():
    from rspo_lightning.credit import outcome_advantages

    trajs = _penalty_batch()
    assert outcome_advantages(trajs, _algo(penalty_at="advantage")) == pytest.approx(
        [0.5, 0.5, 0.5, -0.5, -0.5, 0.0, 0.0, 0.0], abs=1e-12
    )
    assert outcome_advantages(trajs, _algo(penalty_at="reward")) == pytest.approx(
        [0.375] * 3 + [-0.375] * 2 + [0.125] + [-0.125] * 2, abs=1e-12
    )
    assert outcome_advantages(trajs, _algo(estimator="gae", estimator_kwargs={})) is None
    assert outcome_advantages([], _algo()) is None


def test_penalty_at_reward_is_verl_agents_placement_by_hand():
    """verl-agent subtracts the invalid-action penalty from the invalid step sample's own episode
    score (statistics over step samples) and from that step's discounted return-to-go, never
    from the score the trajectory's other turns carry. One group: trajectory 0 = (invalid, valid
    win 10), trajectory 1 = (valid, invalid); p = 0.1; mean norm; steps statistics."""
    from rspo_lightning.batching import flatten
    from rspo_lightning.config import AlgorithmConfig
    from rspo_lightning.credit import turn_advantages
    from rspo_lightning.types import TaskSpec, Trajectory, Turn

    def turn(valid, reward, anchor):
        return Turn(
            prompt_ids=torch.tensor([1]),
            response_ids=torch.tensor([2]),
            behaviour_logprobs=torch.tensor([-1.0]),
            action="a",
            valid=valid,
            observation="o",
            anchor=anchor,
            outcome_reward=reward,
        )

    task = TaskSpec("rspo/Household-v0", "train", 0, 0)
    trajs = [
        Trajectory(task=task, turns=[turn(False, 0.0, "s0"), turn(True, 10.0, "w")], success=True),
        Trajectory(task=task, turns=[turn(True, 0.0, "s0"), turn(False, 0.0, "x")]),
    ]
    flat = flatten(trajs)
    # scores per step sample: 10 - 0.1, 10, 0, 0 - 0.1; mean 19.8 / 4 = 4.95
    grpo = AlgorithmConfig(
        estimator="grpo",
        penalty_at="reward",
        invalid_action_penalty=0.1,
        estimator_kwargs={"norm": "mean", "episode_stats": "steps"},
    )
    assert turn_advantages(flat, grpo)[0].advantages.tolist() == pytest.approx([4.95, 5.05, -4.95, -5.05])
    # the former placement (penalty inside R(tau): 9.9, 9.9, -0.1, -0.1; mean 4.9) gave 5, 5, -5, -5
    # GiGPO adds the step part: returns-to-go, gamma 0.5, then the penalty off each invalid step's own
    # return (verl-agent applies it after discounting, issue 46): trajectory 0: t1 = 10, t0 = 0.5 * 10
    # - 0.1 = 4.9; trajectory 1: t3 = 0 - 0.1 = -0.1, t2 = 0 + 0.5 * 0 = 0 (the penalty no longer
    # reaches it); step group {t0, t2} (anchor s0): mean 2.45 -> +-2.45; the other step groups are singletons (0)
    gigpo = AlgorithmConfig(
        estimator="gigpo",
        penalty_at="reward",
        invalid_action_penalty=0.1,
        estimator_kwargs={"norm": "mean", "episode_stats": "steps", "gamma": 0.5, "omega": 1.0},
    )
    assert turn_advantages(flat, gigpo)[0].advantages.tolist() == pytest.approx([7.4, 5.05, -7.4, -5.05])
    # trajectory statistics have no verl-agent counterpart: the penalty stays inside R(tau) there
    traj_stats = AlgorithmConfig(
        estimator="grpo",
        penalty_at="reward",
        invalid_action_penalty=0.1,
        estimator_kwargs={"norm": "mean", "episode_stats": "trajectory"},
    )
    assert turn_advantages(flat, traj_stats)[0].advantages.tolist() == pytest.approx([5.0, 5.0, -5.0, -5.0])
