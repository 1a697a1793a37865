"""Reusable Lightning callbacks."""

from rspo_lightning.callbacks.curriculum import Curriculum
from rspo_lightning.callbacks.transcripts import TranscriptLogger, render_transcript

__all__ = ["Curriculum", "TranscriptLogger", "render_transcript"]
