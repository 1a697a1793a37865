"""TextWorld: adapter to games made with Microsoft TextWorld's `tw-make` (Côté et al., 2018,
arXiv 1806.11532).

`gymnasium.make("rspo/TextWorld-v0", games=[paths])`; `reset(options={"task_id": i})` plays
`games[i]`. The engine (`textworld.start`, the Inform 7 / Z-machine game plus TextWorld's state
tracker) supplies the admissible commands, the score and max score, won/lost, the world's
facts and the winning policy from the current state; this module adds the TextEnv contract:

- an action that is not admissible is never sent to the engine: "Nothing happens.",
  `invalid=True`, state unchanged (it counts towards `max_steps`);
- `won` -> `success_reward`; `score` = `progress` = engine score / max score;
- `anchor` = a hash of the world's facts (the state tracker's exact state), `privileged` = the
  facts as text, `expert_action()` = the first command of the engine's winning policy;
- observations are the engine's feedback without the ASCII-art banner, the status line and the
  "RESTART, RESTORE ... QUIT" prompt.

Every `.z8`/`.ulx` game needs the `.json` that `tw-make` writes next to it (it holds the logic
the admissible commands and facts come from). `textworld` is imported when the env is built, so
importing `rspo_lightning` never needs it (`pip install rspo_lightning[textworld]`).
"""

from __future__ import annotations

import collections
import contextlib
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rspo_lightning.envs.base import TextEnv, import_optional, normalize_action, text_anchor

#: Split names a plain list of games serves (a dict of lists names its own splits).
LIST_SPLITS: tuple[str, ...] = ("train",)
# A line of TextWorld's ASCII-art banner: only these characters, and at least one of "$_|".
_BANNER_CHARS = frozenset(" _|\\/$<>")
_END_PROMPT = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"
# The Z-machine status line at the end of each feedback: ">   -= Kitchen =-0/7".
_STATUS_LINE = re.compile(r"\n>[^\n]*\Z")
# A challenge name in a game uuid ("tw-cooking-recipe1+...", "tw-coin_collector-..."); the
# uuid of a `tw-make custom` game has a mixed-case hash in that place instead.
_CHALLENGE = re.compile(r"tw-([a-z_]+)-")


def clean_feedback(text: str) -> str:
    """The engine's feedback as a player reads it: banner, status line and end prompt removed,
    runs of blank lines collapsed to one, surrounding whitespace stripped."""
    text = _STATUS_LINE.sub("", text).replace(_END_PROMPT, "")
    lines = [
        line.rstrip()
        for line in text.split("\n")
        if not (line.strip() and set(line) <= _BANNER_CHARS and set(line) & set("$_|"))
    ]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def fact_text(fact: Any) -> str:
    """One TextWorld proposition as `name(arg, arg)` with entity names ("in(apple, fridge)")."""
    return f"{fact.name}({', '.join(arg.name for arg in fact.arguments)})"


def task_type_of(uuid: str) -> str:
    """The challenge a game was made with, from its uuid ("cooking", "coin_collector",
    "treasure_hunter", "simple"); "custom" for `tw-make custom` games and unknown uuids."""
    match = _CHALLENGE.match(uuid or "")
    return match.group(1) if match else "custom"


