"""ReplayBuffer of trajectory groups (RSPO's D, docs/design.md §10).

Groups are stored whole with their behaviour log-probs, outcome rewards, success, task type,
policy tag, iteration and (when the learner's estimator is group-relative) each turn's
``replay_advantage``: the advantage computed over the full collected group with the outcome
reward at collection time. One buffer per rank: each rank replays what it played. The state is
plain lists/dicts/numbers, so it is saved in a Lightning checkpoint and loads back with
``torch.load(weights_only=True)``.

What a replay slot may hold (docs/design.md §10, "replay must carry gradient"): an item (a group, or a
trajectory with ``unit="trajectory"``) whose advantage is exactly 0 on every turn - an all-won
or all-failed group under GRPO - adds no policy gradient, so with ``skip_zero_advantage`` it is
never drawn.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from collections import deque
from collections.abc import Sequence

from rspo_lightning import choices
from rspo_lightning.trajectory_io import trajectory_from_dict, trajectory_to_dict
from rspo_lightning.types import TaskSpec, Trajectory

# Added to every weight so that no group has probability 0 and an all-equal buffer is uniform.
WEIGHT_FLOOR = 1e-3


def has_signal(traj: Trajectory, group_returns_equal: bool) -> bool:
    """Whether ``traj`` would train with a non-zero advantage somewhere: its stored per-turn
    ``replay_advantage`` when set, else (no stored advantage) whether its group's returns differ."""
    stored = [t.replay_advantage for t in traj.turns if t.replay_advantage is not None]
    if stored:
        return any(a != 0.0 for a in stored)
    return not group_returns_equal


def is_positive(traj: Trajectory) -> bool:
    """Whether ``traj``'s stored advantage is positive on some turn (a win of a mixed group under
    a group-relative estimator)."""
    return any(t.replay_advantage is not None and t.replay_advantage > 0 for t in traj.turns)


def group_return_stats(group: Sequence[Trajectory]) -> tuple[float, float]:
    """(mean, population variance) of the outcome returns R(tau) of a group's trajectories."""
    returns = [t.outcome_return for t in group]
    mean = sum(returns) / len(returns)
    return mean, sum((r - mean) ** 2 for r in returns) / len(returns)


