"""Environments brought from elsewhere (docs/environments_byo.md): the 30-line text env on that page
(its code block is executed, so the page cannot rot), rspo/OpenEnv-v0 against a real OpenEnv server
this file starts on loopback (and the same env in-process), and rspo/TextArena-v0 on games that need
no download. Each route plays episodes by the contract and one RL iteration of the tiny model.

Expected values come from the games' rules (the number to guess is known from the seed), not from
the adapters.
"""

from __future__ import annotations

import json
import random
import re
import socket
import sys
import textwrap
import threading
import time
from pathlib import Path

import gymnasium
import pytest

from rspo_lightning.envs import make_env
from rspo_lightning.envs.base import NOTHING_HAPPENS

ROOT = Path(__file__).resolve().parent.parent
DOCS_PAGE = ROOT / "docs" / "environments_byo.md"
INFO_KEYS = {"task", "task_type", "admissible_actions", "anchor", "privileged", "won", "score", "progress", "invalid"}
#: free-form envs have no admissible actions to constrain decoding to
SMOKE_ARGS = ["--model.rollout.constrained_decoding", "false"]


def fit_one_iteration(tmp_path, env_id: str, kwargs: dict, *extra: str):
    """``fit --config configs/quickstart.yaml --config configs/smoke.yaml`` on ``env_id`` in this
    process: one RL iteration of the tiny model (validation included); returns the CLI."""
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule

    args = [
        "--config",
        str(ROOT / "configs" / "quickstart.yaml"),
        "--config",
        str(ROOT / "configs" / "smoke.yaml"),
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger",
        "false",
        "--trainer.enable_checkpointing",
        "false",
        "--data.env.env_id",
        env_id,
        "--data.env.kwargs",
        json.dumps(kwargs),
        *SMOKE_ARGS,
        *extra,
    ]
    cli = AgentCLI(
        AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False, save_config_callback=None
    )
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.model.iteration == 1 and cli.model.env_steps > 0
    assert "val/success_rate" in cli.trainer.callback_metrics
    return cli


# -- the docs page's env -----------------------------------------------------------------------------


def docs_code_block(heading: str) -> str:
    """The first ```python block after ``heading`` on the docs page."""
    text = DOCS_PAGE.read_text()
    start = text.index(heading)
    match = re.search(r"```python\n(.*?)```", text[start:], re.DOTALL)
    assert match, f"no python block after {heading!r} in {DOCS_PAGE}"
    return match.group(1)


@pytest.fixture(scope="module")
def guess_number():
    """Executes the page's code block (it registers my/GuessNumber-v0); unregisters it after."""
    namespace: dict = {"__name__": "byo_docs_env"}
    exec(compile(docs_code_block("## A gymnasium text env in 30 lines"), str(DOCS_PAGE), "exec"), namespace)
    assert "my/GuessNumber-v0" in gymnasium.registry
    yield namespace["GuessNumber"]
    del gymnasium.registry["my/GuessNumber-v0"]


def test_the_docs_page_env_keeps_the_contract(guess_number):
    env = make_env("my/GuessNumber-v0", max_steps=8)
    obs, info = env.reset(options={"split": "valid_seen", "task_id": 7})
    target = random.Random("valid_seen/7").randint(1, 9)  # the page's rule
    assert set(info) == INFO_KEYS and info["admissible_actions"] == [str(n) for n in range(1, 10)]
    assert not info["won"] and info["progress"] == 0.0
    for bad in ("ten", "", None, 3.0):  # any input is legal: nothing happens, the step counts
        step = env.step(bad)
        assert step[0] == NOTHING_HAPPENS and step[4]["invalid"] and step[4]["anchor"] == info["anchor"]
    low, high = 1, 9
    while True:  # bisection wins in at most 4 guesses, within the 4 steps left of max_steps 8
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(str(guess))
        if guess == target:
            break
        low, high = (guess + 1, high) if guess < target else (low, guess - 1)
        assert obs == ("Higher." if guess < target else "Lower.") and 0 < info["progress"] < 1
    assert (obs, reward, terminated, info["won"], info["progress"]) == ("Right!", 10.0, True, True, 1.0)
    assert env.step(str(target))[0] == NOTHING_HAPPENS  # after the end
    texts = env.unwrapped.sample_texts(num_tasks=3)  # the tiny tokenizer's corpus (random admissible play)
    assert "I think of a number from 1 to 9." in texts and "9" in texts


