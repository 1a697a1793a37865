"""Lightning data modules."""

from rspo_lightning.datamodules.agent import AgentDataModule
from rspo_lightning.datamodules.trajectory import TrajectoryDataModule

__all__ = ["AgentDataModule", "TrajectoryDataModule"]
