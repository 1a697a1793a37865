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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _runs import ROOT, commit, fit_job, fmt, mean_std, parse_seeds, read_events

CONFIG = "configs/quickstart.yaml"
RECORDS = ROOT / "docs" / "data" / "quickstart_sweep"

# every variant runs on the prompt the sweep started from (compact; the config ships compact_near
# since 2026-12-03, measured here as "near") and without copy_init (shipped since 2026-12-04), so the
# records stay comparable
COMMON = ("--model.rollout.template=compact", "--model.policy.tiny.copy_init=false")
# name -> CLI overrides on top of configs/quickstart.yaml and COMMON ("base": COMMON alone)
VARIANTS: dict[str, tuple[str, ...]] = {
    "base": (),
    "h256": ("--model.policy.tiny={hidden_size: 256, num_layers: 2, num_heads: 4, intermediate_size: 512}",),
    "ent01": ("--model.algorithm.entropy_coef=0.01",),  # an entropy bonus against the collapse to ~0.06 nats
    "cliphigh": ("--model.algorithm.clip_eps_high=0.28",),  # DAPO's clip-higher: low-probability actions can rise
    "hist4": ("--model.rollout.history_window=4",),  # against loops between receptacles: more of the episode shown
    # the same 128 episodes an iteration as 8 tasks x 16: a near-deterministic policy that fails a task
    # is more likely to win one of 16 samples, so fewer groups are all-fail (no GRPO signal)
    "group16": ("--data.groups_per_iteration=8", "--data.group_size=16"),
    # the task next to the admissible actions: the failures are copy failures (a wrong object or goal chosen)
    "near": ("--model.rollout.template=compact_near",),
    # capacity for the copy circuits: twice the heads of half the width (the same FLOPs, 1.3x the time measured)
    "heads8": ("--model.policy.tiny={hidden_size: 128, num_layers: 2, num_heads: 8, intermediate_size: 256}",),
    # a third layer (previous-token, match and copy steps; benchmarks/grounding.py names the skill)
    "l3": ("--model.policy.tiny={hidden_size: 128, num_layers: 3, num_heads: 4, intermediate_size: 256}",),
    # the shipped prompt with GiGPO's step groups (compare/gigpo.yaml's settings): episodes of a group standing
    # at the same receptacle with the same objects are compared there, so "take the target" is credited per turn
    "gigpo_near": (
        "--model.rollout.template=compact_near",
        "--model.algorithm.estimator=gigpo",
        '--model.algorithm.estimator_kwargs={"gamma": 0.95, "omega": 1.0, "norm": "mean", "episode_stats": "steps"}',
    ),
}
HEADER = "| variant | seeds | end valid_seen per seed | end valid_seen | end valid_unseen | best valid_seen | s / iteration |"


def _avg(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 3) if xs else float("nan")


def record(variant: str, seed: int, run_dir: Path) -> dict:
    """The tracked summary of one finished run, read from its TensorBoard events."""
    ev = read_events(run_dir)
    s = ev["series"]

    def curve(tag: str) -> list[list[float]]:
        return [[step, round(v, 4)] for step, v in sorted(s.get(tag, {}).items())]

    seen, unseen = curve("val/success_rate"), curve("val_unseen/success_rate")
    train = [v for _, v in curve("rollout/success_rate")]
    entropy = [v for _, v in curve("train/entropy")]
    return {
        "variant": variant,
        "seed": seed,
        "overrides": list(VARIANTS[variant]),
        "common": list(COMMON),  # applied before the overrides (records made before 2026-12-03 lack the key)
        "commit": commit(),
        "valid_seen": seen,
        "valid_unseen": unseen,
        "end_seen": seen[-1][1] if seen else None,
        "end_unseen": unseen[-1][1] if unseen else None,
        "best_seen": max(v for _, v in seen) if seen else None,
        "train_success_last10": _avg(train[-10:]),
        "entropy_first10": _avg(entropy[:10]),  # nats per response token
        "entropy_last10": _avg(entropy[-10:]),
        "rollout_s": _avg(list(s.get("perf/rollout_s", {}).values())),
        "update_s": _avg(list(s.get("perf/update_s", {}).values())),
        "wall_s": round(ev["wall_s"]) if ev["wall_s"] == ev["wall_s"] else None,  # NaN: not run by fit_job
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

        per_seed = ", ".join(f"{r['seed']}: {r['end_seen']:.3f}" for r in recs)
        rows.append(
            f"| {vdir.name} | {len(recs)} | {per_seed} | {fmt(seen)} | {fmt(unseen)} | {fmt(best)} | {mean_std(it_s)[0]:.1f} |"
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
    p.add_argument(
        "--checkpoints",
        action="store_true",
        help="keep each run's checkpoints in <runs>/<variant>/seed<k>/checkpoints (for predict and benchmarks/grounding.py)",
    )
    args = p.parse_args()
    records = Path(args.records)
    if not args.summarise_only:
        jobs = []
        for item in args.plan:
            names, _, seeds = item.partition(":")
            try:
                seed_list = parse_seeds(seeds)
            except ValueError:
                raise SystemExit(
                    f"--plan entry {item!r}: expected VARIANT[,VARIANT...]:SEEDS, e.g. base,hist4:0-2"
                ) from None
            for name in names.split(","):
                if name not in VARIANTS:
                    raise SystemExit(f"unknown variant {name!r}; choose from {sorted(VARIANTS)}")
                jobs += [(name, s) for s in seed_list if not (records / name / f"seed{s}.json").exists()]

        def one(job: tuple[str, int]) -> None:
            name, seed = job
            keep = Path(args.runs) / name / f"seed{seed}" / "checkpoints"
            extra = ["--trainer.enable_checkpointing=true", f"--checkpoint.dirpath={keep}"] if args.checkpoints else []
            run_dir = fit_job(name, CONFIG, seed, [*COMMON, *VARIANTS[name], *extra], args.runs, threads=args.threads)
            out = records / name / f"seed{seed}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record(name, seed, run_dir), indent=1) + "\n")
            print(f"record {out}", flush=True)

        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(one, jobs))
    print(summarise(records))


if __name__ == "__main__":
    main()
