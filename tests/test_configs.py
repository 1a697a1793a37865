"""Every shipped RL config parses and instantiates its module, data module and trainer."""

import glob
import importlib.util
import json
import os
import types

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(
    [os.path.join(ROOT, "configs", "quickstart.yaml")]
    + glob.glob(os.path.join(ROOT, "configs", "compare", "*.yaml"))
    + [  # SmolLM2's; tiny stands in under the smoke overlay (the SFT warm start: tests/test_sft.py)
        p for p in glob.glob(os.path.join(ROOT, "configs", "llm", "*.yaml")) if not p.endswith("sft.yaml")
    ]
    + [
        p
        for p in glob.glob(os.path.join(ROOT, "configs", "household", "*.yaml"))
        if not p.endswith(("sft.yaml", "prm.yaml", "_from_sft.yaml"))
    ]
    + [
        p
        for env in ("shop", "textworld", "alfworld", "webshop")
        for p in glob.glob(os.path.join(ROOT, "configs", env, "*.yaml"))
        if not p.endswith("prm.yaml")
    ]
)
#: The env each per-env config folder must play.
ENV_OF_FOLDER = {
    "shop": "rspo/Shop-v0",
    "textworld": "rspo/TextWorld-v0",
    "alfworld": "rspo/ALFWorld-v0",
    "webshop": "rspo/WebShop-v0",
}


def _stub_env_data(folder: str, path: str, tmp_path, monkeypatch) -> None:
    """Stand-ins for the data the real-env adapters check when built (the data module builds the env
    once to count tasks); the games themselves are never played here."""
    if folder == "textworld":
        # the config's own relative game paths, as empty files + the .json tw-make writes beside them
        games = yaml.safe_load(open(path))["data"]["env"]["kwargs"]["games"]
        monkeypatch.chdir(tmp_path)
        for paths in games.values():
            for game in paths:
                os.makedirs(os.path.dirname(game), exist_ok=True)
                for name in (game, game[: -len(".z8")] + ".json"):
                    open(name, "w").close()
    elif folder == "alfworld":
        if importlib.util.find_spec("alfworld") is None:
            pytest.skip("the ALFWorld configs need the alfworld package: pip install 'rspo_lightning[alfworld]'")
        for split in ("train", "valid_seen", "valid_unseen"):  # one stub game per split, found by ALFWorld's rules
            trial = tmp_path / "json_2.1.1" / split / "pick_and_place_simple-Pen-None-Desk-1" / "trial_1"
            trial.mkdir(parents=True)
            (trial / "traj_data.json").write_text(json.dumps({"task_type": "pick_and_place_simple"}))
            (trial / "game.tw-pddl").write_text(json.dumps({"solvable": True}))
        monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))  # the configs leave data_dir to ALFWORLD_DATA
    elif folder == "webshop":  # WebShop is not pip-installable: a text env with 12,087 goals (its human instructions)
        from rspo_lightning.envs import webshop_env

        stub = types.SimpleNamespace(
            server=types.SimpleNamespace(goals=[{}] * 12087, user_sessions={}), close=lambda: None
        )
        monkeypatch.setattr(webshop_env, "make_text_env", lambda *args, **kwargs: stub)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_config_instantiates(path, tmp_path, monkeypatch):
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    folder = os.path.basename(os.path.dirname(path))
    _stub_env_data(folder, path, tmp_path, monkeypatch)

    args = [
        "--config",
        path,
        "--trainer.accelerator",
        "cpu",
        "--trainer.precision",
        "32-true",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
    ]
    dense = (yaml.safe_load(open(path)).get("model") or {}).get("dense_reward") or {}
    if dense.get("class_path", "").endswith("ProcessRewardModelReward"):
        # the learned process reward's path is the value the user sets: unset, startup names the key and the fix
        assert dense["init_args"]["model"].startswith("/path/to/")
        with pytest.raises(
            (FileNotFoundError, ValueError), match=r"--model.dense_reward.init_args.model.*configs/<env>/prm.yaml"
        ):
            AgentCLI(AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False)
        args += ["--model.dense_reward=rspo_lightning.rewards.EnvProgressReward"]
    cli = AgentCLI(AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False)
    name = os.path.basename(path)[: -len(".yaml")].removesuffix(
        "_paper"
    )  # grpo_rspo_paper: RSPO with the paper's settings
    if name.endswith("_rspo"):
        from rspo_lightning.callbacks import RSPOLoop

        name = name[: -len("_rspo")]
        loops = [c for c in cli.trainer.callbacks if isinstance(c, RSPOLoop)]
        assert len(loops) == 1 and loops[0].k == 3 and loops[0].offline_ratio == 0.125
        assert cli.model.dense_reward is not None
    if folder == "llm":  # configs/llm/smollm2_<run>.yaml: every run of the LLM study is GRPO-based
        name = "grpo"
    expected = {"ppo": "gae", "asym_ppo": "gae", "quickstart": "grpo"}.get(name, name)
    assert cli.model.algo.estimator == expected
    if name == "asym_ppo":
        assert cli.model.critic_cfg.kind == "separate" and cli.model.critic_cfg.privileged
    assert cli.datamodule.group_size >= 2
    if folder in ENV_OF_FOLDER:
        assert cli.datamodule.env.env_id == ENV_OF_FOLDER[folder]
    if folder in ("alfworld", "textworld", "webshop"):  # the realistic (verl-agent-like) settings
        kwargs = cli.datamodule.env.kwargs
        assert cli.datamodule.group_size == 8 and cli.datamodule.groups_per_iteration == 16
        assert kwargs["max_steps"] == (15 if folder == "webshop" else 50)
        assert kwargs.get("success_reward", kwargs.get("reward_scale")) == 10.0
        assert cli.model.policy_cfg.source.startswith("/path/to/")  # the placeholder the user sets


