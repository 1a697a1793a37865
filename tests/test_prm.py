"""SPA-RL process reward model: packing, loss, read positions, training, the dense reward."""

from __future__ import annotations

import math
import os

import lightning.pytorch as pl
import pytest
import torch

from rspo_lightning.config import OptimConfig, PolicyConfig
from rspo_lightning.datamodules import TrajectoryEpisodeDataModule
from rspo_lightning.prm import ProcessRewardModule, ProgressHead, pack_episode, prm_loss
from rspo_lightning.rewards import DenseReward, ProcessRewardModelReward, assign_dense_rewards, grounding_bonus
from rspo_lightning.trajectory_io import save_trajectories
from rspo_lightning.types import TaskSpec, Trajectory, Turn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def policy_dir(tiny_policy, tmp_path_factory):
    """The session's tiny policy saved as a Hugging Face directory (a PRM backbone source)."""
    model, tok = tiny_policy
    d = str(tmp_path_factory.mktemp("prm_backbone"))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def make_module(policy_dir, **kw) -> ProcessRewardModule:
    module = ProcessRewardModule(policy=PolicyConfig(source=policy_dir), **kw)
    module.configure_model()
    return module


def turn(prompt, response, observation="", valid=True, outcome=0.0):
    return Turn(
        prompt_ids=torch.tensor(prompt, dtype=torch.long),
        response_ids=torch.tensor(response, dtype=torch.long),
        behaviour_logprobs=torch.zeros(len(response)),
        action="a",
        valid=valid,
        observation=observation,
        anchor="",
        outcome_reward=outcome,
    )


def traj(turns, score=0.0, task_id=0):
    return Trajectory(task=TaskSpec("rspo/Household-v0", "train", task_id), turns=turns, score=score, success=score > 0)


def set_constant_head(module, value):
    """Last Linear: weight 0, bias ``value`` (``linear``) or atanh(``value``) (``mlp_tanh``, whose
    output goes through a tanh) -> c_t = value for every turn."""
    last = module.head.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(math.atanh(value) if module.head.kind == "mlp_tanh" else value)


# --------------------------------------------------------------------------- pure pieces


def test_pack_episode_layout_reads_and_trimming():
    segs = [([5, 6, 7], [9, 10]), ([20, 21], [12])]
    ids, reads = pack_episode(segs, max_length=100)
    assert ids == [5, 6, 7, 9, 10, 20, 21, 12] and reads == [4, 7]
    # 6 tokens: responses take 3, contexts (3, 2 tokens) share 3: common cap 1 leaves one spare
    # token, which the later turn keeps -> contexts [7] and [20, 21].
    ids, reads = pack_episode(segs, max_length=6)
    assert ids == [7, 9, 10, 20, 21, 12] and reads == [2, 5]
    # 4 tokens: one context token left; the later turn keeps it.
    ids, reads = pack_episode(segs, max_length=4)
    assert ids == [9, 10, 21, 12] and reads == [1, 3]
    # an empty context (observation "") and an empty response are read at the token before
    ids, reads = pack_episode([([1, 2], [3]), ([], [4]), ([5], [])], max_length=10)
    assert ids == [1, 2, 3, 4, 5] and reads == [2, 3, 4]
    with pytest.raises(ValueError, match="responses alone take 3 tokens, more than max_length=2"):
        pack_episode(segs, max_length=2)


def test_prm_loss_is_mse_of_the_turn_sum_by_hand():
    values = torch.tensor([[0.2, 0.3, 99.0], [0.5, -0.1, 0.4]])  # 99 sits on a padding turn
    mask = torch.tensor([[True, True, False], [True, True, True]])
    # sums (0.5, 0.8) against R = (1, 0): ((0.5 - 1)^2 + 0.8^2) / 2 = (0.25 + 0.64) / 2
    assert prm_loss(values, mask, torch.tensor([1.0, 0.0])).item() == pytest.approx(0.445)
    with pytest.raises(ValueError, match="targets"):
        prm_loss(values, mask, torch.tensor([1.0]))


# --------------------------------------------------------------------------- the module


