"""Tests for rspo_lightning.envs.webshop_env (the adapter to WebShop's WebAgentTextEnv).

WebShop (`web_agent_site`, princeton-nlp/WebShop) is not on PyPI and needs its product data and
a Java search index, so the adapter's logic is tested against `FakeTextEnv`: a small stand-in
with the real class's interface as read from web_agent_site/envs/web_agent_text_env.py
(`reset(session=...) -> (obs, None)`, `step(action) -> (obs, reward, done, None)` that runs any
non-empty `search[...]` and clicks only listed clickables but `search`, re-showing the page for
anything else, `get_available_actions() -> {"has_search_bar", "clickables"}`, `instruction_text`
= "Instruction: <goal>", `session` = prefix + goal index, `browser.current_url` with the page
name as WebShop's SimServer builds it, `server.goals` / `server.user_sessions`). One test plays
the real package where `web_agent_site` is importable.
"""

from __future__ import annotations

import json
import re
import sys

import gymnasium
import pytest

import rspo_lightning.envs  # noqa: F401  (registers rspo/ ids)
from rspo_lightning.envs import make_env, registered_env_ids
from rspo_lightning.envs.webshop_env import WebShop, parse_webshop_action

BASE_URL = "http://127.0.0.1:3000"
SEP = " [SEP] "
INFO_KEYS = {"task", "task_type", "admissible_actions", "anchor", "privileged", "won", "score", "progress", "invalid"}

# -- a stand-in for web_agent_site.envs.web_agent_text_env.WebAgentTextEnv ------------------------

PRODUCTS = {  # asin -> (title, price, {option name: values}, attributes)
    "B000000001": ("Acme Red Running Shoes", 30.0, {"color": ["red", "blue"], "size": ["8", "9"]}, ["lightweight"]),
    "B000000002": ("Acme Blue Running Shoes", 60.0, {"color": ["blue"], "size": ["8", "9"]}, ["lightweight"]),
    "B000000003": ("Zed Green Tea", 5.0, {"flavor": ["mint", "lemon"]}, ["organic"]),
    "B000000004": ("Zed Black Tea", 6.0, {}, ["organic"]),
    "B000000005": ("Acme Running Socks", 8.0, {"size": ["m", "l"]}, ["cotton"]),
}


def make_goal(i: int) -> dict:
    """Goal i (WebShop's goal dict keys): the products take turns as targets."""
    asin = sorted(PRODUCTS)[i % len(PRODUCTS)]
    title, price, options, attributes = PRODUCTS[asin]
    values = [vs[-1] for vs in options.values()]
    return {
        "asin": asin,
        "category": "fashion" if "Running" in title else "grocery",
        "query": title.lower(),
        "name": title,
        "product_category": "x",
        "attributes": attributes,
        "price_upper": price + 10,
        "goal_options": values,
        "weight": 1,
        "instruction_text": f"i need {title.lower()} {' '.join(values)}, and price lower than {price + 10:.2f} dollars",
    }


def fake_reward(goal: dict, asin: str, options: dict) -> float:
    """(attributes matched + goal option values selected + price ok) / (attributes + options + 1)."""
    title, price, _, attributes = PRODUCTS[asin]
    att = len(set(goal["attributes"]) & set(attributes))
    opt = len(set(goal["goal_options"]) & set(options.values()))
    return (att + opt + (price <= goal["price_upper"])) / (len(goal["attributes"]) + len(goal["goal_options"]) + 1)


class FakeServer:
    def __init__(self, num_goals: int):
        self.goals = [make_goal(i) for i in range(num_goals)]
        self.user_sessions: dict[str, dict] = {}


class FakeBrowser:
    def __init__(self):
        self.current_url = None


