"""Tests for rspo_lightning.envs.shop (the WebShop look-alike).

Expected values are written out by hand: the WebShop reward on hand-built goals and products,
page texts in WebShop's "[SEP]" layout, and BM25 rankings from an index the test builds itself.
"""

from __future__ import annotations

import random
import re
import time

import gymnasium
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import rspo_lightning.envs  # noqa: F401  (registers rspo/ ids)
from rspo_lightning.envs import Shop, make_env, registered_env_ids
from rspo_lightning.envs.shop import Catalog, Product, ShopGoal, is_perfect, purchase_reward

SPLITS = ["train", "valid", "test"]
INFO_KEYS = {"task", "task_type", "admissible_actions", "anchor", "privileged", "won", "score", "progress", "invalid"}
WORDS = re.compile(r"\w+|[^\w\s]+")
ASIN = re.compile(r"B0[A-Z0-9]{8}")
INSTRUCTION = re.compile(r"i need an? (.+) in (.+), price lower than (\d+)\.00 dollars")


@pytest.fixture(scope="module")
def env():
    return Shop()


def goal(**overrides) -> ShopGoal:
    fields = dict(
        instruction="i need a machine washable, long sleeve and cotton t-shirt in black color, "
        "price lower than 30.00 dollars",
        product_type="t-shirt",
        category="fashion",
        attributes=("machine washable", "long sleeve", "cotton"),
        options=(("color", "black"),),
        price_upper=30.0,
        target="B000000000",
        queries=("machine washable long sleeve cotton t-shirt black",),
    )
    fields.update(overrides)
    return ShopGoal(**fields)


def product(**overrides) -> Product:
    fields = dict(
        asin="B011111111",
        product_type="t-shirt",
        category="fashion",
        title="Acme T-Shirt",
        attributes=("machine washable", "long sleeve", "slim fit"),
        options=(("color", ("black", "white")), ("size", ("small", "large"))),
        price=25.0,
        description="d",
        features=("f",),
    )
    fields.update(overrides)
    return Product(**fields)


# -- the WebShop reward, by hand ----------------------------------------------------------------


def test_reward_formula_on_hand_built_goal_and_product():
    g = goal()
    # 2 of 3 attributes, 1 of 1 options, price ok, same type: (2 + 1 + 1) / (3 + 1 + 1)
    assert purchase_reward(g, product(), {"color": "black"}) == pytest.approx(0.8)
    # another type of the same category: r_type 0.5
    assert purchase_reward(g, product(product_type="hoodie"), {"color": "black"}) == pytest.approx(0.4)
    # another category: r_type 0.1
    assert purchase_reward(g, product(product_type="coffee", category="food"), {"color": "black"}) == pytest.approx(
        0.08
    )
    # too expensive: (2 + 1 + 0) / 5; no option chosen: (2 + 0 + 1) / 5; wrong option: the same
    assert purchase_reward(g, product(price=30.01), {"color": "black"}) == pytest.approx(0.6)
    assert purchase_reward(g, product(), {}) == pytest.approx(0.6)
    assert purchase_reward(g, product(), {"color": "white", "size": "large"}) == pytest.approx(0.6)
    # price exactly at the limit counts; every attribute and option: exactly 1.0
    full = product(attributes=("machine washable", "long sleeve", "cotton"), price=30.0)
    assert purchase_reward(g, full, {"color": "black", "size": "small"}) == 1.0
    assert is_perfect(g, full) and not is_perfect(g, product())
    assert not is_perfect(g, product(attributes=full.attributes, options=(("color", ("white",)),)))
    # two options asked, one chosen: (3 + 1 + 1) / (3 + 2 + 1)
    g2 = goal(options=(("color", "black"), ("size", "large")))
    assert purchase_reward(g2, full, {"color": "black", "size": "small"}) == pytest.approx(5 / 6)


