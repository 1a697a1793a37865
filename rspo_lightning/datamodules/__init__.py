"""Lightning data modules."""

from rspo_lightning.datamodules.agent import AgentDataModule

__all__ = ["AgentDataModule"]