class FakeTextEnv:
    """WebAgentTextEnv's interface over PRODUCTS; 2 results a page; pages as WebShop's URLs."""

    per_page = 2

    def __init__(self, server: FakeServer | None = None, session_prefix: str | None = None, num_goals: int = 1600):
        self.base_url = BASE_URL
        self.server = server or FakeServer(num_goals)
        self.browser = FakeBrowser()
        self.session_prefix = session_prefix
        self.session = None
        self.steps_sent: list[str] = []
        self.resets: list[object] = []
        self.closed = False

    # the real methods
    def reset(self, session=None, instruction_text=None):
        self.resets.append(session)
        self.session = str(session) if session is not None else "random"
        if self.session_prefix is not None:
            self.session = self.session_prefix + self.session
        if self.session not in self.server.user_sessions:
            self.server.user_sessions[self.session] = {"goal": self.server.goals[session], "done": False}
        self.sess.update(keywords=None, page=None, asin=None, asins=set(), options={})
        self.browser.current_url = f"{BASE_URL}/{self.session}"
        self.instruction_text = "Instruction: " + self.sess["goal"]["instruction_text"]
        return self.observation, None

    def step(self, action):
        self.steps_sent.append(action)
        m = re.match(r"(.+)\[(.+)\]", action)
        name, arg = (m.group(1), m.group(2).lower()) if m else (action, None)
        reward, done = 0.0, False
        if name == "search" and arg:
            self._results(arg.split(" "), 1)
        elif name == "click" and arg in self.get_available_actions()["clickables"] and arg != "search":
            reward, done = self._click(arg)
        return self.observation, reward, done, None

    def get_available_actions(self):
        kind, s = self.kind, self.sess
        if kind == "":
            return {"has_search_bar": True, "clickables": ["search"]}
        if kind == "search_results":
            clicks = ["back to search"] + (["< prev"] if s["page"] > 1 else [])
            clicks += ["next >"] if s["page"] * self.per_page < len(self._hits()) else []
            return {"has_search_bar": False, "clickables": clicks + [a.lower() for a in self._page_hits()]}
        if kind == "item_page":
            values = [v for vs in PRODUCTS[s["asin"]][2].values() for v in vs]
            return {
                "has_search_bar": False,
                "clickables": ["back to search", "< prev", "description", "features", "reviews", "buy now"] + values,
            }
        if kind == "item_sub_page":
            return {"has_search_bar": False, "clickables": ["back to search", "< prev"]}
        return {"has_search_bar": False, "clickables": []}  # done

    def close(self):
        self.closed = True

    # the simulated site
    @property
    def sess(self):
        return self.server.user_sessions[self.session]

    @property
    def kind(self):
        url = self.browser.current_url[len(BASE_URL) :].strip("/").split("/")
        return url[0] if len(url) > 1 else ""

    def _hits(self):
        words = self.sess["keywords"]
        return [a for a in sorted(PRODUCTS) if any(w in PRODUCTS[a][0].lower().split() for w in words)]

    def _page_hits(self):
        p = self.sess["page"]
        return self._hits()[(p - 1) * self.per_page : p * self.per_page]

    def _results(self, keywords, page):
        self.sess.update(keywords=keywords, page=page, asin=None, options={})
        self.browser.current_url = f"{BASE_URL}/search_results/{self.session}/{'+'.join(keywords)}/{page}"

    def _item(self):
        s = self.sess
        self.browser.current_url = (
            f"{BASE_URL}/item_page/{self.session}/{s['asin']}/{'+'.join(s['keywords'])}/"
            f"{s['page']}/{json.dumps(s['options'])}"
        )

    def _click(self, arg):
        s, kind = self.sess, self.kind
        if arg == "buy now":
            s["done"] = True
            s["reward"] = fake_reward(s["goal"], s["asin"], s["options"])
            self.browser.current_url = f"{BASE_URL}/done/{self.session}/{s['asin']}/{s['options']}"
            return s["reward"], True
        if arg == "back to search":
            self.browser.current_url = f"{BASE_URL}/{self.session}"
        elif arg == "next >":
            self._results(s["keywords"], s["page"] + 1)
        elif arg == "< prev" and kind == "search_results":
            self._results(s["keywords"], s["page"] - 1)
        elif arg == "< prev" and kind == "item_sub_page":
            self._item()
        elif arg == "< prev":
            self._results(s["keywords"], s["page"])
        elif arg in ("description", "features", "reviews"):
            self.browser.current_url = (
                f"{BASE_URL}/item_sub_page/{self.session}/{s['asin']}/"
                f"{'+'.join(s['keywords'])}/{s['page']}/{arg.title()}/{s['options']}"
            )
        elif kind == "search_results":  # a product link
            s["asin"] = arg.upper()
            s["asins"].add(s["asin"])
            self._item()
        else:  # an option value
            name = next(n for n, vs in PRODUCTS[s["asin"]][2].items() if arg in vs)
            s["options"][name] = arg
            self._item()
        return 0.0, False

    @property
    def observation(self):
        s, kind = self.sess, self.kind
        head = ["Instruction:", s["goal"]["instruction_text"]]
        if kind == "":
            return SEP.join(["WebShop", *head, "Search"])
        if kind == "done":
            return SEP.join(["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", str(s["reward"])])
        parts = [*head, "Back to Search"]
        if kind == "search_results":
            parts.append(f"Page {s['page']} (Total results: {len(self._hits())})")
            for a in self._page_hits():
                parts += [a, PRODUCTS[a][0], f"${PRODUCTS[a][1]}"]
            return SEP.join(parts)
        title, price, options, _ = PRODUCTS[s["asin"]]
        parts.append("< Prev")
        if kind == "item_sub_page":
            return SEP.join(parts + [f"about {title}"])
        for name, values in options.items():
            parts += [name, *values]
        return SEP.join(
            parts + [title, f"Price: ${price}", "Rating: N.A.", "Description", "Features", "Reviews", "Buy Now"]
        )