def hand_reward(g: ShopGoal, p: Product, selected: dict[str, str]) -> float:
    r_type = 1.0 if p.product_type == g.product_type else 0.5 if p.category == g.category else 0.1
    hits = (
        len(set(g.attributes) & set(p.attributes))
        + sum(selected.get(n) == v for n, v in g.options)
        + (p.price <= g.price_upper)
    )
    return r_type * hits / (len(g.attributes) + len(g.options) + 1)


def test_buying_in_the_env_pays_the_webshop_reward(env):
    checked = 0
    for task_id in range(40):
        obs, info = env.reset(options={"split": "train", "task_id": task_id})
        g = env.task("train", task_id)
        obs, _, _, _, info = env.step(f"search[{g.product_type}]")  # a broad query: imperfect items too
        clicks = [a for a in info["admissible_actions"] if ASIN.fullmatch(a[6:-1].upper())]
        asin = clicks[task_id % len(clicks)][6:-1].upper()
        p = env.catalog.products[env.catalog.index_of[asin]]
        obs, _, _, _, info = env.step(f"click[{asin.lower()}]")
        name, values = p.options[0]
        obs, _, _, _, info = env.step(f"click[{values[-1]}]")
        obs, reward, terminated, truncated, info = env.step("click[buy now]")
        expected = hand_reward(g, p, {name: values[-1]})
        assert terminated and not truncated
        assert info["score"] == pytest.approx(expected) and reward == pytest.approx(10 * expected)
        assert info["won"] == (expected == 1.0)
        assert obs == f"Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] {expected:.2f}"
        checked += expected < 1.0
    assert checked >= 10  # most of these purchases are imperfect


def test_reward_scale_and_type_gate_in_the_env():
    env = Shop(reward_scale=1.0)
    env.reset(options={"task_id": 3})
    g = env.task("train", 3)
    other = next(t for t in ("coffee", "t-shirt") if t != g.product_type)
    _, _, _, _, info = env.step(f"search[{other}]")
    env.step(next(a for a in info["admissible_actions"] if ASIN.fullmatch(a[6:-1].upper())))
    _, reward, terminated, _, info = env.step("click[buy now]")
    assert terminated and not info["won"] and reward == info["score"] <= 0.5


# -- the expert ---------------------------------------------------------------------------------


def play_expert(env, split, task_id):
    obs, info = env.reset(options={"split": split, "task_id": task_id})
    transcript = []
    for _ in range(env.max_steps):
        action = env.expert_action()
        assert action in info["admissible_actions"], (action, info["admissible_actions"])
        result = env.step(action)
        transcript.append((action, *result))
        info = result[4]
        if result[2] or result[3]:
            break
    return obs, transcript


@pytest.mark.parametrize("split", SPLITS)
def test_expert_wins_every_task_it_tries(env, split):
    for task_id in range(30):
        _, transcript = play_expert(env, split, task_id)
        *middle, (action, obs, reward, terminated, truncated, info) = transcript
        assert action == "click[buy now]" and terminated and not truncated
        assert info["won"] and info["score"] == 1.0 and reward == 10.0 and info["progress"] == 1.0
        assert transcript[0][0].startswith("search[")
        for _, _, r, term, trunc, inf in middle:
            assert r == 0.0 and not term and not trunc and not inf["won"] and not inf["invalid"]
            assert 0.0 < inf["progress"] < 1.0


def test_expert_pages_to_the_target_and_recovers_after_random_actions():
    rng = random.Random(0)
    env = Shop(max_steps=1000)
    paged = 0
    for task_id in range(40):
        _, info = env.reset(options={"task_id": task_id})
        terminated = False
        for _ in range(rng.randint(1, 12)):
            action = rng.choice(info["admissible_actions"])
            if action == "click[buy now]":
                continue
            _, _, terminated, _, info = env.step(action)
        # a broad query on a later page: the expert has to walk the pages
        if info["anchor"] == "page=search":
            _, _, _, _, info = env.step(f"search[{env.task('train', task_id).product_type}]")
        steps = 0
        while not terminated:
            action = env.expert_action()
            paged += action in ("click[next >]", "click[< prev]")
            _, _, terminated, _, info = env.step(action)
            assert not info["invalid"]
            steps += 1
            assert steps <= 15, info["privileged"]
        assert info["won"]
    assert paged > 0


