"""``rspo-lightning``: the Lightning CLI (subcommands fit / validate / test).

``rspo-lightning fit --help`` is the reference manual: every argument of the module, the data
module and the callbacks below is typed and documented.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from rspo_lightning.callbacks import TranscriptLogger
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.module import AgentRLModule


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


def main(args: list[str] | None = None) -> None:
    AgentCLI(
        AgentRLModule,
        AgentDataModule,
        args=args,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
    )


if __name__ == "__main__":
    main()
