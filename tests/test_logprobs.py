"""``logprobs``: the training forward reproduces the rollout's behaviour log-probs."""

import torch
from module_helpers import _module

from rspo_lightning import logprobs
from rspo_lightning.batching import flatten, make_train_batch
from rspo_lightning.types import TaskSpec


def test_scoring_forward_reproduces_behaviour_logprobs():
    m = _module()
    torch.manual_seed(0)
    trajs = m.engine.collect([TaskSpec("rspo/Household-v0", "train", i, i) for i in range(3)], 2)
    flat = flatten(trajs)
    batch = make_train_batch(flat, m.engine.pad_id, torch.zeros(len(flat.turns)))
    dummy = logprobs.dummy_batch(m.engine.pad_id)
    # chunks of 4 rows, of different response widths
    target = logprobs.chunked_logprobs(m.policy, batch, torch.arange(len(batch)), 1.0, 4, dummy)
    mask = batch.response_mask
    assert (target - batch.behaviour_logprobs).abs()[mask].max() < 1e-4
    assert (target[~mask] == 0).all()
