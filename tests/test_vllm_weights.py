"""The vLLM backend's pure parts, without vLLM: the weights it is sent, the trie path it is
scored along, and the errors a user gets."""

import copy
import os
import subprocess
import sys

import pytest
import torch
from conftest import EASY_ENV

from rspo_lightning.config import LoraSettings
from rspo_lightning.language_model import apply_lora
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.trie import ActionTrie
from rspo_lightning.types import TaskSpec
from rspo_lightning.vllm_backend import VLLMConfig, full_state_dict, remove_orphaned_weight_dirs, save_weights


def test_full_state_dict_is_the_hf_checkpoint_with_an_explicit_tied_head(tiny_policy):
    model, _ = tiny_policy
    state = full_state_dict(model)
    reference = model.state_dict()
    assert model.config.tie_word_embeddings
    assert set(state) == set(reference) | {"lm_head.weight"}
    for name, tensor in reference.items():
        assert torch.equal(state[name], tensor) and state[name].data_ptr() != tensor.data_ptr()  # copies
    assert torch.equal(state["lm_head.weight"], reference["model.embed_tokens.weight"])


def test_lora_weights_are_sent_merged_and_the_adapters_stay(tiny_policy, tmp_path):
    model, _ = tiny_policy
    peft_model = apply_lora(copy.deepcopy(model), LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # trained adapters: B != 0, so merging changes q and v
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    before = {n: p.clone() for n, p in peft_model.named_parameters()}
    state = full_state_dict(peft_model)
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    assert set(state) == set(merged) | {"lm_head.weight"}
    for name, tensor in merged.items():
        assert torch.allclose(state[name], tensor, atol=1e-6), name
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(state[q], model.state_dict()[q])  # the adapters are in it
    for name, p in peft_model.named_parameters():  # unmerged again, adapters untouched
        assert torch.equal(p, before[name]), name
    path = save_weights(state, str(tmp_path))
    from safetensors.torch import load_file

    assert set(load_file(path)) == set(state)


def test_trie_path_marks_the_allowed_ids_and_goes_unconstrained_off_the_trie(tiny_policy):
    model, tok = tiny_policy
    engine = RolloutEngine(model, tok, RolloutConfig(), EASY_ENV)

    class Stats:
        stats = {"off_trie_responses": 0}

    engine.vllm = Stats()
    trie = ActionTrie([[5, 6, 7], [5, 8]])
    assert engine._trie_path(trie, [5, 8]).tolist() == [[5, -1], [6, 8]]
    # 9 is not a child of 5's node: that step and the rest are unconstrained (all -1)
    assert engine._trie_path(trie, [5, 9, 7]).tolist() == [[5], [-1], [-1]]
    assert engine.vllm.stats["off_trie_responses"] == 1
    # past a complete path (a trailing eos) is unconstrained, not off the trie
    assert engine._trie_path(trie, [5, 6, 7, 2]).tolist() == [[5, -1], [6, 8], [7, -1], [-1, -1]]
    assert engine.vllm.stats["off_trie_responses"] == 1


def test_bad_backend_settings_fail_at_startup():
    with pytest.raises(ValueError, match=r"rollout.backend must be one of \['hf', 'vllm'\], got 'sglang'"):
        RolloutConfig(backend="sglang")
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMConfig(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="rollout.vllm.constraint"):
        VLLMConfig(constraint="regex")
    assert RolloutConfig(vllm={"kv_cache_gib": 1.0}).vllm.kv_cache_gib == 1.0


def test_missing_vllm_names_the_extra(tiny_policy):
    pytest.importorskip("torch")
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here; the error path is for environments without it")
    model, tok = tiny_policy
    engine = RolloutEngine(model, tok, RolloutConfig(backend="vllm", max_new_tokens=4), EASY_ENV)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[vllm\]"'):
        engine.collect([TaskSpec("rspo/Household-v0", "train", 0, group_id=0)], 2)


def _gather_on_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from rspo_lightning.distributed import shard_fsdp2
    from rspo_lightning.language_model import TinyModelConfig, load_policy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        corpus = ["go to cabinet 1", "take apple 1 from cabinet 1"]
        model, _ = load_policy(
            "tiny", corpus=corpus, tiny=TinyModelConfig(hidden_size=32, num_heads=2, intermediate_size=64)
        )
        reference = full_state_dict(model)
        shard_fsdp2(model, init_device_mesh("cpu", (world,)))
        assert any(hasattr(p, "full_tensor") for p in model.parameters())  # really sharded
        gathered = full_state_dict(model)
        torch.save({"reference": reference, "gathered": gathered}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_fsdp2_shards_are_gathered_into_the_full_weights(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_gather_on_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        saved = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert set(saved["gathered"]) == set(saved["reference"])
        for name, tensor in saved["reference"].items():
            assert torch.equal(saved["gathered"][name], tensor), name


def test_score_reports_the_behaviour_logprob_mismatch_against_the_training_forward():
    from rspo_lightning.batching import flatten, make_train_batch
    from rspo_lightning.config import EnvConfig, PolicyConfig
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    torch.manual_seed(0)
    m = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)),
        env=EnvConfig(kwargs=EASY_ENV),
        rollout=RolloutConfig(max_new_tokens=4),
    )
    m.configure_model()
    flat = flatten(m.engine.collect([TaskSpec("rspo/Household-v0", "train", i, group_id=i) for i in range(2)], 2))
    batch = make_train_batch(flat, m.engine.pad_id, torch.zeros(len(flat.turns)))
    mask = batch.response_mask
    _, exact = m.score(batch)  # the hf backend's log-probs are the training forward's
    assert exact["rollout/logprob_mismatch_max"] < 1e-4
    # a rollout engine off by +0.3 on one token and -0.1 on all the others
    batch = make_train_batch(flat, m.engine.pad_id, torch.zeros(len(flat.turns)))
    first = tuple(mask.nonzero()[0].tolist())
    shift = torch.where(
        mask, torch.full_like(batch.behaviour_logprobs, -0.1), torch.zeros_like(batch.behaviour_logprobs)
    )
    shift[first] = 0.3
    batch.behaviour_logprobs = batch.behaviour_logprobs + shift
    _, off = m.score(batch)
    n = int(mask.sum())
    assert off["rollout/logprob_mismatch_max"] == pytest.approx(0.3, abs=1e-4)
    assert off["rollout/logprob_mismatch_mean"] == pytest.approx((0.3 + 0.1 * (n - 1)) / n, abs=1e-4)


