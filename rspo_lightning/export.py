"""``rspo-lightning export``: agent A of a training checkpoint as a Hugging Face directory.

    rspo-lightning export --ckpt_path runs/quickstart/checkpoints/last.ckpt --out exported/
    python -c "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained('exported')"

What is written (``export``): ``config.json``, ``model.safetensors`` (sharded above
``--max_shard_size``), the tokenizer files with its chat template, ``generation_config.json`` and
``rspo_export.json`` (the source checkpoint and its SHA-256, the iteration, the estimator, whether
RSPO was active and which agent was exported, the package version). The policy is always agent A:
a checkpoint written during RSPO's B phase holds B's weights and A's snapshot in the RSPOLoop
state, and A's are written. LoRA is merged into the base weights by default
(``--adapter_only``: the peft adapter, ``adapter_config.json`` + ``adapter_model.safetensors``,
naming its base model).

Checkpoints of every strategy we ship load on one CPU process, without the ranks that wrote them:
a single file (one process, ``ddp``, FSDP1 with a full state dict) goes through the checked loader
(``checkpointing.load_checkpoint_file``: size, checksum, ``weights_only``); a distributed
checkpoint folder (FSDP2 ``ModelParallelStrategy``, FSDP1 sharded state dict: ``*.distcp`` +
``meta.pt``) is read with ``torch.distributed.checkpoint`` without a process group, and only the
model's tensors are read (not the optimizer's), so the host holds the model about twice (the
module built from the checkpoint's hyper-parameters, and the tensors read into it).

The module is rebuilt from the checkpoint's hyper-parameters (``save_hyperparameters``), so the
tiny model's word-level tokenizer is rebuilt from the same env texts; ``--config C`` (a config
file of the run, e.g. its saved ``config.yaml``) replaces them where the checkpoint has none or a
model source that no longer exists.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from rspo_lightning.checkpointing import CheckpointError, file_sha256, load_checkpoint_file
from rspo_lightning.runfiles import file_error_message, remove_stale_temps

EXPORT_META = "rspo_export.json"


def _sha256(path: Path) -> str:
    """SHA-256 of a checkpoint file, or of a folder's files (their names and their own sums)."""
    if not path.is_dir():
        return file_sha256(str(path))
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)} {file_sha256(str(f))}\n".encode())
    return h.hexdigest()


def _read_distributed(path: Path, into: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """A distributed checkpoint folder: ``meta.pt`` (everything but model and optimizer) plus the
    model's tensors, read from the shards without a process group: into the tensors of ``into``
    (a module's state dict: no second copy) where given, else into new ones."""
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    checkpoint = _read_meta(path)
    try:
        reader = FileSystemReader(str(path))
        metadata = reader.read_metadata()
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint folder {path} cannot be read ({type(exc).__name__}: {str(exc)[:200]}); "
            "it is truncated or corrupted"
        ) from None
    # the model's entries: "state_dict.*" (ModelParallelStrategy, FSDP2) or "model.*" (FSDPStrategy, sharded)
    root = next(
        (r for r in ("state_dict", "model") if any(k.startswith(r + ".") for k in metadata.state_dict_metadata)), None
    )
    wrappers = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")  # FSDP1 / activation-checkpoint wrapper names
    tensors = {}
    for key, md in metadata.state_dict_metadata.items():
        if root is not None and key.startswith(root + ".") and isinstance(md, TensorStorageMetadata):
            name = key.removeprefix(root + ".")
            if into is None:
                tensors[name] = torch.empty(md.size, dtype=md.properties.dtype)
            elif _strip(name, wrappers) in into:
                tensors[name] = into[_strip(name, wrappers)]
    if not tensors:
        raise CheckpointError(
            f"checkpoint folder {path} holds no model tensors (no 'state_dict.*' or 'model.*' entries)"
        )
    state = {root: tensors}
    load(state, storage_reader=reader, no_dist=True)
    checkpoint["state_dict"] = {_strip(k, wrappers): v for k, v in state[root].items()}
    return checkpoint


