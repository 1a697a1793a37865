"""Does RSPO help? GRPO vs RSPO+GRPO and GiGPO vs RSPO+GiGPO on the embedded Household env.

Every run gets the same number of agent-A iterations (``--a-iterations``, a multiple of k = 3):
a base run is that many iterations (validated every 3); an RSPO run is that many loops' worth of
3 explore (B) + 1 collect + 3 exploit (A) iterations, validated after each loop (A's weights).
Environment steps include B's. A last run trains GRPO on the dense reward alone (outcome reward
0) to check for reward hacking: dense return vs true success.

    pip install -e ".[bench]"
    python benchmarks/rspo_vs_base.py --seeds 0 1 2 --a-iterations 12 --jobs 2

Writes ``<out>.md`` and ``<out>.png``; the last line is ``rspo_gain_grpo: <points>``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _runs import fmt, mean_std, plot_curves, read_events, run_all

K = 3  # the configs' RSPOLoop k
VARIANTS = {  # name: (config, is_rspo)
    "grpo": ("configs/compare/grpo.yaml", False),
    "grpo_rspo": ("configs/compare/grpo_rspo.yaml", True),
    "gigpo": ("configs/compare/gigpo.yaml", False),
    "gigpo_rspo": ("configs/compare/gigpo_rspo.yaml", True),
}
DENSE_ONLY_ENV = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 10,
    "info_actions": False,
    "success_reward": 0.0,
}


def curves(run_dir: Path, is_rspo: bool) -> dict:
    s = read_events(run_dir)["series"]
    a_its = {0: 0.0, **s.get("rspo/a_iterations", {})} if is_rspo else None
    env = {0: 0.0, **s.get("rollout/env_steps", {})}
    out = {}
    for tag in ("val/success_rate", "val_unseen/success_rate"):
        pts = sorted(s.get(tag, {}).items())
        out[tag] = [
            ((a_its.get(step, float("nan")) if is_rspo else step), env.get(step, float("nan")), v) for step, v in pts
        ]
    out["repeat_A"] = _mean(s.get("rspo/repeat_visits_A", {}))
    out["repeat_B"] = _mean(s.get("rspo/repeat_visits_B", {}))
    out["rollout_b_success"] = _mean(s.get("rollout_b/success_rate", {}))
    out["dense_return"] = s.get("rollout/dense_return", {})
    return out


def _mean(d: dict) -> float:
    return sum(d.values()) / len(d) if d else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--a-iterations", type=int, default=12, help="agent-A iterations of every run (multiple of 3)")
    p.add_argument("--val-tasks", type=int, default=64)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", default="runs/rspo_vs_base")
    p.add_argument("--out", default="docs/rspo_vs_base")
    args = p.parse_args()
    if args.a_iterations % K:
        raise SystemExit(f"--a-iterations must be a multiple of k = {K}, got {args.a_iterations}")
    loops = args.a_iterations // K
    common = [f"--data.num_val_tasks={args.val_tasks}"]
    jobs = []
    for seed in args.seeds:
        for name, (config, is_rspo) in VARIANTS.items():
            extra = (
                [f"--trainer.max_epochs={loops}"]
                if is_rspo
                else [f"--trainer.max_epochs={loops}", f"--data.iterations_per_epoch={K}"]
            )
            jobs.append((name, config, seed, extra + common, args.runs, args.threads))
    dense_extra = [
        f"--trainer.max_epochs={loops}",
        f"--data.iterations_per_epoch={K}",
        "--data.reward_mode=dense",
        "--model.dense_reward=rspo_lightning.rewards.EnvProgressReward",
        f"--data.env.kwargs={json.dumps(DENSE_ONLY_ENV)}",
    ]
    jobs.append(
        ("dense_only", "configs/compare/grpo.yaml", args.seeds[0], dense_extra + common, args.runs, args.threads)
    )
    t0 = time.time()
    dirs = run_all(jobs, args.jobs)
    print(f"wall time of the runs: {time.time() - t0:.0f} s")

    res: dict[str, list[dict]] = {}
    for job, d in zip(jobs, dirs):
        res.setdefault(job[0], []).append(curves(d, VARIANTS.get(job[0], ("", False))[1]))
    lines = [
        f"{args.a_iterations} agent-A iterations per run (k = {K}); seeds {args.seeds}; {args.val_tasks} validation tasks per split. "
        "Final = validation after the last A iteration (mean ± std over seeds).",
        "",
        "| run | valid_seen | valid_unseen | env steps (B's included) | repeated-anchor rate A / B | B's training success |",
        "|---|---|---|---|---|---|",
    ]
    finals = {}
    for name in VARIANTS:
        rs = res[name]
        seen = [r["val/success_rate"][-1][2] for r in rs]
        unseen = [r["val_unseen/success_rate"][-1][2] for r in rs]
        steps = mean_std([r["val/success_rate"][-1][1] for r in rs])[0]
        finals[name] = (mean_std(seen)[0], mean_std(unseen)[0])
        rep = (
            f"{mean_std([r['repeat_A'] for r in rs])[0]:.3f} / {mean_std([r['repeat_B'] for r in rs])[0]:.3f}"
            if VARIANTS[name][1]
            else "–"
        )
        bsucc = f"{mean_std([r['rollout_b_success'] for r in rs])[0]:.3f}" if VARIANTS[name][1] else "–"
        lines.append(f"| {name} | {fmt(seen)} | {fmt(unseen)} | {steps:.0f} | {rep} | {bsucc} |")
    lines.append("")
    for base in ("grpo", "gigpo"):
        d_seen = 100 * (finals[f"{base}_rspo"][0] - finals[base][0])
        d_unseen = 100 * (finals[f"{base}_rspo"][1] - finals[base][1])
        lines.append(f"- RSPO + {base}: {d_seen:+.1f} points valid_seen, {d_unseen:+.1f} points valid_unseen")
    dense = res["dense_only"][0]
    dense_ret = sorted(dense["dense_return"].items())
    lines += [
        "",
        "Reward-hacking check (GRPO on the dense progress reward alone, outcome reward 0, seed "
        f"{args.seeds[0]}): validation success by iteration "
        + ", ".join(f"{int(x)}: {v:.3f}" for x, _, v in dense["val/success_rate"])
        + "; training dense return (mean of 3 iterations) "
        + ", ".join(
            f"{dense_ret[i][0]}: {mean_std([v for _, v in dense_ret[i : i + 3]])[0]:.3f}"
            for i in range(0, len(dense_ret), 3)
        ),
    ]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    names = list(VARIANTS)
    panels = [
        (
            "valid_seen success vs agent-A iterations",
            "agent-A iterations",
            {n: [[(a, v) for a, _, v in r["val/success_rate"]] for r in res[n]] for n in names},
        ),
        (
            "valid_seen success vs environment steps (B's included)",
            "environment steps",
            {n: [[(e, v) for _, e, v in r["val/success_rate"]] for r in res[n]] for n in names},
        ),
        (
            "valid_unseen success vs agent-A iterations",
            "agent-A iterations",
            {n: [[(a, v) for a, _, v in r["val_unseen/success_rate"]] for r in res[n]] for n in names},
        ),
    ]
    plot_curves(args.out + ".png", panels)
    print(f"rspo_gain_grpo: {100 * (finals['grpo_rspo'][0] - finals['grpo'][0]):+.1f}")


if __name__ == "__main__":
    main()
