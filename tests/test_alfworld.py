"""Tests for rspo_lightning.envs.alfworld_env (adapter to the real `alfworld` package).

Game data is a user download, so the tests bring their own: three hand-written ALFWorld games in
tests/fixtures/alfworld/json_2.1.1/<split>/<task>/<trial>/ (an ALFRED-style `initial_state.pddl`
written against alfworld's shipped domain, plus a `traj_data.json`), one per split and a
different task type each. A session fixture turns them into `game.tw-pddl` files with the
package's own `alfworld-generate` script (its domain and grammar files), and the tests play them
through the real engine and the package's handcoded expert. The games' contents are written out
in the fixture files, so expected texts below are read off them by hand.

Game-discovery, split and zero-games tests run without alfworld installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rspo_lightning.envs import make_env, register_env
from rspo_lightning.envs.alfworld_env import (
    TASK_TYPES,
    ALFWorld,
    AlfworldGame,
    canonical_task_types,
    find_games,
    resolve_data_dir,
)
from rspo_lightning.envs.base import NOTHING_HAPPENS

ENV_ID = "rspo/ALFWorld-v0"
ENTRY_POINT = "rspo_lightning.envs.alfworld_env:ALFWorld"
FIXTURES = Path(__file__).parent / "fixtures" / "alfworld" / "json_2.1.1"
INFO_KEYS = {"task", "task_type", "admissible_actions", "anchor", "privileged", "won", "score", "progress", "invalid"}
# Not pytest.importorskip: importing alfworld with ALFWORLD_DATA unset creates ~/.cache/alfworld.
HAVE_ALFWORLD = importlib.util.find_spec("alfworld") is not None
needs_alfworld = pytest.mark.skipif(
    not HAVE_ALFWORLD, reason="ALFWorld adapter tests need the alfworld package: pip install 'rspo_lightning[alfworld]'"
)

# The three fixture games: (split, task type, instruction text, the receptacles in the room).
CLEAN = ("valid_seen", "pick_clean_then_place_in_recep")
LOOK = ("valid_unseen", "look_at_obj_in_light")
TWO = ("train", "pick_two_obj_and_place")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """The fixture games made playable by the package's own `alfworld-generate`."""
    if not HAVE_ALFWORLD:
        pytest.skip("needs the alfworld package: pip install 'rspo_lightning[alfworld]'")
    root = tmp_path_factory.mktemp("alfworld_data")
    package = Path(importlib.util.find_spec("alfworld").submodule_search_locations[0])
    script = Path(sys.executable).parent / "alfworld-generate"
    script = str(script) if script.is_file() else shutil.which("alfworld-generate")
    assert script, "alfworld-generate (installed with alfworld) is not on PATH"
    # --end: the script's default -1 slices off the last game; the planner expert is deterministic.
    cmd = [
        sys.executable,
        script,
        "--data_path",
        str(FIXTURES),
        "--save_path",
        str(root / "json_2.1.1"),
        "--domain",
        str(package / "data" / "alfred.pddl"),
        "--grammar",
        str(package / "data" / "alfred.twl2"),
        "--expert_type",
        "planner",
        "--end",
        "1000000",
    ]
    done = subprocess.run(
        cmd, env={**os.environ, "ALFWORLD_DATA": str(root)}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(list(root.glob("json_2.1.1/*/*/*/game.tw-pddl"))) == 3, done.stdout + done.stderr
    return root


@pytest.fixture()
def env(data_dir):
    register_env(ENV_ID, ENTRY_POINT)  # what rspo_lightning.envs registers (idempotent)
    env = make_env(ENV_ID, data_dir=str(data_dir), split="valid_seen")
    yield env
    env.close()


def play_expert(env, split, seed=0):
    """Reset task 0 of `split` and follow expert_action() to the end; returns (actions, last info, rewards)."""
    random.seed(seed)  # the handcoded expert breaks ties with the global `random`
    obs, info = env.reset(options={"split": split, "task_id": 0})
    actions, rewards = [], []
    while True:
        action = env.unwrapped.expert_action()
        obs, reward, terminated, truncated, info = env.step(action)
        actions.append(action)
        rewards.append(reward)
        if terminated or truncated:
            return actions, info, rewards


# -- game discovery, splits, task types, the zero-games guard (no alfworld needed) ---------------


def _fake_game(root: Path, rel: str, task_type: str, solvable=True, game_file=True) -> str:
    folder = root / "json_2.1.1" / rel
    folder.mkdir(parents=True)
    (folder / "traj_data.json").write_text(json.dumps({"task_type": task_type}))
    if game_file:
        (folder / "game.tw-pddl").write_text(json.dumps({"solvable": solvable, "pddl_problem": "", "grammar": ""}))
    return str(folder / "game.tw-pddl")


@pytest.fixture()
def fake_layout(tmp_path) -> tuple[Path, dict[str, str]]:
    """An ALFWorld data folder of stub files: which games count is decided by file names and flags."""
    games = {
        "b": _fake_game(tmp_path, "train/pick_two_obj_and_place-Pen-None-Desk-1/trial_b", "pick_two_obj_and_place"),
        "a": _fake_game(tmp_path, "train/pick_and_place_simple-Pen-None-Desk-1/trial_a", "pick_and_place_simple"),
        "unsolvable": _fake_game(
            tmp_path, "train/pick_and_place_simple-Cup-None-Desk-1/trial_u", "pick_and_place_simple", solvable=False
        ),
        "no_game": _fake_game(
            tmp_path, "train/pick_and_place_simple-Cd-None-Desk-1/trial_n", "pick_and_place_simple", game_file=False
        ),
        "movable": _fake_game(
            tmp_path,
            "train/pick_and_place_with_movable_recep-Pen-Bowl-Desk-1/trial_m",
            "pick_and_place_with_movable_recep",
        ),
        "sliced": _fake_game(
            tmp_path, "train/pick_and_place_simple-AppleSliced-None-Desk-1/trial_s", "pick_and_place_simple"
        ),
        "seen": _fake_game(
            tmp_path, "valid_seen/look_at_obj_in_light-Pen-None-DeskLamp-1/trial_v", "look_at_obj_in_light"
        ),
    }
    return tmp_path, games


def test_find_games_applies_alfredtwenv_rules_and_sorts(fake_layout):
    root, games = fake_layout
    found = find_games(str(root / "json_2.1.1" / "train"), TASK_TYPES)
    # sorted by path: pick_and_place_simple-Pen < pick_two_obj_and_place-Pen
    assert found == (
        AlfworldGame(games["a"], "pick_and_place_simple"),
        AlfworldGame(games["b"], "pick_two_obj_and_place"),
    )
    assert find_games(str(root / "json_2.1.1" / "train"), ("pick_two_obj_and_place",)) == found[1:]
    assert find_games(str(root / "json_2.1.1" / "nowhere"), TASK_TYPES) == ()


def test_task_type_names_and_kwarg_validation(fake_layout):
    root, _ = fake_layout
    assert canonical_task_types(None) == TASK_TYPES
    assert canonical_task_types(["pick_cool_then_place", "look_at_obj_in_light"]) == (
        "look_at_obj_in_light",
        "pick_cool_then_place_in_recep",
    )  # Household names accepted
    with pytest.raises(ValueError, match="unknown task types"):
        canonical_task_types(["pick_and_juggle"])
    with pytest.raises(ValueError, match="non-empty list"):
        canonical_task_types("pick_and_place_simple")
    # all checked before alfworld is imported
    with pytest.raises(ValueError, match="split must be one of"):
        ALFWorld(data_dir=str(root), split="test")
    with pytest.raises(ValueError, match="expert must be one of"):
        ALFWorld(data_dir=str(root), expert="oracle")
    with pytest.raises(ValueError, match="max_steps"):
        ALFWorld(data_dir=str(root), max_steps=0)


def test_zero_games_raise_a_clear_error_naming_alfworld_data(tmp_path, monkeypatch):
    # AlfredTWEnv's gym reset() would spin forever at 100 % CPU on an empty game list.
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"no ALFWorld games for split 'train'.*ALFWORLD_DATA.*alfworld-download"):
        ALFWorld(data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="does not exist.*alfworld-download"):
        ALFWorld(data_dir=str(tmp_path / "missing"))
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "missing_too"))
    with pytest.raises(ValueError, match="from ALFWORLD_DATA"):
        resolve_data_dir(None)
    assert not (tmp_path / "missing").exists() and not (tmp_path / "missing_too").exists()


