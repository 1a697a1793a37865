"""Lightning data modules."""

from rspo_lightning.datamodules.agent import AgentDataModule
from rspo_lightning.datamodules.trajectory import TrajectoryDataModule, TrajectoryEpisodeDataModule

__all__ = ["AgentDataModule", "TrajectoryDataModule", "TrajectoryEpisodeDataModule"]
