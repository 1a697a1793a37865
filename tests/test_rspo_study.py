"""benchmarks/rspo_study.py: finals on both axes, the summary from records alone, and a killed
study run that resumes from its last.ckpt to the same record as an uninterrupted one."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rspo_study as study  # noqa: E402


# -- (a) finals and axes from hand-made curves -----------------------------------------------
def _point(step, env, a, seen, unseen):
    return {"step": step, "env_steps": env, "a_updates": a, "valid_seen": seen, "valid_unseen": unseen}


def test_finals_of_a_base_run_validated_every_3_iterations():
    # GRPO: validations at 0, 3, ..., 21 and at the stop (22); A updates = iteration
    curve = [_point(s, 1900 * s, s, s / 100, s / 200) for s in range(0, 22, 3)] + [_point(22, 41800, 22, 0.30, 0.10)]
    f = study.finals(curve, a_updates=9)
    env, au = f["env_steps"], f["a_updates"]
    assert env["steps"] == [21, 22] and env["valid_seen"] == pytest.approx((0.21 + 0.30) / 2)
    assert env["valid_unseen"] == pytest.approx((0.105 + 0.10) / 2)
    assert (env["env_steps"], env["a_updates"]) == (41800, 22)
    assert (
        au["steps"] == [6, 9]
        and au["valid_seen"] == pytest.approx(0.075)
        and au["valid_unseen"] == pytest.approx(0.0375)
    )
    assert (au["env_steps"], au["a_updates"], au["a_updates_target"]) == (17100, 9, 9)


def test_env_step_finals_leave_out_the_points_past_the_budget():
    """An RSPO run ends at the loop boundary after the budget (40,000 steps): its 4th loop ends at
    50,200 steps, past 40,000 x 1.05; the env-steps final is the mean of the loops ending at
    26,500 and 37,600. A base run's crossing iteration (41,800 <= 42,000) still counts."""
    curve = [
        _point(0, 0, 0, 0.05, 0.04),
        _point(7, 13000, 3, 0.10, 0.08),
        _point(14, 26500, 6, 0.20, 0.12),
        _point(21, 37600, 9, 0.30, 0.16),
        _point(28, 50200, 12, 0.50, 0.40),
    ]
    f = study.finals(curve, a_updates=9, env_budget=40000)
    assert f["env_steps"]["steps"] == [14, 21] and f["env_steps"]["valid_seen"] == pytest.approx(0.25)
    assert f["env_steps"]["env_steps"] == 37600 and f["env_steps"]["env_budget"] == 40000
    base = [_point(18, 35000, 18, 0.2, 0.2), _point(21, 39900, 21, 0.3, 0.3), _point(22, 41800, 22, 0.4, 0.4)]
    assert study.finals(base, 9, 40000)["env_steps"]["steps"] == [21, 22]
    # a budget of 7 iterations of 320 steps: one won episode leaves 2,238 after 7, so an 8th crosses to
    # 2,558, past 2,240 x 1.05 = 2,352 but within one iteration's 320 steps of the budget
    short = [_point(0, 0, 0, 0.0, 0.0), _point(8, 2558, 8, 0.1, 0.1)]
    assert study.finals(short, 9, 2240)["env_steps"]["steps"] == [0]
    assert study.finals(short, 9, 2240, slack_steps=320)["env_steps"]["steps"] == [0, 8]
    assert study.finals(short + [_point(9, 2561, 9, 0.2, 0.2)], 9, 2240, 320)["env_steps"]["steps"] == [0, 8]


def test_finals_of_an_rspo_run_and_one_with_fewer_a_updates():
    # RSPO k = 3: validation after each 7-iteration loop, 3 A updates per loop
    curve = [
        _point(0, 0, 0, 0.05, 0.04),
        _point(7, 13000, 3, 0.10, 0.08),
        _point(14, 26500, 6, 0.20, 0.12),
        _point(21, 40100, 9, 0.30, 0.16),
    ]
    f = study.finals(curve, a_updates=9)
    assert f["env_steps"]["steps"] == [14, 21] == f["a_updates"]["steps"]
    assert f["env_steps"]["valid_seen"] == pytest.approx(0.25) and f["a_updates"]["valid_unseen"] == pytest.approx(0.14)
    f = study.finals(curve, a_updates=12)  # fewer A updates than asked: its last two, and the actual count
    assert (
        f["a_updates"]["steps"] == [14, 21]
        and f["a_updates"]["a_updates"] == 9
        and f["a_updates"]["a_updates_target"] == 12
    )
    f = study.finals(curve, a_updates=4)
    assert f["a_updates"]["steps"] == [0, 7] and f["a_updates"]["valid_seen"] == pytest.approx(0.075)
    assert f["a_updates"]["env_steps"] == 13000 and f["a_updates"]["a_updates"] == 3


