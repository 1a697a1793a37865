"""AgentRLModule: PPO with a shared or an asymmetric critic, critic warm-up, the iteration's wiring."""

import lightning.pytorch as pl
import pytest
import torch
from module_helpers import (  # noqa: F401
    ENV,
    TINY,
    KilledInValidation,
    ValidationProbe,
    _changed,
    _module,
    _scored_batch,
    _snapshot,
    _Weights,
    fit_checkpointed,
)

from rspo_lightning import credit, update
from rspo_lightning.batching import flatten, make_train_batch
from rspo_lightning.config import AlgorithmConfig, PolicyConfig
from rspo_lightning.critic import CriticConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.types import IterationBatch, TaskSpec


def _fit(module, iterations=2, groups=2):
    dm = AgentDataModule(
        env=ENV, groups_per_iteration=groups, group_size=2, iterations_per_epoch=iterations, val_splits=[]
    )
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, dm)
    return trainer


def _start_head_at_one(head):
    """A zero-initialised head predicts V = 0 = every return when no episode succeeds (no value
    gradient); start it at V = 1 so the value loss moves it whatever the random policy scores."""
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(1.0)


def test_ppo_with_shared_critic_trains_policy_and_value_head():
    m = _module(
        algorithm=AlgorithmConfig(estimator="gae", estimator_kwargs={"gamma": 0.9, "lam": 0.95}),
        critic=CriticConfig(kind="shared", lr=1e-2),
    )
    assert m.value_head is not None and m.critic is None
    _start_head_at_one(m.value_head)
    head0 = _snapshot(m.value_head)
    pol0 = _snapshot(m.policy)
    trainer = _fit(m)
    assert _changed(head0, m.value_head) and _changed(pol0, m.policy)
    assert "train/value_loss" in trainer.callback_metrics
    assert "train/explained_variance" in trainer.callback_metrics


def test_asymmetric_privileged_critic_has_its_own_optimizer_and_frozen_backbone():
    m = _module(
        algorithm=AlgorithmConfig(estimator="gae"),
        critic=CriticConfig(kind="separate", source="policy", privileged=True, lr=1e-2),
    )
    assert m.critic is not None and m.value_head is None
    torch.manual_seed(0)
    trajs = m.engine.collect([TaskSpec("rspo/Household-v0", "train", 0, 0)], 1)
    rows = m.critic.input_ids(trajs[0].turns)
    text = m.tokenizer.decode(rows[0])
    assert "Full state" in text and "Task :" in text  # the privileged state, not the actor's prompt
    assert m.tokenizer.unk_token not in text  # the tiny vocabulary covers the privileged text
    backbone0 = _snapshot(m.critic.backbone)
    _start_head_at_one(m.critic.head)
    head0 = _snapshot(m.critic.head)
    trainer = _fit(m)
    assert len(trainer.optimizers) == 2
    assert not _changed(backbone0, m.critic.backbone)
    assert _changed(head0, m.critic.head)


def test_critic_warmup_keeps_the_actor_still():
    m = _module(
        algorithm=AlgorithmConfig(estimator="gae", max_grad_norm=0.0),
        critic=CriticConfig(kind="separate", source="policy", warmup_iterations=5, lr=1e-2),
    )
    pol0 = _snapshot(m.policy)
    _start_head_at_one(m.critic.head)
    head0 = _snapshot(m.critic.head)
    _fit(m, iterations=2)
    assert not _changed(pol0, m.policy)
    assert _changed(head0, m.critic.head)


def test_group_size_one_with_group_relative_estimator_fails_at_setup():
    m = _module()
    dm = AgentDataModule(env=ENV, groups_per_iteration=2, group_size=1, iterations_per_epoch=1, val_splits=[])
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="group_size"):
        trainer.fit(m, dm)


def test_skipped_steps_are_counted_and_logged_by_the_module(monkeypatch):
    m = _module()
    real = update.ppo_update

    def nan_loss(batch, loss_fn, *args, **kwargs):
        return real(batch, lambda mb, scale: (loss_fn(mb, scale)[0] * float("nan"), {}), *args, **kwargs)

    monkeypatch.setattr(update, "ppo_update", nan_loss)
    pol0 = _snapshot(m.policy)
    trainer = _fit(m, iterations=2)
    assert m.skipped_steps >= 2 and not _changed(pol0, m.policy)
    assert float(trainer.callback_metrics["train/skipped_steps"]) == m.skipped_steps


