"""Tests for rspo_lightning.envs.household (the ALFWorld look-alike) and the TextEnv registry.

Expectations are written out by hand from ALFWorld's grammar and messages; instructions are
parsed with the test's own regexes, not with the env's helpers.
"""

from __future__ import annotations

import random
import re

import gymnasium
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import rspo_lightning.envs  # noqa: F401  (registers rspo/ ids)
from rspo_lightning.envs import Household, make_env, registered_env_ids
from rspo_lightning.envs.base import register_env

TASK_TYPES = [
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj_and_place",
]
SPLITS = ["train", "valid_seen", "valid_unseen"]
OPENABLE = {"fridge", "cabinet", "drawer", "microwave", "safe"}
INFO_KEYS = {"task", "task_type", "admissible_actions", "anchor", "privileged", "won", "score", "progress", "invalid"}
WORDS = re.compile(r"\w+|[^\w\s]+")

# ALFWorld instruction forms -> (task type, object type, receptacle type).
INSTRUCTION_FORMS = [
    (r"put (?:a|some) (\w+) (?:in|on) (\w+)\.", "pick_and_place"),
    (r"(?:look at|examine the) (\w+) (?:under|with) the (desklamp)\.", "look_at_obj_in_light"),
    (r"(?:put a clean (\w+) in|clean some (\w+) and put it in) (\w+)\.", "pick_clean_then_place"),
    (r"(?:put a hot (\w+) in|heat some (\w+) and put it in) (\w+)\.", "pick_heat_then_place"),
    (r"(?:put a cool (\w+) in|cool some (\w+) and put it in) (\w+)\.", "pick_cool_then_place"),
    (r"(?:put two (\w+) in|find two (\w+) and put them in) (\w+)\.", "pick_two_obj_and_place"),
]


def parse_instruction(text: str) -> tuple[str, str, str]:
    for pattern, task_type in INSTRUCTION_FORMS:
        match = re.fullmatch(pattern, text)
        if match:
            groups = [g for g in match.groups() if g is not None]
            return task_type, groups[0], groups[1]
    raise AssertionError(f"not an ALFWorld instruction: {text!r}")


def welcome_receptacles(observation: str) -> list[str]:
    match = re.search(r"Looking quickly around you, you see (.*)\.\n\nYour task is to: ", observation)
    assert match, observation
    return re.findall(r"a (\w+ \d+)", match.group(1))


def play_expert(env, split: str, task_id: int):
    """Play the expert from reset; return (initial obs, list of (action, obs, reward, term, trunc, info))."""
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


def assert_expert_wins(env, split: str, task_id: int, task_type: str | None = None) -> int:
    _, transcript = play_expert(env, split, task_id)
    *middle, last = transcript
    _, _, reward, terminated, truncated, info = last
    assert terminated and not truncated and info["won"], (split, task_id, info["task"])
    assert reward == env.success_reward and info["score"] == 1.0 and info["progress"] == 1.0
    assert len(transcript) <= env.max_steps
    for _, _, r, term, trunc, inf in middle:
        assert r == 0.0 and not term and not trunc and not inf["won"] and not inf["invalid"]
        assert 0.0 <= inf["progress"] < 1.0
    if task_type is not None:
        assert info["task_type"] == task_type
        assert parse_instruction(info["task"])[0] == task_type
    return len(transcript)


# -- the expert solves every task type in every split --------------------------------------------


@pytest.mark.parametrize("task_type", TASK_TYPES)
@pytest.mark.parametrize("split", SPLITS)
def test_expert_wins_each_task_type_default_settings(task_type, split):
    env = Household(task_types=[task_type])
    assert env.max_steps == 50
    for task_id in range(20):
        assert_expert_wins(env, split, task_id, task_type)


@pytest.mark.parametrize("split", SPLITS)
def test_expert_wins_easy_setting(split):
    env = Household(task_types=["pick_and_place"], num_receptacles=6, max_steps=10)
    for task_id in range(20):
        obs, _ = env.reset(options={"split": split, "task_id": task_id})
        assert len(welcome_receptacles(obs)) == 6
        # go to, open (maybe), take, go to, open (maybe), put: at most 6 steps.
        assert assert_expert_wins(env, split, task_id, "pick_and_place") <= 6


