"""EnvStepBudget: stop training after a fixed number of environment steps."""

from __future__ import annotations

import lightning.pytorch as pl


class EnvStepBudget(pl.Callback):
    """Stops ``fit`` once the module has taken ``max_env_steps`` training environment steps.

    Comparisons between estimators are fair at an equal number of environment interactions,
    not of iterations (successful episodes are shorter). The stop is requested through
    ``trainer.should_stop``, so Lightning runs one last validation before ending the fit.
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
            raise TypeError(f"EnvStepBudget needs a LightningModule with an integer `env_steps` counter; {type(pl_module).__name__} has none")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.env_steps >= self.max_env_steps:
            trainer.should_stop = True
