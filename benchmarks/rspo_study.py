"""Where should RSPO's mechanism matter? GRPO, shaped GRPO, RSPO variants and ablations compared
at EQUAL environment steps (B's exploration and collection steps counted) and at EQUAL agent-A
updates, in a hard-exploration Household setting and in the quickstart setting. Resumable.

    pip install -e ".[bench]"
    # the full study: hard x (grpo grpo_shaped grpo_rspo grpo_rspo_h grpo_rspo_combo grpo_rspo_o) x seeds 0-4,
    # quickstart x (grpo grpo_rspo_h grpo_rspo_combo) x seeds 0-4, hard x every ablation x seeds 0 1
    python benchmarks/rspo_study.py --jobs 2
    # the same runs on the shipped quickstart model (copy_init + compact_last): settings quickstart_copy, hard_copy
    python benchmarks/rspo_study.py --plan quickstart_copy:grpo,grpo_rspo_h,grpo_rspo_combo:0-2 --quick-budget 40000 --quick-a-updates 20
    # a part of it: --plan SETTING:RUN[,RUN...]:SEEDS (seeds 0-4, 0,2,3 or 1), replacing the lists below
    python benchmarks/rspo_study.py --plan hard:grpo,grpo_rspo:0-4 quickstart:grpo:0-2
    # or the lists
    python benchmarks/rspo_study.py --runs grpo grpo_rspo_h --quick-runs --ablations grpo_rspo_k1 --ablation-seeds 0 1 2
    # rebuild docs/rspo_study.json, docs/rspo_study_table.md and docs/rspo_study.png from the records alone
    python benchmarks/rspo_study.py --summarise-only
    # what would run, and how (nothing is run)
    python benchmarks/rspo_study.py --dry-run
    # a smoke test of the whole pipeline in a minute or two (tiny batches; kept out of docs/)
    python benchmarks/rspo_study.py --plan hard:grpo,grpo_rspo_k1:0 quickstart:grpo:0 --budget 200 --quick-budget 200 \
        --val-tasks 4 --extra=--data.groups_per_iteration=2 --extra=--data.group_size=2 \
        --records /tmp/rspo_smoke/records --out-runs /tmp/rspo_smoke/runs --out /tmp/rspo_smoke/rspo_study

**Resuming.** Run the same command again after a crash, a reboot or a ``kill -9``:

- a run (setting, run, seed) whose record ``<records>/<setting>/<run>/seed<k>.json`` exists is
  skipped (``--records``, default ``docs/data/rspo_study``: small tracked JSON files);
- a run whose folder ``<out-runs>/<setting>/<run>/seed<k>`` (``--out-runs``, default
  ``runs/rspo_study``, untracked) has ``checkpoints/last.ckpt`` but no record is resumed with
  ``--ckpt_path last`` (every run checkpoints each iteration: ``IterationCheckpoint`` writes
  ``last.ckpt`` into ``<save_dir>/<logger name>/checkpoints``, and the logger name is
  ``<setting>/<run>/seed<k>``, so no two runs share one);
- any other run starts from scratch.

When a run ends its record is written at once and its checkpoints are deleted
(``--keep-checkpoints`` keeps them). To run one again, delete its record AND its run folder. The
curves come from ``benchmarks/_history.py:RunHistory``, a callback whose history travels inside
each checkpoint, so a resumed run's record equals an uninterrupted one's
(``tests/test_rspo_study.py``); TensorBoard events (``<run folder>/tb``) are for reading only.

**Budget.** Every run ends through ``EnvStepBudget`` (``--budget`` environment steps, hard and
hard_copy; ``--quick-budget``, quickstart and quickstart_copy) and validates agent A on ``--val-tasks`` tasks per split
(``valid_seen``, ``valid_unseen``). Validation also runs every 3 iterations, RSPO runs included
(``data.iterations_per_epoch=3``; during B's phases it measures A), and before training (step 0).

**Finals**, one per axis: ``env_steps``: the mean of the run's last two validations within the
budget x 1.05 (``ENV_SLACK``); ``a_updates``: the mean of the last two validations after at most
``--a-updates`` agent-A updates (default 9: what RSPO with k = 3 gets in 40k steps, 3 loops; for
GRPO validated every 3 iterations, its validations at iterations 6 and 9). Agent-A updates at a
validation = ``rspo/a_iterations`` for RSPO runs, the iteration otherwise. A run with fewer A
updates uses its last two validations, and the summary gives its actual count.

**Outputs.** One record per run (setting, run, seed, the CLI overrides, budget, wall time,
machine load at start and end, the validation curve with step / env steps / A updates /
valid_seen / valid_unseen at each point, diagnostics = the mean of each ``DIAGNOSTICS`` tag over
the iterations that log it (null where none does), the finals of both axes). The summary (also
after running) writes ``<out>.json`` (one entry per setting, run, seed and axis:
``{"setting", "run", "seed", "axis", "env_steps", "a_updates", "valid_seen", "valid_unseen"}``),
``<out>_table.md`` (finals per setting / run / axis: mean ± std over seeds and the paired
difference vs ``grpo`` on the same seeds; diagnostics per setting / run; in a setting with a start
record, each run's end with its Wilson interval and ``matched``'s comparison) and ``<out>.png``
(valid_seen vs environment steps and vs A updates, one row per setting). The last lines printed
are ``rspo_minus_grpo_<setting>_<axis>: <run> <points> ± <std> (n=<seeds>), ...``, the paired
valid_seen difference of each run vs grpo in its setting, in points (in a setting with a start
record, the llm ones, GRPO's curve interpolated at the run's end: ``matched``).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from _runs import ROOT, commit, mean_std, parse_seeds, plot_curves

from rspo_lightning.checkpointing import file_sha256
from rspo_lightning.runfiles import pid_alive

BENCH = Path(__file__).resolve().parent

# The hard setting: 8 receptacles, 2 distractors, 15 steps. A uniformly random admissible policy
# wins 1.3 % of 300 episodes (mean final progress 0.06); the tiny model's GRPO starts at ~3 %
# training success with most groups all-fail.
HARD = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 8,
    "num_distractors": 2,
    "num_object_types": 8,
    "max_steps": 15,
    "info_actions": False,
}
QUICK = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 10,
    "info_actions": False,
}
# quickstart_copy and hard_copy: the quickstart and hard settings with the model configs/quickstart.yaml ships
# since 2026-12-04 (copy_init + compact_last: 0.605 ± 0.077 valid_seen over 4 recorded seeds, from 0.484)
COPY_MODEL = ("--model.policy.tiny.copy_init=true", "--model.rollout.template=compact_last")
# llm: the quickstart env played by SmolLM2-135M-Instruct (configs/llm/), 256 + 256 held-out tasks. Its
# untrained start and a random policy are one shared record (benchmarks/llm_start.py), so the runs skip the
# validation before training (over an hour a split pair on one thread with the hf backend) and validate once,
# when the budget stops them (EnvStepBudget's last validation) or, for an RSPO run, at the end of the loop that
# brings A to the a_updates axis's N (make_job: its one epoch is those loops); the curve is the start and that end.
LLM = {**QUICK, "num_valid_seen": 256, "num_valid_unseen": 256}
# llm_r2: the same with 2 receptacles, the smallest change after 0 wins in 512 training episodes at 4 (docs/llm.md):
# a uniformly random admissible policy wins 19.1 % / 22.3 % there (docs/data/llm_study/start_easier_random.json)
LLM_R2 = {**LLM, "num_receptacles": 2}
# llm_sft: the llm setting (4 receptacles) from a short SFT warm start on the env's expert, after 0 wins in
# 512 + 256 training episodes at 4 and 2 receptacles: the model does not leave its take / put-back loop by RL
# alone. The warm start is configs/llm/smollm2_sft.yaml's export (64 expert demos, one epoch; docs/llm.md):
# copy or link it to SFT_POLICY in the worktree the study runs from. Its demos are the env's default task mix
# (--env-kwargs '{}'), not this setting's: docs/llm.md.
SFT_POLICY = "runs/llm_sft/hf"
SETTINGS = {
    "hard": HARD,
    "quickstart": QUICK,
    "quickstart_copy": QUICK,
    "hard_copy": HARD,
    "llm": LLM,
    "llm_r2": LLM_R2,
    "llm_sft": LLM,
}
LLM_OVERRIDES = (
    "--trainer.num_sanity_val_steps=0",
    "--data.iterations_per_epoch=1000",
    "--data.val_groups_per_batch=64",
)
LLM_CONFIGS = {
    "configs/compare/grpo.yaml": "configs/llm/smollm2_grpo.yaml",
    "configs/compare/grpo_rspo.yaml": "configs/llm/smollm2_rspo.yaml",
}
SETTING_OVERRIDES = {  # a setting's model (and validation) overrides, after the run's own
    "quickstart_copy": COPY_MODEL,
    "hard_copy": COPY_MODEL,
    "llm": LLM_OVERRIDES,
    "llm_r2": LLM_OVERRIDES,
    "llm_sft": (*LLM_OVERRIDES, f"--model.policy.source={SFT_POLICY}"),
}
# a setting's overrides for the runs whose B collects (spec.loop): llm_sft's A also plays the collection's tasks
# (RSPOLoop collect_baseline: B's collection success against A's on the same tasks, outside the budget)
COLLECT_OVERRIDES = {"llm_sft": ("--trainer.callbacks.collect_baseline=true",)}
# a setting's own config for each compare/ config a run names (the run's overrides stay)
SETTING_CONFIGS = {"llm": LLM_CONFIGS, "llm_r2": LLM_CONFIGS, "llm_sft": LLM_CONFIGS}
# the settings of --quick-budget and --quick-a-updates (the others: --budget, --a-updates)
QUICK_SETTINGS = ("quickstart", "quickstart_copy")
PROGRESS = "rspo_lightning.rewards.EnvProgressReward"
NOVELTY = "rspo_lightning.rewards.NoveltyBonus"  # progress deltas + 0.03 per turn reaching a new state
PRM_DIR = "docs/data/rspo_study/prm/hard"  # benchmarks/prm_hard.py writes it; fits run in the repository root
SHAPED_SCALE = 10  # the dense return (progress, at most 1 per episode) on the scale of the success reward (10)
BASE_VAL_EVERY = 3  # iterations between two validations of a base (non-RSPO) run
AXES = ("env_steps", "a_updates")
# the a_updates axis's N per setting (--a-updates, --quick-a-updates)
DEFAULT_A_UPDATES = dict.fromkeys(SETTINGS, 9)


@dataclasses.dataclass(frozen=True)
class Run:
    """A config plus CLI overrides (``{seed}`` is replaced by the run's seed); ``loop``: the
    iterations of one RSPO loop (validation after each), None for a base run."""

    config: str
    overrides: tuple[str, ...] = ()
    loop: int | None = None
    k: int = 0  # A iterations per loop (RSPO)
    # run to the env-step budget even past the a_updates axis's N (a lean loop's A gets there early)
    to_budget: bool = False

    def iterations(self, a_updates: int) -> int | None:
        """The iterations of the loops that bring A to ``a_updates`` updates (None: the run goes to
        its budget)."""
        if self.loop is None or self.to_budget:
            return None
        return -(-a_updates // self.k) * self.loop

    def max_epochs(self, a_updates: int) -> int:
        """An RSPO run stops at the end of the loop that brings A to ``a_updates`` updates (or at its
        env-step budget, if that comes first): the next loop's points count in neither final (its
        first new A comes past the budget x 1.05 in every setting here: 47-49k steps for the hard
        setting's 40k), so running it costs a quarter of the run and changes no number. A base run
        (and RSPO_H, one A update per iteration) runs to its budget."""
        iterations = self.iterations(a_updates)
        return 1000 if iterations is None else -(-iterations // self.iterations_per_epoch)

    @property
    def iterations_per_epoch(self) -> int:
        # every run validates every 3 iterations, whatever its loop: with validation only at loop
        # ends (12.5k steps apart) the mean of RSPO's last two validations averaged 25k and 37k
        # steps against GRPO's 39k and 41k. During B's phases validation measures A (swapped in);
        # common random numbers make two validations of the same A equal.
        return BASE_VAL_EVERY


def cb(name: str, value) -> str:
    """An override of an RSPOLoop init arg (the config's first callback); a lever of
    ``study_loop.StudyRSPOLoop`` (``STUDY_LEVERS``) makes ``fit_command`` switch the callback to it."""
    return f"--trainer.callbacks.{name}={value}"


# RSPOLoop's variants the study measured, which live in study_loop.StudyRSPOLoop (issue 45)
STUDY_LEVERS = frozenset(
    "exploit_k dense_scale buffer_from collect_phase replay_slots explorer_lr_scale explorer_temperature "
    "explorer_credit explorer_gamma explorer_resync_every reuse_a_episodes".split()
)


def loop_class(overrides) -> list[str]:
    """``--trainer.callbacks.class_path=study_loop.StudyRSPOLoop`` when an override sets one of its
    levers (the subclass keeps every RSPOLoop argument the config set), else nothing."""
    names = {o.split("=", 1)[0].removeprefix("--trainer.callbacks.").removeprefix("init_args.") for o in overrides}
    return ["--trainer.callbacks.class_path=study_loop.StudyRSPOLoop"] if names & STUDY_LEVERS else []


def base(*overrides: str, config: str = "configs/compare/grpo.yaml") -> Run:
    return Run(config, overrides)


def rspo(
    *overrides: str,
    k: int = 3,
    collect: bool = True,
    exploit_k: int | None = None,
    config: str = "configs/compare/grpo_rspo.yaml",
) -> Run:
    """An RSPO run: k explore (+ collect) + exploit_k (None = k) exploit iterations per loop. With
    exploit_k > k A reaches the a_updates axis's N long before the budget: it runs to the budget."""
    a_per_loop = k if exploit_k is None else exploit_k
    if exploit_k is not None:
        overrides = (cb("k", k), cb("exploit_k", exploit_k), *overrides)
    return Run(config, overrides, loop=k + collect + a_per_loop, k=a_per_loop, to_budget=exploit_k is not None)


# combo's D: all of B's episodes plus A's own recent groups, replay slots for wins only
COMBO_D = (cb("replay_from", "both"), cb("buffer_from", "explore+collect"), cb("replay_slots", "positive"))


def lean(*overrides: str) -> Run:
    """The lean loop with combo's D: B explores 1 iteration and collects, A exploits 3."""
    return rspo(*COMBO_D, *overrides, k=1, exploit_k=3)


def noisy(
    sigma: float,
) -> tuple[str, ...]:  # B's dense reward plus N(0, sigma^2) per turn, noise seeded by the run's seed
    return (
        "--model.dense_reward=rspo_lightning.rewards.NoisyReward",
        f"--model.dense_reward.init_args.sigma={sigma}",
        "--model.dense_reward.init_args.seed={seed}",
    )


RUNS: dict[str, Run] = {
    "grpo": base(),
    "grpo_shaped": base(
        "--data.reward_mode=outcome+dense", f"--data.dense_scale={SHAPED_SCALE}", f"--model.dense_reward={PROGRESS}"
    ),
    "grpo_rspo": rspo(),
    # RSPO_H: no B, D = A's own previous groups; every iteration is A's, so it validates every 3 like a base run
    "grpo_rspo_h": Run("configs/compare/grpo_rspo.yaml", (cb("replay_from", "history"),)),
    "grpo_rspo_o": rspo(cb("explorer_reward", "outcome")),  # RSPO_O: B on the outcome reward
    # the best explorer configuration measured (docs/rspo_study.md, 5 seeds): the screening's levers together,
    # D = all of B's episodes plus A's own recent groups, slots for wins only
    "grpo_rspo_combo": rspo(*COMBO_D),
    # -- ablations of the defaults (--ablation-seeds) --
    "grpo_rspo_mixed": rspo(cb("explorer_reward", "outcome+dense"), cb("dense_scale", SHAPED_SCALE)),
    "grpo_rspo_group": rspo(cb("replay_unit", "group")),
    "grpo_rspo_tokens": rspo(cb("offline_weighting", "tokens")),
    "grpo_rspo_signal": rspo(cb("offline_weighting", "signal")),  # adaptive α: the replay's share of the signal
    "grpo_rspo_online": rspo(cb("replay_baseline", "online")),
    "grpo_rspo_sampling_random": rspo(cb("sampling", "random")),
    "grpo_rspo_sampling_variance": rspo(cb("sampling", "variance")),
    "grpo_rspo_alpha16": rspo(cb("offline_ratio", 0.0625)),
    "grpo_rspo_alpha4": rspo(cb("offline_ratio", 0.25)),
    "grpo_rspo_alpha2": rspo(cb("offline_ratio", 0.5)),  # alpha must stay < 1
    "grpo_rspo_k1": rspo(cb("k", 1), k=1),
    "grpo_rspo_k5": rspo(cb("k", 5), k=5),
    "grpo_rspo_k10": rspo(cb("k", 10), k=10),
    "grpo_rspo_noise01": rspo(*noisy(0.1)),
    "grpo_rspo_noise03": rspo(*noisy(0.3)),
    "grpo_rspo_explore_buffer": rspo(cb("buffer_from", "explore+collect")),
    "grpo_rspo_nocollect": rspo(cb("buffer_from", "explore+collect"), cb("collect_phase", "false"), collect=False),
    "grpo_rspo_positive": rspo(cb("replay_slots", "positive")),
    "grpo_rspo_positive_repeat": rspo(cb("replay_slots", "positive_repeat")),
    "grpo_rspo_both": rspo(cb("replay_from", "both")),
    "grpo_rspo_lr2": rspo(cb("explorer_lr_scale", 2.0)),
    "grpo_rspo_temp13": rspo(cb("explorer_temperature", 1.3)),
    "grpo_rspo_turn": rspo(cb("explorer_credit", "turn")),
    "grpo_rspo_persistent": rspo(cb("explorer_resync_every", 3)),  # B persists 3 loops, then B := A
    # a lean loop: B explores 1 iteration and collects, A exploits 3 (A plays 3 of 5 iterations, not 3 of 7),
    # with combo's D (B's episodes + A's own recent groups, slots for wins only)
    "grpo_rspo_lean": lean(),
    # the lean loop whose B makes its update on A's last exploit episodes (rescored with progress deltas)
    # instead of playing its own: B plays only the collection, 1 of every 4 played iterations instead of 2 of 5
    "grpo_rspo_lean_reuse": lean(cb("reuse_a_episodes", "true")),
    # the lean loop with a B that is paid for reaching states new to its episode (NoveltyBonus on progress
    # deltas, credited per turn): progress deltas telescope, so nothing else rewards B for covering the house
    "grpo_rspo_lean_novelty": lean(cb("explorer_credit", "turn"), f"--model.dense_reward={NOVELTY}"),
    # the paper's B: a learned process reward (SPA-RL's progress model) fitted on the hard setting's episodes
    # by benchmarks/prm_hard.py, in place of progress deltas
    "grpo_rspo_prm": rspo(
        "--model.dense_reward=rspo_lightning.rewards.ProcessRewardModelReward",
        f"--model.dense_reward.init_args.model={PRM_DIR}",
        f"--model.dense_reward.init_args.max_steps={HARD['max_steps']}",
    ),
    "gigpo": base(config="configs/compare/gigpo.yaml"),
    "gigpo_rspo": rspo(config="configs/compare/gigpo_rspo.yaml"),
    "ppo": base(config="configs/compare/ppo.yaml"),
    "ppo_rspo": rspo(config="configs/compare/ppo_rspo.yaml"),
}
MAIN = ["grpo", "grpo_shaped", "grpo_rspo", "grpo_rspo_h", "grpo_rspo_combo", "grpo_rspo_o"]
QUICK_MAIN = ["grpo", "grpo_rspo_h", "grpo_rspo_combo"]  # the quickstart contrast: GRPO, RSPO_H, the best RSPO
ABLATIONS = [name for name in RUNS if name not in MAIN]
DIAGNOSTICS = {  # table column: logged tag (mean over the iterations that log it)
    "repeat A": "rspo/repeat_visits_A",
    "repeat B_j": "rollout_b*/repeat_visits",  # B's explore iterations j = 0..k-1 (a * pattern: every matching tag)
    "repeat A late": "late:rollout/repeat_visits",  # every run (GRPO too), the last third of A's iterations
    "A train success": "rollout/success_rate",
    "B train success": "rollout_b/success_rate",
    "A progress": "rollout/progress",
    "B progress": "rollout_b/progress",
    "collect success": "rollout_collect/success_rate",
    "collect progress": "rollout_collect/progress",
    "collect repeat": "rollout_collect/repeat_visits",
    "collect A success": "rollout_collect_a/success_rate",  # RSPOLoop(collect_baseline): A on the collection's tasks
    "collect - A": "rspo/collect_minus_a",
    "replay row share": "rspo/replay_frac",
    "replay token share": "rspo/replay_token_share",
    "replay loss share": "rspo/replay_loss_share",
    "replay win share": "rspo/replay_win_share",
    "replay log ratio": "rspo/replay_log_ratio",  # log π_behaviour − log π_A over the trained replayed tokens
    "replay ratio out": "rspo/replay_ratio_out",
    "replay |adv|": "rspo/replay_adv_abs",
    "replay zero frac": "rspo/replay_zero_frac",
    "buffer success": "rspo/buffer_success_rate",
    "buffer wins": "rspo/buffer_wins",
    "buffer used frac": "rspo/buffer_used_frac",
}


# -- jobs -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Job:
    """One fit: ``overrides`` are its CLI arguments after the config (env, validation, run);
    the runner adds the seed, the logger, the budget and the history callback."""

    setting: str
    run: str
    seed: int
    config: str
    overrides: tuple[str, ...]
    budget: int

    @property
    def key(self) -> str:
        return f"{self.setting}/{self.run}/seed{self.seed}"


def make_job(setting: str, run: str, seed: int, budget: int, val_tasks: int = 128, extra: tuple[str, ...] = ()) -> Job:
    """The job of ``RUNS[run]`` in ``SETTINGS[setting]`` (``extra``: more CLI overrides, last)."""
    spec = RUNS[run]
    a_updates = DEFAULT_A_UPDATES.get(setting, 9)
    setting_overrides = SETTING_OVERRIDES.get(setting, ())
    iterations = spec.iterations(a_updates)
    # a setting that validates only at the end sets one long epoch; an RSPO run there makes its one epoch
    # the loops to A's N-th update, so that it still stops (and validates) at that loop's end
    stop = (
        (f"--data.iterations_per_epoch={iterations}", "--trainer.max_epochs=1")
        if iterations is not None and any(o.startswith("--data.iterations_per_epoch=") for o in setting_overrides)
        else ()
    )
    overrides = (
        *(o.replace("{seed}", str(seed)) for o in spec.overrides),
        f"--data.env.kwargs={json.dumps(SETTINGS[setting])}",
        f"--trainer.max_epochs={spec.max_epochs(a_updates)}",
        f"--data.iterations_per_epoch={spec.iterations_per_epoch}",
        f"--data.num_val_tasks={val_tasks}",
        *setting_overrides,
        *stop,
        *(COLLECT_OVERRIDES.get(setting, ()) if spec.loop is not None else ()),
        *extra,
    )
    config = SETTING_CONFIGS.get(setting, {}).get(spec.config)
    if setting in SETTING_CONFIGS and config is None:
        raise ValueError(f"run {run!r} has no config in setting {setting!r}: {sorted(SETTING_CONFIGS[setting])} have")
    return Job(setting, run, seed, config or spec.config, overrides, budget)


def run_dir(job: Job, out_runs) -> Path:
    return Path(out_runs).resolve() / job.setting / job.run / f"seed{job.seed}"


def record_path(job: Job, records) -> Path:
    return Path(records).resolve() / job.setting / job.run / f"seed{job.seed}.json"


def fit_command(job: Job, out_runs, resume: bool = False) -> list[str]:
    """The ``rspo-lightning fit`` command of ``job`` (``resume``: from its ``last.ckpt``)."""
    budget = {"class_path": "rspo_lightning.callbacks.EnvStepBudget", "init_args": {"max_env_steps": job.budget}}
    history = {"class_path": "_history.RunHistory", "init_args": {"path": str(run_dir(job, out_runs) / "history.json")}}
    return [
        sys.executable,
        "-m",
        "rspo_lightning.cli",
        "fit",
        "--config",
        str(ROOT / job.config),
        f"--seed_everything={job.seed}",
        f"--model.seed={job.seed}",
        f"--data.seed={job.seed}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=true",
        f"--trainer.logger.init_args.save_dir={Path(out_runs).resolve()}",
        f"--trainer.logger.init_args.name={job.setting}/{job.run}/seed{job.seed}",
        "--trainer.logger.init_args.version=tb",
        *loop_class(job.overrides),
        *job.overrides,  # before the callbacks below: `--trainer.callbacks.<arg>` overrides target RSPOLoop
        f"--trainer.callbacks+={json.dumps(budget)}",
        f"--trainer.callbacks+={json.dumps(history)}",
        *(["--ckpt_path=last"] if resume else []),
    ]


def _read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(_json_safe(obj), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _json_safe(obj):
    """NaN/inf -> None (null) everywhere."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _alive(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    try:
        return b"rspo_lightning.cli" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def launch(
    job: Job, out_runs, threads: int = 1, resume: bool | None = None, rebudget: bool = False
) -> subprocess.Popen:
    """Start ``job``'s fit (resumed from ``last.ckpt`` if there is one, unless ``resume`` says)
    as a child process writing ``stdout.<attempt>.log`` in its run folder; the attempt is
    logged in ``attempts.json`` there. Refuses while another fit of the folder is alive."""
    rd = run_dir(job, out_runs)
    lock = rd / "running.pid"
    pid = _read_json(lock)
    if isinstance(pid, int) and _alive(pid):
        raise RuntimeError(f"{job.key}: a fit of {rd} is still running (pid {pid}); wait for it or kill it")
    ckpt = rd / "checkpoints" / "last.ckpt"
    resume = ckpt.exists() if resume is None else resume
    rd.mkdir(parents=True, exist_ok=True)
    attempts = _read_json(rd / "attempts.json", [])
    log = rd / f"stdout.{len(attempts)}.log"
    _check_same_job(job, attempts, rd, rebudget)
    entry = {
        "attempt": len(attempts),
        "resumed": resume,
        "started": time.time(),
        "load_start": list(os.getloadavg()),
        "machine": machine_fingerprint(),
        "log": log.name,
        "commit": commit(),
        "policy_sha256": policy_weights(job),
        **_job_args(job),
    }
    if resume:
        history = checkpoint_history(ckpt)
        entry["resumed_from_iteration"] = max((int(k) for k in (history or {}).get("train", {})), default=0)
    cmd = fit_command(job, out_runs, resume)
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join([str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    _write_json(rd / "attempts.json", [*attempts, {**entry, "pid": proc.pid}])
    _write_json(lock, proc.pid)
    return proc


def last_override(overrides, key: str) -> str | None:
    """The value of the last ``<key>=<value>`` among CLI ``overrides`` (the one the CLI applies); None if none."""
    return next((o.split("=", 1)[1] for o in reversed(overrides) if o.startswith(key + "=")), None)


def policy_weights(job: Job) -> dict[str, str] | None:
    """sha256 of each ``*.safetensors`` file of the directory a job's last ``--model.policy.source``
    override names (relative to the repository root, or absolute), by file name: what the run
    starts from (the llm_sft warm start); None when the source is no such directory (tiny, smollm2)."""
    source = last_override(job.overrides, "--model.policy.source")
    if source is None:
        return None
    path = Path(source) if Path(source).is_absolute() else ROOT / source
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        return None
    return {f.name: file_sha256(str(f)) for f in files}


def rollout_backend(job: Job) -> str:
    """The rollout backend a job's fit uses: its last ``--model.rollout.backend`` override, else its config's."""
    backend = last_override(job.overrides, "--model.rollout.backend")
    if backend is not None:
        return backend
    import yaml

    cfg = yaml.safe_load((ROOT / job.config).read_text()) or {}
    return ((cfg.get("model") or {}).get("rollout") or {}).get("backend", "hf")


def machine_fingerprint() -> dict:
    """What an attempt ran on: host, CPU model, cores, memory, torch and Python versions."""
    import platform

    cpu = next(
        (line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo") if line.startswith("model name")),
        platform.machine(),
    )
    mem = next((line.split()[1] for line in _read_lines("/proc/meminfo") if line.startswith("MemTotal")), None)
    import torch

    return {
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_kb": int(mem) if mem else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _job_args(job: Job) -> dict:
    return {"config": job.config, "overrides": list(job.overrides), "budget": job.budget}


def _check_same_job(job: Job, attempts: list[dict], rd: Path, rebudget: bool = False) -> None:
    """A run folder is resumed or reused only by the job that made it (with ``rebudget``, one that
    differs only in its budget: each attempt keeps its own in attempts.json and the record)."""
    keys = ("config", "overrides") if rebudget else ("config", "overrides", "budget")
    for a in attempts:
        if {k: a.get(k) for k in keys} != {k: _job_args(job)[k] for k in keys}:
            raise RuntimeError(
                f"{job.key}: {rd} was made by attempt {a.get('attempt')} with other arguments "
                f"({ {k: a.get(k) for k in ('config', 'overrides', 'budget')} }); delete the folder or use another --out-runs"
            )


def _end_attempt(rd: Path, rc: int) -> None:
    attempts = _read_json(rd / "attempts.json", [])
    if attempts:
        attempts[-1].update(rc=rc, wall_s=time.time() - attempts[-1]["started"], load_end=list(os.getloadavg()))
        _write_json(rd / "attempts.json", attempts)
    (rd / "running.pid").unlink(missing_ok=True)


def checkpoint_history(path: Path) -> dict | None:
    """The run history inside a ``last.ckpt`` (``_history.history_from_checkpoint``)."""
    from _history import history_from_checkpoint

    from rspo_lightning.checkpointing import load_checkpoint_file

    return history_from_checkpoint(load_checkpoint_file(str(path)))


def run_one(
    job: Job, records, out_runs, threads: int = 1, keep_checkpoints: bool = False, log=print, rebudget: bool = False
) -> dict:
    """Run, resume or skip ``job``; write and return its record.

    Skipped when its record exists; otherwise a finished ``history.json`` (or a ``last.ckpt``
    written after the run's last validation) gives the record without fitting; otherwise the fit
    is resumed from ``last.ckpt`` or started. The run's checkpoints are deleted once the record
    is written, unless ``keep_checkpoints``. ``rebudget``: resume a run started with another
    budget (``--rebudget``; the record's ``budget_changes`` lists every attempt's)."""
    rec_path = record_path(job, records)
    record = _read_json(rec_path)
    if record is not None:
        log(f"skip {job.key}: record {rec_path} exists")
        return record
    rd = run_dir(job, out_runs)
    _check_same_job(job, _read_json(rd / "attempts.json", []), rd, rebudget)
    hist_path, ckpt = rd / "history.json", rd / "checkpoints" / "last.ckpt"
    history = _read_json(hist_path)
    if not (history or {}).get("finished") and ckpt.exists():
        history = checkpoint_history(ckpt)  # the fit may have ended between its last checkpoint and the JSON
        if history and history["finished"]:
            log(f"{job.key}: finished in {ckpt}, no fit needed")
            _write_json(hist_path, history)  # kept after the checkpoints go
    if not (history or {}).get("finished"):
        proc = launch(job, out_runs, threads, rebudget=rebudget)
        log(f"{'resume' if ckpt.exists() else 'start'} {job.key} (pid {proc.pid})")
        rc = proc.wait()
        _end_attempt(rd, rc)
        if rc != 0:
            tail = "".join((rd / _read_json(rd / "attempts.json")[-1]["log"]).read_text().splitlines(True)[-15:])
            raise RuntimeError(f"{job.key} failed (exit {rc}); rerun to resume. End of its log:\n{tail}")
        history = _read_json(hist_path)
        if not (history or {}).get("finished"):
            raise RuntimeError(f"{job.key}: the fit exited without writing {hist_path} (interrupted?); rerun to resume")
    record = _json_safe(build_record(job, history, _read_json(rd / "attempts.json", []), rd))  # as the file holds it
    _write_json(rec_path, record)
    if not keep_checkpoints:
        shutil.rmtree(rd / "checkpoints", ignore_errors=True)
    log(
        f"done {job.key}: {record['iterations']} iterations, {record['env_steps']} env steps, {record['wall_s']:.0f} s; "
        f"final valid_seen {_pts(record['finals']['env_steps']['valid_seen'])} (env steps axis), "
        f"{_pts(record['finals']['a_updates']['valid_seen'])} (A updates axis)"
    )
    return record


def record_validated_apart(job: Job, records, out_runs, iteration: int, validation_path) -> dict:
    """The record of an RSPO run whose fit went past the loop end where the study stops it (the llm
    settings lost that stop before make_job's fix): its history up to ``iteration`` from its
    ``last.ckpt``, and the validation of that agent A made apart (``benchmarks/llm_start.py
    --only policy --extra=--ckpt_path=<a copy of the checkpoint>``, a record with ``valid_seen`` and
    ``valid_unseen`` under ``untrained``). Refused unless every iteration the checkpoint holds past
    ``iteration`` left A unchanged (B's phase: ``rspo/a_iterations`` the same), so the A validated
    is the A of ``iteration``. The record says so under ``validated_apart``."""
    rec_path = record_path(job, records)
    if rec_path.exists():
        raise SystemExit(f"{rec_path} exists: delete it first to rebuild {job.key}'s record")
    rd = run_dir(job, out_runs)
    history = checkpoint_history(rd / "checkpoints" / "last.ckpt")
    train = {int(k): v for k, v in (history or {}).get("train", {}).items()}
    if iteration not in train:
        raise SystemExit(f"{job.key}: its checkpoint holds iterations {sorted(train)}, not {iteration}")
    updates = {i: train[i].get("rspo/a_iterations") for i in train if i >= iteration}
    if updates[iteration] is None or len(set(updates.values())) != 1:
        raise SystemExit(
            f"{job.key}: agent A's updates (rspo/a_iterations) past iteration {iteration} were {updates}: "
            "the checkpoint's A is not that iteration's"
        )
    validation = json.loads(Path(validation_path).read_text())
    scores = validation["untrained"]
    history = {
        **history,
        "train": {str(i): v for i, v in train.items() if i <= iteration},
        "val": {
            str(iteration): {
                "val/success_rate": scores["valid_seen"]["success_rate"],
                "val_unseen/success_rate": scores["valid_unseen"]["success_rate"],
            }
        },
        "finished": True,
        "extra_iterations": max(train) - iteration,
    }
    record = build_record(job, history, _read_json(rd / "attempts.json", []), rd)
    record["wall_s"] += scores.get("wall_s", 0.0)
    record["validated_apart"] = {
        "iteration": iteration,
        "checkpoint_iterations": max(train),
        "validation": str(validation_path),
        "extra": validation.get("extra"),
        "wins": {split: [scores[split]["wins"], scores[split]["n"]] for split in ("valid_seen", "valid_unseen")},
    }
    record = _json_safe(record)
    _write_json(rec_path, record)
    return record


def _pts(x) -> str:
    return "–" if x is None or x != x else f"{x:.3f}"


# -- records ---------------------------------------------------------------------------------
def _num(x) -> float:
    return float("nan") if x is None else float(x)


def curve_of(history: dict) -> list[dict]:
    """The validation points of a run history: step (iteration), env steps, agent-A updates
    (``rspo/a_iterations`` where RSPOLoop logs it, else the iteration), valid_seen, valid_unseen."""
    train = {int(k): v for k, v in history["train"].items()}
    rspo_run = any("rspo/a_iterations" in v for v in train.values())

    def last(tag: str, step: int) -> float:  # the value at `step`, else the last one logged before it
        for s in sorted((s for s in train if s <= step and tag in train[s]), reverse=True):
            return train[s][tag]
        return 0.0

    points = []
    for step in sorted(int(k) for k in history["val"]):
        val = history["val"][str(step)]
        points.append(
            {
                "step": step,
                "env_steps": int(last("rollout/env_steps", step)),
                "a_updates": int(last("rspo/a_iterations", step)) if rspo_run else step,
                "valid_seen": _num(val.get("val/success_rate")),
                "valid_unseen": _num(val.get("val_unseen/success_rate")),
            }
        )
    return points


ENV_SLACK = 0.05  # how far past the env-step budget a validation still counts (a base run's last iteration crosses it)
# a setting whose budget is a few iterations: one iteration's steps (4 groups x 8 episodes x 10 turns) is more than 5 %
# of it, and a base run's last iteration crosses the budget by up to that much
ITERATION_STEPS = {"llm": 320, "llm_r2": 320, "llm_sft": 320}


def distinct_weights(curve: list[dict]) -> list[dict]:
    """The first validation of each agent-A state: during B's phases A does not change, and common
    random numbers make two validations of the same A score alike, so a second one is no new point
    (an RSPO run validated at iterations 21 and 24 with 9 A updates at both counts once, at 21, the
    environment steps it had taken when that A was made)."""
    first: dict[int, dict] = {}
    for p in curve:
        first.setdefault(p["a_updates"], p)
    return [p for p in curve if first[p["a_updates"]] is p]


def finals(curve: list[dict], a_updates: int, env_budget: int | None = None, slack_steps: int = 0) -> dict:
    """Both axes' finals of a validation curve: ``env_steps``: the mean of its last two points at
    most ``env_budget`` + max(``env_budget`` x ENV_SLACK, ``slack_steps``) environment steps in (an RSPO run goes on to the end of
    the loop that crosses the budget, up to a loop's steps past it: those points do not count, so
    RSPO is compared on at most the steps a base run used; None: every point);
    ``a_updates``: the mean of the last two points with at most ``a_updates`` agent-A updates
    (all points if the run has fewer). Both count each agent A once (``distinct_weights``).
    Each: valid_seen, valid_unseen, env_steps and a_updates (at the later point), and the steps
    averaged."""

    def mean_of(points: list[dict]) -> dict:
        if not points:
            return {
                "valid_seen": float("nan"),
                "valid_unseen": float("nan"),
                "env_steps": 0,
                "a_updates": 0,
                "steps": [],
            }
        return {
            "valid_seen": sum(p["valid_seen"] for p in points) / len(points),
            "valid_unseen": sum(p["valid_unseen"] for p in points) / len(points),
            "env_steps": points[-1]["env_steps"],
            "a_updates": points[-1]["a_updates"],
            "steps": [p["step"] for p in points],
        }

    within = distinct_weights([p for p in curve if p["a_updates"] <= a_updates])
    limit = None if env_budget is None else env_budget + max(env_budget * ENV_SLACK, slack_steps)
    spent = distinct_weights([p for p in curve if limit is None or p["env_steps"] <= limit])
    return {
        "env_steps": {**mean_of(spent[-2:]), "env_budget": env_budget},
        "a_updates": {**mean_of(within[-2:]), "a_updates_target": a_updates},
    }


def diagnostics(history: dict) -> dict[str, float]:
    """The mean of each ``DIAGNOSTICS`` tag over the iterations that log it (NaN where none does);
    a tag with ``*`` takes the values of every matching tag; ``late:<tag>`` the last third of the
    iterations that log ``<tag>`` (the paper's "late in training")."""
    out = {}
    steps = [v for _, v in sorted(history["train"].items(), key=lambda kv: int(kv[0]))]
    for key in DIAGNOSTICS.values():
        tag = key.removeprefix("late:")
        per_step = [
            [x for t, x in v.items() if x is not None and (t == tag or ("*" in tag and fnmatch.fnmatchcase(t, tag)))]
            for v in steps
        ]
        per_step = [xs for xs in per_step if xs]
        if key.startswith("late:"):
            per_step = per_step[len(per_step) - math.ceil(len(per_step) / 3) :]
        values = [x for xs in per_step for x in xs]
        out[key] = sum(values) / len(values) if values else float("nan")
    return out


def build_record(
    job: Job, history: dict, attempts: list[dict], rd: Path | None = None, a_updates: int | None = None
) -> dict:
    """A run's record from its history (``_history.RunHistory``) and its attempts."""
    curve = curve_of(history)
    train = {int(k): v for k, v in history["train"].items()}
    last = max(train, default=0)
    walls = []
    for i, a in enumerate(attempts):  # an attempt whose runner was killed has no wall_s
        if a.get("wall_s") is not None:
            walls.append(a["wall_s"])
        elif rd is not None:  # until its log (or, for the last attempt, the history it finished) was last written
            files = [rd / a["log"]] + ([rd / "history.json"] if i == len(attempts) - 1 else [])
            ends = [f.stat().st_mtime for f in files if f.exists()]
            if ends:
                walls.append(max(max(ends) - a["started"], 0.0))
    n = DEFAULT_A_UPDATES.get(job.setting, 9) if a_updates is None else a_updates
    return {
        "setting": job.setting,
        "run": job.run,
        "seed": job.seed,
        "config": job.config,
        "overrides": list(job.overrides),
        "budget": job.budget,
        "iterations": last,
        "env_steps": int(train.get(last, {}).get("rollout/env_steps", 0)),
        "a_updates": curve[-1]["a_updates"] if curve else 0,
        "extra_iterations_after_stop": history.get("extra_iterations", 0),
        "wall_s": sum(walls),
        "attempts": len(attempts),
        "load_start": attempts[0].get("load_start") if attempts else None,
        "load_end": attempts[-1].get("load_end") if attempts else None,
        "commit": attempts[-1].get("commit") if attempts else None,
        "rollout_backend": rollout_backend(job),
        "machines": [a.get("machine") for a in attempts],  # one fingerprint per attempt (None: older records)
        # the start's weights per attempt (policy_weights; None: no weights directory, or older records)
        "policy_sha256": [a.get("policy_sha256") for a in attempts],
        "resumed": [a.get("resumed_from_iteration") for a in attempts if a.get("resumed")],
        # the budget each attempt ran under, where one differs from the record's (--rebudget)
        "budget_changes": [
            {
                "attempt": a.get("attempt"),
                "budget": a.get("budget"),
                "from_iteration": a.get("resumed_from_iteration", 0),
            }
            for a in attempts
        ]
        if any(a.get("budget", job.budget) != job.budget for a in attempts)
        else [],
        "curve": curve,
        "diagnostics": diagnostics(history),
        "finals": finals(curve, n, job.budget, ITERATION_STEPS.get(job.setting, 0)),
    }


def load_records(records) -> list[dict]:
    """Every record under ``records`` (``<setting>/<run>/seed<k>.json``)."""
    out = [json.loads(p.read_text()) for p in sorted(Path(records).glob("*/*/seed*.json"))]
    return sorted(out, key=lambda r: (_order(SETTINGS, r["setting"]), _order(RUNS, r["run"]), r["seed"]))


def _order(known, name: str) -> tuple:
    names = list(known)
    return (names.index(name), "") if name in names else (len(names), name)


# -- summary ---------------------------------------------------------------------------------
def summary_entries(records: list[dict], a_updates: dict[str, int] | None = None) -> list[dict]:
    """One entry per record and axis: the finals, recomputed from the curve (``a_updates``:
    the A-update count of the a_updates axis per setting, default each record's own)."""
    out = []
    for r in records:
        n = (a_updates or {}).get(r["setting"], r["finals"]["a_updates"]["a_updates_target"])
        curve = [
            {**p, "valid_seen": _num(p["valid_seen"]), "valid_unseen": _num(p["valid_unseen"])} for p in r["curve"]
        ]
        f = finals(curve, n, r.get("budget"), ITERATION_STEPS.get(r["setting"], 0))
        for axis in AXES:
            out.append(
                {
                    "setting": r["setting"],
                    "run": r["run"],
                    "seed": r["seed"],
                    "axis": axis,
                    "env_steps": f[axis]["env_steps"],
                    "a_updates": f[axis]["a_updates"],
                    "valid_seen": f[axis]["valid_seen"],
                    "valid_unseen": f[axis]["valid_unseen"],
                }
            )
    return out


def paired(entries: list[dict], setting: str, run: str, axis: str, metric: str, against: str = "grpo") -> list[float]:
    """Per-seed differences ``run - against`` of ``metric`` on the seeds both have."""
    mine = {e["seed"]: e[metric] for e in entries if (e["setting"], e["run"], e["axis"]) == (setting, run, axis)}
    ref = {e["seed"]: e[metric] for e in entries if (e["setting"], e["run"], e["axis"]) == (setting, against, axis)}
    return [mine[s] - ref[s] for s in sorted(mine.keys() & ref.keys())]


def _ms(xs: list[float], signed: bool = False) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "–"
    m, s = mean_std(xs)
    return f"{m:+.3f} ± {s:.3f}" if signed else f"{m:.3f} ± {s:.3f}"


def _shown(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


PAIRED_AGAINST = (("grpo_rspo", "a_updates"), ("grpo_rspo_h", "env_steps"))


def base_of(run: str) -> str | None:
    """The base algorithm an RSPO run is built on (``gigpo_rspo`` -> ``gigpo``), None for a base run."""
    return run.split("_rspo")[0] if "_rspo" in run else None


def per_seed_table(entries: list[dict], against=PAIRED_AGAINST) -> list[str]:
    """valid_seen finals per seed (``env steps axis / A updates axis``), a row per run and a table
    per setting, with each run's paired difference (mean ± std over the shared seeds) from each
    ``(run, axis)`` of ``against``: the paper's RSPO on its own axis (the ablations), RSPO_H at
    equal environment steps (target (1) of issue 21 asks an explorer to beat GRPO and RSPO_H); and
    each RSPO run's difference from its own base algorithm (:func:`base_of`) on both axes."""
    lines = []
    for setting in dict.fromkeys(e["setting"] for e in entries):
        es = [e for e in entries if e["setting"] == setting]
        runs = list(dict.fromkeys(e["run"] for e in es))
        seeds = sorted({e["seed"] for e in es})
        refs = [(r, axis) for r, axis in against if r in runs]
        cell = {(e["run"], e["seed"], e["axis"]): e["valid_seen"] for e in es}
        lines += [
            "",
            f"{setting}: valid_seen finals per seed (env steps axis / A updates axis) and paired differences.",
            "",
            "| run | "
            + " | ".join(f"seed {s}" for s in seeds)
            + "".join(f" | Δ vs {r} ({axis.replace('_', ' ')})" for r, axis in refs)
            + " | Δ vs its base (env steps / A updates) |",
            "|" + "---|" * (2 + len(seeds) + len(refs)),
        ]
        for run in runs:
            row = [
                f"{cell[(run, s, 'env_steps')]:.3f} / {cell[(run, s, 'a_updates')]:.3f}"
                if (run, s, "env_steps") in cell
                else "–"
                for s in seeds
            ]
            for ref, axis in refs:
                d = [] if run == ref else paired(entries, setting, run, axis, "valid_seen", ref)
                row.append(f"{_ms(d, True)} (n={len(d)})" if d else "–")
            b = base_of(run)
            d_env, d_upd = [paired(entries, setting, run, axis, "valid_seen", b) for axis in AXES] if b else ([], [])
            row.append(f"{b}: {_ms(d_env, True)} / {_ms(d_upd, True)} (n={len(d_env)})" if d_env else "–")
            lines.append(f"| {run} | " + " | ".join(row) + " |")
    return lines


def table(
    records: list[dict], entries: list[dict], a_updates: dict[str, int], records_dir="docs/data/rspo_study"
) -> list[str]:
    """The markdown of ``<out>_table.md``."""
    groups = list(dict.fromkeys((r["setting"], r["run"]) for r in records))
    n_by = {s: a_updates.get(s) for s, _ in groups}
    lines = [
        f"<!-- generated by benchmarks/rspo_study.py --summarise-only --records {_shown(records_dir)}; do not edit -->",
        "",
        f"{len(records)} runs. Budgets (environment steps, B's counted): "
        + ", ".join(f"{s} {b}" for s, b in dict.fromkeys((r["setting"], r["budget"]) for r in records))
        + ". "
        "Each final averages the last two validations of distinct agent-A weights (a validation during B's phase "
        "re-measures the A of the loop before and counts once). "
        "Final, axis `env_steps`: within the budget x 1.05 (an RSPO run "
        "goes on to the end of the loop that crosses the budget; those points do not count). Axis `a_updates`: "
        "with at most N agent-A updates ("
        + ", ".join(f"{s}: N = {n}" for s, n in n_by.items())
        + "). Mean ± std over seeds; "
        "Δ = paired difference vs grpo on the same seeds (mean ± std of the per-seed differences, n seeds). "
        "env steps / A updates: mean at the final's later validation.",
        "",
        "| setting | run | axis | seeds | env steps | A updates | valid_seen | valid_unseen | Δ valid_seen | Δ valid_unseen | n |",
        "|" + "---|" * 11,
    ]
    for setting, run in groups:
        for axis in AXES:
            es = [e for e in entries if (e["setting"], e["run"], e["axis"]) == (setting, run, axis)]
            d_seen, d_unseen = (
                paired(entries, setting, run, axis, m) if run != "grpo" else [] for m in ("valid_seen", "valid_unseen")
            )
            lines.append(
                f"| {setting} | {run} | {axis} | {','.join(str(e['seed']) for e in es)} | "
                f"{mean_std([e['env_steps'] for e in es])[0]:.0f} | {mean_std([e['a_updates'] for e in es])[0]:.1f} | "
                f"{_ms([e['valid_seen'] for e in es])} | {_ms([e['valid_unseen'] for e in es])} | "
                f"{_ms(d_seen, True)} | {_ms(d_unseen, True)} | {len(d_seen) or '–'} |"
            )
    lines += per_seed_table(entries)
    cols = list(DIAGNOSTICS)
    lines += [
        "",
        "Diagnostics: mean over seeds of each run's mean over the iterations that log the tag "
        "(" + ", ".join(f"{c} = `{t}`" for c, t in DIAGNOSTICS.items()) + "); – = not logged.",
        "",
        "| setting | run | seeds | wall s | " + " | ".join(cols) + " |",
        "|" + "---|" * (4 + len(cols)),
    ]
    for setting, run in groups:
        rs = [r for r in records if (r["setting"], r["run"]) == (setting, run)]
        diag = []
        for tag in DIAGNOSTICS.values():
            xs = [_num(r["diagnostics"].get(tag)) for r in rs]
            xs = [x for x in xs if x == x]
            diag.append(f"{sum(xs) / len(xs):.3f}" if xs else "–")
        lines.append(
            f"| {setting} | {run} | {len(rs)} | {mean_std([r['wall_s'] for r in rs])[0]:.0f} | "
            + " | ".join(diag)
            + " |"
        )
    return lines


def summarise(
    records_dir, out: str, a_updates: dict[str, int] | None = None, plot: bool = True
) -> tuple[list[dict], list[str]]:
    """Build ``<out>.json``, ``<out>_table.md`` and ``<out>.png`` from the records under
    ``records_dir`` alone; returns the entries and the printed lines (the table plus the
    ``rspo_minus_grpo_<setting>_<axis>`` lines)."""
    records = load_records(records_dir)
    if not records:  # leave the previous outputs alone
        return [], [f"no records under {records_dir}: nothing summarised"]
    n_by = {
        s: (a_updates or {}).get(s, DEFAULT_A_UPDATES.get(s, 9)) for s in dict.fromkeys(r["setting"] for r in records)
    }
    entries = summary_entries(records, n_by)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    _write_json(Path(out + ".json"), entries)
    at_start = matched(records, records_dir)
    lines = table(records, entries, n_by, records_dir) + matched_lines(records, records_dir, at_start)
    Path(out + "_table.md").write_text("\n".join(lines) + "\n")
    settings = list(dict.fromkeys(r["setting"] for r in records))  # records are in SETTINGS order
    if plot:
        panels = []
        for setting in settings:
            rs = [r for r in records if r["setting"] == setting]
            counts = {run: sum(r["run"] == run for r in rs) for run in dict.fromkeys(r["run"] for r in rs)}
            shown = [
                run for run, c in counts.items() if c == max(counts.values(), default=0)
            ]  # the runs with the most seeds
            for axis, label in (("env_steps", "environment steps (B's included)"), ("a_updates", "agent-A updates")):
                curves = {
                    run: [[(p[axis], _num(p["valid_seen"])) for p in r["curve"]] for r in rs if r["run"] == run]
                    for run in shown
                }
                panels.append((f"{setting}: valid_seen vs {label.split(' (')[0]}", label, curves))
        plot_curves(out + ".png", panels, ncols=2)
    summary = []
    for setting in settings:
        has_start = start_of(setting, records_dir) is not None
        for axis in AXES:
            parts = []
            for run in dict.fromkeys(r["run"] for r in records if r["setting"] == setting):
                d = paired(entries, setting, run, axis, "valid_seen") if run != "grpo" else []
                if has_start:  # one validation per run: GRPO at the run's end
                    d = [
                        m["valid_seen"]["diff"]
                        for m in at_start
                        if (m["setting"], m["run"], m["rival"], m["axis"]) == (setting, run, "grpo", axis)
                        and m["valid_seen"]["diff"] == m["valid_seen"]["diff"]
                    ]
                if d:
                    m, s = mean_std(d)
                    parts.append(f"{run} {100 * m:+.1f} ± {100 * s:.1f} (n={len(d)})")
            summary.append(f"rspo_minus_grpo_{setting}_{axis}: " + (", ".join(parts) if parts else "–"))
    return entries, lines + [""] + summary


# -- matched comparison (the llm settings: a start record and one validation per run) ---------------
# the start every run of a setting begins at (benchmarks/llm_start.py's record, in the records folder): each
# curve's point at 0 environment steps and 0 A updates
STARTS = {"llm": "start.json", "llm_r2": "start_r2.json", "llm_sft": "start_sft.json"}
MATCHED = (("grpo_rspo", "grpo"), ("grpo_rspo", "grpo_shaped"), ("grpo_rspo_h", "grpo"), ("grpo_rspo_h", "grpo_shaped"))
SPLITS = ("valid_seen", "valid_unseen")


def interpolate(points: list[tuple[float, float]], x: float) -> float:
    """The piecewise-linear curve through ``points`` (sorted by x) at ``x``; NaN outside them."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[0][1] if points and x == points[0][0] else float("nan")


def val_tasks(record: dict) -> int:
    """Validation tasks per split of a record's run (its last ``--data.num_val_tasks``)."""
    return int(last_override(record["overrides"], "--data.num_val_tasks"))


def start_of(setting: str, records_dir) -> dict | None:
    """``{split: (rate, n)}`` of the setting's start record, None without one."""
    path = Path(records_dir) / STARTS.get(setting, "-")
    if not path.is_file():
        return None
    scores = json.loads(path.read_text())["untrained"]
    return {split: (scores[split]["success_rate"], scores[split]["n"]) for split in SPLITS}


def matched(records: list[dict], records_dir) -> list[dict]:
    """Each RSPO-type run's end against each rival's curve at the same environment steps and at
    the same A updates, seed by seed (``MATCHED``): the rival's curve is its validations with the
    setting's start at 0, linear between them (NaN past its end: no extrapolation)."""
    out = []
    for setting in dict.fromkeys(r["setting"] for r in records):
        start = start_of(setting, records_dir)
        if start is None:
            continue
        by = {(r["run"], r["seed"]): r for r in records if r["setting"] == setting}
        for run, rival in MATCHED:
            for seed in sorted(s for (n, s) in by if n == run and (rival, s) in by):
                end = distinct_weights(by[run, seed]["curve"])[-1]
                rival_curve = distinct_weights(by[rival, seed]["curve"])
                for axis in AXES:
                    row = {"setting": setting, "run": run, "rival": rival, "seed": seed, "axis": axis, "at": end[axis]}
                    for split in SPLITS:
                        points = [(0, start[split][0])] + [(p[axis], p[split]) for p in rival_curve]
                        row[split] = {"run": end[split], "rival": interpolate(points, end[axis])}
                        row[split]["diff"] = row[split]["run"] - row[split]["rival"]
                    out.append(row)
    return out


def matched_lines(records: list[dict], records_dir, at_start: list[dict]) -> list[str]:
    """Markdown: every run's end with its Wilson interval beside the start's (target 1: the end's
    interval above the start's), then ``at_start`` (``matched``'s rows: target 2), per seed and as
    mean ± std."""
    from llm_start import wilson

    def cell(rate: float, n: int) -> str:
        wins = round(rate * n)
        low, high = wilson(wins, n)
        return f"{wins}/{n} = {100 * rate:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"

    lines = []
    for setting in dict.fromkeys(r["setting"] for r in records):
        start = start_of(setting, records_dir)
        if start is None:
            continue
        lines += [
            "",
            f"{setting}: each run's end, 95 % Wilson intervals; above = the interval lies above the start's.",
            "",
            "| run | seed | env steps | A updates | valid_seen | above | valid_unseen | above |",
            "|---|---|---|---|---|---|---|---|",
            f"| start ({STARTS[setting]}) | – | 0 | 0 | {cell(*start['valid_seen'])} | – | {cell(*start['valid_unseen'])} | – |",
        ]
        start_high = {split: wilson(round(rate * n), n)[1] for split, (rate, n) in start.items()}
        for r in (r for r in records if r["setting"] == setting):
            end, n = distinct_weights(r["curve"])[-1], val_tasks(r)
            above = {split: wilson(round(end[split] * n), n)[0] > start_high[split] for split in SPLITS}
            lines.append(
                f"| {r['run']} | {r['seed']} | {end['env_steps']} | {end['a_updates']} | "
                f"{cell(end['valid_seen'], n)} | {'yes' if above['valid_seen'] else 'no'} | "
                f"{cell(end['valid_unseen'], n)} | {'yes' if above['valid_unseen'] else 'no'} |"
            )
        rows = [m for m in at_start if m["setting"] == setting]
        if not rows:
            continue
        lines += [
            "",
            f"{setting}: run - rival in points, the rival's curve (start, its validations) linear at the run's end "
            "(its environment steps, or its A updates); – = past the rival's end.",
            "",
            "| run | rival | axis | per seed: run - rival (at) | valid_seen mean ± std | valid_unseen mean ± std | n |",
            "|---|---|---|---|---|---|---|",
        ]
        for run, rival in MATCHED:
            for axis in AXES:
                group = [m for m in rows if (m["run"], m["rival"], m["axis"]) == (run, rival, axis)]
                if not group:
                    continue
                per_seed = ", ".join(
                    f"s{m['seed']}: {100 * m['valid_seen']['diff']:+.1f} ({m['at']})"
                    if m["valid_seen"]["diff"] == m["valid_seen"]["diff"]
                    else f"s{m['seed']}: – ({m['at']})"
                    for m in group
                )
                ms = {}
                for split in SPLITS:
                    d = [m[split]["diff"] for m in group if m[split]["diff"] == m[split]["diff"]]
                    mean, std = mean_std(d) if d else (float("nan"), float("nan"))
                    ms[split] = "–" if not d else f"{100 * mean:+.1f} ± {100 * std:.1f}"
                n = sum(m["valid_seen"]["diff"] == m["valid_seen"]["diff"] for m in group)
                lines.append(
                    f"| {run} | {rival} | {axis} | {per_seed} | {ms['valid_seen']} | {ms['valid_unseen']} | {n} |"
                )
    return lines


# -- plan ------------------------------------------------------------------------------------
def parse_plan(entries: list[str]) -> list[tuple[str, str, int]]:
    """``SETTING:RUN[,RUN...]:SEEDS`` entries -> (setting, run, seed), seed-major per entry."""
    plan = []
    for entry in entries:
        try:
            setting, runs, seeds = entry.split(":")
            seed_list = parse_seeds(seeds)
        except ValueError:
            raise SystemExit(
                f"--plan entry {entry!r}: expected SETTING:RUN[,RUN...]:SEEDS, e.g. hard:grpo,grpo_rspo:0-4"
            ) from None
        if setting not in SETTINGS:
            raise SystemExit(f"--plan entry {entry!r}: unknown setting {setting!r} (of {list(SETTINGS)})")
        for run in runs.split(","):
            if run not in RUNS:
                raise SystemExit(f"--plan entry {entry!r}: unknown run {run!r} (of {list(RUNS)})")
        plan += [(setting, run, seed) for seed in seed_list for run in runs.split(",")]
    return plan


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--plan", nargs="+", metavar="SETTING:RUNS:SEEDS", help="what to run (replaces --runs/--quick-runs/--ablations)"
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="seeds of --runs and --quick-runs")
    p.add_argument("--runs", nargs="*", default=MAIN, help=f"hard-setting runs, --seeds (of {list(RUNS)})")
    p.add_argument("--quick-runs", nargs="*", default=QUICK_MAIN, help="quickstart-setting runs, --seeds")
    p.add_argument(
        "--ablations",
        nargs="*",
        default=ABLATIONS,
        help="hard-setting runs, --ablation-seeds (default: every ablation)",
    )
    p.add_argument("--ablation-seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--budget", type=int, default=40000, help="environment steps per run (hard setting)")
    p.add_argument("--quick-budget", type=int, default=15000, help="environment steps per run (quickstart setting)")
    p.add_argument("--a-updates", type=int, default=9, help="agent-A updates of the a_updates axis (hard setting)")
    p.add_argument(
        "--quick-a-updates", type=int, default=None, help="the same for the quickstart setting (default: --a-updates)"
    )
    p.add_argument("--val-tasks", type=int, default=128, help="validation tasks per split")
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="=--KEY=VALUE",
        help="one more fit override for every run, e.g. --extra=--data.groups_per_iteration=2 (repeatable; smoke tests)",
    )
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (OMP/MKL_NUM_THREADS)")
    p.add_argument("--out-runs", default="runs/rspo_study", help="run folders: checkpoints, history, TensorBoard, logs")
    p.add_argument("--records", default="docs/data/rspo_study", help="one JSON record per run")
    p.add_argument("--out", default="docs/rspo_study", help="summary prefix: <out>.json, <out>_table.md, <out>.png")
    p.add_argument(
        "--keep-checkpoints", action="store_true", help="keep a run's checkpoints after its record is written"
    )
    p.add_argument("--summarise-only", action="store_true", help="run nothing: summarise the records")
    p.add_argument(
        "--validated-apart",
        nargs=2,
        metavar=("ITERATION", "VALIDATION_JSON"),
        help="write the one planned RSPO run's record from its checkpoint's history up to ITERATION and A's "
        "validation made apart (record_validated_apart); fit nothing",
    )
    p.add_argument("--dry-run", action="store_true", help="print each planned run's state and command; run nothing")
    p.add_argument(
        "--rebudget",
        action="store_true",
        help="resume runs started with another --budget; the change is disclosed in the record (budget_changes)",
    )
    args = p.parse_args(argv)
    quick_a = args.a_updates if args.quick_a_updates is None else args.quick_a_updates
    DEFAULT_A_UPDATES.update({s: quick_a if s in QUICK_SETTINGS else args.a_updates for s in SETTINGS})

    if args.plan:
        plan = parse_plan(args.plan)
    else:
        unknown = [n for n in [*args.runs, *args.quick_runs, *args.ablations] if n not in RUNS]
        if unknown:
            raise SystemExit(f"unknown runs {unknown} (of {list(RUNS)})")
        plan = [("hard", n, s) for s in args.seeds for n in args.runs]
        plan += [("quickstart", n, s) for s in args.seeds for n in args.quick_runs]
        plan += [("hard", n, s) for s in args.ablation_seeds for n in args.ablations]
    budgets = {s: args.quick_budget if s in QUICK_SETTINGS else args.budget for s in SETTINGS}
    jobs = list(dict.fromkeys(make_job(st, n, s, budgets[st], args.val_tasks, tuple(args.extra)) for st, n, s in plan))

    failed = []
    if args.validated_apart:
        if len(jobs) != 1:
            raise SystemExit(f"--validated-apart takes one planned run, not {len(jobs)}")
        record = record_validated_apart(
            jobs[0], args.records, args.out_runs, int(args.validated_apart[0]), args.validated_apart[1]
        )
        print(
            f"{jobs[0].key}: {record['iterations']} iterations, {record['env_steps']} env steps, finals {record['finals']}"
        )
        return
    if args.dry_run:
        for job in jobs:
            rd = run_dir(job, args.out_runs)
            state = (
                "record exists"
                if record_path(job, args.records).exists()
                else "resume"
                if (rd / "checkpoints" / "last.ckpt").exists()
                else "start"
            )
            print(f"{job.key}: {state}\n  " + " ".join(fit_command(job, args.out_runs, state == "resume")))
        return
    if not args.summarise_only:
        t0 = time.time()
        todo = [j for j in jobs if not record_path(j, args.records).exists()]
        print(
            f"{len(jobs)} runs planned, {len(jobs) - len(todo)} with a record already; running {len(todo)}, {args.jobs} at a time",
            flush=True,
        )
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = {
                pool.submit(
                    run_one,
                    j,
                    args.records,
                    args.out_runs,
                    args.threads,
                    args.keep_checkpoints,
                    lambda m: print(m, flush=True),
                    args.rebudget,
                ): j
                for j in todo
            }
            for fut in as_completed(futures):
                if fut.exception() is not None:
                    failed.append(futures[fut].key)
                    print(f"FAILED {futures[fut].key}: {fut.exception()}", flush=True)
        print(f"wall time of the runs: {time.time() - t0:.0f} s", flush=True)
    _, lines = summarise(args.records, args.out, dict(DEFAULT_A_UPDATES))
    print("\n".join(lines))
    if failed:
        print(f"{len(failed)} runs failed (rerun to resume them): {' '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
