import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))

EASY_ENV = {"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 6}


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    """A tiny Llama + word-level tokenizer trained on Household text (session-wide)."""
    from rspo_lightning.envs import make_env
    from rspo_lightning.policy import TinyModelConfig, load_policy
    from rspo_lightning.prompts import template_texts

    env = make_env("rspo/Household-v0", **EASY_ENV)
    corpus = env.unwrapped.sample_texts() + template_texts()
    model, tok = load_policy("tiny", corpus=corpus, tiny=TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128),
                             save_dir=str(tmp_path_factory.mktemp("tiny")))
    return model, tok