def test_the_docs_page_env_trains_one_iteration_named_module_colon_id(tmp_path, monkeypatch):
    """The page's route: the code in guess_env.py, named ``guess_env:my/GuessNumber-v0`` (importing
    the module registers the id), with no script of the user's own."""
    code = docs_code_block("## A gymnasium text env in 30 lines").replace("my/GuessNumber-v0", "my/GuessFile-v0")
    (tmp_path / "byo_guess_env.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        fit_one_iteration(tmp_path, "byo_guess_env:my/GuessFile-v0", {"max_steps": 3})
    finally:
        gymnasium.registry.pop("my/GuessFile-v0", None)
        sys.modules.pop("byo_guess_env", None)
    with pytest.raises(ValueError, match=r"module 'no_such_env_module' cannot be imported.*`module:EnvId`"):
        make_env("no_such_env_module:my/Guess-v0")


# -- OpenEnv ---------------------------------------------------------------------------------------

#: An OpenEnv environment, written to a module the tests import (``env_class`` takes "module:Class").
OPENENV_MODULE = '''
import random

from pydantic import Field

from openenv.core.env_server import Action, Environment, HTTPEnvServer, Observation, State


class GuessAction(Action):
    guess: str = Field(min_length=1, max_length=12)


class GuessObservation(Observation):
    message: str
    options: list[str]
    solved: bool = False
    closeness: float = 0.0


class GuessEnvironment(Environment):
    """Guess a number from 1 to 4 (drawn from the reset seed); 3 guesses; reward 1 for the right one."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, low: int = 1, high: int = 4):
        super().__init__()
        self.low, self.high, self._state, self.target = low, high, State(), low

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.target = random.Random(seed).randint(self.low, self.high)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message=f"Guess a number from {self.low} to {self.high}.", options=self._options())

    def step(self, action: GuessAction, timeout_s=None, **kwargs):
        self._state.step_count += 1
        guess = int(action.guess) if action.guess.isdigit() else None
        solved = guess == self.target
        if guess is None:
            message = f"{action.guess} is not a number."
        else:
            message = "Right!" if solved else ("Higher." if guess < self.target else "Lower.")
        closeness = 1.0 if solved else 0.0 if guess is None else 1 - abs(guess - self.target) / (self.high - self.low)
        done = solved or self._state.step_count >= 3
        return GuessObservation(
            message=message, options=self._options(), solved=solved, closeness=closeness, done=done,
            reward=1.0 if solved else 0.0,
        )

    def _options(self):
        return [str(n) for n in range(self.low, self.high + 1)]

    @property
    def state(self):
        return self._state


def serve(max_concurrent_envs):
    """A FastAPI app with OpenEnv's routes, and the HTTPEnvServer (its session count) behind it."""
    from fastapi import FastAPI

    server = HTTPEnvServer(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=max_concurrent_envs)
    app = FastAPI()
    server.register_routes(app)
    return app, server
'''
OPENENV_FIELDS = {"text_field": "message", "won_field": "solved", "progress_field": "closeness"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LoopbackServer:
    """uvicorn serving ``app`` on 127.0.0.1 in a daemon thread of this process."""

    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "the OpenEnv test server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


def import_openenv_without_gradio() -> None:
    """Import ``openenv.core.env_server`` with gradio kept out: openenv imports it for its optional
    web UI (gradio's import alone took 5-12 s of the 16 s here, on the 2 loaded cores), which the server
    these tests run does not use. A plain import where openenv ever needs it."""
    if "openenv.core" in sys.modules or "gradio" in sys.modules:
        return
    sys.modules["gradio"] = None  # import gradio -> ModuleNotFoundError, which openenv catches
    try:
        import openenv.core.env_server  # noqa: F401
    except ImportError:
        for name in [m for m in sys.modules if m == "openenv" or m.startswith("openenv.")]:
            del sys.modules[name]
    finally:
        del sys.modules["gradio"]


@pytest.fixture(scope="module")
def guess_module(tmp_path_factory):
    pytest.importorskip("openenv", reason="OpenEnv adapter tests need openenv-core: pip install -e '.[openenv]'")
    pytest.importorskip("uvicorn", reason="serving an OpenEnv env needs uvicorn (openenv-core brings it)")
    import_openenv_without_gradio()
    folder = tmp_path_factory.mktemp("openenv_module")
    (folder / "byo_guess_openenv.py").write_text(textwrap.dedent(OPENENV_MODULE))
    sys.path.insert(0, str(folder))
    import byo_guess_openenv

    yield byo_guess_openenv
    sys.path.remove(str(folder))
    sys.modules.pop("byo_guess_openenv", None)


@pytest.fixture(scope="module")
def guess_server(guess_module):
    """The guess env served by OpenEnv's server on a free loopback port (8 sessions)."""
    app, http_server = guess_module.serve(max_concurrent_envs=8)
    server = LoopbackServer(app)
    server.sessions = http_server
    yield server
    server.stop()


def play(env, actions):
    """(observation, reward, terminated, truncated, info) of each step, after a reset to task 5 of valid_seen."""
    out = [env.reset(options={"split": "valid_seen", "task_id": 5})]
    return out + [env.step(action) for action in actions]


@pytest.mark.parametrize("mode", ["served", "in_process"])
def test_openenv_plays_by_the_contract(guess_server, mode):
    where = {"base_url": guess_server.url} if mode == "served" else {"env_class": "byo_guess_openenv:GuessEnvironment"}
    env = make_env("rspo/OpenEnv-v0", actions_field="options", tasks_per_split=100, **where, **OPENENV_FIELDS)
    assert env.unwrapped.action_field == "guess"  # the Action's only field
    target = random.Random(1 * 100 + 5).randint(1, 4)  # valid_seen is split 1: seed 105
    wrong = next(str(n) for n in (1, 2, 3, 4) if n != target)
    steps = play(env, ["7", None, wrong, str(target), str(target)])
    obs, info = steps[0]
    assert obs == info["task"] == "Guess a number from 1 to 4." and set(info) == INFO_KEYS
    assert info["admissible_actions"] == ["1", "2", "3", "4"] and info["task_type"] == "openenv"
    for unlisted in steps[1:3]:  # never sent: nothing happens, state unchanged
        assert unlisted[:4] == (NOTHING_HAPPENS, 0.0, False, False) and unlisted[4]["invalid"]
        assert unlisted[4]["anchor"] == info["anchor"]
    obs, reward, terminated, truncated, miss = steps[3]
    assert obs == ("Higher." if int(wrong) < target else "Lower.") and (reward, terminated) == (0.0, False)
    assert miss["progress"] == pytest.approx(1 - abs(int(wrong) - target) / 3) and miss["anchor"] != info["anchor"]
    obs, reward, terminated, truncated, won = steps[4]
    assert (obs, reward, terminated, truncated) == ("Right!", 1.0, True, False)
    assert (won["won"], won["progress"], won["score"]) == (True, 1.0, 1.0)
    assert won["admissible_actions"] == [] and steps[5][0] == NOTHING_HAPPENS and steps[5][2]  # after the end
    env.close()
    if mode == "served":
        assert guess_server.sessions.active_sessions == 0  # close() ended the session


def test_openenv_served_and_in_process_give_the_same_episodes(guess_server):
    """Free-form actions (no actions_field), a reward-based win, an action the Action model rejects."""
    sessions = guess_server.sessions.active_sessions
    served = make_env("rspo/OpenEnv-v0", base_url=guess_server.url, text_field="message")
    local = make_env("rspo/OpenEnv-v0", env_class="byo_guess_openenv:GuessEnvironment", text_field="message")
    target = str(random.Random(10_000 + 5).randint(1, 4))
    actions = ["a guess that is far too long", "", "four", "9", target]
    a, b = play(served, actions), play(local, actions)
    assert a == b
    assert a[0][1]["admissible_actions"] is None  # free-form
    assert a[1][0] == NOTHING_HAPPENS and a[1][4]["invalid"]  # rejected by the Action model (max_length 12)
    assert a[2][0] == NOTHING_HAPPENS and a[2][4]["invalid"]  # empty: never sent
    assert a[3][0] == "four is not a number." and not a[3][4]["invalid"]  # free-form: the env parses it
    assert a[5][:3] == ("Right!", 1.0, True) and a[5][4]["won"]  # won = ended with reward > 0
    # a second episode on the same session: the env resets, the session stays
    assert served.reset(options={"task_id": 0})[0] == "Guess a number from 1 to 4."
    assert guess_server.sessions.active_sessions == sessions + 1
    served.close()
    local.close()


def test_openenv_errors_name_the_value_and_the_fix(guess_server, guess_module, monkeypatch):
    with pytest.raises(ConnectionError, match=r"no OpenEnv server answers at 'http://127\.0\.0\.1:\d+'.*create_app"):
        make_env("rspo/OpenEnv-v0", base_url=f"http://127.0.0.1:{free_port()}", timeout_s=5)
    with pytest.raises(ValueError, match=r"text_field 'prompt' is not a field of .*'closeness', 'message'"):
        make_env("rspo/OpenEnv-v0", base_url=guess_server.url, text_field="prompt")
    with pytest.raises(ValueError, match=r"action_field 'code' is not a field of the env's Action; it has \['guess'\]"):
        make_env("rspo/OpenEnv-v0", base_url=guess_server.url, text_field="message", action_field="code")
    with pytest.raises(ValueError, match="exactly one of base_url"):
        make_env("rspo/OpenEnv-v0")
    with pytest.raises(ValueError, match=r"env_class 'byo_guess_openenv:Nope' cannot be loaded"):
        make_env("rspo/OpenEnv-v0", env_class="byo_guess_openenv:Nope")
    local = make_env("rspo/OpenEnv-v0", env_class="byo_guess_openenv:GuessEnvironment", won_field="won")
    with pytest.raises(ValueError, match=r"won_field 'won' is not a field of the env's observation; it has \["):
        local.reset()
    auto = make_env("rspo/OpenEnv-v0", env_class="byo_guess_openenv:GuessEnvironment")
    assert auto.reset()[0] == "Guess a number from 1 to 4."  # the only string field, found without text_field

    app, _ = guess_module.serve(max_concurrent_envs=1)
    single = LoopbackServer(app)
    try:
        first = make_env("rspo/OpenEnv-v0", base_url=single.url, text_field="message")
        second = make_env("rspo/OpenEnv-v0", base_url=single.url, text_field="message")
        first.reset()
        with pytest.raises(RuntimeError, match=r"maximum of 1 sessions.*max_concurrent_envs"):
            second.reset()
        first.close()
        second.close()
    finally:
        single.stop()

    monkeypatch.setitem(sys.modules, "websockets.sync.client", None)  # as if websockets were not installed
    with pytest.raises(ImportError, match=r"pip install 'rspo_lightning\[openenv\]'"):
        make_env("rspo/OpenEnv-v0", base_url=guess_server.url, text_field="message").reset()


def test_openenv_trains_one_iteration_against_a_server(guess_server, tmp_path):
    fit_one_iteration(tmp_path, "rspo/OpenEnv-v0", {"base_url": guess_server.url, **OPENENV_FIELDS})


# -- TextArena -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def textarena():
    return pytest.importorskip(
        "textarena", reason="TextArena adapter tests need textarena: pip install -e '.[textarena]'"
    )


def guess_target(split_index: int, task_id: int, tasks_per_split: int = 10_000) -> int:
    """GuessTheNumber-v0's number for a task: TextArena seeds Python's random, then draws randint(1, 20)."""
    rng = random.Random(split_index * tasks_per_split + task_id)
    return rng.randint(1, 20)


def test_textarena_guess_the_number_by_the_contract(textarena):
    env = make_env("rspo/TextArena-v0", env_id="GuessTheNumber-v0")
    state = random.getstate()
    obs, info = env.reset(options={"split": "valid_unseen", "task_id": 3})
    assert set(info) == INFO_KEYS and info["task_type"] == "GuessTheNumber-v0" and info["admissible_actions"] is None
    assert "Guess The Number" in info["task"] and "[5]" in info["task"] and obs == ""
    target = guess_target(2, 3)
    assert env.step("")[:4] == (NOTHING_HAPPENS, 0.0, False, False)  # never sent
    obs, reward, terminated, truncated, rejected = env.step("seven")  # sent as [seven]: the game rejects it
    assert rejected["invalid"] and "invalid move" in obs and not terminated
    low, high, seen = 1, 20, []
    while True:
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(str(guess))  # sent as [guess]
        seen.append(info["anchor"])
        if guess == target:
            break
        assert obs == f"The target number is {'higher' if guess < target else 'lower'}." and not info["invalid"]
        assert reward == 0.0 and not terminated and 0.0 <= info["progress"] <= 1.0
        low, high = (guess + 1, high) if guess < target else (low, guess - 1)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert (info["won"], info["score"], info["progress"]) == (True, 1.0, 1.0)
    assert "Congratulations" in obs and len(set(seen)) == len(seen)
    assert env.step("5")[0] == NOTHING_HAPPENS
    assert random.getstate() == state  # the game ran on the env's own random state
    # the same task again: the same number (binary search takes the same path)
    env.reset(options={"split": "valid_unseen", "task_id": 3})
    assert env.step(str(target))[1] == 1.0


def test_textarena_tower_of_hanoi_progress_and_game_reward(textarena):
    env = make_env("rspo/TextArena-v0", env_id="TowerOfHanoi-v0", outcome_reward="game", success_reward=5.0)
    obs, info = env.reset(options={"task_id": 0})
    assert "A: [3, 2, 1]" in obs and "Tower of Hanoi" in info["task"]
    moves = ["a c", "a b", "c b", "a c", "b a", "b c", "a c"]  # the 7-move solution, lowercase as the rollout sends
    progress = [info["progress"]]
    for i, move in enumerate(moves):
        obs, reward, terminated, truncated, info = env.step(move)
        progress.append(info["progress"])
        assert not info["invalid"] and terminated == (i == len(moves) - 1)
    assert "C: [3, 2, 1]" in obs and info["won"] and reward == 1.0  # outcome_reward="game": the game's own 1
    assert progress[-1] == 1.0 and progress[0] == 0.0 and max(progress[:-1]) < 1.0


def test_textarena_errors_name_the_value_and_the_fix(textarena, monkeypatch):
    with pytest.raises(
        ValueError, match=r"unknown TextArena game 'GuessTheNumbr-v0' \(did you mean 'GuessTheNumber-v0'"
    ):
        make_env("rspo/TextArena-v0", env_id="GuessTheNumbr-v0")
    with pytest.raises(ValueError, match=r"'TicTacToe-v0' cannot be played by one player"):
        make_env("rspo/TextArena-v0", env_id="TicTacToe-v0")
    with pytest.raises(TypeError, match=r"did you mean 'env_id'"):
        make_env("rspo/TextArena-v0", env_ud="GuessTheNumber-v0")
    monkeypatch.setitem(sys.modules, "textarena", None)  # as if textarena were not installed
    with pytest.raises(ImportError, match=r"pip install 'rspo_lightning\[textarena\]'"):
        make_env("rspo/TextArena-v0", env_id="GuessTheNumber-v0")


def test_textarena_trains_one_iteration(textarena, tmp_path):
    fit_one_iteration(tmp_path, "rspo/TextArena-v0", {"env_id": "GuessTheNumber-v0"})
