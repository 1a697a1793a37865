"""Multi-process pieces: collectives that keep ranks in lock-step, decoder-layer detection, and
the two ways of sharding the policy (FSDP1 through ``DecoderLayerFSDPStrategy``, FSDP2 through
Lightning's ``ModelParallelStrategy`` + ``shard_fsdp2`` in ``AgentRLModule.configure_model``).

Why lock-step: under DDP every backward all-reduces gradients, and under sharding every forward
all-gathers parameters. A rank that skips one of them (no samples, fewer micro-batches, episodes
that ended sooner) leaves the others waiting for ever. docs/distributed.md has the full list.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

T = TypeVar("T")


def world_size() -> int:
    """Processes in the default group (1 without ``torch.distributed``)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gather_values(values: Sequence[float], device: torch.device | str = "cpu") -> torch.Tensor:
    """Every rank's ``values``: ``[world, len(values)]`` float64 (one all_gather; no collective
    with one process). Sum or max the rows to agree on a count."""
    local = torch.tensor([list(map(float, values))], dtype=torch.float64)
    if world_size() == 1:
        return local
    local = local.to(device)
    rows = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(rows, local)
    return torch.cat(rows).cpu()


def all_sum(values: Sequence[float], device: torch.device | str = "cpu") -> list[float]:
    """Element-wise sum over ranks."""
    return gather_values(values, device).sum(0).tolist()


def lockstep_count(count: int, device: torch.device | str = "cpu") -> int:
    """How many collective steps every rank takes when this one has ``count`` of its own: the
    busiest rank's count (``count`` itself with one process, without a collective)."""
    return int(gather_values([count], device).max()) if world_size() > 1 else count


def lockstep(items: Sequence[T], device: torch.device | str = "cpu") -> Iterator[T | None]:
    """``items``, then None until this rank has taken as many steps as the busiest rank: the one
    loop of every place where ranks must run the same number of collective steps (chunked
    forwards, critic values, micro-batch backwards; generate calls use ``lockstep_count``). On a
    None the caller runs its step on a dummy at weight 0."""
    for i in range(lockstep_count(len(items), device)):
        yield items[i] if i < len(items) else None


def merge_over_ranks(obj: dict[str, list[float]]) -> dict[str, list[float]]:
    """The one way metrics aggregate over ranks: ``{name: [sum, count]}`` (or ``[sum, count,
    max]``) dicts summed over ranks, the maximum taken of a third entry. Keys may differ between
    ranks (one all_gather_object; no collective with one process)."""
    if world_size() == 1:
        return {key: list(map(float, value)) for key, value in obj.items()}
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, obj)
    merged: dict[str, list[float]] = {}
    for part in parts:
        for key, value in part.items():
            acc = merged.setdefault(key, [0.0, 0.0] + ([float("-inf")] if len(value) > 2 else []))
            acc[0] += value[0]
            acc[1] += value[1]
            if len(value) > 2:
                acc[2] = max(acc[2], value[2])
    return merged


# -- which modules are the decoder layers ----------------------------------------------------
def decoder_layer_classes(model: nn.Module) -> set[type[nn.Module]]:
    """Classes of ``model``'s transformer blocks (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ...).

    Read from Hugging Face's ``_no_split_modules`` (the blocks ``device_map`` never splits), or
    else from the first ``layers`` ModuleList found. Only modules registered under ``model`` are
    searched: the frozen reference model, held outside registration, is never wrapped.
    """
    classes = _layer_classes(model)
    if not classes:
        raise ValueError(
            f"cannot find the decoder-layer class of {type(model).__name__}: no `_no_split_modules` names a module of it "
            "and it has no `layers` ModuleList; give FSDP an explicit policy instead, e.g. trainer.strategy: "
            "{class_path: lightning.pytorch.strategies.FSDPStrategy, init_args: {auto_wrap_policy: [<your block class>]}} "
            "in YAML, or Trainer(strategy=FSDPStrategy(auto_wrap_policy={<your block class>})) in Python"
        )
    return classes


