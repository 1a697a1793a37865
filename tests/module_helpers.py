"""Builders shared by the tests of the module and of the update stage: a tiny AgentRLModule on a
small Household, a scored batch of its episodes, weight snapshots, and a budgeted fit that can
be killed in its validation."""

import lightning.pytorch as pl
import torch

from rspo_lightning.batching import flatten, make_train_batch
from rspo_lightning.config import EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.types import TaskSpec

ENV = EnvConfig(
    kwargs={
        "task_types": ["pick_and_place"],
        "num_receptacles": 4,
        "num_distractors": 1,
        "num_object_types": 8,
        "max_steps": 4,
        "info_actions": False,
    }
)
TINY = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


def _module(**kw):
    kw.setdefault(
        "rollout", RolloutConfig(constrained_decoding=False, max_new_tokens=6, template="compact", system_prompt="")
    )
    kw.setdefault("optim", OptimConfig(lr=1e-2))
    m = AgentRLModule(policy=PolicyConfig(tiny=TINY), env=ENV, **kw)
    m.configure_model()
    return m


class _Weights:
    """A state-dict snapshot in the shape ``_changed`` reads."""

    def __init__(self, state):
        self._state = state

    def state_dict(self):
        return self._state


def _snapshot(mod):
    return {k: v.detach().clone() for k, v in mod.state_dict().items()}


def _changed(before, mod):
    return [k for k, v in mod.state_dict().items() if not torch.equal(before[k], v)]


def _scored_batch(m, tasks=3, advantages=None):
    trajs = m.engine.collect([TaskSpec("rspo/Household-v0", "train", i, i) for i in range(tasks)], 2)
    flat = flatten(trajs)
    batch = make_train_batch(
        flat, m.engine.pad_id, advantages if advantages is not None else torch.linspace(-1, 1, len(flat.turns))
    )
    return m.score(batch)[0]


class KilledInValidation(Exception):
    """What ``ValidationProbe(crash=True)`` raises: a run killed during its validation."""


class ValidationProbe(pl.Callback):
    """Appends (iteration, env_steps, weights) to ``seen`` at each validation's start (after
    RSPOLoop's hook: agent A's weights); with ``crash`` it then raises ``KilledInValidation``."""

    def __init__(self, seen: list, crash: bool = False):
        self.seen, self.crash = seen, crash

    def on_validation_start(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        weights = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self.seen.append((pl_module.iteration, pl_module.env_steps, weights))
        if self.crash:
            raise KilledInValidation


def fit_checkpointed(module, env, callbacks, ckpt_dir, probe, groups, max_epochs, ckpt_path=None):
    """Fit ``module`` (50 iterations an epoch, so each ``last.ckpt`` is a mid-epoch one, 2
    validation tasks) with ``callbacks``, an ``IterationCheckpoint`` into ``ckpt_dir`` and
    ``probe`` last; resumed from ``ckpt_path`` when given."""
    from rspo_lightning.callbacks import IterationCheckpoint

    dm = AgentDataModule(
        env=env,
        groups_per_iteration=groups,
        group_size=2,
        iterations_per_epoch=50,
        val_splits=["valid_seen"],
        num_val_tasks=2,
    )
    pl.Trainer(
        max_epochs=max_epochs,
        logger=False,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, IterationCheckpoint(dirpath=str(ckpt_dir)), probe],
    ).fit(module, dm, ckpt_path=ckpt_path, weights_only=True)
    return module
