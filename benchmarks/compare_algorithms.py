"""Side-by-side learning curves of the advantage estimators on the embedded Household env.

Each (algorithm, seed) is one ``rspo-lightning fit --config configs/compare/<algorithm>.yaml``
run, stopped by ``EnvStepBudget`` after the same number of environment steps, validated every
10 iterations and once more at the stop. Runs go ``--jobs`` at a time, one torch thread each;
a finished run (its ``done.json``) is not run again, so the script can be resumed. Then it
reads the TensorBoard events and writes ``<out>.md`` (final valid_seen / valid_unseen success
per task type, mean ± std over seeds; time per iteration; estimator time) and ``<out>.png``
(success vs environment steps).

    pip install -e ".[bench]"
    python benchmarks/compare_algorithms.py --seeds 0 1 2 --env-steps 24000 --jobs 2

The last line printed is ``estimator_overhead_max: <percent of the iteration>``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ["grpo", "rloo", "ppo", "gigpo", "proxmo", "a2tgpo"]
PAPER = {"grpo": 72.8, "gigpo": 86.1, "proxmo": 90.6, "ppo": 54.4}  # ALFWorld, Qwen2.5-1.5B, as reported


def run_one(alg: str, seed: int, args) -> Path:
    run_dir = Path(args.runs) / alg / f"seed{seed}"
    if (run_dir / "done.json").exists():
        return run_dir
    cmd = [sys.executable, "-m", "rspo_lightning.cli", "fit", "--config", str(ROOT / "configs" / "compare" / f"{alg}.yaml"),
           f"--seed_everything={seed}", f"--model.seed={seed}", f"--data.seed={seed}",
           "--trainer.max_epochs=1000", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
           f"--trainer.logger.init_args.save_dir={args.runs}", f"--trainer.logger.init_args.name={alg}",
           f"--trainer.logger.init_args.version=seed{seed}",
           "--trainer.callbacks+=rspo_lightning.callbacks.EnvStepBudget", f"--trainer.callbacks.max_env_steps={args.env_steps}",
           f"--data.num_val_tasks={args.val_tasks}", *args.extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(run_dir / "stdout.log", "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise RuntimeError(f"{alg} seed {seed} failed (exit {rc}); see {run_dir / 'stdout.log'}")
    (run_dir / "done.json").write_text(json.dumps({"wall_s": time.time() - t0, "cmd": cmd}))
    print(f"done {alg} seed {seed} in {time.time() - t0:.0f} s", flush=True)
    return run_dir


def read_run(run_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])

    def series(tag):
        return {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}

    env_steps = {0: 0.0, **series("rollout/env_steps")}
    out = {"val": {}, "env_steps": env_steps, "wall_s": json.loads((run_dir / "done.json").read_text())["wall_s"]}
    for tag in tags:
        if tag.startswith(("val/success_rate", "val_unseen/success_rate")):
            out["val"][tag] = series(tag)
    for tag in ("perf/rollout_s", "perf/update_s", "perf/advantage_s"):
        values = list(series(tag).values())
        out[tag] = sum(values) / max(len(values), 1)
    out["iterations"] = max(env_steps)
    out["total_env_steps"] = env_steps[out["iterations"]]
    return out


def mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def write_report(results: dict[str, list[dict]], args) -> float:
    algs = [a for a in args.algorithms if results.get(a)]
    final_tags = sorted({t for a in algs for r in results[a] for t in r["val"]},
                        key=lambda t: (not t.startswith("val/"), t.count("/"), t))
    lines = [f"Budget: {args.env_steps} environment steps per run; seeds {args.seeds}; {args.val_tasks} validation tasks per split; "
             f"{args.jobs} runs at a time, {args.threads} torch thread(s) each.", "",
             "| algorithm | " + " | ".join(f"`{t}`" for t in final_tags) + " | iterations | env steps | s / iteration | estimator ms / iteration (% of iteration) |",
             "|---" * (len(final_tags) + 5) + "|"]
    grpo_adv = None
    overheads = {}
    for a in algs:
        rs = results[a]
        cells = []
        for t in final_tags:
            finals = [r["val"][t][max(r["val"][t])] for r in rs if r["val"].get(t)]
            m, s = mean_std(finals) if finals else (float("nan"), 0.0)
            cells.append(f"{m:.3f} ± {s:.3f}")
        it_s = mean_std([r["perf/rollout_s"] + r["perf/update_s"] for r in rs])[0]
        adv_s = mean_std([r["perf/advantage_s"] for r in rs])[0]
        if a == "grpo":
            grpo_adv = adv_s
        overheads[a] = (adv_s, it_s)
        iters = mean_std([r["iterations"] for r in rs])[0]
        steps = mean_std([r["total_env_steps"] for r in rs])[0]
        lines.append(f"| {a} | " + " | ".join(cells) + f" | {iters:.1f} | {steps:.0f} | {it_s:.2f} | {1000 * adv_s:.2f} ({100 * adv_s / it_s:.3f}%) |")
    lines += ["", "Estimator time added relative to GRPO (estimator ms − GRPO's estimator ms, as % of the estimator's own iteration time):", ""]
    worst = 0.0
    for a, (adv_s, it_s) in overheads.items():
        if grpo_adv is None or a == "grpo":
            continue
        pct = 100 * (adv_s - grpo_adv) / it_s
        worst = max(worst, pct)
        lines.append(f"- {a}: {1000 * (adv_s - grpo_adv):+.2f} ms = {pct:+.3f}% of {it_s:.2f} s")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(results, algs, args)
    return worst


def plot(results, algs, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, tag, title in zip(axes, ["val/success_rate", "val_unseen/success_rate"], ["valid_seen", "valid_unseen"]):
        for a in algs:
            curves = []
            for r in results[a]:
                pts = sorted(r["val"].get(tag, {}).items())
                curves.append([(r["env_steps"].get(step, float("nan")), v) for step, v in pts])
            n = min(len(c) for c in curves)
            xs = [sum(c[i][0] for c in curves) / len(curves) for i in range(n)]
            stats = [mean_std([c[i][1] for c in curves]) for i in range(n)]
            m = [s[0] for s in stats]
            ax.plot(xs, m, marker="o", ms=3, label=a)
            ax.fill_between(xs, [x - s[1] for x, s in zip(m, stats)], [x + s[1] for x, s in zip(m, stats)], alpha=0.15)
        ax.set_title(f"{title} success (mean ± std, {len(args.seeds)} seeds)")
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--env-steps", type=int, default=24000, help="environment-step budget of every run")
    p.add_argument("--val-tasks", type=int, default=64, help="validation tasks per split")
    p.add_argument("--jobs", type=int, default=2, help="runs at the same time")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--runs", default="runs/compare", help="TensorBoard directory of the runs")
    p.add_argument("--out", default="docs/compare_algorithms", help="report path without extension (.md and .png)")
    p.add_argument("extra", nargs="*", help="extra `fit` arguments passed to every run, after --")
    args = p.parse_args()
    pairs = [(a, s) for s in args.seeds for a in args.algorithms]
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        dirs = list(pool.map(lambda pair: run_one(*pair, args), pairs))
    results: dict[str, list[dict]] = {}
    for (a, _), d in zip(pairs, dirs):
        results.setdefault(a, []).append(read_run(d))
    print(f"wall time of the runs: {time.time() - t0:.0f} s")
    worst = write_report(results, args)
    print(f"estimator_overhead_max: {worst:.3f}%")


if __name__ == "__main__":
    main()
