"""The one registry of the classes a checkpoint may hold: configuration dataclasses stored as a
module's hyper-parameters. ``torch.load(weights_only=True)`` refuses every other global, so a
class is allow-listed where it is defined, by decorating it with ``checkpoint_safe``; the
registry, ``CHECKPOINT_SAFE``, says which classes that is."""

from __future__ import annotations

import torch

CHECKPOINT_SAFE: list[type] = []


def checkpoint_safe(cls: type) -> type:
    """Class decorator: ``cls`` may be unpickled from a checkpoint (``add_safe_globals``; never a
    context manager, whose exit removes the entries again)."""
    if cls not in CHECKPOINT_SAFE:
        CHECKPOINT_SAFE.append(cls)
        torch.serialization.add_safe_globals([cls])
    return cls


def renamed(cls: type, old_path: str) -> None:
    """Checkpoints written before ``cls`` moved name it ``old_path`` (``module.Class``): allow that too."""
    torch.serialization.add_safe_globals([(cls, old_path)])
