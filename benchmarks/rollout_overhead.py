"""Rollout overhead: ``RolloutEngine.collect`` on Household vs raw ``model.generate`` on the very
same prompts and lengths, measured side by side in one run.

Right after each batched ``generate`` call the engine makes, the raw side makes the same call
with ``model.generate`` alone: the same left-padded prompts, the same sampling, forced to the same
number of new tokens, no logits processor, no env, no prompt building, no parsing. That call is
timed on its own clock and its time is taken out of the engine's, so the two sides run
interleaved call by call (a slow spell of the machine hits both) and count the same generated
tokens:

    rollout_ratio = (engine tokens / engine seconds) / (raw tokens / raw seconds) = raw s / engine s.

``--repeats`` collects follow a warm-up; the median ratio is printed.

    python benchmarks/rollout_overhead.py                 # tiny quickstart model, constrained decoding
    python benchmarks/rollout_overhead.py --smollm2       # SmolLM2-135M-Instruct, free generation
    python benchmarks/rollout_overhead.py --breakdown     # + where the engine's time outside generate goes
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from rspo_lightning import rollout
from rspo_lightning.envs import make_env
from rspo_lightning.envs.pool import EnvPool
from rspo_lightning.language_model import TinyModelConfig, load_policy
from rspo_lightning.prompts import template_texts
from rspo_lightning.rollout import RolloutConfig, RolloutEngine, TrieConstraint
from rspo_lightning.runtime import freeze_startup_heap
from rspo_lightning.types import TaskSpec

ENV = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 10,
    "info_actions": False,
}


def build(smollm2: bool):
    if smollm2:
        model, tok = load_policy("smollm2")
        cfg = RolloutConfig(constrained_decoding=False, max_new_tokens=48, template="household")
    else:
        env = make_env("rspo/Household-v0", **ENV)
        corpus = env.unwrapped.sample_texts() + template_texts() + [""]
        model, tok = load_policy(
            "tiny",
            corpus=corpus,
            tiny=TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256),
        )
        cfg = RolloutConfig(constrained_decoding=True, max_new_tokens=12, template="compact", system_prompt="")
    model.eval()
    return model, tok, RolloutEngine(model, tok, cfg, ENV)


def time_parts(tokenizer) -> collections.Counter:
    """Wrap the engine's parts in timers; returns the Counter they add their seconds to."""
    seconds: collections.Counter = collections.Counter()

    def timed(owner, name: str, key: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                seconds[key] += time.perf_counter() - t0

        setattr(owner, name, wrapper)

    for owner, name, key in [
        (rollout, "build_turn_prompts", "prompts (render + tokenise)"),
        (rollout, "parse_response", "parse"),
        (rollout, "left_pad", "left pad"),
        (EnvPool, "step", "env step"),
        (EnvPool, "reset", "env reset"),
        (tokenizer, "decode", "decode"),
        (RolloutEngine, "_trie", "tries"),
        (TrieConstraint, "__init__", "trie table"),
        (TrieConstraint, "__call__", "trie mask (in generate)"),
        (TrieConstraint, "allowed_ids", "allowed ids"),
    ]:
        timed(owner, name, key)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smollm2", action="store_true")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the engine's parts (prompts, env calls, trie, parsing, ...) per repeat; the timers cost a little",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smollm2:
        args.groups, args.group_size = min(args.groups, 2), min(args.group_size, 4)
    model, tok, engine = build(args.smollm2)
    freeze_startup_heap()  # as AgentRLModule.setup does before training
    original = model.generate
    replay = {"seconds": 0.0, "calls": 0, "engine_generate": 0.0}

    @torch.no_grad()
    def raw_generate(ids: torch.Tensor, mask: torch.Tensor, steps: int) -> None:
        original(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=engine.config.temperature,
            top_k=0,
            top_p=None,
            max_new_tokens=steps,
            min_new_tokens=steps,
            pad_token_id=engine.pad_id,
        )

    def side_by_side_generate(input_ids=None, attention_mask=None, **kw):
        """The engine's own call, then raw generate on the same prompts for as many tokens (timed
        apart, outside the engine's clock; its random draws do not touch the engine's)."""
        t0 = time.perf_counter()
        out = original(input_ids=input_ids, attention_mask=attention_mask, **kw)
        replay["engine_generate"] += time.perf_counter() - t0
        steps = out.sequences.shape[1] - input_ids.shape[1]
        with torch.random.fork_rng(devices=[]):
            t0 = time.perf_counter()
            raw_generate(input_ids, attention_mask, steps)
            replay["seconds"] += time.perf_counter() - t0
        replay["calls"] += 1
        return out

    model.generate = side_by_side_generate
    parts = time_parts(tok) if args.breakdown else None

    def run(seed: int) -> tuple[float, float, int, int, float]:
        replay.update(seconds=0.0, calls=0, engine_generate=0.0)
        if parts is not None:
            parts.clear()
        torch.manual_seed(seed)
        tokens0 = engine.stats["generated_tokens"]
        tasks = [TaskSpec("rspo/Household-v0", "train", 1000 * seed + g, g) for g in range(args.groups)]
        t0 = time.perf_counter()
        engine.collect(tasks, args.group_size)
        wall = time.perf_counter() - t0
        return (
            wall - replay["seconds"],
            replay["seconds"],
            engine.stats["generated_tokens"] - tokens0,
            replay["calls"],
            replay["engine_generate"],
        )

    run(0)  # warm-up (tries, env pool, kernels)
    ratios = []
    for r in range(1, args.repeats + 1):
        e_s, raw_s, tokens, calls, gen_s = run(r)
        ratios.append(raw_s / e_s)
        print(
            f"repeat {r}: {tokens} tokens in {calls} generate calls; engine {e_s:.2f} s = {tokens / e_s:.1f} tok/s, "
            f"raw generate {raw_s:.2f} s = {tokens / raw_s:.1f} tok/s, ratio {raw_s / e_s:.3f} "
            f"(engine: {gen_s:.2f} s inside generate, {e_s - gen_s:.2f} s outside)"
        )
        if parts is not None:
            print("  engine parts, ms: " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in parts.most_common()))
    print(
        f"model: {'SmolLM2-135M-Instruct' if args.smollm2 else 'tiny (2x128)'}, threads {torch.get_num_threads()}, "
        f"{args.groups} groups x {args.group_size} episodes"
    )
    print(f"rollout_ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
