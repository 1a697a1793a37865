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
import time
from pathlib import Path

from _runs import fmt, mean_std, plot_curves, read_events, run_all

ALGORITHMS = ["grpo", "rloo", "ppo", "gigpo", "proxmo", "a2tgpo"]


def summarise(run_dir: Path) -> dict:
    series = read_events(run_dir)["series"]
    env_steps = {0: 0.0, **series.get("rollout/env_steps", {})}
    out = {
        "val": {t: v for t, v in series.items() if t.startswith(("val/success_rate", "val_unseen/success_rate"))},
        "env_steps": env_steps,
    }
    for tag in ("perf/rollout_s", "perf/update_s", "perf/advantage_s", "train/samples"):
        values = list(series.get(tag, {}).values())
        out[tag] = sum(values) / max(len(values), 1)
    out["iterations"] = max(env_steps)
    out["total_env_steps"] = env_steps[out["iterations"]]
    return out


def write_report(results: dict[str, list[dict]], args) -> float:
    algs = [a for a in args.algorithms if results.get(a)]
    final_tags = sorted(
        {t for a in algs for r in results[a] for t in r["val"]},
        key=lambda t: (not t.startswith("val/"), t.count("/"), t),
    )
    lines = [
        f"Budget: {args.env_steps} environment steps per run; seeds {args.seeds}; {args.val_tasks} validation tasks per split; "
        f"{args.jobs} runs at a time, {args.threads} torch thread(s) each. Final = validation at the budget's stop.",
        "",
        "| algorithm | "
        + " | ".join(f"`{t}`" for t in final_tags)
        + " | iterations | env steps | trained turns / iteration | s / iteration | estimator ms / iteration (% of iteration) |",
        "|---" * (len(final_tags) + 6) + "|",
    ]
    overheads = {}
    for a in algs:
        rs = results[a]
        cells = []
        for t in final_tags:
            finals = [r["val"][t][max(r["val"][t])] for r in rs if r["val"].get(t)]
            cells.append(fmt(finals) if finals else "–")
        it_s = mean_std([r["perf/rollout_s"] + r["perf/update_s"] for r in rs])[0]
        adv_s = mean_std([r["perf/advantage_s"] for r in rs])[0]
        overheads[a] = (adv_s, it_s)
        iters = mean_std([r["iterations"] for r in rs])[0]
        steps = mean_std([r["total_env_steps"] for r in rs])[0]
        rows = mean_std([r["train/samples"] for r in rs])[0]
        lines.append(
            f"| {a} | "
            + " | ".join(cells)
            + f" | {iters:.1f} | {steps:.0f} | {rows:.0f} | {it_s:.2f} | {1000 * adv_s:.2f} ({100 * adv_s / it_s:.3f}%) |"
        )
    lines += [
        "",
        "Estimator time added relative to GRPO (estimator ms − GRPO's estimator ms, as % of that algorithm's iteration):",
        "",
    ]
    worst = 0.0
    grpo_adv = overheads.get("grpo", (None,))[0]
    for a, (adv_s, it_s) in overheads.items():
        if grpo_adv is None or a == "grpo":
            continue
        pct = 100 * (adv_s - grpo_adv) / it_s
        worst = max(worst, pct)
        lines.append(f"- {a}: {1000 * (adv_s - grpo_adv):+.2f} ms = {pct:+.3f}% of {it_s:.2f} s")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    panels = []
    for tag, title in [("val/success_rate", "valid_seen"), ("val_unseen/success_rate", "valid_unseen")]:
        curves = {
            a: [
                [(r["env_steps"].get(step, float("nan")), v) for step, v in _regular(r["val"].get(tag, {}))]
                for r in results[a]
            ]
            for a in algs
        }
        panels.append((f"{title} success (mean ± std, {len(args.seeds)} seeds)", "environment steps", curves))
    plot_curves(args.out + ".png", panels)
    return worst


def _regular(points: dict) -> list:
    """Validation points every 10 iterations plus the one at the budget's stop; a scheduled point
    that falls just before the stop (e.g. 20 when the budget ends at 21) is left out, so every
    seed's curve has the same points and ends at its final value."""
    items = sorted(points.items())
    if len(items) >= 2 and items[-1][0] - items[-2][0] < 5:
        items.pop(-2)
    return items


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
    extra = [
        "--trainer.max_epochs=1000",
        "--trainer.callbacks+=rspo_lightning.callbacks.EnvStepBudget",
        f"--trainer.callbacks.max_env_steps={args.env_steps}",
        f"--data.num_val_tasks={args.val_tasks}",
        *args.extra,
    ]
    t0 = time.time()
    dirs = run_all([(a, f"configs/compare/{a}.yaml", s, extra, args.runs, args.threads) for a, s in pairs], args.jobs)
    results: dict[str, list[dict]] = {}
    for (a, _), d in zip(pairs, dirs):
        results.setdefault(a, []).append(summarise(d))
    print(f"wall time of the runs: {time.time() - t0:.0f} s")
    worst = write_report(results, args)
    print(f"estimator_overhead_max: {worst:.3f}%")


if __name__ == "__main__":
    main()
