"""How much memory the first update will take, estimated at startup (``startup.check_memory``), so
that a run that cannot fit stops before it plays, naming the estimate and the setting to change,
instead of being killed by the kernel minutes later (docs/reliability.md, "Memory").

The estimate (bytes, the policy's dtype):

- the process itself (Python, torch, transformers, Lightning, the envs, the rollout's buffers and
  what the allocator keeps of them): ``PROCESS_BYTES``;
- weights: every parameter of the policy (and of a frozen reference copy, when a KL term builds
  one without LoRA);
- training state: gradients and AdamW's two moments of every trainable parameter (x 2 more with
  RSPO, whose snapshot of agent A holds its trainable weights and optimizer state);
- the largest micro-batch's activations kept for the backward: per token and decoder layer, the
  inputs of the attention block (8 x hidden + 2 x the key/value width) and of the gated MLP
  (4 x intermediate), x ``ACTIVATION_FACTOR``, over rows x (prompt + response) tokens;
- its logits and their log-softmax over the response window (rows x window x vocab x 2).

The sequence length is the first task's prompt as rendered once its history window is full, plus
its longest response.

Calibration (docs/llm.md, "Memory"): SmolLM2's forward at 8 x 238 tokens keeps 1.13x the counted
activations with full fine-tuning and 1.68x under peft's LoRA (``/proc`` RSS around one step);
whole fits peaked at 7.5 GB (full, micro-batches of 8), 6.3 GB (LoRA) and 2.0 GB (no update),
the tiny quickstart at 1.26 GB. ``PROCESS_BYTES`` and ``ACTIVATION_FACTOR`` are set so that the
estimate falls within 30 % of each of those peaks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PROCESS_BYTES = 1300 * 2**20  # a SmolLM2 fit that never updates peaks at 2.0 GB, 0.54 of it weights
ACTIVATION_FACTOR = 1.5  # measured 1.13 (full fine-tuning) to 1.68 (LoRA) x the counted activations


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of each part of the first update's peak (module docstring) and their sum."""

    process: int
    weights: int
    training_state: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.process + self.weights + self.training_state + self.activations + self.logits

    def describe(self) -> str:
        gb = 2**30
        return (
            f"{self.total / gb:.1f} GB (process {self.process / gb:.1f}, weights {self.weights / gb:.1f}, "
            f"gradients + optimizer {self.training_state / gb:.1f}, activations {self.activations / gb:.1f}, "
            f"logits {self.logits / gb:.1f})"
        )


def activation_floats_per_token(hidden: int, intermediate: int, kv_width: int) -> int:
    """Floats one decoder layer keeps per token for the backward (module docstring)."""
    return 8 * hidden + 2 * kv_width + 4 * intermediate


def estimate_update(
    *,
    params: int,
    trainable: int,
    layers: int,
    hidden: int,
    intermediate: int,
    kv_width: int,
    vocab: int,
    rows: int,
    seq_len: int,
    window: int,
    dtype_bytes: int = 4,
    reference_copy: bool = False,
    rspo_snapshot: bool = False,
) -> MemoryEstimate:
    """The first update's peak (module docstring) for a micro-batch of ``rows`` sequences of
    ``seq_len`` tokens whose last ``window`` are the response."""
    weights = params * (2 if reference_copy else 1)
    state = trainable * 3 * (2 if rspo_snapshot else 1)
    activations = int(
        rows * seq_len * layers * activation_floats_per_token(hidden, intermediate, kv_width) * ACTIVATION_FACTOR
    )
    logits = rows * (window + 1) * vocab * 2
    b = dtype_bytes
    return MemoryEstimate(PROCESS_BYTES, weights * b, state * b, activations * b, logits * b)


def available_bytes() -> int | None:
    """The memory the kernel can still give this process (``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
