"""Text environments (docs/design.md §5); importing this package registers the `rspo/` ids with gymnasium.

gymnasium >= 1.0 has no plugin loader (the ``gymnasium.envs`` entry-point group of gym 0.2x is
gone), so a bare ``gymnasium.make("rspo/Household-v0")`` only works once this package is
imported. Without importing it, name the module in the id, which gymnasium imports first:
``gymnasium.make("rspo_lightning.envs:rspo/Household-v0")``.
"""

from rspo_lightning.envs.base import TextEnv, make_env, register_env, registered_env_ids
from rspo_lightning.envs.household import Household
from rspo_lightning.envs.shop import Shop

#: Every id this package registers, with its entry point.
ENV_ENTRY_POINTS = {
    "rspo/Household-v0": "rspo_lightning.envs.household:Household",
    "rspo/Shop-v0": "rspo_lightning.envs.shop:Shop",
    # adapters to the real packages (imported only when an env is made: pip install -e ".[textworld]" / ".[alfworld]")
    "rspo/TextWorld-v0": "rspo_lightning.envs.textworld_env:TextWorld",
    "rspo/ALFWorld-v0": "rspo_lightning.envs.alfworld_env:ALFWorld",
    "rspo/WebShop-v0": "rspo_lightning.envs.webshop_env:WebShop",
    # environments in other tools' formats (docs/environments_byo.md; pip install -e ".[openenv]" / ".[textarena]")
    "rspo/OpenEnv-v0": "rspo_lightning.envs.openenv_env:OpenEnv",
    "rspo/TextArena-v0": "rspo_lightning.envs.textarena_env:TextArena",
    # fault injection around any env (reliability tests, benchmarks/soak.py)
    "rspo/Faulty-v0": "rspo_lightning.envs.faults:FaultyEnv",
}


def register_envs() -> None:
    """Register every `rspo/` id with gymnasium; calling it again is a no-op."""
    for env_id, entry_point in ENV_ENTRY_POINTS.items():
        register_env(env_id, entry_point)


register_envs()

__all__ = [
    "ENV_ENTRY_POINTS",
    "Household",
    "Shop",
    "TextEnv",
    "make_env",
    "register_env",
    "register_envs",
    "registered_env_ids",
]
