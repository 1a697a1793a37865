"""EnvPool throughput: the same episodes stepped in this process and in W worker processes.

Each side resets ``--envs`` environments and plays ``--turns`` turns of every one with seeded
random admissible actions (the same actions on both sides: they are drawn from the observations,
which the pool reproduces exactly), timing resets and steps together. The workers' share of the
calls runs in parallel, so slow environments (ALFWorld: a reset re-plans the PDDL problem, a step
costs ~25 ms) gain up to the number of cores; the embedded ones (microseconds a step) lose to the
process hop, which is why ``rollout.env_workers`` defaults to 0.

    python benchmarks/env_pool.py --env household
    python benchmarks/env_pool.py --env alfworld --envs 16 --turns 10 --workers 2

The last line is ``pool_speedup: <in-process seconds / worker seconds>``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rspo_lightning.envs.pool import EnvFault, EnvPool

ROOT = Path(__file__).resolve().parents[1]


def alfworld_data() -> str:
    """Make the repository's fixture ALFWorld games playable (as tests/test_alfworld.py does)."""
    root = Path(tempfile.mkdtemp(prefix="alfworld_bench_"))
    package = Path(importlib.util.find_spec("alfworld").submodule_search_locations[0])
    script = Path(sys.executable).parent / "alfworld-generate"
    script = str(script) if script.is_file() else shutil.which("alfworld-generate")
    cmd = [
        sys.executable,
        script,
        "--data_path",
        str(ROOT / "tests" / "fixtures" / "alfworld" / "json_2.1.1"),
        "--save_path",
        str(root / "json_2.1.1"),
        "--domain",
        str(package / "data" / "alfred.pddl"),
        "--grammar",
        str(package / "data" / "alfred.twl2"),
        "--expert_type",
        "planner",
        "--end",
        "1000000",
    ]
    subprocess.run(cmd, env={**os.environ, "ALFWORLD_DATA": str(root)}, check=True, capture_output=True, timeout=600)
    return str(root)


def play(pool: EnvPool, n: int, turns: int, splits: list[str], games: int, seed: int) -> tuple[float, int, list[str]]:
    """Seconds, env calls and a fingerprint of what was seen."""
    rng = random.Random(seed)
    pool.ensure(n)
    t0 = time.perf_counter()
    results = pool.reset(
        [(i, {"split": splits[i % len(splits)], "task_id": (i // len(splits)) % games}) for i in range(n)]
    )
    calls, seen, infos = n, [], {}
    for i, r in enumerate(results):
        if isinstance(r, EnvFault):
            raise RuntimeError(f"env {i} failed to reset: {r}")
        seen.append(r[0][:40])
        infos[i] = r[1]
    for _ in range(turns):
        live = sorted(infos)
        if not live:
            break
        actions = [(i, rng.choice(infos[i]["admissible_actions"])) for i in live]
        for (i, _), r in zip(actions, pool.step(actions)):
            if isinstance(r, EnvFault):
                raise RuntimeError(f"env {i} failed: {r}")
            seen.append(r[0][:40])
            infos[i] = r[4]
            if r[2] or r[3]:
                del infos[i]
        calls += len(actions)
    return time.perf_counter() - t0, calls, seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=["household", "alfworld"], default="household")
    p.add_argument("--envs", type=int, default=64)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.env == "household":
        env_id, kwargs, splits, games = "rspo/Household-v0", {"max_steps": 50}, ["train"], 10**6
    else:
        env_id, splits, games = (
            "rspo/ALFWorld-v0",
            ["train", "valid_seen", "valid_unseen"],
            1,
        )  # one fixture game per split
        kwargs = {"data_dir": alfworld_data(), "split": "train", "max_steps": 50}
    results = {}
    for workers in (0, args.workers):
        with EnvPool(env_id, kwargs, num_workers=workers, timeout_s=None) as pool:
            pool.ensure(args.envs)  # workers started and envs built before the clock starts
            seconds, calls, seen = play(pool, args.envs, args.turns, splits, games, args.seed)
        results[workers] = (seconds, calls, seen)
        print(f"{env_id} workers={workers}: {calls} calls in {seconds:.2f} s = {calls / seconds:,.0f} calls/s")
    same = results[0][2] == results[args.workers][2]
    print(f"identical observations on both sides: {same}")
    if not same:
        raise SystemExit("the worker pool saw different observations than the in-process envs")
    print(f"pool_speedup: {results[0][0] / results[args.workers][0]:.2f}")


if __name__ == "__main__":
    main()
