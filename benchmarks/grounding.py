"""What the quickstart's plateau is made of: grounding the task's words in the chosen action.

Two measurements in the quickstart's Household setting (``configs/quickstart.yaml``'s env):

``--scripted``: scripted agents that see only what the policy sees (the task text, the
observations, the admissible actions and their own last ``--memory`` moves, as
``history_window`` shows them) and differ in two switches: whether they read the task's
**object** word when they take something, and its **goal receptacle** word when they carry
something. An agent that reads neither still has every skill (go, open, take, put somewhere
else than where the object was taken); so its success is what the skills alone earn, and the
gaps to the others are what each grounding is worth.

``--episodes FILE``: the same two decisions counted in a policy's own episodes (trajectory
JSONL, e.g. ``rspo-lightning predict``'s): each episode is replayed in the env from its task and
actions, and at every turn where a choice existed the action is scored:
- *object*: at a receptacle showing both a target-type object and another one, with nothing in
  hand, the agent took the target (``take`` of the target / ``take`` of anything);
- *goal*: carrying a target, away from every goal-type receptacle, the agent went to one
  (``go to`` a goal receptacle / ``go to`` anything);
each beside its chance level, what a uniform choice among the same options would get.

    python benchmarks/grounding.py --scripted
    rspo-lightning predict --config configs/quickstart.yaml --ckpt_path last \\
        --data.predict_splits '[valid_seen,valid_unseen]' --data.num_val_tasks 128
    python benchmarks/grounding.py --episodes runs/quickstart/version_0/predictions/valid_seen-iteration80.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import Callback

from rspo_lightning.envs.household import Household
from rspo_lightning.envs.household import _type_of as _kind  # "garbagecan 1" -> "garbagecan"
from rspo_lightning.trajectory_io import save_trajectories

ROOT = Path(__file__).resolve().parents[1]
_TASK = re.compile(r"put (?:a|some) (\w+) (?:in|on) (\w+)\.")


def quickstart_env() -> Household:
    """The env of ``configs/quickstart.yaml`` (its ``data.env.kwargs``)."""
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    return Household(**cfg["data"]["env"]["kwargs"])


def task_words(instruction: str) -> tuple[str, str]:
    """(object type, goal receptacle type) of a pick-and-place instruction."""
    m = _TASK.fullmatch(instruction.strip())
    if m is None:
        raise ValueError(f"not a pick-and-place instruction: {instruction!r}")
    return m.group(1), m.group(2)


def scripted_episode(
    env: Household,
    split: str,
    task_id: int,
    *,
    read_object: bool,
    read_goal: bool,
    memory: int,
    rng: random.Random,
    actions: list[str] | None = None,
) -> bool:
    """One episode of the scripted agent (see the module docstring); True when won. ``actions``,
    when given, receives the actions played (for ``decisions``)."""
    _, info = env.reset(options={"split": split, "task_id": task_id})
    obj, goal = task_words(info["task"])
    at = held = taken_at = None
    moves: list[str] = []  # receptacles gone to, in order
    for _ in range(env.max_steps):
        adm = info["admissible_actions"]
        puts = [a for a in adm if a.startswith("put ")]
        opens = [a for a in adm if a.startswith("open ")]
        gos = [a for a in adm if a.startswith("go to ")]
        if held is not None:
            here_ok = at is not None and (_kind(at) == goal if read_goal else at != taken_at)
            action = (puts or opens)[0] if here_ok and (puts or opens) else None
            if action is None:
                dest = [a for a in gos if _kind(a[6:]) == goal] if read_goal else [a for a in gos if a[6:] != taken_at]
                action = rng.choice(dest or gos)
        else:
            takes = [a for a in adm if a.startswith("take ")]
            if read_object:
                takes = [a for a in takes if _kind(a[5:].split(" from ")[0]) == obj]
            if takes:
                action = rng.choice(takes)
            elif opens:
                action = opens[0]
            else:
                recent = set(moves[-memory:]) if memory else set()
                action = rng.choice([a for a in gos if a[6:] not in recent] or gos)
        if action.startswith("go to "):
            at = action[6:]
            moves.append(at)
        elif action.startswith("take "):
            held, taken_at = action[5:].split(" from ")[0], at
        elif action.startswith("put "):
            held = None
        if actions is not None:
            actions.append(action)
        _, _, won, truncated, info = env.step(action)
        if won or truncated:
            return bool(won)
    return False


def scripted_table(env: Household, num_tasks: int, memory: int, repeats: int) -> list[dict]:
    """Success of the four scripted agents on both validation splits, ``repeats`` seeds each."""
    rows = []
    for read_object, read_goal in [(True, True), (True, False), (False, True), (False, False)]:
        row = {"reads object": read_object, "reads goal": read_goal}
        for split in ("valid_seen", "valid_unseen"):
            rates = []
            for rep in range(repeats):
                rng = random.Random(rep)
                won = [
                    scripted_episode(
                        env, split, i, read_object=read_object, read_goal=read_goal, memory=memory, rng=rng
                    )
                    for i in range(num_tasks)
                ]
                rates.append(sum(won) / len(won))
            row[split] = (statistics.mean(rates), statistics.pstdev(rates))
        rows.append(row)
    return rows


def decisions(env: Household, episode: dict) -> Iterator[tuple[str, bool, float, dict, tuple[str, str]]]:
    """The episode's object and goal decisions (see the module docstring), in order, as
    ``(kind, right, chance, turn, (wanted, chosen, options))``: ``chance`` is the share of the options that
    were right; ``wanted`` the task's word for that decision, ``chosen`` the type the action named, ``options``
    the sorted types among the options of that kind."""
    _, info = env.reset(options={"split": episode["task"]["split"], "task_id": episode["task"]["task_id"]})
    obj, goal = task_words(info["task"])
    held = None
    for turn in episode["turns"]:
        adm, action = info["admissible_actions"], turn["action"]
        takes = [_kind(a[5:].split(" from ")[0]) for a in adm if a.startswith("take ")]
        gos = [_kind(a[6:]) for a in adm if a.startswith("go to ")]
        if held is None and obj in takes and any(t != obj for t in takes) and action.startswith("take "):
            chosen = _kind(action[5:].split(" from ")[0])
            yield "object", chosen == obj, takes.count(obj) / len(takes), turn, (obj, chosen, tuple(sorted(set(takes))))
        at_goal = env._at is not None and _kind(env._at) == goal
        if held is not None and _kind(held) == obj and not at_goal and goal in gos and action.startswith("go to "):
            chosen = _kind(action[6:])
            yield "goal", chosen == goal, gos.count(goal) / len(gos), turn, (goal, chosen, tuple(sorted(set(gos))))
        if action.startswith("take ") and action in adm:
            held = action[5:].split(" from ")[0]
        elif action.startswith("put ") and action in adm:
            held = None
        _, _, won, truncated, info = env.step(action)
        if won or truncated:
            break


def decision_counts(env: Household, episodes: Iterable[dict]) -> dict[str, list[float]]:
    """Per decision kind, [right, made, chance] over the episodes' turns (see the module
    docstring); chance sums, over the decisions made, the share of the options that were right
    (what a uniform choice among them would get).

    ``episodes``: trajectory dicts with ``task`` (``split``, ``task_id``) and ``turns`` (``action``)."""
    counts = {"object": [0, 0, 0.0], "goal": [0, 0, 0.0]}
    for ep in episodes:
        for kind, right, chance, *_ in decisions(env, ep):
            counts[kind][0] += right
            counts[kind][1] += 1
            counts[kind][2] += chance
    return counts


def iteration_rows(env: Household, files: list[Path], bucket: int) -> list[dict]:
    """Per ``bucket`` consecutive training iterations (one JSONL of the iteration's episodes
    each, as ``EpisodeDump`` writes them): success, the object and goal decisions beside their
    chance, the median probability the policy gave the object action it took, and how many
    object decisions lay in a group of mixed outcomes (the only ones GRPO's episode advantage
    teaches anything: in an all-won or all-lost group every advantage is 0); ``pair_table``'s
    two means over the bucket's object decisions between two types; ``word_dependence`` of the
    goal decisions (mean, cells)."""
    rows = []
    for start in range(0, len(files), bucket):
        episodes = [json.loads(line) for f in files[start : start + bucket] for line in f.read_text().splitlines()]
        outcomes: dict[tuple, set] = {}
        for ep in episodes:
            outcomes.setdefault((ep["iteration"], ep["task"]["group_id"]), set()).add(bool(ep["success"]))
        counts = {"object": [0, 0, 0.0], "goal": [0, 0, 0.0]}
        probs, mixed, choices, goals = [], 0, [], []
        for ep in episodes:
            for kind, right, chance, turn, choice in decisions(env, ep):
                counts[kind][0] += right
                counts[kind][1] += 1
                counts[kind][2] += chance
                if kind == "object":
                    probs.append(math.exp(sum(turn["behaviour_logprobs"])))
                    mixed += len(outcomes[(ep["iteration"], ep["task"]["group_id"])]) == 2
                    choices.append(choice)
                else:
                    goals.append(choice)
        pairs = pair_table(choices)
        rows.append(
            {
                "iterations": f"{start}-{start + len(files[start : start + bucket]) - 1}",
                "success": sum(bool(e["success"]) for e in episodes) / max(len(episodes), 1),
                **{k: (r / max(n, 1), ch / max(n, 1), n) for k, (r, n, ch) in counts.items()},
                "object_action_p": statistics.median(probs) if probs else float("nan"),
                "object_in_mixed_groups": mixed,
                "object_dependence": pairs["dependence"],
                "object_fixed": pairs["fixed"],
                "object_pairs": len(pairs["pairs"]),
                "goal_dependence": word_dependence(goals),
            }
        )
    return rows


def pair_table(choices: Iterable[tuple[str, str, tuple[str, ...]]], min_n: int = 3) -> dict:
    """Does the object choice depend on the task's word, or only on the objects in view?

    ``choices``: ``(target, chosen, options)`` of object decisions (``decisions``' last field).
    For every pair of types ``(x, y)`` met as the only two options, with at least ``min_n``
    decisions for either target: ``p_if_x`` = P(take x | target x), ``p_if_y`` = P(take x | target
    y). A policy that reads the word has ``p_if_x`` near 1 and ``p_if_y`` near 0; one that ranks
    the types whatever the task says has the two equal. Returned: the pairs and two means over
    them, ``dependence`` = p_if_x − p_if_y (1: reads the word, 0: ignores it) and ``fixed`` =
    |(p_if_x + p_if_y) − 1| (1: always the same type of the two, 0: the types taken evenly)."""
    counts: dict[tuple[str, str], dict[str, list[int]]] = {}
    for target, chosen, options in choices:
        if len(options) != 2:
            continue
        x, _ = options
        c = counts.setdefault(options, {"x": [0, 0], "y": [0, 0]})["x" if target == x else "y"]
        c[0] += chosen == x
        c[1] += 1
    pairs = [
        {
            "pair": xy,
            "p_if_x": c["x"][0] / c["x"][1],
            "n_x": c["x"][1],
            "p_if_y": c["y"][0] / c["y"][1],
            "n_y": c["y"][1],
        }
        for xy, c in sorted(counts.items())
        if c["x"][1] >= min_n and c["y"][1] >= min_n
    ]
    mean = statistics.mean if pairs else (lambda _: float("nan"))
    return {
        "pairs": pairs,
        "dependence": mean([r["p_if_x"] - r["p_if_y"] for r in pairs]),
        "fixed": mean([abs(r["p_if_x"] + r["p_if_y"] - 1) for r in pairs]),
    }


def word_dependence(choices: Iterable[tuple[str, str, tuple[str, ...]]], min_n: int = 3) -> tuple[float, int]:
    """Does a choice (object or goal, any number of options) depend on the task's word?

    ``choices``: ``(wanted, chosen, options)`` (``decisions``' last field). For every cell (a set
    of option types, one type ``x`` in it) met at least ``min_n`` times with ``x`` wanted and
    ``min_n`` times with another type wanted: P(choose x | x wanted) − P(choose x | another
    wanted). Returned: the mean over those cells (1: the word decides, 0: the options alone do)
    and the number of cells. ``pair_table``'s ``dependence`` is the two-option case of it."""
    cells: dict[tuple[tuple[str, ...], str], list[int]] = {}
    for wanted, chosen, options in choices:
        for x in options:
            c = cells.setdefault((options, x), [0, 0, 0, 0])  # chosen | wanted, wanted, chosen | other, other
            k = 0 if wanted == x else 2
            c[k] += chosen == x
            c[k + 1] += 1
    diffs = [a / n - b / m for a, n, b, m in cells.values() if n >= min_n and m >= min_n]
    return (statistics.mean(diffs) if diffs else float("nan")), len(diffs)


def scripted_dependence(env: Household, num_tasks: int, memory: int, repeats: int = 8, seed: int = 0) -> list[dict]:
    """``word_dependence`` of the four scripted agents' own choices, ``repeats`` episodes on each
    of ``num_tasks`` train tasks (as a training iteration's groups): what the measure reads for
    agents known to read a word or not."""
    rows = []
    for read_object, read_goal in [(True, True), (True, False), (False, True), (False, False)]:
        rng, choices = random.Random(seed), {"object": [], "goal": []}
        for i in [t for t in range(num_tasks) for _ in range(repeats)]:
            actions: list[str] = []
            kw = {"read_object": read_object, "read_goal": read_goal, "memory": memory, "rng": rng, "actions": actions}
            scripted_episode(env, "train", i, **kw)
            episode = {"task": {"split": "train", "task_id": i}, "turns": [{"action": a} for a in actions]}
            for kind, *_, choice in decisions(env, episode):
                choices[kind].append(choice)
        rows.append(
            {
                "reads object": read_object,
                "reads goal": read_goal,
                **{k: word_dependence(c) for k, c in choices.items()},
            }
        )
    return rows


class EpisodeDump(Callback):
    """Write every training iteration's episodes to ``<out_dir>/iteration<NNNN>.jsonl`` (for
    ``--iterations``); on the CLI: ``--trainer.callbacks+=grounding.EpisodeDump
    --trainer.callbacks.out_dir DIR`` with ``benchmarks`` on ``PYTHONPATH``."""

    def __init__(self, out_dir: str = "runs/episodes") -> None:
        self.out_dir = Path(out_dir)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        n = trainer.fit_loop.epoch_loop.total_batch_idx
        save_trajectories(str(self.out_dir / f"iteration{n:04d}.jsonl"), pl_module.last_trajectories)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scripted", action="store_true", help="the scripted agents' table")
    p.add_argument("--episodes", nargs="*", default=[], help="trajectory JSONL files to count decisions in")
    p.add_argument("--num-tasks", type=int, default=128, help="tasks per split (scripted)")
    p.add_argument("--memory", type=int, default=2, help="own moves remembered (the quickstart's history_window)")
    p.add_argument("--repeats", type=int, default=5, help="random seeds per scripted agent")
    p.add_argument("--iterations", help="a directory of EpisodeDump's per-iteration JSONL files")
    p.add_argument("--bucket", type=int, default=10, help="iterations per row (--iterations)")
    args = p.parse_args(argv)
    env = quickstart_env()
    if args.scripted:
        print(f"scripted agents, {args.num_tasks} tasks per split, memory {args.memory}, {args.repeats} seeds:")
        print("| reads object | reads goal | valid_seen | valid_unseen |")
        print("|---|---|---|---|")
        for row in scripted_table(env, args.num_tasks, args.memory, args.repeats):
            cells = [f"{m:.3f} ± {s:.3f}" for m, s in (row["valid_seen"], row["valid_unseen"])]
            print(f"| {row['reads object']} | {row['reads goal']} | {' | '.join(cells)} |")
        print(f"\nword_dependence of their own choices ({5 * args.num_tasks} train tasks x 8; mean over cells, cells):")
        print("| reads object | reads goal | object choice | goal choice |")
        print("|---|---|---|---|")
        for row in scripted_dependence(env, 5 * args.num_tasks, args.memory):
            o, g = row["object"], row["goal"]
            print(f"| {row['reads object']} | {row['reads goal']} | {o[0]:.2f} ({o[1]}) | {g[0]:.2f} ({g[1]}) |")
    for path in args.episodes:
        episodes = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        c = decision_counts(env, episodes)
        won = sum(bool(e["success"]) for e in episodes)
        parts = [f"{k} {r}/{n} = {r / max(n, 1):.3f} (chance {ch / max(n, 1):.3f})" for k, (r, n, ch) in c.items()]
        print(f"{path}: {len(episodes)} episodes, {won} won; right choices: " + ", ".join(parts))
    if args.iterations:
        files = sorted(Path(args.iterations).glob("iteration*.jsonl"))
        print(
            "| iterations | success | object right (chance), n | goal right (chance), n | p(object action taken), median "
            "| object decisions in mixed groups | object choice: dependence on the word, fixed ranking (pairs) "
            "| goal choice: dependence on the word (cells) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in iteration_rows(env, files, args.bucket):
            o, g = r["object"], r["goal"]
            print(
                f"| {r['iterations']} | {r['success']:.3f} | {o[0]:.3f} ({o[1]:.3f}), {o[2]} | {g[0]:.3f} ({g[1]:.3f}), {g[2]} "
                f"| {r['object_action_p']:.3f} | {r['object_in_mixed_groups']} "
                f"| {r['object_dependence']:.2f}, {r['object_fixed']:.2f} ({r['object_pairs']}) "
                f"| {r['goal_dependence'][0]:.2f} ({r['goal_dependence'][1]}) |"
            )


if __name__ == "__main__":
    main()
