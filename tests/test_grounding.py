"""benchmarks/grounding.py: the decision counts against a hand count on one episode, and the
scripted agents' switches."""

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
