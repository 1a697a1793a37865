"""``rspo-lightning``: the Lightning CLI (subcommands fit / validate / test).

``rspo-lightning fit --help`` is the reference manual: every argument of the RL module, its
data module and the callbacks below is typed and documented there.

Another LightningModule / DataModule (e.g. the SFT warm start) is chosen with
``--model CLASS`` / ``--data CLASS`` or a ``class_path`` in a config file; the CLI then switches
to Lightning's subclass mode (``--model.help CLASS`` documents that class).
"""

from __future__ import annotations

import sys

import yaml
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from rspo_lightning.callbacks import TranscriptLogger


class AgentCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(TranscriptLogger, "transcripts")
        parser.set_defaults({
            "trainer.logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": "runs", "name": "rspo"},
            },
            "trainer.num_sanity_val_steps": -1,
            "trainer.log_every_n_steps": 1,
        })


def _names_a_class(argv: list[str]) -> bool:
    """True when the command line or a config file picks the model/data class explicitly."""
    for i, arg in enumerate(argv):
        if arg in ("--model", "--data") or arg.startswith(("--model=", "--data=", "--model.help", "--data.help")):
            return True
        if arg in ("--config", "-c") and i + 1 < len(argv):
            try:
                with open(argv[i + 1]) as f:
                    cfg = yaml.safe_load(f) or {}
            except OSError:
                continue  # the CLI itself reports the missing file
            if any(isinstance(cfg.get(k), dict) and "class_path" in cfg[k] for k in ("model", "data")):
                return True
    return False


def main(args: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)
    kwargs = dict(args=argv, save_config_kwargs={"overwrite": True}, auto_configure_optimizers=False)
    if _names_a_class(argv):
        AgentCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True, **kwargs)
    else:
        from rspo_lightning.datamodules import AgentDataModule
        from rspo_lightning.module import AgentRLModule

        AgentCLI(AgentRLModule, AgentDataModule, **kwargs)


if __name__ == "__main__":
    main()
