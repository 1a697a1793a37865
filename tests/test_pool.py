"""EnvPool: worker processes step exactly like in-process envs; a dead or hung worker costs only its episodes."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from rspo_lightning.envs.faults import FaultyEnv
from rspo_lightning.envs.pool import EnvFault, EnvPool
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.types import TaskSpec

KW = {"task_types": ["pick_and_place", "pick_clean_then_place"], "num_receptacles": 5, "max_steps": 8}


def _play(pool: EnvPool, n: int, turns: int) -> list[list[str]]:
    """Reset n envs on tasks 0..n-1, then step each with a deterministic choice among its admissible actions."""
    pool.ensure(n)
    seen = [[] for _ in range(n)]
    infos = {}
    for i, result in enumerate(pool.reset([(i, {"split": "train", "task_id": i}) for i in range(n)])):
        obs, infos[i] = result
        seen[i].append(obs)
    for t in range(turns):
        live = sorted(infos)
        actions = [(i, infos[i]["admissible_actions"][(i + 3 * t) % len(infos[i]["admissible_actions"])]) for i in live]
        for (i, _), result in zip(actions, pool.step(actions)):
            obs, reward, terminated, truncated, info = result
            seen[i].append(f"{obs}|{reward}|{terminated}|{info['progress']}")
            infos[i] = info
            if terminated or truncated:
                del infos[i]
    return seen


def test_64_envs_in_4_workers_step_exactly_like_in_process():
    with EnvPool("rspo/Household-v0", KW) as local:
        expected = _play(local, 64, 6)
    with EnvPool("rspo/Household-v0", KW, num_workers=4) as pool:
        got = _play(pool, 64, 6)
        pids = pool.worker_pids
        assert len(set(pids)) == 4 and pool.max_steps == [8] * 64
    assert got == expected and sum(len(s) for s in got) == 64 * 7
    time.sleep(0.2)
    assert not any(
        os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z" for pid in pids
    )


def test_a_worker_killed_mid_episode_is_replaced_and_only_its_episodes_are_reported():
    with EnvPool("rspo/Household-v0", KW, num_workers=2) as pool:
        pool.ensure(4)
        resets = pool.reset([(i, {"split": "train", "task_id": i}) for i in range(4)])
        actions = [(i, resets[i][1]["admissible_actions"][0]) for i in range(4)]
        pool.step(actions)
        victim = pool.worker_pids[0]  # holds envs 0 and 2
        os.kill(victim, signal.SIGKILL)
        t0 = time.perf_counter()
        results = pool.step(actions)
        assert time.perf_counter() - t0 < 30  # reported, not hung
        assert [isinstance(r, EnvFault) for r in results] == [True, False, True, False]
        assert "worker process died" in str(results[0])
        assert pool.worker_pids[0] != victim and pool.worker_restarts == 1
        # the replacement worker's envs play again from a reset
        again = pool.reset([(0, {"split": "train", "task_id": 0}), (2, {"split": "train", "task_id": 2})])
        assert all(isinstance(r, tuple) for r in again)
        assert all(isinstance(r, tuple) for r in pool.step([(0, again[0][1]["admissible_actions"][0])]))


def test_a_hang_in_a_worker_costs_only_that_call():
    kw = {
        "inner_id": "rspo/Household-v0",
        "inner_kwargs": KW,
        "fault_rate": 0.0,
        "modes": ["hang"],
        "fault_at_step": 1,
        "hang_s": 5.0,
    }
    with EnvPool("rspo/Faulty-v0", kw, num_workers=2, timeout_s=0.5) as pool:
        pool.ensure(2)
        resets = pool.reset([(0, {"split": "train", "task_id": 0}), (1, {"split": "train", "task_id": 1})])
        first = pool.step([(0, resets[0][1]["admissible_actions"][0]), (1, resets[1][1]["admissible_actions"][0])])
        assert all(isinstance(r, tuple) for r in first)
        t0 = time.perf_counter()
        second = pool.step([(0, "look"), (1, "look")])  # step 1 hangs in both envs; the workers cut it at 0.5 s
        assert time.perf_counter() - t0 < 3
        assert all(isinstance(r, EnvFault) and "timed out after 0.5 s" in str(r) for r in second)
        assert pool.worker_restarts == 0 and pool.rebuilds == 2


def test_an_env_that_kills_its_worker_costs_only_the_episodes_of_that_worker(tiny_policy):
    model, tok = tiny_policy
    cfg = RolloutConfig(
        constrained_decoding=True,
        max_new_tokens=8,
        template="compact",
        system_prompt="",
        env_workers=2,
        env_timeout_s=10,
    )
    # every env dies at its 3rd step: each worker crashes, is replaced, and the rest goes on
    kw = {
        "inner_id": "rspo/Household-v0",
        "inner_kwargs": {**KW, "max_steps": 6},
        "fault_rate": 0.0,
        "modes": ["die"],
        "fault_at_step": 2,
    }
    engine = RolloutEngine(model, tok, cfg, kw)
    try:
        torch.manual_seed(0)
        trajs = engine.collect([TaskSpec("rspo/Faulty-v0", "train", i, i) for i in range(2)], 2)
        long = [t for t in trajs if t.env_error is not None]
        assert len(trajs) == 4 and all(len(t.turns) == 2 and "worker process died" in t.env_error for t in long)
        assert all(t.success or len(t.turns) <= 2 for t in trajs) and engine.env_errors == len(long) > 0
        assert engine.pools["rspo/Faulty-v0"].worker_restarts == engine.worker_restarts >= 1
        # the next collect works on the replacement workers
        assert len(engine.collect([TaskSpec("rspo/Faulty-v0", "train", 5, 5)], 2)) == 2
    finally:
        engine.close()


def test_workers_are_closed_at_interpreter_exit(tmp_path):
    script = textwrap.dedent("""
        from rspo_lightning.envs.pool import EnvPool
        pool = EnvPool("rspo/Household-v0", {}, num_workers=2)
        pool.ensure(2)
        print(*pool.worker_pids)
    """)  # exits without close()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    pids = [int(p) for p in out.stdout.split()]
    time.sleep(0.5)
    assert len(pids) == 2 and not any(os.path.exists(f"/proc/{p}") for p in pids)


def test_die_mode_never_ends_the_trainer_process_and_bad_worker_counts_fail_early():
    env = FaultyEnv(inner_kwargs=KW, modes=["die"], fault_at_step=0)
    env.reset(options={"split": "train", "task_id": 0})
    with pytest.raises(RuntimeError, match="outside a worker process"):
        env.step("look")
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        EnvPool("rspo/Household-v0", num_workers=-1)
    with pytest.raises(ValueError, match="rollout.env_workers must be >= 0"):
        RolloutConfig(env_workers=-2)


def test_calls_answered_by_a_worker_that_then_died_are_faults_too():
    # Half the resets end their worker: whatever a dead worker had answered in the same batch is
    # lost with it, so each worker's share is all faults or all fine, and the fine ones step on.
    kw = {
        "inner_id": "rspo/Household-v0",
        "inner_kwargs": KW,
        "fault_rate": 0.5,
        "modes": ["die"],
        "on_reset": True,
        "seed": 1,
    }
    with EnvPool("rspo/Faulty-v0", kw, num_workers=2, timeout_s=10) as pool:
        pool.ensure(6)
        results = pool.reset([(i, {"split": "train", "task_id": i}) for i in range(6)])
        faulty = [isinstance(r, EnvFault) for r in results]
        assert faulty[0::2] in ([True] * 3, [False] * 3) and faulty[1::2] in ([True] * 3, [False] * 3)
        assert pool.worker_restarts == (faulty[0] + faulty[1]) >= 1
        fine = [i for i in range(6) if not faulty[i]]
        stepped = pool.step([(i, results[i][1]["admissible_actions"][0]) for i in fine])
        assert all(
            isinstance(r, tuple) or "worker process died" in str(r) for r in stepped
        )  # never "step before reset"


def test_a_batch_of_calls_with_one_hung_call_in_the_middle():
    from rspo_lightning.envs.pool import _TimedCaller

    caller = _TimedCaller(0.3)
    t0 = time.perf_counter()
    out = caller.run([lambda: 1, lambda: time.sleep(3), lambda: 1 / 0, lambda: 4])
    assert time.perf_counter() - t0 < 2  # cut at 0.3 s, not waited out
    assert out[0] == (True, 1) and out[3] == (True, 4)
    assert not out[1][0] and isinstance(out[1][1], EnvFault) and "timed out after 0.3 s" in str(out[1][1])
    assert not out[2][0] and isinstance(out[2][1], ZeroDivisionError)
    assert _TimedCaller(None).run([lambda: 2]) == [(True, 2)]


def test_timed_caller_times_each_call_not_the_batch():
    from rspo_lightning.envs.pool import _TimedCaller

    caller = _TimedCaller(timeout_s=0.3)
    try:
        # four calls of 0.15 s: 0.6 s in all, twice the timeout, yet none is late
        assert caller.run([lambda k=k: time.sleep(0.15) or k for k in range(4)]) == [
            (True, 0),
            (True, 1),
            (True, 2),
            (True, 3),
        ]
        out = caller.run([lambda: "a", lambda: time.sleep(2.0), lambda: "c", lambda: 1 / 0])
        assert out[0] == (True, "a") and out[2] == (True, "c")
        assert out[1][0] is False and isinstance(out[1][1], EnvFault) and "timed out after 0.3 s" in str(out[1][1])
        assert out[3][0] is False and isinstance(
            out[3][1], ZeroDivisionError
        )  # the calls after a hang run in a fresh thread
    finally:
        caller.shutdown()
