"""FaultyEnv: a fault-injecting wrapper for reliability tests and the soak benchmark.

``make_env("rspo/Faulty-v0", inner_id="rspo/Household-v0", inner_kwargs={...}, fault_rate=0.05)``
wraps the inner env; every ``step`` (and ``reset`` when ``on_reset``) faults with probability
``fault_rate`` (or exactly at step ``fault_at_step`` of every episode), in one of ``modes``:

- ``raise``: raises RuntimeError;
- ``hang``: sleeps ``hang_s`` seconds, then answers normally (a rollout timeout must cut it);
- ``garbage``: returns values of the wrong types (``(None, "x", 3, [], 7)``);
- ``die``: ends the whole process at once (``os._exit``), as a segfaulting env would; only
  inside an EnvPool worker process (``rollout.env_workers > 0``): in the trainer it raises instead.

Faults draw from their own seeded RNG, so a run's fault pattern is reproducible. ``faults``
counts what was injected, by mode.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from typing import Any

import gymnasium

from rspo_lightning.envs.base import TextEnv, make_env
from rspo_lightning.envs.pool import WORKER_ENV_VAR

MODES = ("raise", "hang", "garbage", "die")


class FaultyEnv(gymnasium.Wrapper):
    """Wraps ``inner_id`` and injects faults (see the module docstring).

    Args:
        inner_id: the inner environment id.
        inner_kwargs: its ``gymnasium.make`` keyword arguments.
        fault_rate: probability that a call faults.
        modes: fault kinds drawn uniformly: raise, hang, garbage (default), die (worker processes only).
        fault_at_step: fault deterministically at this step of every episode (0-based), in addition.
        hang_s: how long a hang lasts.
        on_reset: also fault in ``reset``.
        seed: seed of the fault RNGs (the n-th instance created draws from stream (seed, n)).
    """

    _instances = itertools.count()
    injected_total = {m: 0 for m in MODES}  # over every instance of the process (soak reports)

    # a dict on the class, as on every TextEnv: gymnasium < 1.4's make() checks the entry point's class
    # metadata, and Wrapper's is a property there (InvalidMetadata; found by nox -s lowest)
    metadata = TextEnv.metadata

    def __init__(
        self,
        inner_id: str = "rspo/Household-v0",
        inner_kwargs: dict | None = None,
        fault_rate: float = 0.05,
        modes: list[str] = ["raise", "hang", "garbage"],
        fault_at_step: int | None = None,
        hang_s: float = 2.0,
        on_reset: bool = False,
        seed: int = 0,
    ):
        bad = [m for m in modes if m not in MODES]
        if bad or not modes:
            raise ValueError(f"FaultyEnv modes must be a non-empty subset of {MODES}, got {modes}")
        if not 0 <= fault_rate <= 1:
            raise ValueError(f"FaultyEnv fault_rate must be in [0, 1], got {fault_rate}")
        super().__init__(make_env(inner_id, **(inner_kwargs or {})))
        self.fault_rate, self.modes, self.fault_at_step = fault_rate, list(modes), fault_at_step
        self.hang_s, self.on_reset = hang_s, on_reset
        # each instance of a pool draws its own stream (same seed, same order of creation = same faults)
        # (in a pool's worker processes the worker's name keeps the streams of different workers apart)
        self.rng = random.Random(f"{seed}/{os.environ.get(WORKER_ENV_VAR, '')}/{next(FaultyEnv._instances)}")
        self.faults = {m: 0 for m in MODES}
        self._step = 0

    def _draw(self, forced: bool) -> str | None:
        if forced or (self.fault_rate > 0 and self.rng.random() < self.fault_rate):
            mode = self.rng.choice(self.modes)
            self.faults[mode] += 1
            FaultyEnv.injected_total[mode] += 1
            return mode
        return None

    def _inject(self, mode: str | None, call, *args, **kwargs) -> Any:
        if mode == "raise":
            raise RuntimeError("injected environment fault")
        if mode == "hang":
            time.sleep(self.hang_s)
        if mode == "garbage":
            return (None, "x", 3, [], 7)
        if mode == "die":
            if not os.environ.get(WORKER_ENV_VAR):  # never end the trainer's own process
                raise RuntimeError(
                    "injected 'die' fault outside a worker process (rollout.env_workers: 0): raised instead"
                )
            os._exit(17)
        return call(*args, **kwargs)

    def reset(self, **kwargs):
        self._step = 0
        mode = self._draw(False) if self.on_reset else None
        return self._inject(mode, self.env.reset, **kwargs)

    def step(self, action):
        mode = self._draw(self.fault_at_step is not None and self._step == self.fault_at_step)
        self._step += 1
        return self._inject(mode, self.env.step, action)