def test_every_weight_change_marks_the_engine_stale():
    """An update and an RSPO swap (``restore_trainable``) both mark the weights for the next push."""
    import lightning.pytorch as pl

    from rspo_lightning.config import AlgorithmConfig, EnvConfig, PolicyConfig
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    class Watch(pl.Callback):
        marks: list = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            pl_module.engine._weights_stale = False

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.marks.append(pl_module.engine._weights_stale)

    m = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)),
        env=EnvConfig(kwargs=EASY_ENV),
        algorithm=AlgorithmConfig(ppo_epochs=1, drop_zero_advantage=False),
        rollout=RolloutConfig(max_new_tokens=4),
    )
    dm = AgentDataModule(
        env=EnvConfig(kwargs=EASY_ENV), groups_per_iteration=2, group_size=2, iterations_per_epoch=2, val_splits=[]
    )
    watch = Watch()
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[watch],
    )
    trainer.fit(m, dm)
    assert watch.marks == [True, True]  # each iteration's update
    snapshot = m.snapshot_trainable()
    m.engine._weights_stale = False
    m.restore_trainable(snapshot)
    assert m.engine._weights_stale


def test_a_killed_runs_weights_copy_is_removed_and_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid no longer names a process
    names = {
        "gone": f"rspo_vllm_abc.tmp-{dead.pid}",
        "live": f"rspo_vllm_def.tmp-{os.getpid()}",  # this test's own process
        "old": "rspo_vllm_x1y2z3",  # a name without a pid (written before the pid was in it)
        "other": f"other_abc.tmp-{dead.pid}",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"0" * 16)
    assert remove_orphaned_weight_dirs(str(tmp_path)) == [str(tmp_path / names["gone"])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "gone")
    assert remove_orphaned_weight_dirs(str(tmp_path / "missing")) == []
