"""Expert demonstrations and recorded rollouts as trajectory JSONL, for behaviour-cloning warm
starts and process-reward data.

Expert demonstrations replay the embedded env's ``expert_action()`` and record each turn as the
policy would have seen it: the prompt is built by ``build_turn_prompt`` (the same builder the
rollout engine uses) and the response is ``"<action> {action} </action>"`` tokenised, exactly
what constrained decoding would generate for that action.

Command line (write demos, and the tiny policy whose tokenizer produced their ids)::

    python -m rspo_lightning.demos expert --config configs/quickstart.yaml \\
        --split train --num-tasks 200 --out demos.jsonl --policy-source tiny --save-policy tiny_policy

"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence

import torch

from rspo_lightning.prompts import HistoryEntry, action_response_ids, build_turn_prompt
from rspo_lightning.trajectory_io import save_trajectories
from rspo_lightning.types import TaskSpec, Trajectory, Turn

# --------------------------------------------------------------------------- expert demos


def expert_demonstrations(
    env_id: str,
    env_kwargs: dict | None,
    split: str,
    task_ids: Iterable[int],
    *,
    tokenizer,
    rollout,
) -> list[Trajectory]:
    """Play the env's ``expert_action()`` on each task and record the turns as the policy sees them.

    Args:
        env_id: gymnasium id of an env with ``env.unwrapped.expert_action()`` (embedded envs).
        env_kwargs: keyword arguments of ``gymnasium.make`` (the same as the RL run's).
        split: task split.
        task_ids: task ids of ``split`` to play, one trajectory each.
        tokenizer: the policy tokenizer the demos are written for (ids are only meaningful under it).
        rollout: the ``RolloutConfig`` of the RL run (template, history window, system prompt,
            ``max_turns``, ``require_admissible``).

    Returns:
        One trajectory per task id, ``policy_tag="A"``, ``source="on_policy"``, behaviour
        log-probs zero (the expert is not the policy: score them before using them off-policy).
    """
    from rspo_lightning.envs import make_env

    env = make_env(env_id, **(env_kwargs or {}))
    expert = getattr(env.unwrapped, "expert_action", None)
    if expert is None:
        raise ValueError(
            f"{env_id} has no expert_action(); expert demonstrations need an embedded env such as rspo/Household-v0"
        )
    max_turns = rollout.max_turns or getattr(env.unwrapped, "max_steps", None) or 1000
    out: list[Trajectory] = []
    for task_id in task_ids:
        task = TaskSpec(env_id, split, int(task_id), group_id=int(task_id))
        obs, info = env.reset(options={"split": split, "task_id": int(task_id)})
        traj = Trajectory(
            task=task, task_type=str(info.get("task_type", "")), initial_progress=float(info.get("progress", 0.0))
        )
        history: list[HistoryEntry] = []
        while len(traj.turns) < max_turns:
            prompt = build_turn_prompt(tokenizer, rollout, info, obs, history, len(traj.turns))
            action = expert()
            response = action_response_ids(tokenizer, action)
            admissible = info.get("admissible_actions")
            next_obs, reward, terminated, truncated, next_info = env.step(action)
            valid = not bool(next_info.get("invalid", False))
            if rollout.require_admissible and admissible is not None:
                valid = valid and action in admissible
            traj.turns.append(
                Turn(
                    prompt_ids=torch.tensor(prompt, dtype=torch.long),
                    response_ids=torch.tensor(response, dtype=torch.long),
                    behaviour_logprobs=torch.zeros(len(response), dtype=torch.float32),
                    action=action,
                    valid=valid,
                    observation=obs,
                    anchor=str(info.get("anchor", obs)),
                    outcome_reward=float(reward),
                    privileged=info.get("privileged"),
                    progress=float(next_info.get("progress", 0.0)),
                )
            )
            history.append(HistoryEntry(obs, action))
            obs, info = next_obs, next_info
            traj.success = bool(info.get("won", False))
            traj.score = float(info.get("score", 0.0))
            if terminated or truncated:
                traj.truncated = bool(truncated and not terminated)
                break
        else:
            traj.truncated = True
        out.append(traj)
    env.close()
    return out


# --------------------------------------------------------------------------- command line


def _dig(config: dict, *keys: str, default=None):
    for k in keys:
        if not isinstance(config, dict) or k not in config:
            return default
        config = config[k]
    return config


def _load_run_config(path: str | None) -> dict:
    if path is None:
        return {}
    import yaml

    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def _json_arg(text: str | None, name: str) -> dict | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"{name} must be a JSON object, got {text!r}: {e}") from None
    if not isinstance(value, dict):
        raise SystemExit(f"{name} must be a JSON object, got {text!r}")
    return value


def _setup(args: argparse.Namespace):
    """Env, rollout settings, policy and task range shared by the ``expert`` and ``rollouts`` commands."""
    from rspo_lightning.envs import make_env
    from rspo_lightning.language_model import TinyModelConfig, load_policy
    from rspo_lightning.prompts import template_texts
    from rspo_lightning.rollout import RolloutConfig

    run = _load_run_config(args.config)
    env_id = args.env_id or _dig(run, "data", "env", "env_id", default="rspo/Household-v0")
    env_kwargs = _json_arg(args.env_kwargs, "--env-kwargs")
    if env_kwargs is None:
        env_kwargs = _dig(run, "data", "env", "kwargs", default={}) or {}
    rollout_kw = dict(_dig(run, "model", "rollout", default={}) or {})
    rollout_kw.update(_json_arg(args.rollout, "--rollout") or {})
    rollout = RolloutConfig(**rollout_kw)
    tiny_kw = dict(_dig(run, "model", "policy", "tiny", default={}) or {})
    tiny_kw.update(_json_arg(args.tiny, "--tiny") or {})
    source = args.policy_source or _dig(run, "model", "policy", "source", default="tiny")

    env = make_env(env_id, **env_kwargs)
    if source == "tiny" and args.command == "rollouts":
        raise SystemExit(
            "rollouts need a trained policy: --policy-source <HF dir> (e.g. an SFT fit's <log_dir>/hf), "
            "a .gguf path or smollm2"
        )
    if source == "tiny":
        if not args.save_policy:
            raise SystemExit(
                "--policy-source tiny builds a new word-level tokenizer; pass --save-policy DIR so SFT and RL "
                "load the tokenizer the demos were written with (model.policy.source: DIR)"
            )
        # The same corpus AgentRLModule.configure_model trains the tiny tokenizer on.
        corpus = env.unwrapped.sample_texts() + template_texts() + [rollout.system_prompt]
        model, tokenizer = load_policy(
            "tiny", tiny=TinyModelConfig(**tiny_kw), corpus=corpus, save_dir=args.save_policy
        )
    else:
        model, tokenizer = load_policy(source, gguf_file=args.gguf_file)
        if args.save_policy:
            model.save_pretrained(args.save_policy)
            tokenizer.save_pretrained(args.save_policy)
    split = args.split
    total = env.unwrapped.num_tasks(split)
    env.close()
    last = min(total, args.start_task + args.num_tasks)
    if args.start_task >= total:
        raise SystemExit(f"--start-task {args.start_task} is past the {total} tasks of split {split!r}")
    return env_id, env_kwargs, rollout, model, tokenizer, split, last


def _expert_command(args: argparse.Namespace) -> None:
    env_id, env_kwargs, rollout, model, tokenizer, split, last = _setup(args)
    trajs = expert_demonstrations(
        env_id, env_kwargs, split, range(args.start_task, last), tokenizer=tokenizer, rollout=rollout
    )
    n = save_trajectories(args.out, trajs, tokenizer if args.with_text else None, append=args.append)
    turns = sum(len(t.turns) for t in trajs)
    won = sum(t.success for t in trajs)
    print(
        f"wrote {n} expert trajectories ({turns} turns, {won} won) of {env_id} {split} tasks "
        f"{args.start_task}..{last - 1} to {args.out}\nenv kwargs (the tasks' distribution): "
        f"{json.dumps(env_kwargs, sort_keys=True)}"
    )
    if args.save_policy:
        print(f"policy + tokenizer in {args.save_policy}: set model.policy.source: {args.save_policy}")


def _rollouts_command(args: argparse.Namespace) -> None:
    """Episodes of a trained policy (e.g. for the SPA-RL process reward model), as JSONL."""
    from rspo_lightning.rollout import RolloutEngine

    env_id, env_kwargs, rollout, model, tokenizer, split, last = _setup(args)
    torch.manual_seed(args.seed)
    engine = RolloutEngine(model, tokenizer, rollout, env_kwargs)
    tasks = [TaskSpec(env_id, split, t, group_id=t) for t in range(args.start_task, last)]
    trajs = engine.collect(tasks, args.group_size, temperature=args.temperature)
    trajs = [t for t in trajs if t.env_error is None]
    n = save_trajectories(args.out, trajs, tokenizer if args.with_text else None, append=args.append)
    won = sum(t.success for t in trajs)
    print(
        f"wrote {n} rollouts ({sum(len(t.turns) for t in trajs)} turns, {won} won) of {env_id} {split} tasks "
        f"{args.start_task}..{last - 1} x {args.group_size} to {args.out}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rspo_lightning.demos", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = argparse.ArgumentParser(add_help=False)  # the options both commands share
    p.add_argument(
        "--config",
        help="an rspo-lightning fit YAML: data.env, model.rollout and model.policy.tiny are read "
        "from it (the flags below override)",
    )
    p.add_argument("--env-id", help="gymnasium id (default: the config's, else rspo/Household-v0)")
    p.add_argument("--env-kwargs", help="JSON object of gymnasium.make kwargs (default: the config's data.env.kwargs)")
    p.add_argument(
        "--rollout",
        help="JSON object of RolloutConfig fields merged over the config's model.rollout "
        "(template, history_window, system_prompt must match the RL run)",
    )
    p.add_argument("--tiny", help="JSON object of TinyModelConfig fields merged over the config's model.policy.tiny")
    p.add_argument("--split", default="train")
    p.add_argument("--start-task", type=int, default=0, help="first task id")
    p.add_argument(
        "--num-tasks", type=int, default=200, help="number of consecutive task ids (capped by the split size)"
    )
    p.add_argument("--out", required=True, help="output JSONL path")
    p.add_argument("--append", action="store_true", help="append to --out instead of overwriting it")
    p.add_argument(
        "--policy-source", help="tiny, a HF directory, a .gguf path or smollm2 (default: the config's, else tiny)"
    )
    p.add_argument("--gguf-file", help="GGUF file name inside --policy-source")
    p.add_argument("--save-policy", help="directory to save the policy + tokenizer in (required for tiny)")
    p.add_argument("--with-text", action="store_true", help="also store decoded prompt/response text per turn")
    sub.add_parser("expert", parents=[p], help="write expert demonstrations of an embedded env as JSONL")
    r = sub.add_parser("rollouts", parents=[p], help="write episodes played by a trained policy as JSONL")
    r.add_argument("--group-size", type=int, default=1, help="episodes per task")
    r.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    r.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = parser.parse_args(argv)
    if args.num_tasks < 1:
        parser.error(f"--num-tasks must be >= 1, got {args.num_tasks}")
    if args.start_task < 0:
        parser.error(f"--start-task must be >= 0, got {args.start_task}")
    if args.command == "expert":
        _expert_command(args)
    else:
        _rollouts_command(args)


if __name__ == "__main__":
    main(sys.argv[1:])
