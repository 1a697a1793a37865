"""benchmarks/llm_speed.py's FLOP arithmetic against a hand count on a tiny Llama."""

import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import llm_speed  # noqa: E402


def test_param_split_counts_a_tiny_llama_by_hand():
    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=12,
        intermediate_size=20,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    # by hand, per layer: q 12x12 = 144, k and v 12x6 = 72 each (2 of 4 heads of width 3), o 144,
    # MLP 3 x 12 x 20 = 720, two norms 24: 1176; two layers + the final norm 12 = 2364
    body, head = llm_speed.llama_param_split(100, 12, 20, 2, 4, 2)
    assert (body, head) == (2364, 1200)
    # the model agrees: every weight but the (tied) embedding is the body
    embedding = model.get_input_embeddings().weight.numel()
    assert sum(p.numel() for p in model.parameters()) - embedding == body
    assert embedding == head


def test_stage_flops_by_hand():
    f = llm_speed.stage_flops(
        1000, 100, prompt_tokens=50, generated_tokens=10, update_tokens=60, update_response_tokens=10, lora=False
    )
    # rollout: 2 x 1000 x (50 + 10) + 2 x 100 x 10 = 122,000; update: 6 x (1000 x 60 + 100 x 10) = 366,000
    assert f == {"rollout": 122_000.0, "update": 366_000.0}
    lora = llm_speed.stage_flops(
        1000, 100, prompt_tokens=50, generated_tokens=10, update_tokens=60, update_response_tokens=10, lora=True
    )
    assert lora["update"] == 4 * 61_000 and lora["rollout"] == 122_000.0


def test_smollm2_split_matches_its_parameter_count():
    # SmolLM2-135M-Instruct: 134,515,008 parameters (counted from the loaded model), embedding tied
    body, head = llm_speed.llama_param_split(49152, 576, 1536, 30, 9, 3)
    assert body + head == 134_515_008


def test_wilson_interval_by_hand():
    import llm_start

    # 0 of 256: centre z²/2n / (1 + z²/n), half the same; upper = 3.8416/256 / (1 + 3.8416/256) = 0.014784
    low, high = llm_start.wilson(0, 256)
    assert low == 0.0 and high == pytest.approx(3.8416 / 256 / (1 + 3.8416 / 256), rel=1e-6)
    # 128 of 256: 0.5 ± 1.96 sqrt(0.25/256 + 3.8416/4/256²) / (1 + 3.8416/256)
    low, high = llm_start.wilson(128, 256)
    half = 1.96 * (0.25 / 256 + 3.8416 / 4 / 256**2) ** 0.5 / (1 + 3.8416 / 256)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half))