@pytest.mark.parametrize("head", ["mlp_tanh", "linear"])
def test_module_loss_with_a_fixed_head_by_hand(policy_dir, head):
    module = make_module(policy_dir, head=head, target="score")
    set_constant_head(module, 0.25)
    a = traj([turn([5, 6], [7]), turn([5, 6, 8], [9])], score=1.0)
    b = traj([turn([5], [7]), turn([5], [8]), turn([5], [9, 10])], score=0.0)
    loss, mae = module.episode_loss([a, b])
    # c_t = 0.25: sums 0.5 (2 turns) and 0.75 (3 turns) against (1, 0)
    assert loss.item() == pytest.approx(((0.5 - 1.0) ** 2 + 0.75**2) / 2)
    assert mae.item() == pytest.approx((0.5 + 0.75) / 2)
    module.target = "outcome"  # R(τ) = sum of outcome rewards: (0, 10)
    b.turns[-1].outcome_reward = 10.0
    loss, _ = module.episode_loss([a, b])
    assert loss.item() == pytest.approx((0.5**2 + (0.75 - 10.0) ** 2) / 2)


def test_head_reads_the_hidden_state_at_each_turns_last_token(policy_dir):
    torch.manual_seed(0)  # the head's first Linear is initialised in configure_model
    module = make_module(policy_dir, head="mlp_tanh")
    # small last-layer weights keep the output tanh away from saturation (at +-1 the causal
    # check below could not see turn 1's action change)
    torch.nn.init.normal_(module.head.net[-1].weight, std=0.1)
    tok = module.tokenizer
    obs = "Nothing happens."
    obs_ids = tok(obs, add_special_tokens=False)["input_ids"]
    assert len(obs_ids) >= 2
    p0, r0, r1 = [5, 6, 7], [9, 10], [12, 13]
    episode = traj([turn(p0, r0), turn([5, 6, 7, 99], r1, observation=obs)])
    enc = module.encode([episode])
    expected_ids = p0 + r0 + obs_ids + r1
    assert enc["input_ids"][0].tolist() == expected_ids
    reads = [len(p0) + len(r0) - 1, len(expected_ids) - 1]
    assert enc["read_positions"][0].tolist() == reads

    with torch.no_grad():
        hidden = module.backbone.get_decoder()(input_ids=torch.tensor([expected_ids])).last_hidden_state[0]
        expected = module.head(hidden[reads])
    values = module.turn_values([episode])[0]
    torch.testing.assert_close(torch.tensor(values), expected, rtol=1e-5, atol=1e-6)

    # Causal: changing turn 1's action moves c_1 only.
    other = traj([turn(p0, r0), turn([5, 6, 7, 99], [12, 14], observation=obs)])
    moved = module.turn_values([other])[0]
    assert moved[0] == pytest.approx(values[0], abs=1e-6) and abs(moved[1] - values[1]) > 1e-4
    # Right padding does not leak: scored next to a longer episode, the values are the same.
    longer = traj([turn(p0 + [8, 8, 8, 8], r0), turn(p0, r1, observation=obs), turn(p0, r0, observation=obs)])
    batched = module.turn_values([episode, longer])
    assert batched[0] == pytest.approx(values, abs=1e-5) and len(batched[1]) == 3


@pytest.mark.parametrize("head", ["mlp_tanh", "linear"])
def test_reward_adds_grounding_on_valid_turns_only(policy_dir, head):
    module = make_module(policy_dir, head=head)
    set_constant_head(module, 0.25)
    reward = ProcessRewardModelReward(module, grounding=0.5, max_steps=3, grounding_mode="bonus")  # 0.5 * 3 = 1.5 < 10
    assert isinstance(reward, DenseReward)
    episode = traj([turn([5], [7], valid=True), turn([5], [8], valid=False), turn([5], [9], valid=True)])
    assert reward.turn_rewards(episode) == pytest.approx([0.75, 0.25, 0.75])
    # the default: the same contrast as a penalty on the invalid turn
    penalty = ProcessRewardModelReward(module, grounding=0.5, max_steps=3)
    assert penalty.turn_rewards(episode) == pytest.approx([0.25, -0.25, 0.25])
    assert reward.turn_rewards(traj([])) == []
    assign_dense_rewards(reward, [episode])
    assert [t.dense_reward for t in episode.turns] == pytest.approx([0.75, 0.25, 0.75])
    assert ProcessRewardModelReward(module, grounding=0.0).turn_rewards(episode) == pytest.approx([0.25] * 3)


