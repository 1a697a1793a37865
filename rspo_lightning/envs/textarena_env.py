"""TextArena: adapter to TextArena's single-player text games (`textarena`: GuessTheNumber,
TowerOfHanoi, Minesweeper, Mastermind, FrozenLake, LightsOut, Sudoku, Wordle, ...).

`make_env("rspo/TextArena-v0", env_id="GuessTheNumber-v0")` (`env_id`: a TextArena env id, in
`data.env.kwargs`); `game_kwargs` override the game's registered settings (`{"max_number": 50}`).
The game is built with `textarena.make(env_id)` and
played without TextArena's observation/action wrappers, so its messages map onto the contract:

- `task` = the game's prompt (its rules and the answer format);
- observation = the messages the game sent this turn (hints, boards, notices of an invalid move,
  and the reason the game ended on the last step), the player's own action left out; the history
  of earlier turns is the prompt's `history_window`, not repeated in each observation. A game
  with no message at the start (GuessTheNumber) starts with an empty observation;
- actions are free-form (`admissible_actions` is None). TextArena games read the move inside
  square brackets (`[5]`, `[A C]`, `[3 2]`); as TextArena's `ActionFormattingWrapper` does, an
  action with no bracket is sent wrapped in one (`bracket_actions`), so the policy writes
  `<action>5</action>` or `<action>[5]</action>`. The rollout lowercases actions; the games
  listed above accept lowercase moves. An empty or non-str action never reaches the game:
  "Nothing happens.", `invalid=True`;
- a move the game rejects (wrong format, against the rules) is `invalid=True`; by TextArena's rules
  the game tells the player why, and a second invalid move in a row ends the game as a loss;
- `won` = the game's final reward is 1 (TextArena pays 1 for a win, else partial credit in
  [0, 1) or -1); `reward` = `success_reward` on the winning step (`outcome_reward="win"`) or the
  game's own final reward on the last step (`outcome_reward="game"`); `score` = the game's final
  reward; `progress` = the game's completion fraction (its `_get_percentage_completion()`, which
  19 of the single-player games have: the dense reward of docs/environments_byo.md), 1.0 once won;
- `anchor` = a hash of every message and action of the episode (equal for equal histories);
- tasks: split `i` of `splits` plays seed `i * tasks_per_split + task_id`. TextArena seeds
  Python's global `random` and draws from it; each env keeps a `random` state of its own and
  swaps it in around every call into the game, so episodes are reproducible whatever runs
  between them, and the trainer's `random` stream is left as it was.

Games that need downloads (NLTK word lists: Wordle, Hangman, Crosswords, WordLadder, WordSearch,
...; an LLM jury: TwentyQuestions) fail with the download command. `textarena` is imported when
the env is built, so importing `rspo_lightning` never needs it (`pip install -e ".[textarena]"`).
"""

from __future__ import annotations

import contextlib
import difflib
import random
from collections.abc import Sequence
from typing import Any, Literal

from rspo_lightning.envs.base import DEFAULT_SPLITS, TextEnv, import_optional, text_anchor

#: The final reward TextArena's single-player games pay for a win.
WIN_REWARD = 1.0
# Message kinds (textarena.ObservationType names) the observation leaves out: the prompt is the
# task, the player's own action is the prompt's history.
_NOT_OBSERVED = ("PROMPT", "PLAYER_ACTION")


def _import_textarena():
    return import_optional("textarena", "rspo/TextArena-v0", "textarena")


