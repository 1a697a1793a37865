"""ReplayBuffer of trajectory groups (RSPO's D, DESIGN §10).

Groups are stored whole (group-relative advantages stay defined on replay) with their behaviour
log-probs, outcome rewards, success, task type, policy tag and iteration. One buffer per rank:
each rank replays what it played. The state is plain lists/dicts/numbers, so it is saved in a
Lightning checkpoint and loads back with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from typing import Sequence

from rspo_lightning.trajectory_io import trajectory_from_dict, trajectory_to_dict
from rspo_lightning.types import Trajectory

SAMPLING = ("reward", "random", "variance")
# Added to every weight so that no group has probability 0 and an all-equal buffer is uniform.
WEIGHT_FLOOR = 1e-3


def group_return_stats(group: Sequence[Trajectory]) -> tuple[float, float]:
    """(mean, population variance) of the outcome returns R(tau) of a group's trajectories."""
    returns = [t.outcome_return for t in group]
    mean = sum(returns) / len(returns)
    return mean, sum((r - mean) ** 2 for r in returns) / len(returns)


class ReplayBuffer:
    """FIFO buffer of trajectory groups with weighted sampling without replacement.

    Args:
        capacity: most groups kept; the oldest go first.
        sampling: ``reward`` (weight = group mean outcome return - the buffer's lowest + floor:
            prefers groups that scored), ``random`` (uniform) or ``variance`` (weight = variance of
            the group's returns + floor: prefers groups whose episodes disagree, the ones that
            carry a group-relative signal).
        seed: seed of the sampling stream (its state is checkpointed).
    """

    def __init__(self, capacity: int = 256, sampling: str = "reward", seed: int = 0):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        if sampling not in SAMPLING:
            raise ValueError(f"replay sampling must be one of {SAMPLING}, got {sampling!r}")
        self.capacity = capacity
        self.sampling = sampling
        self.groups: deque[list[Trajectory]] = deque(maxlen=capacity)
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.groups)

    def add_group(self, group: Sequence[Trajectory]) -> None:
        """Store a copy of ``group`` marked ``source="replay"`` (the caller's objects are untouched)."""
        if not group:
            raise ValueError("cannot add an empty group to the replay buffer")
        stored = [copy.copy(t) for t in group]
        for t in stored:
            t.source = "replay"
        self.groups.append(stored)

    def clear(self) -> None:
        self.groups.clear()

    def success_rate(self) -> float:
        """Fraction of stored trajectories that succeeded (0 when empty)."""
        trajs = [t for g in self.groups for t in g]
        return sum(t.success for t in trajs) / len(trajs) if trajs else 0.0

    def weights(self) -> list[float]:
        """Sampling weight of each stored group under the configured strategy."""
        if self.sampling == "random":
            return [1.0] * len(self.groups)
        stats = [group_return_stats(g) for g in self.groups]
        if self.sampling == "variance":
            return [var + WEIGHT_FLOOR for _, var in stats]
        low = min(mean for mean, _ in stats)
        return [mean - low + WEIGHT_FLOOR for mean, _ in stats]

    def sample(self, n: int) -> list[list[Trajectory]]:
        """``min(n, len(self))`` distinct groups, drawn one by one with probability ∝ weight."""
        if n < 0:
            raise ValueError(f"cannot sample a negative number of groups, got {n}")
        if n == 0 or not self.groups:
            return []
        weights = self.weights()
        index = list(range(len(self.groups)))
        chosen: list[int] = []
        for _ in range(min(n, len(index))):
            total = sum(weights[i] for i in index)
            x = self.rng.random() * total
            for pos, i in enumerate(index):
                x -= weights[i]
                if x <= 0 or pos == len(index) - 1:
                    chosen.append(index.pop(pos))
                    break
        return [self.groups[i] for i in chosen]

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {
            "capacity": self.capacity,
            "sampling": self.sampling,
            "groups": [[trajectory_to_dict(t) for t in g] for g in self.groups],
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict) -> None:
        self.capacity = int(state["capacity"])
        self.sampling = state["sampling"]
        self.groups = deque(([trajectory_from_dict(t) for t in g] for g in state["groups"]), maxlen=self.capacity)
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))