def _read_meta(path: Path) -> dict[str, Any]:
    """``meta.pt`` of a distributed checkpoint folder (hyper-parameters, callbacks, counters)."""
    if not (path / "meta.pt").is_file():
        raise CheckpointError(
            f"checkpoint folder {path} has no meta.pt: not a Lightning distributed checkpoint "
            "(FSDP2 / FSDP1 sharded); pass the folder Lightning wrote, e.g. <run>/checkpoints/last.ckpt"
        )
    try:
        return torch.load(path / "meta.pt", map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint folder {path}: meta.pt cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None


def _strip(key: str, parts: tuple[str, ...]) -> str:
    for part in parts:
        key = key.replace(part, "")
    return key


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """A training checkpoint as one dict (``state_dict``, ``hyper_parameters``, ``callbacks``, ...)
    whatever strategy wrote it; every failure is a ``CheckpointError`` naming the path."""
    p = Path(path)
    if p.is_dir():
        return _read_distributed(p)
    return load_checkpoint_file(
        str(p), map_location="cpu", weights_only=True, mmap=True
    )  # the optimizer's states stay on disk


def _build_module(checkpoint: dict, config: str | None):
    """``AgentRLModule`` from its constructor arguments, parsed and instantiated as the CLI does: the checkpoint's
    hyper-parameters (the CLI saves them as plain values, a Python run as config dataclasses),
    with a config file's ``model:`` section (and its ``data.env``) in their place when given."""
    import dataclasses
    import inspect

    import yaml
    from jsonargparse import ArgumentParser

    from rspo_lightning.module import AgentRLModule

    accepted = set(inspect.signature(AgentRLModule.__init__).parameters) - {
        "self",
        "dense_reward",
    }  # no reward source needed

    def plain(value):
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value

    values = {
        k: plain(v) for k, v in (checkpoint.get("hyper_parameters") or {}).items() if k in accepted
    }  # e.g. not "_instantiator"
    if config is not None:
        with open(config) as f:
            raw = yaml.safe_load(f) or {}
        values = {k: v for k, v in dict(raw.get("model") or {}).items() if k in accepted}
        env = (raw.get("data") or {}).get("env")
        if env is not None and values.get("env") is None:
            values["env"] = env
    if "policy" not in values:
        raise CheckpointError(
            "the checkpoint has no model hyper-parameters (not written by AgentRLModule?); "
            "pass the run's config: rspo-lightning export --ckpt_path ... --config <run>/config.yaml"
        )
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(AgentRLModule, "model", skip={"dense_reward"})
    return parser.instantiate_classes(parser.parse_object({"model": values}))["model"]


def agent_a_module(ckpt_path: str, config: str | None = None):
    """``AgentRLModule`` built from the checkpoint with agent A's weights, the checkpoint, and
    whether A's weights were taken from an RSPO snapshot (the checkpoint was written in B's
    phase). A file is memory-mapped; a folder's shards are read into the module's own tensors."""
    from rspo_lightning.rspo.snapshot import agent_a_into_checkpoint

    path = Path(ckpt_path)
    checkpoint = _read_meta(path) if path.is_dir() else read_checkpoint(path)
    module = _build_module(checkpoint, config)
    module.configure_model()
    if path.is_dir():
        checkpoint = _read_distributed(path, into=module.state_dict())
    from_snapshot = any(
        isinstance(s, dict) and s.get("snapshot") is not None for s in (checkpoint.get("callbacks") or {}).values()
    )
    agent_a_into_checkpoint(module, checkpoint)  # no trainer: A's snapshot replaces B's weights
    missing, unexpected = module.load_state_dict(checkpoint["state_dict"], strict=False)
    policy_missing = [k for k in missing if k.startswith("policy.")]
    if policy_missing or unexpected:
        raise CheckpointError(
            f"the checkpoint's weights do not fit the model its hyper-parameters build: missing "
            f"{policy_missing[:5]}, unexpected {list(unexpected)[:5]}; pass the run's --config"
        )
    return module, checkpoint, from_snapshot


def check_replaceable(target: Path, ckpt_path: str, overwrite: bool) -> None:
    """Refuse an ``--out`` that exists, unless ``overwrite`` and it holds an earlier export
    (``rspo_export.json``) and no checkpoint: ``--overwrite`` never deletes a run."""
    if not target.exists() and not target.is_symlink():
        return
    if not overwrite:
        raise FileExistsError(
            f"export: {target} exists; pass --overwrite to replace an earlier export, or another --out"
        )
    if not target.is_dir() or target.is_symlink():
        raise FileExistsError(
            f"export --overwrite: {target} is a file, not an earlier export folder; remove it yourself or choose another --out"
        )
    ckpt = Path(ckpt_path).resolve()
    if ckpt == target.resolve() or target.resolve() in ckpt.parents:
        raise FileExistsError(
            f"export --overwrite: {target} holds the checkpoint being exported ({ckpt_path}); choose another --out"
        )
    checkpoints = sorted(str(p.relative_to(target)) for p in target.rglob("*.ckpt"))
    if checkpoints:
        raise FileExistsError(
            f"export --overwrite: {target} holds checkpoints ({', '.join(checkpoints[:3])}"
            f"{', ...' if len(checkpoints) > 3 else ''}): it is a run, not an earlier export; choose another --out"
        )
    if not (target / EXPORT_META).is_file() and any(target.iterdir()):
        held = sorted(p.name for p in target.iterdir())
        raise FileExistsError(
            f"export --overwrite: {target} is not an earlier export (no {EXPORT_META}; it holds "
            f"{', '.join(held[:5]) or 'nothing'}{', ...' if len(held) > 5 else ''}); remove it yourself or choose another --out"
        )


def export(
    ckpt_path: str,
    out: str,
    config: str | None = None,
    adapter_only: bool = False,
    max_shard_size: str = "2GB",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write agent A of ``ckpt_path`` as a Hugging Face directory ``out`` (module docstring);
    returns the metadata written to ``rspo_export.json``. The directory appears whole or not at
    all: it is written next to ``out`` and renamed."""
    import rspo_lightning

    target = Path(out)
    check_replaceable(target, ckpt_path, overwrite)
    remove_stale_temps(str(target.with_name(f".{glob.escape(target.name)}.tmp-*")))  # of killed exports
    module, checkpoint, from_snapshot = agent_a_module(ckpt_path, config)
    policy, tokenizer = module.policy, module.tokenizer
    lora = module.policy_cfg.lora is not None
    if adapter_only and not lora:
        raise ValueError(
            "export --adapter_only: this run has no LoRA adapter (model.policy.lora is unset); drop the flag"
        )
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if lora and not adapter_only:
            policy = policy.merge_and_unload()  # the module is ours alone here: merging in place is fine
        if adapter_only:
            policy.save_pretrained(str(tmp))
            config_file = tmp / "adapter_config.json"
            adapter = json.loads(config_file.read_text())
            adapter["base_model_name_or_path"] = module.policy_cfg.source
            config_file.write_text(json.dumps(adapter, indent=2) + "\n")
        else:
            policy.save_pretrained(str(tmp), max_shard_size=max_shard_size, safe_serialization=True)
            if not (tmp / "config.json").is_file():  # transformers writes nothing on a non-zero rank
                raise RuntimeError("export: transformers wrote no config.json (is torch.distributed initialised?)")
        tokenizer.save_pretrained(str(tmp))
        if getattr(policy, "generation_config", None) is not None:
            policy.generation_config.save_pretrained(str(tmp))
        rspo_state = [
            s for s in (checkpoint.get("callbacks") or {}).values() if isinstance(s, dict) and "snapshot" in s
        ]
        meta = {
            "source_checkpoint": os.path.abspath(ckpt_path),
            "source_sha256": _sha256(Path(ckpt_path)),
            "iteration": int(checkpoint.get("rspo_iteration", 0)),
            "agent": "A",
            "taken_from_rspo_snapshot": from_snapshot,
            "rspo": bool(rspo_state),
            "estimator": module.algo.estimator,
            "policy_source": module.policy_cfg.source,
            "lora": "adapter" if adapter_only else ("merged" if lora else None),
            "package_version": getattr(rspo_lightning, "__version__", "unknown"),
        }
        (tmp / EXPORT_META).write_text(json.dumps(meta, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


SUMMARY = "Write agent A of a training checkpoint (any strategy's) as a Hugging Face directory"


def parser() -> argparse.ArgumentParser:
    """``rspo-lightning export``'s parser (every flag documented in its ``--help``)."""
    parser = argparse.ArgumentParser(
        prog="rspo-lightning export",
        description=f"{SUMMARY}: config.json, model.safetensors, tokenizer with chat template, "
        "generation_config.json, rspo_export.json.",
    )
    parser.add_argument(
        "--ckpt_path",
        required=True,
        help="a checkpoint file, or a distributed checkpoint folder (FSDP2 / FSDP1 sharded)",
    )
    parser.add_argument(
        "--out", required=True, help="the directory to write (refused if it exists, unless --overwrite)"
    )
    parser.add_argument(
        "--config",
        default=None,
        help="the run's config (e.g. its saved config.yaml) where the checkpoint alone is not enough",
    )
    parser.add_argument(
        "--adapter_only", action="store_true", help="write the LoRA adapter (peft format) instead of merged weights"
    )
    parser.add_argument("--max_shard_size", default="2GB", help="largest safetensors shard (default 2GB)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        meta = export(
            args.ckpt_path,
            args.out,
            config=args.config,
            adapter_only=args.adapter_only,
            max_shard_size=args.max_shard_size,
            overwrite=args.overwrite,
        )
    except (CheckpointError, FileExistsError, ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except OSError as exc:  # a read-only or full folder: named with its fix
        sys.stderr.write(f"error: export: {file_error_message(args.out, exc) or exc}\n")
        return 2
    print(
        f"export: agent A of {args.ckpt_path} (iteration {meta['iteration']}, {meta['estimator']}"
        f"{', RSPO' if meta['rspo'] else ''}) written to {args.out}"
    )
    return 0
