"""Dense (process) reward sources (DESIGN §11).

A dense reward source is any object with ``turn_rewards(trajectory) -> list[float]`` (one value
per turn; the ``DenseReward`` Protocol). ``assign_dense_rewards`` writes them into
``Turn.dense_reward``. The module uses them in two places:

- ``reward_mode = "dense"`` (RSPO's explorer B): each turn's reward is outcome + dense;
- A²TGPO's per-turn signal g_t is the turn's dense reward.

Sources here: ``EnvProgressReward`` (progress deltas from the env's ``info["progress"]``) and
``NoisyReward`` (Gaussian noise on another source, for the robustness ablation). The learned
SPA-RL process reward model is ``rspo_lightning.prm.ProcessRewardModelReward``.
"""

from __future__ import annotations

import math
import random
from typing import Protocol, Sequence, runtime_checkable

from rspo_lightning.types import Trajectory


@runtime_checkable
class DenseReward(Protocol):
    """A per-turn dense reward source."""

    def turn_rewards(self, trajectory: Trajectory) -> list[float]:
        """One dense reward per turn of ``trajectory``, in turn order."""
        ...


def assign_dense_rewards(source: DenseReward, trajectories: Sequence[Trajectory]) -> None:
    """Write ``source``'s per-turn rewards into ``turn.dense_reward`` of every turn."""
    for traj in trajectories:
        values = source.turn_rewards(traj)
        if len(values) != len(traj.turns):
            raise ValueError(f"{type(source).__name__}.turn_rewards returned {len(values)} values for {len(traj.turns)} turns")
        for turn, value in zip(traj.turns, values):
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"{type(source).__name__} gave a non-finite dense reward {value!r}")
            turn.dense_reward = value


class EnvProgressReward:
    """r_t = scale * (progress_t - progress_{t-1}), progress_{-1} = the progress right after reset.

    ``progress`` is the env's subgoal completion in [0, 1] (``info["progress"]``), so the dense
    return of an episode telescopes to ``scale * (final progress - initial progress)``.

    Args:
        scale: multiplier of the progress delta.
    """

    def __init__(self, scale: float = 1.0):
        if not math.isfinite(scale):
            raise ValueError(f"EnvProgressReward scale must be finite, got {scale!r}")
        self.scale = scale

    def turn_rewards(self, trajectory: Trajectory) -> list[float]:
        out, previous = [], trajectory.initial_progress
        for turn in trajectory.turns:
            out.append(self.scale * (turn.progress - previous))
            previous = turn.progress
        return out


class NoisyReward:
    """Another dense source plus i.i.d. Gaussian noise N(0, sigma^2) per turn.

    Args:
        base: the dense source whose rewards are perturbed (default: ``EnvProgressReward()``).
        sigma: standard deviation of the noise; 0 returns ``base`` unchanged.
        seed: seed of the noise generator (the sequence of draws is reproducible).
    """

    def __init__(self, base: DenseReward | None = None, sigma: float = 0.1, seed: int = 0):
        if not (sigma >= 0 and math.isfinite(sigma)):
            raise ValueError(f"NoisyReward sigma must be a finite number >= 0, got {sigma!r}")
        self.base = base if base is not None else EnvProgressReward()
        self.sigma = sigma
        self.seed = seed
        self._rng = random.Random(seed)

    def turn_rewards(self, trajectory: Trajectory) -> list[float]:
        return [r + (self._rng.gauss(0.0, self.sigma) if self.sigma > 0 else 0.0) for r in self.base.turn_rewards(trajectory)]

    def state_dict(self) -> dict:
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self._rng.setstate(_as_tuple(state["rng"]))


def _as_tuple(value):
    """random.Random state survives a checkpoint round trip as lists; setstate needs tuples."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
