"""``batching``: trajectories -> flat per-turn tensors -> the padded TrainBatch, by hand."""

import pytest
import torch

from rspo_lightning.batching import drop_faulty, flatten, left_pad, make_train_batch, positions_from_mask
from rspo_lightning.types import TaskSpec, Trajectory, Turn


def _turn(prompt, response, outcome=0.0, dense=0.0, valid=True, anchor="s"):
    return Turn(
        prompt_ids=torch.tensor(prompt),
        response_ids=torch.tensor(response),
        behaviour_logprobs=-0.1 * torch.arange(1, len(response) + 1, dtype=torch.float32),
        action="a",
        valid=valid,
        observation="o",
        anchor=anchor,
        outcome_reward=outcome,
        dense_reward=dense,
    )


def _trajs():
    won = Trajectory(
        task=TaskSpec("x", "train", 0, group_id=7),
        turns=[_turn([1, 2], [3], dense=0.5), _turn([1, 2, 4], [5, 6], outcome=10.0, dense=0.5, valid=False)],
        success=True,
    )
    lost = Trajectory(task=TaskSpec("x", "train", 0, group_id=7), turns=[_turn([1], [3, 3, 3], dense=0.25)])
    replayed = Trajectory(
        task=TaskSpec("x", "train", 0, group_id=7),
        turns=[_turn([9], [8], outcome=10.0, dense=1.0)],
        success=True,
        source="replay",
    )
    return [won, lost, replayed]


def test_flatten_lays_turns_out_in_order_with_the_reward_of_each_mode():
    flat = flatten(_trajs(), "outcome")
    assert flat.traj_index.tolist() == [0, 0, 1, 2] and flat.turn_index.tolist() == [0, 1, 0, 0]
    # the replayed trajectory has its own group although its group_id is the on-policy groups'
    assert flat.group_index.tolist() == [0, 0, 0, 1]
    assert flat.rewards.tolist() == [0.0, 10.0, 0.0, 10.0]
    assert flat.success.tolist() == [True, True, False, True] and flat.invalid.tolist() == [False, True, False, False]
    assert flat.is_replay.tolist() == [False, False, False, True]
    # dense x 2 alone for the on-policy turns; a replayed turn always carries its outcome (the reward swap)
    assert flatten(_trajs(), "dense", dense_scale=2.0).rewards.tolist() == [1.0, 1.0, 0.5, 10.0]
    assert flatten(_trajs(), "outcome+dense").rewards.tolist() == [0.5, 10.5, 0.25, 10.0]
    with pytest.raises(ValueError, match="reward_mode must be one of"):
        flatten(_trajs(), "shaped")


def test_train_batch_left_pads_so_every_response_ends_at_the_last_column():
    flat = flatten(_trajs())
    batch = make_train_batch(flat, pad_id=0, advantages=torch.tensor([1.0, -1.0, 0.5, 2.0]))
    # rows: [1 2 | 3], [1 2 4 | 5 6], [1 | 3 3 3], [9 | 8]; width 5, response window 3
    assert batch.input_ids.tolist() == [[0, 0, 1, 2, 3], [1, 2, 4, 5, 6], [0, 1, 3, 3, 3], [0, 0, 0, 9, 8]]
    assert batch.attention_mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert batch.response_mask.tolist() == [
        [False, False, True],
        [False, True, True],
        [True, True, True],
        [False, False, True],
    ]
    assert batch.behaviour_logprobs[1].tolist() == pytest.approx([0.0, -0.1, -0.2])
    assert torch.equal(batch.old_logprobs, batch.behaviour_logprobs)  # until scored
    assert batch.value_positions.tolist() == [3, 2, 1, 3]  # the last prompt token of each row
    assert batch.advantages.tolist() == [1.0, -1.0, 0.5, 2.0] and batch.clip_scale.tolist() == [1.0] * 4
    assert positions_from_mask(batch.attention_mask)[0].tolist() == [0, 0, 0, 1, 2]
    ids, mask = left_pad([[5], [6, 7]], pad_id=9)
    assert ids.tolist() == [[9, 5], [6, 7]] and mask.tolist() == [[0, 1], [1, 1]]


def test_drop_faulty_drops_the_failed_episode_and_a_group_left_without_a_baseline():
    a, b, c = (Trajectory(task=TaskSpec("x", "train", 0, group_id=g), turns=[]) for g in (1, 1, 2))
    d = Trajectory(task=TaskSpec("x", "train", 0, group_id=2), turns=[])
    a.env_error, c.env_error = "timeout", "crash"
    assert drop_faulty([a, b, c, d], group_relative=False) == [b, d]
    assert drop_faulty([a, b, c, d], group_relative=True) == []  # groups 1 and 2 keep one episode each
    assert drop_faulty([b, d], group_relative=True) == [b, d]  # nothing faulty: as given
