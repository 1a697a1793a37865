"""RSPOLoop: the phase schedule, A's bitwise restore, the reward swap, mixing, the generalised
clip's centre, exact resume mid-B-phase, and reuse with a LightningModule that is not ours."""

import math
import os
import sys

import lightning.pytorch as pl
import pytest
import torch

from rspo_lightning import update
from rspo_lightning.batching import flatten
from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.credit import turn_advantages
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rewards import EnvProgressReward, NoveltyBonus
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.rspo.buffer import replay_groups_per_rank
from rspo_lightning.rspo.loop import RSPOLoop, repeat_visit_rate
from rspo_lightning.types import IterationBatch, TaskSpec, Trajectory, Turn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from study_loop import StudyRSPOLoop  # noqa: E402  (the study's levers: a subclass, benchmarks/study_loop.py)

LEVERS = {"exploit_k", "dense_scale", "buffer_from", "collect_phase", "replay_slots", "explorer_lr_scale"}
LEVERS |= {"explorer_temperature", "explorer_credit", "explorer_gamma", "explorer_resync_every", "reuse_a_episodes"}

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
TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)
ROLLOUT = RolloutConfig(
    constrained_decoding=True, max_new_tokens=8, template="compact", system_prompt="", history_window=1
)


def _module(estimator="grpo", **kw):
    kw.setdefault("dense_reward", EnvProgressReward())
    algo = AlgorithmConfig(
        estimator=estimator,
        ppo_epochs=1,
        minibatch_size=64,
        estimator_kwargs={"gamma": 0.9, "lam": 0.9} if estimator == "gae" else {},
    )
    return AgentRLModule(
        policy=PolicyConfig(tiny=TINY),
        env=ENV,
        algorithm=algo,
        optim=OptimConfig(lr=5e-3),
        rollout=ROLLOUT,
        **kw,
    )


def _trainer(callbacks, max_epochs, **kw):
    return pl.Trainer(
        max_epochs=max_epochs,
        logger=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        enable_checkpointing=kw.pop("enable_checkpointing", False),
        **kw,
    )


def _loop(**kw):
    """An RSPOLoop for the tests of its mechanics (schedule, mixing counts, restore, resume):
    whole groups, and zero-advantage groups allowed into replay slots, because the untrained tiny
    model wins no episode here, so every group would otherwise be skipped (the skipping itself is
    tested on hand-built buffers)."""
    kw.setdefault("replay_unit", "group")
    loop = (StudyRSPOLoop if LEVERS & set(kw) else RSPOLoop)(**kw)
    loop.buffer.skip_zero_advantage = False
    return loop


def _dm(groups=4, ipe=5):
    return AgentDataModule(env=ENV, groups_per_iteration=groups, group_size=2, iterations_per_epoch=ipe, val_splits=[])


class Recorder(pl.Callback):
    """Records, per iteration, what the module saw and its state around the step."""

    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # runs after RSPOLoop's hook (callbacks run in list order)
        self.rows.append(
            {
                "phase": batch.plan.phase,
                "tag": batch.plan.policy_tag,
                "mode": batch.plan.reward_mode,
                "tasks": len(batch.tasks),
                "replay": len(batch.replay),
                "played": batch.played is not None,
                "params_before": _params(pl_module),
            }
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        row = self.rows[-1]
        row["params_after"] = _params(pl_module)
        row["metrics"] = {k: float(v) for k, v in trainer.callback_metrics.items()}
        row["actions"] = [t.action for tr in pl_module.last_trajectories for t in tr.turns]


def _params(module):
    return {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _opt_state(module):
    opt = module.optimizers()
    state = (opt.optimizer if hasattr(opt, "optimizer") else opt).state_dict()["state"]
    return {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for i, s in state.items()}


def test_phase_schedule_and_bitwise_restore_of_agent_a():
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=2, offline_ratio=0.25)
    rec = Recorder()

    class OptProbe(pl.Callback):
        def __init__(self):
            self.states = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.states.append(_opt_state(pl_module))

    probe = OptProbe()
    _trainer([loop, rec, probe], max_epochs=2).fit(m, _dm(ipe=5))
    phases = [loop.phase_of(i) for i in range(10)]
    assert phases == ["explore", "explore", "collect", "exploit", "exploit"] * 2
    assert [r["tag"] for r in rec.rows] == ["B", "B", "B", "A", "A"] * 2  # collect is played by B
    assert [r["mode"] for r in rec.rows][:5] == ["dense", "dense", "outcome", "outcome", "outcome"]
    # B trained during explore (weights moved), the collect iteration trained nothing
    assert not _equal(rec.rows[0]["params_before"], rec.rows[1]["params_after"])
    assert rec.rows[2]["phase"] == "collect" and rec.rows[2]["replay"] == 0  # B plays the tasks; no update
    assert _equal(rec.rows[2]["params_after"], rec.rows[0]["params_before"])  # ... and A is back
    # after B's phase, A's parameters and optimizer state are bitwise those from before it
    assert _equal(rec.rows[0]["params_before"], rec.rows[3]["params_before"])
    assert _equal(rec.rows[5]["params_before"], rec.rows[8]["params_before"])
    for it_a, it_b in [(0, 3), (5, 8)]:
        sa, sb = probe.states[it_a], probe.states[it_b]
        assert sa.keys() == sb.keys() and all(_equal(sa[i], sb[i]) for i in sa)
    # exploit batches: 4 groups, alpha 1/4 -> 1 replay group + 3 on-policy
    assert [(r["tasks"], r["replay"]) for r in rec.rows[3:5]] == [(3, 1), (3, 1)]
    # the buffer was cleared when the second loop began, then refilled by the second collect
    assert rec.rows[5]["metrics"]["rspo/buffer_size"] == 0
    assert rec.rows[7]["metrics"]["rspo/buffer_size"] == 4
    assert loop.counts == {"a_iterations": 4, "b_iterations": 4, "collected_groups": 8, "loops": 2}


def test_reward_swap_keeps_outcome_rewards_and_b_behaviour_logprobs():
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=1, offline_ratio=0.25)
    collected = []
    original = m.collect

    def spy(tasks, group_size, policy_tag="A", purpose="train", dense=False, **kw):
        out = original(tasks, group_size, policy_tag, purpose, dense=True, **kw)  # B's turns *do* carry dense rewards
        if purpose == "rspo_collect":
            collected.extend(out)
        return out

    m.collect = spy
    _trainer([loop], max_epochs=1).fit(m, _dm(ipe=2))  # explore, collect
    stored = [t for g in loop.buffer.groups for t in g]
    assert len(stored) == len(collected) == 8
    assert any(turn.dense_reward != 0 for t in collected for turn in t.turns), "vacuous: no dense reward to swap"
    # whatever the reward mode, a replayed turn trains on its outcome reward alone (batching.flatten)
    for mode in ("outcome", "dense", "outcome+dense"):
        flat = flatten(stored, mode)
        assert flat.rewards.tolist() == [turn.outcome_reward for t in collected for turn in t.turns]
        assert flat.dense.abs().sum() == 0
    for s, c in zip(stored, collected):
        assert s.policy_tag == "B" and s.source == "replay"
        for ts, tc in zip(s.turns, c.turns):
            assert torch.equal(ts.behaviour_logprobs, tc.behaviour_logprobs)
    # the originals handed out by collect are untouched by the swap
    assert any(turn.dense_reward != 0 for t in collected for turn in t.turns)


