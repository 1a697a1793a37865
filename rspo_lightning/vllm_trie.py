"""Constrained decoding inside vLLM by the same token trie the hf backend uses.

A per-request vLLM logits processor: each request names its allowed responses as token-id
sequences (``SamplingParams.extra_args["rspo_choices"]``); at every step only the children of
the trie node the sampled ids lead to keep their logits. vLLM's ``processed_logprobs`` are taken
after it, so the behaviour log-prob is the one renormalised over exactly the ids the training
forward renormalises over (``Turn.allowed_ids``). Imported by vLLM's engine (it names this
module's class), never by the rest of the package.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from rspo_lightning.trie import ActionTrie
from rspo_lightning.vllm_backend import CHOICES_KEY


class TrieLogitsProcessor(AdapterLogitsProcessor):
    """Keeps only the tokens that continue one of the request's allowed token sequences."""

    def __init__(self, vllm_config, device, is_pin_memory):
        super().__init__(vllm_config, device, is_pin_memory)
        self._tries: dict[tuple, dict] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is the most likely: applied under greedy decoding too

    def new_req_logits_processor(self, params):
        choices = (params.extra_args or {}).get(CHOICES_KEY)
        if not choices:
            return None
        key = tuple(tuple(c) for c in choices)
        root = self._tries.get(key)
        if root is None:
            if len(self._tries) > 20000:
                self._tries.clear()
            root = self._tries[key] = ActionTrie(choices).root

        def constrain(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            node = root
            for tok in output_ids:
                node = node.get(tok)
                if node is None:
                    return logits
            if not node:  # a complete path: the stop token has ended the request already
                return logits
            keep = torch.tensor(list(node), device=logits.device)
            masked = torch.full_like(logits, float("-inf"))
            masked[keep] = logits[keep]
            return masked

        return constrain
