"""TranscriptLogger renders episodes with every model/env text escaped."""

import torch

from rspo_lightning.callbacks import TranscriptLogger, render_transcript
from rspo_lightning.types import TaskSpec, Trajectory, Turn


def _traj(observation, action):
    turn = Turn(prompt_ids=torch.tensor([1, 2]), response_ids=torch.tensor([3]), behaviour_logprobs=torch.tensor([-0.1]),
                action=action, valid=False, observation=observation, anchor="a")
    return Trajectory(task=TaskSpec("rspo/Household-v0", "train", 7), turns=[turn], task_type="pick_and_place")


def test_markup_from_the_model_or_env_is_escaped():
    md = render_transcript(_traj("<script>alert(1)</script>", "<img src=x onerror=alert(1)>"))
    assert "<script>" not in md and "<img" not in md
    assert "&lt;script&gt;" in md and "&lt;img src=x onerror=alert(1)&gt;" in md
    assert "train/7" in md and "INVALID" in md


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
    assert trainer.logger.experiment.texts == [("transcripts/episode_0", 1), ("transcripts/episode_0", 3), ("transcripts/episode_0", 5)]
