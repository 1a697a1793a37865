"""WebShop: adapter to the real WebShop text environment (Yao et al., 2022, arXiv 2207.01206).

Wraps `WebAgentTextEnv` from the `web_agent_site` package of the princeton-nlp/WebShop
repository (not on PyPI; the PyPI package named `webshop` is unrelated). Install and data
steps are in docs/envs.md; `web_agent_site` is imported only when an env is built without an
injected `text_env`, so importing `rspo_lightning` never needs it.

Mapping onto the TextEnv contract (also in docs/envs.md):
- observation = WebShop's `observation_mode="text"` page (`WebShop [SEP] Instruction: [SEP] ...`);
- goals: `reset(options={"split", "task_id"})` -> `text_env.reset(session=goal_idx)`, the
  goal index into `server.goals` (human instructions, shuffled with WebShop's fixed seed 233).
  WebShop's protocol (baseline_models/env.py): test = goals 0-499, eval ("valid" here) =
  500-1499, train = 1500 onwards;
- admissible actions from `get_available_actions()`: when the page has a search bar,
  `search[<instruction>]` (the instruction as the query, WebShop's baseline candidate); every
  clickable but the search button as `click[<clickable>]`. `step` also accepts any non-empty
  `search[...]` on the search page (free-text queries);
- anything else, and any action after the episode ended, is never sent to WebShop:
  "Nothing happens.", `invalid=True`, state unchanged (WebShop itself would re-show the page,
  and would run a search from any page);
- reward: WebShop's reward r in [0, 1] on `click[buy now]`; step reward = `reward_scale` x r,
  `score` = r, `won` = (r == 1);
- `progress` = page depth (search 0, results 1/3, item and its sub-pages 2/3, 1.0 once won;
  a purchase with r < 1 keeps 2/3); `anchor` = the page state (page kind, query, results
  page, product, selected options) from the simulated browser's URL, without the session id;
- `privileged` = the goal (product id, attributes, options, price limit) and the page state;
  `expert_action()` = an oracle that knows the goal product (search its name, open it, pick
  the goal options, buy); WebShop ships no planner.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from typing import Any

from rspo_lightning.envs.base import TextEnv, normalize_action

#: The goal indices of each split, WebShop's protocol (baseline_models/env.py): test first.
DEFAULT_NUM_TEST_GOALS = 500
DEFAULT_NUM_VALID_GOALS = 1000
SPLITS: tuple[str, ...] = ("train", "valid", "test")
#: WebShop's button texts as `get_available_actions()` lists them (lower case).
BUY_NOW, BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE = "buy now", "back to search", "next >", "< prev"
#: Progress by page kind (the first path segment of the simulated browser's URL).
PAGE_DEPTH = {"search": 0.0, "search_results": 1 / 3, "item_page": 2 / 3, "item_sub_page": 2 / 3, "done": 2 / 3}
INSTALL_HINT = (
    "rspo/WebShop-v0 needs the WebShop text environment (package `web_agent_site`, not on PyPI; "
    "the PyPI package `webshop` is unrelated): git clone https://github.com/princeton-nlp/WebShop, "
    "run `./setup.sh -d small` (or `-d all`) in it (installs its requirements, the spaCy model, the "
    "product data and the pyserini search index; needs Java 11), then put the clone on PYTHONPATH, "
    "e.g. `export PYTHONPATH=/path/to/WebShop:$PYTHONPATH`; see docs/envs.md"
)
# WebShop's engine.parse_action: an action it can carry out is `<name>[<arg>]` under this regex.
_WEBSHOP_ACTION = re.compile(r"(.+)\[(.+)\]")
_SERVERS: dict[tuple, Any] = {}  # one SimServer (products + search index) per process and data setting
_SESSION_IDS = itertools.count()


def parse_webshop_action(action: str) -> tuple[str, str | None]:
    """`(name, arg)` exactly as WebShop's `engine.parse_action` splits `action` (arg None when
    the text has no `name[arg]` form)."""
    match = _WEBSHOP_ACTION.match(action)
    return (action, None) if match is None else (match.group(1), match.group(2))


def _import_text_env():
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} (import failed: {exc})") from exc
    return WebAgentTextEnv


def make_text_env(num_products: int | None, human_goals: bool, file_path: str | None, session_prefix: str):
    """A `WebAgentTextEnv(observation_mode="text")` sharing this process's `SimServer` for the
    same data setting (building one loads every product and the search index)."""
    WebAgentTextEnv = _import_text_env()
    key = (num_products, bool(human_goals), file_path)
    kwargs: dict[str, Any] = {
        "observation_mode": "text",
        "num_products": num_products,
        "human_goals": bool(human_goals),
        "session_prefix": session_prefix,
    }
    if file_path is not None:
        kwargs["file_path"] = file_path
    env = WebAgentTextEnv(server=_SERVERS.get(key), **kwargs)
    _SERVERS.setdefault(key, env.server)
    return env


class WebShop(TextEnv):
    """Adapter to WebShop's text environment (`web_agent_site.envs.WebAgentTextEnv`).

    Args:
        num_products: products to search over, passed to WebShop (None = every product of the
            data files, its own default; 1000 for the `setup.sh -d small` data; WebShop has
            search indexes for None, 100, 1000 and 100000).
        human_goals: WebShop's human-written instructions (as the papers evaluate) instead of its
            synthetic ones.
        file_path: WebShop's product file (None = its DEFAULT_FILE_PATH).
        num_test_goals: goals 0 .. num_test_goals - 1 are the `test` split (WebShop's 500).
        num_valid_goals: the next goals are `valid` (WebShop's "eval", 1000); `train` is the
            rest. 0 gives verl-agent's train = every goal from 500 on (then `valid` is empty).
        max_steps: steps (valid or not) before the episode is truncated (verl-agent's 15).
        reward_scale: step reward of `click[buy now]` = reward_scale x WebShop's reward.
        text_env: a ready `WebAgentTextEnv`-like object (tests inject a fake one); None = build
            the real one (shares a SimServer per process).
        render_mode: None or "ansi".
    """

    splits = SPLITS

    def __init__(
        self,
        num_products: int | None = None,
        human_goals: bool = True,
        file_path: str | None = None,
        num_test_goals: int = DEFAULT_NUM_TEST_GOALS,
        num_valid_goals: int = DEFAULT_NUM_VALID_GOALS,
        max_steps: int = 15,
        reward_scale: float = 10.0,
        text_env: Any = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode=render_mode)
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if float(reward_scale) <= 0:
            raise ValueError(f"reward_scale must be > 0, got {reward_scale}")
        if int(num_test_goals) < 0 or int(num_valid_goals) < 0:
            raise ValueError(
                f"num_test_goals and num_valid_goals must be >= 0, got {num_test_goals} and {num_valid_goals}"
            )
        self.max_steps = int(max_steps)
        self.reward_scale = float(reward_scale)
        if text_env is None:
            # A session prefix of its own: envs in one process share the server, whose state is
            # per session id, so two episodes of the same goal must not share an id.
            prefix = f"rspo{os.getpid()}x{next(_SESSION_IDS)}_"
            text_env = make_text_env(num_products, human_goals, file_path, prefix)
        self.text_env = text_env
        num_goals = len(text_env.server.goals)
        test_end = min(int(num_test_goals), num_goals)
        valid_end = min(test_end + int(num_valid_goals), num_goals)
        self._ranges = {
            "test": range(0, test_end),
            "valid": range(test_end, valid_end),
            "train": range(valid_end, num_goals),
        }
        # Before the first reset the env holds a finished episode: step() answers "Nothing happens.".
        self._split, self._task_id, self._goal_idx = "train", None, None
        self._task = ""
        self._steps, self._reward, self._won, self._truncated, self._done = 0, 0.0, False, False, True
        self._bought = False
        self._admissible: dict[str, str] = {}
        self._search_bar = False

    # -- TextEnv contract -----------------------------------------------------------------------

    def num_tasks(self, split: str) -> int:
        return len(self._ranges[self.check_split(split)])

    def goal_index(self, split: str, task_id: int) -> int:
        """The WebShop goal index (`server.goals[i]`, the `session` of `reset`) of a task."""
        split = self.check_split(split)
        if self.num_tasks(split) == 0:
            raise ValueError(
                f"split {split!r} has no goals: WebShop has {len(self.text_env.server.goals)} goals, "
                f"test = goals {_span(self._ranges['test'])}, valid = {_span(self._ranges['valid'])}, "
                f"train = {_span(self._ranges['train'])}; lower num_test_goals / num_valid_goals, or use "
                f"the full data (num_products=None)"
            )
        return self._ranges[split][self.check_task_id(split, task_id)]

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start task `options["task_id"]` of `options["split"]` (default "train"): WebShop's
        `reset(session=goal_idx)`. Without a task_id, one is drawn from the env's rng."""
        super().reset(seed=seed)
        split, task_id = self.task_from_options(options)
        goal_idx = self.goal_index(split, task_id)
        # Sessions are per env: forget this env's previous one so the server does not grow.
        old = getattr(self.text_env, "session", None)
        sessions = self.text_env.server.user_sessions
        if old is not None and old in sessions:
            del sessions[old]
        observation, _ = self.text_env.reset(session=int(goal_idx))
        self._split, self._task_id, self._goal_idx = split, int(task_id), int(goal_idx)
        self._task = re.sub(
            r"^\s*instruction:\s*", "", str(self.text_env.instruction_text), flags=re.IGNORECASE
        ).strip()
        self._steps, self._reward, self._won, self._truncated, self._done = 0, 0.0, False, False, False
        self._bought = False
        self._update_admissible()
        return self._observe(observation), self._info(False)

    def step(self, action: Any):
        command = self._command(action)
        if command is None:
            return self._invalid()
        self._steps += 1
        observation, reward, done, _ = self.text_env.step(command)
        reward = float(reward or 0.0)
        terminated = bool(done)  # WebShop ends an episode only on "buy now"
        if terminated:
            self._bought, self._reward, self._won = True, reward, reward == 1.0
        self._truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or self._truncated
        if self._done:
            self._admissible, self._search_bar = {}, False
        else:
            self._update_admissible()
        step_reward = self.reward_scale * reward if terminated else 0.0
        return self._observe(observation), step_reward, terminated, self._truncated, self._info(False)

    def _terminated(self) -> bool:
        return self._bought

    def expert_action(self) -> str:
        """Next action of an oracle that knows the goal product: on the search page search its
        name; on results open it (else `next >`, else `back to search`); on an item that is not
        it `< prev`; on it click each goal option value it offers, then `buy now`; from a
        sub-page `< prev`. "click[back to search]" once the episode is over."""
        if self._done:
            return f"click[{BACK_TO_SEARCH}]"
        goal, session = self._goal(), self._session()
        target = str(goal.get("asin", "")).lower()
        page = self._page_kind()
        clickables = set(self._admissible.values())
        if page == "search":
            name = str(goal.get("name") or goal.get("query") or self._task)
            query = normalize_action(name.replace("[", " ").replace("]", " "))
            return f"search[{query}]"
        if page == "item_sub_page":
            return f"click[{PREV_PAGE}]"
        if page == "item_page":
            if str(session.get("asin") or "").lower() != target:
                return f"click[{PREV_PAGE}]"
            chosen = set(session.get("options", {}).values())
            for value in _goal_option_values(goal):
                if value not in chosen and f"click[{value}]" in clickables:
                    return f"click[{value}]"
            return f"click[{BUY_NOW}]"
        for candidate in (target, NEXT_PAGE, BACK_TO_SEARCH):
            if f"click[{candidate}]" in clickables:
                return f"click[{candidate}]"
        return f"click[{BACK_TO_SEARCH}]"

    def close(self) -> None:
        if self._goal_idx is not None:
            self.text_env.server.user_sessions.pop(getattr(self.text_env, "session", None), None)
        self.text_env.close()
        super().close()

    # -- actions --------------------------------------------------------------------------------

    def _update_admissible(self) -> None:
        """Admissible actions of the current page, normalised text -> the command sent to WebShop."""
        available = self.text_env.get_available_actions()
        self._search_bar = bool(available["has_search_bar"])
        commands = []
        if self._search_bar:
            commands.append(f"search[{normalize_action(self._task)}]")
        for clickable in available["clickables"]:
            command = f"click[{clickable}]"
            # WebShop refuses click[search]; a clickable its parser would split otherwise is dead.
            if clickable != "search" and parse_webshop_action(command) == ("click", clickable):
                commands.append(command)
        self._admissible = {normalize_action(c): c for c in commands}

    def _command(self, action: Any) -> str | None:
        """What to send to WebShop for `action`, or None when it is invalid here."""
        command = self._admitted(action)
        if command is not None or not self._search_bar:
            return command
        norm = normalize_action(action)
        if norm is None or self._done:
            return None
        name, query = parse_webshop_action(norm)  # any non-empty search[...] on the search page
        return norm if name == "search" and query is not None and query.strip() else None

    # -- state ----------------------------------------------------------------------------------

    def _session(self) -> dict:
        return self.text_env.server.user_sessions.get(self.text_env.session, {})

    def _goal(self) -> dict:
        return self._session().get("goal", {})

    def _url_path(self) -> list[str]:
        """The simulated browser's URL path after the base URL and the session id."""
        url = str(self.text_env.browser.current_url or "")
        base = str(getattr(self.text_env, "base_url", ""))
        parts = (url[len(base) :] if base and url.startswith(base) else url).strip("/").split("/")
        session = str(self.text_env.session)
        return [p for i, p in enumerate(parts) if not (i <= 1 and p == session)]

    def _page_kind(self) -> str:
        """ "search", "search_results", "item_page", "item_sub_page" or "done" (the URL's first
        segment; WebShop's own get_page_name searches the whole URL, keywords included)."""
        path = self._url_path()
        return path[0] if path and path[0] in PAGE_DEPTH else "search"

    def _progress(self) -> float:
        return 1.0 if self._won else PAGE_DEPTH[self._page_kind()]

    def _anchor(self) -> str:
        """`webshop:` + the page's URL path without the session id: page kind, query, results
        page, product, selected options (equal keys <=> same page state of the same goal)."""
        return "webshop:" + "/".join(self._url_path() or ["search"])

    def _privileged(self) -> str:
        goal, session = self._goal(), self._session()
        lines = [
            f"Task: {self._task}",
            f"Goal product: {goal.get('asin', '?')} ({goal.get('name', '?')}); attributes "
            f"{', '.join(goal.get('attributes', []))}; options {', '.join(_goal_option_values(goal)) or 'none'}; "
            f"price <= {goal.get('price_upper', '?')}",
            f"Page: {self._page_kind()}; query {' '.join(session.get('keywords') or []) or '-'}; "
            f"results page {session.get('page') or '-'}; viewing {session.get('asin') or '-'}; "
            f"selected {json.dumps(session.get('options') or {}, sort_keys=True)}",
        ]
        return "\n".join(lines)

    def _info(self, invalid: bool) -> dict[str, Any]:
        if self._goal_idx is None:  # before the first reset
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
        return {
            "task": self._task,
            "task_type": str(self._goal().get("category", "")),
            "admissible_actions": list(self._admissible.values()),
            "anchor": self._anchor(),
            "privileged": self._privileged(),
            "won": self._won,
            "score": self._reward,
            "progress": self._progress(),
            "invalid": invalid,
        }


def _span(goals: range) -> str:
    return f"{goals.start}-{goals.stop - 1}" if goals else "none"


def _goal_option_values(goal: dict) -> list[str]:
    """The goal's option values: a list for human goals, a {name: value} dict for synthetic ones."""
    options = goal.get("goal_options") or []
    values = options.values() if isinstance(options, dict) else options
    return [str(v).lower() for v in values]
