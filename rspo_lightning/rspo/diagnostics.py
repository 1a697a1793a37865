"""What the replayed rows of an RSPO iteration carry, and the α of its J (docs/algorithms.md):
pure functions of the iteration's ``TrainBatch``; the module logs them as ``rspo/*``."""

from __future__ import annotations

import math

import torch

from rspo_lightning.distributed import all_sum
from rspo_lightning.types import ReplayWeight, TrainBatch
from rspo_lightning.update import Denominators, loss_sizes


def iteration_alpha(
    weight: ReplayWeight, batch: TrainBatch, loss_agg: str, device: torch.device | str = "cpu"
) -> float | None:
    """The α of this iteration's J (None: one pooled mean, the ``tokens`` rule). The ``alpha``
    rule's α as given; the ``signal`` rule (RSPO's ``offline_weighting: signal``) is the replayed rows' share of the iteration's signal-carrying
    size: S_off / (S_on + S_off), S = the tokens (``token-mean``, else rows) of the rows with a
    non-zero advantage, summed over ranks (``batch``: every row of the iteration, before the
    drop). α so follows where the learning signal is: high while A's own groups rarely carry
    any (hard tasks, all-failure groups), falling as they do. An iteration without signal: 0."""
    if weight.rule != "signal":
        return weight.alpha if weight.rule == "alpha" else None
    signal = batch.select(torch.nonzero(batch.advantages != 0).flatten())
    s_on, s_off = all_sum(list(loss_sizes(signal, loss_agg)), device)
    return s_off / (s_on + s_off) if s_on + s_off > 0 else 0.0


def replay_diagnostics(
    batch: TrainBatch, den: Denominators, replay_weight: float | None, loss_agg: str
) -> dict[str, float]:
    """What the replayed rows of the rows actually trained (``batch``, after the drop) carry (this
    rank): ``rspo/replay_token_share`` (their share of the trained response tokens),
    ``rspo/replay_loss_share`` (their share of the policy loss's advantage mass Σ w |A| over the
    trained tokens, w = ``Denominators.unit_weights``: the share of the gradient at ratio 1) and
    ``rspo/replay_win_share`` (replayed rows with positive advantage / replayed rows). Empty
    without replayed rows."""
    rep = batch.is_replay
    if not bool(rep.any()):
        return {}
    tokens = batch.response_mask.sum(-1).float()
    size = tokens if loss_agg == "token-mean" else torch.ones_like(tokens)
    u_on, u_off = den.unit_weights(replay_weight, den.rows)  # the step scale cancels in a share
    mass = torch.where(rep, u_off, u_on) * batch.advantages.abs() * size
    return {
        "rspo/replay_token_share": float(tokens[rep].sum() / tokens.sum()),
        "rspo/replay_loss_share": float(mass[rep].sum() / mass.sum()) if float(mass.sum()) > 0 else 0.0,
        "rspo/replay_win_share": float((batch.advantages[rep] > 0).float().mean()),
    }


def replay_distance(batch: TrainBatch) -> dict[str, float]:
    """How far the policy that played the replayed rows of ``batch`` (the rows trained, scored:
    ``old_logprobs`` are A's, at the start of the iteration) is from A, over their response
    tokens (this rank): ``rspo/replay_log_ratio``, the mean of log π_behaviour − log π_A (on the
    behaviour policy's own samples, the k1 estimate of KL(behaviour ‖ A), restricted to the
    tokens trained), and ``rspo/replay_ratio_out``, the share of those tokens whose ratio
    π_A / π_behaviour lies outside [0.8, 1.25]. Empty without replayed tokens."""
    log_ratio = (batch.behaviour_logprobs - batch.old_logprobs)[batch.response_mask & batch.is_replay[:, None]]
    if not log_ratio.numel():
        return {}
    return {
        "rspo/replay_log_ratio": float(log_ratio.mean()),
        "rspo/replay_ratio_out": float((log_ratio.abs() > math.log(1.25)).float().mean()),
    }