@pytest.mark.parametrize("difficulty", [0, 1, 2, 3])
def test_expert_wins_difficulty_presets(difficulty):
    env = Household(difficulty=difficulty)
    for split in SPLITS:
        for task_id in range(8):
            assert_expert_wins(env, split, task_id)


def test_mixed_task_types_cover_all_six():
    env = Household()
    seen = {env.reset(options={"task_id": i})[1]["task_type"] for i in range(200)}
    assert seen == set(TASK_TYPES)


def test_expert_recovers_after_random_actions():
    rng = random.Random(0)
    env = Household(max_steps=1000)
    for task_id in range(60):
        _, info = env.reset(options={"task_id": task_id})
        for _ in range(rng.randint(1, 30)):
            _, _, terminated, _, info = env.step(rng.choice(info["admissible_actions"]))
            if terminated:
                break
        steps = 0
        while not terminated:
            _, _, terminated, _, info = env.step(env.expert_action())
            assert not info["invalid"]
            steps += 1
            assert steps <= 20, info["privileged"]


# -- determinism and splits ---------------------------------------------------------------------


def test_same_task_gives_identical_start_and_ids_differ():
    a, b = Household(), Household()
    for split in SPLITS:
        for task_id in (0, 7, 33):
            obs_a, info_a = a.reset(options={"split": split, "task_id": task_id})
            a.step(a.expert_action())  # playing must not leak into the next reset
            obs_a2, info_a2 = a.reset(options={"split": split, "task_id": task_id})
            obs_b, info_b = b.reset(options={"split": split, "task_id": task_id})
            assert obs_a == obs_b == obs_a2
            assert info_a == info_b == info_a2
    starts = {a.reset(options={"task_id": i})[0] for i in range(20)}
    assert len(starts) >= 18
    other_seed = Household(seed=1).reset(options={"task_id": 0})[0]
    assert other_seed != a.reset(options={"task_id": 0})[0]


def test_reset_without_task_id_follows_the_seed():
    env = Household()
    assert env.reset(seed=5)[0] == env.reset(seed=5)[0]
    assert len({env.reset(seed=s)[0] for s in range(10)}) > 1


def test_num_tasks_and_splits():
    env = Household(num_train_tasks=50, num_valid_seen=7, num_valid_unseen=9)
    assert env.splits == ("train", "valid_seen", "valid_unseen")
    assert [env.num_tasks(s) for s in SPLITS] == [50, 7, 9]
    assert Household().num_tasks("train") == 10000
    assert Household().num_tasks("valid_seen") == 140
    assert Household().num_tasks("valid_unseen") == 134
    env.reset(options={"split": "valid_seen", "task_id": 6})
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"split": "valid_seen", "task_id": 7})
    with pytest.raises(ValueError, match="valid_unseen"):
        env.reset(options={"split": "test", "task_id": 0})


def test_valid_unseen_goal_combinations_never_seen_in_train():
    env = Household()

    def combos(split, n):
        out = set()
        for task_id in range(n):
            _, info = env.reset(options={"split": split, "task_id": task_id})
            task_type, obj, rec = parse_instruction(info["task"])
            assert task_type == info["task_type"]
            out.add((obj, rec))
        return out

    seen = combos("train", 2000) | combos("valid_seen", 140)
    unseen = combos("valid_unseen", 134)
    assert seen.isdisjoint(unseen), seen & unseen
    assert len(unseen) >= 20 and len(seen) >= 100
    unseen_types = {env.reset(options={"split": "valid_unseen", "task_id": i})[1]["task_type"] for i in range(134)}
    assert unseen_types == set(TASK_TYPES)


# -- the info contract and ALFWorld's grammar ---------------------------------------------------


def test_reset_info_contract():
    env = Household()
    obs, info = env.reset(options={"split": "train", "task_id": 3})
    assert obs.startswith(
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see a "
    )
    assert obs.endswith(f"\n\nYour task is to: {info['task']}")
    assert set(info) >= INFO_KEYS
    assert info["won"] is False and info["score"] == 0.0 and info["invalid"] is False
    assert info["progress"] == 0.0
    assert isinstance(info["anchor"], str) and hash(info["anchor"]) is not None
    assert isinstance(info["privileged"], str) and info["task"] in info["privileged"]
    receptacles = welcome_receptacles(obs)
    assert len(receptacles) == 12
    expected = sorted(f"go to {r}" for r in receptacles) + ["inventory", "look"]
    assert sorted(info["admissible_actions"]) == expected
    assert env.observation_space.contains(obs)