def test_finals_count_each_agent_a_once():
    """RSPO validates every 3 iterations, also during B's phases, when A does not change: at 15 and
    18 A has 6 updates, at 21 and 24 it has 9. The a_updates final is A after 6 and after 9 updates
    (the first validation of each), as GRPO's is its validations at 6 and 9, not 9 twice."""
    curve = [
        _point(15, 26800, 6, 0.07, 0.05),
        _point(18, 32500, 6, 0.07, 0.05),
        _point(21, 37400, 9, 0.09, 0.07),
        _point(24, 43100, 9, 0.09, 0.07),
        _point(27, 48200, 11, 0.14, 0.10),
    ]
    f = study.finals(curve, a_updates=9, env_budget=40000)
    assert f["a_updates"]["steps"] == [15, 21] and f["a_updates"]["valid_seen"] == pytest.approx((0.07 + 0.09) / 2)
    assert f["env_steps"]["steps"] == [15, 21] and f["env_steps"]["valid_unseen"] == pytest.approx((0.05 + 0.07) / 2)


def test_per_seed_table_and_the_paired_differences():
    def e(run, seed, axis, seen):
        return {"setting": "hard", "run": run, "seed": seed, "axis": axis, "valid_seen": seen}

    entries = [
        e(run, seed, axis, v + seed / 100 + (0.5 if axis == "a_updates" else 0))
        for run, v in (("grpo", 0.1), ("grpo_rspo_h", 0.2), ("grpo_rspo", 0.15))
        for seed in (0, 1)
        for axis in ("env_steps", "a_updates")
    ] + [e("grpo_rspo_k5", 1, "env_steps", 0.3), e("grpo_rspo_k5", 1, "a_updates", 0.4)]
    lines = study.per_seed_table(entries)
    head = "| run | seed 0 | seed 1 | Δ vs grpo_rspo (a updates) | Δ vs grpo_rspo_h (env steps) |"
    assert head + " Δ vs its base (env steps / A updates) |" in lines
    # grpo vs grpo_rspo on the A-updates axis: (0.60 - 0.65, 0.61 - 0.66) = -0.05 twice; vs RSPO_H at
    # equal env steps: 0.10 - 0.20 and 0.11 - 0.21 = -0.10 twice; grpo has no base
    assert "| grpo | 0.100 / 0.600 | 0.110 / 0.610 | -0.050 ± 0.000 (n=2) | -0.100 ± 0.000 (n=2) | – |" in lines
    # grpo_rspo's base is grpo: 0.15 - 0.10 = +0.05 on both axes, both seeds
    row = "| grpo_rspo | 0.150 / 0.650 | 0.160 / 0.660 | – | -0.050 ± 0.000 (n=2) | grpo: +0.050 ± 0.000 / +0.050 ± 0.000 (n=2) |"
    assert row in lines
    # one shared seed (1): 0.40 - 0.66 = -0.26 by A updates, 0.30 - 0.21 = +0.09 by env steps; vs grpo
    # seed 1: 0.30 - 0.11 = +0.19 by env steps, 0.40 - 0.61 = -0.21 by A updates
    row = "| grpo_rspo_k5 | – | 0.300 / 0.400 | -0.260 ± 0.000 (n=1) | +0.090 ± 0.000 (n=1) | grpo: +0.190 ± 0.000 / -0.210 ± 0.000 (n=1) |"
    assert row in lines


def test_an_rspo_run_stops_at_the_loop_that_completes_its_a_updates():
    # k = 3 with a collect iteration: 7 iterations per loop, 3 loops for 9 updates = 21 iterations
    assert study.RUNS["grpo_rspo"].max_epochs(9) * study.BASE_VAL_EVERY == 21
    # k = 5: 11 per loop, 2 loops = 22 iterations, rounded up to whole validation epochs (24)
    assert study.RUNS["grpo_rspo_k5"].max_epochs(9) == 8
    assert study.RUNS["grpo"].max_epochs(9) == study.RUNS["grpo_rspo_h"].max_epochs(9) == 1000  # to the budget
    assert "--trainer.max_epochs=7" in study.make_job("hard", "grpo_rspo", 0, 40000).overrides