def make(**kwargs) -> tuple[WebShop, FakeTextEnv]:
    fake = kwargs.pop("text_env", None) or FakeTextEnv(session_prefix="t_")
    return WebShop(text_env=fake, **kwargs), fake


def goal_of(env: WebShop) -> dict:
    return env.text_env.sess["goal"]


# -- splits and goals ---------------------------------------------------------------------------


def test_splits_follow_the_webshop_protocol():
    env, fake = make()
    assert env.splits == ("train", "valid", "test")
    assert [env.num_tasks(s) for s in ("test", "valid", "train")] == [500, 1000, 100]  # 1600 goals
    for split, task_id, goal_idx in (
        ("test", 0, 0),
        ("test", 499, 499),
        ("valid", 0, 500),
        ("valid", 999, 1499),
        ("train", 0, 1500),
        ("train", 99, 1599),
    ):
        obs, info = env.reset(options={"split": split, "task_id": task_id})
        assert fake.resets[-1] == goal_idx and type(fake.resets[-1]) is int  # WebShop needs an int session
        assert fake.session == f"t_{goal_idx}"
        assert info["task"] == fake.server.goals[goal_idx]["instruction_text"]  # "Instruction: " stripped
    with pytest.raises(ValueError, match=r"task_id must be an int in \[0, 500\) for split 'test'"):
        env.reset(options={"split": "test", "task_id": 500})
    with pytest.raises(ValueError, match="split must be one of"):
        env.reset(options={"split": "valid_seen", "task_id": 0})
    # verl-agent's protocol: no valid split, train = every goal from 500 on
    env, fake = make(num_valid_goals=0)
    assert [env.num_tasks(s) for s in ("test", "valid", "train")] == [500, 0, 1100]
    env.reset(options={"split": "train", "task_id": 0})
    assert fake.resets[-1] == 500
    with pytest.raises(ValueError, match="split 'valid' has no goals.*valid = none, train = 500-1599.*num_valid_goals"):
        env.reset(options={"split": "valid", "task_id": 0})
    # small data (fewer goals than the protocol's 1500): train is empty, said so
    env, _ = make(text_env=FakeTextEnv(num_goals=700))
    assert [env.num_tasks(s) for s in ("test", "valid", "train")] == [500, 200, 0]
    with pytest.raises(ValueError, match="split 'train' has no goals: WebShop has 700 goals"):
        env.reset(options={"task_id": 0})


