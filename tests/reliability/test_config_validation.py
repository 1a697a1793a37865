"""A bad config fails at startup with a message that names the field and the fix."""

from pathlib import Path

import pytest

from rspo_lightning.callbacks import RSPOLoop
from rspo_lightning.config import AlgorithmConfig, EnvConfig, PolicyConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.language_model import load_policy
from rspo_lightning.module import AgentRLModule

ROOT = Path(__file__).resolve().parents[2]
ENV = EnvConfig(kwargs={"task_types": ["pick_and_place"], "num_receptacles": 3, "max_steps": 3})


def test_each_bad_value_names_its_field_and_the_fix(tmp_path):
    cases = [
        (
            lambda: AlgorithmConfig(estimator="ppo"),
            r"algorithm.estimator must be one of \['grpo', 'rloo', 'gae', 'gigpo', 'proxmo', 'a2tgpo', 'turn_return'\], got 'ppo'",
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


QUICK = str(ROOT / "configs" / "quickstart.yaml")
SMOKE = str(ROOT / "configs" / "smoke.yaml")


def _cases(tmp_path):
    bad_yaml, a_list, text = tmp_path / "bad.yaml", tmp_path / "list.yaml", tmp_path / "model.txt"
    bad_yaml.write_text("trainer:\n  max_epochs: [1\n")
    a_list.write_text("- trainer\n- model\n")
    text.write_text("not a model\n")
    return {  # case: (arguments after `fit`, what the error line must say)
        "yaml_syntax": (["--config", str(bad_yaml)], "is not valid YAML"),
        "yaml_list": (["--config", str(a_list)], "must hold a mapping of sections"),
        "group_size_0": (["--data.group_size", "0"], "data.group_size must be >= 1, got 0"),
        "groups_minus_1": (["--data.groups_per_iteration", "-1"], "data.groups_per_iteration must be >= 1, got -1"),
        "max_new_tokens_0": (["--model.rollout.max_new_tokens", "0"], "rollout.max_new_tokens must be >= 1, got 0"),
        "lr_minus_1": (["--model.optim.lr", "-1"], "optim.lr must be > 0, got -1.0"),
        "iterations_0": (["--data.iterations_per_epoch", "0"], "data.iterations_per_epoch must be >= 1, got 0"),
        "env_id": (["--data.env.env_id", "rspo/Nope-v0"], "unknown env id 'rspo/Nope-v0'"),
        "env_kwarg": (["--data.env.kwargs", '{"bogus": 1}'], "unknown keyword argument 'bogus'"),
        "split": (["--data.val_splits", "[nope]"], "split 'nope' is not offered"),
        "missing_model": (["--model.policy.source", str(tmp_path / "nowhere")], "is not an existing directory"),
        "text_as_model": (["--model.policy.source", str(text)], "is a file, not a model"),
        "template": (["--model.rollout.template", "foo"], "rollout.template must be one of"),
        "max_steps": (["--trainer.max_steps", "5"], "counts optimizer steps, not RL iterations"),
        "decay_value": (["--model.optim.decay", "none"], 'key "model.optim.decay"'),
        "abbreviated": (["--trainer.max_epoch", "1"], "unrecognized arguments: --trainer.max_epoch"),
    }


@pytest.mark.parametrize("case", list(_cases(Path("/tmp")).keys()))
def test_every_config_error_is_one_error_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    from rspo_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RSPO_DEBUG", raising=False)
    args, says = _cases(tmp_path)[case]
    base = [] if case.startswith("yaml") else ["--config", QUICK, "--config", SMOKE]
    with pytest.raises(SystemExit) as info:
        main(["fit", *base, "--trainer.default_root_dir", str(tmp_path / "runs"), *args])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert info.value.code == 2 and "Traceback" not in err, err[-3000:]
    assert len(errors) == 1 and says.lower() in err.lower(), err[-3000:]  # jsonargparse < 4.5x: "Unrecognized"
    if case == "decay_value":  # the hint names the allowed values, never an option for a value
        assert "allowed: constant, linear, cosine" in err and "did you mean 'trainer'" not in err
    if case == "abbreviated":
        assert "did you mean 'trainer.max_epochs'" in err


def test_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    from rspo_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="data.group_size must be >= 1"):
        main(["fit", "--config", QUICK, "--config", SMOKE, "--data.group_size", "0", "--debug"])
