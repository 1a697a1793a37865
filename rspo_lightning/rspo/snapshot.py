"""Agent A's copy while RSPO's explorer B trains: a snapshot of a module's trainable state, its
bitwise restore, and the rule that a checkpoint written during B's phases is read as agent A
outside a fit with the loop (docs/design.md §10). Used by ``AgentRLModule`` and ``RSPOLoop``
alike, so neither imports the other."""

from __future__ import annotations

import copy

import lightning.pytorch as pl
import torch


def _schedulers(module: pl.LightningModule) -> list:
    scheds = module.lr_schedulers() if module._trainer is not None else None
    return [] if scheds is None else (scheds if isinstance(scheds, list) else [scheds])


def _optimizers(module: pl.LightningModule) -> list:
    opts = module.optimizers()
    return opts if isinstance(opts, list) else [opts]


def snapshot_trainable(module: pl.LightningModule) -> dict:
    """Copies of ``module``'s trainable parameters and its optimizers' and schedulers' states: how
    a LightningModule with manual optimisation implements ``RSPOAgent.snapshot_trainable`` (agent
    A is kept here while B trains; ``restore_trainable`` puts it back bitwise)."""
    return {
        "params": {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad},
        "optimizers": [copy.deepcopy(getattr(o, "optimizer", o).state_dict()) for o in _optimizers(module)],
        "schedulers": [copy.deepcopy(s.state_dict()) for s in _schedulers(module)],
    }


@torch.no_grad()
def restore_trainable(module: pl.LightningModule, snapshot: dict) -> None:
    """Put a ``snapshot_trainable`` result back into ``module``, bitwise."""
    params = dict(module.named_parameters())
    missing = set(snapshot["params"]) - set(params)
    if missing:
        raise ValueError(f"snapshot has parameters this module lacks: {sorted(missing)[:5]}")
    for name, value in snapshot["params"].items():
        params[name].copy_(value)
    for opt, state in zip(_optimizers(module), snapshot["optimizers"]):
        # the wrapped torch optimizer: LightningOptimizer.load_state_dict does not drop state
        # that the snapshot lacks (e.g. Adam moments created after an empty snapshot)
        getattr(opt, "optimizer", opt).load_state_dict(copy.deepcopy(state))
    for sched, state in zip(_schedulers(module), snapshot["schedulers"]):
        sched.load_state_dict(copy.deepcopy(state))


def agent_a_into_checkpoint(module: pl.LightningModule, checkpoint: dict) -> None:
    """A checkpoint written while RSPO's explorer B was active holds B's weights and A's in the
    RSPOLoop state. Unless ``module`` fits with an RSPOLoop (which restores A itself at the end of
    B's phase), put A's parameters, optimizer and scheduler states into ``checkpoint`` (called from
    ``on_load_checkpoint``, before Lightning loads it): validate / test / predict then measure
    agent A, and a fit without the loop continues A."""
    snapshot = None
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and {"snapshot", "counts"} <= state.keys() and state["snapshot"] is not None:
            snapshot = state["snapshot"]
    trainer = module._trainer
    fitting_with_loop = (
        trainer is not None
        and trainer.state.fn == "fit"
        and any(getattr(cb, "restores_agent_a", False) for cb in trainer.callbacks)
    )
    if snapshot is None or fitting_with_loop or "state_dict" not in checkpoint:
        return
    # tied weights (embeddings = LM head) appear once among the parameters, under every name in the state dict
    names = {p.data_ptr(): n for n, p in module.named_parameters()}
    merged = dict(checkpoint["state_dict"])
    for key, tensor in module.state_dict(keep_vars=True).items():
        source = names.get(tensor.data_ptr())
        if source in snapshot["params"] and key in merged:
            merged[key] = snapshot["params"][source]
    checkpoint["state_dict"] = merged
    if snapshot.get("optimizers") and "optimizer_states" in checkpoint:
        checkpoint["optimizer_states"] = snapshot["optimizers"]
    if snapshot.get("schedulers") and "lr_schedulers" in checkpoint:
        checkpoint["lr_schedulers"] = snapshot["schedulers"]
