"""rspo-lightning export: agent A of a checkpoint as a Hugging Face directory that transformers
(and peft) load with no network, whose logits equal the module's agent A."""

from __future__ import annotations

import json
import os

import lightning.pytorch as pl
import pytest
import torch

from rspo_lightning.callbacks import IterationCheckpoint
from rspo_lightning.checkpointing import CheckpointError
from rspo_lightning.config import AlgorithmConfig, EnvConfig, LoraSettings, OptimConfig, PolicyConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.export import export, main
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rewards import EnvProgressReward
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.rspo.loop import RSPOLoop

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
PROMPT = (
    "You are in the middle of a room . Your task is to : put a cup in cabinet 1 . <action> go to cabinet 1 </action>"
)


def _module(lora=None, rollout=ROLLOUT):
    return AgentRLModule(
        policy=PolicyConfig(tiny=TINY, lora=lora),
        env=ENV,
        optim=OptimConfig(lr=5e-2),
        algorithm=AlgorithmConfig(ppo_epochs=1, minibatch_size=64),
        rollout=rollout,
        dense_reward=EnvProgressReward(),
    )


def _fit(module, tmp_path, iterations, callbacks=()):
    ckpt = IterationCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_iterations=1)
    pl.Trainer(
        max_epochs=1,
        logger=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, ckpt],
    ).fit(
        module,
        AgentDataModule(env=ENV, groups_per_iteration=2, group_size=2, iterations_per_epoch=iterations, val_splits=[]),
    )
    return str(tmp_path / "ckpt" / "last.ckpt")


@torch.no_grad()
def _logits(model, tokenizer):
    ids = tokenizer(PROMPT, return_tensors="pt", add_special_tokens=False).input_ids
    return model(input_ids=ids).logits.float()


def _load(directory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, torch_dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(directory, local_files_only=True)


def test_export_loads_with_transformers_and_matches_the_policy(tmp_path):
    torch.manual_seed(0)
    m = _module()
    path = _fit(m, tmp_path, 2)
    out = tmp_path / "hf"
    meta = export(path, str(out))
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "rspo_export.json"} <= set(
        os.listdir(out)
    )
    model, tokenizer = _load(str(out))
    assert tokenizer.chat_template  # the tiny tokenizer's template travels with it
    torch.testing.assert_close(_logits(model, tokenizer), _logits(m.policy.eval(), m.tokenizer), atol=1e-5, rtol=0)
    assert meta["iteration"] == 2 and meta["agent"] == "A" and meta["estimator"] == "grpo" and not meta["rspo"]
    assert json.loads((out / "rspo_export.json").read_text())["source_sha256"] == meta["source_sha256"]
    # an existing directory is not overwritten without asking
    with pytest.raises(FileExistsError, match="--overwrite"):
        export(path, str(out))


def test_a_checkpoint_of_b_s_phase_exports_agent_a(tmp_path):
    torch.manual_seed(0)
    # unconstrained: invalid actions take the penalty, so B's first update has a gradient
    m = _module(
        rollout=RolloutConfig(constrained_decoding=False, max_new_tokens=6, template="compact", system_prompt="")
    )
    seen = {}

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen["a"] = {n: p.detach().clone() for n, p in pl_module.policy.named_parameters()}

    path = _fit(m, tmp_path, 1, callbacks=[RSPOLoop(k=2), Probe()])  # one explore iteration: the module is B
    state = torch.load(path, weights_only=True)["state_dict"]
    b_weight = state["policy.model.layers.0.mlp.up_proj.weight"]
    assert not torch.equal(b_weight, seen["a"]["model.layers.0.mlp.up_proj.weight"])  # B moved away from A
    meta = export(path, str(tmp_path / "hf"))
    assert meta["taken_from_rspo_snapshot"] and meta["rspo"]
    model, _ = _load(str(tmp_path / "hf"))
    exported = dict(model.named_parameters())
    for name, value in seen["a"].items():
        assert torch.equal(exported[name], value), name  # agent A, bitwise