class ReplayBuffer:
    """FIFO buffer of trajectory groups with weighted sampling without replacement.

    Args:
        capacity: most groups kept; the oldest go first.
        sampling: ``reward`` (weight = the item's mean outcome return - the lowest candidate's +
            floor: prefers items that scored), ``random`` (uniform) or ``variance`` (weight =
            variance of the returns of the item's group + floor: prefers groups whose episodes
            disagree).
        unit: what one draw takes: a whole ``group`` or one ``trajectory`` (then a replayed
            trajectory trains with its stored ``replay_advantage``, computed over its full group).
        skip_zero_advantage: never draw an item without signal (``has_signal``).
        slots: ``signal`` (any drawable item), ``positive`` (only trajectories with a positive
            stored advantage; fewer items than asked when there are fewer) or ``positive_repeat``
            (positive trajectories, drawn again once all were drawn, until ``n`` are).
        seed: seed of the sampling stream (its state is checkpointed).

    Every stored group gets a serial number, so ``used_fraction`` can say how many distinct
    stored trajectories were ever drawn.
    """

    def __init__(
        self,
        capacity: int = 256,
        sampling: str = "reward",
        seed: int = 0,
        unit: str = "group",
        skip_zero_advantage: bool = False,
        slots: str = "signal",
        join_online: bool = False,
    ):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        choices.check("replay sampling", sampling, choices.Sampling)
        choices.check("replay unit", unit, choices.ReplayUnit)
        choices.check("replay slots", slots, choices.ReplaySlots)
        if slots != "signal" and unit != "trajectory":
            raise ValueError(
                f"replay slots={slots!r} picks single trajectories by their stored advantage: it needs "
                "unit='trajectory' (RSPOLoop replay_unit: trajectory)"
            )
        self.capacity = capacity
        self.sampling = sampling
        self.unit = unit
        self.skip_zero_advantage = skip_zero_advantage
        self.slots = slots
        self.join_online = join_online
        self.groups: deque[list[Trajectory]] = deque(maxlen=capacity)
        self.serials: deque[int] = deque(maxlen=capacity)  # serial number of each stored group
        self.next_serial = 0
        self.drawn: set[tuple[int, int]] = set()  # (group serial, position) of every trajectory drawn
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.groups)

    def add_group(self, group: Sequence[Trajectory]) -> list[Trajectory]:
        """Store copies of ``group`` (their turns too: the caller's objects are untouched) marked
        ``source="replay"``, so that they train on the outcome reward alone (``batching.flatten``:
        RSPO's reward swap). Returns the stored copies."""
        if not group:
            raise ValueError("cannot add an empty group to the replay buffer")
        stored = [dataclasses.replace(t, source="replay", turns=[copy.copy(turn) for turn in t.turns]) for t in group]
        self.groups.append(stored)
        self.serials.append(self.next_serial)
        self.next_serial += 1
        return stored

    def clear(self) -> None:
        self.retain(lambda group: False)

    def retain(self, keep) -> None:
        """Keep only the groups for which ``keep(group)`` is true."""
        pairs = [(g, s) for g, s in zip(self.groups, self.serials) if keep(g)]
        self.groups = deque((g for g, _ in pairs), maxlen=self.capacity)
        self.serials = deque((s for _, s in pairs), maxlen=self.capacity)
        live = set(self.serials)
        self.drawn = {d for d in self.drawn if d[0] in live}

    def num_trajectories(self) -> int:
        return sum(len(g) for g in self.groups)

    def num_wins(self) -> int:
        """Stored trajectories that were won."""
        return sum(t.success for g in self.groups for t in g)

    def used_fraction(self) -> float:
        """Distinct stored trajectories drawn at least once / trajectories stored (0 when empty)."""
        live = set(self.serials)
        used = sum(1 for serial, _ in self.drawn if serial in live)
        return used / max(self.num_trajectories(), 1)

    def success_rate(self) -> float:
        """Fraction of stored trajectories that succeeded (0 when empty)."""
        trajs = [t for g in self.groups for t in g]
        return sum(t.success for t in trajs) / len(trajs) if trajs else 0.0

    def weights(self) -> list[float]:
        """Sampling weight of each stored group under the configured strategy (all groups)."""
        return self._weights([(g, g) for g in self.groups])

    def _weights(self, items: list[tuple[list[Trajectory], list[Trajectory]]]) -> list[float]:
        """Weights of ``(trajectories of the item, the item's group)`` pairs."""
        if self.sampling == "random":
            return [1.0] * len(items)
        if self.sampling == "variance":
            return [group_return_stats(g)[1] + WEIGHT_FLOOR for _, g in items]
        means = [sum(t.outcome_return for t in trajs) / len(trajs) for trajs, _ in items]
        low = min(means)
        return [m - low + WEIGHT_FLOOR for m in means]

    def candidates(self) -> list[tuple[list[Trajectory], list[Trajectory]]]:
        """The drawable items as ``(trajectories, their group)``: whole groups or single
        trajectories (``unit``), leaving out those without signal when ``skip_zero_advantage``
        and, with ``slots`` positive, those without a positive stored advantage."""
        return [(trajs, group) for trajs, group, _ in self._candidates()]

    def _candidates(self) -> list[tuple[list[Trajectory], list[Trajectory], list[tuple[int, int]]]]:
        items = []
        for g, serial in zip(self.groups, self.serials):
            equal = group_return_stats(g)[1] == 0.0
            if self.unit == "group":
                if not self.skip_zero_advantage or any(has_signal(t, equal) for t in g):
                    items.append((list(g), g, [(serial, i) for i in range(len(g))]))
                continue
            for i, t in enumerate(g):
                if self.slots != "signal" and not is_positive(t):
                    continue
                if not self.skip_zero_advantage or has_signal(t, equal):
                    items.append(([t], g, [(serial, i)]))
        return items

    def num_candidates(self) -> int:
        return len(self._candidates())

    def sample(self, n: int) -> list[list[Trajectory]]:
        """``min(n, candidates)`` distinct items, drawn one by one with probability ∝ weight
        (``slots="positive_repeat"``: ``n`` items, in passes over the candidates, each pass
        without replacement, so a win is drawn again only once every candidate was).

        Returned as groups: a drawn group whole, or (``unit="trajectory"``) the drawn trajectories
        of each stored group together, in the order first drawn.
        """
        if n < 0:
            raise ValueError(f"cannot sample a negative number of items, got {n}")
        if n == 0 or not self.groups:
            return []
        found = self._candidates()
        if not found:
            return []
        items = [(trajs, group) for trajs, group, _ in found]
        weights = self._weights(items)
        chosen: list[int] = []
        while len(chosen) < n:  # one pass: weighted draws without replacement
            index = list(range(len(items)))
            for _ in range(min(n - len(chosen), len(index))):
                total = sum(weights[i] for i in index)
                x = self.rng.random() * total
                for pos, i in enumerate(index):
                    x -= weights[i]
                    if x <= 0 or pos == len(index) - 1:
                        chosen.append(index.pop(pos))
                        break
            if self.slots != "positive_repeat":  # only positive_repeat draws the items again
                break
        out: dict[int, list[Trajectory]] = {}
        emitted: set[int] = set()
        for i in chosen:
            trajs, group, keys = found[i]
            self.drawn.update(keys)
            out.setdefault(id(group), []).extend(copy.copy(t) if i in emitted else t for t in trajs)
            emitted.add(i)
        return list(out.values())

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {
            "capacity": self.capacity,
            "sampling": self.sampling,
            "unit": self.unit,
            "skip_zero_advantage": self.skip_zero_advantage,
            "slots": self.slots,
            "join_online": self.join_online,
            "groups": [[trajectory_to_dict(t) for t in g] for g in self.groups],
            "serials": list(self.serials),
            "next_serial": self.next_serial,
            "drawn": sorted([list(d) for d in self.drawn]),
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict) -> None:
        self.capacity = int(state["capacity"])
        self.sampling = state["sampling"]
        self.unit = state.get("unit", "group")
        self.skip_zero_advantage = bool(state.get("skip_zero_advantage", False))
        self.slots = state.get("slots", "signal")
        self.join_online = bool(state.get("join_online", self.join_online))
        self.groups = deque(([trajectory_from_dict(t) for t in g] for g in state["groups"]), maxlen=self.capacity)
        self.serials = deque(state.get("serials", range(len(self.groups))), maxlen=self.capacity)
        self.next_serial = int(state.get("next_serial", len(self.groups)))
        self.drawn = {tuple(d) for d in state.get("drawn", [])}
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def replay_groups_per_rank(total_groups: int, world_size: int, offline_ratio: float) -> list[int]:
    """Each rank's replay-group count: ``round_half_up(α · total_groups)`` over all ranks, split
    as evenly as possible, the first ranks taking one more (deterministic: every rank computes
    the same list). Never more on a rank than its own ``total_groups / world_size`` groups."""
    if total_groups < 0 or world_size < 1:
        raise ValueError(f"need total_groups >= 0 and world_size >= 1, got {total_groups}, {world_size}")
    if not 0 <= offline_ratio < 1:
        raise ValueError(f"offline_ratio must be in [0, 1), got {offline_ratio}")
    total = round_half_up(offline_ratio * total_groups)
    base, extra = divmod(total, world_size)
    return [base + (r < extra) for r in range(world_size)]


