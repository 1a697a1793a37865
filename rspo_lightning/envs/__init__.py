"""Text environments (DESIGN §5); importing this package registers the `rspo/` ids with gymnasium."""

from rspo_lightning.envs.base import TextEnv, make_env, register_env, registered_env_ids
from rspo_lightning.envs.household import Household
from rspo_lightning.envs.shop import Shop

register_env("rspo/Household-v0", "rspo_lightning.envs.household:Household")
register_env("rspo/Shop-v0", "rspo_lightning.envs.shop:Shop")
# adapters to the real packages (imported only when an env is made: pip install -e ".[textworld]" / ".[alfworld]")
register_env("rspo/TextWorld-v0", "rspo_lightning.envs.textworld_env:TextWorld")
register_env("rspo/ALFWorld-v0", "rspo_lightning.envs.alfworld_env:ALFWorld")
register_env("rspo/WebShop-v0", "rspo_lightning.envs.webshop_env:WebShop")
# fault injection around any env (reliability tests, benchmarks/soak.py)
register_env("rspo/Faulty-v0", "rspo_lightning.envs.faults:FaultyEnv")

__all__ = ["Household", "Shop", "TextEnv", "make_env", "register_env", "registered_env_ids"]
