"""The TextEnv contract (docs/design.md §5) and the `rspo/` environment registry.

Every environment in `rspo_lightning.envs` is a `gymnasium.Env` whose observations and actions
are strings. `TextEnv` fixes the spaces, the info keys and the "any input is legal" rule; the
subclasses implement the game. The registry helpers wrap `gymnasium.register` / `gymnasium.make`
so that a typo in an env id fails with the list of ids that do exist.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import numbers
import random
import re
import string
from typing import Any

import gymnasium
from gymnasium import spaces
from gymnasium.envs.registration import load_env_creator

#: Characters the text spaces accept: every printable ASCII character, whitespace included.
TEXT_CHARSET = string.printable
#: Longest observation or action the spaces declare. `step` accepts longer inputs anyway.
MAX_TEXT_LENGTH = 16384
#: What every text env answers to an action it cannot carry out.
NOTHING_HAPPENS = "Nothing happens."
# what the tiny tokenizer splits text into (an env's `vocabulary()` lists these words)
WORD_PATTERN = re.compile(r"\w+|[^\w\s]+")
#: Prefix of the ids this package registers.
ENV_ID_PREFIX = "rspo/"
#: The splits of an env whose tasks are seeds (the adapters' default): training and two held-out.
DEFAULT_SPLITS = ("train", "valid_seen", "valid_unseen")


def text_anchor(prefix: str, parts: list[str]) -> str:
    """``prefix`` + 16 hex digits of sha1 over ``parts`` joined by newlines: an `anchor` equal
    exactly when the parts are (the state's facts, or an episode's whole history)."""
    return prefix + hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]


def import_optional(module: str, env_id: str, extra: str) -> Any:
    """``import module`` for an adapter; ImportError naming the env and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{env_id} needs the {module} package: pip install 'rspo_lightning[{extra}]' (or pip install {module})"
        ) from exc


def normalize_action(action: Any) -> str | None:
    """Return `action` stripped, with runs of whitespace collapsed to one space, lowercased.

    Returns None for anything that is not a `str` (None, bytes, numbers, ...), so callers can
    treat it as an invalid action without raising.
    """
    if not isinstance(action, str):
        return None
    return " ".join(action.split()).lower()


