"""benchmarks/grounding.py: the decision counts against a hand count on one episode, and the
scripted agents' switches."""

import json
import math
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import grounding  # noqa: E402


def test_task_words_and_a_clear_error():
    assert grounding.task_words("put some cup on diningtable.") == ("cup", "diningtable")
    with pytest.raises(ValueError, match="not a pick-and-place instruction"):
        grounding.task_words("look at cup under the desklamp.")


def test_decision_counts_match_a_hand_count():
    env = grounding.quickstart_env()
    # valid_seen task 1: "put some cup on diningtable."; cup 1 and egg 1 on bed 1, cup 2 on sofa 1
    task = env.task("valid_seen", 1)
    assert task.instruction == "put some cup on diningtable."
    assert set(task.placement) == {("cup 1", "bed 1"), ("cup 2", "sofa 1"), ("egg 1", "bed 1")}
    actions = [
        "go to bed 1",  # nothing held: no decision of either kind
        "take egg 1 from bed 1",  # object decision (cup and egg here), wrong
        "go to diningtable 1",  # carrying a distractor: not a goal decision
        "put egg 1 in/on diningtable 1",
        "go to sofa 1",
        "take cup 2 from sofa 1",  # only a cup here: no choice of object
        "go to countertop 1",  # carrying the target: goal decision, wrong
        "go to diningtable 1",  # goal decision, right
        "put cup 2 in/on diningtable 1",  # wins
    ]
    ep = {"task": {"split": "valid_seen", "task_id": 1}, "turns": [{"action": a} for a in actions], "success": True}
    counts = grounding.decision_counts(env, [ep])
    # chance: 1 of 2 objects at bed 1; 1 of 3 receptacles from sofa 1 and again from countertop 1
    assert counts == {"object": [0, 1, pytest.approx(1 / 2)], "goal": [1, 2, pytest.approx(2 / 3)]}
    assert env._won  # the replay followed the episode to its win


def test_scripted_agents_read_what_their_switches_say():
    env = grounding.quickstart_env()
    rng = random.Random(0)
    full = [grounding.scripted_episode(env, "valid_seen", i, read_object=True, read_goal=True, memory=2, rng=rng)
            for i in range(32)]  # fmt: skip
    blind = [grounding.scripted_episode(env, "valid_seen", i, read_object=False, read_goal=False, memory=2, rng=rng)
             for i in range(32)]  # fmt: skip
    assert sum(full) >= 30  # grounded in both words, 10 steps are enough for nearly every task
    assert sum(blind) < sum(full) - 10  # the skills alone win far fewer