# -- splits, determinism ------------------------------------------------------------------------


def test_splits_are_disjoint_in_targets_and_goals(env):
    assert env.splits == ("train", "valid", "test")
    assert [env.num_tasks(s) for s in SPLITS] == [10000, 1000, 500]
    targets, keys, texts = {}, {}, {}
    for split, n in (("train", 1500), ("valid", 1000), ("test", 500)):
        goals = [env.task(split, i) for i in range(n)]
        targets[split] = {g.target for g in goals}
        keys[split] = {(g.product_type, g.attributes, g.options) for g in goals}
        texts[split] = {INSTRUCTION.fullmatch(g.instruction).group(1, 2) for g in goals}
    for a, b in (("train", "valid"), ("train", "test"), ("valid", "test")):
        assert targets[a].isdisjoint(targets[b]) and keys[a].isdisjoint(keys[b])
        assert texts[a].isdisjoint(texts[b])
    assert len(targets["test"]) >= 15 and len(keys["test"]) >= 200
    small = Shop(num_train_tasks=5, num_valid_tasks=3, num_test_tasks=2)
    assert [small.num_tasks(s) for s in SPLITS] == [5, 3, 2]
    with pytest.raises(ValueError, match="task_id"):
        small.reset(options={"split": "test", "task_id": 2})
    with pytest.raises(ValueError, match="valid"):
        small.reset(options={"split": "valid_seen", "task_id": 0})


def test_goal_matches_its_target_and_instruction():
    env = Shop()
    for split in SPLITS:
        for task_id in range(20):
            g = env.task(split, task_id)
            p = env.catalog.products[env.catalog.index_of[g.target]]
            assert env.catalog.split_of[env.catalog.index_of[g.target]] == split
            assert is_perfect(g, p) and 1 <= len(g.attributes) <= 3 and 1 <= len(g.options) <= 2
            words, option_text, price = INSTRUCTION.fullmatch(g.instruction).groups()
            assert words.endswith(" " + g.product_type) and int(price) == g.price_upper > p.price
            assert option_text == " and ".join(f"{v} {n}" for n, v in g.options)
            assert g.queries[0] == " ".join([*g.attributes, g.product_type, *(v for _, v in g.options)])
            assert g.queries[-1] == g.product_type


def test_same_task_gives_identical_episodes():
    a, b = Shop(), Shop()
    for split in SPLITS:
        for task_id in (0, 7, 33):
            obs_a, info_a = a.reset(options={"split": split, "task_id": task_id})
            a.step(a.expert_action())  # playing must not leak into the next reset
            assert a.reset(options={"split": split, "task_id": task_id}) == (obs_a, info_a)
            assert b.reset(options={"split": split, "task_id": task_id}) == (obs_a, info_a)
            assert [t[:4] for t in play_expert(a, split, task_id)[1]] == [
                t[:4] for t in play_expert(b, split, task_id)[1]
            ]
    assert len({a.reset(options={"task_id": i})[0] for i in range(20)}) >= 18
    other = Shop(seed=1)
    assert other.catalog.products[0] != a.catalog.products[0]
    assert other.reset(options={"task_id": 0})[0] != a.reset(options={"task_id": 0})[0]
    assert a.reset(seed=5)[0] == a.reset(seed=5)[0]


def test_catalog_is_built_quickly_and_deterministically():
    start = time.perf_counter()
    catalog = Catalog(seed=123, num_products=300)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, elapsed  # ~0.05 s on the 2-core dev CPU; generous for loaded machines
    assert Catalog(seed=123, num_products=300).products == catalog.products
    assert len(catalog.products) == 300 and len({p.asin for p in catalog.products}) == 300
    assert {p.category for p in catalog.products} == {"beauty", "food", "fashion", "furniture", "electronics"}
    assert len({p.product_type for p in catalog.products}) == 25
    assert {"test", "valid", "train"} == set(catalog.split_of)