def test_reset_replaces_the_previous_session_and_is_deterministic():
    env, fake = make()
    first = env.reset(options={"split": "test", "task_id": 3})
    env.step(env.expert_action())
    assert env.reset(options={"split": "test", "task_id": 3}) == first
    for i in range(20):
        env.reset(options={"split": "test", "task_id": i})
    assert list(fake.server.user_sessions) == ["t_19"]  # sessions do not pile up on the server
    env.reset(seed=7)
    drawn = fake.resets[-1]
    env.reset(seed=7)
    assert fake.resets[-1] == drawn and 1500 <= drawn < 1600


# -- actions ------------------------------------------------------------------------------------


def test_admissible_actions_on_every_page():
    env, fake = make()
    obs, info = env.reset(options={"split": "test", "task_id": 0})
    goal = goal_of(env)
    assert set(info) >= INFO_KEYS
    assert obs == SEP.join(["WebShop", "Instruction:", goal["instruction_text"], "Search"])
    # search page: the instruction as the query; WebShop's search button is not clickable
    assert info["admissible_actions"] == [f"search[{goal['instruction_text'].lower()}]"]
    obs, _, _, _, info = env.step("search[running]")
    assert fake.steps_sent == ["search[running]"]
    assert info["admissible_actions"] == [
        "click[back to search]",
        "click[next >]",
        "click[b000000001]",
        "click[b000000002]",
    ]
    obs, _, _, _, info = env.step("click[next >]")
    assert info["admissible_actions"] == ["click[back to search]", "click[< prev]", "click[b000000005]"]
    env.step("click[< prev]")
    obs, _, _, _, info = env.step("CLICK[B000000001]")  # normalised: WebShop lower-cases the argument
    assert fake.steps_sent[-1] == "click[b000000001]" and fake.sess["asin"] == "B000000001"
    assert info["admissible_actions"] == [
        "click[back to search]",
        "click[< prev]",
        "click[description]",
        "click[features]",
        "click[reviews]",
        "click[buy now]",
        "click[red]",
        "click[blue]",
        "click[8]",
        "click[9]",
    ]
    _, _, _, _, info = env.step("click[description]")
    assert info["admissible_actions"] == ["click[back to search]", "click[< prev]"]


def test_free_text_search_only_on_the_search_page():
    env, fake = make(max_steps=100)
    env.reset(options={"split": "test", "task_id": 0})
    obs, _, _, _, info = env.step("  search[Green   TEA]  ")
    assert not info["invalid"] and fake.steps_sent == ["search[green tea]"]
    assert "B000000003" in obs and "B000000001" not in obs
    # WebShop would search from here too; the adapter admits search only where the page has a search bar
    before = len(fake.steps_sent)
    obs, _, _, _, info = env.step("search[running]")
    assert obs == "Nothing happens." and info["invalid"] and len(fake.steps_sent) == before


BAD = [
    "",
    " ",
    "x" * 5000,
    "苹果 🍎",
    "\x00",
    "\ud800",
    "search[]",
    "search[ ]",
    "search",
    "click[]",
    "click[search]",
    "click[buy now",
    "buy now",
    "<action>click[buy now]</action>",
    "click[b000000003]",
    "click[green]",
    None,
    b"click[buy now]",
    0,
    3.5,
    True,
    ["click[buy now]"],
    {"a": 1},
    object(),
]


@pytest.mark.parametrize("page", ["search", "item"])
def test_invalid_actions_change_nothing_and_never_reach_webshop(page):
    env, fake = make(max_steps=1000)
    env.reset(options={"split": "test", "task_id": 0})
    if page == "item":
        env.step("search[running]")
        env.step("click[b000000001]")
        env.step("click[red]")
    state = env.step("")[4]  # an empty action reports the current state
    sent, url = list(fake.steps_sent), fake.browser.current_url
    for action in BAD:
        if page == "search" and isinstance(action, str) and action.startswith("search[") and action[7:-1].strip():
            continue  # a non-empty free-text search is valid there
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == "Nothing happens.", action
        assert info["invalid"] is True and reward == 0.0 and not terminated and not truncated
        for key in ("anchor", "privileged", "admissible_actions", "progress", "won", "score", "task"):
            assert info[key] == state[key], (action, key)
    assert fake.steps_sent == sent and fake.browser.current_url == url