def test_a_zero_validation_temperature_fails_at_construction_and_names_val_greedy():
    for t in (0.0, -0.5):
        with pytest.raises(ValueError, match=rf"val_temperature must be > 0, got {t}.*val_greedy: true"):
            AgentRLModule(policy=PolicyConfig(tiny=TINY), env=ENV, val_temperature=t)


def test_a2tgpo_needs_a_dense_reward_and_gets_progress_signals(monkeypatch):
    with pytest.raises(ValueError, match="a2tgpo needs a per-turn signal.*EnvProgressReward"):
        AgentRLModule(policy=PolicyConfig(tiny=TINY), env=ENV, algorithm=AlgorithmConfig(estimator="a2tgpo"))
    from rspo_lightning.rewards import EnvProgressReward

    m = _module(
        algorithm=AlgorithmConfig(estimator="a2tgpo"),
        dense_reward=EnvProgressReward(),
        rollout=RolloutConfig(constrained_decoding=True, max_new_tokens=8, template="compact", system_prompt=""),
    )
    seen = {}
    original = credit.turn_advantages

    def spy(flat, algo, values=None, *args, **kw):
        seen["dense"] = flat.dense.clone()
        return original(flat, algo, values, *args, **kw)

    monkeypatch.setattr(credit, "turn_advantages", spy)
    torch.manual_seed(0)
    _fit(m, iterations=1, groups=16)
    # each turn's signal is its progress delta (progress starts at 0 in pick-and-place)
    expected = []
    for traj in m.last_trajectories:
        prev = 0.0
        for turn in traj.turns:
            expected.append(turn.progress - prev)
            prev = turn.progress
    assert any(e != 0 for e in expected), "no progress at all in this rollout: the check would be vacuous"
    assert torch.allclose(seen["dense"], torch.tensor(expected))
    assert m.env_steps == len(expected)


def test_env_step_budget_stops_the_fit():
    from rspo_lightning.callbacks import EnvStepBudget

    m = _module()
    dm = AgentDataModule(env=ENV, groups_per_iteration=2, group_size=2, iterations_per_epoch=50, val_splits=[])
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[EnvStepBudget(max_env_steps=20)],
    )
    trainer.fit(m, dm)
    # 4 episodes of <= 4 steps per iteration: at most 16 steps each, so 2..5 iterations reach 20
    assert m.env_steps >= 20 and m.env_steps - 16 < 20
    assert 2 <= m.iteration <= 5
    with pytest.raises(ValueError, match="max_env_steps"):
        EnvStepBudget(0)


def test_a_run_resumed_with_its_budget_spent_validates_without_another_iteration(tmp_path):
    """Killed during its last validation, a budgeted run resumes to that validation only: no
    iteration past the one that spent the budget."""
    from rspo_lightning.callbacks import EnvStepBudget

    seen = []

    def fit(crash: bool, ckpt_path=None):
        probe = ValidationProbe(seen, crash)
        return fit_checkpointed(_module(), ENV, [EnvStepBudget(max_env_steps=20)], tmp_path, probe, 2, 1, ckpt_path)

    with pytest.raises(KilledInValidation):
        fit(crash=True)
    (done,) = [s[:2] for s in seen]
    assert done[1] >= 20
    resumed = fit(crash=False, ckpt_path=str(tmp_path / "last.ckpt"))
    assert (resumed.iteration, resumed.env_steps) == done and [s[:2] for s in seen] == [done, done]


def test_swap_partner_loss_is_added_with_its_warmed_up_coefficient():
    from rspo_lightning.config import SwapConfig

    torch.manual_seed(0)
    m = _module(
        rollout=RolloutConfig(constrained_decoding=True, max_new_tokens=8, template="compact", system_prompt="")
    )
    trajs = m.engine.collect([TaskSpec("rspo/Household-v0", "train", i, i) for i in range(3)], 2)
    flat = flatten(trajs)
    batch = make_train_batch(flat, m.engine.pad_id, torch.linspace(-1, 1, len(flat.turns)))
    base, _ = m.loss(batch)
    m.algo.swap = SwapConfig(coef=0.5, strategy="knn", warmup_iterations=4)
    m.iteration = 2  # halfway through the warm-up: lambda = 0.25
    total, stats = m.loss(batch)
    assert stats["swap_loss"] != 0
    assert torch.allclose(total, base + 0.25 * stats["swap_loss"], atol=1e-6)
    with pytest.raises(ValueError, match="swap.strategy"):
        SwapConfig(strategy="nearest")


