"""Old name of ``rspo_lightning.build`` (what AgentRLModule owns, built from its configs), renamed so that the file says what it
holds (issue 24). Importing this name gives that very module, so code, pickles and monkeypatches
written against ``rspo_lightning.models`` reach the objects in use."""

import sys

from rspo_lightning import build

sys.modules[__name__] = build
