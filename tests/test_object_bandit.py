"""benchmarks/object_bandit.py: its choice states are the object decisions the quickstart's
policy makes, and both learners run."""

import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import object_bandit as ob  # noqa: E402

from rspo_lightning.language_model import TinyModelConfig, load_policy  # noqa: E402
from rspo_lightning.prompts import template_texts  # noqa: E402
from rspo_lightning.rollout import RolloutConfig  # noqa: E402


def test_choice_states_hold_the_target_among_the_allowed_objects():
    env = ob.quickstart_env()
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    rollout = RolloutConfig(**cfg["model"]["rollout"])
    _, tok = load_policy("tiny", tiny=TinyModelConfig(**cfg["model"]["policy"]["tiny"]),
                         corpus=env.sample_texts() + template_texts() + [rollout.system_prompt])  # fmt: skip
    # valid_seen task 1: "put some cup on diningtable."; cup 1 and egg 1 on bed 1 (the grounding test's task)
    (state,) = ob.choice_states(env, tok, rollout, "valid_seen", [1])
    prompt, target, allowed = state
    assert tok.convert_ids_to_tokens(prompt[-2:]) == ["<action>", "take"]
    assert tok.convert_ids_to_tokens([target]) == ["cup"]
    assert sorted(tok.convert_ids_to_tokens(allowed)) == ["cup", "egg"]
    text = tok.decode(prompt)
    assert "Task : put some cup on diningtable ." in text and "take egg 1 from bed 1" in text  # decoded: words spaced
    states = ob.choice_states(env, tok, rollout, "valid_seen", range(32))
    assert 8 < len(states) < 32 and all(t in a and len(a) >= 2 for _, t, a in states)


def test_both_learners_run_and_count_decisions(capsys):
    torch.manual_seed(0)
    for mode in ("supervised", "pg"):
        ob.main(["--mode", mode, "--train-tasks", "64", "--max-decisions", "64", "--states", "8", "--eval-every", "1"])
    out = capsys.readouterr().out
    assert out.count("seed 0") == 2 and "decisions -> held-out accuracy 0: " in out
