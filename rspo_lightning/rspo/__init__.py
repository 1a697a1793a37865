"""RSPO (Reward-Swap Policy Optimization) in a room of its own (docs/design.md §10):

- ``loop.py``: ``RSPOLoop``, the callback that decides each iteration's phase (B explores, B
  collects into D, A exploits) and hands the module one frozen ``IterationPlan`` per iteration;
- ``buffer.py``: ``ReplayBuffer``, D (owned by the DataModule, which mixes it into A's batches);
- ``snapshot.py``: agent A's copy while B trains, and its bitwise restore;
- ``diagnostics.py``: what the replayed rows of an iteration carry, and J's α.
"""

from rspo_lightning.rspo.buffer import ReplayBuffer
from rspo_lightning.rspo.loop import RSPOAgent, RSPOLoop

__all__ = ["RSPOAgent", "RSPOLoop", "ReplayBuffer"]
