"""Old name of ``rspo_lightning.logprobs`` (log-probs of a batch (forward, chunked scoring, old and reference log-probs, critic values)), renamed so that the file says what it
holds (issue 24). Importing this name gives that very module, so code, pickles and monkeypatches
written against ``rspo_lightning.scoring`` reach the objects in use."""

import sys

from rspo_lightning import logprobs

sys.modules[__name__] = logprobs
