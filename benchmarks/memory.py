"""Peak memory (RSS) of GRPO vs RSPO+GRPO, full fine-tuning and LoRA, side by side.

Each variant is one short ``rspo-lightning fit`` in its own process (one RSPO loop with k = 1:
explore, collect, exploit; the GRPO runs do the same number of iterations); the peak RSS of
that process is read with ``getrusage(RUSAGE_CHILDREN)`` by a fresh parent, so runs never share
a maximum. Prints the four peaks and the two ratios RSPO / GRPO.

    python benchmarks/memory.py --smollm2      # SmolLM2-135M-Instruct (weights dominate: the meaningful case)
    python benchmarks/memory.py                # tiny model (framework overhead dominates)
    python benchmarks/memory.py --smollm2 --groups 2 --max-steps 2 --ppo-epochs 1   # a shorter SmolLM2 run

Targets (issue 6): LoRA RSPO <= 1.15 x LoRA GRPO; full RSPO <= 2.2 x full GRPO.
The last line is ``memory_ratio_lora: <ratio>``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, "
    "stderr=subprocess.DEVNULL); print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def peak_rss_mb(cmd: list[str]) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, *cmd], capture_output=True, text=True, cwd=ROOT, check=True)
    rc, kb = out.stdout.split()
    if rc != "0":
        raise RuntimeError(f"run failed (exit {rc}): {' '.join(cmd)}")
    return int(kb) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smollm2", action="store_true")
    p.add_argument("--groups", type=int, default=4, help="task groups per iteration")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument(
        "--max-steps", type=int, default=None, help="turn cap (default: 3 with --smollm2, the config's 10 otherwise)"
    )
    p.add_argument("--ppo-epochs", type=int, default=None, help="PPO epochs (default: the config's 2)")
    args = p.parse_args()
    out = tempfile.mkdtemp(prefix="rspo_mem_")
    common = [
        "--trainer.max_epochs=1",
        "--data.iterations_per_epoch=3",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={out}",
        f"--data.groups_per_iteration={args.groups}",
        f"--data.group_size={args.group_size}",
    ]
    if args.ppo_epochs is not None:
        common.append(f"--model.algorithm.ppo_epochs={args.ppo_epochs}")
    max_steps = args.max_steps or (3 if args.smollm2 else None)
    if args.smollm2:
        common += [
            "--model.policy.source=smollm2",
            "--model.rollout.constrained_decoding=false",
            "--model.rollout.template=household",
            "--model.rollout.max_new_tokens=32",
            "--model.algorithm.minibatch_size=16",
            "--model.algorithm.micro_batch_size=4",
            f'--data.env.kwargs={{"task_types": ["pick_and_place"], "num_receptacles": 4, "max_steps": {max_steps}}}',
        ]
    elif max_steps is not None:
        common.append(
            '--data.env.kwargs={"task_types": ["pick_and_place"], "num_receptacles": 4, "num_distractors": 1, '
            f'"num_object_types": 8, "max_steps": {max_steps}, "info_actions": false}}'
        )
    lora = ['--model.policy.lora={"r": 16, "alpha": 32}']
    rspo = ["--trainer.callbacks.init_args.k=1"]
    variants = {
        "grpo full": ("configs/compare/grpo.yaml", []),
        "rspo+grpo full": ("configs/compare/grpo_rspo.yaml", rspo),
        "grpo lora": ("configs/compare/grpo.yaml", lora),
        "rspo+grpo lora": ("configs/compare/grpo_rspo.yaml", rspo + lora),
    }
    peaks = {}
    for name, (config, extra) in variants.items():
        cmd = [sys.executable, "-m", "rspo_lightning.cli", "fit", "--config", config, *common, *extra]
        peaks[name] = peak_rss_mb(cmd)
        print(f"{name}: peak RSS {peaks[name]:.0f} MB", flush=True)
    full = peaks["rspo+grpo full"] / peaks["grpo full"]
    low = peaks["rspo+grpo lora"] / peaks["grpo lora"]
    print(json.dumps({k: round(v) for k, v in peaks.items()}))
    print(
        f"model: {'SmolLM2-135M-Instruct' if args.smollm2 else 'tiny'}; RSPO/GRPO full {full:.3f} (target <= 2.2), LoRA {low:.3f} (target <= 1.15)"
    )
    print(f"memory_ratio_full: {full:.3f}")
    print(f"memory_ratio_lora: {low:.3f}")


if __name__ == "__main__":
    main()