class TextEnv(gymnasium.Env):
    """Base class of the text environments (docs/design.md §5).

    Contract for subclasses:

    - `reset(seed=None, options={"split": str, "task_id": int})` returns `(observation, info)`.
      `info` holds `task` (the instruction), `task_type`, `admissible_actions` (list[str] or
      None), `anchor` (hashable state key), `privileged` (full-state text or None), `won`,
      `score`, `progress`, `invalid`.
    - `step(action)` returns `(observation, reward, terminated, truncated, info)` with the same
      info keys. `reward` is the outcome reward: the env's `success_reward` on the winning step,
      else 0.0. Any input must be accepted: an unknown or malformed action (non-str included,
      and any action after the episode ended) returns `NOTHING_HAPPENS` with `invalid=True` and
      leaves the state unchanged.
    - `num_tasks(split)` and the `splits` attribute say which `(split, task_id)` pairs exist.
    - `expert_action()` returns the next action of an expert plan from the current state.
    """

    # render_fps: gymnasium's env checker warns on the first render() of an env with render modes
    # and no render_fps. A text env has no frame rate; 4 is only what a recorder would replay at.
    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    #: Task splits this env serves; subclasses override.
    splits: tuple[str, ...] = ("train",)

    def __new__(cls, *args: Any, **kwargs: Any):
        # Runs before __init__ whichever way the env is built (the class itself, gymnasium.make,
        # make_env), so a misspelt keyword fails with the accepted ones instead of a bare TypeError.
        check_env_kwargs(cls, kwargs)
        return super().__new__(cls)

    def __init__(self, render_mode: str | None = None) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset=TEXT_CHARSET)
        self.action_space = spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset=TEXT_CHARSET)
        self._last_observation = ""

    # -- contract -------------------------------------------------------------------------------

    def num_tasks(self, split: str) -> int:
        """Number of tasks in `split`; task ids are `0 .. num_tasks(split) - 1`."""
        raise NotImplementedError

    def expert_action(self) -> str:
        """Next action of an expert that solves the current task from the current state."""
        raise NotImplementedError

    def render(self) -> str | None:
        """Return the last observation when `render_mode == "ansi"`."""
        return self._last_observation if self.render_mode == "ansi" else None

    def check_split(self, split: Any) -> str:
        """Return `split` if it is one of `self.splits`, else raise a ValueError naming them."""
        if split not in self.splits:
            raise ValueError(f"split must be one of {list(self.splits)}, got {split!r}")
        return split

    def check_task_id(self, split: str, task_id: Any) -> int:
        """Return `task_id` as int if it is in `range(num_tasks(split))`, else raise ValueError."""
        n = self.num_tasks(split)
        if isinstance(task_id, bool) or not isinstance(task_id, numbers.Integral) or not 0 <= task_id < n:
            raise ValueError(f"task_id must be an int in [0, {n}) for split {split!r}, got {task_id!r}")
        return int(task_id)

    # -- shared step plumbing (subclasses keep _done, _steps, _truncated, _admissible, max_steps) --

    def task_from_options(self, options: dict[str, Any] | None, default_split: str = "train") -> tuple[str, Any]:
        """``(split, task_id)`` of a ``reset``: ``options["split"]`` (default ``default_split``,
        checked) and ``options["task_id"]``, or one drawn from the env's rng when it is missing."""
        options = options or {}
        split = self.check_split(options.get("split", default_split))
        task_id = options.get("task_id")
        if task_id is None:
            task_id = int(self.np_random.integers(self.num_tasks(split)))
        return split, task_id

    def _admitted(self, action: Any):
        """The env's command for ``action`` if it is admissible now (``self._admissible`` maps
        normalised action text to commands), else None."""
        norm = normalize_action(action)
        return self._admissible.get(norm) if (norm is not None and not self._done) else None

    def _observe(self, text: str) -> str:
        self._last_observation = text
        return text

    def _terminated(self) -> bool:
        """Whether the episode has ended by itself (won, or lost where the env can lose)."""
        return self._won

    def _invalid(self):
        """ "Nothing happens.": the state is unchanged, but the step counts (and may truncate)."""
        if not self._done:
            self._steps += 1
            self._truncated = self._steps >= self.max_steps
            self._done = self._truncated
            if self._done:
                self._admissible = {}
        return self._observe(NOTHING_HAPPENS), 0.0, self._terminated(), self._truncated, self._info(True)

    # -- tokenizer corpus -----------------------------------------------------------------------

    def sample_texts(self, num_tasks: int = 30, seed: int = 0) -> list[str]:
        """Play tasks from every split and return every text the env showed.

        Plays task ids `0 .. min(num_tasks, num_tasks(split)) - 1` of each split, choosing the
        expert's action with probability 0.7 and a random admissible action otherwise (an rng
        seeded by `seed`; always random where the env was built without its expert), and returns the observations, task instructions and every admissible
        action string seen. Envs with a finite word list (a `vocabulary()` method) add it as one
        extra string, so a word-level tokenizer trained on the result covers everything the env
        can print. Leaves the env in the state of the last episode played; call `reset` after.
        """
        rng = random.Random(seed)
        texts: list[str] = []
        expert = True  # an env built without its expert plays random admissible actions instead
        for split in self.splits:
            for task_id in range(min(num_tasks, self.num_tasks(split))):
                obs, info = self.reset(options={"split": split, "task_id": task_id})
                texts.append(obs)
                texts.append(info["task"])
                if info.get("privileged"):
                    texts.append(info["privileged"])  # what an asymmetric critic reads
                # A hard cap guards against envs whose own max_steps is huge.
                for _ in range(1000):
                    admissible = info.get("admissible_actions")
                    if admissible:
                        texts.extend(admissible)
                    if admissible and (rng.random() < 0.3 or not expert):
                        action = rng.choice(admissible)
                    else:
                        try:
                            action = self.expert_action()
                        except (
                            RuntimeError,
                            NotImplementedError,
                        ):  # built without its expert (ALFWorld's expert: null)
                            expert = False
                            action = rng.choice(admissible) if admissible else "look"
                    obs, _, terminated, truncated, info = self.step(action)
                    texts.append(obs)
                    if info.get("privileged"):
                        texts.append(info["privileged"])
                    if terminated or truncated:
                        break
        vocabulary = getattr(self, "vocabulary", None)
        if callable(vocabulary):
            texts.append(" ".join(vocabulary()))
        return texts


