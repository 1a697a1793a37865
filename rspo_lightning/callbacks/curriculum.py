"""Curriculum: raise an environment's difficulty knob when the rolling success rate is high."""

from __future__ import annotations

from collections import deque
from typing import Any

import lightning.pytorch as pl
import torch


class Curriculum(pl.Callback):
    """Steps ``knob`` through ``levels`` as the agent gets good (reusable: any module that offers
    ``last_trajectories`` (objects with ``.success``) and ``set_env_kwargs(dict)``).

    Args:
        knob: the environment keyword argument to change, e.g. ``difficulty`` or ``max_steps``.
        levels: its values from easiest to hardest; the run starts at the first.
        threshold: rolling training success rate that moves to the next level.
        window: iterations in the rolling window (the window restarts at every level).

    Under multi-process training the success rate is over every rank's episodes (summed with
    the strategy's ``reduce``), so all ranks move to a level together.
    """

    def __init__(
        self, knob: str = "difficulty", levels: list[Any] = [0, 1, 2, 3], threshold: float = 0.7, window: int = 5
    ):
        if not levels:
            raise ValueError("curriculum.levels must list at least one value")
        if not 0 < threshold <= 1:
            raise ValueError(f"curriculum.threshold must be in (0, 1], got {threshold}")
        if window < 1:
            raise ValueError(f"curriculum.window must be >= 1, got {window}")
        self.knob, self.levels, self.threshold, self.window = knob, list(levels), threshold, window
        self.level = 0
        self._recent: deque[float] = deque(maxlen=window)

    def _apply(self, pl_module) -> None:
        if not hasattr(pl_module, "set_env_kwargs"):
            raise TypeError(
                f"Curriculum needs a LightningModule with set_env_kwargs(dict); {type(pl_module).__name__} has none"
            )
        pl_module.set_env_kwargs({self.knob: self.levels[self.level]})

    def on_fit_start(self, trainer, pl_module) -> None:
        self._apply(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        trajs = list(getattr(pl_module, "last_trajectories", []))
        successes, count = float(sum(t.success for t in trajs)), float(len(trajs))
        if trainer is not None and trainer.world_size > 1:  # every rank decides from all ranks' episodes
            pooled = trainer.strategy.reduce(torch.tensor([successes, count], device=pl_module.device), reduce_op="sum")
            successes, count = pooled.tolist()
        if count:
            self._recent.append(successes / count)
        if (
            len(self._recent) == self.window
            and sum(self._recent) / self.window >= self.threshold
            and self.level + 1 < len(self.levels)
        ):
            self.level += 1
            self._recent.clear()
            self._apply(pl_module)
        pl_module.log("curriculum/level", float(self.level), on_step=True)

    def state_dict(self) -> dict:
        return {"level": self.level, "recent": list(self._recent)}

    def load_state_dict(self, state: dict) -> None:
        self.level = int(state["level"])
        self._recent = deque(state.get("recent", []), maxlen=self.window)
