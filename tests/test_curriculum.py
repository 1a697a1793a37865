"""Curriculum callback: levels rise only after `window` iterations at or above the threshold."""

import pytest
import torch

from rspo_lightning.callbacks import Curriculum


class _T:
    def __init__(self, success):
        self.success = success


class _Module:
    def __init__(self):
        self.applied = []
        self.logged = []
        self.last_trajectories = []

    def set_env_kwargs(self, changes):
        self.applied.append(changes)

    def log(self, name, value, **kw):
        self.logged.append((name, value))


def _step(cb, m, rate):
    m.last_trajectories = [_T(True)] * int(rate * 10) + [_T(False)] * (10 - int(rate * 10))
    cb.on_train_batch_end(None, m, None, None, 0)


def test_levels_rise_after_a_full_window_above_threshold():
    cb = Curriculum(knob="max_steps", levels=[10, 20, 30], threshold=0.7, window=2)
    m = _Module()
    cb.on_fit_start(None, m)
    assert m.applied == [{"max_steps": 10}]
    _step(cb, m, 0.9)  # window not full yet
    assert cb.level == 0
    _step(cb, m, 0.6)  # mean 0.75 >= 0.7 -> level 1, window restarts
    assert cb.level == 1 and m.applied[-1] == {"max_steps": 20}
    _step(cb, m, 0.5)
    _step(cb, m, 0.8)  # mean 0.65 < 0.7
    assert cb.level == 1
    _step(cb, m, 0.8)  # window (0.8, 0.8)
    assert cb.level == 2
    for _ in range(4):
        _step(cb, m, 1.0)  # already at the hardest level
    assert cb.level == 2 and m.logged[-1] == ("curriculum/level", 2.0)


def test_state_round_trip_and_bad_arguments():
    cb = Curriculum(levels=[0, 1], window=3)
    cb.level = 1
    cb._recent.extend([0.1, 0.2])
    other = Curriculum(levels=[0, 1], window=3)
    other.load_state_dict(cb.state_dict())
    assert other.level == 1 and list(other._recent) == [0.1, 0.2]
    with pytest.raises(ValueError, match="threshold"):
        Curriculum(threshold=1.5)
    with pytest.raises(TypeError, match="set_env_kwargs"):
        Curriculum().on_fit_start(None, object())


class _TwoRanks:
    """A trainer whose other rank always had ``other = (successes, episodes)``."""

    world_size = 2

    def __init__(self, other):
        self.strategy = self
        self.other = torch.tensor(other, dtype=torch.float32)

    def reduce(self, tensor, reduce_op):
        assert reduce_op == "sum"
        return tensor + self.other


def test_under_ddp_the_rate_is_over_all_ranks():
    cb = Curriculum(knob="max_steps", levels=[10, 20], threshold=0.7, window=1)
    m = _Module()
    m.device = torch.device("cpu")
    m.last_trajectories = [_T(True)] * 9 + [_T(False)]  # this rank: 9 of 10
    cb.on_train_batch_end(_TwoRanks([3.0, 10.0]), m, None, None, 0)  # other rank 3 of 10: (9 + 3) / 20 = 0.6
    assert cb.level == 0 and list(cb._recent) == [pytest.approx(0.6)]
    m.last_trajectories = []  # no episode here this time; the other rank's 8 of 10 still count
    cb.on_train_batch_end(_TwoRanks([8.0, 10.0]), m, None, None, 0)
    assert cb.level == 1 and m.applied[-1] == {"max_steps": 20}
