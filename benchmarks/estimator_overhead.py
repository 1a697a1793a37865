"""Estimator overhead: time of each advantage estimator as a fraction of one RL iteration.

One real iteration is played and trained first: ``AgentRLModule.training_step`` outside a
Trainer (as in ``benchmarks/scaling.py``) on 16 groups x 8 = 128 episodes of Household
pick-and-place (8 receptacles) capped at 50 turns, with the untrained tiny quickstart policy
(constrained decoding; it rarely wins, so almost every episode runs all 50 turns), GRPO, one PPO
epoch over every turn sample in minibatches of 64. Its wall time (rollout + advantage + update)
is the denominator.

Then every estimator runs on that very batch of turns (the same per-turn tensors
``training_step`` builds) through ``rspo_lightning.credit.turn_advantages``, what
``AgentRLModule`` calls (invalid-action penalty included; dense rewards from
``EnvProgressReward`` for A²TGPO's signal; GAE's values are random numbers, since the critic's
forward is not the estimator's cost), ``--repeats`` times each; the median is divided by the
iteration's time. Target (issue 6): below 1 % of the iteration.

    python benchmarks/estimator_overhead.py      # ~2 min on 2 CPU cores, one torch thread
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from scaling import build_module, run_iteration

from rspo_lightning.advantages import ESTIMATORS
from rspo_lightning.batching import flatten
from rspo_lightning.config import KNOWN_ESTIMATORS, AlgorithmConfig
from rspo_lightning.credit import turn_advantages
from rspo_lightning.rewards import EnvProgressReward, assign_dense_rewards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    module = build_module()
    module.set_env_kwargs({"max_steps": args.max_steps})
    run_iteration(module, 2, args.group_size, 9_000)  # warm-up: env pool, tries, kernels
    it = run_iteration(module, args.groups, args.group_size, 0)
    trajs = it["trajectories"]
    print(
        f"iteration: {it['episodes']} episodes, {it['turns']} turns ({it['turns'] / it['episodes']:.1f} per episode), "
        f"success {it['success']:.3f}; rollout {it['rollout_s']:.2f} s + update {it['update_s']:.2f} s "
        f"(advantage {1000 * it['advantage_s']:.2f} ms included) = {it['wall_s']:.2f} s"
    )

    assign_dense_rewards(EnvProgressReward(), trajs)
    t0 = time.perf_counter()
    flat = flatten(trajs)
    flatten_s = time.perf_counter() - t0
    values = torch.randn(len(flat.turns))
    print(
        f"flatten (shared by every estimator, part of the iteration above): {1000 * flatten_s:.2f} ms for {len(flat.turns)} turns"
    )
    print("| estimator | median ms | min ms | fraction of the iteration |")
    print("|---|---|---|---|")
    fractions = {}
    for name in sorted(KNOWN_ESTIMATORS):
        algo = AlgorithmConfig(estimator=name)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            turn_advantages(flat, algo, values if ESTIMATORS[name].needs_critic else None)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        fractions[name] = med / it["wall_s"]
        print(f"| {name} | {1000 * med:.2f} | {1000 * min(times):.2f} | {100 * fractions[name]:.4f} % |", flush=True)
    worst = max(fractions, key=fractions.get)
    print(
        f"threads {torch.get_num_threads()}; worst: {worst} at {100 * fractions[worst]:.4f} % of the iteration (target < 1 %)"
    )
    print(f"estimator_overhead_max: {fractions[worst]:.5f}")


if __name__ == "__main__":
    main()
