"""Constrained decoding: the admissible actions as a token trie, and the HF logits processor
that keeps every generated row on its trie (the vLLM backend's is ``vllm_trie.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import LogitsProcessor


class ActionTrie:
    """Prefix trie over token-id sequences.

    ``root`` is the trie as nested dicts keyed by token id. ``children`` / ``child_nodes`` are the
    same trie as tensors, nodes numbered breadth-first from the root (0): row ``n`` holds node
    ``n``'s child token ids (in insertion order) and their node numbers, padded with -1; a
    complete path (a leaf) has no children. ``max_len`` is the longest sequence's length: the
    token budget a constrained turn needs to finish every sequence.
    """

    def __init__(self, sequences: Sequence[Sequence[int]]):
        self.root: dict[int, dict] = {}
        self.max_len = max((len(seq) for seq in sequences), default=0)
        for seq in sequences:
            node = self.root
            for tok in seq:
                node = node.setdefault(int(tok), {})
        order, tokens, numbers = [self.root], [], []
        for node in order:  # breadth-first; `order` grows while it is walked
            tokens.append(list(node))
            numbers.append(list(range(len(order), len(order) + len(node))))
            order.extend(node.values())
        width = max(1, max(len(t) for t in tokens))
        self.children, self.child_nodes = (
            torch.from_numpy(
                np.array([r + [-1] * (width - len(r)) for r in rows], dtype=np.int64).reshape(len(rows), width)
            )
            for rows in (tokens, numbers)
        )


class TrieConstraint(LogitsProcessor):
    """Masks every token outside each row's trie, as tensor operations over the whole batch.

    A row whose trie path is complete (or that left the trie) may only emit ``pad_id``; the
    stopping criterion has already finished it, so those positions are never trained on.
    ``allowed_ids(lengths)`` returns the allowed ids each row had at each generated step.
    """

    def __init__(self, tries: list[ActionTrie], prompt_len: int, pad_id: int):
        self.prompt_len = prompt_len
        distinct = list({id(t): t for t in tries}.values())
        width = max(t.children.shape[1] for t in distinct)
        rows = 1 + sum(t.children.shape[0] for t in distinct)
        # One table for the batch: node 0 is the sink ("pad only", forever), then each trie's nodes.
        self.children = torch.full((rows, width), -1, dtype=torch.long)
        self.child_nodes = torch.full((rows, width), -1, dtype=torch.long)
        offsets, start = {}, 1
        for t in distinct:
            n, k = t.children.shape
            offsets[id(t)] = start
            self.children[start : start + n, :k] = t.children
            self.child_nodes[start : start + n, :k] = t.child_nodes.where(t.child_nodes < 0, t.child_nodes + start)
            start += n
        leaf = self.children[:, 0] < 0  # complete paths (and the sink): pad, then the sink
        self.children[leaf, 0] = pad_id
        self.child_nodes[leaf, 0] = 0
        self.node = torch.tensor([offsets[id(t)] for t in tries], dtype=torch.long)
        self.steps: list[torch.Tensor] = []  # [B, K] allowed ids per generated step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.children.device != scores.device:
            self.children, self.child_nodes, self.node = (
                x.to(scores.device) for x in (self.children, self.child_nodes, self.node)
            )
        if input_ids.shape[1] > self.prompt_len:  # follow the token sampled last
            last = input_ids[:, -1:]
            hit = self.children[self.node] == last
            nxt = self.child_nodes[self.node].gather(1, hit.long().argmax(1, keepdim=True)).squeeze(1)
            self.node = torch.where(hit.any(1), nxt, torch.zeros_like(nxt))
        allowed = self.children[self.node]
        self.steps.append(allowed)
        vocab = scores.shape[1]
        mask = torch.full((scores.shape[0], vocab + 1), float("-inf"), dtype=scores.dtype, device=scores.device)
        mask.scatter_(1, torch.where(allowed >= 0, allowed, vocab), 0.0)
        return scores + mask[:, :vocab]

    def allowed_ids(self, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Per row, ``[n, k]`` allowed ids of its first ``n = lengths[row]`` steps, padded with -1
        to the most ids any of its steps allowed."""
        table = torch.stack(self.steps, dim=1).cpu()  # [B, T, K]
        counts = (table >= 0).sum(-1)
        counts[torch.arange(table.shape[1]) >= lengths[:, None]] = 0
        widths = counts.amax(1).clamp(min=1).tolist()
        return [table[i, :n, :k].clone() for i, (n, k) in enumerate(zip(lengths.tolist(), widths))]
