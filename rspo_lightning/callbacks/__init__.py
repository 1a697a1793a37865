"""Reusable Lightning callbacks."""

from rspo_lightning.callbacks.transcripts import TranscriptLogger, render_transcript

__all__ = ["TranscriptLogger", "render_transcript"]