@contextlib.contextmanager
def _quiet_jericho():
    """Hide Jericho's "not fully supported" warning: it cannot read the score of Inform 7 games,
    which TextWorld's own state tracker supplies."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is not fully supported", category=UserWarning)
        yield


def _import_textworld():
    return import_optional("textworld", "rspo/TextWorld-v0", "textworld")


class TextWorld(TextEnv):
    """Adapter to TextWorld games made with `tw-make`.

    Args:
        games: Game files (`.z8` or `.ulx`, each with the `.json` tw-make writes beside it).
            A list serves every split name (`splits` = ("train",)); a dict
            `{split: [paths]}` defines the splits and their games (use one to validate on
            other games, e.g. `{"train": [...], "valid_seen": [...]}`).
        max_steps: Steps (valid or not) before the episode is truncated.
        success_reward: Reward on the winning step.
        max_loaded_games: Engines kept loaded per env (least recently used first out); loading
            a game takes ~0.25 s, resetting a loaded one ~10 ms.
        render_mode: None or "ansi".
    """

    def __init__(
        self,
        games: Sequence[str] | Mapping[str, Sequence[str]],
        max_steps: int = 50,
        success_reward: float = 10.0,
        max_loaded_games: int = 4,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if isinstance(games, (str, Path)):
            games = [games]
        if isinstance(games, Mapping):
            self._games = {str(split): [str(p) for p in paths] for split, paths in games.items()}
            self._any_split = False
        else:
            self._games = {LIST_SPLITS[0]: [str(p) for p in games]}
            self._any_split = True
        self.splits = tuple(self._games)
        for split, paths in self._games.items():
            if not paths:
                raise ValueError(f"games for split {split!r} is empty; pass game files made with tw-make")
            for path in paths:
                _check_game_file(path)
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if int(max_loaded_games) < 1:
            raise ValueError(f"max_loaded_games must be >= 1, got {max_loaded_games}")
        self.max_steps = int(max_steps)
        self.success_reward = float(success_reward)
        self.max_loaded_games = int(max_loaded_games)
        textworld = _import_textworld()
        self._request = textworld.EnvInfos(
            admissible_commands=True,
            score=True,
            max_score=True,
            won=True,
            lost=True,
            objective=True,
            facts=True,
            policy_commands=True,
        )
        self._engines: collections.OrderedDict[str, Any] = collections.OrderedDict()
        # Before the first reset the env holds a finished, empty episode: step() answers
        # "Nothing happens." instead of raising.
        self._game_path, self._task_type, self._state = "", "custom", None
        self._steps, self._won, self._lost, self._truncated, self._done = 0, False, False, False, True
        self._admissible: dict[str, str] = {}

    # -- TextEnv contract -----------------------------------------------------------------------

    def check_split(self, split: Any) -> str:
        """A list of games answers to any split name (it maps to "train"); a dict to its keys."""
        if self._any_split and isinstance(split, str):
            return LIST_SPLITS[0]
        return super().check_split(split)

    def num_tasks(self, split: str) -> int:
        return len(self._games[self.check_split(split)])

    def game_path(self, split: str, task_id: int) -> str:
        """The game file of `(split, task_id)`."""
        split = self.check_split(split)
        return self._games[split][self.check_task_id(split, task_id)]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start the game `options["task_id"]` of `options["split"]` (default "train").

        Without a task_id, one is drawn from the env's rng (seeded by `seed`).
        """
        super().reset(seed=seed)
        split, task_id = self.task_from_options(options)
        self._game_path = self.game_path(split, task_id)
        state = self._engine(self._game_path).reset()
        self._task_type = task_type_of(state["game"].metadata.get("uuid", ""))
        self._steps, self._truncated = 0, False
        self._update(state)
        return self._observe(clean_feedback(state.feedback)), self._info(False)

    def step(self, action: Any):
        command = self._admitted(action)
        if command is None:
            return self._invalid()
        self._steps += 1
        state, _, _ = self._engine(self._game_path).step(command)
        self._update(state)
        self._truncated = not (self._won or self._lost) and self._steps >= self.max_steps
        self._done = self._done or self._truncated
        if self._done:
            self._admissible = {}
        reward = self.success_reward if self._won else 0.0
        terminated = self._won or self._lost
        return self._observe(clean_feedback(state.feedback)), reward, terminated, self._truncated, self._info(False)

    def expert_action(self) -> str:
        """First command of the engine's winning policy from the current state ("look" when
        the episode is over or the game has no winning policy from here)."""
        policy = self._state["policy_commands"] if self._state is not None and not self._done else None
        return policy[0] if policy else "look"

    def vocabulary(self) -> list[str]:
        """Every word TextWorld lists for these games, sorted: the lowercase words of their logic,
        entity names, descriptions and objective, and the Z-machine dictionary
        (`textworld.text_utils.extract_vocab_from_gamefiles`). Admissible commands are made of
        these words; `sample_texts` adds them so a word-level tokenizer covers every command."""
        from textworld.text_utils import extract_vocab_from_gamefiles

        paths = sorted({path for paths in self._games.values() for path in paths})
        with _quiet_jericho():
            return sorted(extract_vocab_from_gamefiles(paths))

    def close(self) -> None:
        while self._engines:
            _, engine = self._engines.popitem()
            engine.close()
        super().close()

    # -- internals ------------------------------------------------------------------------------

    def _engine(self, path: str):
        engine = self._engines.pop(path, None)
        if engine is None:
            with _quiet_jericho():
                engine = _import_textworld().start(path, request_infos=self._request)
        self._engines[path] = engine  # most recently used last
        while len(self._engines) > self.max_loaded_games:
            _, old = self._engines.popitem(last=False)
            old.close()
        return engine

    def _update(self, state) -> None:
        self._state = state
        self._won, self._lost = bool(state["won"]), bool(state["lost"])
        self._done = self._won or self._lost
        commands = [] if self._done else state["admissible_commands"]
        self._admissible = {normalize_action(c): c for c in commands}
        self._facts = sorted(fact_text(f) for f in state["facts"])

    def _terminated(self) -> bool:
        return self._won or self._lost

    def _info(self, invalid: bool) -> dict[str, Any]:
        state = self._state
        if state is None:  # before the first reset
            return {
                "task": "",
                "task_type": self._task_type,
                "admissible_actions": [],
                "anchor": "",
                "privileged": None,
                "won": False,
                "score": 0.0,
                "progress": 0.0,
                "invalid": invalid,
            }
        max_score = state["max_score"] or 0
        fraction = 1.0 if self._won else (min(1.0, max(0.0, state["score"] / max_score)) if max_score > 0 else 0.0)
        return {
            "task": state["objective"],
            "task_type": self._task_type,
            "admissible_actions": list(self._admissible.values()),
            "anchor": self._anchor(),
            "privileged": self._privileged(),
            "won": self._won,
            "score": fraction,
            "progress": fraction,
            "invalid": invalid,
        }

    def _anchor(self) -> str:
        """`tw:` + 16 hex digits of sha1 over the game file and its sorted facts: equal keys <=>
        equal world state (the facts are TextWorld's whole logical state: where the player and
        every object are, what is open, locked, eaten, ...)."""
        return text_anchor("tw:", [self._game_path, *self._facts])

    def _privileged(self) -> str:
        """The task and every fact of the world state, one a line, sorted."""
        return "\n".join([f"Task: {self._state['objective']}", "Facts:", *self._facts])


def _check_game_file(path: str) -> None:
    game = Path(path)
    if not game.is_file():
        raise ValueError(
            f"TextWorld game {path!r} does not exist; make one with e.g. "
            f"`tw-make custom --world-size 2 --quest-length 2 --seed 1 --output {path}`"
        )
    if game.suffix in (".z8", ".ulx") and not game.with_suffix(".json").is_file():
        raise ValueError(
            f"TextWorld game {path!r} has no {game.with_suffix('.json').name} beside it; the "
            "adapter needs the game logic tw-make writes there (admissible commands, facts, score)"
        )