# -- keyword arguments ---------------------------------------------------------------------------


def accepted_kwargs(creator: Any) -> list[str] | None:
    """Keyword argument names `creator` (an env class or factory) accepts, in signature order.

    None when it takes ``**kwargs`` or has no readable signature (anything goes, as far as we can tell).
    """
    try:
        signature = inspect.signature(creator.__init__ if isinstance(creator, type) else creator)
    except (TypeError, ValueError):
        return None
    params = list(signature.parameters.values())
    if isinstance(creator, type):
        params = params[1:]  # self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds]


def check_env_kwargs(creator: Any, kwargs: dict[str, Any], env_id: str | None = None) -> None:
    """Raise TypeError if `kwargs` holds a key `creator` does not accept.

    The message names each unknown key, suggests the closest accepted name
    (`difflib.get_close_matches`) and lists the accepted ones.
    """
    accepted = accepted_kwargs(creator)
    if accepted is None:
        return
    unknown = [key for key in kwargs if key not in accepted]
    if not unknown:
        return
    what = env_id or getattr(creator, "__name__", repr(creator))
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), accepted, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(
        f"{what} got unknown keyword argument{'s' if len(unknown) > 1 else ''} {', '.join(parts)}; "
        f"it accepts {accepted}"
    )


# -- registry ----------------------------------------------------------------------------------


def register_env(env_id: str, entry_point: str) -> None:
    """Register `env_id` with gymnasium; calling it again with the same entry point is a no-op.

    Raises ValueError when `env_id` is already registered with a different entry point.
    """
    existing = gymnasium.registry.get(env_id)
    if existing is not None:
        if existing.entry_point != entry_point:
            raise ValueError(
                f"env id {env_id!r} is already registered with entry point "
                f"{existing.entry_point!r}, not {entry_point!r}; pick another id"
            )
        return
    gymnasium.register(id=env_id, entry_point=entry_point)


def registered_env_ids() -> list[str]:
    """Sorted ids of the registered environments that start with `rspo/`."""
    return sorted(env_id for env_id in gymnasium.registry if env_id.startswith(ENV_ID_PREFIX))


def make_env(env_id: str, /, **kwargs: Any) -> gymnasium.Env:
    """`gymnasium.make(env_id, **kwargs)` for a registered id.

    `env_id` may be gymnasium's `module:EnvId` form: the module is imported first, and registers
    the env when imported (`my_envs:my/Guess-v0` in `data.env.env_id` for an env of your own:
    docs/environments_byo.md). `env_id` is positional-only, so an env may take an `env_id`
    keyword of its own (rspo/TextArena-v0: the game's).

    Raises ValueError naming the bad id and listing the registered `rspo/` ids when `env_id`
    is unknown, and TypeError naming a keyword argument the env does not take, with the closest
    accepted one and the list of them (wrappers such as `rspo/Faulty-v0` included).
    """
    if env_id not in gymnasium.registry and ":" in env_id:
        module, _, name = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(
                f"env id {env_id!r}: module {module!r} cannot be imported ({exc}); name an importable module "
                "that registers the env (`module:EnvId`), or a registered id"
            ) from exc
        env_id = name
    if env_id not in gymnasium.registry:
        raise ValueError(
            f"unknown env id {env_id!r}; registered rspo envs: {registered_env_ids()} (an env of your own: "
            "`module:EnvId`, where importing module registers EnvId)"
        )
    spec = gymnasium.spec(env_id)
    if spec.entry_point is not None:
        creator = spec.entry_point if callable(spec.entry_point) else load_env_creator(spec.entry_point)
        # max_episode_steps and disable_env_checker are gymnasium.make's own, not the env's
        env_kwargs = {k: v for k, v in kwargs.items() if k not in _MAKE_KWARGS}
        check_env_kwargs(creator, {**spec.kwargs, **env_kwargs}, env_id)
    return gymnasium.make(env_id, **kwargs)


#: Keyword arguments `gymnasium.make` takes for itself rather than passing to the env.
_MAKE_KWARGS = ("max_episode_steps", "disable_env_checker")
