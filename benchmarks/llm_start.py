"""Where the LLM study starts: the untrained policy of configs/llm/ and a uniformly random choice
among the admissible actions, on the same held-out tasks (default 256 valid_seen + 256
valid_unseen), each success rate with its 95 % Wilson interval.

    python benchmarks/llm_start.py                               # both, 256 + 256 tasks, 1 thread
    python benchmarks/llm_start.py --only random --tasks 512
    .nox/vllm/bin/python benchmarks/llm_start.py --tasks 64 --env num_receptacles=3 --only policy \
        --extra=--model.rollout.backend=vllm --record docs/data/llm_study/start_r3.json   # an easier setting

The policy is validated by ``rspo-lightning validate`` of the config (its ``val_temperature``,
``--seed_everything``); the record (JSON) names the command, the machine and the wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _runs import ROOT, thread_env

CONFIG = "configs/llm/smollm2_grpo.yaml"
SPLITS = ("valid_seen", "valid_unseen")


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a binomial proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def machine() -> dict:
    """What the numbers were measured on."""
    import torch

    return {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def env_kwargs(config: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / config).read_text())["data"]["env"]["kwargs"]


def random_policy(kwargs: dict, tasks: int, seed: int) -> dict:
    """Uniform over the admissible actions at every step, ``tasks`` tasks per split."""
    from rspo_lightning.envs import make_env

    env = make_env("rspo/Household-v0", **kwargs)
    rng = random.Random(seed)
    out = {}
    for split in SPLITS:
        wins, progress = 0, 0.0
        for task_id in range(tasks):
            _, info = env.reset(options={"split": split, "task_id": task_id})
            done = False
            while not done:
                _, _, terminated, truncated, info = env.step(rng.choice(info["admissible_actions"]))
                done = terminated or truncated
            wins += bool(info.get("won"))
            progress += float(info.get("progress", 0.0))
        out[split] = summary(wins, tasks, progress / tasks)
    return out


def summary(wins: int, n: int, progress: float | None = None) -> dict:
    low, high = wilson(wins, n)
    return {"wins": wins, "n": n, "success_rate": wins / n, "wilson95": [low, high], "progress": progress}


def policy(config: str, tasks: int, seed: int, threads: int, out: str, extra: list[str] = ()) -> dict:
    """``rspo-lightning validate`` of the untrained policy; success per split from its logged metrics."""
    cmd = [
        sys.executable,
        "-m",
        "rspo_lightning.cli",
        "validate",
        "--config",
        str(ROOT / config),
        f"--seed_everything={seed}",
        f"--data.num_val_tasks={tasks}",
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={out}",
        "--trainer.logger.init_args.name=start",
        *extra,
    ]
    env = thread_env(threads)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"validate failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = {}
    for events in Path(out).rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        acc.Reload()
        values.update({tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]})
    result = {"cmd": cmd, "wall_s": time.time() - t0, "threads": threads}
    for split, prefix in zip(SPLITS, ("val", "val_unseen")):
        rate = values[f"{prefix}/success_rate"]
        result[split] = summary(round(rate * tasks), tasks)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--tasks", type=int, default=256, help="held-out tasks per split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", choices=["random", "policy"], default=None)
    p.add_argument("--record", default="docs/data/llm_study/start.json")
    p.add_argument(
        "--env", nargs="*", default=[], metavar="KEY=VALUE", help="env kwargs over the config's (JSON values)"
    )
    p.add_argument("--extra", action="append", default=[], help="a CLI override for the policy's validate run")
    args = p.parse_args(argv)
    changes = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.env)}
    kwargs = {**env_kwargs(args.config), **changes}
    extra = [*args.extra, *([f"--data.env.kwargs={json.dumps(kwargs)}"] if changes else [])]
    record_path = ROOT / args.record
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    record.update({"config": args.config, "tasks_per_split": args.tasks, "seed": args.seed, "machine": machine()})
    record.update({"env_kwargs": kwargs, "extra": extra})
    if args.only in (None, "random"):
        record["random"] = random_policy(kwargs, args.tasks, args.seed)
        print("random", json.dumps(record["random"]), flush=True)
    if args.only in (None, "policy"):
        record["untrained"] = policy(
            args.config, args.tasks, args.seed, args.threads, tempfile.mkdtemp(prefix="llm_start_"), extra
        )
        print("untrained", json.dumps({s: record["untrained"][s] for s in SPLITS}), flush=True)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
