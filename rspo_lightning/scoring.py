"""Old name of ``rspo_lightning.logprobs`` (log-probs of a batch (forward, chunked scoring, old and reference log-probs, critic values)): renamed so that the file says what
it holds (the note of issue 24); this module re-exports it, so code written against
``rspo_lightning.scoring`` keeps working."""

from rspo_lightning.logprobs import *  # noqa: F403
from rspo_lightning.logprobs import __dict__ as _moved

globals().update({k: v for k, v in _moved.items() if not k.startswith("__")})
