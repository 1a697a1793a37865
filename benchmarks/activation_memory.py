"""Activation memory of one SmolLM2 update step, full fine-tuning or LoRA, against the count that
``rspo_lightning.memory`` makes (the calibration of ``memory.ACTIVATION_FACTOR``).

    python benchmarks/activation_memory.py full 238      # 8 rows x 238 tokens
    python benchmarks/activation_memory.py lora 190

Prints the process's RSS after loading, after the forward and the peak (``ru_maxrss``) after the
optimizer step, and the forward's growth over the counted activations.
"""

from __future__ import annotations

import argparse
import gc
import resource

import torch


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**30


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["full", "lora"])
    p.add_argument("tokens", type=int, help="tokens per row")
    p.add_argument("--rows", type=int, default=8)
    args = p.parse_args()
    from rspo_lightning.config import LoraSettings
    from rspo_lightning.language_model import apply_lora, load_policy
    from rspo_lightning.memory import activation_floats_per_token

    model, _ = load_policy("smollm2")
    gc.collect()
    loaded = rss_gb()
    print(f"loaded: {loaded:.2f} GB (peak {peak_gb():.2f})", flush=True)
    if args.mode == "lora":
        model = apply_lora(model, LoraSettings())
    model.train()
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-6)
    ids = torch.randint(0, 49152, (args.rows, args.tokens))
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=20, use_cache=False)
    lp = out.logits.float().log_softmax(-1)
    grown = rss_gb() - loaded
    counted = args.rows * args.tokens * 30 * activation_floats_per_token(576, 1536, 192) * 4 / 2**30
    lp.mean().backward()
    opt.step()
    print(
        f"forward kept {grown:.2f} GB, counted {counted:.2f} GB: {grown / counted:.2f}x; step peak {peak_gb():.2f} GB"
    )


if __name__ == "__main__":
    main()
