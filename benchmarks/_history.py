"""RunHistory: a fit's per-iteration scalars and validation results, kept inside its checkpoints.

Added to a fit by ``benchmarks/rspo_study.py`` (``--trainer.callbacks+=`` with ``benchmarks/`` on
``PYTHONPATH``). Unlike TensorBoard event files (buffered for up to two minutes and lost with a
``kill -9``), the history is part of every ``last.ckpt``: a run resumed with ``--ckpt_path last``
continues exactly the history of the checkpoint it resumed from, and a killed and resumed run
ends with the same history as an uninterrupted one. When the fit ends it is written as JSON:

    {"train": {"<iteration>": {tag: value}}, "val": {"<iteration>": {tag: value}},
     "stop_requested_at": <iteration> | null, "extra_iterations": <int>, "finished": true}

``train[n]`` holds what the module and the callbacks before this one logged in RL iteration
``n`` (the values ``AgentRLModule`` writes to its loggers at step ``n``); ``val[n]`` the
validation after iteration ``n`` (``val[0]`` = the full sanity check before training).
"""

from __future__ import annotations

import json
import os

import lightning.pytorch as pl


def write_json_atomic(path: str, obj) -> None:
    """``obj`` as JSON at ``path``, through a temporary file renamed over it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunHistory(pl.Callback):
    """Records every RL iteration's logged scalars and every validation's results; the record
    travels in the checkpoints (``state_dict``) and is written to ``path`` at the end of ``fit``.

    Put it after the callbacks whose per-iteration metrics it should see (it reads what was
    logged so far in ``on_train_batch_end``, which Lightning calls for the callbacks in order and
    before the module's own hook, where the module writes the iteration to its loggers, and
    before the checkpoint callbacks, which Lightning moves last).

    Args:
        path: where the history JSON goes when the fit ends.
    """

    def __init__(self, path: str):
        self.path = path
        self.train: dict[int, dict[str, float]] = {}
        self.val: dict[int, dict[str, float]] = {}
        self.stop_requested_at: int | None = None  # the iteration after which the trainer was asked to stop
        self.extra_iterations = 0  # iterations trained after a restored stop request (see on_train_start)

    # -- training ----------------------------------------------------------------------------
    def _take(self, pl_module) -> None:
        pending = getattr(pl_module, "_iteration_metrics", None)
        if pending is None:
            raise TypeError(
                f"RunHistory needs a module that buffers each iteration's metrics in `_iteration_metrics` "
                f"(rspo_lightning.metrics.IterationLog); {type(pl_module).__name__} has none"
            )
        if pending:
            step = int(pl_module.iteration)
            self.train.setdefault(step, {}).update({k: float(v) for k, v in pending.items()})

    def on_train_start(self, trainer, pl_module) -> None:
        # Restored from a checkpoint written after the stop request but before the last
        # validation: EnvStepBudget runs that validation before this hook and ends the fit; a
        # stop requested by another callback is not kept by Lightning (`should_stop`), so the fit
        # goes on and one more iteration is trained: counted so that the record can say so.
        if self.stop_requested_at is not None and self.stop_requested_at not in self.val:
            self.extra_iterations += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._take(pl_module)
        if trainer.should_stop and self.stop_requested_at is None:
            self.stop_requested_at = int(pl_module.iteration)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._take(pl_module)  # what epoch-end callbacks logged before this one

    # -- validation --------------------------------------------------------------------------
    def on_validation_end(self, trainer, pl_module) -> None:
        step = int(pl_module.iteration)
        if trainer.sanity_checking:
            # AgentRLModule logs a full sanity check as step 0 and keeps it in `initial_val_metrics`
            values = getattr(pl_module, "initial_val_metrics", None)
            if step != 0 or trainer.num_sanity_val_steps != float("inf") or not values or 0 in self.val:
                return
        else:
            values = {k: v for k, v in trainer.callback_metrics.items() if k.split("/")[0].startswith("val")}
        self.val[step] = {k: float(v) for k, v in values.items()}

    # -- end of fit and checkpoints ----------------------------------------------------------
    def as_dict(self, finished: bool) -> dict:
        return {
            "train": {str(k): v for k, v in sorted(self.train.items())},
            "val": {str(k): v for k, v in sorted(self.val.items())},
            "stop_requested_at": self.stop_requested_at,
            "extra_iterations": self.extra_iterations,
            "finished": finished,
        }

    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            write_json_atomic(self.path, self.as_dict(finished=True))

    def state_dict(self) -> dict:
        return {
            "train": self.train,
            "val": self.val,
            "stop_requested_at": self.stop_requested_at,
            "extra_iterations": self.extra_iterations,
        }

    def load_state_dict(self, state: dict) -> None:
        self.train = {int(k): dict(v) for k, v in state.get("train", {}).items()}
        self.val = {int(k): dict(v) for k, v in state.get("val", {}).items()}
        self.stop_requested_at = state.get("stop_requested_at")
        self.extra_iterations = int(state.get("extra_iterations", 0))


def history_from_checkpoint(checkpoint: dict) -> dict | None:
    """The ``RunHistory`` state a Lightning checkpoint dict holds, in ``as_dict`` form
    (``finished`` = the stop was requested and its last validation ran), or None."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if str(key).split("{")[0] == "RunHistory" and isinstance(state, dict):
            h = RunHistory.__new__(RunHistory)
            h.load_state_dict(state)
            done = h.stop_requested_at is not None and h.stop_requested_at in h.val
            return h.as_dict(finished=done)
    return None