def test_curve_and_diagnostics_of_a_history():
    train = {
        str(s): {
            "rollout/env_steps": 100.0 * s,
            "rspo/a_iterations": float(max(0, s - 4)),
            "rspo/replay_frac": 0.5 if s > 4 else 0.0,
        }
        for s in range(1, 8)
    }
    train["5"]["rollout/success_rate"] = 0.2
    train["7"]["rollout/success_rate"] = 0.4
    train["1"]["rollout_b0/repeat_visits"], train["2"]["rollout_b1/repeat_visits"] = 0.1, 0.3
    train["4"]["rollout_collect/success_rate"], train["4"]["rollout_collect_a/success_rate"] = 0.5, 0.25
    train["4"]["rspo/collect_minus_a"] = 0.25
    val = {str(s): {"val/success_rate": s / 10, "val_unseen/success_rate": s / 20} for s in (0, 7)}
    history = {"train": train, "val": val}
    assert study.curve_of(history) == [_point(0, 0, 0, 0.0, 0.0), _point(7, 700, 3, 0.7, 0.35)]
    base = {"train": {k: {"rollout/env_steps": v["rollout/env_steps"]} for k, v in train.items()}, "val": val}
    assert [p["a_updates"] for p in study.curve_of(base)] == [0, 7]  # no RSPOLoop: A updates = iteration
    d = study.diagnostics(history)
    assert d["rollout/success_rate"] == pytest.approx(0.3)  # mean over the iterations that log it
    late = {"train": {str(s): {"rollout/repeat_visits": s / 10} for s in range(1, 8)}}
    assert study.diagnostics(late)["late:rollout/repeat_visits"] == pytest.approx((0.5 + 0.6 + 0.7) / 3)  # 5..7
    assert d["rspo/replay_frac"] == pytest.approx(1.5 / 7)
    assert d["rollout_b*/repeat_visits"] == pytest.approx(0.2)  # a pattern: every B_j's values
    assert (d["rollout_collect_a/success_rate"], d["rspo/collect_minus_a"]) == (0.25, 0.25)  # collect_baseline's
    assert math.isnan(d["rspo/buffer_wins"]) and set(d) == set(study.DIAGNOSTICS.values())


def test_runs_table_and_plan():
    for name, run in study.RUNS.items():
        ks = [int(o.split("=")[1]) for o in run.overrides if o.startswith("--trainer.callbacks.k=")]
        exploit = [int(o.split("=")[1]) for o in run.overrides if o.startswith("--trainer.callbacks.exploit_k=")]
        no_collect = "--trainer.callbacks.collect_phase=false" in run.overrides
        k = ks[0] if ks else 3
        if run.loop is not None:  # the loop length (validation is every 3 iterations for every run)
            assert run.loop == k + (not no_collect) + (exploit[0] if exploit else k), name
            assert run.k == (exploit[0] if exploit else k) and run.to_budget == bool(exploit), name
        assert (ROOT / run.config).exists(), name
    job = study.make_job("hard", "grpo_rspo_noise01", 3, 40000)
    assert "--model.dense_reward.init_args.seed=3" in job.overrides and "--data.iterations_per_epoch=3" in job.overrides
    assert "--data.iterations_per_epoch=3" in study.make_job("quickstart", "grpo", 0, 15000).overrides
    # the *_copy settings: the same environment, the shipped model's two overrides; the others carry neither
    copy = study.make_job("hard_copy", "grpo_rspo_h", 1, 40000).overrides
    assert copy[-2:] == ("--model.policy.tiny.copy_init=true", "--model.rollout.template=compact_last")
    assert f"--data.env.kwargs={json.dumps(study.HARD)}" in copy and not any("copy_init" in o for o in job.overrides)
    assert "--data.num_val_tasks=128" in job.overrides
    assert study.parse_plan(["hard:grpo,grpo_rspo:0-1", "quickstart:grpo:2,4"]) == [
        ("hard", "grpo", 0),
        ("hard", "grpo_rspo", 0),
        ("hard", "grpo", 1),
        ("hard", "grpo_rspo", 1),
        ("quickstart", "grpo", 2),
        ("quickstart", "grpo", 4),
    ]
    with pytest.raises(SystemExit):
        study.parse_plan(["hard:nope:0"])


# -- (b) the summary from records alone ------------------------------------------------------
def _record(setting, run, seed, curve):
    return {
        "setting": setting,
        "run": run,
        "seed": seed,
        "budget": 40000,
        "wall_s": 10.0,
        "curve": curve,
        "diagnostics": {**{t: None for t in study.DIAGNOSTICS.values()}, "rollout/success_rate": 0.1 * (seed + 1)},
        "finals": study.finals(curve, 9),
    }


