"""ALFWorld: adapter to the real `alfworld` package's text games (Shridhar et al., 2021,
arXiv 2010.03768).

Data: `alfworld-download` puts the games under `$ALFWORLD_DATA/json_2.1.1/{train,valid_seen,
valid_unseen}/<task>/<trial>/` (`traj_data.json` + `game.tw-pddl`). Games are chosen with the
rules of `AlfredTWEnv.collect_game_files` (a `traj_data.json` with a `game.tw-pddl` marked
solvable beside it, no "movable"/"Sliced" trials, task type in `task_types`), sorted by path so a
`task_id` names the same game on every machine.

Engine: each env holds one in-process TextWorld PDDL engine built with the wrappers that
`AlfredTWEnv.init_env` gives every game, `GenericEnvironment -> AlfredDemangler(shuffle=False)
-> AlfredInfos`, and plays `games[task_id]` on `reset`. `AlfredTWEnv`'s own gym env is not used:
it runs each env in a subprocess and cycles through its games in its own order (with no games
its `reset()` spins forever), while the contract needs `reset(options={"task_id": i})`.

Contract details (also in docs/envs.md):
- an action that is not admissible is never sent to the engine: "Nothing happens.",
  `invalid=True`, state unchanged (it counts towards `max_steps`);
- `admissible_actions` = the engine's admissible commands without "help" (verl-agent drops it);
- `won` -> `success_reward` (default 10, as verl-agent); ALFWorld has no subgoal signal, so
  `score` = `progress` = 1.0 when won, else 0.0;
- `anchor` = a hash of the game and its PDDL state (facts without the `checked` bookkeeping),
  `privileged` = the state as text (location, held object, every receptacle's contents);
- `expert_action()` = alfworld's handcoded expert (`HandCodedTWAgent`, as `AlfredExpert` runs it:
  "look" first, then its next command when admissible, else "look"); if it fails or times out,
  the PDDL planner's next command (fast-downward replanning from the current state).

`ALFWORLD_DATA` is set to `data_dir` before `alfworld` is first imported (importing it otherwise
creates `~/.cache/alfworld`). `textworld`/`alfworld` are imported when the env is built, so
importing `rspo_lightning` never needs them (`pip install rspo_lightning[alfworld]`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rspo_lightning.envs.base import TextEnv, normalize_action, text_anchor

#: ALFWorld's six task types (the `task_type` of traj_data.json), in AlfredTWEnv's id order 1..6.
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
#: Household's names for the same task types, accepted in `task_types`.
HOUSEHOLD_TASK_TYPES: dict[str, str] = {
    "pick_and_place": "pick_and_place_simple",
    "pick_clean_then_place": "pick_clean_then_place_in_recep",
    "pick_heat_then_place": "pick_heat_then_place_in_recep",
    "pick_cool_then_place": "pick_cool_then_place_in_recep",
}
#: Split name -> folder under `<data_dir>/json_2.1.1` (the layout `alfworld-download` writes).
SPLIT_DIRS: dict[str, str] = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen"}
GAME_FILE = "game.tw-pddl"
EXPERTS = ("handcoded", "planner")
# Facts that only record what the agent has looked at; no action's precondition reads them.
_BOOKKEEPING_FACTS = frozenset({"checked", "examined"})
_OBJECT_STATES = (
    ("isclean", "clean"),
    ("ishot", "hot"),
    ("iscool", "cool"),
    ("issliced", "sliced"),
    ("ison", "on"),
    ("istoggled", "toggled"),
)
_TASK_LINE = re.compile(r"Your task is to: (.*)")
# The words of the command templates in alfworld's grammar (alfworld/data/alfred.twl2).
_COMMAND_WORDS = "go to open close take from move put into in use heat cool clean slice with examine inventory look"
_GAMES_CACHE: dict[tuple[str, tuple[str, ...]], tuple[AlfworldGame, ...]] = {}


@dataclass(frozen=True)
class AlfworldGame:
    """One playable game: its `game.tw-pddl` path and the task type from its `traj_data.json`."""

    path: str
    task_type: str


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """`data_dir`, else `$ALFWORLD_DATA`, else alfworld's default `~/.cache/alfworld`; must exist."""
    chosen = data_dir if data_dir is not None else os.environ.get("ALFWORLD_DATA") or "~/.cache/alfworld"
    path = Path(chosen).expanduser().resolve()
    if not path.is_dir():
        raise ValueError(
            f"ALFWorld data folder {str(path)!r} does not exist (from "
            f"{'data_dir' if data_dir is not None else 'ALFWORLD_DATA'}); download the games with "
            f"`ALFWORLD_DATA={path} alfworld-download`, or pass data_dir= / set ALFWORLD_DATA to the folder holding json_2.1.1/"
        )
    return path