@needs_alfworld
def test_splits_and_task_type_filter_on_a_fake_layout(fake_layout):
    root, games = fake_layout
    env = ALFWorld(data_dir=str(root), split="valid_seen", expert=None)
    assert env.splits == ("train", "valid_seen", "valid_unseen")
    assert env.num_tasks("train") == 2 and env.num_tasks("valid_seen") == 1
    assert [g.task_type for g in env.games("train")] == ["pick_and_place_simple", "pick_two_obj_and_place"]
    assert env.games("valid_seen")[0].path == games["seen"]
    only_pick = ALFWorld(data_dir=str(root), task_types=["pick_and_place"], expert=None)  # Household's name
    assert only_pick.task_types == ("pick_and_place_simple",) and only_pick.num_tasks("train") == 1
    # a split without games says where they should be, instead of spinning
    with pytest.raises(ValueError, match=r"split 'valid_unseen'.*json_2\.1\.1/valid_unseen.*ALFWORLD_DATA"):
        env.reset(options={"split": "valid_unseen", "task_id": 0})
    with pytest.raises(RuntimeError, match="expert=None"):
        env.expert_action()


# -- the real package: engine, expert, contract ------------------------------------------------


@needs_alfworld
def test_game_list_matches_alfredtwenv(data_dir, fake_layout):
    from rspo_lightning.envs.alfworld_env import _import_alfworld

    _import_alfworld(data_dir)  # sets ALFWORLD_DATA before alfworld is imported
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    for root in (data_dir, fake_layout[0]):
        config = {
            "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6]},
            "dataset": {
                "data_path": f"{root}/json_2.1.1/train",
                "eval_id_data_path": f"{root}/json_2.1.1/valid_seen",
                "eval_ood_data_path": f"{root}/json_2.1.1/valid_unseen",
                "num_train_games": -1,
                "num_eval_games": -1,
            },
        }
        for split, train_eval in (
            ("train", "train"),
            ("valid_seen", "eval_in_distribution"),
            ("valid_unseen", "eval_out_of_distribution"),
        ):
            theirs = sorted(AlfredTWEnv(config, train_eval=train_eval).game_files)
            ours = [g.path for g in find_games(f"{root}/json_2.1.1/{split}", TASK_TYPES)]
            assert ours == theirs, (root, split)