def test_reward_refuses_a_policy_whose_tokenizer_it_cannot_read(policy_dir, tiny_policy):
    import copy

    reward = ProcessRewardModelReward(make_module(policy_dir), max_steps=3)
    reward.check_tokenizer(tiny_policy[1])  # the tokenizer the PRM's backbone was saved with: fine
    other = copy.deepcopy(tiny_policy[1])
    other.add_tokens(["zzz_not_in_the_prm_vocabulary"])
    with pytest.raises(ValueError, match=r"not the policy's .*Fit the PRM on episodes recorded by a policy"):
        reward.check_tokenizer(other)


def _head_2x2(kind):
    """A ProgressHead on H = 2 whose first Linear (mlp_tanh) is the identity with bias 0."""
    head = ProgressHead(2, kind=kind, head_hidden=2)
    with torch.no_grad():
        if kind == "mlp_tanh":
            head.net[0].weight.copy_(torch.eye(2))
            head.net[0].bias.zero_()
    return head


def test_mlp_tanh_head_is_bounded_and_linear_is_not():
    head = _head_2x2("mlp_tanh")
    last = head.net[-1]
    with torch.no_grad():
        # pre-activation 0.5 from the bias alone: output tanh(0.5)
        last.weight.zero_()
        last.bias.fill_(0.5)
        assert head(torch.tensor([[3.0, -7.0]])).item() == pytest.approx(0.46211715726, abs=1e-7)
        # hidden (1e6, -1e6): first tanh (1, -1); weights (2.5, -2.5) -> pre-activation 5:
        # tanh(5) = 0.99990920426, strictly below 1
        last.bias.zero_()
        last.weight.copy_(torch.tensor([[2.5, -2.5]]))
        out = head(torch.tensor([[1e6, -1e6]]))
        assert out.item() == pytest.approx(0.99990920426, abs=1e-7) and out.item() < 1.0
        # pre-activation +-1000 (weights (1000, 0), bias 0 / weights (0, 1000)): tanh saturates at
        # +-1 in float32 but never leaves [-1, 1]; huge random inputs stay inside too
        last.weight.copy_(torch.tensor([[1000.0, 0.0]]))
        assert head(torch.tensor([[1e30, -1e30]])).item() == 1.0
        last.weight.copy_(torch.tensor([[0.0, 1000.0]]))
        assert head(torch.tensor([[1e30, -1e30]])).item() == -1.0
        torch.manual_seed(0)
        last.weight.normal_(std=100.0)
        last.bias.normal_(std=100.0)
        assert head(torch.randn(64, 2) * 1e20).abs().max().item() <= 1.0
        # an untrained head (last Linear zero) gives exactly tanh(0) = 0
        fresh = ProgressHead(2, kind="mlp_tanh")
        assert torch.equal(fresh(torch.randn(5, 2) * 1e6), torch.zeros(5))

    linear = _head_2x2("linear")
    with torch.no_grad():
        linear.net[-1].weight.copy_(torch.tensor([[1.0, 0.0]]))
        linear.net[-1].bias.fill_(0.5)
    # unbounded: 1000 * 1 + 0 * 5 + 0.5
    assert linear(torch.tensor([[1000.0, 5.0]])).item() == pytest.approx(1000.5)


def test_grounding_default_and_bound_by_hand():
    assert grounding_bonus(None, 10.0, 50) == pytest.approx(10.0 / (2 * 50))  # 0.1
    assert grounding_bonus(None, 2.0, 4) == pytest.approx(0.25)
    assert grounding_bonus(0.19, 10.0, 50) == 0.19  # 0.19 * 50 = 9.5 < 10
    assert grounding_bonus(0.0, 10.0, 50) == 0.0
    # SPA-RL's 0.5 on a 50-turn, success-10 env: 0.5 * 50 = 25 >= 10
    with pytest.raises(ValueError, match=r"grounding=0.5 .*max_steps=50 .*earns 25, not less than success_reward=10.0"):
        grounding_bonus(0.5, 10.0, 50)
    with pytest.raises(ValueError, match=r"grounding < 0.2 \(None = success_reward / \(2 \* max_steps\) = 0.1\)"):
        grounding_bonus(0.2, 10.0, 50)  # 0.2 * 50 = 10 is not < 10
    with pytest.raises(ValueError, match="max_steps must be an integer >= 1.*got 0"):
        grounding_bonus(None, 10.0, 0)
    with pytest.raises(ValueError, match="success_reward must be a finite number > 0.*got -1.0"):
        grounding_bonus(None, -1.0, 50)
    with pytest.raises(ValueError, match="grounding must be a finite number or None, got inf"):
        grounding_bonus(float("inf"), 10.0, 50)