# -- pages and observations ---------------------------------------------------------------------


def test_search_page_and_candidate_queries(env):
    obs, info = env.reset(options={"split": "valid", "task_id": 4})
    g = env.task("valid", 4)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {info['task']} [SEP] Search"
    assert set(info) >= INFO_KEYS and info["task"] == g.instruction and info["task_type"] == g.category
    assert info["admissible_actions"] == [f"search[{q}]" for q in g.queries]
    assert 2 <= len(info["admissible_actions"]) <= 4
    assert (info["anchor"], info["progress"], info["score"], info["won"]) == ("page=search", 0.0, 0.0, False)
    assert g.target in info["privileged"] and g.instruction in info["privileged"]
    assert env.observation_space.contains(obs)


def test_results_item_and_detail_pages(env):
    obs, info = env.reset(options={"task_id": 2})
    task = info["task"]
    obs, _, _, _, info = env.step(env.expert_action())
    head = f"Instruction: [SEP] {task} [SEP] Back to Search [SEP] Page 1 (Total results: "
    assert obs.startswith(head) and env.observation_space.contains(obs)
    listed = ASIN.findall(obs)
    assert 1 <= len(listed) <= 10
    for asin in listed:
        p = env.catalog.products[env.catalog.index_of[asin]]
        assert f" [SEP] {asin} [SEP] {p.title} [SEP] ${p.price:.2f}" in obs
    assert info["admissible_actions"][0] == "click[back to search]"
    assert [a for a in info["admissible_actions"] if a[6:-1].upper() in listed] == [
        f"click[{a.lower()}]" for a in listed
    ]
    results_obs, results_info = obs, info
    # item page
    asin = listed[0]
    p = env.catalog.products[env.catalog.index_of[asin]]
    obs, _, _, _, info = env.step(f"click[{asin.lower()}]")
    options = " [SEP] ".join(f"{n} [SEP] " + " [SEP] ".join(vs) for n, vs in p.options)
    assert obs == (
        f"Instruction: [SEP] {task} [SEP] Back to Search [SEP] < Prev [SEP] {options} [SEP] "
        f"{p.title} [SEP] Price: ${p.price:.2f} [SEP] Rating: N.A. [SEP] Description [SEP] "
        f"Features [SEP] Buy Now"
    )
    values = [v for _, vs in p.options for v in vs]
    assert info["admissible_actions"] == (
        ["click[back to search]", "click[< prev]"]
        + [f"click[{v}]" for v in values]
        + ["click[description]", "click[features]", "click[buy now]"]
    )
    name, first = p.options[0][0], p.options[0][1][0]
    obs, _, _, _, info = env.step(f"click[{first}]")
    assert f" [SEP] {name} [SEP] {first} (selected) [SEP] " in obs and f"selected={name}={first}" in info["anchor"]
    item_obs = obs
    # description / features sub-pages, "< prev" back to the item keeps the selection
    obs, _, _, _, info = env.step("click[description]")
    assert obs == f"Instruction: [SEP] {task} [SEP] Back to Search [SEP] < Prev [SEP] {p.description}"
    assert info["admissible_actions"] == ["click[back to search]", "click[< prev]"]
    assert env.step("click[< prev]")[0] == item_obs
    obs, *_ = env.step("click[features]")
    assert obs == f"Instruction: [SEP] {task} [SEP] Back to Search [SEP] < Prev [SEP] " + " [SEP] ".join(p.features)
    env.step("click[< prev]")
    # "< prev" on the item returns to the results page; "back to search" to the search page
    assert env.step("click[< prev]")[0] == results_obs
    obs, _, _, _, info = env.step("click[back to search]")
    assert obs == f"WebShop [SEP] Instruction: [SEP] {task} [SEP] Search" and info["anchor"] == "page=search"
    assert info["admissible_actions"] == env.reset(options={"task_id": 2})[1]["admissible_actions"]
    assert results_info["anchor"].startswith("page=results|query=")


