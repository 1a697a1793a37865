"""Household: an offline look-alike of ALFWorld (Shridhar et al., 2021, arXiv 2010.03768).

One room of numbered receptacles ("cabinet 2", "fridge 1", "desklamp 1") holding numbered
objects ("apple 1"), the six ALFWorld task types under their ALFWorld names, ALFWorld's command
grammar and messages, admissible actions, and an expert planner. Tasks are generated from
(seed, split, task_id) with a sha256-seeded `random.Random`, so the same spec always gives the
same initial state on every machine.

Deviations from ALFWorld (also in docs/envs.md):
- `info["anchor"]` is a canonical state key, not the observation text: "Nothing happens." (and
  "You are facing the X. Next to it, you see nothing.") would pool unrelated states.
- The desk lamp is a location of its own ("desklamp 1"), not an object on a side table; arriving
  at it says whether it is on. Objects cannot be put on it.
- clean / heat / cool work at the appliance without opening it (ALFWorld's high-level commands
  behave the same way); "use desklamp 1" turns the lamp on and never off.
- valid_unseen holds out (object type, goal receptacle type) combinations rather than rooms.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from rspo_lightning.envs.base import NOTHING_HAPPENS, WORD_PATTERN, TextEnv

# -- the world's catalogue ---------------------------------------------------------------------

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj_and_place",
)

# The appliance each task type needs in the room, and the object ability it relies on.
_APPLIANCE = {
    "look_at_obj_in_light": "desklamp",
    "pick_clean_then_place": "sinkbasin",
    "pick_heat_then_place": "microwave",
    "pick_cool_then_place": "fridge",
}
_ABILITY = {
    "look_at_obj_in_light": "look",
    "pick_clean_then_place": "clean",
    "pick_heat_then_place": "heat",
    "pick_cool_then_place": "cool",
}
# The object state a place task requires of the placed object (None: any state).
_REQUIRED_STATE = {
    "pick_and_place": None,
    "pick_clean_then_place": "clean",
    "pick_heat_then_place": "hot",
    "pick_cool_then_place": "cool",
}

# Object type -> task abilities beyond plain pick/place and pick-two (which every object has).
OBJECT_TYPES: dict[str, frozenset[str]] = {
    name: frozenset(abilities.split())
    for name, abilities in {
        "apple": "clean heat cool",
        "bread": "heat cool",
        "egg": "clean heat cool",
        "lettuce": "clean cool",
        "potato": "clean heat cool",
        "tomato": "clean heat cool",
        "mug": "clean heat cool look",
        "cup": "clean heat cool",
        "plate": "clean heat cool",
        "bowl": "clean cool look",
        "pan": "clean cool",
        "pot": "clean cool",
        "knife": "clean",
        "fork": "clean",
        "spoon": "clean",
        "spatula": "clean",
        "ladle": "clean",
        "cloth": "clean",
        "soapbar": "clean",
        "winebottle": "cool",
        "pencil": "look",
        "pen": "look",
        "book": "look",
        "cd": "look",
        "keychain": "look",
        "creditcard": "look",
        "cellphone": "look",
        "alarmclock": "look",
        "remotecontrol": "look",
        "statue": "look",
        "vase": "look",
        "box": "look",
        "pillow": "look",
        "laptop": "look",
        "newspaper": "look",
        "watch": "look",
        "candle": "",
        "spraybottle": "",
        "towel": "",
        "tissuebox": "",
    }.items()
}

# Receptacle types an object can be asked to go into.
GOAL_RECEPTACLES: tuple[str, ...] = (
    "countertop",
    "cabinet",
    "drawer",
    "shelf",
    "diningtable",
    "desk",
    "sidetable",
    "dresser",
    "coffeetable",
    "sofa",
    "armchair",
    "bed",
    "garbagecan",
    "safe",
    "fridge",
    "microwave",
    "sinkbasin",
)
# Receptacles that fill the rest of the room (repeats make cabinets and drawers common).
_FILLER_RECEPTACLES: tuple[str, ...] = (
    "cabinet",
    "cabinet",
    "cabinet",
    "drawer",
    "drawer",
    "drawer",
    "countertop",
    "countertop",
    "shelf",
    "shelf",
    "diningtable",
    "desk",
    "sidetable",
    "dresser",
    "coffeetable",
    "sofa",
    "armchair",
    "bed",
    "garbagecan",
    "safe",
    "stoveburner",
    "toaster",
    "coffeemachine",
)
# Filler types a room has at most one of (a room with three beds reads oddly).
_SINGLE_FILLERS = frozenset(
    {"diningtable", "desk", "dresser", "coffeetable", "sofa", "bed", "garbagecan", "toaster", "coffeemachine"}
)
OPENABLE: frozenset[str] = frozenset({"fridge", "cabinet", "drawer", "microwave", "safe"})
_LAMP = "desklamp"


def is_unseen_combination(object_type: str, receptacle_type: str) -> bool:
    """Whether a goal (object type, receptacle type) pair belongs to valid_unseen only.

    A fixed modular rule over the catalogue order: every fifth receptacle type per object.
    Look tasks use the receptacle type "desklamp".
    """
    receptacle_index = (GOAL_RECEPTACLES + (_LAMP,)).index(receptacle_type)
    return (list(OBJECT_TYPES).index(object_type) + receptacle_index) % 5 == 0


def _goal_combinations(task_type: str, unseen: bool) -> list[tuple[str, str]]:
    """All goal (object type, receptacle type) pairs of `task_type` in one side of the split."""
    if task_type == "look_at_obj_in_light":
        pairs = [(o, _LAMP) for o, ab in OBJECT_TYPES.items() if "look" in ab]
    else:
        ability = _ABILITY.get(task_type)
        appliance = _APPLIANCE.get(task_type)
        pairs = [
            (o, r)
            for o, ab in OBJECT_TYPES.items()
            if ability is None or ability in ab
            for r in GOAL_RECEPTACLES
            if r != appliance
        ]
    return [p for p in pairs if is_unseen_combination(*p) == unseen]


_COMBINATIONS = {(t, u): _goal_combinations(t, u) for t in TASK_TYPES for u in (False, True)}
assert all(_COMBINATIONS.values()), "every task type needs seen and unseen goal combinations"

_INSTRUCTIONS = {
    "pick_and_place": ("put a {o} in {r}.", "put some {o} on {r}."),
    "look_at_obj_in_light": ("look at {o} under the desklamp.", "examine the {o} with the desklamp."),
    "pick_clean_then_place": ("put a clean {o} in {r}.", "clean some {o} and put it in {r}."),
    "pick_heat_then_place": ("put a hot {o} in {r}.", "heat some {o} and put it in {r}."),
    "pick_cool_then_place": ("put a cool {o} in {r}.", "cool some {o} and put it in {r}."),
    "pick_two_obj_and_place": ("put two {o} in {r}.", "find two {o} and put them in {r}."),
}
_WELCOME = "-= Welcome to TextWorld, ALFRED! =-\n\n{look}\n\nYour task is to: {task}"
# Every fixed text the env prints; vocabulary() tokenises them with the names removed.
_MESSAGES = (
    _WELCOME,
    NOTHING_HAPPENS,
    *(t for pair in _INSTRUCTIONS.values() for t in pair),
    "You are in the middle of a room. Looking quickly around you, you see nothing.",
    "You are facing the {r}. Next to it, you see nothing.",
    "You arrive at {r}.",
    "The {r} is closed.",
    "The {r} is open. In it, you see a {o}, and a {o}.",
    "On the {r}, you see a {o}.",
    "The {r} is on.",
    "The {r} is off.",
    "You open the {r}.",
    "You close the {r}.",
    "You pick up the {o} from the {r}.",
    "You put the {o} in/on the {r}.",
    "You clean the {o} using the {r}.",
    "You heat the {o} using the {r}.",
    "You cool the {o} using the {r}.",
    "You turn on the {r}.",
    "There's nothing special about {o}.",
    "You are carrying: a {o}.",
    "You are not carrying anything.",
    "go to {r}",
    "open {r}",
    "close {r}",
    "take {o} from {r}",
    "put {o} in/on {r}",
    "clean {o} with {r}",
    "heat {o} with {r}",
    "cool {o} with {r}",
    "use {r}",
    "examine {r}",
    "inventory",
    "look",
)
#: How `vocabulary()` splits text into words (the same split as HF's `Whitespace` pre-tokenizer).

DIFFICULTY_PRESETS: dict[int, dict[str, Any]] = {
    0: dict(task_types=["pick_and_place"], num_receptacles=6, num_distractors=2, max_steps=10),
    1: dict(task_types=["pick_and_place", "look_at_obj_in_light"], num_receptacles=8, num_distractors=4, max_steps=20),
    2: dict(task_types=list(TASK_TYPES[:5]), num_receptacles=12, num_distractors=6, max_steps=30),
    3: dict(task_types=list(TASK_TYPES), num_receptacles=20, num_distractors=12, max_steps=50),
}
_DEFAULTS = dict(task_types=list(TASK_TYPES), num_receptacles=12, num_distractors=6, max_steps=50)


@dataclass(frozen=True)
class HouseholdTask:
    """One generated task: the goal and the initial room."""

    task_type: str
    object_type: str
    #: Goal receptacle type; "desklamp" for look_at_obj_in_light.
    receptacle_type: str
    instruction: str
    #: Receptacle names in the order the room describes them.
    receptacles: tuple[str, ...]
    #: (object name, receptacle name) for every object at the start.
    placement: tuple[tuple[str, str], ...]


def _type_of(name: str) -> str:
    return name.rsplit(" ", 1)[0]


def _natural_key(name: str) -> tuple[str, int]:
    kind, number = name.rsplit(" ", 1)
    return kind, int(number)


def _numbered(types: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    names = []
    for kind in types:
        counts[kind] = counts.get(kind, 0) + 1
        names.append(f"{kind} {counts[kind]}")
    return names


def _a_list(names: list[str]) -> str:
    """ALFWorld's listing: "nothing", "a apple 1", "a apple 1, and a mug 2", "a x, a y, and a z"."""
    if not names:
        return "nothing"
    items = [f"a {n}" for n in names]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