def test_trainer_preset_combines_with_a_config(tmp_path):
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    args = [
        "--config",
        os.path.join(ROOT, "configs", "household", "grpo.yaml"),
        "--config",
        os.path.join(ROOT, "configs", "trainer", "cpu.yaml"),
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
    ]
    cli = AgentCLI(AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False)
    assert cli.trainer.precision == "32-true"


RSPO_CONFIGS = [p for p in CONFIGS if p.endswith(("_rspo.yaml", "_rspo_paper.yaml"))]
LOOK_ALIKE = {
    "webshop": ("rspo/Shop-v0", {"max_steps": 5}),
    "shop": ("rspo/Shop-v0", {"max_steps": 5}),
}  # every other folder: Household


@pytest.mark.parametrize("path", RSPO_CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_rspo_config_runs_one_loop(path, tmp_path):
    """Every shipped RSPO config, its model swapped for ``tiny``, its env for the embedded
    look-alike and its learned process reward (if any) for progress deltas, runs one RSPO loop
    (k = 1: explore, collect, exploit) on the CPU, with replay in the exploit iteration."""
    from rspo_lightning.callbacks import RSPOLoop
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    folder = os.path.basename(os.path.dirname(path))
    env_id, kwargs = LOOK_ALIKE.get(
        folder,
        (
            "rspo/Household-v0",
            {"task_types": ["pick_and_place"], "num_receptacles": 3, "max_steps": 3, "info_actions": False},
        ),
    )
    args = [
        "--config",
        path,
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
        "--trainer.precision",
        "32-true",
        "--trainer.logger",
        "false",
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.max_epochs",
        "1",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.callbacks.k",
        "1",
        "--data.iterations_per_epoch",
        "3",
        "--data.groups_per_iteration",
        "4",
        "--data.group_size",
        "2",
        "--data.env.env_id",
        env_id,
        "--data.env.kwargs",
        json.dumps(kwargs),
        "--data.val_splits",
        "[]",
        "--model.policy.source",
        "tiny",
        "--model.policy.gradient_checkpointing",
        "false",
        "--model.policy.tiny.hidden_size",
        "32",
        "--model.policy.tiny.intermediate_size",
        "64",
        "--model.policy.tiny.num_layers",
        "1",
        "--model.rollout.max_new_tokens",
        "8",
        "--model.rollout.template",
        "compact",
        "--model.algorithm.micro_batch_size",
        "null",
        "--model.algorithm.minibatch_size",
        "64",
        "--model.dense_reward=rspo_lightning.rewards.EnvProgressReward",
    ]
    cli = AgentCLI(
        AgentRLModule,
        AgentDataModule,
        run=False,
        args=[*args, "--trainer.default_root_dir", str(tmp_path)],
        auto_configure_optimizers=False,
        save_config_callback=None,
    )
    loop = next(c for c in cli.trainer.callbacks if isinstance(c, RSPOLoop))
    loop.buffer.skip_zero_advantage = False  # the untrained tiny model wins nothing: let any item fill the slot
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.model.iteration == 3 and loop.counts == {
        "a_iterations": 1,
        "b_iterations": 1,
        "collected_groups": 4,
        "loops": 1,
    }


SMOKE = os.path.join(ROOT, "configs", "smoke.yaml")
#: the real envs' data are not on the test machine: their configs play the look-alike here (the
#: ALFWorld config on the real engine and the fixture games: tests/test_alfworld.py)
REAL_ENV_STAND_IN = {
    "alfworld": ("rspo/Household-v0", {}),
    "textworld": ("rspo/Household-v0", {}),
    "webshop": ("rspo/Shop-v0", {}),
}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_config_runs_one_iteration_under_the_smoke_overlay(path, tmp_path):
    """``--config <shipped> --config configs/smoke.yaml`` fits one iteration on the CPU with the
    config's own estimator, loss and callbacks (a learned process reward swapped for progress
    deltas, a real env for its look-alike), validates, and writes one checkpoint."""
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    folder = os.path.basename(os.path.dirname(path))
    args = [
        "--config",
        path,
        "--config",
        SMOKE,
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
    ]
    if folder in REAL_ENV_STAND_IN:
        env_id, kwargs = REAL_ENV_STAND_IN[folder]
        args += ["--data.env.env_id", env_id, "--data.env.kwargs", json.dumps(kwargs)]
    dense = (yaml.safe_load(open(path)).get("model") or {}).get("dense_reward") or {}
    if dense.get("class_path", "").endswith("ProcessRewardModelReward"):
        args += ["--model.dense_reward=rspo_lightning.rewards.EnvProgressReward"]
    cli = AgentCLI(
        AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False, save_config_callback=None
    )
    assert cli.trainer.precision == "32-true" and cli.model.policy_cfg.source == "tiny"
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.model.iteration == 1
    assert "val/success_rate" in cli.trainer.callback_metrics
    assert glob.glob(str(tmp_path / "**" / "last.ckpt"), recursive=True)