def test_summary_from_records_alone(tmp_path):
    records = tmp_path / "records"
    grpo = {
        0: (0.1, 0.2),
        1: (0.3, 0.1),
    }  # seed: (seen at a = 6, seen at a = 9); later points move the env-steps final only
    for seed, (a6, a9) in grpo.items():
        curve = [
            _point(0, 0, 0, 0.0, 0.0),
            _point(6, 12000, 6, a6, a6),
            _point(9, 18000, 9, a9, a9),
            _point(21, 40000, 21, 0.5, 0.4),
        ]
        study._write_json(records / "hard" / "grpo" / f"seed{seed}.json", _record("hard", "grpo", seed, curve))
    for seed in (0, 1, 2):
        curve = [_point(0, 0, 0, 0.0, 0.0), _point(14, 27000, 6, 0.2, 0.1), _point(21, 40500, 9, 0.4, 0.3)]
        study._write_json(
            records / "hard" / "grpo_rspo" / f"seed{seed}.json", _record("hard", "grpo_rspo", seed, curve)
        )
    curve = [_point(0, 0, 0, 0.0, 0.0), _point(3, 5000, 3, 0.5, float("nan"))]
    study._write_json(records / "quickstart" / "grpo" / "seed0.json", _record("quickstart", "grpo", 0, curve))
    out = str(tmp_path / "docs" / "study")
    assert (
        study.summarise(tmp_path / "empty", out)[0] == [] and not (tmp_path / "docs").exists()
    )  # no records: nothing written
    entries, lines = study.summarise(records, out, {"hard": 9, "quickstart": 9})

    saved = json.loads(Path(out + ".json").read_text())
    assert len(saved) == 2 * (2 + 3 + 1) and saved[0].keys() == {
        "setting",
        "run",
        "seed",
        "axis",
        "env_steps",
        "a_updates",
        "valid_seen",
        "valid_unseen",
    }
    one = {(e["run"], e["seed"], e["axis"]): e for e in saved if e["setting"] == "hard"}
    assert one[("grpo", 1, "a_updates")] == {
        "setting": "hard",
        "run": "grpo",
        "seed": 1,
        "axis": "a_updates",
        "env_steps": 18000,
        "a_updates": 9,
        "valid_seen": pytest.approx(0.2),
        "valid_unseen": pytest.approx(0.2),
    }
    assert (
        one[("grpo", 0, "env_steps")]["valid_seen"] == pytest.approx(0.35)
        and one[("grpo", 0, "env_steps")]["a_updates"] == 21
    )
    assert one[("grpo_rspo", 2, "env_steps")]["valid_seen"] == pytest.approx(0.3)
    quick = [e for e in saved if e["setting"] == "quickstart" and e["axis"] == "env_steps"]
    assert quick[0]["valid_unseen"] is None  # NaN (a validation that logged no valid_unseen) is null in JSON

    # paired vs grpo on the seeds both have (0, 1): a_updates axis rspo 0.3 vs grpo 0.15 and 0.2
    assert study.paired(entries, "hard", "grpo_rspo", "a_updates", "valid_seen") == pytest.approx([0.15, 0.1])
    assert study.paired(entries, "hard", "grpo_rspo", "env_steps", "valid_seen") == pytest.approx(
        [-0.05, 0.0], abs=1e-12
    )
    md = Path(out + "_table.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| hard | grpo_rspo | a_updates |"))
    assert "| 0,1,2 |" in row and "0.300 ± 0.000" in row and "+0.125 ± 0.035 | " in row and row.endswith("| 2 |")
    diag = next(line for line in md.splitlines() if line.startswith("| hard | grpo | 2 |"))
    assert "| 0.150 |" in diag and "–" in diag
    assert Path(out + ".png").stat().st_size > 0
    assert lines[-4:] == [  # one pair of lines per setting, in SETTINGS order; the quickstart has grpo only
        "rspo_minus_grpo_hard_env_steps: grpo_rspo -2.5 ± 3.5 (n=2)",
        "rspo_minus_grpo_hard_a_updates: grpo_rspo +12.5 ± 3.5 (n=2)",
        "rspo_minus_grpo_quickstart_env_steps: –",
        "rspo_minus_grpo_quickstart_a_updates: –",
    ]


# -- (c) a killed study run resumes to the record of an uninterrupted one ----------------------
TINY = (
    "--data.groups_per_iteration=2",
    "--data.group_size=2",
    "--data.num_val_tasks=4",
    "--data.iterations_per_epoch=2",
    "--trainer.max_epochs=1000",
)
VOLATILE = (
    "wall_s",
    "load_start",
    "load_end",
    "attempts",
    "commit",
    "machines",
    "policy_sha256",  # per attempt, as machines (the same weights in each, here none)
    "resumed",
)  # the machine's or the attempt's, not the run's


def _stable(record: dict) -> dict:
    return json.loads(json.dumps({k: v for k, v in record.items() if k not in VOLATILE}))


