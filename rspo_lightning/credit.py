"""Per-turn credit of an iteration's rows: the wiring between the config and the estimators.

``advantages.py`` holds the estimators as pure functions of flat tensors and imports no config;
this module reads ``AlgorithmConfig`` (the estimator's name and keywords, where the invalid-action
penalty goes), feeds a ``FlatTurns`` batch to the estimator with its declared inputs, puts the
stored advantages of replayed rows in place, and computes the advantages RSPOLoop stores with B's
groups (docs/design.md §3, "advantage").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from rspo_lightning.advantages import AdvantageResult, get_estimator
from rspo_lightning.batching import FlatTurns, flatten
from rspo_lightning.config import AlgorithmConfig
from rspo_lightning.types import Trajectory

# Estimators whose ``penalty_at: reward`` follows verl-agent exactly under step statistics.
VERL_PLACEMENT = ("grpo", "gigpo")


def _estimate(flat: FlatTurns, algo: AlgorithmConfig, values: Tensor | None) -> AdvantageResult:
    """The estimator over ``flat`` with its declared inputs and ``algo.estimator_kwargs``; with
    ``penalty_at="reward"`` the invalid-action penalty is taken off the invalid turns' rewards."""
    est = get_estimator(algo.estimator)
    if est.needs_critic and values is None:
        raise ValueError(f"estimator {algo.estimator!r} needs critic values V(s): pass values=[N]")
    supplied = {"anchors": flat.anchors, "success": flat.success, "values": values, "signals": flat.dense}
    rewards = flat.rewards
    extra = {}
    if algo.penalty_at == "reward":
        penalty = algo.invalid_action_penalty * flat.invalid.to(rewards.dtype)
        if algo.estimator in VERL_PLACEMENT and algo.estimator_kwargs.get("episode_stats") == "steps":
            extra["step_penalty"] = penalty  # verl-agent: off the step sample's own score, not off R(tau)
        else:
            rewards = rewards - penalty
    return est.fn(
        rewards=rewards,
        traj_index=flat.traj_index,
        group_index=flat.group_index,
        turn_index=flat.turn_index,
        **{k: supplied[k] for k in est.inputs},
        **algo.estimator_kwargs,
        **extra,
    )


def turn_advantages(
    flat: FlatTurns, algo: AlgorithmConfig, values: Tensor | None = None, credit: str = "trajectory", gamma: float = 0.9
) -> tuple[AdvantageResult, Tensor]:
    """Per-turn advantages of ``flat`` under ``algo`` (``values``: V(s) ``[N]``, for a critic).

    In order: (1) with ``algo.penalty_at="reward"``, ``algo.invalid_action_penalty`` is taken off
    each invalid turn's reward; (2) the estimator runs with its declared inputs (anchors,
    success, values, signals = ``flat.dense``) and ``algo.estimator_kwargs``; (3) replayed rows
    whose turn carries a ``replay_advantage`` take that stored value; (4) with
    ``penalty_at="advantage"`` (default) the penalty is taken off each invalid turn's advantage.

    Returns ``(result, estimator_advantages)``: ``result`` is the estimator's
    :class:`AdvantageResult` with the final advantages (returns and clip_scale as the estimator
    gave them), ``estimator_advantages`` the advantages after (3) but before (4), i.e. without an
    advantage-placed penalty (the module's ``rspo/replay_adv_abs``; equal to
    ``result.advantages`` under ``penalty_at="reward"``). It is returned rather than recovered
    by adding the penalty back, which would be wrong under ``penalty_at="reward"``.

    ``credit="turn"`` (RSPO's explorer) replaces (2) by ``turn_return_advantages`` with discount
    ``gamma`` (the estimator's ``norm`` when it has one).
    """
    if not flat.turns:  # a rank with nothing of its own
        return AdvantageResult(torch.zeros(0)), torch.zeros(0)
    if credit == "turn":  # the registered turn_return estimator, with the learner's norm and the given discount
        norm = algo.estimator_kwargs.get("norm", "std")
        algo = dataclasses.replace(algo, estimator="turn_return", estimator_kwargs={"gamma": gamma, "norm": norm})
    result = _estimate(flat, algo, values)
    advantages = result.advantages
    if bool(flat.is_replay.any()):
        stored = [t.replay_advantage for t in flat.turns]
        has = torch.tensor([a is not None for a in stored], dtype=torch.bool) & flat.is_replay.cpu()
        if bool(has.any()):
            value = torch.tensor([0.0 if a is None else a for a in stored], dtype=advantages.dtype)
            advantages = torch.where(has.to(advantages.device), value.to(advantages.device), advantages)
    estimator_advantages = advantages
    if algo.penalty_at == "advantage":
        advantages = advantages - algo.invalid_action_penalty * flat.invalid.to(advantages.device, advantages.dtype)
    return result._replace(advantages=advantages), estimator_advantages


def outcome_advantages(trajectories: Sequence[Trajectory], algo: AlgorithmConfig) -> list[float] | None:
    """Each turn's advantage (trajectory/turn order) under ``algo``'s estimator with the outcome
    reward, over the groups as given; None for a non-group-relative estimator or no turns.

    An advantage-placed invalid-action penalty is left out (the learner subtracts it when it
    trains the row); a reward-placed one is included, so the value is what the learner's
    estimator would give. RSPOLoop stores these with B's collected groups
    (``Turn.replay_advantage``); stored values are not applied here.
    """
    if not get_estimator(algo.estimator).group_relative or not trajectories:
        return None
    flat = flatten(list(trajectories), "outcome")
    if not flat.turns:
        return None
    return _estimate(flat, algo, None).advantages.tolist()
