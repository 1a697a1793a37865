"""Process-level utilities of a run: the garbage collector's frozen startup heap, the seeding of
rollout sampling, and the Lightning notices that do not apply to an RL module (filtered once)."""

from __future__ import annotations

import gc
import warnings

import torch

_HEAP_FROZEN = False  # by freeze_startup_heap, and not given back yet


def freeze_startup_heap() -> None:
    """Leave the heap built so far (torch, transformers, the models, the envs: ~440k objects with
    the tiny model) out of every later garbage collection: a full collection then scans only what
    the run allocates, instead of pausing a rollout ~0.35 s every few iterations
    (docs/history/issue06_overheads.md). ``AgentRLModule.setup`` calls it, ``teardown`` gives the heap back.

    A heap this function froze for a run that crashed (Lightning runs no ``teardown`` hook after
    an exception) is given back first; a process that froze objects itself is left as it is.
    """
    global _HEAP_FROZEN
    unfreeze_startup_heap()
    if gc.get_freeze_count() == 0:
        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True


def unfreeze_startup_heap() -> None:
    """Give the heap frozen by ``freeze_startup_heap`` back to the collector (no-op otherwise)."""
    global _HEAP_FROZEN
    if _HEAP_FROZEN:
        gc.unfreeze()
        _HEAP_FROZEN = False


def seed_rollout(seed: int, iteration: int, purpose: str, rank: int = 0) -> None:
    """Seed torch's RNG (the sampler's) from (seed, iteration, purpose, rank): a resumed run replays
    the same samples as an uninterrupted one, whatever ran before."""
    code = sum(ord(c) * 31**i for i, c in enumerate(purpose)) % 1_000_003
    torch.manual_seed(((seed * 1_000_003 + iteration) * 1_000_003 * 64 + code * 64 + rank) % (2**63 - 1))


# Lightning notices that say nothing a user of AgentRLModule can act on, each filtered by its own
# text only: the data module's IterableDataset has a length (for the progress bar; no worker
# processes load it), the module moves batches itself (task specs and trajectories stay on the
# CPU), the policy sits in eval mode between updates (rollouts and scoring need it).
LIGHTNING_NOTICES = (
    r"Your `IterableDataset` has `__len__` defined",
    r"You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a `LightningDataModule`",
    r"Found \d+ module\(s\) in eval mode at the start of training",
    # Lightning turns sync_dist off on a single device and then warns that it is off wherever
    # torch.distributed is initialised (a single-process vLLM engine does): about the held-out
    # means evaluation.py logs, already all-rank, there is nothing to act on
    r"It is recommended to use `self\.log\('(?:(?:val|test)[\w/]*|step)', \.\.\., sync_dist=True\)`",
    # Lightning's own pytree helper calls an API torch >= 2.10 deprecates: printed at every fit, nothing to act on
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)
for _notice in LIGHTNING_NOTICES:
    warnings.filterwarnings("ignore", message=_notice)