def test_parse_webshop_action_matches_webshop_regex():
    assert parse_webshop_action("click[buy now]") == ("click", "buy now")
    assert parse_webshop_action("search[a]b]") == ("search", "a]b")  # greedy, as engine.parse_action
    assert parse_webshop_action("click[a [b] c]") == ("click[a ", "b] c")
    assert parse_webshop_action("buy now") == ("buy now", None)


# -- reward, score, won, progress, anchor ---------------------------------------------------------


def play_expert(env: WebShop, split: str, task_id: int):
    obs, info = env.reset(options={"split": split, "task_id": task_id})
    steps = []
    for _ in range(env.max_steps):
        action = env.expert_action()
        result = env.step(action)
        steps.append((action, *result))
        assert not result[4]["invalid"], action
        if result[2] or result[3]:
            break
    return steps


def test_expert_buys_the_goal_and_wins():
    env, _ = make()
    for task_id in range(5):  # every product once as the target
        steps = play_expert(env, "test", task_id)
        action, obs, reward, terminated, truncated, info = steps[-1]
        goal = goal_of(env)
        assert action == "click[buy now]" and terminated and not truncated
        assert info["won"] and info["score"] == 1.0 and reward == 10.0 and info["progress"] == 1.0
        assert obs.endswith(SEP + "1.0") and info["admissible_actions"] == []
        assert steps[0][0] == f"search[{goal['name'].lower()}]"
        assert all(r == 0.0 and not t for _, _, r, t, _, _ in steps[:-1])


def test_reward_score_and_won_of_an_imperfect_purchase():
    env, _ = make(reward_scale=2.0)
    env.reset(options={"split": "test", "task_id": 0})  # goal: B000000001, options blue + 9, price <= 40
    env.step("search[running]")
    env.step("click[b000000002]")  # lightweight, but 60 dollars
    env.step("click[blue]")
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    # by hand: (1 attribute + 1 of 2 options + 0 price) / (1 + 2 + 1) = 0.5
    assert terminated and not truncated and info["score"] == 0.5 and reward == 1.0 and not info["won"]
    assert info["progress"] == pytest.approx(2 / 3)
    # after the purchase every action is invalid and the episode stays terminated
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert (obs, reward, terminated, truncated, info["invalid"]) == ("Nothing happens.", 0.0, True, False, True)
    assert info["score"] == 0.5 and not info["won"]


def test_progress_and_anchor_follow_the_page():
    env, fake = make()
    _, info = env.reset(options={"split": "test", "task_id": 0})
    assert (info["progress"], info["anchor"]) == (0.0, "webshop:search")
    _, _, _, _, info = env.step("search[running shoes]")
    assert info["progress"] == pytest.approx(1 / 3) and info["anchor"] == "webshop:search_results/running+shoes/1"
    _, _, _, _, info = env.step("click[b000000001]")
    assert (
        info["progress"] == pytest.approx(2 / 3) and info["anchor"] == "webshop:item_page/B000000001/running+shoes/1/{}"
    )
    _, _, _, _, info = env.step("click[blue]")
    assert info["anchor"] == 'webshop:item_page/B000000001/running+shoes/1/{"color": "blue"}'
    assert "t_0" not in info["anchor"] and 'selected {"color": "blue"}' in info["privileged"]
    assert "Goal product: B000000001" in info["privileged"]
    _, _, _, _, info = env.step("click[features]")
    assert info["progress"] == pytest.approx(2 / 3) and info["anchor"].startswith("webshop:item_sub_page/B000000001/")
    _, _, _, _, info = env.step("click[back to search]")
    assert (info["progress"], info["anchor"]) == (0.0, "webshop:search")
    # another env (another session id) in the same state has the same anchor
    other, _ = make(text_env=FakeTextEnv(server=fake.server, session_prefix="u_"))
    other.reset(options={"split": "test", "task_id": 0})
    assert other.step("search[running shoes]")[4]["anchor"] == "webshop:search_results/running+shoes/1"


