"""Environment faults cost only their episode: raise, hang past the timeout, garbage returns."""

import time

import pytest
import torch

from rspo_lightning.envs.faults import FaultyEnv
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.types import TaskSpec

INNER = {"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 6}


def _engine(tiny_policy, fault_kwargs, timeout=None):
    model, tok = tiny_policy
    cfg = RolloutConfig(
        constrained_decoding=True, max_new_tokens=8, template="compact", system_prompt="", env_timeout_s=timeout
    )
    kwargs = {"inner_id": "rspo/Household-v0", "inner_kwargs": INNER, **fault_kwargs}
    return RolloutEngine(model, tok, cfg, kwargs)


def _tasks(n):
    return [TaskSpec("rspo/Faulty-v0", "train", i, i) for i in range(n)]


@pytest.mark.parametrize("mode", ["raise", "garbage"])
def test_a_fault_at_step_k_drops_only_that_episode_and_rebuilds_the_env(tiny_policy, mode):
    eng = _engine(tiny_policy, {"fault_rate": 0.0, "modes": [mode], "fault_at_step": 2})
    torch.manual_seed(0)
    trajs = eng.collect(_tasks(2), 2)
    # every episode that reached step 2 faulted there: exactly 2 turns kept, the error recorded
    long = [t for t in trajs if t.env_error is not None]
    assert long and all(len(t.turns) == 2 for t in long)
    assert all(("RuntimeError" in t.env_error) if mode == "raise" else ("expected (str" in t.env_error) for t in long)
    assert eng.env_errors == len(long)
    # each faulty env was rebuilt in place: a fresh object at its index, the others kept
    pool = eng.pools["rspo/Faulty-v0"]
    assert len(pool) == 4 and pool.rebuilds == len(long)
    before = dict(pool._local.envs)
    again = eng.collect(_tasks(2), 2)
    faulted = sum(t.env_error is not None for t in again)
    assert len(again) == 4 and eng.env_errors == len(long) + faulted
    assert sum(pool._local.envs[i] is not before[i] for i in range(4)) == faulted


def test_a_hang_past_the_timeout_is_cut(tiny_policy):
    eng = _engine(tiny_policy, {"fault_rate": 0.0, "modes": ["hang"], "fault_at_step": 0, "hang_s": 3.0}, timeout=0.3)
    t0 = time.perf_counter()
    trajs = eng.collect(_tasks(1), 2)
    took = time.perf_counter() - t0
    assert all(t.env_error is not None and "timed out after 0.3 s" in t.env_error for t in trajs)
    assert all(len(t.turns) == 0 for t in trajs)
    assert took < 2.5  # both hangs were cut at 0.3 s, not waited out (3 s each)


def test_faulty_reset_and_the_module_keeps_only_clean_episodes(tiny_policy):
    from rspo_lightning.batching import drop_faulty

    eng = _engine(tiny_policy, {"fault_rate": 0.1, "on_reset": True, "modes": ["raise"], "seed": 3})
    torch.manual_seed(0)
    trajs = eng.collect(_tasks(8), 3)
    assert any(t.env_error and t.env_error.startswith("reset:") for t in trajs)

    def clean_count(g):
        return sum(t.env_error is None for t in trajs if t.task.group_id == g)

    groups = {t.task.group_id for t in trajs}
    partial = [g for g in groups if 2 <= clean_count(g) < 3]
    lonely = [g for g in groups if clean_count(g) < 2]
    assert partial and lonely, "vacuous: choose a seed with a partial group and a group left with < 2 episodes"

    kept = drop_faulty(trajs, group_relative=True)  # the module's rule (GRPO), without building a module
    # group-relative: every clean episode of a group that keeps >= 2, nothing of the others
    assert kept == [t for t in trajs if t.env_error is None and t.task.group_id not in lonely]
    assert drop_faulty(trajs, group_relative=False) == [t for t in trajs if t.env_error is None]  # e.g. gae


def test_bad_fault_arguments():
    with pytest.raises(ValueError, match="modes"):
        FaultyEnv(modes=["explode"])
    with pytest.raises(ValueError, match="env_timeout_s"):
        RolloutConfig(env_timeout_s=0)


def test_an_iteration_whose_every_episode_faults_trains_nothing_and_goes_on():
    import lightning.pytorch as pl

    from rspo_lightning.config import EnvConfig, PolicyConfig
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    env = EnvConfig(
        env_id="rspo/Faulty-v0",
        kwargs={
            "inner_id": "rspo/Household-v0",
            "inner_kwargs": INNER,
            "fault_rate": 0.0,
            "modes": ["raise"],
            "fault_at_step": 0,
        },
    )
    m = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)),
        env=env,
        rollout=RolloutConfig(constrained_decoding=True, max_new_tokens=8, template="compact", system_prompt=""),
    )
    dm = AgentDataModule(env=env, groups_per_iteration=2, group_size=2, iterations_per_epoch=2, val_splits=[])
    pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    ).fit(m, dm)
    assert m.iteration == 2 and m.episodes_dropped == 8 and m.engine.env_errors == 8