def test_arrival_messages_and_listing_format():
    env = Household()
    forms = set()
    for task_id in range(30):
        obs, _ = env.reset(options={"task_id": task_id})
        for rec in welcome_receptacles(obs):
            obs, *_ = env.step(f"go to {rec}")
            kind = rec.rsplit(" ", 1)[0]
            assert obs.startswith(f"You arrive at {rec}. ")
            if kind in OPENABLE:
                assert obs == f"You arrive at {rec}. The {rec} is closed."
            elif kind == "desklamp":
                assert obs == f"You arrive at {rec}. The {rec} is off."
            else:
                listing = obs[len(f"You arrive at {rec}. On the {rec}, you see ") :]
                assert obs.startswith(f"You arrive at {rec}. On the {rec}, you see ")
                if listing == "nothing.":
                    forms.add(0)
                elif re.fullmatch(r"a \w+ \d+\.", listing):
                    forms.add(1)
                elif re.fullmatch(r"a \w+ \d+, and a \w+ \d+\.", listing):
                    forms.add(2)
                else:
                    assert re.fullmatch(r"(a \w+ \d+, )+and a \w+ \d+\.", listing), listing
                    forms.add(3)
    assert forms == {0, 1, 2, 3}


def find_task(env, predicate, limit=300):
    for task_id in range(limit):
        obs, info = env.reset(options={"task_id": task_id})
        if predicate(obs, info):
            return obs, info
    raise AssertionError("no task matches")


def test_take_put_inventory_examine_and_one_object_in_hand():
    env = Household(task_types=["pick_and_place"])
    env.reset(options={"task_id": 0})
    # Walk to receptacles until one shows objects on it.
    for action in list(env.reset(options={"task_id": 0})[1]["admissible_actions"]):
        if not action.startswith("go to "):
            continue
        obs, _, _, _, info = env.step(action)
        takes = [a for a in info["admissible_actions"] if a.startswith("take ")]
        if len(takes) >= 2:
            break
    else:
        raise AssertionError("no receptacle with two objects")
    rec = action[len("go to ") :]
    obj = re.fullmatch(r"take (\w+ \d+) from (\w+ \d+)", takes[0]).group(1)
    assert env.step("inventory")[0] == "You are not carrying anything."
    obs, _, _, _, info = env.step(f"take {obj} from {rec}")
    assert obs == f"You pick up the {obj} from the {rec}."
    assert not [a for a in info["admissible_actions"] if a.startswith("take ")]  # one in hand
    assert f"put {obj} in/on {rec}" in info["admissible_actions"]
    assert f"held={obj}" in info["anchor"]
    assert env.step("inventory")[0] == f"You are carrying: a {obj}."
    assert env.step(f"examine {obj}")[0] == f"There's nothing special about {obj}."
    other = re.fullmatch(r"take (\w+ \d+) from .*", takes[1]).group(1)
    obs, _, _, _, info = env.step(f"take {other} from {rec}")
    assert obs == "Nothing happens." and info["invalid"]
    obs, _, _, _, info = env.step(f"put {obj} in/on {rec}")
    assert obs == f"You put the {obj} in/on the {rec}."
    assert env.step(f"examine {rec}")[0].endswith(f"a {obj}.")
    assert f"take {obj} from {rec}" in info["admissible_actions"]
    assert env.step(f"go to {rec}")[0] == "Nothing happens."  # already there
    assert env.step("look")[0] == f"You are facing the {rec}. Next to it, you see nothing."