class TextArena(TextEnv):
    """Adapter to a single-player TextArena game (module docstring; docs/environments_byo.md).

    Args:
        env_id: a single-player TextArena env id, e.g. ``GuessTheNumber-v0``, ``TowerOfHanoi-v0``,
            ``Minesweeper-v0-small``, ``Mastermind-v0``, ``FrozenLake-v0``.
        game_kwargs: keyword arguments of the game, over its registered ones (``{"max_turns": 5}``).
        splits: task split names; split ``i`` plays seeds ``i * tasks_per_split + task_id``.
        tasks_per_split: tasks (seeds) per split.
        max_steps: steps (valid or not) before the episode is truncated (the game's own turn
            limit usually ends it first).
        success_reward: reward on the winning step with ``outcome_reward="win"``.
        outcome_reward: ``win`` (``success_reward`` for a win, else 0) or ``game`` (the game's own
            final reward, partial credit included, on the last step).
        bracket_actions: wrap an action that has no square bracket in one (``5`` -> ``[5]``).
        render_mode: None or "ansi".
    """

    def __init__(
        self,
        env_id: str,
        game_kwargs: dict[str, Any] | None = None,
        splits: Sequence[str] = DEFAULT_SPLITS,
        tasks_per_split: int = 10_000,
        max_steps: int = 50,
        success_reward: float = 1.0,
        outcome_reward: Literal["win", "game"] = "win",
        bracket_actions: bool = True,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if outcome_reward not in ("win", "game"):
            raise ValueError(f"outcome_reward must be 'win' or 'game', got {outcome_reward!r}")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if int(tasks_per_split) < 1:
            raise ValueError(f"tasks_per_split must be >= 1, got {tasks_per_split}")
        self.splits = tuple(splits)
        if not self.splits:
            raise ValueError("splits must name at least one split, got []")
        self.game, self.tasks_per_split, self.max_steps = env_id, int(tasks_per_split), int(max_steps)
        self.success_reward, self.outcome_reward = float(success_reward), outcome_reward
        self.bracket_actions = bool(bracket_actions)
        self._random_state = random.Random(0).getstate()
        self._game = self._make_game(env_id, dict(game_kwargs or {}))
        # before the first reset the env holds a finished, empty episode
        self._done, self._won, self._truncated, self._steps = True, False, False, 0
        self._task, self._history, self._score, self._progress = "", [], 0.0, 0.0

    # -- TextEnv contract -----------------------------------------------------------------------

    def num_tasks(self, split: str) -> int:
        self.check_split(split)
        return self.tasks_per_split

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start task ``options["task_id"]`` of ``options["split"]`` (the game seeded as the module docstring says)."""
        super().reset(seed=seed)
        split, task_id = self.task_from_options(options)
        task_id = self.check_task_id(split, task_id)
        with self._own_random():
            self._game.reset(num_players=1, seed=self.splits.index(split) * self.tasks_per_split + task_id)
            messages = self._messages()
        self._task = "\n".join(text for kind, text in messages if kind == "PROMPT")
        observation = self._observed(messages)
        self._done, self._won, self._truncated, self._steps = False, False, False, 0
        self._history, self._score, self._progress = [observation], 0.0, self._completion()
        return self._observe(observation), self._info(False)

    def step(self, action: Any):
        if self._done or not isinstance(action, str) or not action.strip():
            return self._invalid()
        move = action.strip()
        if self.bracket_actions and "[" not in move and "]" not in move:
            move = f"[{move}]"
        with self._own_random():
            done, _ = self._game.step(move)
            messages = self._messages()
            rewards, game_info = self._game.close() if done else (None, None)
        self._steps += 1
        state = self._game.state
        reward = 0.0
        parts = [self._observed(messages)]
        if done:
            final = float((rewards or {}).get(0, 0.0))
            info0 = (game_info or {}).get(0, {})
            invalid = bool(info0.get("invalid_move", False))
            if info0.get("reason"):
                parts.append(str(info0["reason"]))
            self._won = final >= WIN_REWARD
            self._score = final
            reward = final if self.outcome_reward == "game" else (self.success_reward if self._won else 0.0)
        else:
            invalid = getattr(state, "error_count", 0) > 0  # a rejected move the game let the player retry
        observation = "\n".join(p for p in parts if p)
        self._history += [f"> {move}", observation]
        self._progress = 1.0 if self._won else self._completion()
        self._truncated = not done and self._steps >= self.max_steps
        self._done = done or self._truncated
        return self._observe(observation), reward, bool(done), self._truncated, self._info(invalid)

    def expert_action(self) -> str:
        raise NotImplementedError("a TextArena game has no expert here")

    # -- internals ------------------------------------------------------------------------------

    def _make_game(self, env_id: str, game_kwargs: dict[str, Any]):
        ta = _import_textarena()
        from textarena.envs.registration import ENV_REGISTRY

        if env_id not in ENV_REGISTRY:
            close = difflib.get_close_matches(str(env_id), list(ENV_REGISTRY), n=3)
            raise ValueError(
                f"unknown TextArena game {env_id!r}"
                + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
                + "; single-player games that need no download: GuessTheNumber-v0, TowerOfHanoi-v0, "
                "Minesweeper-v0-small, Mastermind-v0, FrozenLake-v0, LightsOut-v0"
            )
        try:
            with self._own_random():
                game = ta.make(env_id, **game_kwargs)
                while isinstance(game, ta.Wrapper):  # TextArena's observation/action wrappers: ours instead
                    game = game.env
                game.reset(num_players=1, seed=0)
        except LookupError as exc:  # nltk's "Resource words not found"
            raise ValueError(
                f"TextArena game {env_id!r} needs NLTK data that is not installed ({exc}); download it with "
                "`python -m nltk.downloader words averaged_perceptron_tagger_eng` or pick a game that needs none"
            ) from exc
        except (AssertionError, TypeError, ValueError) as exc:  # "The number of players has to be 2"
            raise ValueError(
                f"TextArena game {env_id!r} cannot be played by one player ({type(exc).__name__}: {exc}); "
                "rspo/TextArena-v0 plays single-player games, e.g. GuessTheNumber-v0 or TowerOfHanoi-v0"
            ) from exc
        if not isinstance(game.state, ta.SinglePlayerState):
            raise ValueError(f"TextArena game {env_id!r} is not a single-player game; rspo/TextArena-v0 plays those")
        return game

    @contextlib.contextmanager
    def _own_random(self):
        """Run the game on this env's own ``random`` state (TextArena seeds and draws from the global one)."""
        outer = random.getstate()
        random.setstate(self._random_state)
        try:
            yield
        finally:
            self._random_state = random.getstate()
            random.setstate(outer)

    def _messages(self) -> list[tuple[str, str]]:
        """The game's new messages to the player as ``(kind, text)``."""
        _, messages = self._game.get_observation()
        if isinstance(messages, str):
            return [("GAME_MESSAGE", messages)]
        return [(getattr(kind, "name", str(kind)), str(text)) for _, text, kind in messages]

    @staticmethod
    def _observed(messages: list[tuple[str, str]]) -> str:
        return "\n".join(text.strip() for kind, text in messages if kind not in _NOT_OBSERVED and text.strip())

    def _completion(self) -> float:
        """The game's completion fraction in [0, 1] (0.0 for games without one)."""
        completion = getattr(self._game, "_get_percentage_completion", None)
        if completion is None:
            return 0.0
        try:
            with self._own_random():
                value = float(completion())
        except Exception:  # noqa: BLE001 - a game's helper that fails in some state: no progress signal
            return self._progress
        return min(1.0, max(0.0, value))

    def _info(self, invalid: bool) -> dict[str, Any]:
        anchor = text_anchor("ta:", [self.game, self._task, *self._history])
        return {
            "task": self._task,
            "task_type": self.game,
            "admissible_actions": None,
            "anchor": anchor,
            "privileged": None,
            "won": self._won,
            "score": self._score,
            "progress": self._progress,
            "invalid": invalid,
        }

    def _terminated(self) -> bool:
        """The game ended by itself (a win or a loss; TextEnv._invalid's "Nothing happens." reports it):
        not truncated, and not the empty episode before the first reset."""
        return self._done and not self._truncated and bool(self._history)
