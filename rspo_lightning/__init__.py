"""rspo_lightning: multi-turn LLM-agent RL (RSPO, GiGPO, GRPO, PPO, ...) on PyTorch Lightning."""

import rspo_lightning.envs  # noqa: F401  (registers the rspo/* gymnasium ids)

__version__ = "0.1.0"

__all__ = [
    "AgentRLModule",
    "AgentDataModule",
    "SFTModule",
    "ProcessRewardModule",
    "TaskSpec",
    "Turn",
    "Trajectory",
    "TrainBatch",
    "IterationBatch",
]


_TYPES = {"IterationBatch", "TaskSpec", "TrainBatch", "Trajectory", "Turn"}


def __getattr__(
    name,
):  # lazy: importing the package (e.g. in an env worker process) imports neither torch nor Lightning
    if name in _TYPES:
        import rspo_lightning.types

        return getattr(rspo_lightning.types, name)
    if name == "AgentRLModule":
        from rspo_lightning.module import AgentRLModule

        return AgentRLModule
    if name == "SFTModule":
        from rspo_lightning.sft import SFTModule

        return SFTModule
    if name == "ProcessRewardModule":
        from rspo_lightning.prm import ProcessRewardModule

        return ProcessRewardModule
    if name == "AgentDataModule":
        from rspo_lightning.datamodules import AgentDataModule

        return AgentDataModule
    raise AttributeError(f"module 'rspo_lightning' has no attribute {name!r}")
