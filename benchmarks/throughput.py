"""Rollout and update throughput of real `rspo-lightning fit` iterations.

Runs the CLI in-process on a config (default: the quickstart) for a few iterations without
validation, then reads the perf/* scalars it logged to TensorBoard and prints their means
(the first iteration is dropped as warm-up when there are more than one).

    python benchmarks/throughput.py                                   # tiny quickstart model
    python benchmarks/throughput.py --smollm2                         # SmolLM2-135M-Instruct (GGUF)
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "quickstart.yaml"))
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct, free generation, verl-agent prompt")
    ap.add_argument("extra", nargs="*", help="more CLI overrides, e.g. --data.group_size=4")
    args = ap.parse_args()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rspo_lightning.cli import main as cli_main

    out = tempfile.mkdtemp(prefix="rspo_bench_")
    cli = [
        "fit",
        "--config",
        args.config,
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_val_batches",
        "0",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        out,
        "--data.iterations_per_epoch",
        str(args.iterations),
    ]
    if args.smollm2:
        cli += [
            "--model.policy.source",
            "smollm2",
            "--model.rollout.constrained_decoding",
            "false",
            "--model.rollout.template",
            "household",
            "--model.rollout.max_new_tokens",
            "48",
            "--model.rollout.system_prompt",
            "You are a helpful assistant.",
            "--model.optim.lr",
            "1e-6",
            "--model.algorithm.minibatch_size",
            "16",
            "--model.algorithm.micro_batch_size",
            "4",
            "--data.groups_per_iteration",
            "2",
            "--data.group_size",
            "4",
            "--data.env.kwargs",
            '{"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 3}',
        ]
    cli += args.extra
    cli_main(cli)
    (event_dir,) = {
        os.path.dirname(p) for p in glob.glob(os.path.join(out, "**", "events.out.tfevents*"), recursive=True)
    }
    acc = EventAccumulator(event_dir, size_guidance={"scalars": 0})
    acc.Reload()
    name = "smollm2" if args.smollm2 else "tiny"
    rows = {}
    for tag in ["perf/rollout_s", "perf/update_s", "perf/rollout_tokens_per_s", "perf/update_tokens_per_s"]:
        values = [e.value for e in acc.Scalars(tag)]
        if len(values) > 1:
            values = values[1:]
        rows[tag] = sum(values) / len(values)
        print(f"{name} {tag}: {rows[tag]:.2f}  (per iteration: {', '.join(f'{v:.1f}' for v in values)})")
    print(f"{name}_rollout_tokens_per_s: {rows['perf/rollout_tokens_per_s']:.1f}")
    print(f"{name}_update_tokens_per_s: {rows['perf/update_tokens_per_s']:.1f}")


if __name__ == "__main__":
    sys.exit(main())
