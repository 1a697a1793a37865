"""Old name of ``rspo_lightning.runtime`` (the process-level utilities (frozen startup heap, rollout seeding)): renamed so that the file says what
it holds (the note of issue 24); this module re-exports it, so code written against
``rspo_lightning.process`` keeps working."""

from rspo_lightning.runtime import *  # noqa: F403
from rspo_lightning.runtime import __dict__ as _moved

globals().update({k: v for k, v in _moved.items() if not k.startswith("__")})
