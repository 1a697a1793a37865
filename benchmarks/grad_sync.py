"""Gradient synchronisation per optimizer step vs per micro-batch (``algorithm.grad_sync``) on 2
CPU ranks over gloo, under DDP and FSDP2, side by side in one run: the collectives each rank issued,
the gradient memory it held (the largest, right after a backward), its peak RSS, the update's
wall time and whether the trained weights agree.

    python benchmarks/grad_sync.py                  # hidden 512 x 4 layers (~10M parameters)
    python benchmarks/grad_sync.py --hidden 128 --layers 2
    python benchmarks/grad_sync.py --only fsdp2 --kl 0.05 [--root OTHER_CHECKOUT]   # the sharded KL reference

One iteration of configs/quickstart.yaml with the tiny model resized, 2 groups of 8 episodes,
one minibatch of up to 64 turns in micro-batches of 4, no validation. The probe
(benchmarks/_grad_sync_probe.py) counts DDP's all-reduces with a comm hook and FSDP2's
reduce-scatters by wrapping its ``foreach_reduce`` (a benchmark may use a private name; the
package does not), and the MB of the frozen KL reference each rank holds (``--kl``). ``--root``
runs another checkout's package (e.g. a commit before the reference was sharded) with this probe.
Numbers go to docs/distributed.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _runs import ROOT, fit_cmd, thread_env

STRATEGIES = {"ddp": "configs/trainer/ddp_cpu.yaml", "fsdp2": "configs/trainer/fsdp2_cpu.yaml"}
MODES = ("step", "micro_batch")


def run(strategy: str, mode: str, args, out: Path) -> list[dict]:
    cmd = fit_cmd(
        str(args.root / "configs" / "quickstart.yaml"),
        "--config",
        str(args.root / STRATEGIES[strategy]),
        "--seed_everything=0",
        f"--model.policy.tiny.hidden_size={args.hidden}",
        f"--model.policy.tiny.intermediate_size={2 * args.hidden}",
        f"--model.policy.tiny.num_layers={args.layers}",
        "--model.policy.tiny.num_heads=8",
        "--data.iterations_per_epoch=1",
        "--trainer.max_epochs=1",
        "--data.groups_per_iteration=2",
        "--data.group_size=8",
        "--model.algorithm.minibatch_size=64",
        f"--model.algorithm.micro_batch_size={args.micro}",
        "--model.algorithm.drop_zero_advantage=false",
        "--model.algorithm.entropy_coef=0.01",  # a gradient on every row, won or not
        f"--model.algorithm.kl_coef={args.kl}",
        f"--model.algorithm.grad_sync={mode}",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=0",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.logger=false",
        "--trainer.callbacks+=_grad_sync_probe.GradSyncProbe",
        f"--trainer.callbacks.out_dir={out}",
    )
    env = {**thread_env(1), "PYTHONPATH": os.pathsep.join([str(args.root), str(ROOT / "benchmarks")])}
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{strategy}/{mode} failed:\n{proc.stderr[-3000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    print(f"  {strategy:5s} {mode:11s} done in {time.time() - t0:.0f} s", flush=True)
    return ranks


def max_weight_diff(a: Path, b: Path) -> float:
    import torch

    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--kl", type=float, default=0.0, help="algorithm.kl_coef (> 0 builds the frozen reference)")
    p.add_argument("--only", choices=list(STRATEGIES), default=None)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout whose package and configs run")
    p.add_argument("--json", default=None, help="also write the table as JSON here")
    args = p.parse_args()
    args.root = args.root.resolve()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in [args.only] if args.only else STRATEGIES:
            for mode in args.modes:
                out = Path(tmp) / f"{strategy}_{mode}"
                ranks = run(strategy, mode, args, out)
                rows.append({"strategy": strategy, "mode": mode, "ranks": ranks})
            if len(args.modes) == 2:
                diffs = [
                    max_weight_diff(
                        Path(tmp) / f"{strategy}_step" / f"params{r}.pt",
                        Path(tmp) / f"{strategy}_micro_batch" / f"params{r}.pt",
                    )
                    for r in (0, 1)
                ]
                rows[-1]["weight_diff_vs_step"] = max(diffs)
    print(
        f"\nhidden {args.hidden}, {args.layers} layers, micro-batches of {args.micro}, kl_coef {args.kl}, "
        f"package from {args.root}; per rank (rank 0 / rank 1)"
    )
    print(
        "| strategy | grad_sync | params | optimizer steps | backwards | gradient collectives "
        "| gradient MB held (max) | reference MB held | peak RSS MB | update s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        r0, r1 = row["ranks"]

        def both(key, fmt="{:.0f}", r0=r0, r1=r1):
            return " / ".join(fmt.format(r[key]) for r in (r0, r1))

        print(
            f"| {row['strategy']} | {row['mode']} | {r0['params'] / 1e6:.1f}M | {both('steps')} | {both('backwards')} "
            f"| {both('collectives')} | {both('grad_mb', '{:.1f}')} | {both('reference_mb', '{:.1f}')} | {both('rss_mb')} "
            f"| {both('update_s', '{:.1f}')} |"
        )
    for row in rows:
        if "weight_diff_vs_step" in row:
            print(f"{row['strategy']}: max |weights(step) - weights(micro_batch)| = {row['weight_diff_vs_step']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {**vars(args), "root": str(args.root)}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
