"""One GPU, bf16: a 2-iteration fit of a Qwen2.5-1.5B-shaped policy (randomly initialised, so no
weights are needed) with the hf rollout backend, on one device, plainly and under
configs/trainer/fsdp.yaml; prints seconds per iteration split into rollout / update and the
peak GPU memory, as one table. Run by benchmarks/gpu_check.sh (which installs what is missing).

The shape: 28 decoder layers, hidden 1536, 12 heads, SwiGLU 8960 (Qwen2.5-1.5B's), built as
the package's tiny Llama (no grouped-query attention; the vocabulary is the word-level
tokenizer's, not Qwen's 151,936): 1.32 B parameters.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
from lightning.pytorch import Callback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the CLI imports the Probe callback as benchmarks.gpu_check.Probe
SMOKE_SHAPE = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 128,
}  # --cpu-smoke: the plumbing only
SHAPE = {
    "hidden_size": 1536,
    "num_layers": 28,
    "num_heads": 12,
    "intermediate_size": 8960,
    "max_position_embeddings": 2048,
}


class Probe(Callback):
    """Per-iteration rollout / update seconds (the module's perf/* logs) and peak GPU memory."""

    def __init__(self, out: str):
        self.out, self.rows = out, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = trainer.callback_metrics
        self.rows.append(
            {k: float(m[k]) for k in ("perf/rollout_s", "perf/update_s", "rollout/success_rate") if k in m}
        )

    def on_train_end(self, trainer, pl_module):
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
        with open(self.out, "w") as f:
            json.dump(
                {"rows": self.rows, "peak_gib": peak, "params": sum(p.numel() for p in pl_module.policy.parameters())},
                f,
            )


def fit(name: str, extra: list[str], out_dir: str, smoke: bool = False) -> dict:
    from rspo_lightning.cli import main

    out = os.path.join(out_dir, f"{name}.json")
    args = [
        "fit",
        "--config",
        os.path.join(ROOT, "configs", "quickstart.yaml"),
        *extra,
        "--trainer.accelerator",
        "cpu" if smoke else "gpu",
        "--trainer.devices",
        "1",
        "--trainer.max_epochs",
        "1",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.default_root_dir",
        os.path.join(out_dir, name),
        "--trainer.logger.init_args.save_dir",
        os.path.join(out_dir, name),
        "--data.iterations_per_epoch",
        "2",
        "--data.groups_per_iteration",
        "8",
        "--data.group_size",
        "8",
        "--model.rollout.max_new_tokens",
        "16",
        "--model.algorithm.minibatch_size",
        "32",
        "--model.algorithm.micro_batch_size",
        "16",
        "--trainer.callbacks+=benchmarks.gpu_check.Probe",
        f"--trainer.callbacks.out={out}",
    ]
    for key, value in (SMOKE_SHAPE if smoke else SHAPE).items():
        args += [f"--model.policy.tiny.{key}", str(value)]
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    main(args)
    result = json.load(open(out))
    result["wall_s"] = time.perf_counter() - t0
    return result


def main() -> None:
    smoke = "--cpu-smoke" in sys.argv
    positional = [a for a in sys.argv[1:] if not a.startswith("--")]
    out_dir = positional[0] if positional else "gpu_check_out"
    os.makedirs(out_dir, exist_ok=True)
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}",
        flush=True,
    )
    if smoke:  # this script's own check on a CPU: a tiny shape, the plain run only
        runs = {"cpu smoke (tiny shape, fp32)": fit("smoke", [], out_dir, smoke=True)}
    else:
        runs = {
            "hf, 1 GPU, bf16-true": fit("plain", ["--trainer.precision", "bf16-true"], out_dir),
            "hf, configs/trainer/fsdp.yaml (1 GPU, bf16-mixed)": fit(
                "fsdp", ["--config", os.path.join(ROOT, "configs", "trainer", "fsdp.yaml")], out_dir
            ),
        }
    print(f"\n{'run':52s} {'params':>8s} {'rollout s/it':>13s} {'update s/it':>12s} {'peak GiB':>9s} {'wall s':>7s}")
    for name, r in runs.items():
        roll = statistics.median(x["perf/rollout_s"] for x in r["rows"])
        upd = statistics.median(x["perf/update_s"] for x in r["rows"])
        print(f"{name:52s} {r['params'] / 1e9:7.2f}B {roll:13.2f} {upd:12.2f} {r['peak_gib']:9.1f} {r['wall_s']:7.0f}")


if __name__ == "__main__":
    main()
