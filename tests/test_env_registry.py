"""Registration, metadata and keyword checking shared by every `rspo/` env (envs/base.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

import gymnasium
import pytest

import rspo_lightning.envs  # noqa: F401  (registers rspo/ ids)
from rspo_lightning.envs import Household, Shop, make_env, register_envs
from rspo_lightning.envs.textworld_env import TextWorld

# -- registration ------------------------------------------------------------------------------


def test_module_prefixed_id_makes_an_env_without_importing_rspo_first():
    # gymnasium >= 1.0 has no plugin loader; "module:id" is its way to import the registering
    # module on demand.
    code = (
        "import sys, gymnasium\n"
        "assert not [m for m in sys.modules if m.startswith('rspo_lightning')]\n"
        "env = gymnasium.make('rspo_lightning.envs:rspo/Household-v0')\n"
        "print(type(env.unwrapped).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Household"


def test_register_envs_is_idempotent():
    expected = {
        "rspo/Household-v0": "rspo_lightning.envs.household:Household",
        "rspo/Shop-v0": "rspo_lightning.envs.shop:Shop",
        "rspo/TextWorld-v0": "rspo_lightning.envs.textworld_env:TextWorld",
        "rspo/ALFWorld-v0": "rspo_lightning.envs.alfworld_env:ALFWorld",
        "rspo/WebShop-v0": "rspo_lightning.envs.webshop_env:WebShop",
        "rspo/Faulty-v0": "rspo_lightning.envs.faults:FaultyEnv",
    }
    before = {env_id: gymnasium.registry[env_id] for env_id in expected}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        register_envs()
        register_envs()
    assert [str(w.message) for w in caught] == []  # no "Overriding environment ..."
    for env_id, entry_point in expected.items():
        assert gymnasium.registry[env_id] is before[env_id]
        assert gymnasium.registry[env_id].entry_point == entry_point


# -- metadata: no gymnasium warnings -----------------------------------------------------------


@pytest.mark.parametrize("env_id", ["rspo/Household-v0", "rspo/Shop-v0"])
@pytest.mark.parametrize("render_mode", [None, "ansi"])
def test_make_reset_step_render_warn_nothing(env_id, render_mode):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = gymnasium.make(env_id, render_mode=render_mode)
        env.reset(seed=0)
        env.step("look")
        rendered = env.render()  # the passive checker looks at metadata on the first render
    assert [str(w.message) for w in caught] == []
    assert (rendered is None) == (render_mode is None)


# -- unknown keyword arguments -----------------------------------------------------------------


def _accepted(message: str) -> list[str]:
    listed = re.search(r"it accepts \[([^\]]*)\]", message)
    assert listed, message
    return re.findall(r"'([^']+)'", listed.group(1))


def test_gymnasium_make_names_the_bad_key_the_nearest_and_the_accepted():
    with pytest.raises(TypeError) as err:
        gymnasium.make("rspo/Household-v0", num_recepticles=3)
    message = str(err.value)
    assert "unknown keyword argument 'num_recepticles' (did you mean 'num_receptacles'?)" in message
    accepted = _accepted(message)
    assert {"num_receptacles", "num_distractors", "task_types", "seed", "render_mode"} <= set(accepted)
    assert "num_recepticles" not in accepted and "self" not in accepted


def test_make_env_and_the_class_itself_check_too():
    with pytest.raises(TypeError, match=r"rspo/Shop-v0 got unknown keyword argument 'sed' \(did you mean 'seed'\?\)"):
        make_env("rspo/Shop-v0", sed=1)
    with pytest.raises(
        TypeError, match=r"Shop got unknown keyword argument 'num_product' \(did you mean 'num_products'\?\)"
    ):
        Shop(num_product=100)
    with pytest.raises(
        TypeError,
        match=r"Household got unknown keyword arguments 'difficulty_level' \(did you mean 'difficulty'\?\), 'zzz'; it accepts \[",
    ):
        Household(difficulty_level=1, zzz=2)


def test_a_key_with_no_near_name_gets_no_suggestion():
    with pytest.raises(TypeError) as err:
        make_env("rspo/Household-v0", zzz=1)
    assert "'zzz'; it accepts [" in str(err.value) and "did you mean" not in str(err.value)


def test_wrapper_and_adapter_kwargs_are_checked():
    with pytest.raises(
        TypeError, match=r"rspo/Faulty-v0 got unknown keyword argument 'fault_rat' \(did you mean 'fault_rate'\?\)"
    ):
        make_env("rspo/Faulty-v0", fault_rat=0.1)
    with pytest.raises(
        TypeError, match=r"rspo/Household-v0 got unknown keyword argument 'seeed' \(did you mean 'seed'\?\)"
    ):
        make_env("rspo/Faulty-v0", inner_kwargs={"seeed": 1})
    # checked before __init__, so before the adapter needs textworld or any game file
    with pytest.raises(TypeError, match=r"TextWorld got unknown keyword argument 'gamez' \(did you mean 'games'\?\)"):
        TextWorld(gamez=["a.z8"])


def test_make_env_passes_gymnasiums_own_kwargs_through():
    env = make_env("rspo/Household-v0", max_episode_steps=2)
    env.reset(seed=0, options={"split": "train", "task_id": 0})
    assert env.step("xyzzy")[3] is False
    assert env.step("xyzzy")[3] is True  # TimeLimit(2), far below Household's own max_steps
