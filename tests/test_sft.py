"""Warm start: trajectory JSONL, expert demonstrations, the per-turn data module and SFT."""

import json
import math

import lightning.pytorch as pl
import pytest
import torch

from rspo_lightning.config import EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.datamodules import TrajectoryDataModule
from rspo_lightning.datamodules.trajectory import collate_turns, turn_samples
from rspo_lightning.demos import expert_demonstrations, main
from rspo_lightning.language_model import TinyModelConfig, load_policy
from rspo_lightning.module import AgentRLModule
from rspo_lightning.parsing import parse_response
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.sft import SFTModule
from rspo_lightning.trajectory_io import load_trajectories, save_trajectories
from rspo_lightning.types import TaskSpec, Trajectory, Turn

ENV_ID = "rspo/Household-v0"
# The quickstart's easy setting.
EASY = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 10,
    "info_actions": False,
}
ROLLOUT = {
    "template": "compact",
    "system_prompt": "",
    "constrained_decoding": True,
    "max_new_tokens": 12,
    "history_window": 2,
}
TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}
NUM_DEMO_TASKS = 22  # ~100 turns


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from intra-op threads; on a busy 2-core machine two threads made
    the SFT fit ~30x slower (spinning OpenMP workers), so these tests use one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """Expert demos + the tiny policy that tokenised them, written by the command-line entry."""
    d = tmp_path_factory.mktemp("sft")
    main(
        [
            "expert",
            "--env-id",
            ENV_ID,
            "--env-kwargs",
            json.dumps(EASY),
            "--rollout",
            json.dumps(ROLLOUT),
            "--tiny",
            json.dumps(TINY),
            "--split",
            "train",
            "--num-tasks",
            str(NUM_DEMO_TASKS),
            "--out",
            str(d / "demos.jsonl"),
            "--policy-source",
            "tiny",
            "--save-policy",
            str(d / "policy"),
            "--with-text",
        ]
    )
    return d


def _assert_same_trajectory(a: Trajectory, b: Trajectory) -> None:
    for name in a.__dataclass_fields__:
        if name != "turns":
            assert getattr(a, name) == getattr(b, name), name
    assert len(a.turns) == len(b.turns)
    for ta, tb in zip(a.turns, b.turns):
        for name in ta.__dataclass_fields__:
            va, vb = getattr(ta, name), getattr(tb, name)
            if isinstance(va, torch.Tensor):
                assert isinstance(vb, torch.Tensor) and va.dtype == vb.dtype and va.shape == vb.shape, name
                assert torch.equal(va, vb), name
            else:
                assert va == vb, name


def _hand_trajectories() -> list[Trajectory]:
    t1 = Trajectory(
        task=TaskSpec(ENV_ID, "valid_unseen", 7, group_id=3),
        turns=[
            Turn(
                prompt_ids=torch.tensor([5, 6, 7]),
                response_ids=torch.tensor([9, 10]),
                behaviour_logprobs=torch.tensor([-0.1, -23.456789], dtype=torch.float32),
                action="go to café 1",
                valid=True,
                observation='Tu es dans la cuisine — «☕» 日本語\n"quoted"',
                anchor="at=café|held=∅",
                privileged="état: ✓",
                dense_reward=0.25,
                progress=0.5,
                allowed_ids=torch.tensor([[9, 11, -1], [10, -1, -1]]),
            ),
            Turn(
                prompt_ids=torch.tensor([5, 6, 7, 8]),
                response_ids=torch.tensor([12]),
                behaviour_logprobs=torch.tensor([float("-inf")]),
                action="",
                valid=False,
                observation="Nothing happens.",
                anchor="a2",
                outcome_reward=10.0,
                progress=1.0,
            ),
        ],
        success=True,
        score=1.0,
        task_type="pick_and_place",
        source="replay",
        policy_tag="B",
        iteration=12,
    )
    t2 = Trajectory(task=TaskSpec("rspo/Shop-v0", "train", 0), turns=[], truncated=True)
    return [t1, t2]


def test_jsonl_round_trip_is_exact(tmp_path):
    trajs = _hand_trajectories()
    path = str(tmp_path / "sub" / "t.jsonl")
    assert save_trajectories(path, trajs[:1]) == 1
    save_trajectories(path, trajs[1:], append=True)
    loaded = load_trajectories(path)
    assert len(loaded) == 2
    for a, b in zip(trajs, loaded):
        _assert_same_trajectory(a, b)
    # unicode is written as text, not \u escapes
    assert "日本語" in open(path, encoding="utf-8").read()
    # overwrite (not append) replaces the file
    save_trajectories(path, trajs[1:])
    assert len(load_trajectories(path)) == 1


