"""Soak test: a long tiny run with a fraction of environment calls faulting, against the same run
without faults.

Both runs train GRPO with a tiny policy on Household pick-and-place wrapped in
``rspo/Faulty-v0``; the faulty run makes ``--fault-rate`` of env steps (and resets) raise,
hang past ``rollout.env_timeout_s`` or return garbage. Reports iterations completed, episodes
played / lost, faults injected by kind, skipped optimizer steps, and final validation success
(validation episodes fault too; their faulty ones are not counted).

    python benchmarks/soak.py --iterations 200 --fault-rate 0.05
    python benchmarks/soak.py --iterations 40 --fault-rate 0.01 --env-workers 2 --modes raise hang garbage die

With ``--env-workers`` the envs run in worker processes and ``die`` (an env ending its process)
becomes possible; faults are then injected inside the workers and counted there, so the table
shows the errors caught and the worker restarts instead of the injected counts.

The last line is ``soak_completed: <iterations completed>/<iterations asked>``.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as pl
import torch

from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.envs.faults import FaultyEnv
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rollout import RolloutConfig

INNER = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 8,
    "info_actions": False,
}


def run(args, fault_rate: float) -> dict:
    torch.manual_seed(args.seed)
    env = EnvConfig(
        env_id="rspo/Faulty-v0",
        kwargs={
            "inner_id": "rspo/Household-v0",
            "inner_kwargs": INNER,
            "fault_rate": fault_rate,
            "on_reset": True,
            "modes": args.modes,
            "hang_s": args.hang_s,
            "seed": args.seed,
        },
    )
    module = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128)),
        algorithm=AlgorithmConfig(
            estimator="grpo", ppo_epochs=1, minibatch_size=64, recompute_old_logprobs=False, drop_zero_advantage=True
        ),
        optim=OptimConfig(lr=2e-3),
        rollout=RolloutConfig(
            constrained_decoding=True,
            max_new_tokens=12,
            template="compact",
            system_prompt="",
            env_timeout_s=args.timeout_s,
            env_workers=args.env_workers,
        ),
        seed=args.seed,
    )
    dm = AgentDataModule(
        env=env,
        groups_per_iteration=args.groups,
        group_size=args.group_size,
        iterations_per_epoch=args.iterations,
        val_splits=["valid_seen"],
        num_val_tasks=args.val_tasks,
        seed=args.seed,
    )
    before = dict(FaultyEnv.injected_total)
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=-1,
    )
    t0 = time.time()
    trainer.fit(module, dm)
    injected = {m: FaultyEnv.injected_total[m] - before[m] for m in before}
    return {
        "iterations": module.iteration,
        "episodes": module.iteration * args.groups * args.group_size,
        "dropped": module.episodes_dropped,
        "env_errors": module.engine.env_errors,
        "injected": injected,
        "skipped_steps": module.skipped_steps,
        "worker_restarts": module.engine.worker_restarts,
        "val_start": module.initial_val_metrics.get("val/success_rate", float("nan")),
        "val_end": float(trainer.callback_metrics.get("val/success_rate", float("nan"))),
        "wall_s": time.time() - t0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--fault-rate", type=float, default=0.05)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--val-tasks", type=int, default=64)
    p.add_argument("--hang-s", type=float, default=1.0, help="how long an injected hang lasts")
    p.add_argument("--timeout-s", type=float, default=0.25, help="rollout.env_timeout_s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--env-workers", type=int, default=0, help="rollout.env_workers (0 = envs in the trainer process)")
    p.add_argument(
        "--modes", nargs="+", default=["raise", "hang", "garbage"], help="fault kinds (die needs --env-workers)"
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    clean = run(args, 0.0)
    faulty = run(args, args.fault_rate)
    print(
        f"\n{args.iterations} iterations x {args.groups} groups x {args.group_size} episodes, fault rate {args.fault_rate} "
        f"of env steps and resets (raise / hang {args.hang_s} s vs timeout {args.timeout_s} s / garbage)\n"
    )
    print(f"env workers: {args.env_workers}, fault kinds: {' / '.join(args.modes)}\n")
    print(
        "| run | iterations | episodes played | episodes lost | faults injected (raise/hang/garbage/die) | env errors caught | worker restarts | skipped optimizer steps | val success start → end | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in (("fault-free", clean), (f"{args.fault_rate:.1%} faults", faulty)):
        inj = r["injected"]
        injected = (
            "/".join(str(inj[m]) for m in ("raise", "hang", "garbage", "die"))
            if not args.env_workers
            else "(in the workers)"
        )
        print(
            f"| {name} | {r['iterations']} | {r['episodes']} | {r['dropped']} | {injected} | "
            f"{r['env_errors']} | {r['worker_restarts']} | {r['skipped_steps']} | {r['val_start']:.3f} → {r['val_end']:.3f} | {r['wall_s']:.0f} |"
        )
    print(f"soak_completed: {faulty['iterations']}/{args.iterations}")


if __name__ == "__main__":
    main()