def test_replay_groups_per_rank_is_global_alpha_split_over_ranks():
    # 16 groups over all ranks (the paper's setting); expected counts worked out by hand:
    # alpha * 16 = 1, 2, 4, 8 replay groups in total, split evenly, the first ranks one more.
    expected = {
        (1, 1 / 16): [1],
        (1, 1 / 8): [2],
        (1, 1 / 4): [4],
        (1, 1 / 2): [8],
        (2, 1 / 16): [1, 0],
        (2, 1 / 8): [1, 1],
        (2, 1 / 4): [2, 2],
        (2, 1 / 2): [4, 4],
        (4, 1 / 16): [1, 0, 0, 0],
        (4, 1 / 8): [1, 1, 0, 0],
        (4, 1 / 4): [1, 1, 1, 1],
        (4, 1 / 2): [2, 2, 2, 2],
        (8, 1 / 16): [1] + [0] * 7,
        (8, 1 / 8): [1, 1] + [0] * 6,
        (8, 1 / 4): [1] * 4 + [0] * 4,
        (8, 1 / 2): [1] * 8,
        (16, 1 / 16): [1] + [0] * 15,
        (16, 1 / 8): [1, 1] + [0] * 14,
        (16, 1 / 4): [1] * 4 + [0] * 12,
        (16, 1 / 2): [1] * 8 + [0] * 8,
    }
    for (world, alpha), counts in expected.items():
        assert replay_groups_per_rank(16, world, alpha) == counts, (world, alpha)
    # the per-rank rounding this replaces: 2 groups per rank on 8 ranks, round(0.25) = 0 -> none at all
    assert sum(replay_groups_per_rank(16, 8, 1 / 8)) == 2
    # round half up on the total: 4 groups x 1/8 = 0.5 -> 1; 3 x 1/8 = 0.375 -> 0; 24 x 1/16 = 1.5 -> 2
    assert replay_groups_per_rank(4, 1, 1 / 8) == [1]
    assert replay_groups_per_rank(3, 1, 1 / 8) == [0]
    assert replay_groups_per_rank(24, 2, 1 / 16) == [1, 1]
    assert replay_groups_per_rank(16, 4, 0.0) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="offline_ratio"):
        replay_groups_per_rank(16, 2, 1.0)


def _trained_batches(monkeypatch) -> list:
    """The batches ``update.ppo_update`` is given from now on (the rows actually trained)."""
    seen = []
    original = update.ppo_update

    def spy(batch, *args, **kwargs):
        seen.append(batch)
        return original(batch, *args, **kwargs)

    monkeypatch.setattr(update, "ppo_update", spy)
    return seen


def test_generalised_clip_centre_on_replay_and_on_policy_rows(monkeypatch):
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=1, offline_ratio=0.25)
    seen = _trained_batches(monkeypatch)
    _trainer([loop], max_epochs=1).fit(m, _dm(ipe=3))  # explore, collect, exploit
    batch = seen[-1]  # the exploit iteration's batch
    rep, mask = batch.is_replay, batch.response_mask
    assert rep.any() and (~rep).any()
    centre = torch.exp(batch.old_logprobs - batch.behaviour_logprobs)
    assert (centre[~rep][mask[~rep]] == 1.0).all()  # on-policy: exactly PPO's centre
    # replay rows: old = A's log-probs now (recomputed), behaviour = B's; B moved, so c != 1
    assert (centre[rep][mask[rep]] - 1).abs().max() > 1e-4


def test_resume_in_the_middle_of_b_phase_reproduces_the_run(tmp_path):
    def run(epochs, ckpt=None, root=None):
        torch.manual_seed(123)
        m = _module()
        rec = Recorder()
        cbs = [_loop(k=2, offline_ratio=0.25), rec]
        kw = {}
        if root is not None:
            cbs.append(pl.callbacks.ModelCheckpoint(dirpath=root, save_last=True, every_n_epochs=1, save_top_k=-1))
            kw = {"enable_checkpointing": True}
        t = _trainer(cbs, max_epochs=epochs, **kw)
        t.fit(m, _dm(ipe=3), ckpt_path=ckpt, weights_only=True if ckpt else None)
        return m, rec.rows, cbs[0]

    full, full_rows, full_loop = run(3)  # iterations 0..8
    run(2, root=tmp_path)  # killed after iteration 5: B has done 1 of its 2 explore iterations
    resumed, resumed_rows, resumed_loop = run(3, ckpt=str(tmp_path / "last.ckpt"))
    assert [full_loop.phase_of(i) for i in range(6, 9)] == ["explore", "collect", "exploit"]
    assert len(resumed_rows) == 3
    for a, b in zip(full_rows[6:], resumed_rows):
        assert a["actions"] == b["actions"]
        assert _equal(a["params_after"], b["params_after"])
        keys = [k for k in b["metrics"] if k.startswith(("train/", "rollout", "rspo/"))]
        assert keys and {k: a["metrics"].get(k) for k in keys} == {k: b["metrics"][k] for k in keys}
    assert _equal(_params(full), _params(resumed))
    assert full_loop.counts == resumed_loop.counts


@pytest.mark.parametrize("estimator", ["gae", "gigpo"])
def test_rspo_runs_with_ppo_and_gigpo(estimator):
    torch.manual_seed(0)
    m = _module(estimator)
    loop = _loop(k=1, offline_ratio=0.25)
    rec = Recorder()
    _trainer([loop, rec], max_epochs=1).fit(m, _dm(ipe=3))
    assert rec.rows[2]["replay"] == 1 and math.isfinite(rec.rows[2]["metrics"]["train/policy_loss"])