def generate_task(
    seed: int,
    split: str,
    task_id: int,
    task_types: tuple[str, ...],
    num_receptacles: int,
    num_distractors: int,
    object_types: tuple[str, ...] | None = None,
) -> HouseholdTask:
    """Build the task `(seed, split, task_id)`; pure and stable across Python runs.

    `object_types` restricts goal objects and distractors to these types (None = all)."""
    digest = hashlib.sha256(f"household|{seed}|{split}|{task_id}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    task_type = rng.choice(task_types)
    combos = _COMBINATIONS[task_type, split == "valid_unseen"]
    if object_types is not None:
        combos = [c for c in combos if c[0] in object_types]
    object_type, goal_type = rng.choice(combos)
    instruction = rng.choice(_INSTRUCTIONS[task_type]).format(o=object_type, r=goal_type)

    types = sorted({_APPLIANCE[t] for t in task_types if t in _APPLIANCE})
    if goal_type not in types:
        types.append(goal_type)
    # The first filler is never the goal type, so a target object always has a place to start.
    types.append(rng.choice([r for r in _FILLER_RECEPTACLES if r != goal_type]))
    while len(types) < num_receptacles:
        types.append(rng.choice([r for r in _FILLER_RECEPTACLES if r not in _SINGLE_FILLERS or r not in types]))
    rng.shuffle(types)
    receptacles = _numbered(types)

    placeable = [r for r in receptacles if _type_of(r) != _LAMP]
    starts = [r for r in placeable if _type_of(r) != goal_type]
    num_targets = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 2)
    others = [o for o in (object_types or OBJECT_TYPES) if o != object_type]
    object_types = [object_type] * num_targets + [rng.choice(others) for _ in range(num_distractors)]
    objects = _numbered(object_types)
    placement = tuple((obj, rng.choice(starts if i < num_targets else placeable)) for i, obj in enumerate(objects))
    return HouseholdTask(task_type, object_type, goal_type, instruction, tuple(receptacles), placement)


