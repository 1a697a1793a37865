"""vLLM serves what ``rspo-lightning export`` writes: it loads the exported directory as any
Hugging Face model, and its log-probs of the tokens it samples equal the training forward."""

import lightning.pytorch as pl
import torch
from conftest import EASY_ENV, HEAD32

from rspo_lightning.callbacks import IterationCheckpoint
from rspo_lightning.config import AlgorithmConfig, EnvConfig, PolicyConfig
from rspo_lightning.datamodules import AgentDataModule
from rspo_lightning.export import export
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.vllm_backend import engine_kwargs

TOL = 1e-4  # fp32 on this CPU, as the backend's own tests


def test_vllm_loads_the_exported_directory_and_its_logprobs_match_the_training_forward(tmp_path):
    import vllm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    env = EnvConfig(kwargs=EASY_ENV)
    module = AgentRLModule(
        policy=PolicyConfig(tiny=TinyModelConfig(**HEAD32)),
        env=env,
        algorithm=AlgorithmConfig(ppo_epochs=1, minibatch_size=64),
        rollout=RolloutConfig(max_new_tokens=8, template="compact", system_prompt=""),
    )
    ckpt = IterationCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_iterations=1)
    pl.Trainer(
        max_epochs=1,
        logger=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ckpt],
    ).fit(module, AgentDataModule(env=env, groups_per_iteration=2, group_size=2, iterations_per_epoch=1, val_splits=[]))
    out = str(tmp_path / "hf")
    export(str(tmp_path / "ckpt" / "last.ckpt"), out)

    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    prompt = tok("Your task is to : put a cup in cabinet 1 . <action>", add_special_tokens=False).input_ids
    llm = vllm.LLM(
        model=out,
        tokenizer=out,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        seed=0,
        logprobs_mode="processed_logprobs",
        trust_remote_code=False,
        **engine_kwargs(1.0),
    )
    params = vllm.SamplingParams(max_tokens=8, temperature=1.0, logprobs=0, seed=0)
    result = llm.generate([vllm.inputs.TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0].outputs[0]
    ids = list(result.token_ids)
    served = torch.tensor([lp[t].logprob for lp, t in zip(result.logprobs, ids)])
    assert ids, "vLLM sampled nothing"

    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    trained = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
    gap = float((served - trained).abs().max())
    print(f"exported tiny model: vLLM vs training forward max |delta| {gap:.2e} over {len(ids)} tokens")
    assert gap < TOL