def hand_ranking(catalog: Catalog, query: str) -> list[str]:
    """ASINs ranked by an independent bm25s index (ties by catalog order), positive scores only."""
    import bm25s

    stop = set("a an and for i in of or the to with need".split())

    def tokens(text):
        return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in stop]

    index = bm25s.BM25()
    index.index(
        [tokens(" ".join([p.title, p.description, *p.features])) for p in catalog.products], show_progress=False
    )
    scores = index.get_scores(tokens(query))
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [catalog.products[i].asin for i in order if scores[i] > 0]


def test_pagination_ten_per_page_capped_at_num_results(env):
    env.reset(options={"task_id": 0})
    ranked = hand_ranking(env.catalog, "machine washable cotton")
    assert len(ranked) > 20
    obs, _, _, _, info = env.step("search[Machine   Washable COTTON]")  # free text, normalised
    assert info["anchor"] == "page=results|query=machine washable cotton|p=1"
    assert "Page 1 (Total results: " + str(min(50, len(ranked))) + ")" in obs
    assert ASIN.findall(obs) == ranked[:10]
    assert "click[next >]" in info["admissible_actions"] and "click[< prev]" not in info["admissible_actions"]
    page_one = obs
    obs, _, _, _, info = env.step("click[next >]")
    assert ASIN.findall(obs) == ranked[10:20] and "Page 2 (Total results: " in obs
    assert " [SEP] < Prev [SEP] Next > [SEP] " in obs and info["anchor"].endswith("|p=2")
    assert env.step("click[< prev]")[0] == page_one
    # a broad query is cut at num_results = 50: five pages, no "Next >" on the last
    env.reset(options={"task_id": 0})
    ranked = hand_ranking(env.catalog, "free")
    assert len(ranked) > 50
    obs, _, _, _, info = env.step("search[free]")
    for _page in range(2, 6):
        obs, _, _, _, info = env.step("click[next >]")
    assert "Page 5 (Total results: 50)" in obs and ASIN.findall(obs) == ranked[40:50]
    assert "Next >" not in obs and "click[next >]" not in info["admissible_actions"]
    # a query that matches nothing still shows a results page
    env.step("click[back to search]")
    obs, _, _, _, info = env.step("search[zzzz qqqq]")
    assert obs.endswith("Back to Search [SEP] Page 1 (Total results: 0)") and not info["invalid"]
    assert info["admissible_actions"] == ["click[back to search]"]


def test_progress_along_the_expert_path_and_on_a_wrong_item():
    env = Shop()
    task_id = next(i for i in range(50) if len(env.task("train", i).options) == 2)
    _, transcript = play_expert(env, "train", task_id)
    assert [t[-1]["progress"] for t in transcript] == [0.25, 0.5, 0.625, 0.75, 1.0]
    # a wrong product: results found (1/4), but not viewing a reward-1 item
    env.reset(options={"task_id": task_id})
    g = env.task("train", task_id)
    _, _, _, _, info = env.step(f"search[{g.queries[0]}]")
    wrong = next(
        a
        for a in info["admissible_actions"]
        if ASIN.fullmatch(a[6:-1].upper())
        and not is_perfect(g, env.catalog.products[env.catalog.index_of[a[6:-1].upper()]])
    )
    _, _, _, _, info = env.step(wrong)
    assert info["progress"] == 0.25
    _, _, terminated, _, info = env.step("click[buy now]")
    assert terminated and not info["won"] and info["progress"] == 0.25 and info["anchor"].startswith("page=done")


# -- invalid input, truncation ------------------------------------------------------------------