def test_reward_default_grounding_is_bounded(policy_dir):
    module = make_module(policy_dir, head="mlp_tanh")
    set_constant_head(module, 0.25)
    episode = traj([turn([5], [7], valid=True), turn([5], [8], valid=False)])
    # defaults success_reward 10, max_steps 50 -> grounding 10 / 100 = 0.1
    reward = ProcessRewardModelReward(module)
    assert reward.grounding == pytest.approx(0.1)
    assert reward.turn_rewards(episode) == pytest.approx([0.25, 0.15])  # penalty: 0.25 - 0.1 on the invalid turn
    # success 2 over 4 steps -> 2 / 8 = 0.25
    assert ProcessRewardModelReward(module, success_reward=2.0, max_steps=4, grounding_mode="bonus").turn_rewards(
        episode
    ) == pytest.approx([0.5, 0.25])
    with pytest.raises(ValueError, match="grounding=0.5 per valid turn over max_steps=50"):
        ProcessRewardModelReward(module, grounding=0.5)


def test_freeze_backbone_trains_the_head_only(policy_dir):
    module = make_module(policy_dir, head="linear", freeze_backbone=True, optim=OptimConfig(lr=1e-2))
    module.train()
    assert not module.backbone.training
    before = {k: v.clone() for k, v in module.backbone.state_dict().items()}
    opt = module.configure_optimizers()["optimizer"]
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(
        p.numel() for p in module.head.parameters()
    )
    episodes = [traj([turn([5], [7]), turn([5], [8])], score=1.0)]
    for _ in range(3):
        loss, _ = module.episode_loss(episodes)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(torch.equal(before[k], v) for k, v in module.backbone.state_dict().items())
    assert module.head.net[0].bias.abs().item() > 0


def synthetic_episodes(n, win_id, lose_id):
    """Won episodes end on ``win_id``, lost ones on ``lose_id``; everything else is shared."""
    out = []
    for k in range(n):
        won = k % 2 == 0
        turns = [turn([5, 6, 7], [9, 10]) for _ in range(1 + k % 3)]
        turns.append(turn([5, 6, 7], [9, win_id if won else lose_id], observation="Nothing happens."))
        out.append(traj(turns, score=1.0 if won else 0.0, task_id=k))
    return out


def test_fit_lowers_the_loss_and_exports_a_loadable_reward(policy_dir, tmp_path):
    path = str(tmp_path / "episodes.jsonl")
    save_trajectories(path, synthetic_episodes(16, win_id=11, lose_id=12) + [traj([], task_id=99)])
    dm = TrajectoryEpisodeDataModule(path, batch_size=8, val_fraction=0.0)
    dm.setup("fit")
    assert len(dm.train_episodes) == 16  # the empty trajectory is left out
    module = ProcessRewardModule(
        policy=PolicyConfig(source=policy_dir), optim=OptimConfig(lr=1e-3), head="mlp_tanh", max_length=64
    )
    module.configure_model()
    with torch.no_grad():
        before, _ = module.episode_loss(dm.train_episodes)
    assert before.item() == pytest.approx(0.5)  # c_t = 0 at the start: mean(R^2) with half of R = 1

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=30,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, dm)
    assert "train/prm_loss" in trainer.callback_metrics
    module.eval()
    with torch.no_grad():
        after, _ = module.episode_loss(dm.train_episodes)
    assert after.item() < 0.1 * before.item(), (before.item(), after.item())

    probe = synthetic_episodes(2, win_id=11, lose_id=12)
    direct = module.turn_values(probe)
    assert sum(direct[0]) > sum(direct[1]) + 0.5  # the won episode's contributions add up to more

    from_dir = ProcessRewardModelReward(str(tmp_path / "prm"), grounding=0.0)  # on_train_end's export
    ckpt = str(tmp_path / "prm.ckpt")
    trainer.save_checkpoint(ckpt)
    from_ckpt = ProcessRewardModelReward(ckpt, grounding=0.0)
    for reward in (from_dir, from_ckpt):
        assert reward.model.head_kind == "mlp_tanh" and reward.model.max_length == 64
        assert reward.turn_rewards(probe[0]) == pytest.approx(direct[0], abs=1e-5)


