"""Every shipped RL config parses and instantiates its module, data module and trainer."""

import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(
    [os.path.join(ROOT, "configs", "quickstart.yaml")]
    + glob.glob(os.path.join(ROOT, "configs", "compare", "*.yaml"))
    + [p for p in glob.glob(os.path.join(ROOT, "configs", "household", "*.yaml")) if not p.endswith(("sft.yaml", "prm.yaml", "_from_sft.yaml"))]
)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_config_instantiates(path, tmp_path):
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    args = ["--config", path, "--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
            "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = AgentCLI(AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False)
    name = os.path.basename(path)[: -len(".yaml")]
    if name.endswith("_rspo"):
        from rspo_lightning.callbacks import RSPOLoop

        name = name[: -len("_rspo")]
        loops = [c for c in cli.trainer.callbacks if isinstance(c, RSPOLoop)]
        assert len(loops) == 1 and loops[0].k == 3 and loops[0].offline_ratio == 0.125
        assert cli.model.dense_reward is not None
    expected = {"ppo": "gae", "asym_ppo": "gae", "quickstart": "grpo"}.get(name, name)
    assert cli.model.algo.estimator == expected
    if name == "asym_ppo":
        assert cli.model.critic_cfg.kind == "separate" and cli.model.critic_cfg.privileged
    assert cli.datamodule.group_size >= 2


def test_trainer_preset_combines_with_a_config(tmp_path):
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    args = ["--config", os.path.join(ROOT, "configs", "household", "grpo.yaml"),
            "--config", os.path.join(ROOT, "configs", "trainer", "cpu.yaml"),
            "--trainer.logger.init_args.save_dir", str(tmp_path)]
    cli = AgentCLI(AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False)
    assert cli.trainer.precision == "32-true"