def test_bad_arguments_and_missing_dense_source():
    for kw, match in [
        ({"k": 0}, "k must be >= 1"),
        ({"offline_ratio": 1.0}, r"offline_ratio must be in \[0, 1\)"),
        ({"explorer_reward": "x"}, "explorer_reward"),
        ({"replay_from": "x"}, "replay_from"),
        ({"collect_groups": 0}, "collect_groups"),
    ]:
        with pytest.raises(ValueError, match=match):
            RSPOLoop(**kw)
    m = AgentRLModule(policy=PolicyConfig(tiny=TINY), env=ENV, rollout=ROLLOUT)
    with pytest.raises(ValueError, match="needs a dense reward source.*EnvProgressReward"):
        _trainer([RSPOLoop()], max_epochs=1).fit(m, _dm())


def test_exploration_metric_counts_repeated_anchors_in_window():
    def traj(anchors):
        turns = [
            Turn(
                prompt_ids=torch.tensor([1]),
                response_ids=torch.tensor([1]),
                behaviour_logprobs=torch.tensor([0.0]),
                action="a",
                valid=True,
                observation="o",
                anchor=a,
            )
            for a in anchors
        ]
        return Trajectory(task=TaskSpec("x", "train", 0, 0), turns=turns)

    # a b a b c: with window 2 turns 3 and 4 repeat (2 of 5); window 1 none repeat
    assert repeat_visit_rate([traj("ababc")], 2) == pytest.approx(2 / 5)
    assert repeat_visit_rate([traj("ababc")], 1) == 0.0
    # two episodes pooled by turns: "aa" has 1 repeat -> (2 + 1) / 7
    assert repeat_visit_rate([traj("ababc"), traj("aa")], 2) == pytest.approx(3 / 7)


# -- reusable outside this package ------------------------------------------------------------