def test_bad_settings_name_the_value_and_the_fix(policy_dir, tmp_path):
    with pytest.raises(ValueError, match="--save-policy"):
        ProcessRewardModule(policy=PolicyConfig(source="tiny")).configure_model()
    with pytest.raises(ValueError, match="model.head must be one of \\['mlp_tanh', 'linear'\\], got 'mlp'"):
        ProcessRewardModule(head="mlp")
    with pytest.raises(ValueError, match="model.target"):
        ProcessRewardModule(target="reward")
    with pytest.raises(ValueError, match="max_position_embeddings=1024"):
        make_module(policy_dir, max_length=4096)
    with pytest.raises(FileNotFoundError, match="neither"):
        ProcessRewardModelReward(str(tmp_path / "nowhere"))
    module = make_module(policy_dir, max_length=4)
    with pytest.raises(ValueError, match="trajectory 0 .*max_length=4"):
        module.encode([traj([turn([5], [7, 7, 7]), turn([5], [8, 8])])])


def test_prm_config_instantiates(policy_dir, tmp_path):
    from lightning.pytorch import LightningDataModule, LightningModule

    from rspo_lightning.cli import AgentCLI, _names_a_class

    config = os.path.join(ROOT, "configs", "household", "prm.yaml")
    assert _names_a_class(["fit", "--config", config])
    path = str(tmp_path / "episodes.jsonl")
    save_trajectories(path, synthetic_episodes(4, win_id=11, lose_id=12))
    args = [
        "--config",
        config,
        "--model.policy.source",
        policy_dir,
        "--data.train_path",
        path,
        "--trainer.logger.init_args.save_dir",
        str(tmp_path),
    ]
    cli = AgentCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        args=args,
        auto_configure_optimizers=False,
    )
    assert isinstance(cli.model, ProcessRewardModule) and isinstance(cli.datamodule, TrajectoryEpisodeDataModule)
    assert cli.model.head_kind == "mlp_tanh" and not cli.model.freeze_backbone


class _CalibratedPRM:
    """A PRM whose per-turn values sum to its predicted return: 1/8 per turn of a won episode
    (Σ = 1.0 over 8 turns), 0 on a failed one (the issue's 8-turn win and 50-turn failure)."""

    def turn_values(self, trajectories):
        return [[(1 / 8 if t.success else 0.0)] * len(t.turns) for t in trajectories]


def test_dense_only_prm_reward_a_long_valid_failure_cannot_out_earn_a_short_win(policy_dir):
    from rspo_lightning.callbacks import RSPOLoop
    from rspo_lightning.rspo.loop import check_length_neutral

    win = traj([turn([5], [7], valid=True) for _ in range(8)])
    win.success = True
    failure = traj([turn([5], [7], valid=True) for _ in range(50)])

    def dense_return(reward, episode):
        return sum(reward.turn_rewards(episode))

    module = make_module(policy_dir, head="mlp_tanh")
    bonus = ProcessRewardModelReward(module, grounding_mode="bonus")  # SPA-RL's: +0.1 per valid turn
    penalty = ProcessRewardModelReward(module)  # the default: -0.1 per invalid turn
    for reward in (bonus, penalty):
        reward.model = _CalibratedPRM()
    # the bug: with no outcome in B's reward, the bonus pays the failure 50 x 0.1 = 5.0 > 1.0 + 8 x 0.1 = 1.8
    assert dense_return(bonus, failure) == pytest.approx(5.0) and dense_return(bonus, win) == pytest.approx(1.8)
    assert dense_return(penalty, failure) == pytest.approx(0.0) and dense_return(penalty, win) == pytest.approx(1.0)
    assert dense_return(penalty, failure) < dense_return(penalty, win)
    # RSPO refuses the bonus under a dense-only explorer reward, at startup; outcome+dense keeps it
    with pytest.raises(ValueError, match="long failure out-earn a short win.*grounding_mode: penalty"):
        check_length_neutral(bonus, "dense")
    check_length_neutral(bonus, "outcome+dense")
    check_length_neutral(penalty, "dense")
    assert RSPOLoop(dense_reward=penalty).dense_reward is penalty


def test_ranking_metrics_by_hand():
    from rspo_lightning.prm import pearson, roc_auc

    # won 0.9, 0.4; lost 0.5, 0.1, 0.4: pairs won > lost: 0.9 beats 3, 0.4 beats 0.1 and ties 0.4 -> (3 + 1 + 0.5) / 6
    assert roc_auc([0.9, 0.4], [0.5, 0.1, 0.4]) == pytest.approx(4.5 / 6)
    assert roc_auc([1.0], []) != roc_auc([1.0], [])  # NaN without both kinds
    assert roc_auc([2.0, 3.0], [0.0, 1.0]) == 1.0 and roc_auc([0.0], [1.0]) == 0.0
    # x = (1, 2, 3), y = (1, 3, 2): means 2, 2; sxy = 1*-1... = (-1)(-1) + 0 + (1)(0) = 1; sxx = syy = 2 -> 0.5
    assert pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert pearson([1, 1], [0, 1]) != pearson([1, 1], [0, 1])


