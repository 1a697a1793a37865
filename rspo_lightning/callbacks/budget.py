"""EnvStepBudget: stop training after a fixed number of environment steps."""

from __future__ import annotations

import lightning.pytorch as pl


class EnvStepBudget(pl.Callback):
    """Stops ``fit`` once the module has taken ``max_env_steps`` training environment steps.

    Comparisons between estimators are fair at an equal number of environment interactions,
    not of iterations (successful episodes are shorter). The stop is requested through
    ``trainer.should_stop``, so Lightning runs one last validation before ending the fit.
    A callback with an ``at_loop_end(iterations_done)`` method (``RSPOLoop``) delays the stop
    to the end of its loop: an RSPO run ends after a completed exploit phase, with agent A's
    weights, never with a B whose data was not used. A run resumed with its budget already
    spent at a loop end (killed during its last validation, or resumed under a smaller budget)
    runs that validation at once and ends, without another iteration.
    Reusable with any LightningModule that counts its steps in an integer ``env_steps``
    attribute (summed over ranks).

    Args:
        max_env_steps: the budget; the iteration that crosses it is the last one.
    """

    def __init__(self, max_env_steps: int):
        if max_env_steps < 1:
            raise ValueError(f"EnvStepBudget.max_env_steps must be >= 1, got {max_env_steps}")
        self.max_env_steps = max_env_steps

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not isinstance(getattr(pl_module, "env_steps", None), int):
            raise TypeError(
                f"EnvStepBudget needs a LightningModule with an integer `env_steps` counter; {type(pl_module).__name__} has none"
            )

    def _spent(self, trainer, pl_module) -> bool:
        return pl_module.env_steps >= self.max_env_steps and all(
            cb.at_loop_end(pl_module.iteration) for cb in trainer.callbacks if hasattr(cb, "at_loop_end")
        )

    def on_train_start(self, trainer, pl_module) -> None:
        # A run resumed after the iteration that spent its budget (killed during its last
        # validation): that validation now, then the end, and no further iteration. Lightning
        # would otherwise train on (``should_stop`` is not checkpointed), and an RSPO run would
        # start another loop.
        if pl_module.iteration == 0 or not self._spent(trainer, pl_module):
            return
        if trainer.enable_validation:  # as Lightning's epoch loop runs it (lightning 2.6's loop API)
            trainer.validating = True
            trainer.fit_loop.epoch_loop.val_loop.run()
            trainer.training = True
        trainer.should_stop = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._spent(trainer, pl_module):
            trainer.should_stop = True
