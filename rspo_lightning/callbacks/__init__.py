"""Reusable Lightning callbacks."""

from rspo_lightning.callbacks.budget import EnvStepBudget
from rspo_lightning.callbacks.curriculum import Curriculum
from rspo_lightning.callbacks.transcripts import TranscriptLogger, render_transcript

__all__ = ["Curriculum", "EnvStepBudget", "TranscriptLogger", "render_transcript"]
