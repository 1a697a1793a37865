"""Reusable Lightning callbacks."""

from rspo_lightning.callbacks.budget import EnvStepBudget
from rspo_lightning.callbacks.checkpoint import IterationCheckpoint
from rspo_lightning.callbacks.curriculum import Curriculum
from rspo_lightning.callbacks.progress import IterationProgressBar
from rspo_lightning.callbacks.transcripts import TranscriptLogger, render_transcript
from rspo_lightning.rspo.loop import RSPOAgent, RSPOLoop

__all__ = [
    "Curriculum",
    "EnvStepBudget",
    "IterationCheckpoint",
    "IterationProgressBar",
    "RSPOAgent",
    "RSPOLoop",
    "TranscriptLogger",
    "render_transcript",
]
