"""A bad config fails at startup with a message that names the field and the fix."""

import pytest

from rspo_lightning.callbacks import RSPOLoop
from rspo_lightning.config import AlgorithmConfig, EnvConfig, PolicyConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.language_model import load_policy
from rspo_lightning.module import AgentRLModule

ENV = EnvConfig(kwargs={"task_types": ["pick_and_place"], "num_receptacles": 3, "max_steps": 3})


def test_each_bad_value_names_its_field_and_the_fix(tmp_path):
    cases = [
        (
            lambda: AlgorithmConfig(estimator="ppo"),
            r"algorithm.estimator must be one of \['grpo', 'rloo', 'gae', 'gigpo', 'proxmo', 'a2tgpo'\], got 'ppo'",
        ),
        (lambda: AlgorithmConfig(kl_coef=-0.1), "algorithm.kl_coef must be >= 0.*use 0 to disable"),
        (
            lambda: AlgorithmConfig(minibatch_size=64, micro_batch_size=24),
            r"minibatch_size \(64\) must be a multiple of .*micro_batch_size \(24\).*micro_batch_size: 16",
        ),
        (lambda: RSPOLoop(k=0), "RSPOLoop k must be >= 1"),
        (lambda: RSPOLoop(offline_ratio=1.0), r"offline_ratio must be in \[0, 1\), got 1.0; the paper uses 0.125"),
        (lambda: RSPOLoop(offline_ratio=-0.1), r"offline_ratio must be in \[0, 1\)"),
        (
            lambda: AgentDataModule(env=EnvConfig(env_id="rspo/Nope-v0")),
            r"unknown env id 'rspo/Nope-v0'; registered rspo envs: \[.*'rspo/Household-v0'",
        ),
        (
            lambda: AgentRLModule(env=ENV, algorithm=AlgorithmConfig(estimator="a2tgpo")),
            "model.dense_reward.*EnvProgressReward",
        ),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match):
            make()
    with pytest.raises(
        FileNotFoundError, match="GGUF file .*missing.gguf.* does not exist. Pass source=<dir> with gguf_file"
    ):
        load_policy(str(tmp_path), gguf_file="missing.gguf")


def test_group_size_one_and_missing_dense_source_fail_at_setup():
    import lightning.pytorch as pl

    def fit(module, dm, callbacks=()):
        pl.Trainer(
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=list(callbacks),
        ).fit(module, dm)

    with pytest.raises(ValueError, match="data.group_size must be >= 2 for the group-relative estimator 'grpo', got 1"):
        fit(AgentRLModule(env=ENV, policy=PolicyConfig()), AgentDataModule(env=ENV, group_size=1, val_splits=[]))
    with pytest.raises(ValueError, match="RSPOLoop explorer_reward='dense' needs a dense reward source"):
        fit(AgentRLModule(env=ENV), AgentDataModule(env=ENV, val_splits=[]), [RSPOLoop()])
    with pytest.raises(ValueError, match="data.reward_mode: dense needs a dense reward source"):
        fit(AgentRLModule(env=ENV), AgentDataModule(env=ENV, val_splits=[], reward_mode="dense"))