class MinimalAgent(pl.LightningModule):
    """Not an AgentRLModule: one scalar parameter, fake episodes, SGD; offers the RSPOAgent protocol."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.automatic_optimization = False
        self.iteration = 0
        self.dense_reward = "fake-source"
        self.last_trajectories = []
        self.seen = []

    def _episode(self, task, tag):
        turn = Turn(
            prompt_ids=torch.tensor([1]),
            response_ids=torch.tensor([1]),
            behaviour_logprobs=torch.tensor([float(self.w)]),
            action="go",
            valid=True,
            observation="o",
            anchor="s",
            outcome_reward=1.0,
            dense_reward=0.5,
        )
        return Trajectory(task=task, turns=[turn], success=True, policy_tag=tag)

    def collect(self, tasks, group_size, policy_tag="A", purpose="train"):
        return [self._episode(t, policy_tag) for t in tasks for _ in range(group_size)]

    def snapshot_trainable(self):
        return {"w": self.w.detach().clone(), "opt": self.optimizers().optimizer.state_dict()}

    def restore_trainable(self, snapshot):
        with torch.no_grad():
            self.w.copy_(snapshot["w"])
        self.optimizers().optimizer.load_state_dict(snapshot["opt"])

    def training_step(self, batch, batch_idx):
        plan = batch.plan  # the frozen IterationPlan RSPOLoop made for this iteration
        self.seen.append((plan.policy_tag, plan.reward_mode, len(batch.tasks), len(batch.replay), float(self.w)))
        if not plan.updates:  # RSPO's collect: B played in the loop's hook
            self.last_trajectories = []
            self.iteration += 1
            return
        self.last_trajectories = self.collect(batch.tasks, batch.group_size, plan.policy_tag)
        if batch.tasks or batch.replay:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(-self.w)  # every step moves w by +lr
            opt.step()
        self.iteration += 1

    def configure_optimizers(self):
        return torch.optim.SGD([self.w], lr=1.0)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch


def _identity(x):
    return x


def test_rspo_loop_drives_a_module_that_is_not_ours():
    m = MinimalAgent()
    loop = _loop(k=2, offline_ratio=1 / 8)
    pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[loop],
    ).fit(
        m,
        datamodule=AgentDataModule(
            env=ENV, groups_per_iteration=16, group_size=2, iterations_per_epoch=10, val_splits=[]
        ),
    )
    # (tag, mode, on-policy groups, replay groups, w at the step); in the collect iteration B
    # plays before the step (the module updates nothing), then A (w = 0) is restored
    assert m.seen[:5] == [
        ("B", "dense", 16, 0, 0.0),
        ("B", "dense", 16, 0, 1.0),
        ("B", "outcome", 16, 0, 0.0),
        ("A", "outcome", 14, 2, 0.0),
        ("A", "outcome", 14, 2, 1.0),
    ]
    assert m.seen[5][4] == 2.0 and m.seen[8][4] == 2.0  # A restored after the second B phase
    stored = [t for g in loop.buffer.groups for t in g]
    assert stored and all(turn.outcome_reward == 1.0 for t in stored for turn in t.turns)
    assert flatten(stored, "dense").rewards.tolist() == [1.0] * len(stored)  # replayed: the outcome alone


def test_rspo_loop_names_what_a_module_lacks():
    class NotAnAgent(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.iteration = 0

    loop = RSPOLoop(explorer_reward="outcome")
    with pytest.raises(
        TypeError,
        match=r"RSPOAgent.*lacks \['dense_reward', 'last_trajectories', 'collect', 'snapshot_trainable', 'restore_trainable'\]",
    ):
        loop.setup(None, NotAnAgent(), "fit")


def test_validation_during_b_phase_measures_agent_a():
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=2, offline_ratio=0.25)
    seen = {}

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if pl_module.iteration == 0:
                seen["a"] = _params(pl_module)

        def on_validation_start(self, trainer, pl_module):  # after RSPOLoop's hook
            seen["val"] = _params(pl_module)

        def on_validation_end(self, trainer, pl_module):
            seen["after_val"] = _params(pl_module)

    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[loop, Probe()],
    )
    dm = AgentDataModule(
        env=ENV,
        groups_per_iteration=4,
        group_size=2,
        iterations_per_epoch=2,
        val_splits=["valid_seen"],
        num_val_tasks=2,
    )
    trainer.fit(m, dm)  # one epoch of 2 iterations: validation runs after B's 2 explore iterations
    assert _equal(seen["val"], seen["a"])
    assert not _equal(seen["after_val"], seen["a"]) and _equal(seen["after_val"], _params(m))


# -- the replay carries gradient, alpha is a weight ----------------------------------------------


def _hand_traj(group_id, won, n_turns=1):
    turns = [
        Turn(
            prompt_ids=torch.tensor([1, 2]),
            response_ids=torch.tensor([3]),
            behaviour_logprobs=torch.tensor([-0.5]),
            action="go",
            valid=True,
            observation="o",
            anchor=f"s{t}",
            outcome_reward=10.0 if won and t == n_turns - 1 else 0.0,
        )
        for t in range(n_turns)
    ]
    return Trajectory(task=TaskSpec("rspo/Household-v0", "train", group_id, group_id), turns=turns, success=won)


def test_default_replay_draws_only_trajectories_that_carry_advantage():
    torch.manual_seed(0)
    m = _module()  # GRPO
    loop = RSPOLoop()  # the defaults: single trajectories, reward sampling, zero-advantage items skipped
    loop._advantages = m.outcome_advantages
    all_won = [_hand_traj(0, True), _hand_traj(0, True)]
    mixed = [_hand_traj(1, True), _hand_traj(1, False)]
    all_failed = [_hand_traj(2, False), _hand_traj(2, False)]
    loop._store(all_won + mixed + all_failed, count=True)
    # GRPO over each full group, by hand: returns [10, 0] -> mean 5, unbiased std sqrt(50) = 7.0711,
    # so +-5 / 7.0711 = +-0.70711; all-equal groups give exactly 0
    stored = [[t.turns[0].replay_advantage for t in g] for g in loop.buffer.groups]
    assert stored[0] == [0.0, 0.0] and stored[2] == [0.0, 0.0]
    assert stored[1] == pytest.approx([0.70711, -0.70711], abs=1e-4)
    assert loop.buffer.num_candidates() == 2  # the two trajectories of the mixed group
    for _ in range(20):
        drawn = [t for g in loop.buffer.sample(4) for t in g]
        assert sorted(t.success for t in drawn) == [False, True] and all(t.task.group_id == 1 for t in drawn)
    # and they train with that advantage: the module's estimator rows for replay take the stored value
    replay = loop.buffer.sample(1)  # reward sampling prefers the win
    flat = flatten([t for g in replay for t in g])
    advantages = turn_advantages(flat, m.algo)[0].advantages
    assert advantages.tolist() == pytest.approx([0.70711], abs=1e-4)
    # whole groups: only the mixed group is ever drawn
    loop.buffer.unit = "group"
    assert [[t.success for t in g] for g in loop.buffer.sample(3)] == [[True, False]]


def test_validate_and_predict_of_a_mid_b_checkpoint_measure_agent_a(tmp_path):
    from rspo_lightning.callbacks import IterationCheckpoint
    from rspo_lightning.trajectory_io import load_trajectories

    torch.manual_seed(0)
    m = _module()
    ckpt = IterationCheckpoint(dirpath=str(tmp_path), every_n_iterations=1)
    # one epoch of 1 iteration: B has explored once, so the checkpoint holds B's weights and A's snapshot
    _trainer([_loop(k=2), ckpt], max_epochs=1, enable_checkpointing=True).fit(m, _dm(ipe=1))
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)
    snapshot = next(v["snapshot"] for v in state["callbacks"].values() if isinstance(v, dict) and "snapshot" in v)
    assert snapshot is not None and any(
        not torch.equal(snapshot["params"][k], state["state_dict"][k]) for k in snapshot["params"]
    )
    dm = AgentDataModule(env=ENV, groups_per_iteration=4, group_size=2, val_splits=["valid_seen"], num_val_tasks=3)
    for stage in ("validate", "predict"):
        fresh = _module(predict_path=str(tmp_path / "episodes.jsonl"))
        trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)  # no RSPOLoop here
        getattr(trainer, stage)(fresh, dm, ckpt_path=str(tmp_path / "last.ckpt"), weights_only=True)
        params = dict(fresh.named_parameters())
        assert all(torch.equal(params[k], v) for k, v in snapshot["params"].items()), stage  # agent A, not B
    episodes = load_trajectories(str(tmp_path / "episodes.jsonl"))
    assert sorted(t.task.task_id for t in episodes) == [0, 1, 2] and all(t.turns for t in episodes)


def test_online_baseline_joins_a_replayed_win_to_a_s_group_on_the_same_task():
    from rspo_lightning.rspo.buffer import mix_replay

    m = _module()  # GRPO
    loop = RSPOLoop(replay_baseline="online")
    loop._advantages = m.outcome_advantages
    loop._store([_hand_traj(3, True), _hand_traj(3, True)], count=True)  # all-won: stored advantage 0
    assert loop.buffer.num_candidates() == 2  # still drawable: its advantage is decided against A's group
    replay = loop.buffer.sample(1)
    tasks = [TaskSpec("rspo/Household-v0", "train", 5, 100), TaskSpec("rspo/Household-v0", "train", 6, 101)]
    tasks, mixed = mix_replay(tasks, replay, 2, join_online=True)
    # one trajectory takes ceil(1/2) = 1 slot; the remaining group (id 100) now plays the replayed task 3
    assert tasks == [TaskSpec("rspo/Household-v0", "train", 3, 100)]
    joined = mixed[0][0]
    assert joined.joins_online and joined.task.group_id == 100 and joined.turns[0].replay_advantage is None
    assert loop.buffer.groups[0][0].turns[0].replay_advantage == 0.0  # the buffer's copy is untouched
    a_fails = [_hand_traj(100, False), _hand_traj(100, False)]
    for t in a_fails:
        t.task = TaskSpec("rspo/Household-v0", "train", 3, 100)
    flat = flatten(a_fails + [joined])
    advantages = turn_advantages(flat, m.algo)[0].advantages
    # GRPO over returns [0, 0, 10] by hand: mean 10/3, unbiased std sqrt(((10/3)^2 * 2 + (20/3)^2) / 2) = 5.7735
    assert advantages.tolist() == pytest.approx([-0.57735, -0.57735, 1.15470], abs=1e-4)


def test_a_fit_with_the_online_baseline_trains_replay_in_a_s_groups():
    torch.manual_seed(0)
    m = _module()
    loop = RSPOLoop(k=1, offline_ratio=0.25, replay_baseline="online")
    seen = {}

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch.plan.policy_tag == "A":
                seen["tasks"] = [t.task_id for t in batch.tasks]
                seen["replay"] = [t for g in batch.replay for t in g]

    _trainer([loop, Probe()], max_epochs=1).fit(m, _dm(ipe=3))  # explore, collect, exploit
    # 4 groups x alpha 1/4 = 1 group's worth (2 trajectories) of replay, 3 on-policy groups
    assert len(seen["replay"]) == 2 and len(seen["tasks"]) == 3
    assert all(t.joins_online and t.task.task_id in seen["tasks"] for t in seen["replay"])
    assert math.isfinite(float(m.trainer.callback_metrics["rspo/replay_adv_abs"]))


# -- B's data used, slots that carry signal, fair ends, metrics of the policy they name ---------


def test_explore_and_collect_rollouts_all_enter_d_with_their_behaviour_logprobs():
    """``buffer_from: explore+collect``: after one loop D holds the episodes of all k + 1 of B's
    iterations (k explore, 1 collect), each turn with the behaviour log-probs recorded when it
    was played and its advantage under A's estimator over its group."""
    torch.manual_seed(0)
    m = _module()
    loop = StudyRSPOLoop(k=2, offline_ratio=0.25, buffer_from="explore+collect")
    played = []
    original = m.collect

    collected = []

    def spy(*args, **kw):
        out = original(*args, **kw)
        played.extend((t.iteration, [turn.behaviour_logprobs.clone() for turn in t.turns]) for t in out)
        if kw.get("purpose") == "rspo_collect":
            collected.extend(out)
        return out

    m.collect = spy
    seen = {}
    rec = Recorder()

    class Probe(pl.Callback):  # D at the end of the collect iteration (before A's exploit draws)
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if loop.phase_of(pl_module.iteration - 1) == "collect":
                seen["d"] = [t for g in loop.buffer.groups for t in g]

    _trainer([loop, Probe(), rec], max_epochs=1).fit(m, _dm(ipe=3))  # explore, explore, collect
    stored = seen["d"]
    # rollout_collect/* measure the collecting policy B_k's own episodes: a hand count
    assert len(collected) == 8
    metrics = rec.rows[2]["metrics"]
    assert metrics["rollout_collect/success_rate"] == pytest.approx(sum(t.success for t in collected) / 8)
    assert metrics["rollout_collect/progress"] == pytest.approx(sum(t.turns[-1].progress for t in collected) / 8)
    assert len(stored) == 3 * 4 * 2 == len(played)  # 3 B iterations x 4 groups x 2 episodes
    assert sorted({t.iteration for t in stored}) == [0, 1, 2] and all(t.policy_tag == "B" for t in stored)
    by_play = {}
    for iteration, recorded in played:
        by_play.setdefault(iteration, []).append(recorded)
    for iteration in (0, 1, 2):
        mine = [[turn.behaviour_logprobs for turn in t.turns] for t in stored if t.iteration == iteration]
        assert len(mine) == len(by_play[iteration]) == 8
        for a, b in zip(mine, by_play[iteration]):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(turn.replay_advantage is not None for t in stored for turn in t.turns)
    assert flatten(stored, "dense").dense.abs().sum() == 0  # replayed rows carry no dense reward
    assert loop.counts["collected_groups"] == 12


