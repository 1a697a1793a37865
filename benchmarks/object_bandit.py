"""How many decisions the quickstart's object choice takes to learn, as a one-step problem.

The quickstart's policy reads the task's goal word but takes the target object at chance
(``benchmarks/grounding.py``). This script asks whether the choice itself is hard for the model:
the quickstart's tiny Llama, from its own initialisation, sees the quickstart's prompt at a
receptacle holding the target and another object ("<action> take" already written) and chooses
the object token among the ones the constrained decoder allows there. Two ways to learn it:

- ``supervised``: cross-entropy on the target (an upper bound: every decision carries the answer);
- ``pg``: GRPO on the decision alone: ``--group`` samples per state, reward 1 for the target,
  advantages normalised within the group, PPO's clipped loss over ``--epochs`` passes. With
  ``--p-right`` / ``--p-wrong`` the reward is an episode's outcome instead, won with those
  probabilities after the target / another object (what the rest of the episode adds as noise).

Printed: the held-out accuracy (argmax over the allowed objects, valid_seen tasks) against the
number of decisions sampled, and the first count at which it reaches ``--target``. Compare it
with how many object decisions a quickstart run makes, and how many of them carry any GRPO signal
(``grounding.py --iterations``).

    python benchmarks/object_bandit.py --mode supervised
    python benchmarks/object_bandit.py --mode pg --epochs 2 --seeds 0,1,2
    python benchmarks/object_bandit.py --mode pg --epochs 2 --seeds 0,1,2 --p-right 0.57 --p-wrong 0.06
    python benchmarks/object_bandit.py --mode pg --epochs 2 --seeds 0,1,2 --p-right 0.57 --p-wrong 0.06 --template compact
    python benchmarks/object_bandit.py --mode pg --epochs 2 --p-right 0.57 --p-wrong 0.06 --init runs/.../last.ckpt

``--init`` starts from a trained quickstart policy: whether the weights an episode run ends with
can still learn the choice as fast as the initialisation does; ``--scale-qk`` softens its
attention first; ``--attention`` prints the attention at the choice (entropy, mass on the task's
object word) instead of learning.

    python benchmarks/object_bandit.py --attention --init runs/.../last.ckpt
    python benchmarks/object_bandit.py --mode supervised --init runs/.../last.ckpt --scale-qk 0.35
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
import yaml
from grounding import ROOT, quickstart_env, task_words
from lightning.pytorch.callbacks import Callback

from rspo_lightning.envs.household import Household
from rspo_lightning.envs.household import _type_of as _kind
from rspo_lightning.language_model import TinyModelConfig, load_policy
from rspo_lightning.prompts import HistoryEntry, action_response_ids, build_turn_prompt, template_texts
from rspo_lightning.rollout import RolloutConfig

State = tuple[list[int], int, list[int]]  # prompt ids ending in "<action> take", target token id, allowed ids


def choice_states(env: Household, tokenizer, rollout: RolloutConfig, split: str, task_ids) -> list[State]:
    """One object-choice state per task that has one: the first receptacle (in the env's order)
    holding the target and another object type, reached by ``go to`` (and ``open`` if closed)."""
    states = []
    for task_id in task_ids:
        obs, info = env.reset(options={"split": split, "task_id": task_id})
        obj, _ = task_words(info["task"])
        for line in info["privileged"].splitlines()[3:]:  # "cabinet 1 (closed): tomato 2, egg 1"
            name, _, contents = line.partition(": ")
            kinds = {_kind(c) for c in contents.split(", ") if c != "nothing"}
            if obj not in kinds or len(kinds) < 2:
                continue
            receptacle = name.replace(" (closed)", "")
            history = []
            for action in [f"go to {receptacle}"] + ([f"open {receptacle}"] if "(closed)" in name else []):
                next_obs, _, _, _, info = env.step(action)
                history.append(HistoryEntry(obs, action))
                obs = next_obs
            prompt = build_turn_prompt(tokenizer, rollout, info, obs, history, len(history))
            prefix = action_response_ids(tokenizer, "take")[:-1]  # "<action> take" (no "</action>")
            takes = [a.split()[1] for a in info["admissible_actions"] if a.startswith("take ")]
            allowed = sorted({tokenizer.convert_tokens_to_ids(w) for w in takes})
            states.append((prompt + prefix, tokenizer.convert_tokens_to_ids(obj), allowed))
            break
    return states


def choice_logits(model, pad_id: int, states: list[State]) -> torch.Tensor:
    """Next-token logits after each state's prompt, ``[n, vocab]`` (left padding)."""
    width = max(len(p) for p, _, _ in states)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p, _, _ in states])
    attn = (ids != pad_id).long()
    return model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits[:, -1]


@torch.no_grad()
def accuracy(model, pad_id: int, states: list[State]) -> float:
    """Share of states whose highest-logit allowed object is the target."""
    model.eval()
    right = 0
    for i in range(0, len(states), 64):
        chunk = states[i : i + 64]
        logits = choice_logits(model, pad_id, chunk)
        right += sum(allowed[int(logits[j, allowed].argmax())] == t for j, (_, t, allowed) in enumerate(chunk))
    model.train()
    return right / len(states)