def replay_slots(
    share: float, total_groups: int, group_size: int, unit: str, rank: int = 0, world_size: int = 1
) -> int:
    """This rank's replay draws of an iteration: ``replay_groups_per_rank(total_groups, world_size,
    share)[rank]`` groups, or that many times ``group_size`` trajectories under ``unit="trajectory"``."""
    n = replay_groups_per_rank(total_groups, world_size, share)[rank]
    return n * group_size if unit == "trajectory" else n


def mix_replay(
    tasks: list[TaskSpec], replay: list[list[Trajectory]], group_size: int, join_online: bool = False
) -> tuple[list[TaskSpec], list[list[Trajectory]]]:
    """``(tasks, replay)`` with ``replay`` (groups of trajectories) in place of on-policy groups: as
    many of the last task groups are dropped as the replayed trajectories fill
    (``ceil(trajectories / group_size)``), so the iteration plays no more episodes than before.

    ``join_online`` (RSPO's ``replay_baseline="online"``): each replayed task is played by one of
    the remaining on-policy groups (that slot's task is re-pointed to it, keeping its group id) and
    the replayed trajectories join that group (``Trajectory.joins_online``), so their advantage is
    taken against A's own episodes of the same task when the iteration is trained. Copies are
    made; the buffer's trajectories are untouched. Replayed tasks beyond the number of on-policy
    slots keep their stored advantage.
    """
    n = sum(len(g) for g in replay)
    drop = min(len(tasks), -(-n // max(group_size, 1)))
    tasks = list(tasks[: len(tasks) - drop])
    if join_online:
        slots: dict[tuple, TaskSpec] = {}
        joined = []
        for group in replay:
            out = []
            for t in group:
                key = (t.task.env_id, t.task.split, t.task.task_id)
                if key not in slots and len(slots) < len(tasks):
                    i = len(slots)
                    tasks[i] = TaskSpec(t.task.env_id, t.task.split, t.task.task_id, tasks[i].group_id)
                    slots[key] = tasks[i]
                if key in slots:
                    t = dataclasses.replace(
                        t,
                        task=slots[key],
                        joins_online=True,
                        turns=[dataclasses.replace(turn, replay_advantage=None) for turn in t.turns],
                    )
                out.append(t)
            joined.append(out)
        replay = joined
    return tasks, replay