def test_bad_line_raises_with_its_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    save_trajectories(str(path), _hand_trajectories()[:1])
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:3:"):
        load_trajectories(str(path))
    path.write_text(
        json.dumps({"task": {"env_id": ENV_ID, "split": "train", "task_id": 0}, "turns": [{"action": "x"}]}) + "\n"
    )
    with pytest.raises(ValueError, match=r":1: .*missing fields"):
        load_trajectories(str(path))
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_trajectories(str(tmp_path / "nowhere.jsonl"))


def test_expert_cli_writes_demos_with_the_rl_module_tokenizer(demo_dir):
    trajs = load_trajectories(str(demo_dir / "demos.jsonl"))
    assert len(trajs) == NUM_DEMO_TASKS and all(t.success for t in trajs)
    assert 80 <= sum(len(t.turns) for t in trajs) <= 130
    line = json.loads(open(demo_dir / "demos.jsonl", encoding="utf-8").readline())
    assert "<action>" in line["turns"][0]["response_text"]  # --with-text
    # The saved tokenizer is the one AgentRLModule builds for source: tiny with the same env/rollout.
    module = AgentRLModule(
        policy=PolicyConfig(source="tiny", tiny=TinyModelConfig(**TINY)),
        rollout=RolloutConfig(**ROLLOUT),
        env=EnvConfig(ENV_ID, EASY),
    )
    module.configure_model()
    _, saved_tok = load_policy(str(demo_dir / "policy"))
    assert module.tokenizer.get_vocab() == saved_tok.get_vocab()


def test_expert_cli_takes_the_config_env_and_prints_the_kwargs_it_played(tmp_path, capsys):
    """The demos' task distribution is the config's env unless --env-kwargs replaces it, and the
    command prints which: the llm_sft warm start's demos came from the env's defaults unnoticed."""
    import yaml

    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"data": {"env": {"env_id": ENV_ID, "kwargs": EASY}}, "model": {"rollout": ROLLOUT}})
    )
    common = ["expert", "--config", str(config), "--tiny", json.dumps(TINY), "--split", "train", "--num-tasks", "2"]
    common += ["--policy-source", "tiny", "--save-policy", str(tmp_path / "policy")]

    def printed_kwargs() -> str:
        (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("env kwargs")]
        return line.split(": ", 1)[1]

    main([*common, "--out", str(tmp_path / "config_env.jsonl")])
    assert json.loads(printed_kwargs()) == EASY
    main([*common, "--env-kwargs", "{}", "--out", str(tmp_path / "default_env.jsonl")])
    assert printed_kwargs() == "{}"
    # the two differ in the tasks played, not only in what is printed
    config_env = load_trajectories(str(tmp_path / "config_env.jsonl"))
    default_env = load_trajectories(str(tmp_path / "default_env.jsonl"))
    assert [t.task_type for t in config_env] != [t.task_type for t in default_env] or [
        t.turns[0].observation for t in config_env
    ] != [t.turns[0].observation for t in default_env]


@pytest.mark.parametrize(
    "rollout_kw",
    [ROLLOUT, {"template": "household", "history_window": 1, "constrained_decoding": True, "max_new_tokens": 12}],
)
def test_expert_prompts_equal_rollout_engine_prompts(demo_dir, rollout_kw):
    model, tok = load_policy(str(demo_dir / "policy"))
    cfg = RolloutConfig(**{**rollout_kw, "max_turns": 1})
    tasks = [TaskSpec(ENV_ID, "train", i, group_id=i) for i in range(4)]
    played = RolloutEngine(model, tok, cfg, EASY).collect(tasks, 1, greedy=True)
    demos = expert_demonstrations(ENV_ID, EASY, "train", range(4), tokenizer=tok, rollout=RolloutConfig(**rollout_kw))
    for p, d in zip(played, demos):
        assert torch.equal(p.turns[0].prompt_ids, d.turns[0].prompt_ids)
        assert d.turns[0].observation == p.turns[0].observation and d.turns[0].anchor == p.turns[0].anchor
    for d in demos:
        assert d.success and d.turns[-1].outcome_reward > 0 and all(t.outcome_reward == 0 for t in d.turns[:-1])
        for turn in d.turns:
            assert turn.valid and torch.equal(turn.behaviour_logprobs, torch.zeros(len(turn.response_ids)))
            # the response is exactly what constrained decoding emits for this action (no eos)
            assert (
                turn.response_ids.tolist()
                == tok(f"<action> {turn.action} </action>", add_special_tokens=False)["input_ids"]
            )
            assert parse_response(tok.decode(turn.response_ids, skip_special_tokens=True)).action == turn.action


