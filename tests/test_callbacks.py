"""TranscriptLogger: episodes rendered as Markdown that TensorBoard shows as written."""

import os

import torch

from rspo_lightning.callbacks import TranscriptLogger, render_transcript
from rspo_lightning.types import TaskSpec, Trajectory, Turn


def _traj(observation, action):
    turn = Turn(
        prompt_ids=torch.tensor([1, 2]),
        response_ids=torch.tensor([3]),
        behaviour_logprobs=torch.tensor([-0.1]),
        action=action,
        valid=False,
        observation=observation,
        anchor="a",
    )
    return Trajectory(task=TaskSpec("rspo/Household-v0", "train", 7), turns=[turn], task_type="pick_and_place")


def test_transcript_renders_in_tensorboard_as_text():
    """TensorBoard's own Markdown renderer shows model and env text literally: ``<action>`` as
    text (one level of escaping in the HTML), no markup executed, nothing escaped twice."""
    from tensorboard.plugin_util import markdown_to_safe_html

    response_action = "<action> search[red ```shoe``` & more] </action>"
    md = render_transcript(_traj("<script>alert(1)</script> You see a desk.", response_action))
    html = markdown_to_safe_html(md)
    assert "&lt;action&gt; search[red ```shoe``` &amp; more] &lt;/action&gt;" in html  # shown as typed, fences kept
    assert "&lt;script&gt;alert(1)&lt;/script&gt; You see a desk." in html
    assert "<script>" not in html and "&amp;lt;" not in html and "&amp;amp;" not in html
    assert "train/7" in html and "INVALID" in html


def test_long_text_is_truncated():
    md = render_transcript(_traj("x" * 50_000, "go"), max_chars=100)
    assert "x" * 101 not in md and "[...]" in md


class _Experiment:
    def __init__(self):
        self.texts = []

    def add_text(self, tag, text, global_step):
        self.texts.append((tag, global_step))


class _Logger:
    def __init__(self):
        self.experiment = _Experiment()


class _Trainer:
    global_rank = 0
    global_step = 0

    def __init__(self):
        self.logger = _Logger()


class _Module:
    tokenizer = None

    def __init__(self, iteration, trajs):
        self.iteration = iteration
        self.last_trajectories = trajs


def test_writes_every_n_iterations_successes_first():
    cb = TranscriptLogger(every_n_iterations=2, num_episodes=1)
    trainer = _Trainer()
    ok, bad = _traj("o", "a"), _traj("o", "b")
    ok.success = True
    for it in range(1, 6):
        cb.on_train_batch_end(trainer, _Module(it, [bad, ok]), None, None, it)
    assert trainer.logger.experiment.texts == [
        ("transcripts/episode_0", 1),
        ("transcripts/episode_0", 3),
        ("transcripts/episode_0", 5),
    ]


def test_a_fit_with_csvlogger_writes_every_series_and_transcripts_as_files(tmp_path):
    """``--trainer.logger CSVLogger``: metrics.csv holds the rollout/*, train/*, rspo/* and val/*
    series, one row per RL iteration, and transcripts go to Markdown files in the run folder."""
    import csv

    from rspo_lightning.cli import main

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    main(
        [
            "fit",
            "--config",
            os.path.join(root, "configs", "compare", "grpo_rspo.yaml"),
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.logger.init_args.name=csv",
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_epochs=1",
            "--trainer.callbacks.k=1",
            "--data.iterations_per_epoch=3",
            "--data.groups_per_iteration=2",
            "--data.group_size=4",
            "--data.num_val_tasks=2",
            "--transcripts.every_n_iterations=1",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
            "--model.policy.tiny.hidden_size=32",
            "--model.policy.tiny.intermediate_size=64",
            "--model.policy.tiny.num_layers=1",
            # train/* is logged only by an iteration with a non-zero advantage: two receptacles and
            # 8 steps let the untrained policy take the target (B's dense signal) on every seed
            # tried (0-2), where 4 receptacles, 4 steps and groups of 2 trained nothing on seeds 1-2
            "--data.env.kwargs.num_receptacles=2",
            "--data.env.kwargs.max_steps=8",
        ]
    )
    run = tmp_path / "csv" / "version_0"
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    keys = {k for r in rows for k, v in r.items() if v != ""}
    for key in (
        "rollout/success_rate",
        "train/policy_loss",
        "rspo/phase",
        "rspo/buffer_size",
        "val/success_rate",
        "val_unseen/success_rate",
        "rollout_b0/success_rate",
        "rollout_collect/progress",
    ):
        assert key in keys, key
    phases = [float(r["rspo/phase"]) for r in rows if r.get("rspo/phase")]
    assert phases == [0.0, 1.0, 2.0]  # one point per iteration: explore, collect, exploit
    transcripts = sorted(os.listdir(run / "transcripts"))
    assert transcripts and all(t.endswith(".md") for t in transcripts)
    assert "**task**" in (run / "transcripts" / transcripts[0]).read_text()