@needs_alfworld
def test_reset_shows_the_alfworld_intro_and_sets_alfworld_data(env, data_dir):
    assert os.environ["ALFWORLD_DATA"] == str(data_dir)
    obs, info = env.reset()  # the default split is the split kwarg: valid_seen
    assert set(info) == INFO_KEYS
    assert obs == (
        "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around "
        "you, you see a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, a microwave 1, and a sinkbasin 1."
        f"\n\nYour task is to: {info['task']}"
    )
    assert info["task"] in ("put a clean apple in fridge.", "clean some apple and put it in fridge.")
    assert info["task_type"] == "pick_clean_then_place_in_recep" and not info["won"] and not info["invalid"]
    assert info["admissible_actions"] == [
        "go to cabinet 1",
        "go to cabinet 2",
        "go to countertop 1",
        "go to fridge 1",
        "go to microwave 1",
        "go to sinkbasin 1",
        "inventory",
        "look",
    ]  # no "help"
    assert info["privileged"].splitlines()[1:] == [
        "You are at the middle of the room.",
        "You are holding nothing.",
        "cabinet 1 (closed): nothing",
        "cabinet 2 (closed): mug 1",
        "countertop 1: apple 1",
        "fridge 1 (closed): tomato 1",
        "microwave 1 (closed): nothing",
        "sinkbasin 1: nothing",
    ]