class Household(TextEnv):
    """Offline ALFWorld look-alike: six task types, ALFWorld grammar, admissible actions, expert.

    Args:
        task_types: Subset of the six ALFWorld task types to sample from; None = all six (or
            the difficulty preset's).
        num_receptacles: Receptacles in the room, appliances included; must be at least the
            number of appliances the task types need + 2. None = 12 (or the preset's).
        num_distractors: Extra objects of non-goal types. None = 6 (or the preset's).
        max_steps: Steps (valid or not) before the episode is truncated. None = 50 (or the
            preset's).
        success_reward: Reward on the winning step.
        seed: World seed; tasks are a function of (seed, split, task_id).
        num_train_tasks: Tasks in the train split.
        num_valid_seen: Tasks in valid_seen (goal combinations seen in train).
        num_valid_unseen: Tasks in valid_unseen (held-out goal combinations).
        difficulty: Preset 0..3 (see DIFFICULTY_PRESETS) for the four arguments above left at
            None; explicit arguments win over the preset.
        num_object_types: Use only the first N object types of the catalogue (OBJECT_TYPES order)
            for goals and distractors (None = all 40); fewer types make an easier task for
            tiny models. Every task type must keep seen and unseen goal combinations.
        info_actions: Offer the state-preserving commands "examine X", "inventory" and "look"
            (ALFWorld does). False removes them (an easy setting for tiny models, which otherwise
            spend most early turns on them); typed anyway they are then invalid.
        render_mode: None or "ansi".
    """

    splits = ("train", "valid_seen", "valid_unseen")

    def __init__(
        self,
        task_types: list[str] | None = None,
        num_receptacles: int | None = None,
        num_distractors: int | None = None,
        max_steps: int | None = None,
        success_reward: float = 10.0,
        seed: int = 0,
        num_train_tasks: int = 10000,
        num_valid_seen: int = 140,
        num_valid_unseen: int = 134,
        difficulty: int | None = None,
        num_object_types: int | None = None,
        info_actions: bool = True,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if difficulty is not None and difficulty not in DIFFICULTY_PRESETS:
            raise ValueError(f"difficulty must be None or one of {list(DIFFICULTY_PRESETS)}, got {difficulty!r}")
        preset = DIFFICULTY_PRESETS[difficulty] if difficulty is not None else _DEFAULTS
        task_types = preset["task_types"] if task_types is None else task_types
        num_receptacles = preset["num_receptacles"] if num_receptacles is None else num_receptacles
        num_distractors = preset["num_distractors"] if num_distractors is None else num_distractors
        max_steps = preset["max_steps"] if max_steps is None else max_steps

        if isinstance(task_types, str) or not task_types:
            raise ValueError(f"task_types must be a non-empty list of {list(TASK_TYPES)}, got {task_types!r}")
        unknown = [t for t in task_types if t not in TASK_TYPES]
        if unknown:
            raise ValueError(f"unknown task types {unknown}; valid task types are {list(TASK_TYPES)}")
        self.task_types = tuple(t for t in TASK_TYPES if t in task_types)
        appliances = sorted({_APPLIANCE[t] for t in self.task_types if t in _APPLIANCE})
        if int(num_receptacles) < len(appliances) + 2:
            raise ValueError(
                f"num_receptacles must be >= {len(appliances) + 2} for task types "
                f"{list(self.task_types)} (appliances {appliances} + a goal + a start receptacle), "
                f"got {num_receptacles}"
            )
        for name, value, low in (
            ("num_distractors", num_distractors, 0),
            ("max_steps", max_steps, 1),
            ("num_train_tasks", num_train_tasks, 1),
            ("num_valid_seen", num_valid_seen, 1),
            ("num_valid_unseen", num_valid_unseen, 1),
        ):
            if int(value) < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        self.num_receptacles = int(num_receptacles)
        self.num_distractors = int(num_distractors)
        self.max_steps = int(max_steps)
        self.info_actions = bool(info_actions)
        self.object_types = None
        if num_object_types is not None:
            if int(num_object_types) < 2:
                raise ValueError(f"num_object_types must be >= 2 or None, got {num_object_types}")
            self.object_types = tuple(list(OBJECT_TYPES)[: int(num_object_types)])
            for t in self.task_types:
                for unseen in (False, True):
                    if not any(c[0] in self.object_types for c in _COMBINATIONS[t, unseen]):
                        raise ValueError(
                            f"num_object_types={num_object_types} leaves task type {t!r} without "
                            f"{'unseen' if unseen else 'seen'} goals; use more object types"
                        )
        self.success_reward = float(success_reward)
        self.seed = int(seed)
        self._num_tasks = {
            "train": int(num_train_tasks),
            "valid_seen": int(num_valid_seen),
            "valid_unseen": int(num_valid_unseen),
        }
        # A fresh env holds train task 0 as an already-finished episode: step() before reset()
        # answers "Nothing happens." instead of raising.
        self._load("train", 0)
        self._done = True

    # -- TextEnv contract -----------------------------------------------------------------------

    def num_tasks(self, split: str) -> int:
        return self._num_tasks[self.check_split(split)]

    def task(self, split: str, task_id: int) -> HouseholdTask:
        """The task `(split, task_id)` under this env's settings (does not change the state)."""
        split = self.check_split(split)
        task_id = self.check_task_id(split, task_id)
        return generate_task(
            self.seed, split, task_id, self.task_types, self.num_receptacles, self.num_distractors, self.object_types
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start task `options["task_id"]` of `options["split"]` (default "train").

        Without a task_id, one is drawn from the env's rng (seeded by `seed`).
        """
        super().reset(seed=seed)
        split, task_id = self.task_from_options(options)
        self._load(split, task_id)
        welcome = _WELCOME.format(look=self._do_look(), task=self._task.instruction)
        return self._observe(welcome), self._info(False)

    def step(self, action: Any):
        command = self._admitted(action)
        if command is None:
            return self._invalid()
        self._steps += 1
        observation = getattr(self, "_do_" + command[0])(*command[1:])
        done, total = self._progress_counts()
        self._won = done == total
        self._truncated = not self._won and self._steps >= self.max_steps
        self._done = self._won or self._truncated
        self._admissible = {} if self._done else self._compute_admissible()
        reward = self.success_reward if self._won else 0.0
        return self._observe(observation), reward, self._won, self._truncated, self._info(False)

    def _info(self, invalid: bool) -> dict[str, Any]:
        done, total = self._progress_counts()
        return {
            "task": self._task.instruction,
            "task_type": self._task.task_type,
            "admissible_actions": list(self._admissible),
            "anchor": self._anchor(),
            "privileged": self._privileged(),
            "won": self._won,
            "score": 1.0 if self._won else 0.0,
            "progress": done / total,
            "invalid": invalid,
        }

    # -- state ----------------------------------------------------------------------------------

    def _load(self, split: str, task_id: int) -> None:
        task = self.task(split, task_id)
        self._task = task
        self._split, self._task_id = split, task_id
        self._contents: dict[str, list[str]] = {r: [] for r in task.receptacles}
        self._location_of: dict[str, str] = {}  # object -> receptacle; held objects are absent
        for obj, rec in task.placement:
            self._contents[rec].append(obj)
            self._location_of[obj] = rec
        self._initial_location = dict(self._location_of)
        self._open: set[str] = set()
        self._lamp_on = False
        self._clean: set[str] = set()
        self._temperature: dict[str, str] = {}  # object -> "hot" | "cool"
        self._held: str | None = None
        self._at: str | None = None  # None = the middle of the room
        self._steps = 0
        self._won = self._truncated = self._done = False
        self._admissible = self._compute_admissible()

    def _accessible(self, rec: str) -> bool:
        return _type_of(rec) not in OPENABLE or rec in self._open

    def _has_state(self, obj: str, state: str | None) -> bool:
        if state is None:
            return True
        return obj in self._clean if state == "clean" else self._temperature.get(obj) == state

    def _compute_admissible(self) -> dict[str, tuple[str, ...]]:
        """Normalised command -> (handler, args), in ALFWorld's grouping."""
        at, held = self._at, self._held
        commands: dict[str, tuple[str, ...]] = {}
        for rec in sorted(self._task.receptacles, key=_natural_key):
            if rec != at:
                commands[f"go to {rec}"] = ("go", rec)
        if at is not None:
            kind = _type_of(at)
            if kind in OPENABLE:
                commands[f"close {at}" if at in self._open else f"open {at}"] = (
                    ("close", at) if at in self._open else ("open", at)
                )
            if kind == _LAMP:
                commands[f"use {at}"] = ("use", at)
            elif self._accessible(at):
                if held is None:
                    for obj in self._contents[at]:
                        commands[f"take {obj} from {at}"] = ("take", obj, at)
                else:
                    commands[f"put {held} in/on {at}"] = ("put", held, at)
            if held is not None:
                verb = {"sinkbasin": "clean", "microwave": "heat", "fridge": "cool"}.get(kind)
                if verb:
                    commands[f"{verb} {held} with {at}"] = (verb, held, at)
            if self.info_actions:
                commands[f"examine {at}"] = ("examine", at)
        if not self.info_actions:
            return commands
        if held is not None:
            commands[f"examine {held}"] = ("examine", held)
        commands["inventory"] = ("inventory",)
        commands["look"] = ("look",)
        return commands

    def _describe(self, rec: str) -> str:
        kind = _type_of(rec)
        if kind == _LAMP:
            return f"The {rec} is {'on' if self._lamp_on else 'off'}."
        if kind in OPENABLE:
            if rec not in self._open:
                return f"The {rec} is closed."
            return f"The {rec} is open. In it, you see {_a_list(self._contents[rec])}."
        return f"On the {rec}, you see {_a_list(self._contents[rec])}."

    # -- command handlers (only ever called with admissible arguments) ---------------------------

    def _do_go(self, rec: str) -> str:
        self._at = rec
        return f"You arrive at {rec}. {self._describe(rec)}"

    def _do_open(self, rec: str) -> str:
        self._open.add(rec)
        return f"You open the {rec}. {self._describe(rec)}"

    def _do_close(self, rec: str) -> str:
        self._open.discard(rec)
        return f"You close the {rec}."

    def _do_take(self, obj: str, rec: str) -> str:
        self._contents[rec].remove(obj)
        del self._location_of[obj]
        self._held = obj
        return f"You pick up the {obj} from the {rec}."

    def _do_put(self, obj: str, rec: str) -> str:
        self._contents[rec].append(obj)
        self._location_of[obj] = rec
        self._held = None
        return f"You put the {obj} in/on the {rec}."

    def _do_clean(self, obj: str, rec: str) -> str:
        self._clean.add(obj)
        return f"You clean the {obj} using the {rec}."

    def _do_heat(self, obj: str, rec: str) -> str:
        self._temperature[obj] = "hot"
        return f"You heat the {obj} using the {rec}."

    def _do_cool(self, obj: str, rec: str) -> str:
        self._temperature[obj] = "cool"
        return f"You cool the {obj} using the {rec}."

    def _do_use(self, rec: str) -> str:
        self._lamp_on = True
        return f"You turn on the {rec}."

    def _do_examine(self, name: str) -> str:
        if name in self._contents:
            return self._describe(name)
        return f"There's nothing special about {name}."

    def _do_inventory(self) -> str:
        return f"You are carrying: a {self._held}." if self._held else "You are not carrying anything."

    def _do_look(self) -> str:
        if self._at is None:
            seen = _a_list(list(self._task.receptacles))
            return f"You are in the middle of a room. Looking quickly around you, you see {seen}."
        return f"You are facing the {self._at}. Next to it, you see nothing."

    # -- progress, anchor, privileged text ------------------------------------------------------

    def _is_target(self, obj: str | None) -> bool:
        return obj is not None and _type_of(obj) == self._task.object_type

    def _progress_counts(self) -> tuple[int, int]:
        """(subgoals satisfied now, subgoals in the task); won iff they are equal.

        place tasks: [target taken (held or in a goal receptacle), target has the required
        state (clean/hot/cool tasks only), target in a goal receptacle with that state], best
        target object. pick two: [first taken, first placed, second taken, second placed] with
        "placed" = in the goal receptacle holding most targets. look: [target held, lamp on,
        at the lamp while holding the target].
        """
        task, held = self._task, self._held
        if task.task_type == "look_at_obj_in_light":
            holding = self._is_target(held)
            at_lamp = self._at is not None and _type_of(self._at) == _LAMP
            return holding + self._lamp_on + (holding and at_lamp), 3
        if task.task_type == "pick_two_obj_and_place":
            placed = max(
                (
                    min(2, sum(map(self._is_target, objs)))
                    for rec, objs in self._contents.items()
                    if _type_of(rec) == task.receptacle_type
                ),
                default=0,
            )
            return placed + min(2, placed + self._is_target(held)), 4
        state = _REQUIRED_STATE[task.task_type]
        best = 0
        for obj in self._objects_of_target_type():
            in_goal = obj in self._location_of and _type_of(self._location_of[obj]) == task.receptacle_type
            has = self._has_state(obj, state)
            score = (obj == held or in_goal) + (in_goal and has)
            if state is not None:
                score += has
            best = max(best, score)
        return best, (2 if state is None else 3)

    def _objects_of_target_type(self) -> list[str]:
        return [o for o, _ in self._task.placement if self._is_target(o)]

    def _object_states(self, obj: str) -> list[str]:
        return (["clean"] if obj in self._clean else []) + (
            [self._temperature[obj]] if obj in self._temperature else []
        )

    def _anchor(self) -> str:
        """Canonical state key: location, held object, open receptacles, lamp, and every object
        that is a target or has moved or changed state. Equal keys <=> equal task-relevant state."""
        parts = []
        for obj, start in self._task.placement:
            where = self._location_of.get(obj, "held")
            states = self._object_states(obj)
            if self._is_target(obj) or where != start or states:
                parts.append(f"{obj}@{where}" + "".join(f"+{s}" for s in states))
        return (
            f"at={self._at or 'middle'}|held={self._held or 'nothing'}"
            f"|open={','.join(sorted(self._open, key=_natural_key))}"
            f"|lamp={'on' if self._lamp_on else 'off'}|objects={';'.join(parts)}"
        )

    def _privileged(self) -> str:
        """Full state text: where the agent is, what it holds, every receptacle's contents."""

        def named(obj: str) -> str:
            states = self._object_states(obj)
            return f"{obj} ({', '.join(states)})" if states else obj

        lines = [
            f"Task: {self._task.instruction}",
            f"You are at {self._at or 'the middle of the room'}.",
            f"You are holding {named(self._held) if self._held else 'nothing'}.",
        ]
        for rec in sorted(self._task.receptacles, key=_natural_key):
            kind = _type_of(rec)
            status = (
                ("on" if self._lamp_on else "off")
                if kind == _LAMP
                else (("open" if rec in self._open else "closed") if kind in OPENABLE else "")
            )
            contents = ", ".join(named(o) for o in self._contents[rec]) or "nothing"
            lines.append(f"{rec}{f' ({status})' if status else ''}: {contents}")
        return "\n".join(lines)

    # -- expert ---------------------------------------------------------------------------------

    def expert_action(self) -> str:
        """Next action of a shortest-style plan from the current state, using privileged
        knowledge of where objects are. Recovers from any earlier actions: a wrong held object
        is put down first, then the nearest-to-done target object is fetched and processed."""
        if self._done:
            return "look"
        task, held = self._task, self._held
        if held is not None and not self._is_target(held):
            return self._expert_drop(held)
        if task.task_type == "look_at_obj_in_light":
            if held is None:
                return self._expert_take(self._expert_pick_target(None))
            lamp = next(r for r in task.receptacles if _type_of(r) == _LAMP)
            return f"go to {lamp}" if self._at != lamp else f"use {lamp}"
        state = _REQUIRED_STATE.get(task.task_type)
        if held is not None:
            if not self._has_state(held, state):
                appliance = next(r for r in task.receptacles if _type_of(r) == _APPLIANCE[task.task_type])
                if self._at != appliance:
                    return f"go to {appliance}"
                return f"{_ABILITY[task.task_type]} {held} with {appliance}"
            return self._expert_put(held, self._expert_goal_receptacle())
        exclude = self._expert_goal_receptacle() if task.task_type == "pick_two_obj_and_place" else None
        return self._expert_take(self._expert_pick_target(exclude, state))

    def _expert_goal_receptacle(self) -> str:
        """Goal receptacle to fill: most targets already inside, then open, then by name."""
        goal = [r for r in self._task.receptacles if _type_of(r) == self._task.receptacle_type]
        return min(
            goal,
            key=lambda r: (-sum(map(self._is_target, self._contents[r])), not self._accessible(r), _natural_key(r)),
        )

    def _expert_pick_target(self, exclude: str | None, state: str | None = None) -> str:
        """Target object to fetch (not from `exclude`): already processed, reachable, by name."""
        candidates = [
            o for o in self._objects_of_target_type() if o in self._location_of and self._location_of[o] != exclude
        ]
        return min(
            candidates,
            key=lambda o: (not self._has_state(o, state), not self._accessible(self._location_of[o]), _natural_key(o)),
        )

    def _expert_take(self, obj: str) -> str:
        rec = self._location_of[obj]
        if self._at != rec:
            return f"go to {rec}"
        return f"open {rec}" if not self._accessible(rec) else f"take {obj} from {rec}"

    def _expert_put(self, obj: str, rec: str) -> str:
        if self._at != rec:
            return f"go to {rec}"
        return f"open {rec}" if not self._accessible(rec) else f"put {obj} in/on {rec}"

    def _expert_drop(self, obj: str) -> str:
        """Put a useless held object down here, or at the first receptacle that needs no opening."""
        if self._at is not None and _type_of(self._at) != _LAMP:
            return self._expert_put(obj, self._at)
        recs = sorted((r for r in self._task.receptacles if _type_of(r) != _LAMP), key=_natural_key)
        return self._expert_put(obj, min(recs, key=lambda r: not self._accessible(r)))

    # -- vocabulary -----------------------------------------------------------------------------

    def vocabulary(self) -> list[str]:
        """Every word (a `WORD_PATTERN` match) the env can print under these settings, sorted."""
        words: set[str] = set()
        for message in _MESSAGES:
            words.update(WORD_PATTERN.findall(message.format(o="", r="", look="", task="")))
        words.update(OBJECT_TYPES)
        words.update(GOAL_RECEPTACLES + _FILLER_RECEPTACLES + (_LAMP,))
        largest_number = max(self.num_receptacles, self.num_distractors + 3)
        words.update(str(n) for n in range(1, largest_number + 1))
        return sorted(words)