def build_model(args, env: Household, cfg: dict):
    """The quickstart's tiny policy and tokenizer as ``build_models`` makes them (from
    ``--init``'s checkpoint, q/k scaled by ``--scale-qk``), and the rollout config."""
    rollout = RolloutConfig(**{**cfg["model"]["rollout"], **({"template": args.template} if args.template else {})})
    corpus = env.sample_texts() + template_texts() + [rollout.system_prompt]  # what build_models trains on
    tiny = {**cfg["model"]["policy"]["tiny"], **json.loads(args.tiny)}
    model, tok = load_policy("tiny", tiny=TinyModelConfig(**tiny), corpus=corpus)
    if args.init:
        load_trained(model, args.init)
    if args.scale_qk != 1.0:
        scale_qk(model, args.scale_qk)
    return model, tok, rollout


def learn(args, seed: int, env: Household, cfg: dict) -> list[tuple[int, float]]:
    """One learning curve: [(decisions sampled, held-out accuracy)], stopping at ``--target``."""
    model, tok, rollout = build_model(args, env, cfg)
    torch.manual_seed(seed)
    train = choice_states(env, tok, rollout, "train", range(args.train_tasks))
    test = choice_states(env, tok, rollout, "valid_seen", range(env.num_tasks("valid_seen")))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    curve, decisions, rng = [(0, accuracy(model, tok.pad_token_id, test))], 0, random.Random(seed)
    while decisions < args.max_decisions and curve[-1][1] < args.target:
        rng.shuffle(train)
        for i in range(0, len(train) - args.states + 1, args.states):
            batch = train[i : i + args.states]
            if args.mode == "supervised":
                logits = choice_logits(model, tok.pad_token_id, batch)
                loss = -sum(torch.log_softmax(logits[j, a], -1)[a.index(t)] for j, (_, t, a) in enumerate(batch)) / len(
                    batch
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                decisions += len(batch)
            else:
                with torch.no_grad():
                    logits = choice_logits(model, tok.pad_token_id, batch)
                samples = []
                for j, (_, target, allowed) in enumerate(batch):
                    old = torch.log_softmax(logits[j, allowed], -1)
                    picks = torch.multinomial(old.exp(), args.group, replacement=True)
                    right = torch.tensor([allowed[k] == target for k in picks])
                    # the episode's outcome after the choice: won with p_right after the target, p_wrong after another
                    reward = (torch.rand(len(picks)) < torch.where(right, args.p_right, args.p_wrong)).float()
                    decisions += args.group
                    if reward.std() > 0:  # an all-right or all-wrong group carries no signal
                        samples.append((j, picks, (reward - reward.mean()) / (reward.std() + 1e-6), old[picks]))
                for _ in range(args.epochs if samples else 0):
                    logits = choice_logits(model, tok.pad_token_id, batch)
                    loss = 0.0
                    for j, picks, adv, old in samples:
                        ratio = (torch.log_softmax(logits[j, batch[j][2]], -1)[picks] - old).exp()
                        loss = loss - torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum()
                    opt.zero_grad()
                    (loss / (len(samples) * args.group)).backward()
                    opt.step()
            if (i // args.states) % args.eval_every == 0:
                curve.append((decisions, accuracy(model, tok.pad_token_id, test)))
                if curve[-1][1] >= args.target or decisions >= args.max_decisions:
                    break
    return curve


@torch.no_grad()
def attention_at_choice(model, tokenizer, states: list[State]) -> dict[str, list[float]]:
    """At the object-choice position of each state (one at a time, no padding): per layer and
    head, the attention's entropy in nats (log of the prompt length when uniform, 0 when on one
    position) and its mass on the target word in the task sentence (between the last "Task"
    and the "." that ends its sentence, wherever the template puts it), both averaged over the states."""
    span = (tokenizer.convert_tokens_to_ids("Task"), tokenizer.convert_tokens_to_ids("."))
    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"  # the fused kernels return no attention weights
    was_training = model.training
    model.eval()
    entropy, mass = [], []
    try:
        for prompt, target, _ in states:
            attn = model(input_ids=torch.tensor([prompt]), output_attentions=True).attentions
            start = max(i for i, t in enumerate(prompt) if t == span[0])
            end = prompt.index(span[1], start)
            where = [i for i in range(start, end) if prompt[i] == target]
            last = torch.stack([a[0, :, -1] for a in attn])  # [layers, heads, seq]
            entropy.append(-(last * last.clamp_min(1e-12).log()).sum(-1))
            mass.append(last[..., where].sum(-1))
    finally:
        model.config._attn_implementation = impl
        model.train(was_training)
    return {"entropy": torch.stack(entropy).mean(0).tolist(), "target_mass": torch.stack(mass).mean(0).tolist()}


class ChoiceProbe(Callback):
    """Every ``every`` training iterations, measure the policy at the object choice of ``n``
    valid_seen states (``choice_states``): the held-out accuracy of its argmax (``accuracy``) and
    ``attention_at_choice``; one JSON line per measurement in ``out`` (``iteration``: the
    iteration just trained, as ``EpisodeDump`` numbers them; −1 before the first). On the CLI:
    ``--trainer.callbacks+=object_bandit.ChoiceProbe --trainer.callbacks.out FILE`` with
    ``benchmarks`` on ``PYTHONPATH``."""

    def __init__(self, out: str = "runs/choice_probe.jsonl", every: int = 5, n: int = 48) -> None:
        self.out, self.every, self.n, self.states = Path(out), every, n, None

    def _measure(self, trainer, pl_module) -> None:
        if self.states is None:
            env = quickstart_env()
            tasks = range(env.num_tasks("valid_seen"))
            self.states = choice_states(env, pl_module.tokenizer, pl_module.rollout_cfg, "valid_seen", tasks)[: self.n]
        model, tok = pl_module.policy, pl_module.tokenizer
        row = {
            "iteration": trainer.fit_loop.epoch_loop.total_batch_idx,
            "accuracy": accuracy(model, tok.pad_token_id, self.states),
            **attention_at_choice(model, tok, self.states),
        }
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with self.out.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        self._measure(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.fit_loop.epoch_loop.total_batch_idx % self.every == 0:
            self._measure(trainer, pl_module)


def load_trained(model, path: str) -> None:
    """Start from a quickstart run's trained policy (a Lightning checkpoint of ``fit``) instead of
    the initialisation; the tokenizer built from the same corpus has the same ids."""
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    policy = {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}
    missing, unexpected = model.load_state_dict(policy, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # lm_head is tied to the embedding
        raise ValueError(f"{path} does not hold this tiny policy: missing {missing}, unexpected {unexpected}")


def scale_qk(model, factor: float) -> None:
    """Multiply every layer's query and key projections by ``factor`` (the attention logits by
    ``factor**2``): softens attention that a run has made nearly one-hot, leaving the rest."""
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(factor)
            layer.self_attn.k_proj.weight.mul_(factor)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["supervised", "pg"], default="pg")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW's learning rate (the quickstart's)")
    p.add_argument("--epochs", type=int, default=2, help="passes over each batch (pg; the quickstart's ppo_epochs)")
    p.add_argument("--group", type=int, default=8, help="samples per state (pg; the quickstart's group_size)")
    p.add_argument("--p-right", type=float, default=1.0, help="reward 1 with this probability after the target (pg)")
    p.add_argument("--p-wrong", type=float, default=0.0, help="... and with this one after another object (pg)")
    p.add_argument("--states", type=int, default=16, help="states per update")
    p.add_argument("--train-tasks", type=int, default=6000, help="train-split tasks to draw states from")
    p.add_argument("--target", type=float, default=0.9, help="held-out accuracy to stop at")
    p.add_argument("--max-decisions", type=int, default=40_000)
    p.add_argument("--eval-every", type=int, default=10, help="updates between evaluations")
    p.add_argument("--seeds", default="0")
    p.add_argument("--template", help="a prompt template other than the quickstart's (prompts.TEMPLATES)")
    p.add_argument(
        "--tiny", default="{}", help="JSON overrides of the quickstart's tiny model, e.g. '{\"num_heads\": 8}'"
    )
    p.add_argument("--init", help="start from this quickstart checkpoint's policy (fit's .ckpt) instead of the init")
    p.add_argument("--scale-qk", type=float, default=1.0, help="scale the q/k projections first (scale_qk)")
    p.add_argument(
        "--attention", action="store_true", help="print attention_at_choice on 48 valid_seen states and stop"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    env = quickstart_env()
    if args.attention:
        model, tok, rollout = build_model(args, env, cfg)
        states = choice_states(env, tok, rollout, "valid_seen", range(env.num_tasks("valid_seen")))[:48]
        out = attention_at_choice(model, tok, states)
        print(f"held-out accuracy (argmax) {accuracy(model, tok.pad_token_id, states):.3f} on {len(states)} states")
        for name, rows in out.items():
            print(f"{name} (layer x head): " + "; ".join(" ".join(f"{v:.3f}" for v in row) for row in rows))
        norms = [
            (a.q_proj.weight.norm().item(), a.k_proj.weight.norm().item())
            for a in (x.self_attn for x in model.model.layers)
        ]
        print("q / k projection norms per layer: " + "; ".join(f"{q:.2f} / {k:.2f}" for q, k in norms))
        return
    reached = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        t0 = time.time()
        curve = learn(args, seed, env, cfg)
        hit = next((n for n, a in curve if a >= args.target), None)
        reached.append(hit)
        points = ", ".join(f"{n}: {a:.2f}" for n, a in curve)
        print(
            f"seed {seed} ({time.time() - t0:.0f} s): decisions -> held-out accuracy {points}; reached {args.target}: {hit}"
        )
    hits = [h for h in reached if h is not None]
    if hits:
        print(
            f"{args.mode}: decisions to {args.target}: median {statistics.median(hits)}, {len(hits)} of {len(reached)} seeds"
        )


if __name__ == "__main__":
    main()