@pytest.mark.slow
def test_the_process_reward_flow_end_to_end_on_household(tmp_path, capfd):
    """README "RSPO with a learned process reward", with the tiny model: (0) a policy to record
    with (a short fit, exported so its tokenizer travels), (a) record won and lost episodes on the
    train split, several per task, (b) fit the PRM, which prints its held-out ROC AUC, (c) RSPO
    with ProcessRewardModelReward as B's reward. About two minutes on 2 idle cores."""
    import json
    import os

    from rspo_lightning.cli import main
    from rspo_lightning.export import export
    from rspo_lightning.trajectory_io import load_trajectories

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = os.path.join(root, "configs")
    small = [
        "--model.policy.tiny.hidden_size=32",
        "--model.policy.tiny.intermediate_size=64",
        "--model.policy.tiny.num_layers=1",
        "--trainer.enable_progress_bar=false",
    ]
    main(
        [
            "fit",
            "--config",
            f"{cfg}/compare/grpo.yaml",
            f"--trainer.default_root_dir={tmp_path}/run",
            "--trainer.max_epochs=1",
            "--data.iterations_per_epoch=1",
            "--data.groups_per_iteration=2",
            "--data.num_val_tasks=2",
            "--trainer.num_sanity_val_steps=0",
            *small,
        ]
    )
    export(str(tmp_path / "run" / "compare_grpo" / "checkpoints" / "last.ckpt"), str(tmp_path / "policy"))
    main(
        [
            "predict",
            "--config",
            f"{cfg}/compare/grpo.yaml",
            f"--model.policy.source={tmp_path}/policy",
            f"--trainer.default_root_dir={tmp_path}/rec",
            f"--model.predict_path={tmp_path}/rec/episodes.jsonl",
            "--data.predict_splits=[train]",
            "--data.predict_samples=8",
            "--data.num_val_tasks=32",
            "--model.val_temperature=1.0",
            "--trainer.enable_progress_bar=false",
        ]
    )
    episodes = load_trajectories(str(tmp_path / "rec" / "episodes.jsonl"))
    assert len(episodes) == 256 and 0 < sum(t.success for t in episodes) < 256  # won and lost
    main(
        [
            "fit",
            "--config",
            f"{cfg}/household/prm.yaml",
            f"--model.init_args.policy.source={tmp_path}/policy",
            f"--data.init_args.train_path={tmp_path}/rec/episodes.jsonl",
            "--data.init_args.val_fraction=0.3",
            "--trainer.max_epochs=3",
            f"--trainer.default_root_dir={tmp_path}/prm",
            f"--trainer.logger.init_args.save_dir={tmp_path}/prm",
            "--trainer.enable_progress_bar=false",
        ]
    )
    printed = capfd.readouterr().out
    assert "held-out ranking: ROC AUC" in printed
    print(next(line for line in printed.splitlines() if line.startswith("prm:")))
    prm = tmp_path / "prm" / "household_prm" / "version_0" / "prm"
    assert json.loads((prm / "prm_config.json").read_text())["head"] == "mlp_tanh"
    main(
        [
            "fit",
            "--config",
            f"{cfg}/compare/grpo_rspo.yaml",
            f"--model.policy.source={tmp_path}/policy",
            "--model.dense_reward=rspo_lightning.rewards.ProcessRewardModelReward",
            f"--model.dense_reward.init_args.model={prm}",
            "--model.dense_reward.init_args.max_steps=10",
            "--trainer.callbacks.k=1",
            "--data.iterations_per_epoch=3",
            "--trainer.max_epochs=1",
            "--data.groups_per_iteration=2",
            "--data.num_val_tasks=2",
            "--trainer.num_sanity_val_steps=0",
            f"--trainer.default_root_dir={tmp_path}/rspo",
            "--trainer.enable_progress_bar=false",
        ]
    )
    assert (tmp_path / "rspo" / "compare_grpo_rspo" / "checkpoints" / "last.ckpt").exists()
