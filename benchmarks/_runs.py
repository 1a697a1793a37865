"""Shared by the learning-curve benchmarks: run `rspo-lightning fit` jobs in parallel (resumable),
read their TensorBoard events, and summarise/plot over seeds."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def thread_env(threads: int) -> dict:
    """This process's environment with ``threads`` torch/BLAS threads and quiet tokenizers."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")


def fit_cmd(config: str | Path, *args: str) -> list[str]:
    """``python -m rspo_lightning.cli fit --config CONFIG ARGS`` with this interpreter."""
    return [sys.executable, "-m", "rspo_lightning.cli", "fit", "--config", str(config), *args]


def fit_job(name: str, config: str, seed: int, extra: list[str], runs: str, threads: int = 1) -> Path:
    """One ``rspo-lightning fit`` run into ``<runs>/<name>/seed<seed>``; skipped when ``done.json`` exists."""
    run_dir = Path(runs) / name / f"seed{seed}"
    if (run_dir / "done.json").exists():
        return run_dir
    cmd = fit_cmd(
        ROOT / config,
        f"--seed_everything={seed}",
        f"--model.seed={seed}",
        f"--data.seed={seed}",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={runs}",
        f"--trainer.logger.init_args.name={name}",
        f"--trainer.logger.init_args.version=seed{seed}",
        *extra,
    )
    env = thread_env(threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(run_dir / "stdout.log", "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise RuntimeError(f"{name} seed {seed} failed (exit {rc}); see {run_dir / 'stdout.log'}")
    (run_dir / "done.json").write_text(json.dumps({"wall_s": time.time() - t0, "cmd": cmd}))
    print(f"done {name} seed {seed} in {time.time() - t0:.0f} s", flush=True)
    return run_dir


def commit() -> str:
    """The short HEAD of this checkout, ``-dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        return head + ("-dirty" if dirty else "") if head else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse_seeds(text: str) -> list[int]:
    """``0-4`` -> 0..4, ``0,2,3`` -> [0, 2, 3], ``1`` -> [1]."""
    seeds = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return seeds


def run_all(jobs: list[tuple], parallel: int) -> list[Path]:
    """``jobs`` = ``fit_job`` argument tuples, ``parallel`` at a time."""
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda job: fit_job(*job), jobs))


def read_events(run_dir: Path) -> dict:
    """Every scalar series of a run as ``{tag: {step: value}}`` plus its wall time."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    series = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    done = run_dir / "done.json"
    return {"series": series, "wall_s": json.loads(done.read_text())["wall_s"] if done.exists() else float("nan")}


def mean_std(xs: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def fmt(xs: list[float]) -> str:
    m, s = mean_std(xs)
    return f"{m:.3f} ± {s:.3f}"


def plot_curves(
    path: str, panels: list[tuple[str, str, dict[str, list[list[tuple[float, float]]]]]], ncols: int | None = None
) -> None:
    """One subplot per panel ``(title, x label, {label: [curve per seed = [(x, y)...]]})``: the
    mean over seeds with a ±std band (points paired by index). ``ncols`` panels per row (default:
    all in one row). Without matplotlib (e.g. the nox vLLM venv the LLM study runs in) it says so
    and draws nothing: the records and tables do not depend on the plot."""
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: {path} not drawn (pip install matplotlib)", flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = ncols or len(panels)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4 * nrows), sharey=True, squeeze=False)
    flat = list(axes.ravel())
    for ax, (title, xlabel, curves) in zip(flat, panels):
        for label, seeds in curves.items():
            n = min(len(c) for c in seeds)
            xs = [sum(c[i][0] for c in seeds) / len(seeds) for i in range(n)]
            stats = [mean_std([c[i][1] for c in seeds]) for i in range(n)]
            m = [s[0] for s in stats]
            ax.plot(xs, m, marker="o", ms=3, label=label)
            ax.fill_between(xs, [v - s[1] for v, s in zip(m, stats)], [v + s[1] for v, s in zip(m, stats)], alpha=0.15)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    for ax in flat[len(panels) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("success rate")
    for ax in flat:  # one legend per panel: panels may hold different runs (and so colours)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