def item_page_env():
    env = Shop(max_steps=10**9)
    env.reset(options={"split": "test", "task_id": 3})
    env.step(env.expert_action())
    env.step(env.expert_action())
    return env


def assert_invalid_and_unchanged(env, action):
    before = env.step("")[4]  # an empty action reports the current state
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == "Nothing happens."
    assert info["invalid"] is True and reward == 0.0 and not terminated and not truncated
    for key in ("anchor", "privileged", "admissible_actions", "progress", "won", "score"):
        assert info[key] == before[key], key


BAD_ON_ITEM = [
    "",
    " ",
    "x" * 10000,
    "苹果 🍎",
    "\x00",
    "\ud800",
    "search[t-shirt]",
    "search[]",
    "click[]",
    "click[next >]",
    "click[b0zzzzzzzz]",
    "click[buy now",
    "buy now",
    "click [buy now]",
    "<action>click[buy now]</action>",
    None,
    b"click[buy now]",
    0,
    3.5,
    True,
    ["click[buy now]"],
    {"a": 1},
    object(),
]


@pytest.mark.parametrize("action", BAD_ON_ITEM, ids=lambda a: type(a).__name__)
def test_bad_inputs_on_the_item_page_are_invalid(action):
    assert_invalid_and_unchanged(item_page_env(), action)


def test_bad_inputs_on_search_and_results_pages():
    env = Shop(max_steps=10**9)
    env.reset(options={"task_id": 1})
    for action in (
        "search[]",
        "search[   ]",
        "click[back to search]",
        "click[buy now]",
        "search",
        "search t-shirt",
        "click[b0zzzzzzzz]",
    ):
        assert_invalid_and_unchanged(env, action)
    _, _, _, _, info = env.step(env.expert_action())
    for action in ("search[t-shirt]", "click[description]", "click[< prev]", "click[" + "x" * 50 + "]"):
        assert_invalid_and_unchanged(env, action)
    # an option value of another page is not clickable here
    assert_invalid_and_unchanged(env, "click[black]")


def test_random_strings_never_raise():
    env = item_page_env()
    admissible = set(env.step("")[4]["admissible_actions"])
    calls = []

    @settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.text())
    def on_item_page(text):
        assume(" ".join(text.split()).lower() not in admissible)
        calls.append(text)
        assert_invalid_and_unchanged(env, text)

    on_item_page()
    search_env = Shop(max_steps=10**9)
    search_env.reset(options={"task_id": 0})

    @settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.text(), st.booleans())
    def on_search_page(text, bracket):
        action = f"search[{text}]" if bracket else text
        obs, reward, terminated, truncated, info = search_env.step(action)
        calls.append(action)
        assert reward == 0.0 and not terminated and not truncated
        if info["invalid"]:
            assert obs == "Nothing happens." and info["anchor"] == "page=search"
        else:
            assert info["anchor"].startswith("page=results|query=") and search_env.observation_space.contains(obs)
            search_env.step("click[back to search]")

    on_search_page()
    assert len(calls) >= 3000


def test_truncation_invalid_steps_and_after_the_end():
    env = Shop(max_steps=5)
    env.reset(options={"task_id": 0})
    assert env.step("not an action")[2:4] == (False, False)  # invalid steps count
    _, _, _, _, info = env.step(env.expert_action())  # the results page
    env.step(next(a for a in info["admissible_actions"] if ASIN.fullmatch(a[6:-1].upper())))
    env.step("xyzzy")
    obs, reward, terminated, truncated, info = env.step("click[back to search]")
    assert (reward, terminated, truncated, info["won"], info["admissible_actions"]) == (0.0, False, True, False, [])
    obs, _, _, truncated, info = env.step("search[t-shirt]")
    assert obs == "Nothing happens." and info["invalid"] and truncated
    # after a purchase every action is invalid and the episode stays terminated
    env = Shop()
    _, transcript = play_expert(env, "train", 0)
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert (obs, reward, terminated, truncated, info["invalid"]) == ("Nothing happens.", 0.0, True, False, True)
    assert info["won"] and info["score"] == 1.0 and info["admissible_actions"] == []
    # before any reset
    obs, reward, _, _, info = Shop().step("search[coffee]")
    assert obs == "Nothing happens." and info["invalid"] and reward == 0.0