def canonical_task_types(task_types: Sequence[str] | None) -> tuple[str, ...]:
    """ALFWorld names of `task_types` (ALFWorld or Household names; None = all six), in TASK_TYPES order."""
    if task_types is None:
        return TASK_TYPES
    if isinstance(task_types, str) or not task_types:
        raise ValueError(f"task_types must be None or a non-empty list of {list(TASK_TYPES)}, got {task_types!r}")
    names = {HOUSEHOLD_TASK_TYPES.get(t, t) for t in task_types}
    unknown = sorted(names - set(TASK_TYPES))
    if unknown:
        raise ValueError(
            f"unknown task types {unknown}; valid task types are {list(TASK_TYPES)} "
            f"(or Household's {list(HOUSEHOLD_TASK_TYPES)})"
        )
    return tuple(t for t in TASK_TYPES if t in names)


def find_games(split_dir: str, task_types: tuple[str, ...]) -> tuple[AlfworldGame, ...]:
    """Playable games under `split_dir`, sorted by path. Cached per process when some were found
    (the train split reads ~3,500 game files); an empty result is looked up again next time.

    The rules of `AlfredTWEnv.collect_game_files`: a folder with `traj_data.json` whose
    `task_type` is in `task_types`, no "movable" or "Sliced" in its path, and a `game.tw-pddl`
    beside it whose `solvable` is true.
    """
    key = (split_dir, tuple(task_types))
    if key in _GAMES_CACHE:
        return _GAMES_CACHE[key]
    games = []
    for root, _, files in os.walk(split_dir):
        if "traj_data.json" not in files or "movable" in root or "Sliced" in root:
            continue
        game_path = os.path.join(root, GAME_FILE)
        if not os.path.isfile(game_path):
            continue
        with open(os.path.join(root, "traj_data.json")) as f:
            task_type = json.load(f).get("task_type")
        if task_type not in task_types:
            continue
        with open(game_path) as f:
            if not json.load(f).get("solvable"):
                continue
        games.append(AlfworldGame(game_path, task_type))
    found = tuple(sorted(games, key=lambda g: g.path))
    if found:
        _GAMES_CACHE[key] = found
    return found


def _import_alfworld(data_dir: Path) -> dict[str, Any]:
    """Import textworld and alfworld with ALFWORLD_DATA set to `data_dir` (process-wide)."""
    os.environ["ALFWORLD_DATA"] = str(data_dir)
    try:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from alfworld.agents.expert import HandCodedTWAgent
        from textworld.envs.wrappers import GenericEnvironment
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "rspo/ALFWorld-v0 needs the alfworld package: pip install 'rspo_lightning[alfworld]' "
            "(or pip install alfworld)"
        ) from exc
    return {
        "EnvInfos": textworld.EnvInfos,
        "GenericEnvironment": GenericEnvironment,
        "AlfredDemangler": AlfredDemangler,
        "AlfredInfos": AlfredInfos,
        "HandCodedTWAgent": HandCodedTWAgent,
    }


def _natural_key(name: str) -> tuple[str, int]:
    kind, _, number = name.rpartition(" ")
    return (kind, int(number)) if number.isdigit() else (name, 0)