def test_collect_baseline_plays_a_on_the_collection_s_tasks_outside_d_and_the_budget():
    """``collect_baseline``: after B's collection the restored A (its weights from the loop's
    start) plays the same tasks with the same group size; nothing of it enters D, its steps stay
    out of ``env_steps``, and the logged comparison is the hand count on the two sets of episodes."""
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=1, offline_ratio=0.25, collect_baseline=True)
    calls, start, steps = [], {}, []
    original = m.collect

    def spy(tasks, group_size, policy_tag="A", purpose="train", **kw):
        out = original(tasks, group_size, policy_tag=policy_tag, purpose=purpose, **kw)
        calls.append((purpose, policy_tag, [t.task_id for t in tasks], group_size, _params(m), out))
        return out

    m.collect = spy

    class Probe(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            start.update(_params(pl_module))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            steps.append(pl_module.env_steps)
            if loop.phase_of(pl_module.iteration - 1) == "collect":
                start["d_tags"] = {t.policy_tag for g in loop.buffer.groups for t in g}

    rec = Recorder()
    _trainer([loop, Probe(), rec], max_epochs=1).fit(m, _dm(ipe=3))  # explore, collect, exploit
    by_purpose = {c[0]: c for c in calls if c[0].startswith("rspo_collect")}
    _, b_tag, b_tasks, b_size, _, b_eps = by_purpose["rspo_collect"]
    _, a_tag, a_tasks, a_size, a_params, a_eps = by_purpose["rspo_collect_baseline"]
    assert (b_tag, a_tag) == ("B", "A") and a_tasks == b_tasks and a_size == b_size == 2
    assert len(a_eps) == len(b_eps) == 8
    assert _equal(a_params, {k: v for k, v in start.items() if k != "d_tags"})  # A: B trained in iteration 0
    assert start["d_tags"] == {"B"}  # A's baseline episodes are not stored
    assert steps[1] - steps[0] == sum(len(t.turns) for t in b_eps)  # the collect iteration counts B's steps only
    metrics = rec.rows[1]["metrics"]
    a_success = sum(t.success for t in a_eps) / 8
    b_success = sum(t.success for t in b_eps) / 8
    assert metrics["rollout_collect_a/success_rate"] == pytest.approx(a_success)
    assert metrics["rollout_collect_a/progress"] == pytest.approx(sum(t.turns[-1].progress for t in a_eps) / 8)
    assert metrics["rspo/collect_minus_a"] == pytest.approx(b_success - a_success)
    assert metrics["rspo/collect_baseline_env_steps"] == sum(len(t.turns) for t in a_eps)


def test_without_the_collect_phase_the_last_explore_iteration_is_the_collection():
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=2, offline_ratio=0.25, collect_phase=False)
    rec = Recorder()
    _trainer([loop, rec], max_epochs=1).fit(m, _dm(ipe=4))
    assert [loop.phase_of(i) for i in range(8)] == ["explore", "explore", "exploit", "exploit"] * 2
    assert loop.loop_length == 4 and [loop.at_loop_end(i) for i in range(1, 9)] == [False, False, False, True] * 2
    assert [r["tag"] for r in rec.rows] == ["B", "B", "A", "A"]
    assert _equal(rec.rows[0]["params_before"], rec.rows[2]["params_before"])  # A restored after B's last iteration
    assert [(r["tasks"], r["replay"]) for r in rec.rows[2:]] == [(3, 1), (3, 1)]
    stored_iterations = {t.iteration for g in loop.buffer.groups for t in g}
    assert stored_iterations == {1}  # buffer_from: collect = the last explore iteration's episodes
    assert "rollout_collect/success_rate" in rec.rows[1]["metrics"] and "rollout_b1/progress" in rec.rows[1]["metrics"]


