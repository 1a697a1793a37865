"""Scaling: cost of one RL iteration as the number of parallel episodes and the episode length grow.

One iteration is ``AgentRLModule.training_step`` outside a Trainer (rollout -> advantage ->
update, exactly the code a ``fit`` runs; its own ``perf/rollout_s`` and ``perf/update_s`` are
read back). The policy is the untrained tiny quickstart Llama (2 x 128) with constrained
decoding, so it acts about uniformly over the admissible actions; the env is Household
pick-and-place with 8 receptacles, where such a policy rarely wins (random play: 4 % in 50
steps), so episodes run to the ``max_steps`` cap. GRPO, one PPO epoch over every turn
(``drop_zero_advantage`` off: the cost of training every turn sample).

Two sweeps, the same weights throughout (the cap changes through ``set_env_kwargs``):
- episodes: 8 -> 16 -> 32 -> 64 -> 128 parallel episodes (groups of 8) at ``--episode-turns``;
- turns: 10 -> 20 -> 30 -> 50 turns per episode at ``--turn-episodes`` episodes.

It also reports the prompt length of each turn index (mean tokens of ``turn.prompt_ids`` over the
episodes of the 50-turn run): prompts are rebuilt from the last ``history_window`` pairs, so the
length must be flat in the turn index once the first observation (the long room description)
has left the window (turn index > ``history_window``). Cost vs turns is fitted with a line
(seconds per iteration against turns per episode; each point the fastest of ``--repeats``
iterations): R² and seconds per turn.

    python benchmarks/scaling.py                 # ~2-3 min on 2 CPU cores, one torch thread
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rewards import EnvProgressReward
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.types import IterationBatch, TaskSpec

ENV = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 8,
    "num_distractors": 2,
    "num_object_types": 8,
    "max_steps": 50,
    "info_actions": False,
}
TINY = TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256)


def build_module(env_kwargs: dict | None = None, estimator: str = "grpo", minibatch_size: int = 64) -> AgentRLModule:
    """The quickstart's tiny policy and rollout settings, one PPO epoch, every turn trained, wired
    for ``training_step`` outside a Trainer (its logged values are kept in ``module.logged``)."""
    module = AgentRLModule(
        policy=PolicyConfig(tiny=TINY),
        env=EnvConfig(kwargs=dict(env_kwargs or ENV)),
        rollout=RolloutConfig(constrained_decoding=True, max_new_tokens=12, template="compact", system_prompt=""),
        optim=OptimConfig(lr=1e-3),
        algorithm=AlgorithmConfig(
            estimator=estimator,
            ppo_epochs=1,
            minibatch_size=minibatch_size,
            recompute_old_logprobs=False,
            drop_zero_advantage=False,
        ),
        dense_reward=EnvProgressReward() if estimator == "a2tgpo" else None,
    )
    module.configure_model()
    opt_cfg = module.configure_optimizers()
    opt, sched = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    # Just enough of Lightning's plumbing for training_step without a Trainer.
    module.optimizers = lambda: opt
    module.lr_schedulers = lambda: sched
    module.manual_backward = lambda loss: loss.backward()
    module.clip_gradients = lambda o, gradient_clip_val, gradient_clip_algorithm: torch.nn.utils.clip_grad_norm_(
        [p for g in o.param_groups for p in g["params"]], gradient_clip_val
    )
    module.logged = {}

    def log(name, value, *args, **kwargs):
        module.logged[name] = value

    def log_dict(values, *args, **kwargs):
        module.logged.update(values)

    module.log, module.log_dict = log, log_dict
    return module


def run_iteration(module: AgentRLModule, groups: int, group_size: int, first_task: int) -> dict:
    """One ``training_step`` on ``groups`` train tasks x ``group_size`` episodes; its timings and trajectories."""
    tasks = [TaskSpec("rspo/Household-v0", "train", first_task + g, g) for g in range(groups)]
    module.logged = {}
    t0 = time.perf_counter()
    module.training_step(IterationBatch(tasks=tasks, group_size=group_size), 0)
    wall = time.perf_counter() - t0
    trajs = module.last_trajectories
    return {
        "wall_s": wall,
        "rollout_s": float(module.logged["perf/rollout_s"]),
        "update_s": float(module.logged["perf/update_s"]),
        "advantage_s": float(module.logged["perf/advantage_s"]),
        "episodes": len(trajs),
        "turns": sum(len(t.turns) for t in trajs),
        "success": sum(t.success for t in trajs) / max(len(trajs), 1),
        "trajectories": trajs,
    }


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + b x``: ``(a, b, R²)``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, 1 - ss_res / ss_tot if ss_tot > 0 else 1.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    p.add_argument("--episode-turns", type=int, default=10, help="max_steps of the episode sweep")
    p.add_argument("--turns", type=int, nargs="+", default=[10, 20, 30, 50])
    p.add_argument("--turn-episodes", type=int, default=32, help="parallel episodes of the turn sweep")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--repeats", type=int, default=2, help="iterations per point of the turn sweep (the fastest is kept)"
    )
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    module = build_module()
    task = 0

    def iteration(episodes: int, max_steps: int) -> dict:
        nonlocal task
        module.set_env_kwargs({"max_steps": max_steps})
        out = run_iteration(module, episodes // args.group_size, args.group_size, task)
        task += episodes // args.group_size
        return out

    iteration(16, 10)  # warm-up: env pool, tries, kernels
    print(f"episode sweep ({args.episode_turns}-turn cap, groups of {args.group_size}):")
    print("| episodes | turns played | success | rollout s | update s | iteration s | ms per turn sample |")
    print("|---|---|---|---|---|---|---|")
    for n in args.episodes:
        r = iteration(n, args.episode_turns)
        print(
            f"| {n} | {r['turns']} | {r['success']:.2f} | {r['rollout_s']:.2f} | {r['update_s']:.2f} | {r['wall_s']:.2f} | "
            f"{1000 * r['wall_s'] / r['turns']:.1f} |",
            flush=True,
        )

    print(f"\nturn sweep ({args.turn_episodes} parallel episodes):")
    print(
        "| max_steps | turns per episode (mean) | success | rollout s | update s | iteration s | ms per turn sample |"
    )
    print("|---|---|---|---|---|---|---|")
    xs, ys, longest = [], [], None
    for t in args.turns:
        # the fastest of --repeats iterations: the least disturbed by other work on the machine
        r = min((iteration(args.turn_episodes, t) for _ in range(args.repeats)), key=lambda x: x["wall_s"] / x["turns"])
        per_episode = r["turns"] / r["episodes"]
        xs.append(per_episode)
        ys.append(r["wall_s"])
        if t == max(args.turns):
            longest = r["trajectories"]
        print(
            f"| {t} | {per_episode:.1f} | {r['success']:.2f} | {r['rollout_s']:.2f} | {r['update_s']:.2f} | {r['wall_s']:.2f} | "
            f"{1000 * r['wall_s'] / r['turns']:.1f} |",
            flush=True,
        )

    lengths: dict[int, list[int]] = {}
    for traj in longest:
        for i, turn in enumerate(traj.turns):
            lengths.setdefault(i, []).append(len(turn.prompt_ids))
    means = {i: statistics.fmean(v) for i, v in sorted(lengths.items())}
    window = module.rollout_cfg.history_window
    shown = [i for i in (0, 1, 2, 3, 5, 10, 20, 30, 40, 49) if i in means]
    print(
        f"\nprompt tokens by turn index ({max(args.turns)}-turn run; history_window {window}): "
        + ", ".join(f"t{i}: {means[i]:.1f}" for i in shown)
    )
    # Turn t shows turns t-window..t-1: from t = window + 1 on the long first observation (the
    # room description) has left the window and every prompt has the same shape.
    full = [i for i in means if i > window and len(lengths[i]) >= 4]
    _, slope_tok, _ = fit_line([float(i) for i in full], [means[i] for i in full])
    print(
        f"prompt tokens for turns >= {window + 1}: min {min(means[i] for i in full):.1f}, max {max(means[i] for i in full):.1f}, "
        f"fitted slope {slope_tok:+.3f} tokens per turn index"
    )
    a, b, r2 = fit_line(xs, ys)
    print(
        f"iteration s = {a:.2f} + {b:.3f} x turns per episode ({args.turn_episodes} episodes); "
        f"{b / args.turn_episodes * 1000:.1f} ms per turn sample; R² {r2:.4f}"
    )
    print(f"threads {torch.get_num_threads()}; whole script {time.perf_counter() - start:.0f} s")
    print(f"scaling_prompt_slope_tokens_per_turn: {slope_tok:.3f}")
    print(f"scaling_seconds_per_turn: {b:.3f}")
    print(f"scaling_turn_slope_r2: {r2:.4f}")


if __name__ == "__main__":
    main()
