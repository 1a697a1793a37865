"""Callbacks and a module used by tests/test_distributed.py inside ``rspo-lightning fit`` subprocesses
(importable there through PYTHONPATH=tests)."""

from __future__ import annotations

import json
import os

import torch
from lightning.pytorch import Callback

from rspo_lightning.module import AgentRLModule
from rspo_lightning.rspo.loop import RSPOLoop


def _local_mb(module) -> float:
    """MB of ``module``'s parameters this rank holds (a DTensor's local shard)."""
    if module is None:
        return 0.0
    local = [p.to_local() if hasattr(p, "to_local") else p for p in module.parameters()]
    return sum(t.numel() * t.element_size() for t in local) / 2**20


def _full_mb(module) -> float:
    """MB of ``module``'s parameters unsharded (a DTensor counts its global shape)."""
    return 0.0 if module is None else sum(p.numel() * p.element_size() for p in module.parameters()) / 2**20


class RankSkewProbe(Callback):
    """Makes the ranks' rollouts as unequal as possible and records what each rank did.

    Rank 0: in its first training iteration every episode ends after one turn (``max_steps: 1``);
    from the second on every episode is lost to an environment fault at reset (it has no sample
    at all). The other ranks keep the configured env (``rspo/Faulty-v0`` around Household, no
    faults). At the end each rank writes ``rank<r>.json``: optimizer steps, backward calls, DDP
    gradient all-reduces (a counting comm hook: backwards whose last bucket was reduced) and, per
    iteration, the turn count of every episode it trained on; and ``params<r>.pt``, its trained
    weights in float64.
    """

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.backwards = 0
        self.allreduces = 0
        self.turns: list[list[int]] = []

    def on_train_start(self, trainer, pl_module) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        def counting_allreduce(probe, bucket):
            probe.allreduces += int(bucket.is_last())
            return allreduce_hook(None, bucket)

        if isinstance(trainer.strategy.model, DistributedDataParallel):
            trainer.strategy.model.register_comm_hook(self, counting_allreduce)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank != 0:
            return
        kwargs = pl_module.env_cfg.kwargs
        if pl_module.iteration == 0:
            pl_module.set_env_kwargs({"inner_kwargs": {**kwargs["inner_kwargs"], "max_steps": 1}})
        elif pl_module.iteration == 1:
            pl_module.set_env_kwargs({"fault_rate": 1.0, "on_reset": True, "modes": ["raise"]})

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.backwards += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.turns.append([len(t.turns) for t in pl_module.last_trajectories])

    def on_train_end(self, trainer, pl_module) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
            json.dump(
                {
                    "optimizer_steps": trainer.global_step,
                    "backwards": self.backwards,
                    "allreduces": self.allreduces,
                    "reference_local_mb": _local_mb(pl_module._ref),
                    "reference_full_mb": _full_mb(pl_module._ref),
                    "turns": self.turns,
                    "world_size": trainer.world_size,
                },
                f,
            )
        weights = {n: p.detach().double().cpu() for n, p in pl_module.named_parameters() if p.requires_grad}
        torch.save(weights, os.path.join(self.out_dir, f"params{trainer.global_rank}.pt"))


class TrajectoryRecorder(Callback):
    """Saves the trajectories each rank trained on, per iteration (``traj_it<i>_rank<r>.pt``), and
    at the end of fit the full (gathered) state dict of the module on rank 0 (``final_state.pt``)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        name = f"traj_it{pl_module.iteration}_rank{trainer.global_rank}.pt"
        torch.save(pl_module.last_trajectories, os.path.join(self.out_dir, name))

    def on_train_end(self, trainer, pl_module) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if trainer.world_size == 1:
            state = {k: v.detach().cpu() for k, v in pl_module.state_dict().items()}
        else:  # gathers the shards (a collective: every rank calls it)
            state = get_model_state_dict(pl_module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if trainer.global_rank == 0:
            torch.save(state, os.path.join(self.out_dir, "final_state.pt"))


class ReplayedRollouts(AgentRLModule):
    """AgentRLModule whose rollouts are read from a recording (every rank's trajectories of the
    iteration, in rank order) instead of being played: a single process then trains on exactly the
    union of what the ranks of a multi-process run trained on.

    Args:
        recording_dir: folder of ``traj_it<i>_rank<r>.pt`` files (TrajectoryRecorder).
        recorded_world_size: number of ranks of the recorded run.
    """

    def __init__(self, *args, recording_dir: str = "", recorded_world_size: int = 2, **kwargs):
        super().__init__(*args, **kwargs)
        self.recording_dir = recording_dir
        self.recorded_world_size = recorded_world_size

    def collect(self, tasks, group_size, policy_tag="A", purpose="train", dense=False):
        it = self.iteration + 1
        out = []
        for rank in range(self.recorded_world_size):
            out += torch.load(os.path.join(self.recording_dir, f"traj_it{it}_rank{rank}.pt"), weights_only=False)
        return out


class ReplayCountingLoop(RSPOLoop):
    """RSPOLoop that records, per iteration, how many replayed trajectories this rank's batch
    holds once the data module has composed the mix (``replay<r>.json`` at the end). Zero-advantage
    items may fill replay slots here: the untrained tiny model wins nothing, and the test is about
    the counts."""

    def __init__(self, out_dir: str = "", **kwargs):
        super().__init__(**kwargs)
        self.buffer.skip_zero_advantage = False
        self.out_dir = out_dir
        self.replayed: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self.replayed.append(sum(len(g) for g in batch.replay))

    def on_train_end(self, trainer, pl_module) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f"replay{trainer.global_rank}.json"), "w") as f:
            json.dump({"replayed": self.replayed, "group_size": trainer.datamodule.group_size}, f)


class KillAt(Callback):
    """SIGKILLs its own process when iteration ``at`` is about to start (a crash no hook sees)."""

    def __init__(self, at: int = 0):
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if pl_module.iteration == self.at:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