def test_exploit_k_gives_a_more_iterations_per_loop_than_b():
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=1, exploit_k=3, offline_ratio=0.25)
    rec = Recorder()
    _trainer([loop, rec], max_epochs=2).fit(m, _dm(ipe=5))
    # one loop: 1 explore + 1 collect + 3 exploit = 5 iterations, A ends it
    assert [loop.phase_of(i) for i in range(10)] == ["explore", "collect", "exploit", "exploit", "exploit"] * 2
    loop_ends = ([False] * 4 + [True]) * 2
    assert loop.loop_length == 5 and [loop.at_loop_end(i) for i in range(1, 11)] == loop_ends
    assert [r["tag"] for r in rec.rows] == ["B", "B", "A", "A", "A"] * 2
    assert _equal(rec.rows[0]["params_before"], rec.rows[2]["params_before"])  # A restored after the collect
    assert [(r["tasks"], r["replay"]) for r in rec.rows if r["tag"] == "A"] == [(3, 1)] * 6
    assert loop.counts == {"a_iterations": 6, "b_iterations": 2, "collected_groups": 8, "loops": 2}
    with pytest.raises(ValueError, match="exploit_k must be >= 1"):
        StudyRSPOLoop(k=1, exploit_k=0)


def test_positive_slots_take_only_wins_and_give_the_free_slots_back_to_online_groups():
    """A buffer with 3 wins and 10 losses (mixed groups, so every one carries signal) and 16 replay
    slots (2 groups of 8): ``positive`` draws exactly the 3 wins; they fill ceil(3/8) = 1 group's
    slots, so 15 of the 16 groups play on-policy (the other replay group's 8 slots go back
    online), and α becomes an upper bound: 1/8 x 3/16."""
    m = _module()
    loop = StudyRSPOLoop(offline_ratio=0.125, replay_slots="positive")
    loop._advantages = m.outcome_advantages
    groups = [
        [_hand_traj(0, True)] + [_hand_traj(0, False) for _ in range(4)],
        [_hand_traj(1, True)] + [_hand_traj(1, False) for _ in range(3)],
        [_hand_traj(2, True)] + [_hand_traj(2, False) for _ in range(3)],
    ]
    loop._store([t for g in groups for t in g], count=True)
    assert loop.buffer.num_trajectories() == 13 and loop.buffer.num_wins() == 3
    assert loop.buffer.num_candidates() == 3  # the losses carry (negative) signal, but not positive
    batch = IterationBatch(tasks=[TaskSpec("rspo/Household-v0", "train", i, 100 + i) for i in range(16)], group_size=8)
    assert loop.phase_of(5) == "exploit"  # k = 3: explore 0-2, collect 3, exploit 4-6
    dm = AgentDataModule(env=ENV, groups_per_iteration=16, group_size=8, val_splits=[])
    dm.attach_replay(loop.buffer, loop)
    batch = dm.compose(batch, 5)  # the data module draws D with the loop's plan of iteration 5
    drawn = [t for g in batch.replay for t in g]
    assert len(drawn) == 3 and all(t.success for t in drawn)
    assert len(batch.tasks) == 15
    assert batch.plan.replay_weight.alpha == pytest.approx(0.125 * 3 / 16)
    # the signal default draws 16 of the 13 (all carry signal) and keeps alpha
    signal = RSPOLoop(offline_ratio=0.125)
    signal._advantages = m.outcome_advantages
    signal._store([t for g in groups for t in g], count=True)
    assert sum(len(g) for g in signal.buffer.sample(16)) == 13
    # positive_repeat fills all 16 slots with the 3 wins, each drawn again only after all were drawn
    repeat = StudyRSPOLoop(offline_ratio=0.125, replay_slots="positive_repeat")
    repeat._advantages = m.outcome_advantages
    repeat._store([t for g in groups for t in g], count=True)
    wins = [t for g in repeat.buffer.sample(16) for t in g]
    assert len(wins) == 16 and all(t.success for t in wins)
    assert sorted({t.task.group_id for t in wins}) == [0, 1, 2]
    assert sorted(sum(t.task.group_id == g for t in wins) for g in range(3)) == [5, 5, 6]
    with pytest.raises(ValueError, match="needs unit='trajectory'"):
        StudyRSPOLoop(replay_slots="positive", replay_unit="group")


def test_buffer_used_fraction_and_wins_by_hand():
    m = _module()
    loop = RSPOLoop(offline_ratio=0.125)
    loop._advantages = m.outcome_advantages
    loop._store([_hand_traj(0, True), _hand_traj(0, False), _hand_traj(1, False), _hand_traj(1, False)], count=True)
    assert loop.buffer.used_fraction() == 0.0 and loop.buffer.num_wins() == 1
    loop.buffer.sample(5)  # only the 2 trajectories of the mixed group carry signal
    assert loop.buffer.used_fraction() == pytest.approx(2 / 4)
    loop.buffer.sample(5)  # drawing them again adds no distinct trajectory
    assert loop.buffer.used_fraction() == pytest.approx(2 / 4)
    state = loop.buffer.state_dict()
    fresh = RSPOLoop().buffer
    fresh.load_state_dict(state)
    assert fresh.used_fraction() == pytest.approx(2 / 4) and fresh.next_serial == 2
    fresh.clear()
    assert fresh.used_fraction() == 0.0 and fresh.drawn == set()


