"""Variants of ``configs/quickstart.yaml`` side by side, toward issue 21's quickstart goal (valid_seen
>= 0.6 at the end, in <= 15 min on 2 cores). Resumable: each finished run writes a small tracked
record ``<records>/<variant>/seed<k>.json`` (the validation curves, the end and best points, the
per-iteration times) and a run whose record exists is skipped.

    python benchmarks/quickstart_sweep.py --plan base,h256:0 --jobs 2
    python benchmarks/quickstart_sweep.py --summarise-only

Runs go two at a time with one thread each (``--jobs``), so their wall times are not the
quickstart's own on 2 cores: time a chosen variant alone (``--jobs 1 --threads 2``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from _runs import ROOT, fit_job, mean_std, read_events

CONFIG = "configs/quickstart.yaml"
RECORDS = ROOT / "docs" / "data" / "quickstart_sweep"

# name -> CLI overrides on top of configs/quickstart.yaml ("base" is the config as shipped)
VARIANTS: dict[str, tuple[str, ...]] = {
    "base": (),
    "h256": ("--model.policy.tiny={hidden_size: 256, num_layers: 2, num_heads: 4, intermediate_size: 512}",),
    "ent01": ("--model.algorithm.entropy_coef=0.01",),  # an entropy bonus against the collapse to ~0.06 nats
    "cliphigh": ("--model.algorithm.clip_eps_high=0.28",),  # DAPO's clip-higher: low-probability actions can rise
    "hist4": ("--model.rollout.history_window=4",),  # against loops between receptacles: more of the episode shown
}
HEADER = "| variant | seeds | end valid_seen per seed | end valid_seen | end valid_unseen | best valid_seen | s / iteration |"


def record(variant: str, seed: int, run_dir: Path) -> dict:
    """The tracked summary of one finished run, read from its TensorBoard events."""
    ev = read_events(run_dir)
    s = ev["series"]

    def curve(tag: str) -> list[list[float]]:
        return [[step, round(v, 4)] for step, v in sorted(s.get(tag, {}).items())]

    def mean(tag: str) -> float:
        v = list(s.get(tag, {}).values())
        return round(sum(v) / len(v), 3) if v else float("nan")

    seen, unseen = curve("val/success_rate"), curve("val_unseen/success_rate")
    train = [v for _, v in curve("rollout/success_rate")]
    entropy = [v for _, v in curve("train/entropy")]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {
        "variant": variant,
        "seed": seed,
        "overrides": list(VARIANTS[variant]),
        "commit": commit,
        "valid_seen": seen,
        "valid_unseen": unseen,
        "end_seen": seen[-1][1] if seen else None,
        "end_unseen": unseen[-1][1] if unseen else None,
        "best_seen": max(v for _, v in seen) if seen else None,
        "train_success_last10": round(sum(train[-10:]) / max(len(train[-10:]), 1), 3),
        "entropy_first10": round(sum(entropy[:10]) / max(len(entropy[:10]), 1), 3),  # nats per response token
        "entropy_last10": round(sum(entropy[-10:]) / max(len(entropy[-10:]), 1), 3),
        "rollout_s": mean("perf/rollout_s"),
        "update_s": mean("perf/update_s"),
        "wall_s": round(ev["wall_s"]),
    }


def summarise(records_dir: Path) -> str:
    """A markdown table: per variant, the end points per seed and their mean ± std."""
    rows = [HEADER, "|---|---|---|---|---|---|---|"]
    for vdir in sorted(p for p in records_dir.glob("*") if p.is_dir()):
        recs = [json.loads(f.read_text()) for f in sorted(vdir.glob("seed*.json"))]
        if not recs:
            continue
        seen = [r["end_seen"] for r in recs]
        unseen = [r["end_unseen"] for r in recs]
        best = [r["best_seen"] for r in recs]
        it_s = [r["rollout_s"] + r["update_s"] for r in recs]

        def ms(xs: list[float]) -> str:
            m, sd = mean_std(xs)
            return f"{m:.3f} ± {sd:.3f}"

        per_seed = ", ".join(f"{r['seed']}: {r['end_seen']:.3f}" for r in recs)
        rows.append(
            f"| {vdir.name} | {len(recs)} | {per_seed} | {ms(seen)} | {ms(unseen)} | {ms(best)} | {mean_std(it_s)[0]:.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", nargs="*", default=[], help="VARIANT[,VARIANT...]:SEEDS, SEEDS as 0-2 or 0,3")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--runs", default="runs/quickstart_sweep", help="TensorBoard runs (untracked)")
    p.add_argument("--records", default=str(RECORDS), help="tracked records")
    p.add_argument("--summarise-only", action="store_true")
    args = p.parse_args()
    records = Path(args.records)
    if not args.summarise_only:
        jobs = []
        for item in args.plan:
            names, seeds = item.split(":")
            if "-" in seeds:
                lo, hi = seeds.split("-")
                seed_list = list(range(int(lo), int(hi) + 1))
            else:
                seed_list = [int(x) for x in seeds.split(",")]
            for name in names.split(","):
                if name not in VARIANTS:
                    raise SystemExit(f"unknown variant {name!r}; choose from {sorted(VARIANTS)}")
                jobs += [(name, s) for s in seed_list if not (records / name / f"seed{s}.json").exists()]
        from concurrent.futures import ThreadPoolExecutor

        def one(job: tuple[str, int]) -> None:
            name, seed = job
            run_dir = fit_job(name, CONFIG, seed, list(VARIANTS[name]), args.runs, threads=args.threads)
            out = records / name / f"seed{seed}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record(name, seed, run_dir), indent=1) + "\n")
            print(f"record {out}", flush=True)

        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(one, jobs))
    print(summarise(records))


if __name__ == "__main__":
    main()