def test_open_close_and_action_normalisation():
    env = Household()
    obs, _ = env.reset(options={"task_id": 1})
    rec = next(r for r in welcome_receptacles(obs) if r.rsplit(" ", 1)[0] in OPENABLE)
    obs, _, _, _, info = env.step(f"   GO   To\t{rec.upper()}  ")
    assert obs == f"You arrive at {rec}. The {rec} is closed." and not info["invalid"]
    assert f"open {rec}" in info["admissible_actions"]
    assert not [a for a in info["admissible_actions"] if a.startswith("take ")]  # closed
    obs, _, _, _, info = env.step(f"Open {rec}")
    assert obs.startswith(f"You open the {rec}. The {rec} is open. In it, you see ")
    assert f"close {rec}" in info["admissible_actions"] and f"open {rec}" not in info["admissible_actions"]
    assert f"open={rec}" in info["anchor"]
    assert env.step(f"close {rec}")[0] == f"You close the {rec}."
    assert env.step(f"examine {rec}")[0] == f"The {rec} is closed."


@pytest.mark.parametrize(
    "task_type,verb,appliance,state",
    [
        ("pick_clean_then_place", "clean", "sinkbasin 1", "clean"),
        ("pick_heat_then_place", "heat", "microwave 1", "hot"),
        ("pick_cool_then_place", "cool", "fridge 1", "cool"),
    ],
)
def test_clean_heat_cool_at_the_appliance(task_type, verb, appliance, state):
    env = Household(task_types=[task_type], max_steps=100)
    for task_id in range(20):  # a task whose target does not start at the appliance
        obs, info = env.reset(options={"task_id": task_id})
        assert appliance in welcome_receptacles(obs)
        obj = parse_instruction(info["task"])[1]
        while not obs.startswith("You pick up the "):  # let the expert fetch the target
            obs, _, _, _, info = env.step(env.expert_action())
        if not obs.endswith(f"from the {appliance}."):
            break
    held = re.fullmatch(r"You pick up the (\w+ \d+) from .*", obs).group(1)
    assert held.startswith(obj + " ")
    assert not [a for a in info["admissible_actions"] if a.startswith(verb + " ")]
    obs, _, _, _, info = env.step(f"go to {appliance}")
    assert info["progress"] == pytest.approx(1 / 3)  # taken, not yet processed
    assert f"{verb} {held} with {appliance}" in info["admissible_actions"]
    obs, _, _, _, info = env.step(f"{verb} {held} with {appliance}")
    assert obs == f"You {verb} the {held} using the {appliance}."
    assert info["progress"] == pytest.approx(2 / 3)
    assert f"{held}@held+{state}" in info["anchor"]
    assert f"{held} ({state})" in info["privileged"]


def test_look_task_lamp_and_progress():
    env = Household(task_types=["look_at_obj_in_light"])
    obs, info = env.reset(options={"task_id": 2})
    assert env.step("go to desklamp 1")[0] == "You arrive at desklamp 1. The desklamp 1 is off."
    assert not [a for a in env.step("look")[4]["admissible_actions"] if a.startswith("put ")]
    obs, _, _, _, info = env.step("use desklamp 1")
    assert obs == "You turn on the desklamp 1." and info["progress"] == pytest.approx(1 / 3)
    assert not info["won"]
    # Fetch the object; arriving back at the lit lamp while holding it wins.
    for _ in range(10):
        obs, reward, terminated, _, info = env.step(env.expert_action())
        if terminated:
            break
    assert obs == "You arrive at desklamp 1. The desklamp 1 is on."
    assert info["won"] and reward == 10.0 and info["progress"] == 1.0


def test_progress_is_a_function_of_state_and_can_go_down():
    env = Household(task_types=["pick_and_place"])
    _, info = env.reset(options={"task_id": 5})
    assert info["progress"] == 0.0
    while True:
        action = env.expert_action()
        obs, _, _, _, info = env.step(action)
        if action.startswith("take "):
            break
    assert info["progress"] == 0.5  # taken, not placed
    rec = action.rsplit(" from ", 1)[1]
    obj = action[len("take ") :].rsplit(" from ", 1)[0]
    _, _, _, _, info = env.step(f"put {obj} in/on {rec}")  # put it back where it was
    assert info["progress"] == 0.0


def test_pick_two_progress_quarters():
    env = Household(task_types=["pick_two_obj_and_place"])
    _, transcript = play_expert(env, "train", 0)
    values = [info["progress"] for *_, info in transcript]
    assert set(values) <= {0.0, 0.25, 0.5, 0.75, 1.0}
    assert values == sorted(values) and values[-1] == 1.0
    assert values.count(1.0) == 1


