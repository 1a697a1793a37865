"""Where should RSPO's mechanism matter? GRPO, shaped GRPO and RSPO variants at EQUAL environment
steps (B's exploration and collection steps counted), in a hard-exploration Household setting and
in the quickstart setting.

    pip install -e ".[bench]"
    python benchmarks/rspo_study.py --seeds 0 1 2 --budget 40000 --jobs 2

Every run stops at the first iteration whose cumulative environment steps reach ``--budget``
(``EnvStepBudget``), then validates (RSPO: agent A's weights) on 64 + 64 held-out tasks.
Validation also runs every 3 iterations (base runs) or after each RSPO loop, for the curves.
Writes ``<out>.md``, ``<out>.png`` and ``<out>.json`` (one record per run and seed:
``{"setting", "run", "seed", "env_steps", "valid_seen", "valid_unseen"}``); the last line printed
is ``rspo_minus_best_rival_hard: <points>``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _runs import fmt, mean_std, plot_curves, read_events, run_all

# The hard setting: 8 receptacles, 2 distractors, 15 steps. A uniformly random admissible policy
# wins 1.3 % of 300 episodes (mean final progress 0.06); the tiny model's GRPO starts at ~3 %
# training success with most groups all-fail.
HARD = {"task_types": ["pick_and_place"], "num_receptacles": 8, "num_distractors": 2, "num_object_types": 8,
        "max_steps": 15, "info_actions": False}
QUICK = {"task_types": ["pick_and_place"], "num_receptacles": 4, "num_distractors": 1, "num_object_types": 8,
         "max_steps": 10, "info_actions": False}
PROGRESS = "rspo_lightning.rewards.EnvProgressReward"
SHAPED_SCALE = 10  # the dense return (progress, at most 1 per episode) on the scale of the success reward (10)

# name: (config, is_rspo, extra CLI arguments)
RUNS = {
    "grpo": ("configs/compare/grpo.yaml", False, []),
    "grpo_shaped": ("configs/compare/grpo.yaml", False,
                    ["--data.reward_mode=outcome+dense", f"--data.dense_scale={SHAPED_SCALE}", f"--model.dense_reward={PROGRESS}"]),
    "grpo_rspo": ("configs/compare/grpo_rspo.yaml", True, []),
    "grpo_rspo_h": ("configs/compare/grpo_rspo.yaml", True, ["--trainer.callbacks.replay_from=history"]),
    "grpo_rspo_o": ("configs/compare/grpo_rspo.yaml", True, ["--trainer.callbacks.explorer_reward=outcome"]),
    # ablations of this study's defaults (one seed unless asked)
    "grpo_rspo_mixed": ("configs/compare/grpo_rspo.yaml", True,
                        ["--trainer.callbacks.explorer_reward=outcome+dense", f"--trainer.callbacks.dense_scale={SHAPED_SCALE}"]),
    "grpo_rspo_group": ("configs/compare/grpo_rspo.yaml", True, ["--trainer.callbacks.replay_unit=group"]),
    "grpo_rspo_tokens": ("configs/compare/grpo_rspo.yaml", True, ["--trainer.callbacks.offline_weighting=tokens"]),
    "grpo_rspo_online": ("configs/compare/grpo_rspo.yaml", True, ["--trainer.callbacks.replay_baseline=online"]),
}
MAIN = ["grpo", "grpo_shaped", "grpo_rspo", "grpo_rspo_h", "grpo_rspo_o"]
DIAGNOSTICS = {  # table column: TensorBoard tag (mean over the iterations that log it)
    "repeat A": "rspo/repeat_visits_A", "repeat B": "rspo/repeat_visits_B",
    "A train success": "rollout/success_rate", "B train success": "rollout_b/success_rate",
    "A progress": "rollout/progress", "B progress": "rollout_b/progress",
    "replay row share": "rspo/replay_frac", "replay token share": "rspo/replay_token_share",
    "replay |adv|": "rspo/replay_adv_abs", "replay zero frac": "rspo/replay_zero_frac",
}


def summarise(run_dir: Path) -> dict:
    s = read_events(run_dir)["series"]
    env = {0: 0.0, **s.get("rollout/env_steps", {})}
    out = {"curves": {}}
    for tag in ("val/success_rate", "val_unseen/success_rate"):
        out["curves"][tag] = [(env.get(step, float("nan")), v) for step, v in sorted(s.get(tag, {}).items())]
    out["env_steps"] = max(env.values())
    out["diag"] = {col: (sum(d.values()) / len(d) if (d := s.get(tag)) else float("nan")) for col, tag in DIAGNOSTICS.items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--budget", type=int, default=40000, help="environment steps per run (hard setting)")
    p.add_argument("--quick-budget", type=int, default=15000, help="environment steps per run (quickstart setting)")
    p.add_argument("--runs", nargs="*", default=MAIN, help=f"runs of the hard setting, all seeds (of {list(RUNS)})")
    p.add_argument("--ablations", nargs="*", default=["grpo_rspo_mixed", "grpo_rspo_group"], help="hard-setting runs, first seed only")
    p.add_argument("--quick-runs", nargs="*", default=["grpo", "grpo_rspo"], help="quickstart-setting runs, all seeds")
    p.add_argument("--val-tasks", type=int, default=64)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-runs", default="runs/rspo_study")
    p.add_argument("--out", default="docs/rspo_study")
    p.add_argument("--summarise-only", action="store_true", help="run nothing: summarise the runs already finished")
    args = p.parse_args()

    def job(setting, name, seed):
        config, is_rspo, extra = RUNS[name]
        env, budget = (HARD, args.budget) if setting == "hard" else (QUICK, args.quick_budget)
        per_epoch = [] if is_rspo else ["--data.iterations_per_epoch=3"]
        return (f"{setting}/{name}", config, seed,
                [*extra, f"--data.env.kwargs={json.dumps(env)}", "--trainer.max_epochs=1000", *per_epoch,
                 f"--data.num_val_tasks={args.val_tasks}", "--trainer.callbacks+=rspo_lightning.callbacks.EnvStepBudget",
                 f"--trainer.callbacks.max_env_steps={budget}"], args.out_runs, args.threads)

    plan = [("hard", n, s) for s in args.seeds for n in args.runs]
    plan += [("quickstart", n, s) for s in args.seeds for n in args.quick_runs]
    plan += [("hard", n, args.seeds[0]) for n in args.ablations]
    if args.summarise_only:
        plan = [x for x in plan if (Path(args.out_runs) / f"{x[0]}/{x[1]}" / f"seed{x[2]}" / "done.json").exists()]
        dirs = [Path(args.out_runs) / f"{x[0]}/{x[1]}" / f"seed{x[2]}" for x in plan]
    else:
        t0 = time.time()
        dirs = run_all([job(*x) for x in plan], args.jobs)
        print(f"wall time of the runs: {time.time() - t0:.0f} s")

    records, res = [], {}
    for (setting, name, seed), d in zip(plan, dirs):
        r = summarise(d)
        res.setdefault((setting, name), []).append(r)
        records.append({"setting": setting, "run": name, "seed": seed, "env_steps": int(r["env_steps"]),
                        "valid_seen": r["curves"]["val/success_rate"][-1][1],
                        "valid_unseen": r["curves"]["val_unseen/success_rate"][-1][1]})
    Path(args.out + ".json").write_text(json.dumps(records, indent=1) + "\n")

    lines = [f"Budgets: {args.budget} environment steps (hard), {args.quick_budget} (quickstart), B's counted; seeds "
             f"{args.seeds} (ablations: seed {args.seeds[0]}); {args.val_tasks} validation tasks per split. "
             "Final = the validation after the iteration that crossed the budget (mean ± std over seeds).", ""]
    cols = list(DIAGNOSTICS)
    lines += ["| setting | run | seeds | env steps | valid_seen | valid_unseen | " + " | ".join(cols) + " |",
              "|" + "---|" * (6 + len(cols))]
    finals = {}
    for (setting, name), rs in res.items():
        seen = [r["curves"]["val/success_rate"][-1][1] for r in rs]
        unseen = [r["curves"]["val_unseen/success_rate"][-1][1] for r in rs]
        finals[(setting, name)] = mean_std(seen)[0]
        diag = [mean_std([r["diag"][c] for r in rs])[0] for c in cols]
        lines.append(f"| {setting} | {name} | {len(rs)} | {mean_std([r['env_steps'] for r in rs])[0]:.0f} | {fmt(seen)} | "
                     f"{fmt(unseen)} | " + " | ".join("–" if v != v else f"{v:.3f}" for v in diag) + " |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    def panel(setting, tag, title):
        return (title, "environment steps (B's included)",
                {name: [r["curves"][tag] for r in rs] for (st, name), rs in res.items() if st == setting and len(rs) > 1})

    plot_curves(args.out + ".png", [panel("hard", "val/success_rate", "hard: valid_seen"),
                                    panel("hard", "val_unseen/success_rate", "hard: valid_unseen"),
                                    panel("quickstart", "val/success_rate", "quickstart: valid_seen")])
    rivals = [finals[("hard", n)] for n in ("grpo", "grpo_shaped") if ("hard", n) in finals]
    if ("hard", "grpo_rspo") in finals and rivals:
        print(f"rspo_minus_best_rival_hard: {100 * (finals[('hard', 'grpo_rspo')] - max(rivals)):+.1f}")


if __name__ == "__main__":
    main()
