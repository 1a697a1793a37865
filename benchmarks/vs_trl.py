"""Side by side with a real peer: TRL's ``GRPOTrainer`` vs our ``AgentRLModule`` on one
single-turn GRPO workload, each side in its own process (so peak RSS is per side), in one run.

The workload, identical on both sides as far as TRL allows:
- prompts: Household first-turn prompts (pick-and-place, the quickstart's easy env) built with
  our prompt builder (``render_prompt`` + the tokenizer's chat template); both sides play the
  very same task ids in the same iterations (``AgentDataModule.iteration_tasks``; TRL's dataset
  is unshuffled, so iteration k sees the same ``--prompts`` tasks);
- ``--prompts`` prompts x 8 generations per iteration, the same ``max_new_tokens``, sampling at
  temperature 1 (top-p 1, top-k off), free generation (no constrained decoding), stop at eos or
  ``</action>`` (TRL: ``stop_strings`` in its generation kwargs, or ``</action>``'s id as an extra
  eos when it is one token);
- reward: one environment step with the parsed action, the env's reward; an invalid action
  (no/empty ``<action>`` tag or not admissible) is stepped as "" and costs 0.1. Ours subtracts
  the 0.1 from the advantage after the group normalisation (the framework's rule, as verl-agent);
  TRL's reward function subtracts it from the reward before (the only place a TRL reward can go);
- GRPO with std normalisation, one optimisation epoch, one optimizer step per iteration over all
  prompts x generations (micro-batches of ``--micro``: TRL ``per_device_train_batch_size`` x
  ``gradient_accumulation_steps``; ours ``minibatch_size``/``micro_batch_size``), clip 0.2, no
  KL (``beta=0``: no reference model), no entropy bonus, token-mean loss (TRL ``loss_type="dapo"``),
  AdamW lr 1e-6 constant, grad clip 1.0, fp32, no gradient checkpointing (TRL's defaults
  bf16/gradient checkpointing switched off), old log-probs not re-scored on either side.

Seconds per iteration = the median interval between consecutive optimizer-step ends after a
warm-up iteration (TRL: ``TrainerCallback.on_step_end``; ours: Lightning
``on_train_batch_end``), so it covers everything a training loop does per iteration.

    /tmp/trlvenv/bin/pip install trl==1.16.0           # a venv with --system-site-packages
    python benchmarks/vs_trl.py                         # tiny quickstart model
    python benchmarks/vs_trl.py --smollm2               # SmolLM2-135M-Instruct

Target (issue 6): ours >= 1.0x TRL's throughput at <= 1.0x its peak memory.
The last line is ``vs_trl_throughput_ratio: <TRL s per iteration / ours>``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUP_SIZE = 8
ENV = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 10,
    "info_actions": False,
}
INVALID_PENALTY = 0.1


def settings(smollm2: bool) -> dict:
    if smollm2:
        return {
            "source": "smollm2",
            "template": "household",
            "system_prompt": "You are a helpful assistant.",
            "max_new_tokens": 48,
        }
    return {"source": "tiny", "template": "compact", "system_prompt": "", "max_new_tokens": 24}


def load_model(smollm2: bool):
    """The policy both sides train: SmolLM2 from its GGUF, or the tiny Llama built from the env's texts."""
    from rspo_lightning.envs import make_env
    from rspo_lightning.language_model import TinyModelConfig, load_policy
    from rspo_lightning.prompts import template_texts

    s = settings(smollm2)
    if smollm2:
        return load_policy("smollm2")
    corpus = make_env("rspo/Household-v0", **ENV).unwrapped.sample_texts() + template_texts() + [s["system_prompt"]]
    return load_policy(
        "tiny", corpus=corpus, tiny=TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256)
    )


def datamodule(args):
    from rspo_lightning.config import EnvConfig
    from rspo_lightning.datamodules import AgentDataModule

    return AgentDataModule(
        env=EnvConfig(kwargs=dict(ENV, max_steps=1)),
        groups_per_iteration=args.prompts,
        group_size=GROUP_SIZE,
        iterations_per_epoch=args.iterations + 1,
        val_splits=[],
        num_val_tasks=0,
        seed=0,
    )


def peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024


