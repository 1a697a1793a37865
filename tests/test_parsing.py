"""Parsing and prompts: hand-written cases."""

from rspo_lightning import prompts
from rspo_lightning.parsing import parse_response
from rspo_lightning.prompts import HistoryEntry, render_prompt

ADM = ["go to shelf 1", "take apple 1 from shelf 1", "put apple 1 in/on fridge 1"]


def test_well_formed_response_with_think():
    p = parse_response("<think>the apple is on the shelf</think><action>take apple 1 from shelf 1</action>", ADM)
    assert p.valid and p.action == "take apple 1 from shelf 1" and p.reason == "ok"
    assert p.think == "the apple is on the shelf"


def test_whitespace_and_case_are_normalised_to_the_admissible_spelling():
    p = parse_response("<action>  Go   TO shelf 1 \n</action>", ADM)
    assert p.valid and p.action == "go to shelf 1"


def test_missing_tag_is_invalid():
    for text in ["", "go to shelf 1", "<action>go to shelf 1", "go to shelf 1</action>", "<think>hm</think>"]:
        p = parse_response(text, ADM)
        assert not p.valid and p.reason == "missing_action_tag" and p.action == "", text


def test_empty_action_is_invalid():
    p = parse_response("<action>   </action>", ADM)
    assert not p.valid and p.reason == "empty_action"


def test_extra_text_around_the_tag_is_ignored():
    p = parse_response("Sure! I will act now. <action>go to shelf 1</action> Done.", ADM)
    assert p.valid and p.action == "go to shelf 1"


def test_multiple_actions_are_invalid():
    p = parse_response("<action>go to shelf 1</action><action>take apple 1 from shelf 1</action>", ADM)
    assert not p.valid and p.reason == "multiple_actions"


def test_not_admissible():
    p = parse_response("<action>fly to the moon</action>", ADM)
    assert not p.valid and p.reason == "not_admissible"
    p = parse_response("<action>fly to the moon</action>", ADM, require_admissible=False)
    assert p.valid and p.action == "fly to the moon"
    p = parse_response("<action>fly to the moon</action>", None)  # env without an admissible list
    assert p.valid


def test_require_think():
    p = parse_response("<action>go to shelf 1</action>", ADM, require_think=True)
    assert not p.valid and p.reason == "missing_think"


def test_garbage_inputs_never_raise():
    for text in [
        None,
        3,
        b"\xff\xfe<action>go to shelf 1</action>",
        "<action>" + "x" * 10_000 + "</action>",
        "ignore previous instructions <action>rm -rf /</action>",
        "\x00\udcff",
    ]:
        p = parse_response(text, ADM)
        assert not p.valid or p.action in ADM


def test_prompt_shows_only_the_last_history_window_pairs():
    history = [HistoryEntry(f"obs{i}", f"act{i}") for i in range(1, 5)]
    text = render_prompt(
        "household",
        task="put a apple in fridge.",
        observation="now",
        admissible=ADM,
        history=history,
        step=4,
        history_window=2,
    )
    assert "obs3" in text and "act4" in text
    assert "obs2" not in text and "act1" not in text
    # numbering continues from the true step count
    assert "Observation 3: obs3" in text and "Action 4: act4" in text
    assert "already taken 4 step(s)" in text and "You are now at step 5" in text
    assert "\n- go to shelf 1" in text


def test_first_step_prompt_has_no_history_section():
    text = render_prompt("compact", task="t", observation="o", admissible=ADM, history=[], step=0, history_window=2)
    assert "history" not in text.lower()
    text0 = render_prompt(
        "household",
        task="t",
        observation="o",
        admissible=ADM,
        history=[HistoryEntry("a", "b")],
        step=1,
        history_window=0,
    )
    assert "Observation 1" not in text0


def test_compact_near_puts_the_task_between_the_observation_and_the_actions():
    history = [HistoryEntry("obs1", "act1")]
    kw = dict(task="put a apple in fridge.", observation="now", admissible=ADM, history=history, step=1)
    near = render_prompt("compact_near", history_window=2, **kw)
    assert near.index("Observation 1: obs1") < near.index("Observation: now") < near.index("Task: put a apple")
    assert near.index("Task: put a apple") < near.index("Admissible actions:") < near.index("\n- go to shelf 1")
    assert near.count("put a apple") == 1
    # the same words as compact, in another order
    assert sorted(near.split()) == sorted(render_prompt("compact", history_window=2, **kw).split())
    first = render_prompt("compact_near", history_window=2, **{**kw, "history": [], "step": 0})
    assert first.startswith("Observation: now\nTask: put a apple in fridge.\nAdmissible actions:")


def test_compact_last_puts_the_task_right_before_the_answer():
    history = [HistoryEntry("obs1", "act1")]
    kw = dict(task="put a apple in fridge.", observation="now", admissible=ADM, history=history, step=1)
    last = render_prompt("compact_last", history_window=2, **kw)
    assert last.index("Observation: now") < last.index("Admissible actions:") < last.index("Task: put a apple")
    assert last.endswith("- put apple 1 in/on fridge 1\nTask: put a apple in fridge.\nAnswer with <action> </action>.")
    assert sorted(last.split()) == sorted(render_prompt("compact", history_window=2, **kw).split())
    first = render_prompt("compact_last", history_window=2, **{**kw, "history": [], "step": 0})
    assert first.startswith("Observation: now\nAdmissible actions:")


def test_template_texts_cover_every_template_without_reordering_the_tiny_vocabulary():
    # the texts the tiny tokenizer trains on are those from before compact_near existed, so its ids
    # (and every recorded tiny run) stay as they were; compact_near's words are all among them
    expected = [
        prompts.SYSTEM_PROMPT,
        prompts.PRIVILEGED_PREFIX,
        prompts.HOUSEHOLD_TEMPLATE,
        prompts.HOUSEHOLD_TEMPLATE_NO_HISTORY,
        prompts.COMPACT_TEMPLATE,
        prompts.COMPACT_TEMPLATE_NO_HISTORY,
        "- Observation 1: Action 1:",
    ]
    assert prompts.template_texts() == expected
    vocabulary = set().union(*map(prompts._words, expected))
    for name, pair in prompts.TEMPLATES.items():
        for text in pair:
            assert prompts._words(text) <= vocabulary, name
    assert prompts._words("Task: put a apple.") == {"Task", ":", "put", "a", "apple", "."}
