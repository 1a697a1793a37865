"""Text environments (DESIGN §5); importing this package registers the `rspo/` ids with gymnasium."""

from rspo_lightning.envs.base import TextEnv, make_env, register_env, registered_env_ids
from rspo_lightning.envs.household import Household

register_env("rspo/Household-v0", "rspo_lightning.envs.household:Household")

__all__ = ["Household", "TextEnv", "make_env", "register_env", "registered_env_ids"]