# ---------------------------------------------------------------------------------------------- ours
def run_ours(args) -> dict:
    import lightning.pytorch as pl

    from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
    from rspo_lightning.language_model import TinyModelConfig
    from rspo_lightning.module import AgentRLModule
    from rspo_lightning.rollout import RolloutConfig

    s = settings(args.smollm2)
    n = args.prompts * GROUP_SIZE
    module = AgentRLModule(
        policy=PolicyConfig(
            source=s["source"], tiny=TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256)
        ),
        env=EnvConfig(kwargs=dict(ENV, max_steps=1)),
        rollout=RolloutConfig(
            constrained_decoding=False,
            max_new_tokens=s["max_new_tokens"],
            template=s["template"],
            system_prompt=s["system_prompt"],
            max_turns=1,
            temperature=1.0,
        ),
        optim=OptimConfig(lr=1e-6),
        algorithm=AlgorithmConfig(
            estimator="grpo",
            ppo_epochs=1,
            minibatch_size=n,
            micro_batch_size=args.micro,
            recompute_old_logprobs=False,
            drop_zero_advantage=False,
            kl_coef=0.0,
            entropy_coef=0.0,
            invalid_action_penalty=INVALID_PENALTY,
            max_grad_norm=1.0,
            clip_eps_low=0.2,
            clip_eps_high=0.2,
            loss_agg="token-mean",
        ),
    )
    ends: list[float] = []
    gen: list[int] = []
    gen_s: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ends.append(time.perf_counter())
            gen.append(pl_module.engine.stats["generated_tokens"])
            gen_s.append(pl_module.engine.stats["generate_s"])

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[Clock()],
    )
    trainer.fit(module, datamodule=datamodule(args))
    tokens = [b - a for a, b in zip(gen, gen[1:])]
    return {
        "intervals": [b - a for a, b in zip(ends, ends[1:])],
        "generated_tokens": tokens,
        "generate_s": [b - a for a, b in zip(gen_s, gen_s[1:])],
    }


# ----------------------------------------------------------------------------------------------- TRL
def run_trl(args) -> dict:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from rspo_lightning.envs import make_env
    from rspo_lightning.parsing import parse_response
    from rspo_lightning.prompts import ACTION_CLOSE, build_turn_prompt, render_prompt
    from rspo_lightning.rollout import RolloutConfig

    s = settings(args.smollm2)
    model, tok = load_model(args.smollm2)
    model.train()
    env = make_env("rspo/Household-v0", **dict(ENV, max_steps=1))
    rows, mismatches = [], 0
    cfg = RolloutConfig(
        constrained_decoding=False,
        max_new_tokens=s["max_new_tokens"],
        template=s["template"],
        system_prompt=s["system_prompt"],
    )
    # The parent passes the task ids our datamodule plays (this process never imports Lightning,
    # so TRL's peak RSS holds TRL's own stack only).
    for iteration_ids in json.loads(args.task_ids):
        for task_id in iteration_ids:
            obs, info = env.reset(options={"split": "train", "task_id": task_id})
            text = render_prompt(
                s["template"],
                task=str(info.get("task", "")),
                observation=obs,
                admissible=info.get("admissible_actions"),
                history=[],
                step=0,
                history_window=2,
            )
            prompt = ([{"role": "system", "content": s["system_prompt"]}] if s["system_prompt"] else []) + [
                {"role": "user", "content": text}
            ]
            ours = build_turn_prompt(tok, cfg, info, obs, [], 0)
            theirs = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
            mismatches += list(ours) != list(theirs)
            rows.append({"prompt": prompt, "task_id": task_id, "prompt_tokens": len(theirs)})

    def env_reward(prompts, completions, task_id, **kwargs):
        out = []
        for completion, tid in zip(completions, task_id):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            obs, info = env.reset(options={"split": "train", "task_id": int(tid)})
            parsed = parse_response(text, info.get("admissible_actions"), require_admissible=True)
            _, reward, _, _, step_info = env.step(parsed.action if parsed.valid else "")
            valid = parsed.valid and not bool(step_info.get("invalid", False))
            out.append(float(reward) - (0.0 if valid else INVALID_PENALTY))
        return out

    close = tok(ACTION_CLOSE, add_special_tokens=False)["input_ids"]
    eos = [tok.eos_token_id] if isinstance(tok.eos_token_id, int) else list(tok.eos_token_id)
    gen_kwargs = {"eos_token_id": eos + close} if len(close) == 1 else {"stop_strings": [ACTION_CLOSE]}
    n = args.prompts * GROUP_SIZE
    config = trl.GRPOConfig(
        output_dir=args.out + "/trl",
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        num_generations=GROUP_SIZE,
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=n // args.micro,
        max_completion_length=s["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.iterations + 1,
        shuffle_dataset=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        dataloader_num_workers=0,
        generation_kwargs=gen_kwargs,
        disable_dropout=True,
    )
    ends: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            ends.append(time.perf_counter())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"] * n)

    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Clock()],
    )
    generate, gen_s = trainer.model.generate, []

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        if len(close) != 1:  # transformers' stop_strings need the tokenizer at generate time; TRL does not pass it
            kw["tokenizer"] = tok
        out = generate(*a, **kw)
        gen_s.append(time.perf_counter() - t0)
        return out

    trainer.model.generate = timed_generate
    # Rows stopped by </action> are padded; TRL masks the completion after the first eos, so count pad as one.
    pad = tok.pad_token_id
    if pad is not None and pad not in trainer.eos_token_ids:
        trainer.eos_token_ids = [*trainer.eos_token_ids, pad]
    trainer.train()
    return {
        "intervals": [b - a for a, b in zip(ends, ends[1:])],
        "generated_tokens": [round(x) for x in lengths[1:]],
        "generate_s": gen_s[1:],
        "prompt_mismatches": mismatches,
        "mean_prompt_tokens": statistics.fmean(r["prompt_tokens"] for r in rows),
        "versions": {
            "trl": trl.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "accelerate": __import__("accelerate").__version__,
            "datasets": __import__("datasets").__version__,
        },
    }