def test_an_rspo_run_under_a_budget_ends_at_a_loop_boundary_and_validates_agent_a():
    """The budget is crossed inside B's first explore iterations; the run goes on to the end of the
    loop (explore, explore, collect, exploit, exploit) and validates A there."""
    from rspo_lightning.callbacks import EnvStepBudget

    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=2, offline_ratio=0.25)
    seen = {}

    class Probe(pl.Callback):
        def on_validation_start(self, trainer, pl_module):  # after RSPOLoop's hook
            if not trainer.sanity_checking:
                seen.setdefault("validated_at", []).append(pl_module.iteration)
                seen["snapshot"] = loop.snapshot

    trainer = pl.Trainer(
        max_epochs=10,
        logger=False,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[loop, EnvStepBudget(max_env_steps=1), Probe()],
    )
    dm = AgentDataModule(
        env=ENV,
        groups_per_iteration=4,
        group_size=2,
        iterations_per_epoch=5,
        val_splits=["valid_seen"],
        num_val_tasks=2,
    )
    trainer.fit(m, dm)
    assert m.iteration == 5 and loop.counts["loops"] == 1 and loop.counts["a_iterations"] == 2
    assert seen["validated_at"] == [5] and seen["snapshot"] is None  # A is the module's weights: nothing swapped

    # with a loop that does not coincide with an epoch (3 iterations per epoch), the run still ends at iteration 5
    torch.manual_seed(0)
    m2, loop2 = _module(), _loop(k=2, offline_ratio=0.25)
    pl.Trainer(
        max_epochs=10,
        logger=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[loop2, EnvStepBudget(max_env_steps=1)],
    ).fit(m2, _dm(ipe=3))
    assert m2.iteration == 5


def test_an_rspo_run_killed_in_its_last_validation_resumes_to_it_not_to_another_loop(tmp_path):
    """Resumed after the loop that spent the budget, the run validates agent A and ends: no B of
    a next loop is explored."""
    from module_helpers import KilledInValidation, ValidationProbe, fit_checkpointed

    from rspo_lightning.callbacks import EnvStepBudget

    seen = []

    def fit(crash: bool, ckpt_path=None):
        torch.manual_seed(0)
        m, loop = _module(), _loop(k=2, offline_ratio=0.25)
        callbacks = [loop, EnvStepBudget(max_env_steps=1)]
        fit_checkpointed(m, ENV, callbacks, tmp_path, ValidationProbe(seen, crash), 4, 10, ckpt_path)
        return m, loop

    with pytest.raises(KilledInValidation):
        fit(crash=True)
    m, loop = fit(crash=False, ckpt_path=str(tmp_path / "last.ckpt"))
    (it, steps, weights), again = seen
    assert it == 5 and again[:2] == (5, steps) and m.iteration == 5 and m.env_steps == steps
    assert loop.counts["loops"] == 1 and loop.counts["b_iterations"] == 2  # restored: no B of a second loop
    assert all(torch.equal(weights[k], again[2][k]) for k in weights)  # agent A both times


def test_replay_token_share_logged_is_the_hand_count_over_the_rows_trained(monkeypatch):
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=1, offline_ratio=0.25)
    trained = _trained_batches(monkeypatch)
    rec = Recorder()
    _trainer([loop, rec], max_epochs=1).fit(m, _dm(ipe=3))  # explore, collect, exploit
    batch = trained[-1]
    tokens = batch.response_mask.sum(-1).float()
    assert batch.is_replay.any()
    hand = float(tokens[batch.is_replay].sum() / tokens.sum())
    assert rec.rows[2]["metrics"]["rspo/replay_token_share"] == pytest.approx(hand)
    # B_1's distance from A over the replayed tokens trained, from the scored batch (old = A's)
    log_ratio = (batch.behaviour_logprobs - batch.old_logprobs)[batch.response_mask & batch.is_replay[:, None]]
    assert float(log_ratio.abs().max()) > 1e-4  # B made one update: its log-probs are not A's
    assert rec.rows[2]["metrics"]["rspo/replay_log_ratio"] == pytest.approx(float(log_ratio.mean()))
    assert "rollout_b0/success_rate" in rec.rows[0]["metrics"] and "rollout_collect/progress" in rec.rows[1]["metrics"]
    assert "rspo/replay_loss_share" in rec.rows[2]["metrics"] and "rspo/buffer_used_frac" in rec.rows[2]["metrics"]


def test_signal_alpha_logged_is_the_hand_count_over_the_signal_carrying_rows(monkeypatch):
    """``offline_weighting: signal``: A's iteration logs rspo/alpha = the replayed rows' share of
    the trained tokens with a non-zero advantage (hand count over the rows actually trained). The
    untrained tiny model wins nothing, so every row's advantage is set to -1, 0, 1, -1, 0, 1, ...
    (whatever the estimator said): both parts then carry signal on some rows only."""
    import dataclasses

    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=1, offline_ratio=0.25, offline_weighting="signal")
    original = update.with_advantages

    def patterned(batch, result):
        out = original(batch, result)
        return dataclasses.replace(out, advantages=(torch.arange(len(out)) % 3 - 1).float())

    monkeypatch.setattr(update, "with_advantages", patterned)
    trained = _trained_batches(monkeypatch)
    rec = Recorder()
    _trainer([loop, rec], max_epochs=1).fit(m, _dm(ipe=3))  # explore, collect, exploit
    batch = trained[-1]
    signal = batch.advantages != 0
    tokens = batch.response_mask.sum(-1).float() * signal
    assert batch.is_replay.any() and bool(signal[batch.is_replay].any())
    hand = float(tokens[batch.is_replay].sum() / tokens.sum())
    assert 0 < hand < 1 and rec.rows[2]["metrics"]["rspo/alpha"] == pytest.approx(hand)
    assert "rspo/alpha" not in rec.rows[0]["metrics"]  # B's explore iteration has no replay


def test_explorer_levers_lr_scale_temperature_and_turn_credit_reach_b_only():
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=1, offline_ratio=0.25, explorer_lr_scale=3.0, explorer_temperature=1.5, explorer_credit="turn")
    seen = []

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # after RSPOLoop's hook
            seen.append(
                (
                    batch.plan.policy_tag,
                    pl_module.optimizers().optimizer.param_groups[0]["lr"],
                    pl_module.lr_schedulers().get_last_lr()[0],
                    batch.plan.temperature,
                    batch.plan.credit,
                )
            )

    _trainer([loop, Probe()], max_epochs=1).fit(m, _dm(ipe=3))
    (tag_b, lr_b, sched_b, temp_b, credit_b), _, (tag_a, lr_a, sched_a, temp_a, credit_a) = seen
    assert tag_b == "B" and lr_b == pytest.approx(3.0 * sched_b) and temp_b == 1.5 and credit_b == "turn"
    assert tag_a == "A" and lr_a == pytest.approx(sched_a) and temp_a is None and credit_a == "trajectory"