def test_truncation_counts_invalid_steps_and_before_reset():
    env, _ = make(max_steps=3)
    env.reset(options={"split": "test", "task_id": 1})
    assert env.step("nonsense")[2:4] == (False, False)
    env.step("search[tea]")
    obs, reward, terminated, truncated, info = env.step("click[b000000003]")
    assert (reward, terminated, truncated, info["admissible_actions"]) == (0.0, False, True, [])
    assert env.step("click[buy now]")[0] == "Nothing happens."
    obs, reward, terminated, truncated, info = make()[0].step("search[tea]")
    assert obs == "Nothing happens." and info["invalid"] and not terminated and reward == 0.0


def test_kwarg_validation_registry_and_make():
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        make(max_steps=0)
    with pytest.raises(ValueError, match="reward_scale must be > 0"):
        make(reward_scale=0)
    with pytest.raises(ValueError, match="num_test_goals and num_valid_goals must be >= 0"):
        make(num_valid_goals=-1)
    assert "rspo/WebShop-v0" in registered_env_ids()
    fake = FakeTextEnv()
    env = gymnasium.make("rspo/WebShop-v0", text_env=fake, max_steps=7)
    obs, info = env.reset(options={"split": "valid", "task_id": 2})
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and fake.resets == [502]
    assert env.unwrapped.max_steps == 7
    env.close()
    assert fake.closed and fake.server.user_sessions == {}


def test_missing_package_names_the_install_steps(monkeypatch):
    monkeypatch.setitem(sys.modules, "web_agent_site", None)  # import web_agent_site -> ImportError
    monkeypatch.delitem(sys.modules, "web_agent_site.envs", raising=False)
    monkeypatch.delitem(sys.modules, "web_agent_site.envs.web_agent_text_env", raising=False)
    with pytest.raises(ImportError, match=r"princeton-nlp/WebShop.*setup\.sh -d small.*PYTHONPATH"):
        make_env("rspo/WebShop-v0")


def test_sample_texts_play_the_expert():
    env, _ = make()
    texts = env.sample_texts(num_tasks=2, seed=0)
    assert any(t.startswith("Thank you for shopping with us!") for t in texts)
    assert "click[buy now]" in texts and any(t.startswith("Task: ") and "\nGoal product: " in t for t in texts)


# -- the real package -----------------------------------------------------------------------------


def test_real_webshop_episode():
    pytest.importorskip("web_agent_site", reason="WebShop (princeton-nlp/WebShop) is not installed; see docs/envs.md")
    env = make_env("rspo/WebShop-v0", num_products=1000).unwrapped  # the `setup.sh -d small` data
    assert env.num_tasks("test") == 500
    obs, info = env.reset(options={"split": "test", "task_id": 0})
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and info["task"] in obs
    assert info["admissible_actions"] == [f"search[{' '.join(info['task'].lower().split())}]"]
    obs, _, _, _, info = env.step(info["admissible_actions"][0])
    assert not info["invalid"] and info["anchor"].startswith("webshop:search_results/")
    before = info
    obs, _, _, _, info = env.step("click[no such button]")
    assert obs == "Nothing happens." and info["anchor"] == before["anchor"]
    product = next(a for a in before["admissible_actions"] if re.fullmatch(r"click\[b[0-9a-z]{9}\]", a))
    _, _, _, _, info = env.step(product)
    assert info["anchor"].startswith("webshop:item_page/") and "click[buy now]" in info["admissible_actions"]
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert terminated and 0.0 <= info["score"] <= 1.0 and reward == pytest.approx(10 * info["score"])
    assert info["won"] == (info["score"] == 1.0)
