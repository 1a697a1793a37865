"""What a checkpoint save costs: ``AtomicCheckpointIO`` (temporary file next to the target, fsync,
rename, SHA-256 sidecar) against Lightning's ``TorchCheckpointIO``, interleaved, for the tiny
model's checkpoint and for a 135M-parameter model with Adam state (1.6 GB in fp32).

    python benchmarks/checkpoint_save.py --repeats 5

Prints the median (and range) seconds of each and, last, ``atomic_over_lightning: <ratio>`` for
the tiny checkpoint. Decides the default ``checkpoint.every_n_iterations`` (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from rspo_lightning.checkpointing import AtomicCheckpointIO


def tiny_checkpoint() -> dict:
    """The state of a quickstart-sized run: a 0.36M-parameter policy, Adam moments, a replay buffer's worth of lists."""
    from rspo_lightning.language_model import TinyModelConfig, load_policy

    model, _ = load_policy(
        "tiny",
        tiny=TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256),
        corpus=["go to the shelf 1", "take the apple 1 from the shelf 1"],
    )
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {
        "state_dict": params,
        "optimizer_states": [
            {
                "m": {k: torch.zeros_like(v) for k, v in params.items()},
                "v": {k: torch.zeros_like(v) for k, v in params.items()},
            }
        ],
        "callbacks": {"RSPOLoop": {"buffer": [[list(range(300))] * 8] * 16}},
    }


def large_checkpoint(n: int = 134_500_000) -> dict:
    return {"state_dict": {"w": torch.zeros(n)}, "optimizer_states": [{"m": torch.zeros(n), "v": torch.zeros(n)}]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--large-repeats", type=int, default=2)
    args = p.parse_args()
    out = tempfile.mkdtemp(prefix="ckpt_bench_")
    ratio = None
    for name, ckpt, repeats in (
        ("tiny", tiny_checkpoint(), args.repeats),
        ("135M + Adam", large_checkpoint(), args.large_repeats),
    ):
        times: dict[str, list[float]] = {"atomic": [], "lightning": []}
        for _ in range(repeats):  # interleaved: a slow spell of the machine hits both sides
            for side, io in (("atomic", AtomicCheckpointIO()), ("lightning", TorchCheckpointIO())):
                path = os.path.join(out, f"{side}.ckpt")
                t0 = time.perf_counter()
                io.save_checkpoint(ckpt, path)
                times[side].append(time.perf_counter() - t0)
        size = os.path.getsize(os.path.join(out, "atomic.ckpt")) / 1e6
        for side, ts in times.items():
            print(
                f"{name} ({size:.1f} MB) {side}: median {statistics.median(ts):.3f} s (range {min(ts):.3f}-{max(ts):.3f}, n={len(ts)})"
            )
        if name == "tiny":
            ratio = statistics.median(times["atomic"]) / statistics.median(times["lightning"])
        for f in os.listdir(out):
            os.remove(os.path.join(out, f))
    os.rmdir(out)
    print(f"atomic_over_lightning: {ratio:.2f}")


if __name__ == "__main__":
    main()
