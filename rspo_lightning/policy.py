"""Old name of ``rspo_lightning.language_model`` (the language model loader, value head and frozen copies): renamed so that the file says what
it holds (the note of issue 24); this module re-exports it, so code written against
``rspo_lightning.policy`` keeps working."""

from rspo_lightning.language_model import *  # noqa: F403
from rspo_lightning.language_model import __dict__ as _moved

globals().update({k: v for k, v in _moved.items() if not k.startswith("__")})