def test_lora_exports_merged_and_as_a_peft_adapter(tmp_path):
    from peft import PeftModel

    torch.manual_seed(0)
    m = _module(lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    path = _fit(m, tmp_path, 2)
    export(path, str(tmp_path / "merged"))
    model, tokenizer = _load(str(tmp_path / "merged"))
    assert not any("lora" in n for n, _ in model.named_parameters())
    reference = _logits(m.policy.eval(), m.tokenizer)
    torch.testing.assert_close(_logits(model, tokenizer), reference, atol=1e-5, rtol=0)

    meta = export(path, str(tmp_path / "adapter"), adapter_only=True)
    assert meta["lora"] == "adapter"
    files = set(os.listdir(tmp_path / "adapter"))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny"
    base = _module()  # the tiny base is rebuilt from its seed; LoRA never changes it
    base.configure_model()
    adapted = PeftModel.from_pretrained(base.policy, str(tmp_path / "adapter")).eval()
    torch.testing.assert_close(_logits(adapted, m.tokenizer), reference, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="no LoRA adapter"):
        export(_fit(_module(), tmp_path / "plain", 1), str(tmp_path / "x"), adapter_only=True)


def test_a_corrupt_checkpoint_is_named_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "last.ckpt"
    bad.write_text("not a checkpoint")
    assert main(["--ckpt_path", str(bad), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "cannot be read as a PyTorch checkpoint" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".hf")]
    with pytest.raises(CheckpointError, match="no meta.pt"):
        export(str(tmp_path), str(tmp_path / "hf"))


def test_export_of_a_two_rank_fsdp2_checkpoint_on_one_cpu_process(tmp_path):
    """A distributed checkpoint folder (FSDP2 over gloo, one shard per rank) exported by one
    process: the weights equal torch's own consolidation of the shards (dcp_to_torch_save)."""
    from safetensors.torch import load_file
    from test_distributed import ROOT, TINY_ARGS
    from test_distributed import _fit as fit_subprocess
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = tmp_path / "ckpt"
    fit_subprocess(
        [
            *TINY_ARGS,
            "--config",
            os.path.join(ROOT, "configs", "trainer", "fsdp2_cpu.yaml"),
            "--trainer.max_epochs",
            "1",
            "--trainer.num_sanity_val_steps",
            "0",
            "--trainer.limit_val_batches",
            "0",
            "--trainer.callbacks+=ModelCheckpoint",
            f"--trainer.callbacks.dirpath={ckpt}",
            "--trainer.callbacks.save_last=true",
            "--trainer.enable_checkpointing=true",
        ],
        cwd=tmp_path,
    )
    folder = ckpt / "last.ckpt"
    assert folder.is_dir() and {f for f in os.listdir(folder) if f.endswith(".distcp")} == {
        "__0_0.distcp",
        "__1_0.distcp",
    }
    meta = export(str(folder), str(tmp_path / "hf"))
    assert meta["iteration"] == 1
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    dcp_to_torch_save(str(folder), str(tmp_path / "full.pt"))
    full = torch.load(tmp_path / "full.pt", weights_only=False)["state_dict"]
    policy = {k.removeprefix("policy."): v for k, v in full.items() if k.startswith("policy.")}
    assert set(exported) <= set(policy) and len(exported) >= len(policy) - 1  # the tied head is written once
    for k, v in exported.items():
        assert torch.equal(v, policy[k]), k
    model, tokenizer = _load(str(tmp_path / "hf"))
    assert torch.isfinite(_logits(model, tokenizer)).all()


def test_export_hf_at_the_end_of_fit(tmp_path):
    torch.manual_seed(0)
    m = _module()
    exports = []

    class Seen(pl.Callback):  # Lightning runs checkpoint callbacks last: look at the next epoch's start
        def on_train_epoch_start(self, trainer, pl_module):
            meta = tmp_path / "run" / "hf" / "rspo_export.json"
            exports.append(json.loads(meta.read_text())["iteration"] if meta.exists() else None)

    ckpt = IterationCheckpoint(
        dirpath=str(tmp_path / "run" / "checkpoints"), every_n_iterations=1, export_hf=True, export_hf_every_epoch=True
    )
    pl.Trainer(
        max_epochs=2,
        logger=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ckpt, Seen()],
    ).fit(m, AgentDataModule(env=ENV, groups_per_iteration=2, group_size=2, iterations_per_epoch=1, val_splits=[]))
    assert exports == [None, 1]  # written at the end of epoch 0, then replaced at the end of fit
    model, tokenizer = _load(str(tmp_path / "run" / "hf"))
    assert json.loads((tmp_path / "run" / "hf" / "rspo_export.json").read_text())["iteration"] == 2
    torch.testing.assert_close(_logits(model, tokenizer), _logits(m.policy.eval(), m.tokenizer), atol=1e-5, rtol=0)