@needs_alfworld
@pytest.mark.parametrize("split, task_type, steps", [(*CLEAN, 15), (*LOOK, 12)])
def test_handcoded_expert_wins_through_the_real_engine(env, split, task_type, steps):
    start = time.perf_counter()
    actions, info, rewards = play_expert(env, split)
    per_step_ms = 1000 * (time.perf_counter() - start) / len(actions)
    assert info["won"] and info["task_type"] == task_type and info["score"] == info["progress"] == 1.0
    assert actions[0] == "look"  # AlfredExpert's plan before the first command
    assert len(actions) == steps and rewards == [0.0] * (steps - 1) + [10.0]
    assert per_step_ms < 1000, per_step_ms  # ~25 ms/step on the 2-core dev CPU (reset included)


@needs_alfworld
def test_clean_game_walkthrough_and_messages(env):
    env.reset(options={"split": "valid_seen", "task_id": 0})
    expected = [
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a apple 1."),
        ("take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."),
        ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing."),
        ("clean apple 1 with sinkbasin 1", "You clean the apple 1 using the sinkbasin 1."),
        ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
        ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see a tomato 1."),
        ("move apple 1 to fridge 1", "You move the apple 1 to the fridge 1."),
    ]
    for i, (command, text) in enumerate(expected):
        obs, reward, terminated, truncated, info = env.step(command)
        assert obs == text and terminated == (i == len(expected) - 1) and not truncated
    assert reward == 10.0 and info["won"] and info["admissible_actions"] == []
    assert "fridge 1 (open): apple 1 (clean), tomato 1" in info["privileged"]


@needs_alfworld
def test_planner_expert_wins_pick_two(data_dir):
    env = ALFWorld(data_dir=str(data_dir), split="train", expert="planner")
    actions, info, rewards = play_expert(env, "train")
    assert info["won"] and info["task_type"] == "pick_two_obj_and_place" and rewards[-1] == 10.0
    # both keychains: one on the coffeetable, one in the closed drawer (fixture file)
    assert sum(a.startswith("take keychain") for a in actions) == 2 and "open drawer 1" in actions
    assert len(actions) == 9
    env.close()


@needs_alfworld
def test_handcoded_failure_falls_back_to_the_planner(env):
    env.reset(options={"split": "valid_unseen", "task_id": 0})
    env.step("go to drawer 2")

    def broken(*args, **kwargs):
        raise RuntimeError("expert lost")

    env.unwrapped._handcoded.act = broken
    *_, info = env.step("open drawer 2")
    assert env.unwrapped.expert_action() == "take cd 1 from drawer 2"  # now the planner's plan
    while not info["won"]:
        *_, info = env.step(env.unwrapped.expert_action())
    assert info["won"]


@needs_alfworld
def test_invalid_actions_leave_the_state_unchanged(env):
    obs0, info0 = env.reset(options={"split": "valid_seen", "task_id": 0})
    for action in ["help", "take apple 1 from countertop 1", "go to the moon", "", None, 3, b"look"]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert (obs, reward, terminated, truncated) == (NOTHING_HAPPENS, 0.0, False, False)
        assert info["invalid"] and info["anchor"] == info0["anchor"]
        assert info["admissible_actions"] == info0["admissible_actions"] and info["privileged"] == info0["privileged"]
    *_, info = env.step("  GO TO   Countertop 1 ")  # normalised, then sent as the engine spells it
    assert not info["invalid"] and "take apple 1 from countertop 1" in info["admissible_actions"]


@needs_alfworld
def test_max_steps_counts_invalid_steps_and_ends_the_episode(data_dir):
    env = ALFWorld(data_dir=str(data_dir), split="valid_unseen", max_steps=3)
    env.reset(options={"task_id": 0})
    outs = [env.step("go to bed 1"), env.step("xyzzy"), env.step("look")]
    assert [o[3] for o in outs] == [False, False, True] and outs[-1][4]["admissible_actions"] == []
    assert env.step("look")[4]["invalid"] and env.expert_action() == "look"
    env.close()


