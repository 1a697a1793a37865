"""A run killed at any iteration (here mid-epoch and mid-B-phase, or mid-exploit with replay
rows in the batch, of RSPO) and resumed with ``ckpt_path`` (loaded with weights_only=True)
reproduces the uninterrupted run exactly."""

import lightning.pytorch as pl
import pytest
import torch

from rspo_lightning.callbacks import IterationCheckpoint, RSPOLoop
from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rewards import EnvProgressReward
from rspo_lightning.rollout import RolloutConfig

ENV = EnvConfig(
    kwargs={
        "task_types": ["pick_and_place"],
        "num_receptacles": 3,
        "num_distractors": 0,
        "num_object_types": 4,
        "max_steps": 4,
        "info_actions": False,
    }
)


class Crash(pl.Callback):
    def __init__(self, at):
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if pl_module.iteration == self.at:
            raise RuntimeError("simulated crash")


class Record(pl.Callback):
    def __init__(self):
        self.rows = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows[pl_module.iteration] = {
            "actions": [t.action for tr in pl_module.last_trajectories for t in tr.turns],
            "metrics": {
                k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("train/", "rollout", "rspo/"))
            },
            "params": [p.detach().clone() for p in pl_module.parameters()],
        }


def _run(tmp_path, crash_at=None, resume=False):
    torch.manual_seed(7)
    module = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)),
        env=ENV,
        algorithm=AlgorithmConfig(ppo_epochs=1),
        optim=OptimConfig(lr=5e-3),
        rollout=RolloutConfig(constrained_decoding=True, max_new_tokens=8, template="compact", system_prompt=""),
        dense_reward=EnvProgressReward(),
    )
    record = Record()
    loop = RSPOLoop(k=2, offline_ratio=0.25)  # the default: single trajectories with their collection-time advantage
    loop.buffer.skip_zero_advantage = (
        False  # the untrained tiny model wins nothing here: replay every stored trajectory
    )
    callbacks = [loop, record, IterationCheckpoint(dirpath=str(tmp_path), every_n_iterations=1, save_top_k=0)]
    if crash_at is not None:
        callbacks.append(Crash(crash_at))
    trainer = pl.Trainer(
        max_epochs=2,
        logger=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    dm = AgentDataModule(env=ENV, groups_per_iteration=4, group_size=2, iterations_per_epoch=4, val_splits=[])
    trainer.fit(
        module, dm, ckpt_path=str(tmp_path / "last.ckpt") if resume else None, weights_only=True if resume else None
    )
    return record.rows


@pytest.mark.parametrize("crash_at, phase", [(6, "explore"), (4, "exploit")])
def test_crash_mid_b_phase_or_mid_exploit_resumes_to_the_same_run(tmp_path, crash_at, phase):
    full = _run(tmp_path / "full")
    # 6: the 2nd of the 2nd loop's explore iterations (B active), mid-epoch 2;
    # 4: A's 2nd exploit iteration of the first loop, with replay in its batch, end of epoch 1
    assert RSPOLoop(k=2).phase_of(crash_at) == phase
    assert full[4]["metrics"]["rspo/replay_frac"] > 0 and "rspo/replay_adv_abs" in full[4]["metrics"]
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_path / "crash", crash_at=crash_at)
    resumed = _run(tmp_path / "crash", resume=True)
    # rows are keyed by iterations done: the last checkpoint holds crash_at done, the crash hit the next
    assert sorted(resumed) == list(range(crash_at + 1, 9))
    for it in resumed:
        assert resumed[it]["actions"] == full[it]["actions"]
        assert resumed[it]["metrics"] == {k: full[it]["metrics"].get(k) for k in resumed[it]["metrics"]}
        assert all(torch.equal(a, b) for a, b in zip(resumed[it]["params"], full[it]["params"]))
