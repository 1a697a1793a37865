"""Old name of ``rspo_lightning.runtime`` (the process-level utilities (frozen startup heap, rollout seeding)), renamed so that the file says what it
holds (issue 24). Importing this name gives that very module, so code, pickles and monkeypatches
written against ``rspo_lightning.process`` reach the objects in use."""

import sys

from rspo_lightning import runtime

sys.modules[__name__] = runtime