# -- kwargs, registry, corpus -------------------------------------------------------------------


def test_kwarg_validation():
    with pytest.raises(ValueError, match="num_products must be >= 50"):
        Shop(num_products=10)
    with pytest.raises(ValueError, match="max_steps must be >= 5"):
        Shop(max_steps=2)
    with pytest.raises(ValueError, match="reward_scale"):
        Shop(reward_scale=0)
    env = Shop(num_products=80, results_per_page=5, max_steps=8)
    for split in SPLITS:
        for task_id in range(10):
            _, transcript = play_expert(env, split, task_id)
            assert transcript[-1][-1]["won"]


def test_registry_and_make():
    assert "rspo/Shop-v0" in registered_env_ids()
    env = gymnasium.make("rspo/Shop-v0", max_steps=12)
    obs, info = env.reset(options={"split": "test", "task_id": 0})
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] i need ")
    obs, *_ = env.step(env.unwrapped.expert_action())
    assert obs.startswith("Instruction: [SEP] ")
    assert make_env("rspo/Shop-v0", num_products=100).unwrapped.num_products == 100


def test_vocabulary_and_sample_texts_cover_what_the_env_prints():
    rng = random.Random(1)
    env = Shop()
    vocabulary = set(env.vocabulary())
    for task_id in range(30):
        split = SPLITS[task_id % 3]
        obs, info = env.reset(options={"split": split, "task_id": task_id})
        printed = set(WORDS.findall(obs)) | set(obs.split())
        for _ in range(15):
            for action in info["admissible_actions"]:
                printed |= set(WORDS.findall(action)) | set(action.split())
            action = rng.choice(info["admissible_actions"] + [env.expert_action()] * 2)
            obs, _, terminated, truncated, info = env.step(action)
            printed |= set(WORDS.findall(obs)) | set(obs.split())
            if terminated or truncated:
                break
        assert printed <= vocabulary, printed - vocabulary
    texts = env.sample_texts(num_tasks=2, seed=0)
    obs, info = env.reset(options={"split": "test", "task_id": 1})
    assert obs in texts and info["task"] in texts and info["privileged"] in texts


def test_rollout_engine_plays_shop_with_constrained_decoding(tmp_path):
    from rspo_lightning.language_model import TinyModelConfig, load_policy
    from rspo_lightning.prompts import template_texts
    from rspo_lightning.rollout import RolloutConfig, RolloutEngine
    from rspo_lightning.types import TaskSpec

    kwargs = {"max_steps": 6}
    env = make_env("rspo/Shop-v0", **kwargs)
    corpus = env.unwrapped.sample_texts(num_tasks=3) + template_texts()
    model, tok = load_policy(
        "tiny",
        corpus=corpus,
        save_dir=str(tmp_path),
        tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    )
    torch.manual_seed(0)
    engine = RolloutEngine(
        model,
        tok,
        RolloutConfig(constrained_decoding=True, max_new_tokens=40, template="compact", history_window=1),
        kwargs,
    )
    trajectories = engine.collect([TaskSpec("rspo/Shop-v0", "train", i, group_id=i) for i in range(2)], 2)
    assert len(trajectories) == 4
    for traj in trajectories:
        assert 1 <= len(traj.turns) <= 6 and traj.task_type in {"beauty", "food", "fashion", "furniture", "electronics"}
        assert all(turn.valid for turn in traj.turns), [turn.action for turn in traj.turns]
        assert traj.turns[0].action.startswith("search[")
        ended = traj.truncated or traj.turns[-1].action == "click[buy now]"
        assert ended and 0.0 <= traj.score <= 1.0
