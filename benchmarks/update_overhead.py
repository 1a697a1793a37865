"""Update overhead: trained tokens/s of one ``AgentRLModule`` update vs a raw
forward + backward + optimizer step on the very same padded batch, side by side in one run.

A batch of real Household turns is collected once. Ours: ``update.ppo_update`` with the module's
loss (``AgentRLModule.loss``), one PPO epoch
and one minibatch (the clipped surrogate with the generalised centre, constrained
renormalisation, entropy, stats, gradient clipping, AdamW). Raw: the same model, the same padded
``input_ids``/``attention_mask``, one forward with ``logits_to_keep`` over the response window,
``log_softmax`` + gather of the response tokens, loss = −mean(advantage × log-prob) over the
response tokens, backward, AdamW step. Both train the same tokens, so

    update_ratio = (ours tokens / ours s) / (raw tokens / raw s) = raw s / ours s.

They alternate ``--repeats`` times after a warm-up; the median ratio is printed.

    python benchmarks/update_overhead.py              # tiny quickstart model
    python benchmarks/update_overhead.py --smollm2    # SmolLM2-135M-Instruct
    python benchmarks/update_overhead.py --smollm2 --groups 1 --max-steps 2   # smaller batch (~8 rows)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rspo_lightning import logprobs, update
from rspo_lightning.batching import flatten, make_train_batch, positions_from_mask
from rspo_lightning.config import AlgorithmConfig, EnvConfig, OptimConfig, PolicyConfig
from rspo_lightning.language_model import TinyModelConfig
from rspo_lightning.module import AgentRLModule
from rspo_lightning.rollout import RolloutConfig
from rspo_lightning.types import TaskSpec

ENV = {
    "task_types": ["pick_and_place"],
    "num_receptacles": 4,
    "num_distractors": 1,
    "num_object_types": 8,
    "max_steps": 10,
    "info_actions": False,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smollm2", action="store_true")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=ENV["max_steps"], help="turn cap of the collected episodes")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smollm2:
        policy = PolicyConfig(source="smollm2")
        rollout = RolloutConfig(constrained_decoding=False, max_new_tokens=48, template="household")
        args.groups, args.group_size = min(args.groups, 2), min(args.group_size, 4)
    else:
        policy = PolicyConfig(tiny=TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256))
        rollout = RolloutConfig(constrained_decoding=True, max_new_tokens=12, template="compact", system_prompt="")
    module = AgentRLModule(
        policy=policy,
        env=EnvConfig(kwargs=dict(ENV, max_steps=args.max_steps)),
        rollout=rollout,
        optim=OptimConfig(lr=1e-5),
        algorithm=AlgorithmConfig(ppo_epochs=1, minibatch_size=10**6, recompute_old_logprobs=False),
    )
    module.configure_model()
    torch.manual_seed(0)
    trajs = module.engine.collect(
        [TaskSpec("rspo/Household-v0", "train", g, g) for g in range(args.groups)], args.group_size
    )
    flat = flatten(trajs)
    batch = make_train_batch(flat, module.engine.pad_id, torch.randn(len(flat.turns)))
    tokens = int(batch.attention_mask.sum())
    model = module.policy
    model.train()
    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-5)
    dummy = logprobs.dummy_batch(module.engine.pad_id)

    def ours() -> float:
        t0 = time.perf_counter()
        update.ppo_update(batch, module.loss, opt, module.algo, dummy=dummy, generator=torch.Generator().manual_seed(0))
        return time.perf_counter() - t0

    def raw() -> float:
        t0 = time.perf_counter()
        ids, attn = batch.input_ids, batch.attention_mask
        window = batch.response_mask.shape[1]
        opt.zero_grad()
        out = model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=positions_from_mask(attn),
            logits_to_keep=window + 1,
            use_cache=False,
        )
        lp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1).gather(-1, ids[:, -window:, None]).squeeze(-1)
        mask = batch.response_mask
        loss = -(lp * batch.advantages[:, None])[mask].mean()
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    ours(), raw()  # warm-up
    ratios = []
    for r in range(1, args.repeats + 1):
        o, w = ours(), raw()
        ratios.append(w / o)
        print(
            f"repeat {r}: {len(batch)} rows, {tokens} tokens; ours {o:.3f} s = {tokens / o:.0f} tok/s, "
            f"raw {w:.3f} s = {tokens / w:.0f} tok/s, ratio {w / o:.3f}"
        )
    print(f"model: {'SmolLM2-135M-Instruct' if args.smollm2 else 'tiny (2x128)'}, threads {torch.get_num_threads()}")
    print(f"update_ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