def test_iteration_rows_count_mixed_groups_and_action_probabilities(tmp_path):
    env = grounding.quickstart_env()
    wrong = ["go to bed 1", "take egg 1 from bed 1"]  # valid_seen task 1: one object decision, wrong
    right = ["go to bed 1", "take cup 1 from bed 1"]  # the same decision, right

    def ep(iteration, group, actions, success, logprob):
        turns = [{"action": a, "behaviour_logprobs": [0.0, logprob]} for a in actions]
        return {"iteration": iteration, "task": {"split": "valid_seen", "task_id": 1, "group_id": group},
                "turns": turns, "success": success}  # fmt: skip

    # iteration 0: group 7 mixed (one won), group 8 all lost; iteration 1: group 7 again, all lost
    it0 = [ep(0, 7, right, True, -0.1), ep(0, 7, wrong, False, -0.2), ep(0, 8, wrong, False, -0.3)]
    it1 = [ep(1, 7, wrong, False, -0.4)]
    for n, eps in enumerate([it0, it1]):
        (tmp_path / f"iteration{n:04d}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
    files = sorted(tmp_path.glob("iteration*.jsonl"))
    (row,) = grounding.iteration_rows(env, files, bucket=2)
    assert row["iterations"] == "0-1"
    assert row["success"] == pytest.approx(1 / 4)
    assert row["object"] == (pytest.approx(1 / 4), pytest.approx(1 / 2), 4)  # 1 of 4 right, chance 1 of 2 each
    assert row["goal"][2] == 0
    # the probability of each object action taken: exp(-0.1 ... -0.4); median of four = mean of the middle two
    assert row["object_action_p"] == pytest.approx((math.exp(-0.2) + math.exp(-0.3)) / 2)
    # only iteration 0's group 7 had both outcomes: its 2 decisions; the same group id in iteration 1 is another group
    assert row["object_in_mixed_groups"] == 2


def test_pair_table_tells_reading_from_a_fixed_ranking():
    # (target, chosen, options); pair (cup, egg) only counted when those two are the options
    reads = [("cup", "cup", ("cup", "egg"))] * 3 + [("egg", "egg", ("cup", "egg"))] * 3
    ranks = [("cup", "cup", ("cup", "egg"))] * 4 + [("egg", "cup", ("cup", "egg"))] * 4
    other = [("cup", "egg", ("apple", "cup", "egg"))] * 5  # three options: not a pair
    t = grounding.pair_table(reads + other)
    assert t["pairs"] == [{"pair": ("cup", "egg"), "p_if_x": 1.0, "n_x": 3, "p_if_y": 0.0, "n_y": 3}]
    assert (t["dependence"], t["fixed"]) == (1.0, 0.0)
    t = grounding.pair_table(ranks)
    assert (t["dependence"], t["fixed"]) == (0.0, 1.0)  # always cup, whatever the task says
    # cup taken 2 of 3 with target cup, 1 of 3 with target egg: dependence 1/3, fixed |2/3 + 1/3 - 1| = 0
    mixed = [("cup", "cup", ("cup", "egg"))] * 2 + [("cup", "egg", ("cup", "egg"))]
    mixed += [("egg", "cup", ("cup", "egg"))] + [("egg", "egg", ("cup", "egg"))] * 2
    t = grounding.pair_table(mixed)
    assert t["dependence"] == pytest.approx(1 / 3) and t["fixed"] == pytest.approx(0.0)
    assert grounding.pair_table(reads[:5])["pairs"] == []  # only 2 decisions with target egg: under min_n


def test_decisions_name_the_wanted_chosen_and_options():
    env = grounding.quickstart_env()
    ep = {"task": {"split": "valid_seen", "task_id": 1},
          "turns": [{"action": a} for a in ["go to bed 1", "take egg 1 from bed 1"]], "success": False}  # fmt: skip
    ((kind, right, chance, _, choice),) = grounding.decisions(env, ep)
    assert (kind, right, chance, choice) == ("object", False, 0.5, ("cup", "egg", ("cup", "egg")))


def test_word_dependence_by_hand():
    two = ("apple", "mug")
    choices = [("apple", "apple", two)] * 3 + [("apple", "mug", two)] + [("mug", "apple", two)] * 3
    three = ("a", "b", "c")
    choices += [("a", "a", three)] * 3 + [("b", "b", three)] * 3
    # (two, apple): P(apple | apple) = 3/4, P(apple | mug) = 3/3 -> -1/4
    # (two, mug): P(mug | mug) = 0/3, P(mug | apple) = 1/4 -> -1/4
    # (three, a): 3/3 - 0/3 = 1; (three, b): 3/3 - 0/3 = 1; (three, c): never wanted, left out
    mean, cells = grounding.word_dependence(choices)
    assert cells == 4
    assert mean == pytest.approx((-0.25 - 0.25 + 1 + 1) / 4)
    assert grounding.word_dependence(choices, min_n=4) == (pytest.approx(float("nan"), nan_ok=True), 0)


def test_word_dependence_reads_the_scripted_switches():
    env = grounding.quickstart_env()
    rows = {(r["reads object"], r["reads goal"]): r for r in grounding.scripted_dependence(env, 120, memory=2)}
    reads, blind = rows[(True, True)], rows[(False, False)]
    for kind in ("object", "goal"):
        assert reads[kind][1] >= 5 and blind[kind][1] >= 5  # enough cells to read
        assert reads[kind][0] == pytest.approx(1.0)
        assert abs(blind[kind][0]) < 0.3