class _FreezeCount(pl.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        import gc

        self.seen.append(gc.get_freeze_count())


def test_the_startup_heap_is_frozen_while_fitting_and_given_back_after():
    import gc

    def fit(*callbacks):
        dm = AgentDataModule(env=ENV, groups_per_iteration=2, group_size=2, iterations_per_epoch=1, val_splits=[])
        pl.Trainer(
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=list(callbacks),
        ).fit(_module(), dm)

    class _Crash(pl.Callback):
        def on_train_batch_end(self, *args):
            raise RuntimeError("crash mid-run")

    seen = _FreezeCount()
    fit(seen)
    assert len(seen.seen) == 1 and seen.seen[0] > 10000  # torch, transformers, the model: out of the collector's sight
    assert gc.get_freeze_count() == 0  # teardown gave them back
    with pytest.raises(RuntimeError, match="crash mid-run"):
        fit(_Crash())
    assert gc.get_freeze_count() > 0  # Lightning runs no teardown hook after a crash ...
    fit()
    assert gc.get_freeze_count() == 0  # ... the next fit gives that heap back too
    gc.freeze()  # a process that froze objects itself is left as it is
    try:
        frozen = gc.get_freeze_count()
        fit()
        assert 0 < gc.get_freeze_count() <= frozen  # neither unfrozen nor frozen again (freed objects leave the count)
    finally:
        gc.unfreeze()


def test_bf16_true_trains_with_a_bf16_reference_and_leaves_the_batch_alone():
    from lightning.pytorch.plugins.precision import HalfPrecision

    from rspo_lightning.types import Trajectory, Turn

    turn = Turn(
        prompt_ids=torch.tensor([1, 2]),
        response_ids=torch.tensor([3]),
        behaviour_logprobs=torch.tensor([-0.123456789]),
        action="look",
        valid=True,
        observation="",
        anchor="",
    )
    batch = IterationBatch(
        tasks=[TaskSpec("rspo/Household-v0", "train", 0, 0)],
        group_size=2,
        replay=[[Trajectory(task=TaskSpec("rspo/Household-v0", "train", 1, 1), turns=[turn])]],
    )
    # Lightning casts float tensors of list/dict/dataclass batches; ours passes through untouched
    assert HalfPrecision("bf16-true").convert_input(batch) is batch
    assert turn.behaviour_logprobs.dtype == torch.float32

    seen = []

    class _Dtypes(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            seen.append((next(pl_module.policy.parameters()).dtype, next(pl_module._ref.parameters()).dtype))

    module = _module(algorithm=AlgorithmConfig(kl_coef=0.1))
    before = _snapshot(module)
    dm = AgentDataModule(env=ENV, groups_per_iteration=2, group_size=2, iterations_per_epoch=1, val_splits=[])
    pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        precision="bf16-true",
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_Dtypes()],
    ).fit(module, dm)
    assert seen == [(torch.bfloat16, torch.bfloat16)]  # the reference follows the policy's dtype
    assert _changed(before, module)


def test_validation_uses_common_random_numbers_whatever_the_iteration():
    """Two validations of the same weights give the same numbers, also at another training
    iteration: held-out sampling is seeded by the run's seed and the batch of tasks only."""
    m = _module(
        rollout=RolloutConfig(constrained_decoding=True, max_new_tokens=8, template="compact", system_prompt="")
    )
    dm = AgentDataModule(env=ENV, groups_per_iteration=2, group_size=2, val_splits=["valid_seen"], num_val_tasks=16)
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)

    def actions():
        played = []
        original = m.engine.collect

        def spy(*args, **kw):
            out = original(*args, **kw)
            played.extend(tuple(tuple(t.response_ids.tolist()) for t in tr.turns) for tr in out)
            return out

        m.engine.collect = spy
        trainer.validate(m, dm, verbose=False)
        m.engine.collect = original
        return played

    first = actions()
    m.iteration = 7
    second = actions()
    assert len(first) == 16 and first == second
    assert len(set(first)) > 1, "vacuous: every episode played the same actions"
