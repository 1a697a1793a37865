"""LoRA policies: only adapters train, the KL reference is the adapter-disabled base (no copy),
and RSPO's snapshot of agent A holds only adapter weights."""

import pytest
import torch

pytest.importorskip("peft", reason='LoRA needs peft: pip install -e ".[lora]"')

import lightning.pytorch as pl  # noqa: E402

from rspo_lightning import logprobs  # noqa: E402
from rspo_lightning.batching import flatten, make_train_batch  # noqa: E402
from rspo_lightning.config import AlgorithmConfig, EnvConfig, LoraSettings, OptimConfig, PolicyConfig  # noqa: E402
from rspo_lightning.datamodules import AgentDataModule  # noqa: E402
from rspo_lightning.language_model import TinyModelConfig  # noqa: E402
from rspo_lightning.module import AgentRLModule  # noqa: E402
from rspo_lightning.rewards import EnvProgressReward  # noqa: E402
from rspo_lightning.rollout import RolloutConfig  # noqa: E402
from rspo_lightning.types import TaskSpec  # noqa: E402

ENV = EnvConfig(
    kwargs={
        "task_types": ["pick_and_place"],
        "num_receptacles": 3,
        "num_distractors": 0,
        "num_object_types": 4,
        "max_steps": 4,
        "info_actions": False,
    }
)


def _module(kl=0.05):
    m = AgentRLModule(
        policy=PolicyConfig(
            tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64),
            lora=LoraSettings(r=4, alpha=8),
        ),
        env=ENV,
        algorithm=AlgorithmConfig(ppo_epochs=1, kl_coef=kl),
        optim=OptimConfig(lr=2e-2),
        rollout=RolloutConfig(constrained_decoding=True, max_new_tokens=8, template="compact", system_prompt=""),
        dense_reward=EnvProgressReward(),
    )
    m.configure_model()
    return m


def test_only_adapters_train_and_the_reference_is_the_frozen_base():
    torch.manual_seed(0)
    m = _module()
    assert m._ref is None  # no second copy of the model
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base_before = {n: p.detach().clone() for n, p in m.named_parameters() if not p.requires_grad}
    trajs = m.engine.collect([TaskSpec("rspo/Household-v0", "train", i, i) for i in range(4)], 2)
    flat = flatten(trajs)
    batch = make_train_batch(flat, m.engine.pad_id, torch.zeros(len(flat.turns)))
    batch, _ = m.score(batch)
    # adapters start at B = 0: the policy equals the base, so ref = old on every response token
    mask = batch.response_mask
    assert torch.allclose(batch.ref_logprobs[mask], batch.behaviour_logprobs[mask], atol=1e-4)
    ref0 = batch.ref_logprobs.clone()

    # progress rewards give every group a learning signal (outcome alone is often all-zero here)
    dm = AgentDataModule(
        env=ENV, groups_per_iteration=4, group_size=2, iterations_per_epoch=2, val_splits=[], reward_mode="dense"
    )
    pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    ).fit(m, dm)
    # the base weights never moved, the adapters did
    assert all(torch.equal(base_before[n], p) for n, p in m.named_parameters() if not p.requires_grad)
    assert any(p.abs().sum() > 0 for n, p in m.named_parameters() if "lora_B" in n)
    # the reference still scores like the untouched base; the policy no longer does
    batch, _ = m.score(batch)
    assert torch.allclose(batch.ref_logprobs[mask], ref0[mask], atol=1e-5)
    with torch.no_grad():
        now = logprobs.forward(m.policy, batch, 1.0).logprobs
    assert (now[mask] - ref0[mask]).abs().max() > 1e-3


def test_rspo_snapshot_holds_only_adapters():
    torch.manual_seed(0)
    m = _module(kl=0.0)
    dm = AgentDataModule(
        env=ENV, groups_per_iteration=2, group_size=2, iterations_per_epoch=1, val_splits=[], reward_mode="dense"
    )
    pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    ).fit(m, dm)
    snap = m.snapshot_trainable()
    assert snap["params"] and all("lora_" in n for n in snap["params"])
    n_adapter = sum(v.numel() for v in snap["params"].values())
    n_all = sum(p.numel() for p in m.parameters())
    assert n_adapter < 0.2 * n_all
