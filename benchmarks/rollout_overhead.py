"""Rollout overhead: ``RolloutEngine.collect`` on Household vs raw ``model.generate`` on the very
same prompts and lengths, measured side by side in one run.

Every batched ``generate`` call the engine makes is recorded (its left-padded prompts and how
many tokens it generated); the raw side replays exactly those calls with ``model.generate``
alone (same sampling, forced to the same number of new tokens, no logits processor, no env,
no prompt building, no parsing). Both sides count the same generated tokens, so

    rollout_ratio = (engine tokens / engine seconds) / (raw tokens / raw seconds) = raw s / engine s.

Engine and raw runs alternate ``--repeats`` times after a warm-up; the median ratio is printed.

    python benchmarks/rollout_overhead.py                 # tiny quickstart model, constrained decoding
    python benchmarks/rollout_overhead.py --smollm2       # SmolLM2-135M-Instruct, free generation
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rspo_lightning.envs import make_env
from rspo_lightning.policy import TinyModelConfig, load_policy
from rspo_lightning.prompts import template_texts
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.types import TaskSpec

ENV = {"task_types": ["pick_and_place"], "num_receptacles": 4, "num_distractors": 1, "num_object_types": 8,
       "max_steps": 10, "info_actions": False}


def build(smollm2: bool):
    if smollm2:
        model, tok = load_policy("smollm2")
        cfg = RolloutConfig(constrained_decoding=False, max_new_tokens=48, template="household")
    else:
        env = make_env("rspo/Household-v0", **ENV)
        corpus = env.unwrapped.sample_texts() + template_texts() + [""]
        model, tok = load_policy("tiny", corpus=corpus,
                                 tiny=TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256))
        cfg = RolloutConfig(constrained_decoding=True, max_new_tokens=12, template="compact", system_prompt="")
    model.eval()
    return model, tok, RolloutEngine(model, tok, cfg, ENV)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smollm2", action="store_true")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smollm2:
        args.groups, args.group_size = min(args.groups, 2), min(args.group_size, 4)
    model, tok, engine = build(args.smollm2)
    original = model.generate
    calls: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def recording_generate(input_ids=None, attention_mask=None, **kw):
        out = original(input_ids=input_ids, attention_mask=attention_mask, **kw)
        calls.append((input_ids.clone(), attention_mask.clone(), out.sequences.shape[1] - input_ids.shape[1]))
        return out

    model.generate = recording_generate

    def engine_run(seed: int) -> tuple[float, int, list]:
        calls.clear()
        torch.manual_seed(seed)
        tokens0 = engine.stats["generated_tokens"]
        tasks = [TaskSpec("rspo/Household-v0", "train", 1000 * seed + g, g) for g in range(args.groups)]
        t0 = time.perf_counter()
        engine.collect(tasks, args.group_size)
        return time.perf_counter() - t0, engine.stats["generated_tokens"] - tokens0, list(calls)

    @torch.no_grad()
    def raw_run(recorded: list, seed: int) -> float:
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        for ids, mask, steps in recorded:
            original(input_ids=ids, attention_mask=mask, do_sample=True, temperature=engine.config.temperature, top_k=0,
                     top_p=None, max_new_tokens=steps, min_new_tokens=steps, pad_token_id=engine.pad_id)
        return time.perf_counter() - t0

    engine_run(0)  # warm-up (tries, env pool, kernels)
    ratios = []
    for r in range(1, args.repeats + 1):
        e_s, tokens, recorded = engine_run(r)
        raw_s = raw_run(recorded, r)
        ratios.append(raw_s / e_s)
        print(f"repeat {r}: {tokens} tokens in {len(recorded)} generate calls; engine {e_s:.2f} s = {tokens / e_s:.1f} tok/s, "
              f"raw generate {raw_s:.2f} s = {tokens / raw_s:.1f} tok/s, ratio {raw_s / e_s:.3f}")
    print(f"model: {'SmolLM2-135M-Instruct' if args.smollm2 else 'tiny (2x128)'}, threads {torch.get_num_threads()}, "
          f"{args.groups} groups x {args.group_size} episodes")
    print(f"rollout_ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
