"""``metrics``: what an iteration and a held-out pass log, by hand."""

import pytest
import torch

from rspo_lightning import metrics
from rspo_lightning.types import TaskSpec, Trajectory, Turn


def _traj(valids, success, progress, dense=0.0, task_type="pick_and_place"):
    turns = [
        Turn(
            prompt_ids=torch.tensor([1]),
            response_ids=torch.tensor([2]),
            behaviour_logprobs=torch.tensor([-0.1]),
            action="a",
            valid=v,
            observation="o",
            anchor="s",
            dense_reward=dense,
            progress=p,
        )
        for v, p in zip(valids, progress)
    ]
    return Trajectory(
        task=TaskSpec("x", "train", 0, 0), turns=turns, success=success, score=float(success), task_type=task_type
    )


def test_rollout_metrics_by_hand():
    played = [
        _traj([True, False, True], True, [0.0, 0.5, 1.0], dense=0.5),
        _traj([False], False, [0.5], task_type="heat"),
    ]
    got = metrics.rollout_metrics(played, "rollout")
    assert got["rollout/score"] == pytest.approx(0.5)
    assert got["rollout/episode_len"] == pytest.approx(2.0)  # 4 turns over 2 episodes
    assert got["rollout/invalid_rate"] == pytest.approx(0.5)  # 2 invalid of 4 turns
    assert got["rollout/dense_return"] == pytest.approx(0.75)  # (3 x 0.5 + 0) / 2
    assert got["rollout/progress"] == pytest.approx(0.75)  # the last turn's: (1.0 + 0.5) / 2
    # anchors are all "s": turns 2 and 3 of the first episode repeat one within 4 turns back; 2 of 4 turns
    assert got["rollout/repeat_visits"] == pytest.approx(0.5)
    assert got["rollout/success_rate/pick_and_place"] == 1.0 and got["rollout/success_rate/heat"] == 0.0


def test_held_out_sums_and_one_scheme_of_names():
    sums = {}
    metrics.add_held_out(sums, [_traj([True], True, [1.0]), _traj([True], False, [0.0])], "val")
    assert sums == {
        "val/success_rate": [1.0, 2.0],
        "val/score": [1.0, 2.0],
        "val/success_rate/pick_and_place": [1.0, 2.0],
    }
    assert [metrics.metric_prefix(s, "val") for s in ("valid_seen", "valid", "valid_unseen")] == [
        "val",
        "val",
        "val_unseen",
    ]
    assert [metrics.metric_prefix(s, "test") for s in ("test", "valid_seen", "valid_unseen")] == [
        "test",
        "test",
        "test_unseen",
    ]


def test_results_table_has_a_row_per_metric_and_a_column_per_split():
    table = metrics.results_table(
        {
            "val/success_rate": 0.5,
            "val/success_rate/pick_and_place_with_a_long_name": 0.25,
            "val_unseen/success_rate": 0.125,
            "val/score": 1.0,
        },
        "validate: agent A at iteration 3",
    )
    lines = table.splitlines()
    assert lines[0] == "validate: agent A at iteration 3" and lines[1].split() == ["metric", "val", "val_unseen"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows == {
        "score": ["1.000", "-"],
        "success_rate": ["0.500", "0.125"],
        "success_rate/pick_and_place_with_a_long_name": ["0.250", "-"],
    }  # never cut


def test_explained_variance_by_hand():
    returns, values = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 2.0])
    # Var(returns) = 1, Var(returns - values) = Var([0, 0, 1]) = 1/3
    assert metrics.explained_variance(returns, values) == pytest.approx(1 - 1 / 3)
    assert metrics.explained_variance(torch.ones(3), torch.zeros(3)) == 0.0
