"""Old name of ``rspo_lightning.language_model`` (the language model loader, value head and frozen copies), renamed so that the file says what it
holds (issue 24). Importing this name gives that very module, so code, pickles and monkeypatches
written against ``rspo_lightning.policy`` reach the objects in use."""

import sys

from rspo_lightning import language_model

sys.modules[__name__] = language_model
