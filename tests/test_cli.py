"""Integration: ``rspo-lightning fit`` on a tiny config in a subprocess."""

import glob
import json
import os
import shutil
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ARGS = [
    "fit",
    "--config",
    os.path.join(ROOT, "configs", "quickstart.yaml"),
    "--trainer.max_epochs",
    "1",
    "--data.iterations_per_epoch",
    "2",
    "--data.groups_per_iteration",
    "4",
    "--data.group_size",
    "2",
    "--data.num_val_tasks",
    "4",
    "--data.env.kwargs",
    '{"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 4}',
    "--model.policy.tiny.hidden_size",
    "32",
    "--model.policy.tiny.intermediate_size",
    "64",
    # free generation: a random tiny model emits invalid actions, whose penalty guarantees a
    # non-zero advantage (with constrained decoding and no success every advantage could be 0)
    "--model.rollout.constrained_decoding",
    "false",
    "--model.rollout.max_new_tokens",
    "6",
]


def _run(args, cwd):
    # the installed console script, as a user runs it (python -m as a fallback in odd installs)
    exe = shutil.which("rspo-lightning")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "rspo_lightning.cli", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def _scalars(event_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(event_dir, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_fit_writes_metrics_and_changes_weights(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    proc = _run(
        [
            *TINY_ARGS,
            "--trainer.logger.init_args.save_dir",
            str(tmp_path / "runs"),
            "--trainer.callbacks+=ModelCheckpoint",
            f"--trainer.callbacks.dirpath={ckpt_dir}",
            "--trainer.callbacks.save_last=true",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    event_dirs = {
        os.path.dirname(p) for p in glob.glob(str(tmp_path / "runs" / "**" / "events.out.tfevents*"), recursive=True)
    }
    assert len(event_dirs) == 1
    acc = _scalars(event_dirs.pop())
    tags = set(acc.Tags()["scalars"])
    for tag in [
        "rollout/success_rate",
        "train/policy_loss",
        "train/entropy",
        "perf/rollout_tokens_per_s",
        "perf/update_tokens_per_s",
        "rollout/invalid_rate",
        "val/success_rate",
        "val_unseen/success_rate",
    ]:
        assert tag in tags, (tag, sorted(tags))
    # two iterations logged, at steps 1 and 2 (the x-axis is the RL iteration)
    assert [e.step for e in acc.Scalars("rollout/success_rate")] == [1, 2]
    assert [e.step for e in acc.Scalars("train/policy_loss")] == [1, 2]
    # validation before training is recorded at step 0, the epoch-end one at iteration 2
    assert [e.step for e in acc.Scalars("val/success_rate")] == [0, 2]
    assert "transcripts/episode_0/text_summary" in acc.Tags()["tensors"]

    # the policy moved: compare the checkpoint to a freshly built (identically seeded) policy
    ckpt = torch.load(ckpt_dir / "last.ckpt", weights_only=True, map_location="cpu")
    trained = ckpt["state_dict"]
    from rspo_lightning.config import EnvConfig, PolicyConfig
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    fresh = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, intermediate_size=64)),
        env=EnvConfig(kwargs={"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 4}),
    )
    fresh.configure_model()
    initial = fresh.state_dict()
    assert set(initial) == set(k for k in trained if k in initial)
    changed = [k for k in initial if not torch.equal(initial[k], trained[k])]
    assert changed, "no parameter changed during fit"
    assert ckpt["rspo_iteration"] == 2

    # `predict` plays the held-out tasks of data.val_splits with the checkpoint and writes them as
    # trajectory JSONL, each turn with its prompt and response text
    from rspo_lightning.trajectory_io import load_trajectories

    out = tmp_path / "episodes.jsonl"
    proc = _run(
        [
            "predict",
            *TINY_ARGS[1:],
            "--ckpt_path",
            str(ckpt_dir / "last.ckpt"),
            "--data.val_splits",
            "[valid_unseen]",
            "--model.predict_path",
            str(out),
            "--trainer.logger",
            "false",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (
        "predict valid_unseen: 4 episodes, success rate" in proc.stdout
        and ", score " in proc.stdout
        and str(out) in proc.stdout
    )
    episodes = load_trajectories(str(out))
    assert sorted(t.task.task_id for t in episodes) == [0, 1, 2, 3] and {t.task.split for t in episodes} == {
        "valid_unseen"
    }
    first = json.loads(out.read_text().splitlines()[0])
    assert first["turns"] and all(turn["response_text"] and turn["prompt_text"] for turn in first["turns"])


def test_help_documents_every_argument():
    proc = _run(["fit", "--help"], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for arg in [
        "--model.algorithm.estimator",
        "--model.algorithm.ppo_epochs",
        "--model.rollout.constrained_decoding",
        "--model.policy.source",
        "--model.optim.lr",
        "--model.val_temperature",
        "--data.groups_per_iteration",
        "--data.group_size",
        "--data.env.env_id",
        "--transcripts.every_n_iterations",
    ]:
        assert arg in out, arg
    # docstrings reach the help text
    assert "advantage estimator" in out
    assert "episodes per task group" in out


def test_bad_config_fails_at_startup(tmp_path):
    proc = _run([*TINY_ARGS, "--model.algorithm.estimator", "nope"], cwd=tmp_path)
    assert proc.returncode != 0
    assert "nope" in proc.stderr and "grpo" in proc.stderr


def test_naming_another_class_switches_to_subclass_mode(tmp_path):
    from rspo_lightning.cli import _names_a_class

    assert not _names_a_class(["fit", "--config", os.path.join(ROOT, "configs", "quickstart.yaml")])
    assert _names_a_class(["fit", "--config", os.path.join(ROOT, "configs", "household", "sft.yaml")])
    assert _names_a_class(["fit", "--model", "rspo_lightning.sft.SFTModule"])
    assert _names_a_class(["fit", "--data=rspo_lightning.datamodules.TrajectoryDataModule"])
    assert not _names_a_class(["fit", "--config", str(tmp_path / "missing.yaml")])
    import rspo_lightning
    from rspo_lightning.sft import SFTModule

    assert rspo_lightning.SFTModule is SFTModule  # `--model rspo_lightning.SFTModule` resolves


def test_a_mistyped_key_suggests_the_nearest_one_in_a_few_lines(tmp_path):
    out = _run(
        ["fit", "--config", os.path.join(ROOT, "configs", "quickstart.yaml"), "--model.algoritm.estimator", "grpo"],
        tmp_path,
    )
    assert out.returncode == 2
    assert "did you mean 'model.algorithm.estimator'" in out.stderr and "rspo-lightning fit --help" in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 5  # not the full usage
    typo = tmp_path / "typo.yaml"
    typo.write_text("trainer:\n  max_epoch: 3\n")
    out = _run(["fit", "--config", os.path.join(ROOT, "configs", "quickstart.yaml"), "--config", str(typo)], tmp_path)
    assert out.returncode == 2 and "did you mean 'trainer.max_epochs'" in out.stderr


def test_help_prints_no_lightning_args_warning(tmp_path):
    out = _run(["fit", "--help"], tmp_path)
    assert out.returncode == 0 and "--checkpoint.every_n_iterations" in out.stdout
    assert "args parameter is intended" not in out.stderr


def test_test_plays_the_test_split_where_the_env_has_one():
    from rspo_lightning.config import EnvConfig
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    shop = AgentDataModule(env=EnvConfig(env_id="rspo/Shop-v0"), val_splits=["valid"])
    household = AgentDataModule(env=EnvConfig(), val_splits=["valid_seen", "valid_unseen"])
    assert shop.test_splits() == ["test"] and household.test_splits() == ["valid_seen", "valid_unseen"]
    assert [AgentRLModule.metric_prefix(s, "test") for s in ("test", "valid_seen", "valid_unseen")] == [
        "test",
        "test",
        "test_unseen",
    ]
    assert [AgentRLModule.metric_prefix(s, "val") for s in ("valid", "valid_seen", "valid_unseen")] == [
        "val",
        "val",
        "val_unseen",
    ]


def test_the_env_is_set_once_in_data_env_and_reaches_the_module(tmp_path):
    """``data.env`` is linked to ``model.env`` (LightningCLI link_arguments): the module plays
    the env the datamodule draws tasks from, set in one place; ``model.env`` is not an option."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    args = [
        "--config",
        os.path.join(ROOT, "configs", "quickstart.yaml"),
        "--data.env.kwargs.max_steps",
        "3",
        "--trainer.logger",
        "false",
    ]
    cli = AgentCLI(AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False)
    assert cli.model.env_cfg == cli.datamodule.env
    assert cli.model.env_cfg.env_id == "rspo/Household-v0" and cli.model.env_cfg.kwargs["max_steps"] == 3
    out = _run(
        [
            "fit",
            "--config",
            os.path.join(ROOT, "configs", "quickstart.yaml"),
            "--model.env.env_id",
            "x",
            "--print_config",
        ],
        tmp_path,
    )
    assert out.returncode != 0 and "data.env.env_id" in out.stderr  # the error points at the one place to set it
    # naming the classes (subclass mode, no parser link): an unset model.env still gets the datamodule's
    cli = AgentCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        auto_configure_optimizers=False,
        args=[
            "--model",
            "rspo_lightning.module.AgentRLModule",
            "--data",
            "rspo_lightning.datamodules.AgentDataModule",
            "--data.env.kwargs",
            '{"max_steps": 2}',
            "--trainer.logger",
            "false",
        ],
    )
    assert cli.model.env_cfg == cli.datamodule.env and cli.model.env_cfg.kwargs == {"max_steps": 2}


def test_seed_everything_seeds_the_rollouts_and_the_task_draws_unless_they_are_set():
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    def seeds(*extra):
        args = ["--config", os.path.join(ROOT, "configs", "quickstart.yaml"), "--trainer.logger", "false", *extra]
        cli = AgentCLI(AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False)
        return cli.model.seed, cli.datamodule.seed, cli.model.hparams["seed"]

    assert seeds() == (0, 0, 0)  # the config's seed_everything: 0
    assert seeds("--seed_everything", "3") == (3, 3, 3)
    assert seeds("--seed_everything", "3", "--model.seed", "5") == (5, 3, 5)  # a seed set wins
    assert seeds("--seed_everything", "false") == (0, 0, None)  # no run seed: the classes' 0
    # outside the CLI, an unset seed is 0, as before
    assert AgentDataModule().seed == 0 and AgentRLModule().seed == 0


def test_help_lists_export_beside_the_trainer_subcommands_and_export_help_documents_every_flag(capsys):
    """Issue 46: ``rspo-lightning --help`` lists ``export`` with one line; ``rspo-lightning export
    --help`` documents every flag of its parser."""
    import pytest

    from rspo_lightning import export
    from rspo_lightning.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "{fit,validate,test,predict,export}" in out
    assert "export" in out.split("Available subcommands:")[1] and "Hugging Face directory" in out
    with pytest.raises(SystemExit) as info:
        main(["export", "--help"])
    out = capsys.readouterr().out
    flags = [a.option_strings[0] for a in export.parser()._actions if a.option_strings and a.dest != "help"]
    assert info.value.code == 0 and len(flags) == 6
    assert all(flag in out for flag in flags) and all(a.help for a in export.parser()._actions)