def _layer_classes(model: nn.Module) -> set[type[nn.Module]]:
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        for module in model.modules():
            layers = getattr(module, "layers", None)
            if isinstance(layers, nn.ModuleList) and len(layers):
                classes.add(type(layers[0]))
                break
    return classes


# -- FSDP1 (GPUs) ----------------------------------------------------------------------------
class DecoderLayerFSDPStrategy(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` whose auto-wrap policy is the policy model's decoder-layer
    class, found when the model is wrapped (a YAML cannot name the class of a model it has not
    loaded yet). Every other argument is ``FSDPStrategy``'s.

    Args:
        checkpoint_decoder_layers: activation checkpointing of every decoder layer (recompute its
            activations in the backward pass; saves memory, costs about a third more compute).
        state_dict_type: ``sharded`` (each rank writes its shard; a checkpoint is a folder) or ``full``.
    """

    def __init__(self, checkpoint_decoder_layers: bool = False, state_dict_type: str = "sharded", **kwargs: Any):
        for name in ("auto_wrap_policy", "activation_checkpointing_policy", "activation_checkpointing"):
            if kwargs.pop(name, None) is not None:
                raise ValueError(
                    f"DecoderLayerFSDPStrategy sets {name} from the model's decoder layers; drop {name}, or use "
                    "lightning.pytorch.strategies.FSDPStrategy to give your own"
                )
        super().__init__(state_dict_type=state_dict_type, **kwargs)
        self.checkpoint_decoder_layers = checkpoint_decoder_layers

    def wrap_policies(self, model: nn.Module) -> tuple[Any, dict]:
        """``(auto-wrap policy, activation-checkpointing kwargs)`` for ``model``."""
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        classes = decoder_layer_classes(model)
        checkpointing = {"auto_wrap_policy": ModuleWrapPolicy(classes)} if self.checkpoint_decoder_layers else {}
        return ModuleWrapPolicy(classes), checkpointing

    def _setup_model(self, model: nn.Module) -> nn.Module:
        self.kwargs["auto_wrap_policy"], self._activation_checkpointing_kwargs = self.wrap_policies(model)
        return super()._setup_model(model)


# -- FSDP2 (ModelParallelStrategy; CPU/gloo and GPUs) -----------------------------------------
def shard_fsdp2(model: nn.Module, mesh) -> nn.Module:
    """``fully_shard`` each decoder layer, then ``model`` itself (Lightning's documented FSDP2
    pattern); in place, returns ``model``. The root unit holds the embeddings, final norm and
    (tied) LM head, so the model must be called as a whole, never its decoder alone.

    A 2-D ``ModelParallelStrategy`` mesh (``data_parallel`` x ``tensor_parallel``) gives HSDP:
    replicated over the first dimension (nodes by default), sharded over the second (the GPUs of a
    node); no tensor parallelism is applied.
    """
    from torch.distributed.fsdp import fully_shard

    classes = tuple(_layer_classes(model))  # none in a value head: it is one unit
    if classes:
        for module in list(model.modules()):
            if isinstance(module, classes):
                fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp2_modules(module: nn.Module) -> list[nn.Module]:
    """The ``fully_shard``-ed modules under ``module`` (none without FSDP2)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


@contextmanager
def no_gradient_sync(strategy, sharded: Sequence[nn.Module] = ()) -> Iterator[None]:
    """Backwards inside accumulate gradients on each rank without synchronising them: DDP through
    Lightning's ``block_backward_sync`` (DDP's ``no_sync``), FSDP2 by
    ``set_requires_gradient_sync(False)`` on the ``sharded`` modules (``fsdp2_modules``; gradients
    stay unsharded until the next synchronised backward). FSDP1 and one process: no-op."""
    from lightning.pytorch.strategies import ParallelStrategy

    for m in sharded:
        m.set_requires_gradient_sync(False, recurse=False)
    try:
        if isinstance(strategy, ParallelStrategy):
            with strategy.block_backward_sync():
                yield
        else:
            yield
    finally:
        for m in sharded:
            m.set_requires_gradient_sync(True, recurse=False)


def is_sharded(strategy) -> bool:
    """The strategy shards parameters (every forward is then a collective)."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    return isinstance(strategy, (FSDPStrategy, ModelParallelStrategy))
