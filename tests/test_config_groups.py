"""Nested config groups given as plain dicts from Python (rspo_lightning/config.py)."""

from __future__ import annotations

import pytest

from rspo_lightning.config import AlgorithmConfig, LoraSettings, PolicyConfig, SwapConfig
from rspo_lightning.language_model import TinyModelConfig


def test_tiny_dict_becomes_a_tiny_model_config_with_defaults_for_the_rest():
    policy = PolicyConfig(tiny={"hidden_size": 64, "num_heads": 2})
    assert policy.tiny == TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256, max_position_embeddings=1024, seed=0
    )


def test_lora_dict_becomes_lora_settings_and_none_stays_none():
    assert PolicyConfig(lora={"r": 4, "alpha": 8}).lora == LoraSettings(
        r=4, alpha=8, dropout=0.0, target_modules="all-linear"
    )
    assert PolicyConfig().lora is None


def test_swap_dict_becomes_a_swap_config_and_is_validated():
    assert AlgorithmConfig(swap={"coef": 0.5, "strategy": "bucket"}).swap == SwapConfig(
        coef=0.5, strategy="bucket", num_partners=1, beta_s=1.0, p_swap=1.0, warmup_iterations=0
    )
    with pytest.raises(ValueError, match=r"algorithm.swap.coef must be >= 0 \(0 = off\), got -1"):
        AlgorithmConfig(swap={"coef": -1})


def test_instances_pass_through_unchanged():
    tiny, lora, swap = TinyModelConfig(hidden_size=32), LoraSettings(r=2), SwapConfig(coef=1.0)
    policy = PolicyConfig(tiny=tiny, lora=lora)
    assert policy.tiny is tiny and policy.lora is lora
    assert AlgorithmConfig(swap=swap).swap is swap


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: PolicyConfig(tiny={"hiden_size": 64}),
            "policy.tiny: unknown key 'hiden_size' (did you mean 'hidden_size'?); TinyModelConfig accepts "
            "['hidden_size', 'num_layers', 'num_heads', 'intermediate_size', 'max_position_embeddings', 'seed', 'tie_embeddings', 'copy_init']",
        ),
        (
            lambda: PolicyConfig(lora={"rank": 8}),
            "policy.lora: unknown key 'rank'; LoraSettings accepts ['r', 'alpha', 'dropout', 'target_modules']",
        ),
        (
            lambda: AlgorithmConfig(swap={"coeff": 0.1}),
            "algorithm.swap: unknown key 'coeff' (did you mean 'coef'?); SwapConfig accepts "
            "['coef', 'strategy', 'num_partners', 'beta_s', 'p_swap', 'warmup_iterations']",
        ),
    ],
    ids=["tiny", "lora", "swap"],
)
def test_unknown_key_names_it_the_nearest_and_the_fields(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == message


def test_a_value_that_is_neither_names_the_type():
    with pytest.raises(TypeError, match=r"policy.tiny must be a TinyModelConfig or a dict of its fields, got int 128"):
        PolicyConfig(tiny=128)


def test_unknown_estimator_kwargs_key_fails_at_startup_naming_the_accepted_ones():
    with pytest.raises(ValueError) as err:
        AlgorithmConfig(estimator="a2tgpo", estimator_kwargs={"epsilon": 0.2})
    assert str(err.value) == (
        "algorithm.estimator_kwargs: unknown key 'epsilon' for a2tgpo; it accepts "
        "['adaptive_clip', 'beta', 'delta', 'gamma', 'kappa', 'norm', 'turn_group_size']"
    )
    with pytest.raises(
        ValueError, match=r"unknown key 'lambda' for gae \(did you mean 'lam'\?\); it accepts \['gamma', 'lam'\]"
    ):
        AlgorithmConfig(estimator="gae", estimator_kwargs={"lambda": 0.95})
    with pytest.raises(ValueError, match="key 'anchors' for gigpo is supplied by the module"):
        AlgorithmConfig(estimator="gigpo", estimator_kwargs={"anchors": ["s"]})
    assert (
        AlgorithmConfig(estimator="a2tgpo", estimator_kwargs={"kappa": 0.5, "adaptive_clip": "signal"}).estimator
        == "a2tgpo"
    )


def test_penalty_at_defaults_to_the_advantage_and_is_validated():
    assert AlgorithmConfig().penalty_at == "advantage"
    assert AlgorithmConfig(penalty_at="reward").penalty_at == "reward"
    with pytest.raises(
        ValueError, match=r"algorithm.penalty_at must be one of \['advantage', 'reward'\] .*, got 'score'"
    ):
        AlgorithmConfig(penalty_at="score")


def test_known_and_group_relative_estimators_come_from_the_registry():
    from rspo_lightning.config import GROUP_RELATIVE, KNOWN_ESTIMATORS

    assert KNOWN_ESTIMATORS == {"grpo", "rloo", "gae", "gigpo", "proxmo", "a2tgpo", "turn_return"}
    assert GROUP_RELATIVE == KNOWN_ESTIMATORS - {"gae"}