def test_export_of_an_fsdp1_sharded_checkpoint_folder(tmp_path):
    """FSDPStrategy(state_dict_type="sharded") needs GPUs; its folder layout (``model.*`` entries in
    torch.distributed.checkpoint shards + ``meta.pt``, as Lightning writes it) is rebuilt here from a
    one-process checkpoint, and exports to the same weights."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    torch.manual_seed(0)
    m = _module()
    path = _fit(m, tmp_path, 1)
    export(path, str(tmp_path / "from_file"))
    checkpoint = torch.load(path, weights_only=True)
    folder = tmp_path / "sharded.ckpt"
    dcp.save({"model": checkpoint.pop("state_dict")}, checkpoint_id=str(folder), no_dist=True)
    torch.save(checkpoint, folder / "meta.pt")
    export(str(folder), str(tmp_path / "from_folder"))
    a, b = (
        load_file(str(tmp_path / "from_file" / "model.safetensors")),
        load_file(str(tmp_path / "from_folder" / "model.safetensors")),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_validating_the_export_reproduces_validating_its_checkpoint(tmp_path):
    """``validate --model.policy.source <exported>`` plays what ``validate --ckpt_path <checkpoint>``
    plays: the same weights and tokenizer, and held-out sampling seeded by the run's seed and the
    batch of tasks only (common random numbers), so the numbers are equal, not merely close."""
    from rspo_lightning.cli import main

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    common = [
        "--config",
        os.path.join(root, "configs", "compare", "grpo.yaml"),
        "--model.policy.tiny.hidden_size=32",
        "--model.policy.tiny.intermediate_size=64",
        "--model.policy.tiny.num_layers=1",
        "--data.num_val_tasks=8",
        "--trainer.enable_progress_bar=false",
    ]
    main(
        [
            "fit",
            *common,
            f"--trainer.default_root_dir={tmp_path}/run",
            "--trainer.max_epochs=1",
            "--data.iterations_per_epoch=2",
            "--data.groups_per_iteration=2",
            "--trainer.num_sanity_val_steps=0",
        ]
    )
    ckpt = tmp_path / "run" / "compare_grpo" / "checkpoints" / "last.ckpt"
    export(str(ckpt), str(tmp_path / "hf"))
    results = []
    for extra in ([f"--ckpt_path={ckpt}"], [f"--model.policy.source={tmp_path}/hf"]):
        seen = {}

        class Keep(pl.Callback):
            def on_validation_end(self, trainer, pl_module, seen=seen):
                seen.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")})

        import rspo_lightning.cli as cli_module

        original = cli_module.AgentCLI._instantiate_trainer

        def with_keep(self, config, callbacks, original=original):
            return original(self, config, [*callbacks, Keep()])

        cli_module.AgentCLI._instantiate_trainer = with_keep
        try:
            main(["validate", *common, f"--trainer.default_root_dir={tmp_path}/val", *extra])
        finally:
            cli_module.AgentCLI._instantiate_trainer = original
        results.append(seen)
    assert results[0] and "val/success_rate" in results[0]
    assert results[0] == results[1]


def _dead_pid() -> int:
    from rspo_lightning.runfiles import pid_alive

    return next(p for p in range(4_194_000, 4_194_304) if not pid_alive(p))


def test_export_overwrite_replaces_only_an_earlier_export_and_never_a_run(tmp_path, capsys):
    ckpt = _fit(_module(), tmp_path, 1)
    before = sorted(os.listdir(tmp_path / "ckpt"))
    # the run's folder (it holds the checkpoint being exported), the checkpoint folder itself, a folder of
    # other checkpoints, a folder that is no export, a file: each refused in one line, nothing deleted
    other = tmp_path / "other_run"
    (other / "checkpoints").mkdir(parents=True)
    (other / "checkpoints" / "iteration=5.ckpt").write_bytes(b"x")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.txt").write_text("keep me")
    afile = tmp_path / "file.txt"
    afile.write_text("keep me too")
    for out, says in (
        (tmp_path, "holds the checkpoint being exported"),
        (tmp_path / "ckpt", "holds the checkpoint being exported"),
        (other, "holds checkpoints (checkpoints/iteration=5.ckpt)"),
        (notes, "is not an earlier export (no rspo_export.json; it holds a.txt)"),
        (afile, "is a file"),
    ):
        assert main(["--ckpt_path", ckpt, "--out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path / "ckpt")) == before and os.path.exists(ckpt)
    assert (other / "checkpoints" / "iteration=5.ckpt").exists() and (notes / "a.txt").read_text() == "keep me"
    assert afile.read_text() == "keep me too"
    # an earlier export is replaced; without --overwrite it is refused
    hf = tmp_path / "hf"
    assert main(["--ckpt_path", ckpt, "--out", str(hf)]) == 0
    assert main(["--ckpt_path", ckpt, "--out", str(hf)]) == 2 and "pass --overwrite" in capsys.readouterr().err
    # a dead export's leftover is removed at the next export; a live process's is not
    dead, live = tmp_path / f".hf.tmp-{_dead_pid()}", tmp_path / f".hf.tmp-{os.getppid()}"
    dead.mkdir()
    live.mkdir()
    assert main(["--ckpt_path", ckpt, "--out", str(hf), "--overwrite"]) == 0
    assert (hf / "rspo_export.json").is_file() and not dead.exists() and live.exists()
