"""The callback benchmarks/grad_sync.py loads into each rank of its ``fit`` runs (PYTHONPATH=benchmarks).

Per rank it writes ``rank<r>.json``: optimizer steps, backwards, gradient collectives (DDP: a comm
hook counting backwards whose last bucket was all-reduced; FSDP2: calls of ``foreach_reduce``, one
per sharded module per synchronised backward, divided by the number of sharded modules), the
largest gradient memory held right after a backward, the MB of the frozen KL reference held (local gradients, plus FSDP2's unsharded
gradients while its sync is off), the peak RSS, and the update's wall time (first backward of
the iteration to its end); and ``params<r>.pt``, the trained weights in float64.
"""

from __future__ import annotations

import json
import os
import resource
import time

import torch
from lightning.pytorch import Callback


def _bytes(t) -> int:
    if t is None:
        return 0
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.numel() * t.element_size()


def _held_mb(module) -> float:
    """MB of ``module``'s parameters this rank holds (a DTensor's local shard; 0 without one)."""
    return 0.0 if module is None else sum(_bytes(p) for p in module.parameters()) / 2**20


class GradSyncProbe(Callback):
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.backwards = 0
        self.reduces = 0
        self.allreduces = 0
        self.grad_bytes = 0
        self.first_backward: float | None = None
        self.update_s = 0.0
        self.fsdp_modules: list = []

    def on_train_start(self, trainer, pl_module) -> None:
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        model = trainer.strategy.model
        if isinstance(model, DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def counting(probe, bucket):
                probe.allreduces += int(bucket.is_last())
                return allreduce_hook(None, bucket)

            model.register_comm_hook(self, counting)
        self.fsdp_modules = [m for m in pl_module.modules() if isinstance(m, FSDPModule)]
        if self.fsdp_modules:
            from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

            original = group.foreach_reduce

            def counting_reduce(*args, **kwargs):
                self.reduces += 1
                return original(*args, **kwargs)

            group.foreach_reduce = counting_reduce

    def on_after_backward(self, trainer, pl_module) -> None:
        self.backwards += 1
        if self.first_backward is None:
            self.first_backward = time.perf_counter()
        held = sum(_bytes(p.grad) for p in pl_module.parameters())
        for m in self.fsdp_modules:
            group = m._get_fsdp_state()._fsdp_param_group
            if group is not None:
                for fp in group.fsdp_params:  # unsharded gradients kept while the sync is off
                    unsharded = getattr(fp, "_unsharded_param", None)
                    held += _bytes(fp.unsharded_accumulated_grad) + _bytes(
                        unsharded.grad if unsharded is not None else None
                    )
        self.grad_bytes = max(self.grad_bytes, held)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.first_backward is not None:
            self.update_s += time.perf_counter() - self.first_backward
            self.first_backward = None

    def on_train_end(self, trainer, pl_module) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        rank = trainer.global_rank
        collectives = self.allreduces if not self.fsdp_modules else self.reduces / len(self.fsdp_modules)
        record = {
            "steps": trainer.global_step,
            "backwards": self.backwards,
            "collectives": collectives,
            "grad_mb": self.grad_bytes / 2**20,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "update_s": self.update_s,
            "reference_mb": _held_mb(getattr(pl_module, "_ref", None)),
            "params": sum(p.numel() for p in pl_module.policy.parameters()),  # a DTensor counts its global shape
        }
        with open(os.path.join(self.out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(record, f)
        weights = {n: p.detach().double().cpu() for n, p in pl_module.named_parameters() if p.requires_grad}
        if self.fsdp_modules:
            weights = {n: w.full_tensor() if hasattr(w, "full_tensor") else w for n, w in weights.items()}
        torch.save(weights, os.path.join(self.out_dir, f"params{rank}.pt"))