def test_collate_masks_prompt_and_padding_by_hand():
    def sample(p, r, i):
        return {
            "prompt_ids": torch.tensor(p),
            "response_ids": torch.tensor(r),
            "traj_index": i,
            "turn_index": 0,
            "num_turns": 1,
            "outcome": float(i),
            "success": bool(i),
            "score": 0.0,
            "valid": True,
            "dense_reward": 0.0,
            "progress": 0.0,
        }

    batch = collate_turns([sample([11, 12, 13], [21, 22], 0), sample([14], [23, 24, 25], 1)], pad_id=0)
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22], [14, 23, 24, 25, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, -100, -100, 21, 22], [-100, 23, 24, 25, -100]]
    assert batch["turn_end"].tolist() == [4, 3]
    assert batch["prompt_lengths"].tolist() == [3, 1]
    assert batch["outcome"].tolist() == [0.0, 1.0] and batch["success"].tolist() == [False, True]


def test_datamodule_splits_by_trajectory_and_names_bad_paths(demo_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        TrajectoryDataModule(str(tmp_path / "missing.jsonl"))
    dm = TrajectoryDataModule(str(demo_dir / "demos.jsonl"), batch_size=8, val_fraction=0.2, seed=1)
    dm.setup("fit")
    train_ids = {t.task.task_id for t in dm.train_trajectories}
    val_ids = {t.task.task_id for t in dm.val_trajectories}
    assert (
        not train_ids & val_ids
        and len(train_ids | val_ids) == NUM_DEMO_TASKS
        and len(val_ids) == round(0.2 * NUM_DEMO_TASKS)
    )
    assert len(dm.train_samples) == sum(len(t.turns) for t in dm.train_trajectories)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 8
    # loss only on response tokens: label count == response token count
    resp = sum(len(s["response_ids"]) for s in turn_samples(dm.train_trajectories))
    assert sum(int((b["labels"] != -100).sum()) for b in dm.train_dataloader()) == resp


def test_sft_refuses_tiny_source_with_the_fix():
    with pytest.raises(ValueError, match="--save-policy"):
        SFTModule(policy=PolicyConfig(source="tiny")).configure_model()


class _LossRecorder(pl.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def _greedy_play(model, tok, task_ids):
    engine = RolloutEngine(model, tok, RolloutConfig(**ROLLOUT), EASY)
    return engine.collect([TaskSpec(ENV_ID, "train", i, group_id=i) for i in task_ids], 1, greedy=True)


def test_sft_fit_lowers_loss_and_wins_more(demo_dir, tmp_path):
    torch.manual_seed(0)
    untrained, tok = load_policy(str(demo_dir / "policy"))
    dm = TrajectoryDataModule(str(demo_dir / "demos.jsonl"), batch_size=16, val_fraction=0.1, pad_id=tok.pad_token_id)
    dm.setup("fit")
    eval_ids = [t.task.task_id for t in dm.train_trajectories][:12]
    before = _greedy_play(untrained, tok, eval_ids)

    module = SFTModule(policy=PolicyConfig(source=str(demo_dir / "policy")), optim=OptimConfig(lr=3e-3))
    recorder = _LossRecorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=300,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[recorder],
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, dm)
    for key in ("train/sft_loss", "train/token_accuracy", "val/sft_loss"):
        assert key in trainer.callback_metrics, key
    first, last = sum(recorder.losses[:5]) / 5, sum(recorder.losses[-10:]) / 10
    assert math.isfinite(last) and last < 0.3 * first, (first, last)

    after = _greedy_play(module.policy, module.tokenizer, eval_ids)
    won_before = sum(t.success for t in before) / len(before)
    won_after = sum(t.success for t in after) / len(after)
    print(
        f"SFT loss {first:.3f} -> {last:.3f}; greedy success on {len(eval_ids)} train tasks: "
        f"untrained {won_before:.2f}, SFT {won_after:.2f}"
    )
    assert won_after >= won_before + 0.5, (won_before, won_after)

    # Where the SFT policy replayed the expert's actions, every turn's prompt equals the demo's
    # (the shared prompt builder beyond the first turn, history included).
    demos = {t.task.task_id: t for t in dm.train_trajectories}
    replayed = [t for t in after if [x.action for x in t.turns] == [x.action for x in demos[t.task.task_id].turns]]
    assert replayed
    for t in replayed:
        for a, b in zip(t.turns, demos[t.task.task_id].turns):
            assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.response_ids, b.response_ids)

    # on_train_end exported a Hugging Face directory that an RL config can load.
    reloaded, _ = load_policy(str(tmp_path / "hf"))
    for (name, p), q in zip(module.policy.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(p.cpu(), q), name


def test_rollouts_command_writes_a_trained_policys_episodes(demo_dir, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    main(
        [
            "rollouts",
            "--env-id",
            ENV_ID,
            "--env-kwargs",
            json.dumps(EASY),
            "--rollout",
            json.dumps(ROLLOUT),
            "--split",
            "valid_seen",
            "--num-tasks",
            "3",
            "--group-size",
            "2",
            "--out",
            str(out),
            "--policy-source",
            str(demo_dir / "policy"),
        ]
    )
    trajs = load_trajectories(str(out))
    assert len(trajs) == 6 and [t.task.task_id for t in trajs] == [0, 0, 1, 1, 2, 2]
    assert all(t.turns and t.task.split == "valid_seen" for t in trajs)
    # stored ids are the policy's own: its tokenizer decodes every response to an <action> tag
    _, tok = load_policy(str(demo_dir / "policy"))
    assert all(
        parse_response(tok.decode(turn.response_ids, skip_special_tokens=True)).valid for t in trajs for turn in t.turns
    )
    with pytest.raises(SystemExit, match="rollouts need a trained policy"):
        main(["rollouts", "--env-id", ENV_ID, "--out", str(out), "--policy-source", "tiny"])


def test_rl_config_from_sft_uses_the_sft_model_as_policy_and_reference(demo_dir, tmp_path):
    import os

    from rspo_lightning.cli import AgentCLI
    from rspo_lightning.datamodules import AgentDataModule

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cli = AgentCLI(
        AgentRLModule,
        AgentDataModule,
        run=False,
        auto_configure_optimizers=False,
        args=[
            "--config",
            os.path.join(root, "configs", "household", "grpo_from_sft.yaml"),
            "--model.policy.source",
            str(demo_dir / "policy"),
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
        ],
    )
    m = cli.model
    m.env_cfg = cli.datamodule.env  # what the Trainer's datamodule hands over in fit
    m.configure_model()
    sft, _ = load_policy(str(demo_dir / "policy"))
    for (name, p), q in zip(m.policy.named_parameters(), sft.parameters()):
        assert torch.equal(p, q), name
    with m.reference_model() as ref:
        assert ref is not m.policy and all(not p.requires_grad for p in ref.parameters())
        assert all(torch.equal(p, q) for p, q in zip(ref.parameters(), sft.parameters()))


def test_llm_sft_config_fits_the_demos_it_names(demo_dir, tmp_path):
    """configs/llm/smollm2_sft.yaml (the LLM study's warm start) with the tiny demo policy standing in for
    SmolLM2: one optimizer step, then the export an RL config's policy.source loads."""
    import os

    from lightning.pytorch import LightningDataModule, LightningModule

    from rspo_lightning.cli import AgentArgumentParser, AgentCLI

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = ["--config", os.path.join(root, "configs", "llm", "smollm2_sft.yaml")]
    args += ["--model.init_args.policy.source", str(demo_dir / "policy")]
    args += ["--data.init_args.train_path", str(demo_dir / "demos.jsonl")]
    args += ["--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.max_steps", "1"]
    args += ["--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false"]
    cli = AgentCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=["fit", *args],
        auto_configure_optimizers=False,
        parser_class=AgentArgumentParser,
    )
    assert isinstance(cli.model, SFTModule) and cli.trainer.global_step == 1
    exported, _ = load_policy(cli.model.export_dir)
    for p, q in zip(exported.parameters(), cli.model.policy.parameters()):
        assert torch.equal(p, q)