def test_custom_success_reward_and_truncation():
    env = Household(success_reward=3.5)
    _, transcript = play_expert(env, "train", 1)
    assert transcript[-1][2] == 3.5 and all(t[2] == 0.0 for t in transcript[:-1])
    # After the win: every action, even a formerly admissible one, is invalid.
    obs, reward, terminated, _, info = env.step("look")
    assert obs == "Nothing happens." and reward == 0.0 and info["invalid"] and terminated
    assert info["admissible_actions"] == []

    env = Household(max_steps=3)
    env.reset(options={"task_id": 0})
    assert env.step("look")[2:4] == (False, False)
    assert env.step("not a command")[2:4] == (False, False)  # invalid steps count too
    obs, reward, terminated, truncated, info = env.step("inventory")
    assert (terminated, truncated, reward, info["won"]) == (False, True, 0.0, False)
    obs, _, _, truncated, info = env.step("look")
    assert obs == "Nothing happens." and info["invalid"] and truncated

    env = Household(max_steps=2)
    env.reset(options={"task_id": 0})
    env.step("look")
    obs, _, terminated, truncated, info = env.step("xyzzy")  # an invalid last step truncates too
    assert (obs, terminated, truncated, info["invalid"]) == ("Nothing happens.", False, True, True)
    assert info["admissible_actions"] == []


def test_step_before_reset_does_not_raise():
    obs, reward, _, _, info = Household().step("look")
    assert obs == "Nothing happens." and info["invalid"] and reward == 0.0


# -- any input is legal -----------------------------------------------------------------------


def invalid_env():
    env = Household(max_steps=10**9)
    env.reset(options={"split": "valid_seen", "task_id": 11})
    env.step(env.expert_action())
    env.step(env.expert_action())
    return env


def assert_invalid_and_unchanged(env, action):
    before = env.step("inventory")[4]
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs == "Nothing happens."
    assert info["invalid"] is True and reward == 0.0 and not terminated and not truncated
    for key in ("anchor", "privileged", "admissible_actions", "progress", "won"):
        assert info[key] == before[key], key


EXPLICIT_BAD_INPUTS = [
    "",
    " ",
    "\n\t",
    "x" * 10000,
    "苹果 🍎 ñ",
    "\x00\x01",
    "\ud800",
    "<action></action>",
    "<action>look</action>",
    "go to",
    "take",
    "go to nowhere 1",
    "put apple 1 in/on",
    "look.",
    "inventory please",
    None,
    b"look",
    b"\xff",
    0,
    42,
    3.5,
    True,
    ["look"],
    {"a": 1},
    object(),
]


@pytest.mark.parametrize("action", EXPLICIT_BAD_INPUTS, ids=lambda a: type(a).__name__)
def test_explicit_bad_inputs_are_invalid(action):
    assert_invalid_and_unchanged(invalid_env(), action)


def test_random_strings_never_raise():
    env = invalid_env()
    admissible = set(env.step("inventory")[4]["admissible_actions"])

    calls = []

    @settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.text())
    def check(text):
        assume(" ".join(text.split()).lower() not in admissible)
        calls.append(text)
        assert_invalid_and_unchanged(env, text)

    check()
    assert len(calls) >= 1000


def test_valid_action_changes_state():
    env = invalid_env()
    before = env.step("inventory")[4]
    go = next(a for a in before["admissible_actions"] if a.startswith("go to "))
    obs, _, _, _, info = env.step(go)
    assert obs.startswith(f"You arrive at {go[6:]}.") and not info["invalid"]
    assert info["anchor"] != before["anchor"] and info["anchor"].startswith(f"at={go[6:]}|")


# -- kwargs, registry, spaces -----------------------------------------------------------------


def test_kwarg_validation():
    with pytest.raises(ValueError, match="pick_and_place") as err:
        Household(task_types=["pick_and_juggle"])
    assert "pick_and_juggle" in str(err.value)
    with pytest.raises(ValueError, match="num_receptacles must be >= 6"):
        Household(num_receptacles=5)  # 4 appliances + goal + start
    Household(task_types=["pick_and_place"], num_receptacles=2)
    with pytest.raises(ValueError, match="difficulty"):
        Household(difficulty=4)
    with pytest.raises(ValueError, match="max_steps"):
        Household(max_steps=0)
    env = Household(difficulty=0, max_steps=7)  # explicit kwargs win over the preset
    assert (env.task_types, env.num_receptacles, env.max_steps) == (("pick_and_place",), 6, 7)


