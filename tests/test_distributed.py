"""Distributed training on CPU: 2-process DDP and FSDP2 (ModelParallelStrategy) over gloo, FSDP1 wiring.

Multi-process runs are ``rspo-lightning fit`` subprocesses with a hard timeout: a deadlock fails
the test instead of hanging it. tests/distributed_helpers.py holds the callbacks they load.
"""

import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
HOUSEHOLD = {"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 6}
# rspo/Faulty-v0 without faults: RankSkewProbe switches faults on for rank 0 mid-run
ENV_KWARGS = {"inner_id": "rspo/Household-v0", "inner_kwargs": HOUSEHOLD, "fault_rate": 0.0, "modes": ["raise"]}
MINIBATCH, MICRO, EPOCHS = 4, 2, 2
TINY_ARGS = [
    "--config",
    os.path.join(ROOT, "configs", "quickstart.yaml"),
    "--data.iterations_per_epoch",
    "1",
    "--data.groups_per_iteration",
    "2",  # one group per rank
    "--data.group_size",
    "2",
    "--data.num_val_tasks",
    "3",  # 2 tasks on rank 0, 1 on rank 1, one per validation batch
    "--data.val_groups_per_batch",
    "1",
    "--data.val_splits",
    "[valid_seen]",
    "--data.env.env_id",
    "rspo/Faulty-v0",
    "--data.env.kwargs",
    json.dumps(ENV_KWARGS),
    "--model.policy.tiny.hidden_size",
    "32",
    "--model.policy.tiny.intermediate_size",
    "64",
    "--model.rollout.constrained_decoding",
    "false",
    "--model.rollout.max_new_tokens",
    "6",
    "--model.algorithm.ppo_epochs",
    str(EPOCHS),
    "--model.algorithm.micro_batch_size",
    str(MICRO),
    "--model.algorithm.drop_zero_advantage",
    "false",
    "--trainer.logger",
    "false",
]


def _fit(args, cwd, timeout=300):
    """``rspo-lightning fit ARGS`` (as ``python -m``, this checkout first on the path); fails on a
    non-zero exit and on a timeout, killing every process the run started."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "rspo_lightning.cli", "fit", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's other rank is in the same session
        out, err = proc.communicate()
        pytest.fail(f"fit did not finish within {timeout} s (deadlocked ranks?):\n{err[-3000:]}")
    assert proc.returncode == 0, err[-4000:]


def _split_sizes(n, parts):
    """Sizes of ``torch.tensor_split`` of n items into ``parts`` (the first n % parts one larger)."""
    return [n // parts + (1 if j < n % parts else 0) for j in range(parts)]


def _expected_counts(samples_per_rank):
    """(optimizer steps, micro-batch backwards) of one iteration whose ranks hold these sample
    counts, when every rank follows the busiest one."""
    if sum(samples_per_rank) == 0:
        return 0, 0
    minibatches = max(math.ceil(n / MINIBATCH) for n in samples_per_rank)
    per_rank = [_split_sizes(n, minibatches) for n in samples_per_rank]
    backwards = sum(max(math.ceil(sizes[j] / MICRO) for sizes in per_rank) for j in range(minibatches))
    return EPOCHS * minibatches, EPOCHS * backwards


def _skewed_ddp_fit(tmp_path, out, *extra):
    _fit(
        [
            *TINY_ARGS,
            "--config",
            os.path.join(ROOT, "configs", "trainer", "ddp_cpu.yaml"),
            "--data.iterations_per_epoch",
            "2",
            "--trainer.max_epochs",
            "1",
            "--model.algorithm.minibatch_size",
            str(MINIBATCH),
            # one validation, after iteration 2: rank 0's environments then fail, it plays nothing
            "--trainer.num_sanity_val_steps",
            "0",
            "--trainer.enable_checkpointing",
            "false",
            "--trainer.callbacks+=distributed_helpers.RankSkewProbe",
            f"--trainer.callbacks.out_dir={out}",
            *extra,
        ],
        cwd=tmp_path,
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_ddp_ranks_with_unequal_episodes_take_the_same_steps_and_finish(tmp_path):
    """... and synchronise gradients once per optimizer step (no_sync on every micro-batch but the
    last), to the same weights as a sync in every backward (``grad_sync: micro_batch``)."""
    ranks = _skewed_ddp_fit(tmp_path, tmp_path / "probe")
    assert [r["world_size"] for r in ranks] == [2, 2]
    # the skew took effect: rank 0 played 1-turn episodes, then lost every episode to faults
    assert ranks[0]["turns"][0] == [1, 1]
    assert ranks[0]["turns"][1] == []
    assert all(max(turns) > 1 for turns in ranks[1]["turns"]), ranks[1]["turns"]
    steps = backwards = 0
    for it in range(2):
        s, b = _expected_counts([sum(ranks[r]["turns"][it]) for r in (0, 1)])
        steps, backwards = steps + s, backwards + b
    assert steps > 0
    assert [r["optimizer_steps"] for r in ranks] == [steps, steps]
    assert [r["backwards"] for r in ranks] == [backwards, backwards]
    assert backwards > steps  # some minibatch has several micro-batches
    assert [r["allreduces"] for r in ranks] == [steps, steps]
    every = _skewed_ddp_fit(tmp_path, tmp_path / "every", "--model.algorithm.grad_sync=micro_batch")
    assert [r["allreduces"] for r in every] == [backwards, backwards]
    assert [r["turns"] for r in every] == [r["turns"] for r in ranks]  # the same episodes
    for r in (0, 1):
        once = torch.load(tmp_path / "probe" / f"params{r}.pt", weights_only=True)
        each = torch.load(tmp_path / "every" / f"params{r}.pt", weights_only=True)
        assert once.keys() == each.keys() and once
        assert max(float((once[k] - each[k]).abs().max()) for k in once) < 1e-6


def test_ddp_alpha_is_global_over_ranks(tmp_path):
    """4 groups over 2 ranks, alpha = 1/4: round_half_up(0.25 * 4) = 1 replay group in all (rank 0
    holds it). Rounding per rank would give round_half_up(0.25 * 2) = 1 on each rank, 2 in all."""
    out = tmp_path / "replay"
    _fit(
        [
            *TINY_ARGS,
            "--config",
            os.path.join(ROOT, "configs", "trainer", "ddp_cpu.yaml"),
            "--data.groups_per_iteration",
            "4",
            "--data.iterations_per_epoch",
            "3",
            "--trainer.max_epochs",
            "1",
            "--trainer.num_sanity_val_steps",
            "0",
            "--trainer.limit_val_batches",
            "0",
            "--trainer.enable_checkpointing",
            "false",
            "--model.dense_reward",
            "rspo_lightning.rewards.EnvProgressReward",
            "--trainer.callbacks+=distributed_helpers.ReplayCountingLoop",
            f"--trainer.callbacks.out_dir={out}",
            "--trainer.callbacks.k=1",
            "--trainer.callbacks.offline_ratio=0.25",
        ],
        cwd=tmp_path,
    )
    ranks = [json.loads((out / f"replay{r}.json").read_text()) for r in (0, 1)]
    group_size = ranks[0]["group_size"]
    # iterations: explore, collect, exploit; only the exploit batch replays, one group's worth on rank 0
    assert [r["replayed"] for r in ranks] == [[0, 0, group_size], [0, 0, 0]]


def test_fsdp2_two_ranks_with_resume_match_one_process_on_the_same_trajectories(tmp_path):
    """Sharded (FSDP2 over gloo) rollout, update, sharded checkpoint and resume; then one process
    trains on the union of the trajectories the two ranks trained on. The weights must agree."""
    rec, single, ckpt = tmp_path / "rec", tmp_path / "single", tmp_path / "ckpt"
    args = [
        *TINY_ARGS,
        "--model.algorithm.minibatch_size",
        "64",  # one minibatch: the union's gradient
        "--model.algorithm.kl_coef",
        "0.05",  # a frozen reference model, scored in lock-step
        "--model.algorithm.recompute_old_logprobs",
        "true",
        "--model.algorithm.forward_batch_size",
        "3",
    ]
    sharded = [
        *args,
        "--config",
        os.path.join(ROOT, "configs", "trainer", "fsdp2_cpu.yaml"),
        "--trainer.callbacks+=distributed_helpers.RankSkewProbe",
        f"--trainer.callbacks.out_dir={tmp_path / 'probe'}",
        "--trainer.callbacks+=distributed_helpers.TrajectoryRecorder",
        f"--trainer.callbacks.out_dir={rec}",
    ]
    _fit(
        [
            *sharded,
            "--trainer.max_epochs",
            "1",
            "--trainer.callbacks+=ModelCheckpoint",
            f"--trainer.callbacks.dirpath={ckpt}",
            "--trainer.callbacks.save_last=true",
        ],
        cwd=tmp_path,
    )
    assert {f for f in os.listdir(ckpt / "last.ckpt") if f.endswith(".distcp")} == {
        "__0_0.distcp",
        "__1_0.distcp",
    }  # a shard per rank
    _fit([*sharded, "--trainer.max_epochs", "2", "--ckpt_path", str(ckpt / "last.ckpt")], cwd=tmp_path)
    _fit(
        [
            "--model",
            "distributed_helpers.ReplayedRollouts",
            "--data",
            "rspo_lightning.datamodules.AgentDataModule",
            *args,
            f"--model.recording_dir={rec}",
            "--trainer.max_epochs",
            "2",
            "--trainer.limit_val_batches",
            "0",
            "--trainer.num_sanity_val_steps",
            "0",
            "--trainer.enable_checkpointing",
            "false",
            "--trainer.callbacks+=distributed_helpers.TrajectoryRecorder",
            f"--trainer.callbacks.out_dir={single}",
        ],
        cwd=tmp_path,
    )

    # the ranks trained on unequal shares: iteration 1 one-turn episodes on rank 0, iteration 2 none
    turns = {
        (it, r): [len(t.turns) for t in torch.load(rec / f"traj_it{it}_rank{r}.pt", weights_only=False)]
        for it in (1, 2)
        for r in (0, 1)
    }
    assert turns[1, 0] == [1, 1] and turns[2, 0] == [] and sum(turns[1, 1]) > 2, turns

    sharded_state = torch.load(rec / "final_state.pt", weights_only=False)
    single_state = torch.load(single / "final_state.pt", weights_only=False)
    assert set(sharded_state) == set(single_state)
    assert not any(k.startswith("_ref") for k in sharded_state)  # the reference model is not checkpointed
    from rspo_lightning.config import EnvConfig, PolicyConfig
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    fresh = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, intermediate_size=64)),
        env=EnvConfig("rspo/Faulty-v0", ENV_KWARGS),
    )
    fresh.configure_model()
    initial = fresh.state_dict()
    moved = max(float((single_state[k] - initial[k]).abs().max()) for k in initial)
    assert moved > 1e-3  # the comparison below is 100x finer than what training changed
    for k in single_state:
        torch.testing.assert_close(sharded_state[k], single_state[k], atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    # the KL reference is sharded like the policy: each rank holds half of it (the tiny tied model shards evenly)
    probes = [json.loads((tmp_path / "probe" / f"rank{r}.json").read_text()) for r in (0, 1)]
    for p in probes:
        assert p["reference_full_mb"] > 0, p
        assert p["reference_local_mb"] == pytest.approx(p["reference_full_mb"] / 2, rel=0.05), p


# -- FSDP1 wiring (GPU-only strategy; checked without a GPU) --------------------------------------
def _tiny_model(kind):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(LlamaConfig(**shape)) if kind == "llama" else Qwen2ForCausalLM(Qwen2Config(**shape))


def _fsdp_strategy_from_yaml():
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import Strategy

    with open(os.path.join(ROOT, "configs", "trainer", "fsdp.yaml")) as f:
        spec = yaml.safe_load(f)["trainer"]["strategy"]
    parser = ArgumentParser()
    parser.add_subclass_arguments(Strategy, "strategy")
    cfg = parser.parse_object({"strategy": spec})
    # instantiate() is jsonargparse >= 4.49's name (instantiate_classes before, deprecated since)
    return (parser.instantiate(cfg) if hasattr(parser, "instantiate") else parser.instantiate_classes(cfg)).strategy


@pytest.mark.parametrize("kind, layer", [("llama", "LlamaDecoderLayer"), ("qwen2", "Qwen2DecoderLayer")])
def test_fsdp_yaml_wraps_the_decoder_layers(kind, layer):
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from rspo_lightning.distributed import DecoderLayerFSDPStrategy, decoder_layer_classes

    strategy = _fsdp_strategy_from_yaml()
    assert isinstance(strategy, DecoderLayerFSDPStrategy)
    assert strategy._state_dict_type == "sharded"
    model = _tiny_model(kind)
    assert {c.__name__ for c in decoder_layer_classes(model)} == {layer}
    wrap, checkpointing = strategy.wrap_policies(model)
    assert isinstance(wrap, ModuleWrapPolicy)
    assert {c.__name__ for c in wrap._module_classes} == {layer}
    assert checkpointing == {}  # checkpoint_decoder_layers: false in the YAML
    strategy.checkpoint_decoder_layers = True
    assert {c.__name__ for c in strategy.wrap_policies(model)[1]["auto_wrap_policy"]._module_classes} == {layer}


def test_decoder_layers_fall_back_to_the_layers_list_and_fail_clearly():
    from torch import nn

    from rspo_lightning.distributed import DecoderLayerFSDPStrategy, decoder_layer_classes

    class Block(nn.Linear):
        pass

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(2, 2), Block(2, 2)])

    assert decoder_layer_classes(Net()) == {Block}
    with pytest.raises(ValueError, match="decoder-layer class of Linear"):
        decoder_layer_classes(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="drop auto_wrap_policy"):
        DecoderLayerFSDPStrategy(auto_wrap_policy={Block})


@pytest.mark.parametrize("critic", [False, True])
def test_frozen_reference_and_critic_backbone_are_outside_optimizer_and_checkpoint(critic):
    from rspo_lightning.config import AlgorithmConfig, EnvConfig, PolicyConfig
    from rspo_lightning.critic import CriticConfig
    from rspo_lightning.distributed import decoder_layer_classes
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    m = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, intermediate_size=64)),
        algorithm=AlgorithmConfig(estimator="gae" if critic else "grpo", kl_coef=0.1),
        critic=CriticConfig(kind="separate" if critic else "shared"),
        env=EnvConfig(kwargs=HOUSEHOLD),
    )
    m.configure_model()
    frozen = [m._ref] + ([m.critic.backbone] if critic else [])
    frozen_ids = {id(p) for f in frozen for p in f.parameters()}
    assert frozen_ids and all(not p.requires_grad for f in frozen for p in f.parameters())
    assert not frozen_ids & {id(p) for p in m.parameters()}  # not submodules: DDP/FSDP never wrap them
    opt = m.configure_optimizers()
    opts = opt[0] if isinstance(opt, tuple) else [opt["optimizer"]]
    assert not frozen_ids & {id(p) for o in opts for g in o.param_groups for p in g["params"]}
    assert not [k for k in m.state_dict() if k.startswith("_ref") or k.startswith("critic.backbone")]
    # an FSDP auto-wrap over the module finds the policy's decoder layers only
    layer_class = tuple(decoder_layer_classes(m))
    assert sum(isinstance(mod, layer_class) for mod in m.modules()) == m.policy.config.num_hidden_layers
    # the policy's own weights are in the checkpoint and in the optimizer
    assert any(k.startswith("policy.") for k in m.state_dict())