def test_a_persistent_explorer_continues_from_the_previous_b_and_resyncs_every_n_loops():
    torch.manual_seed(0)
    m = _module()
    loop = _loop(k=1, offline_ratio=0.25, explorer_resync_every=2)
    rec = Recorder()
    _trainer([loop, rec], max_epochs=3).fit(m, _dm(ipe=3))  # 3 loops: explore, collect, exploit
    # loop 1: B := A; loop 2: B continues from B's weights after loop 1's explore; loop 3: B := A again
    b_after_loop1 = rec.rows[0]["params_after"]
    assert _equal(rec.rows[3]["params_before"], b_after_loop1) and not _equal(
        rec.rows[3]["params_before"], rec.rows[2]["params_after"]
    )
    assert _equal(rec.rows[6]["params_before"], rec.rows[5]["params_after"])  # resync: the loop starts from A
    # A itself is restored bitwise after every B phase
    assert _equal(rec.rows[4]["params_before"], rec.rows[2]["params_after"])
    assert loop.state_dict()["b_state"] is not None


def test_reuse_a_episodes_trains_b_first_on_a_s_last_exploit_episodes():
    """``reuse_a_episodes``: B_0 = A's first update of a loop is on A's last exploit episodes,
    rescored with B's dense reward; it plays nothing (no environment step), stores nothing in D,
    and B still collects with its own weights."""
    torch.manual_seed(0)
    m = _module(dense_reward=NoveltyBonus(bonus=0.1))  # novelty differs between episodes: B has a signal
    loop = _loop(k=1, exploit_k=2, offline_ratio=0.25, reuse_a_episodes=True)
    plays, trained, d_after_collect = [], {}, {}
    original = m.collect

    def spy(*args, **kw):
        out = original(*args, **kw)
        plays.append((m.iteration, kw.get("purpose", "train"), sum(len(t.turns) for t in out)))
        return out

    m.collect = spy

    class Probe(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            n = pl_module.iteration - 1
            trained[n] = (pl_module.last_trajectories, pl_module.env_steps)
            if loop.phase_of(n) == "collect":
                d_after_collect[n] = {t.iteration for g in loop.buffer.groups for t in g}

    rec = Recorder()
    _trainer([loop, Probe(), rec], max_epochs=2).fit(m, _dm(ipe=4))  # 2 loops: explore, collect, exploit x 2
    assert [loop.phase_of(i) for i in range(8)] == ["explore", "collect", "exploit", "exploit"] * 2
    # loop 1 plays its explore iteration; loop 2's (iteration 4) plays nothing: 7 rollouts, not 8
    assert [(n, p) for n, p, _ in plays] == [(0, "train"), (1, "rspo_collect"), (2, "train"), (3, "train")] + [
        (5, "rspo_collect"),
        (6, "train"),
        (7, "train"),
    ]
    assert trained[4][1] == trained[3][1]  # no environment step in iteration 4
    assert m.env_steps == sum(steps for _, _, steps in plays)
    assert rec.rows[4]["played"] and rec.rows[4]["tag"] == "B"
    # what B trained on in iteration 4 is A's iteration-3 episodes: same actions, behaviour log-probs
    # (the very tensors), and the dense reward recomputed by hand for each
    a_eps, b_eps = trained[3][0], trained[4][0]
    # A played 3 groups x 2 in iteration 3 (the 4th group's slot was a replay, not re-used)
    assert len(b_eps) == len(a_eps) == 6 and all(t.iteration == 3 and t.policy_tag == "A" for t in b_eps)
    for a, b in zip(a_eps, b_eps):
        assert [t.action for t in a.turns] == [t.action for t in b.turns]
        assert all(x.behaviour_logprobs is y.behaviour_logprobs for x, y in zip(a.turns, b.turns))
        assert [t.dense_reward for t in b.turns] == pytest.approx(NoveltyBonus(bonus=0.1).turn_rewards(a))
        assert all(t.dense_reward == 0.0 for t in a.turns)  # A's own copies are untouched
    assert not _equal(rec.rows[4]["params_before"], rec.rows[4]["params_after"])  # B_0 did update
    assert _equal(rec.rows[4]["params_before"], rec.rows[6]["params_before"])  # A restored after the collect
    assert d_after_collect == {1: {1}, 5: {5}}  # D: the collections only, A's re-used episodes not stored again
    # the held episodes survive a checkpoint round trip; k = 1 without a collect phase is refused
    held = _loop(k=1, reuse_a_episodes=True)
    held.a_last = a_eps
    again = _loop(k=1, reuse_a_episodes=True)
    again.load_state_dict(held.state_dict())
    assert [[t.action for t in e.turns] for e in again.a_last] == [[t.action for t in e.turns] for e in a_eps]
    with pytest.raises(ValueError, match="reuse_a_episodes with k=1 and collect_phase=False"):
        StudyRSPOLoop(k=1, collect_phase=False, reuse_a_episodes=True)


def test_a_small_rspo_loop_logs_exactly_what_the_code_before_issue_45_logged():
    """Issue 45 moved D into the DataModule and made the plan frozen, "behaviour unchanged": every
    logged scalar but ``perf/*`` of a small RSPO run (one loop, k = 2, group replay) equals the
    trace the code before the move wrote (``tests/fixtures/rspo_loop_trace_before_issue45.json``,
    ``benchmarks/scalar_trace.py`` at commit 53b8c36, one thread). Bitwise on the machine that wrote
    it; 1e-6 relative here, in case another CPU's float kernels round differently."""
    import importlib.util
    import json
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("scalar_trace", os.path.join(root, "benchmarks", "scalar_trace.py"))
    trace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trace)
    with open(os.path.join(root, "tests", "fixtures", "rspo_loop_trace_before_issue45.json")) as f:
        before = json.load(f)
    after = trace.run(
        ["configs/compare/grpo_rspo.yaml", "configs/smoke.yaml"],
        [
            "--data.iterations_per_epoch=7",
            "--data.groups_per_iteration=2",
            "--data.group_size=4",
            "--model.rollout.max_turns=4",
            "--trainer.callbacks.init_args.k=2",
            "--trainer.callbacks.init_args.replay_unit=group",
        ],
    )
    assert sorted(after) == sorted(before)
    assert any(tag.startswith("rspo/") for tag in after) and len(after["rollout/env_steps"]) == 7
    for tag, points in before.items():
        assert len(after[tag]) == len(points), tag
        for (s0, v0), (s1, v1) in zip(points, after[tag]):
            assert s0 == s1 and math.isclose(v0, v1, rel_tol=1e-6, abs_tol=1e-9), (tag, s0, v0, v1)