# -------------------------------------------------------------------------------------------- parent
def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    result = run_ours(args) if args.side == "ours" else run_trl(args)
    result["peak_rss_mb"] = peak_rss_mb()
    Path(args.result).write_text(json.dumps(result))


def side(
    name: str, python: str, args, out: str, task_ids: list[list[int]], script: str = __file__, extra: list[str] = ()
) -> dict:
    """Run one side (``script --side name``) in its own process; returns its result JSON."""
    result = os.path.join(out, f"{name}.json")
    cmd = [
        python,
        script,
        *extra,
        "--side",
        name,
        "--result",
        result,
        "--task-ids",
        json.dumps(task_ids),
        "--prompts",
        str(args.prompts),
        "--micro",
        str(args.micro),
        "--iterations",
        str(args.iterations),
        "--threads",
        str(args.threads),
        "--out",
        out,
    ] + (["--smollm2"] if args.smollm2 else [])
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.threads),
        MKL_NUM_THREADS=str(args.threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    t0 = time.perf_counter()
    with open(os.path.join(out, f"{name}.log"), "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if rc != 0:
        raise RuntimeError(f"{name} side failed (exit {rc}); see {os.path.join(out, name + '.log')}")
    res = json.loads(Path(result).read_text())
    res["wall_s"] = time.perf_counter() - t0
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smollm2", action="store_true")
    p.add_argument("--prompts", type=int, default=None, help="prompts per iteration (default 16 tiny, 2 SmolLM2)")
    p.add_argument(
        "--micro", type=int, default=None, help="sequences per forward/backward (default 32 tiny, 4 SmolLM2)"
    )
    p.add_argument(
        "--iterations", type=int, default=None, help="measured iterations after one warm-up (default 4 tiny, 2 SmolLM2)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--trl-python", default="/tmp/trlvenv/bin/python", help="python of a venv with trl installed")
    p.add_argument("--out", default=None, help="folder for logs and results (default: a temporary one)")
    p.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--task-ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.prompts = args.prompts or (2 if args.smollm2 else 16)
    args.micro = args.micro or (4 if args.smollm2 else 32)
    args.iterations = args.iterations or (2 if args.smollm2 else 4)
    if (args.prompts * GROUP_SIZE) % args.micro:
        raise ValueError(f"--micro must divide prompts x {GROUP_SIZE} = {args.prompts * GROUP_SIZE}, got {args.micro}")
    if args.side:
        return child(args)
    import tempfile

    args.out = args.out or tempfile.mkdtemp(prefix="rspo_vs_trl_")
    os.makedirs(args.out, exist_ok=True)
    dm = datamodule(args)
    task_ids = [[t.task_id for t in dm.iteration_tasks(it)] for it in range(args.iterations + 1)]
    results = {}
    for name, python in (("trl", args.trl_python), ("ours", sys.executable)):
        results[name] = r = side(name, python, args, args.out, task_ids)
        med = statistics.median(r["intervals"][-args.iterations :])
        tok = statistics.fmean(r["generated_tokens"][-args.iterations :]) if r["generated_tokens"] else float("nan")
        gen_med = statistics.median(r["generate_s"][-args.iterations :])
        print(
            f"{name}: s/iteration {', '.join(f'{x:.2f}' for x in r['intervals'])} (median of the last {args.iterations}: {med:.2f}, "
            f"of which generate {gen_med:.2f}); generated tokens/iteration {tok:.0f}; peak RSS {r['peak_rss_mb']:.0f} MB; "
            f"process wall {r['wall_s']:.0f} s",
            flush=True,
        )
        r["median_s"] = med
    trl_r, ours = results["trl"], results["ours"]
    print(
        f"versions: {json.dumps(trl_r['versions'])}; prompt tokens (mean) {trl_r['mean_prompt_tokens']:.0f}, "
        f"prompts where our builder and TRL's chat templating differ: {trl_r['prompt_mismatches']}"
    )
    speed = trl_r["median_s"] / ours["median_s"]
    mem = ours["peak_rss_mb"] / trl_r["peak_rss_mb"]
    print(
        f"model: {'SmolLM2-135M-Instruct' if args.smollm2 else 'tiny (2x128)'}; {args.prompts} prompts x {GROUP_SIZE} generations, "
        f"max_new_tokens {settings(args.smollm2)['max_new_tokens']}, micro-batch {args.micro}, threads {args.threads}; logs in {args.out}"
    )
    print(f"throughput ours/TRL {speed:.3f} (target >= 1.0); peak RSS ours/TRL {mem:.3f} (target <= 1.0)")
    print(f"vs_trl_memory_ratio: {mem:.3f}")
    print(f"vs_trl_throughput_ratio: {speed:.3f}")


if __name__ == "__main__":
    main()