def test_registry_and_make():
    assert "rspo/Household-v0" in registered_env_ids()
    with pytest.raises(ValueError, match="rspo/Household-v0") as err:
        make_env("rspo/NoSuchEnv-v0")
    assert "rspo/NoSuchEnv-v0" in str(err.value)
    register_env("rspo/Household-v0", "rspo_lightning.envs.household:Household")  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        register_env("rspo/Household-v0", "somewhere:Else")
    env = gymnasium.make("rspo/Household-v0", task_types=["pick_and_place"])
    obs, info = env.reset(options={"split": "train", "task_id": 0})
    assert info["task_type"] == "pick_and_place"
    obs, *_ = env.step(env.unwrapped.expert_action())
    assert obs.startswith("You arrive at ")
    env2 = make_env("rspo/Household-v0", difficulty=0)
    assert env2.unwrapped.num_receptacles == 6


# -- tokenizer corpus -------------------------------------------------------------------------


def test_sample_texts_cover_expert_episodes():
    env = Household()
    texts = env.sample_texts(num_tasks=3, seed=0)
    corpus = {w for t in texts for w in WORDS.findall(t)}
    obs, info = env.reset(options={"task_id": 0})
    assert obs in texts and info["task"] in texts
    for split, task_id in (("train", 5000), ("valid_unseen", 100), ("valid_seen", 77)):
        obs, transcript = play_expert(env, split, task_id)
        words = set(WORDS.findall(obs))
        for action, o, *_, inf in transcript:
            words |= set(WORDS.findall(action)) | set(WORDS.findall(o))
            words |= {w for a in inf["admissible_actions"] for w in WORDS.findall(a)}
        assert words <= corpus, words - corpus
    assert {"apple", "countertop", "desklamp", "in", "/", "on", "Nothing", "."} <= corpus


def test_vocabulary_holds_every_printed_word():
    rng = random.Random(1)
    env = Household(difficulty=3)
    vocabulary = set(env.vocabulary())
    for task_id in range(40):
        obs, info = env.reset(options={"split": "valid_unseen" if task_id % 2 else "train", "task_id": task_id})
        printed = set(WORDS.findall(obs))
        for _ in range(40):
            action = rng.choice(info["admissible_actions"])
            obs, _, terminated, truncated, info = env.step(action)
            printed |= set(WORDS.findall(obs)) | set(WORDS.findall(action))
            if terminated or truncated:
                break
        assert printed <= vocabulary, printed - vocabulary


def test_info_actions_off_removes_state_preserving_commands_and_expert_still_wins():
    env = Household(task_types=["pick_and_place"], num_receptacles=6, max_steps=10, info_actions=False)
    for task_id in range(20):
        obs, info = env.reset(options={"split": "train", "task_id": task_id})
        done = False
        while not done:
            acts = info["admissible_actions"]
            assert "look" not in acts and "inventory" not in acts
            assert not any(a.startswith("examine") for a in acts)
            obs, reward, term, trunc, info = env.step(env.expert_action())
            done = term or trunc
        assert info["won"]
    env.reset(options={"split": "train", "task_id": 0})
    obs, _, _, _, info = env.step("look")
    assert obs == "Nothing happens." and info["invalid"]


def test_num_object_types_restricts_goals_and_distractors():
    from rspo_lightning.envs.household import OBJECT_TYPES

    allowed = set(list(OBJECT_TYPES)[:8])
    env = Household(task_types=["pick_and_place"], num_receptacles=6, num_object_types=8)
    for split in env.splits:
        for task_id in range(30):
            task = env.unwrapped.task(split, task_id)
            assert task.object_type in allowed
            assert {obj.rsplit(" ", 1)[0] for obj, _ in task.placement} <= allowed
    with pytest.raises(ValueError, match="num_object_types"):
        Household(num_object_types=1)