def _kill_once_checkpointed(job, runs) -> int:
    """Start ``job``'s fit and SIGKILL it as soon as its first last.ckpt (and checksum) is written;
    returns the iteration the checkpoint holds."""
    proc = study.launch(job, runs)
    ckpt = study.run_dir(job, runs) / "checkpoints" / "last.ckpt"
    deadline = time.time() + 300
    while (
        not (ckpt.exists() and Path(str(ckpt) + ".sha256").exists()) and proc.poll() is None and time.time() < deadline
    ):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, (
        f"the fit ended (rc {proc.returncode}) before it could be killed: raise the budget"
    )
    assert not (study.run_dir(job, runs) / "history.json").exists()
    history = study.checkpoint_history(ckpt)
    done = max(int(k) for k in history["train"])
    assert done >= 1 and not history["finished"]
    return done


@pytest.mark.parametrize(
    "config, overrides, budget",
    [
        pytest.param("configs/compare/grpo.yaml", TINY, 250, id="grpo"),
        # RSPO with k = 1: a 3-iteration loop (explore, collect, exploit), validated at each loop's end
        pytest.param(
            "configs/compare/grpo_rspo.yaml",
            (*TINY[:3], "--data.iterations_per_epoch=3", "--trainer.max_epochs=1000", "--trainer.callbacks.k=1"),
            300,
            id="grpo_rspo",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_killed_run_resumes_to_the_uninterrupted_record(tmp_path, config, overrides, budget):
    job = study.Job("tiny", "run", 0, config, overrides, budget)
    messages = []
    whole = study.run_one(job, tmp_path / "records_a", tmp_path / "runs_a", keep_checkpoints=True, log=messages.append)
    assert whole["attempts"] == 1 and whole["iterations"] >= 4 and whole["env_steps"] >= budget
    assert len(whole["curve"]) >= 3 and whole["curve"][0]["step"] == 0
    if "rspo" in config:  # A updates from rspo/a_iterations: one per 3-iteration loop
        assert [p["a_updates"] for p in whole["curve"]] == [p["step"] // 3 for p in whole["curve"]]

    killed_at = _kill_once_checkpointed(job, tmp_path / "runs_b")
    assert killed_at < whole["iterations"]
    resumed = study.run_one(job, tmp_path / "records_b", tmp_path / "runs_b", log=messages.append)
    attempts = json.loads((study.run_dir(job, tmp_path / "runs_b") / "attempts.json").read_text())
    assert [a["resumed"] for a in attempts] == [False, True] and attempts[1]["resumed_from_iteration"] == killed_at
    assert (
        "Restoring states from the checkpoint"
        in (study.run_dir(job, tmp_path / "runs_b") / attempts[1]["log"]).read_text()
    )
    assert resumed["attempts"] == 2
    assert _stable(resumed) == _stable(whole)
    assert json.loads(study.record_path(job, tmp_path / "records_b").read_text()) == resumed
    assert not (study.run_dir(job, tmp_path / "runs_b") / "checkpoints").exists()  # deleted once the record is written

    # a run with a record is skipped
    assert study.run_one(job, tmp_path / "records_b", tmp_path / "runs_b", log=messages.append) == resumed
    assert messages[-1].startswith("skip tiny/run/seed0")
    # killed after its last checkpoint but before history.json: the record comes from last.ckpt, no fit
    (study.run_dir(job, tmp_path / "runs_a") / "history.json").unlink()
    study.record_path(job, tmp_path / "records_a").unlink()
    again = study.run_one(job, tmp_path / "records_a", tmp_path / "runs_a", log=messages.append)
    assert _stable(again) == _stable(whole) and again["attempts"] == 1


def test_a_study_command_parses(tmp_path):
    """The full command of an RSPO ablation (noisy dense reward, the budget and history
    callbacks as JSON after the RSPOLoop overrides) is accepted by the CLI."""
    job = study.make_job("hard", "grpo_rspo_noise01", 1, 40000)
    cmd = study.fit_command(job, tmp_path / "runs") + ["--print_config"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "benchmarks"))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    import yaml

    cfg = yaml.safe_load(out.stdout)
    cbs = [c["class_path"] for c in cfg["trainer"]["callbacks"]]
    assert cbs == ["rspo_lightning.callbacks.RSPOLoop", "rspo_lightning.callbacks.EnvStepBudget", "_history.RunHistory"]
    assert cfg["trainer"]["callbacks"][1]["init_args"]["max_env_steps"] == 40000
    assert cfg["model"]["dense_reward"] == {
        "class_path": "rspo_lightning.rewards.NoisyReward",
        "init_args": {"base": None, "sigma": 0.1, "seed": 1},
    }
    assert cfg["trainer"]["logger"]["init_args"]["name"] == "hard/grpo_rspo_noise01/seed1"
    assert cfg["data"]["num_val_tasks"] == 128 and cfg["data"]["iterations_per_epoch"] == 3


def test_llm_setting_plays_the_llm_configs_and_validates_at_the_end():
    grpo = study.make_job("llm", "grpo", 0, 4500, val_tasks=256)
    shaped = study.make_job("llm", "grpo_shaped", 1, 4500, val_tasks=256)
    rspo = study.make_job("llm", "grpo_rspo", 0, 4500, val_tasks=256)
    rspo_h = study.make_job("llm", "grpo_rspo_h", 0, 4500, val_tasks=256)
    assert grpo.config == shaped.config == "configs/llm/smollm2_grpo.yaml"
    assert rspo.config == rspo_h.config == "configs/llm/smollm2_rspo.yaml"
    assert "--data.reward_mode=outcome+dense" in shaped.overrides
    assert "--trainer.callbacks.replay_from=history" in rspo_h.overrides
    for job in (grpo, shaped, rspo_h):
        # the setting's overrides come last, so they win over the run's validation interval of 3
        assert job.overrides[-3:] == study.SETTING_OVERRIDES["llm"]
    # an RSPO run's one epoch is the loops that bring A to the axis's N (9: 3 loops of 7), then it stops
    assert rspo.overrides[-5:] == (
        *study.SETTING_OVERRIDES["llm"],
        "--data.iterations_per_epoch=21",
        "--trainer.max_epochs=1",
    )
    for job in (grpo, shaped, rspo, rspo_h):
        env = json.loads(next(o for o in job.overrides if o.startswith("--data.env.kwargs=")).split("=", 1)[1])
        assert env["num_valid_seen"] == env["num_valid_unseen"] == 256 and env["num_receptacles"] == 4
    assert study.rollout_backend(grpo) == "hf"
    assert (
        study.rollout_backend(study.make_job("llm", "grpo", 0, 4500, extra=("--model.rollout.backend=vllm",))) == "vllm"
    )
    with pytest.raises(ValueError, match="has no config in setting 'llm'"):
        study.make_job("llm", "gigpo", 0, 4500)
    # llm_r2: the same runs with 2 receptacles (the easier setting)
    r2 = study.make_job("llm_r2", "grpo_rspo", 0, 2240, val_tasks=256)
    assert r2.config == "configs/llm/smollm2_rspo.yaml" and r2.overrides[-5:-2] == study.SETTING_OVERRIDES["llm"]
    env = json.loads(next(o for o in r2.overrides if o.startswith("--data.env.kwargs=")).split("=", 1)[1])
    assert env["num_receptacles"] == 2 and env["num_valid_seen"] == 256
    # llm_sft: the 4-receptacle env from the SFT warm start (the source override comes last, so it wins)
    sft = study.make_job("llm_sft", "grpo", 0, 2240, val_tasks=256)
    assert sft.overrides[-1] == f"--model.policy.source={study.SFT_POLICY}"
    # where B collects, A plays the collection's tasks too (a diagnostic outside the budget)
    baseline = "--trainer.callbacks.collect_baseline=true"
    assert study.make_job("llm_sft", "grpo_rspo", 0, 2000).overrides[-1] == baseline
    assert baseline not in study.make_job("llm_sft", "grpo_rspo_h", 0, 2000).overrides + sft.overrides
    env = json.loads(next(o for o in sft.overrides if o.startswith("--data.env.kwargs=")).split("=", 1)[1])
    assert env["num_receptacles"] == 4 and env["num_valid_unseen"] == 256


def test_an_rspo_run_in_a_setting_validated_at_the_end_stops_at_its_loop(tmp_path, monkeypatch):
    """The llm settings validate once (one long epoch); before, that long epoch also overrode the
    RSPO run's stop at the loop that completes its A updates, so RSPO ran on to the loop crossing
    the budget (a second loop that counts in neither final). A tiny RSPO run with k = 1 (a loop
    is explore, collect, exploit) and N = 1 stops after its 3 iterations, well inside its budget,
    and validates there."""
    monkeypatch.setitem(study.SETTINGS, "tiny_end", study.QUICK)
    monkeypatch.setitem(study.SETTING_OVERRIDES, "tiny_end", ("--data.iterations_per_epoch=1000",))
    monkeypatch.setitem(study.DEFAULT_A_UPDATES, "tiny_end", 1)
    job = study.make_job("tiny_end", "grpo_rspo_k1", 0, 200, val_tasks=4, extra=TINY[:2])
    record = study.run_one(job, tmp_path / "records", tmp_path / "runs", log=lambda m: None)
    # one loop: at most 3 x 4 episodes x 10 turns = 120 steps, below the budget of 200 that would
    # otherwise have stopped it at the end of a later loop
    assert record["iterations"] == 3 and record["env_steps"] < 200
    assert record["curve"][-1]["step"] == 3 and record["curve"][-1]["a_updates"] == 1
    assert record["finals"]["a_updates"]["steps"] == [0, 3]  # the last two distinct A: the start and the loop's


def test_a_record_from_a_checkpoint_and_a_validation_made_apart(tmp_path, monkeypatch):
    """An RSPO run that went one iteration (B's explore) past its loop end: its record keeps the
    iterations up to the loop end and takes A's validation from the separate record; refused where
    the checkpoint's A is not the loop end's."""
    job = study.make_job("llm_sft", "grpo_rspo", 0, 2000, val_tasks=256)
    a_its = {1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 2, 7: 3, 8: 3}  # loop 1: 3 explore, collect, 3 exploit; 8: loop 2's B
    train = {str(i): {"rollout/env_steps": 250 * i, "rspo/a_iterations": a} for i, a in a_its.items()}
    monkeypatch.setattr(
        study, "checkpoint_history", lambda path: {"train": train, "val": {}, "finished": False, "extra_iterations": 0}
    )
    rd = study.run_dir(job, tmp_path / "runs")
    rd.mkdir(parents=True)
    (rd / "attempts.json").write_text(json.dumps([{"attempt": 0, "started": 0.0, "wall_s": 100.0, "budget": 2000}]))
    scores = {
        "valid_seen": {"wins": 97, "n": 256, "success_rate": 97 / 256},
        "valid_unseen": {"wins": 89, "n": 256, "success_rate": 89 / 256},
        "wall_s": 50.0,
    }
    val = tmp_path / "loop1_A_seed0.json"
    val.write_text(json.dumps({"untrained": scores, "extra": ["--ckpt_path=x.ckpt"]}))
    with pytest.raises(SystemExit, match=r"past iteration 6 were \{6: 2, 7: 3, 8: 3\}"):
        study.record_validated_apart(job, tmp_path / "records", tmp_path / "runs", 6, val)
    record = study.record_validated_apart(job, tmp_path / "records", tmp_path / "runs", 7, val)
    assert record["iterations"] == 7 and record["env_steps"] == 1750 and record["a_updates"] == 3
    assert record["extra_iterations_after_stop"] == 1 and record["wall_s"] == 150.0
    assert record["curve"] == [
        {"step": 7, "env_steps": 1750, "a_updates": 3, "valid_seen": 97 / 256, "valid_unseen": 89 / 256}
    ]
    assert record["validated_apart"]["wins"] == {"valid_seen": [97, 256], "valid_unseen": [89, 256]}
    assert json.loads(study.record_path(job, tmp_path / "records").read_text()) == record
    with pytest.raises(SystemExit, match="exists"):
        study.record_validated_apart(job, tmp_path / "records", tmp_path / "runs", 7, val)


def test_matched_comparison_interpolates_the_rival_from_the_start(tmp_path):
    """Target (2) of issue 43: RSPO's end against GRPO's curve (start at 0, then its validations)
    at RSPO's environment steps and at its A updates; nothing past the rival's end."""

    def record(run, seed, env_steps, a_updates, seen, unseen):
        point = {"step": 7, "env_steps": env_steps, "a_updates": a_updates, "valid_seen": seen, "valid_unseen": unseen}
        return {
            "setting": "llm_sft",
            "run": run,
            "seed": seed,
            "overrides": ["--data.num_val_tasks=100"],
            "curve": [point],
        }

    scores = {"valid_seen": {"success_rate": 0.30, "n": 100}, "valid_unseen": {"success_rate": 0.20, "n": 100}}
    (tmp_path / "start_sft.json").write_text(json.dumps({"untrained": scores}))
    records = [
        record("grpo", 0, 2000, 7, 0.44, 0.34),
        record("grpo_rspo", 0, 1500, 3, 0.40, 0.30),
        record("grpo", 1, 2000, 7, 0.60, 0.20),
        record("grpo_rspo", 1, 2100, 3, 0.60, 0.20),  # past GRPO's last step: no env-steps point
    ]
    rows = study.matched(records, tmp_path)
    assert [(m["seed"], m["axis"], m["at"]) for m in rows] == [
        (0, "env_steps", 1500),
        (0, "a_updates", 3),
        (1, "env_steps", 2100),
        (1, "a_updates", 3),
    ]
    # seed 0: GRPO at 1,500 of its 2,000 steps: 0.30 + 0.75 x (0.44 - 0.30) = 0.405; at 3 of its 7 updates: 0.30 + 3/7 x 0.14 = 0.36
    assert rows[0]["valid_seen"]["rival"] == pytest.approx(0.405) and rows[0]["valid_seen"]["diff"] == pytest.approx(
        -0.005
    )
    assert rows[1]["valid_seen"]["rival"] == pytest.approx(0.36) and rows[1]["valid_seen"]["diff"] == pytest.approx(
        0.04
    )
    # valid_unseen from its own start: 0.20 + 0.75 x 0.14 = 0.305; 0.20 + 3/7 x 0.14 = 0.26
    assert rows[0]["valid_unseen"]["diff"] == pytest.approx(-0.005) and rows[1]["valid_unseen"][
        "diff"
    ] == pytest.approx(0.04)
    assert math.isnan(rows[2]["valid_seen"]["diff"])
    # seed 1 at 3 updates: 0.30 + 3/7 x 0.30 = 0.428571...
    assert rows[3]["valid_seen"]["rival"] == pytest.approx(0.30 + 3 / 7 * 0.30)
    lines = study.matched_lines(records, tmp_path, rows)
    # 60/100: Wilson's lower bound ~0.502 above the start's upper ~0.396; 40/100: ~0.309, not above
    assert "| grpo | 1 | 2000 | 7 | 60/100 = 60.0 % [50.2, 69.1] | yes | 20/100 = 20.0 % [13.3, 28.9] | no |" in lines
    assert (
        "| grpo_rspo | 0 | 1500 | 3 | 40/100 = 40.0 % [30.9, 49.8] | no | 30/100 = 30.0 % [21.9, 39.6] | no |" in lines
    )
    assert "| grpo_rspo | grpo | env_steps | s0: -0.5 (1500), s1: – (2100) | -0.5 ± 0.0 | -0.5 ± 0.0 | 1 |" in lines
    assert (
        study.interpolate([(0, 0.1), (10, 0.3)], 10) == pytest.approx(0.3) and study.interpolate([(0, 0.1)], 0) == 0.1
    )


def test_every_attempt_records_its_machine():
    m = study.machine_fingerprint()
    assert m["cores"] == os.cpu_count() and m["torch"] and m["cpu"] and m["mem_kb"] > 0


def test_every_attempt_records_the_weights_its_policy_source_names(tmp_path):
    """The llm_sft runs start from an SFT export; its hash in each attempt makes a rebuilt export checkable."""
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_text("{}")  # not weights: not hashed
    job = study.make_job("llm_sft", "grpo", 0, 2000, val_tasks=256)
    assert job.overrides[-1] == f"--model.policy.source={study.SFT_POLICY}"  # relative: under the repository root
    job = dataclasses.replace(job, overrides=(*job.overrides, f"--model.policy.source={tmp_path}"))
    got = study.policy_weights(job)
    # sha256 of b"weights", from `printf weights | sha256sum`
    assert got == {"model.safetensors": "9a129038d9a00aed0cf6a7ea059ca50a813449061ab87848cf1a13eafdf33b2c"}
    assert study.policy_weights(study.make_job("llm", "grpo", 0, 2000)) is None  # smollm2: no weights directory
    attempt = {"attempt": 0, "config": job.config, "overrides": list(job.overrides), "budget": 2000}
    history = {"train": {"1": {"rollout/env_steps": 300.0}}, "val": {}}
    record = study.build_record(job, history, [{**attempt, "policy_sha256": got}, attempt])
    assert record["policy_sha256"] == [got, None]  # per attempt; None where an attempt (an older one) has none


def test_a_run_resumed_under_another_budget_is_refused_unless_rebudget_and_then_disclosed(tmp_path):
    job = study.make_job("llm_sft", "grpo_rspo", 0, 1800, val_tasks=256)
    first = {"attempt": 0, "config": job.config, "overrides": list(job.overrides), "budget": 2000}
    second = dict(first, attempt=1, budget=1800, resumed=True, resumed_from_iteration=6)
    with pytest.raises(RuntimeError, match="with other arguments"):
        study._check_same_job(job, [first], tmp_path)
    study._check_same_job(job, [first], tmp_path, rebudget=True)
    other = dict(first, overrides=[*first["overrides"], "--seed_everything=1"])
    with pytest.raises(RuntimeError, match="with other arguments"):  # only the budget may differ
        study._check_same_job(job, [other], tmp_path, rebudget=True)

    val = {"0": {"val/success_rate": 0.3, "val_unseen/success_rate": 0.25}}
    val["7"] = {"val/success_rate": 0.4, "val_unseen/success_rate": 0.3}
    history = {"train": {str(s): {"rollout/env_steps": 260.0 * s} for s in range(1, 8)}, "val": val}
    record = study.build_record(job, history, [first, second])
    assert record["budget"] == 1800 and record["resumed"] == [6]
    assert record["budget_changes"] == [
        {"attempt": 0, "budget": 2000, "from_iteration": 0},
        {"attempt": 1, "budget": 1800, "from_iteration": 6},
    ]
    assert study.build_record(job, history, [second])["budget_changes"] == []