@needs_alfworld
def test_anchor_ignores_looking_and_tracks_the_world(env):
    _, a = env.reset(options={"split": "valid_seen", "task_id": 0})
    _, b = env.reset(options={"split": "valid_seen", "task_id": 0})
    assert a["anchor"] == b["anchor"] and a["anchor"].startswith("alfworld:")
    *_, moved = env.step("go to countertop 1")
    *_, looked = env.step("look")
    *_, examined = env.step("examine countertop 1")
    assert moved["anchor"] != a["anchor"] and looked["anchor"] == examined["anchor"] == moved["anchor"]
    *_, took = env.step("take apple 1 from countertop 1")
    assert took["anchor"] != moved["anchor"] and "You are holding apple 1." in took["privileged"]
    _, other = env.reset(options={"split": "valid_unseen", "task_id": 0})
    assert other["anchor"] != a["anchor"]


@needs_alfworld
def test_vocabulary_covers_every_command_random_play_reaches(env):
    vocabulary = set(env.unwrapped.vocabulary())
    assert {"move", "apple", "sinkbasin", "desklamp", "keychain", "1", "2"} <= vocabulary and "help" not in vocabulary
    rng = random.Random(0)
    for split in ("train", "valid_seen", "valid_unseen"):
        _, info = env.reset(options={"split": split, "task_id": 0})
        for _ in range(25):
            for command in info["admissible_actions"]:
                assert set(command.split()) <= vocabulary, command
            if not info["admissible_actions"]:
                break
            *_, info = env.step(rng.choice(info["admissible_actions"]))
    assert " ".join(sorted(vocabulary)) in env.unwrapped.sample_texts(num_tasks=1)


@needs_alfworld
def test_step_before_reset_is_invalid(data_dir):
    env = ALFWorld(data_dir=str(data_dir), split="train")
    obs, reward, terminated, truncated, info = env.step("look")
    assert obs == NOTHING_HAPPENS and info["invalid"] and set(info) == INFO_KEYS
    env.close()


@needs_alfworld
def test_rollout_engine_plays_alfworld_with_constrained_decoding(data_dir, tmp_path):
    from rspo_lightning.language_model import TinyModelConfig, load_policy
    from rspo_lightning.prompts import template_texts
    from rspo_lightning.rollout import RolloutConfig, RolloutEngine
    from rspo_lightning.types import TaskSpec

    register_env(ENV_ID, ENTRY_POINT)
    kwargs = {"data_dir": str(data_dir), "split": "valid_seen", "max_steps": 4}
    env = make_env(ENV_ID, **kwargs)
    corpus = env.unwrapped.sample_texts(num_tasks=1) + template_texts()
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
    tasks = [TaskSpec(ENV_ID, split, 0, group_id=i) for i, split in enumerate(["valid_seen", "valid_unseen"])]
    trajectories = engine.collect(tasks, 2)
    assert len(trajectories) == 4 and engine.env_errors == 0
    for traj, task_type in zip(trajectories, [CLEAN[1]] * 2 + [LOOK[1]] * 2):
        assert traj.env_error is None and traj.task_type == task_type
        assert 1 <= len(traj.turns) <= 4 and (traj.success or traj.truncated)
        assert all(turn.valid for turn in traj.turns), [turn.action for turn in traj.turns]


def test_the_alfworld_config_runs_one_iteration_under_the_smoke_overlay(data_dir, tmp_path, monkeypatch):
    """``fit --config configs/alfworld/grpo.yaml --config configs/smoke.yaml`` on the fixture games:
    the real engine, the config's own settings (no expert: the tiny tokenizer's corpus is played
    with random admissible actions), one iteration of the tiny model."""
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("ALFWORLD_DATA", str(data_dir))
    args = [
        "--config",
        str(root / "configs" / "alfworld" / "grpo.yaml"),
        "--config",
        str(root / "configs" / "smoke.yaml"),
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
    ]
    cli = AgentCLI(
        AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False, save_config_callback=None
    )
    assert cli.datamodule.env.env_id == "rspo/ALFWorld-v0" and cli.datamodule.env.kwargs["expert"] is None
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.model.iteration == 1 and cli.model.env_steps > 0