class ALFWorld(TextEnv):
    """Adapter to the `alfworld` package's TextWorld games (the real ALFWorld text env).

    Args:
        data_dir: Folder holding `json_2.1.1/` (what `alfworld-download` fills); None =
            `$ALFWORLD_DATA`, else `~/.cache/alfworld`. ALFWORLD_DATA is set to it (process-wide)
            before alfworld is imported.
        split: Split `reset` plays when its options name none: "train", "valid_seen" (140 games
            in the download) or "valid_unseen" (134).
        task_types: Task types to keep (ALFWorld names, or Household's short names); None = all six.
        max_steps: Steps (valid or not) before the episode is truncated (verl-agent uses 50).
        success_reward: Reward on the winning step (verl-agent's 10).
        expert: "handcoded" (alfworld's HandCodedTWAgent, run every step as AlfredExpert does;
            falls back to the planner if it fails), "planner" (fast-downward replanning, only when
            `expert_action()` is called), or None (`expert_action()` raises).
        render_mode: None or "ansi".
    """

    splits = tuple(SPLIT_DIRS)

    def __init__(
        self,
        data_dir: str | None = None,
        split: str = "train",
        task_types: list[str] | None = None,
        max_steps: int = 50,
        success_reward: float = 10.0,
        expert: str | None = "handcoded",
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        self.default_split = self.check_split(split)
        self.task_types = canonical_task_types(task_types)
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if expert is not None and expert not in EXPERTS:
            raise ValueError(f"expert must be one of {list(EXPERTS)} or None, got {expert!r}")
        self.max_steps = int(max_steps)
        self.success_reward = float(success_reward)
        self.expert = expert
        self.data_dir = resolve_data_dir(data_dir)
        self.num_tasks(self.default_split)  # no games -> a clear error now, not a spin later
        self._api = _import_alfworld(self.data_dir)
        self._engine = None
        self._loaded_path: str | None = None
        # Before the first reset the env holds a finished, empty episode: step() answers
        # "Nothing happens." instead of raising.
        self._game: AlfworldGame | None = None
        self._state: Any = None
        self._task = ""
        self._steps, self._won, self._truncated, self._done = 0, False, False, True
        self._admissible: dict[str, str] = {}
        self._facts: list[tuple[str, tuple[str, ...]]] = []
        self._handcoded = None
        self._handcoded_next: str | None = None

    # -- TextEnv contract -----------------------------------------------------------------------

    def games(self, split: str) -> tuple[AlfworldGame, ...]:
        """The playable games of `split` (task id = index), possibly none."""
        split_dir = self.data_dir / "json_2.1.1" / SPLIT_DIRS[self.check_split(split)]
        return find_games(str(split_dir), self.task_types)

    def num_tasks(self, split: str) -> int:
        """Games in `split`; raises ValueError naming ALFWORLD_DATA when there are none (AlfredTWEnv
        would spin forever in `reset()`)."""
        n = len(self.games(split))
        if n == 0:
            split_dir = self.data_dir / "json_2.1.1" / SPLIT_DIRS[split]
            raise ValueError(
                f"no ALFWorld games for split {split!r} (task types {list(self.task_types)}) under "
                f"{str(split_dir)!r}; data_dir/ALFWORLD_DATA must hold json_2.1.1/<split>/**/traj_data.json with a "
                f"solvable game.tw-pddl beside it: run `ALFWORLD_DATA={self.data_dir} alfworld-download` "
                f"or set ALFWORLD_DATA / data_dir to the folder that has them"
            )
        return n

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start game `options["task_id"]` of `options["split"]` (default: the `split` kwarg).

        Without a task_id, one is drawn from the env's rng (seeded by `seed`).
        """
        super().reset(seed=seed)
        split, task_id = self.task_from_options(options, self.default_split)
        self._game = self.games(split)[self.check_task_id(split, task_id)]
        engine = self._load(self._game.path)
        state = engine.reset()
        match = _TASK_LINE.search(state["feedback"])
        self._task = match.group(1).strip() if match else ""
        self._steps, self._truncated = 0, False
        self._update(state)
        if self.expert == "handcoded":
            self._handcoded = self._api["HandCodedTWAgent"](max_steps=200)
            self._handcoded.reset(self._game.path)
            self._handcoded.observe(state["feedback"])
            self._handcoded_next = "look"  # AlfredExpert's plan before any command
        return self._observe(state["feedback"]), self._info(False)

    def step(self, action: Any):
        command = self._admitted(action)
        if command is None:
            return self._invalid()
        self._steps += 1
        state, _, _ = self._engine.step(command)
        self._update(state)
        self._truncated = not self._won and self._steps >= self.max_steps
        self._done = self._won or self._truncated
        if self._done:
            self._admissible = {}
        elif self._handcoded is not None:
            self._advance_handcoded(state, command)
        reward = self.success_reward if self._won else 0.0
        return self._observe(state["feedback"]), reward, self._won, self._truncated, self._info(False)

    def expert_action(self) -> str:
        """Next command of the expert (see the `expert` kwarg); "look" once the episode is over."""
        if self.expert is None:
            raise RuntimeError("this ALFWorld env was built with expert=None; pass expert='handcoded' or 'planner'")
        if self._done:
            return "look"
        if self._handcoded is not None and self._handcoded_next is not None:
            return self._handcoded_next
        return self._planner_action()

    def vocabulary(self) -> list[str]:
        """Every word an ALFWorld command can hold, sorted: the verbs of alfworld's command
        grammar, the lowercase object and receptacle class names of `alfworld.gen.constants`
        (the demangled names, "apple", "sinkbasin", ...) and the numbers 1..99. `sample_texts`
        adds them, so a word-level tokenizer covers every admissible command of every game."""
        import alfworld.gen.constants as constants

        words = set(_COMMAND_WORDS.split()) | {str(n) for n in range(1, 100)}
        words |= {name.lower() for name in (*constants.OBJECTS, *constants.RECEPTACLES)}
        return sorted(words)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine, self._loaded_path = None, None
        super().close()

    # -- engine ---------------------------------------------------------------------------------

    def _load(self, path: str):
        if self._engine is None:
            api = self._api
            infos = api["EnvInfos"](won=True, admissible_commands=True, facts=True, extras=["gamefile"])
            # The wrappers AlfredTWEnv.init_env gives each game (its gym env adds only batching).
            self._engine = api["AlfredInfos"](api["AlfredDemangler"](api["GenericEnvironment"](infos), shuffle=False))
        if self._loaded_path != path:
            self._engine.load(path)
            self._loaded_path = path
        return self._engine

    def _update(self, state) -> None:
        self._state = state
        self._won = bool(state["won"])
        self._done = self._won
        commands = [] if self._won else [c for c in state["admissible_commands"] if c != "help"]
        self._admissible = {normalize_action(c): c for c in commands}
        self._facts = sorted((f.name, tuple(a.name.strip() for a in f.arguments)) for f in state["facts"])

    def _advance_handcoded(self, state, command: str) -> None:
        """AlfredExpert's per-step update; an expert error switches this episode to the planner."""
        if self._handcoded_next is None:
            return
        try:
            proposal = self._handcoded.act(state, 0, state["won"], command)
        except Exception:  # noqa: BLE001 - HandCodedAgentTimeout/Failed and its parsing errors
            self._handcoded_next = None
            return
        # AlfredExpert keeps an admissible proposal, else "look"; "help" is not admissible here.
        self._handcoded_next = proposal if proposal in self._admissible.values() else "look"

    def _planner_action(self) -> str:
        """First command of fast-downward's plan from the current state ("look" if none)."""
        pddl_env = self._engine.unwrapped  # textworld's PddlEnv
        try:
            plan = pddl_env._pddl_state.replan(pddl_env._entity_infos)
        except Exception:  # noqa: BLE001 - a planner failure must not break the episode
            plan = []
        return plan[0] if plan and plan[0] in self._admissible.values() else "look"

    # -- info -----------------------------------------------------------------------------------

    def _info(self, invalid: bool) -> dict[str, Any]:
        if self._game is None:  # before the first reset
            return {
                "task": "",
                "task_type": "",
                "admissible_actions": [],
                "anchor": "",
                "privileged": None,
                "won": False,
                "score": 0.0,
                "progress": 0.0,
                "invalid": invalid,
            }
        won = 1.0 if self._won else 0.0
        return {
            "task": self._task,
            "task_type": self._game.task_type,
            "admissible_actions": list(self._admissible.values()),
            "anchor": self._anchor(),
            "privileged": self._privileged(),
            "won": self._won,
            "score": won,
            "progress": won,
            "invalid": invalid,
        }

    def _anchor(self) -> str:
        """`alfworld:` + 16 hex digits of sha1 over the game path and its sorted PDDL facts (minus
        `checked`/`examined`): equal keys <=> same game in the same state."""
        lines = [self._game.path] + [
            f"{name}({', '.join(args)})" for name, args in self._facts if name not in _BOOKKEEPING_FACTS
        ]
        return text_anchor("alfworld:", lines)

    def _privileged(self) -> str:
        """The task, where the agent is, what it holds, and every receptacle's state and contents."""
        where: dict[str, list[str]] = {}  # location -> receptacles there
        contents: dict[str, list[str]] = {}
        states: dict[str, list[str]] = {}
        openable, opened, held, at = set(), set(), [], None
        state_names = dict(_OBJECT_STATES)
        for name, args in self._facts:
            if name == "receptacleatlocation":
                where.setdefault(args[1], []).append(args[0])
                contents.setdefault(args[0], [])
            elif name == "inreceptacle":
                contents.setdefault(args[1], []).append(args[0])
            elif name == "atlocation":
                at = args[1]
            elif name == "holds":
                held.append(args[1])
            elif name == "openable":
                openable.add(args[0])
            elif name == "opened":
                opened.add(args[0])
            elif name in state_names:
                states.setdefault(args[0], []).append(state_names[name])

        def named(obj: str) -> str:
            return f"{obj} ({', '.join(states[obj])})" if obj in states else obj

        here = " / ".join(sorted(where.get(at, []), key=_natural_key)) or "the middle of the room"
        lines = [
            f"Task: {self._task}",
            f"You are at {here}.",
            f"You are holding {', '.join(map(named, held)) or 'nothing'}.",
        ]
        for rec in sorted(contents, key=_natural_key):
            status = (" (open)" if rec in opened else " (closed)") if rec in openable else ""
            objects = ", ".join(named(o) for o in sorted(contents[rec], key=_natural_key)) or "nothing"
            lines.append(f"{rec}{status}: {objects}")
        return "\n".join(lines)
