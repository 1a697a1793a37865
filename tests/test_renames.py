"""Renamed and split modules keep the old dotted paths working, and a checkpoint written before
the renames (by the code of commit e636b71, through the Python API, so its hyper-parameters are
the pickled config dataclasses, ``rspo_lightning.policy.TinyModelConfig`` among them) loads with
``weights_only=True`` and validates agent A."""

import os

import lightning.pytorch as pl
import torch

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "checkpoints", "before_issue24_rspo_a2tgpo.ckpt")


def test_the_alias_modules_are_gone_and_old_pickled_paths_still_load():
    """Issue 45 deleted models.py, policy.py, process.py and scoring.py: importing them fails, and
    the old pickled path of a config class stays allow-listed (``serialization.renamed``)."""
    import importlib

    import pytest

    for old in ("models", "policy", "process", "scoring"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"rspo_lightning.{old}")
    from rspo_lightning.language_model import TinyModelConfig

    assert (TinyModelConfig, "rspo_lightning.policy.TinyModelConfig") in torch.serialization.get_safe_globals()


def test_a_checkpoint_written_before_the_renames_loads_and_validates_agent_a(tmp_path):
    from rspo_lightning.config import EnvConfig
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    ckpt = torch.load(FIXTURE, weights_only=True)  # every global allow-listed under its old path
    hp = ckpt["hyper_parameters"]
    assert type(hp["policy"].tiny) is TinyModelConfig and hp["policy"].tiny.hidden_size == 16
    assert hp["algorithm"].estimator_kwargs == {"adaptive_clip": "signal"}  # A²TGPO's old key, renamed on load
    from rspo_lightning.rewards import EnvProgressReward

    module = AgentRLModule.load_from_checkpoint(
        FIXTURE, weights_only=True, dense_reward=EnvProgressReward()
    )  # not a hyper-parameter
    snapshot = next(s["snapshot"] for s in ckpt["callbacks"].values() if isinstance(s, dict) and "snapshot" in s)
    env = EnvConfig(kwargs={"task_types": ["pick_and_place"], "num_receptacles": 3, "max_steps": 3})
    dm = AgentDataModule(env=env, groups_per_iteration=2, group_size=2, val_splits=["valid_seen"], num_val_tasks=2)
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.validate(module, dm, ckpt_path=FIXTURE, weights_only=True)
    params = dict(module.named_parameters())
    assert all(torch.equal(params[k], v) for k, v in snapshot["params"].items())  # agent A, not the B it was saved with
    assert "val/success_rate" in trainer.callback_metrics


def test_an_rspo_checkpoint_written_before_d_moved_resumes_and_continues_exactly(tmp_path):
    """A checkpoint written mid-loop (D filled, A exploiting) by the code before issue 45, when D
    was RSPOLoop's state, resumes with today's code: D reaches the loop's buffer and the run
    continues to the parameters the old code reached without a break (the fixture's JSON)."""
    import importlib.util
    import json
    import shutil

    path = os.path.join(os.path.dirname(FIXTURE), "make_before_issue45.py")
    spec = importlib.util.spec_from_file_location("make_before_issue45", path)
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    with open(maker.NAME + ".json") as f:
        expected = json.load(f)
    ckpt = shutil.copy(maker.NAME + ".ckpt", tmp_path / "mid_loop.ckpt")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the fixture was written
    try:
        module, loop, _ = maker.fit(2, ckpt=str(ckpt))
    finally:
        torch.set_num_threads(threads)
    assert loop.counts == expected["counts"]
    assert torch.allclose(torch.tensor(maker.sums(module)), torch.tensor(expected["param_sums_after_8"]), atol=1e-6)
