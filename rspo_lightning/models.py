"""Old name of ``rspo_lightning.build`` (what AgentRLModule owns, built from its configs): renamed so that the file says what
it holds (the note of issue 24); this module re-exports it, so code written against
``rspo_lightning.models`` keeps working."""

from rspo_lightning.build import *  # noqa: F403
from rspo_lightning.build import __dict__ as _moved

globals().update({k: v for k, v in _moved.items() if not k.startswith("__")})
