"""Builders shared by the tests of the module and of the update stage: a tiny AgentRLModule on a
small Household, a scored batch of its episodes, and weight snapshots."""

import torch

from rspo_lightning.batching import flatten, make_train_batch
from rspo_lightning.config import EnvConfig, OptimConfig, PolicyConfig
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
