"""Tests for rspo_lightning.envs.textworld_env (adapter to real TextWorld games).

Two tiny games are made with the real `tw-make` (offline, ~2-4 s each) once per session; the
tests play them through the adapter, the gymnasium registry and the RolloutEngine. Expected
walkthroughs come from the `.json` tw-make writes, not from the adapter.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "textworld", reason="TextWorld adapter tests need the textworld package: pip install 'rspo_lightning[textworld]'"
)

from rspo_lightning.envs import make_env, register_env  # noqa: E402
from rspo_lightning.envs.base import NOTHING_HAPPENS  # noqa: E402
from rspo_lightning.envs.textworld_env import TextWorld, clean_feedback, task_type_of  # noqa: E402

ENV_ID = "rspo/TextWorld-v0"
ENTRY_POINT = "rspo_lightning.envs.textworld_env:TextWorld"
INFO_KEYS = {"task", "task_type", "admissible_actions", "anchor", "privileged", "won", "score", "progress", "invalid"}
SEEDS = (1, 2)


def _tw_make() -> str:
    beside_python = Path(sys.executable).parent / "tw-make"
    found = str(beside_python) if beside_python.is_file() else shutil.which("tw-make")
    if found is None:
        pytest.skip("tw-make (installed with textworld) is not on PATH")
    return found


@pytest.fixture(scope="session")
def games(tmp_path_factory) -> list[str]:
    """Two tiny custom games (2 rooms, 2 objects, quest length 2), made in parallel."""
    out = tmp_path_factory.mktemp("textworld")
    paths = [str(out / f"game{seed}.z8") for seed in SEEDS]
    procs = [
        subprocess.Popen(
            [
                _tw_make(),
                "custom",
                "--world-size",
                "2",
                "--nb-objects",
                "2",
                "--quest-length",
                "2",
                "--seed",
                str(seed),
                "--output",
                path,
                "--silent",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for seed, path in zip(SEEDS, paths)
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output.decode()
    return paths


def walkthrough(game: str) -> list[str]:
    return json.loads(Path(game).with_suffix(".json").read_text())["metadata"]["walkthrough"]


@pytest.fixture()
def env(games):
    register_env(ENV_ID, ENTRY_POINT)  # what rspo_lightning.envs registers (idempotent)
    env = make_env(ENV_ID, games=games, max_steps=50)
    yield env
    env.close()


# -- pure helpers --------------------------------------------------------------------------------


def test_clean_feedback_drops_banner_status_line_and_end_prompt():
    raw = (
        "\n\n   ________  ________\n  |        \\|  $$$$$$\\\n   \\$$$$$$$$ \\$$    $$\n\n"
        "Welcome! Go east.\n\n\n\n-= Kitchen =-\nA kitchen.\n\n\n\n>            -= Kitchen =-0/1"
    )
    assert clean_feedback(raw) == "Welcome! Go east.\n\n-= Kitchen =-\nA kitchen."
    end = (
        "\nYou close the box.\n\n\n*** The End ***\n\nWould you like to RESTART, RESTORE a saved game, "
        "QUIT or UNDO the last command?\n>     -= Hall =-0/3"
    )
    assert clean_feedback(end) == "You close the box.\n\n*** The End ***"
    assert clean_feedback("\nThat's not a verb I recognise.\n\n>   -= Hall =-0/4") == "That's not a verb I recognise."


def test_task_type_is_the_challenge_name_from_the_uuid():
    assert task_type_of("tw-cooking-recipe1+take1+go1-E5eLHkaXFk6BSgR1") == "cooking"
    assert task_type_of("tw-coin_collector-8giOIM-house-mo-E5eLHkaXFk6BSgR1") == "coin_collector"
    assert task_type_of("tw-66InIpFQI6InF1IoF5-house-GP-ekDZtbGXIbO5FKp8") == "custom"
    assert task_type_of("") == "custom"


# -- playing real games --------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", [0, 1])
def test_walkthrough_wins_with_success_reward(env, games, task_id):
    obs, info = env.reset(options={"split": "train", "task_id": task_id})
    assert set(info) == INFO_KEYS and not info["invalid"] and not info["won"]
    assert info["task"] and info["task"] in obs and "$$" not in obs  # objective shown, banner gone
    assert info["task_type"] == "custom" and info["score"] == info["progress"] == 0.0
    assert info["privileged"].startswith("Task: ") and "at(P, " in info["privileged"]
    steps = walkthrough(games[task_id])
    assert env.unwrapped.expert_action() == steps[0]  # the engine's winning policy
    for i, command in enumerate(steps):
        assert command in info["admissible_actions"]
        obs, reward, terminated, truncated, info = env.step(command)
        last = i == len(steps) - 1
        assert (reward, terminated, info["won"]) == ((10.0, True, True) if last else (0.0, False, False))
        assert not truncated and not info["invalid"]
    assert info["score"] == info["progress"] == 1.0 and info["admissible_actions"] == []
    assert "Would you like to RESTART" not in obs
    # after the end every action is invalid and nothing changes
    obs, reward, terminated, truncated, after = env.step(steps[-1])
    assert (obs, reward, terminated, after["invalid"], after["won"]) == (NOTHING_HAPPENS, 0.0, True, True, True)


def test_invalid_actions_are_not_sent_and_leave_the_state_unchanged(env, games):
    obs0, info0 = env.reset(options={"task_id": 0})
    admissible = info0["admissible_actions"]
    bogus = ["xyzzy", "", None, 7, b"look", "take the moon", "go nowhere"]
    assert not set(a for a in bogus if isinstance(a, str)) & set(admissible)
    for action in bogus:
        obs, reward, terminated, truncated, info = env.step(action)
        assert (obs, reward, terminated, truncated) == (NOTHING_HAPPENS, 0.0, False, False)
        assert info["invalid"] and info["anchor"] == info0["anchor"]
        assert info["admissible_actions"] == admissible and info["privileged"] == info0["privileged"]
    # the engine never saw them: the walkthrough still wins in exactly its length
    steps = walkthrough(games[0])
    for command in steps:
        *_, terminated, _, info = env.step(command.upper().replace(" ", "  "))  # normalised
    assert terminated and info["won"]


def test_invalid_steps_count_towards_max_steps(games):
    env = TextWorld(games=games, max_steps=3)
    env.reset(options={"task_id": 1})
    outs = [env.step("xyzzy") for _ in range(3)]
    assert [o[3] for o in outs] == [False, False, True]  # truncated on the third step
    assert outs[-1][4]["admissible_actions"] == [] and env.expert_action() == "look"
    env.close()


def test_expert_recovers_after_random_actions(env):
    rng = random.Random(0)
    for task_id in (0, 1):
        obs, info = env.reset(options={"task_id": task_id})
        for _ in range(6):
            obs, _, terminated, _, info = env.step(rng.choice(info["admissible_actions"]))
            if terminated:
                break
        while not (info["won"] or info["invalid"]):
            obs, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
            assert not truncated
        assert info["won"]


def test_anchor_is_a_state_key(env, games):
    _, a = env.reset(options={"task_id": 0})
    _, b = env.reset(options={"task_id": 0})
    _, other_game = env.reset(options={"task_id": 1})
    assert a["anchor"] == b["anchor"] != other_game["anchor"]
    env.reset(options={"task_id": 0})
    _, _, _, _, moved = env.step(walkthrough(games[0])[0])
    assert moved["anchor"] != a["anchor"]
    _, _, _, _, looked = env.step("look")  # looking changes nothing in the world
    assert looked["anchor"] == moved["anchor"]


def test_splits_list_dict_and_bad_games(games, tmp_path):
    listed = TextWorld(games=games)
    assert listed.splits == ("train",) and listed.num_tasks("valid_seen") == 2  # any split name
    with pytest.raises(ValueError, match="task_id"):
        listed.reset(options={"task_id": 2})
    listed.close()
    split = TextWorld(games={"train": games[:1], "valid": games[1:]})
    assert split.splits == ("train", "valid") and split.num_tasks("valid") == 1
    assert split.game_path("valid", 0) == games[1]
    with pytest.raises(ValueError, match="split must be one of"):
        split.num_tasks("test")
    split.close()
    with pytest.raises(ValueError, match="tw-make"):
        TextWorld(games=[str(tmp_path / "missing.z8")])
    lonely = tmp_path / "lonely.z8"
    shutil.copy(games[0], lonely)
    with pytest.raises(ValueError, match=r"lonely\.json"):
        TextWorld(games=[str(lonely)])
    with pytest.raises(ValueError, match="max_steps"):
        TextWorld(games=games, max_steps=0)


def test_step_before_reset_and_loaded_game_cache(games):
    env = TextWorld(games=games, max_loaded_games=1)
    obs, reward, terminated, truncated, info = env.step("look")
    assert obs == NOTHING_HAPPENS and info["invalid"] and set(info) == INFO_KEYS
    for task_id in (0, 1, 0):
        obs, info = env.reset(options={"task_id": task_id})
        assert len(env._engines) == 1 and info["admissible_actions"]
    env.close()
    assert not env._engines


def test_sample_texts_and_vocabulary_cover_every_command(env):
    texts = env.unwrapped.sample_texts(num_tasks=2, seed=0)
    obs, info = env.reset(options={"task_id": 1})
    assert obs in texts and info["task"] in texts
    assert set(info["admissible_actions"]) <= set(texts)
    vocabulary = set(env.unwrapped.vocabulary())
    assert " ".join(sorted(vocabulary)) in texts
    rng = random.Random(1)
    for task_id in (0, 1):  # commands of states random play reaches are made of vocabulary words
        _, info = env.reset(options={"task_id": task_id})
        for _ in range(30):
            for command in info["admissible_actions"]:
                assert set(command.split()) <= vocabulary, command
            if not info["admissible_actions"]:
                break
            *_, info = env.step(rng.choice(info["admissible_actions"]))


def test_rollout_engine_plays_textworld_with_constrained_decoding(games, tmp_path):
    from rspo_lightning.language_model import TinyModelConfig, load_policy
    from rspo_lightning.prompts import template_texts
    from rspo_lightning.rollout import RolloutConfig, RolloutEngine
    from rspo_lightning.types import TaskSpec

    register_env(ENV_ID, ENTRY_POINT)
    kwargs = {"games": games, "max_steps": 5}
    env = make_env(ENV_ID, **kwargs)
    corpus = env.unwrapped.sample_texts(num_tasks=2) + template_texts()
    env.close()
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
    trajectories = engine.collect([TaskSpec(ENV_ID, "train", i, group_id=i) for i in range(2)], 2)
    assert len(trajectories) == 4 and engine.env_errors == 0
    for traj in trajectories:
        assert traj.env_error is None and traj.task_type == "custom"
        assert 1 <= len(traj.turns) <= 5 and (traj.success or traj.truncated)
        assert all(turn.valid for turn in traj.turns), [turn.action for turn in traj.turns]
        assert all(turn.anchor.startswith("tw:") for turn in traj.turns)
