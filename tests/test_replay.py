"""ReplayBuffer: FIFO capacity, hand-computed sampling weights, checkpoint round trip."""

import io

import pytest
import torch

from rspo_lightning.rspo.buffer import ReplayBuffer
from rspo_lightning.types import TaskSpec, Trajectory, Turn


def _traj(group_id, reward, tag="B"):
    turn = Turn(
        prompt_ids=torch.tensor([1, 2, 3]),
        response_ids=torch.tensor([4, 5]),
        behaviour_logprobs=torch.tensor([-0.5, -0.25]),
        action="go to shelf 1",
        valid=True,
        observation="o",
        anchor="a",
        outcome_reward=reward,
        dense_reward=0.3,
    )
    return Trajectory(
        task=TaskSpec("rspo/Household-v0", "train", group_id, group_id),
        turns=[turn],
        success=reward > 0,
        score=float(reward > 0),
        task_type="pick_and_place",
        policy_tag=tag,
        iteration=7,
    )


def _group(group_id, rewards):
    return [_traj(group_id, r) for r in rewards]


def test_fifo_capacity_and_copies_marked_as_replay():
    buf = ReplayBuffer(capacity=2)
    g0 = _group(0, [10.0, 0.0])
    buf.add_group(g0)
    buf.add_group(_group(1, [0.0, 0.0]))
    buf.add_group(_group(2, [10.0, 10.0]))
    assert len(buf) == 2 and [g[0].task.group_id for g in buf.groups] == [1, 2]
    assert g0[0].source == "on_policy"  # the caller's trajectory is untouched
    assert all(t.source == "replay" and t.policy_tag == "B" for g in buf.groups for t in g)
    assert buf.success_rate() == 0.5  # 2 of the 4 stored trajectories won
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0)
    with pytest.raises(ValueError, match="sampling"):
        ReplayBuffer(sampling="best")


def test_weights_by_hand():
    buf = ReplayBuffer(sampling="reward")
    for gid, rewards in enumerate([[10.0, 0.0], [0.0, 0.0], [10.0, 10.0]]):
        buf.add_group(_group(gid, rewards))
    # group mean returns 5, 0, 10; lowest 0; floor 1e-3
    assert buf.weights() == pytest.approx([5.001, 0.001, 10.001])
    buf.sampling = "variance"
    # population variances: [10, 0] -> 25; [0, 0] -> 0; [10, 10] -> 0
    assert buf.weights() == pytest.approx([25.001, 0.001, 0.001])
    buf.sampling = "random"
    assert buf.weights() == [1.0, 1.0, 1.0]


def test_sampling_is_distinct_capped_and_follows_the_weights():
    buf = ReplayBuffer(sampling="reward", seed=3)
    for gid, rewards in enumerate([[10.0, 0.0], [0.0, 0.0], [10.0, 10.0]]):
        buf.add_group(_group(gid, rewards))
    picked = buf.sample(5)
    assert len(picked) == 3 and len({id(g) for g in picked}) == 3
    counts = [0, 0, 0]
    for _ in range(3000):
        (g,) = buf.sample(1)
        counts[g[0].task.group_id] += 1
    # expected shares 5.001/15.003 = 0.333, 0.001/15.003 ~ 0, 10.001/15.003 = 0.667
    assert abs(counts[0] / 3000 - 1 / 3) < 0.04
    assert counts[1] < 10
    assert abs(counts[2] / 3000 - 2 / 3) < 0.04
    assert buf.sample(0) == []


def test_state_round_trips_through_a_weights_only_checkpoint():
    buf = ReplayBuffer(capacity=4, sampling="variance", seed=11)
    for gid, rewards in enumerate([[10.0, 0.0], [0.0, 0.0], [10.0, 10.0]]):
        buf.add_group(_group(gid, rewards))
    buf.sample(1)  # advance the stream
    blob = io.BytesIO()
    torch.save({"replay": buf.state_dict()}, blob)
    blob.seek(0)
    state = torch.load(blob, weights_only=True)["replay"]
    other = ReplayBuffer(capacity=1, sampling="random", seed=0)
    other.load_state_dict(state)
    assert other.capacity == 4 and other.sampling == "variance" and len(other) == 3
    t0, t1 = buf.groups[0][0], other.groups[0][0]
    assert torch.equal(t0.turns[0].behaviour_logprobs, t1.turns[0].behaviour_logprobs) and t1.source == "replay"
    assert t1.turns[0].outcome_reward == 10.0 and t1.iteration == 7
    # the same sampling stream continues
    assert [g[0].task.group_id for g in buf.sample(2)] == [g[0].task.group_id for g in other.sample(2)]


def test_sampling_an_empty_buffer_gives_nothing():
    for sampling in ("reward", "variance", "random"):
        buf = ReplayBuffer(capacity=4, sampling=sampling)
        assert buf.sample(0) == [] and buf.sample(3) == []
