"""Dense reward sources: progress deltas, noise, assignment into turns."""

import pytest
import torch

from rspo_lightning.rewards import DenseReward, EnvProgressReward, NoisyReward, NoveltyBonus, assign_dense_rewards
from rspo_lightning.types import TaskSpec, Trajectory, Turn


def _traj(progress, initial=0.0, anchors=None):
    anchors = anchors or ["s"] * len(progress)
    turns = [
        Turn(
            prompt_ids=torch.tensor([1]),
            response_ids=torch.tensor([2]),
            behaviour_logprobs=torch.tensor([0.0]),
            action="a",
            valid=True,
            observation="o",
            anchor=a,
            progress=p,
        )
        for p, a in zip(progress, anchors)
    ]
    return Trajectory(task=TaskSpec("rspo/Household-v0", "train", 0, 0), turns=turns, initial_progress=initial)


def test_env_progress_reward_is_the_delta_of_progress():
    t = _traj([0.0, 1 / 3, 1 / 3, 2 / 3, 1.0])
    # deltas by hand: 0, 1/3, 0, 1/3, 1/3; scaled by 2
    assert EnvProgressReward(scale=2.0).turn_rewards(t) == pytest.approx([0.0, 2 / 3, 0.0, 2 / 3, 2 / 3])
    # progress can fall (the object is put back): the delta is negative; origin = initial progress
    t = _traj([0.5, 0.25], initial=0.25)
    assert EnvProgressReward().turn_rewards(t) == pytest.approx([0.25, -0.25])


def test_assign_writes_dense_reward_into_turns():
    trajs = [_traj([0.5, 1.0]), _traj([0.0])]
    assign_dense_rewards(EnvProgressReward(), trajs)
    assert [t.dense_reward for t in trajs[0].turns] == [0.5, 0.5]
    assert trajs[1].turns[0].dense_reward == 0.0
    assert isinstance(EnvProgressReward(), DenseReward)


def test_assign_rejects_a_wrong_length_or_non_finite_source():
    class Short:
        def turn_rewards(self, trajectory):
            return [0.0]

    class Nan:
        def turn_rewards(self, trajectory):
            return [float("nan")] * len(trajectory.turns)

    with pytest.raises(ValueError, match="1 values for 2 turns"):
        assign_dense_rewards(Short(), [_traj([0.5, 1.0])])
    with pytest.raises(ValueError, match="non-finite"):
        assign_dense_rewards(Nan(), [_traj([0.5])])


def test_noisy_reward_adds_seeded_gaussian_noise():
    t = _traj([0.5, 1.0])
    assert NoisyReward(sigma=0.0).turn_rewards(t) == [0.5, 0.5]
    a, b = NoisyReward(sigma=0.3, seed=7), NoisyReward(sigma=0.3, seed=7)
    assert a.turn_rewards(t) == b.turn_rewards(t)
    # the noise has the requested spread: sample std of 4000 draws within 5% of sigma
    n = NoisyReward(base=EnvProgressReward(scale=0.0), sigma=0.3, seed=1)
    draws = torch.tensor([n.turn_rewards(t) for _ in range(2000)]).flatten()
    assert abs(draws.std().item() - 0.3) < 0.015 and abs(draws.mean().item()) < 0.02
    # the generator state round-trips (as a checkpoint would store it)
    state = a.state_dict()
    first = a.turn_rewards(t)
    a.load_state_dict({"rng": [list(x) if isinstance(x, tuple) else x for x in state["rng"]]})
    assert a.turn_rewards(t) == first
    with pytest.raises(ValueError, match="sigma"):
        NoisyReward(sigma=-0.1)


def test_novelty_bonus_pays_each_turn_that_reaches_a_new_state():
    # states A B A C C D: turn 0 reaches B (new), 1 reaches A (seen), 2 reaches C (new), 3 reaches C
    # (seen: "Nothing happens"), 4 reaches D (new), 5 is last (its next state is not recorded)
    t = _traj([0.0, 0.0, 0.5, 0.5, 0.5, 1.0], anchors=["A", "B", "A", "C", "C", "D"])
    # progress deltas by hand: 0, 0, 0.5, 0, 0, 0.5; bonus 0.1 on turns 0, 2, 4
    assert NoveltyBonus(bonus=0.1).turn_rewards(t) == pytest.approx([0.1, 0.0, 0.6, 0.0, 0.1, 0.5])
    # bonus 0 is the base itself; a loop between two states earns only its first step
    assert NoveltyBonus(bonus=0.0).turn_rewards(t) == EnvProgressReward().turn_rewards(t)
    loop = _traj([0.0] * 5, anchors=["A", "B", "A", "B", "A"])
    assert NoveltyBonus(bonus=0.1).turn_rewards(loop) == pytest.approx([0.1, 0.0, 0.0, 0.0, 0.0])
    # the default bound of the hard setting: a 15-turn failure visiting 15 distinct states, progress 0.5,
    # earns 0.5 + 14 x 0.03 = 0.92, below a 3-turn win's 1.0 + 2 x 0.03 = 1.06
    fail = _traj([0.5] * 15, anchors=[f"s{i}" for i in range(15)])
    win = _traj([0.0, 0.5, 1.0], anchors=["a", "b", "c"])
    assert sum(NoveltyBonus().turn_rewards(fail)) == pytest.approx(0.92)
    assert sum(NoveltyBonus().turn_rewards(win)) == pytest.approx(1.06)
    # the base's state travels (NoisyReward's generator), and bad input names the value
    noisy = NoveltyBonus(base=NoisyReward(sigma=0.3, seed=3))
    state = noisy.state_dict()
    first = noisy.turn_rewards(t)
    noisy.load_state_dict(state)
    assert noisy.turn_rewards(t) == first
    assert NoveltyBonus().state_dict() == {}
    with pytest.raises(ValueError, match="bonus must be a finite number >= 0, got -0.1"):
        NoveltyBonus(bonus=-0.1)
