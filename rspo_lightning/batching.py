"""From trajectories to the flat per-turn tensors of the estimators and the padded TrainBatch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rspo_lightning import choices
from rspo_lightning.types import TrainBatch, Trajectory, Turn


@dataclass
class FlatTurns:
    """Per-turn tensors over a list of trajectories (turns of a trajectory contiguous, in order).

    Args:
        turns: the Turn objects, in the same order.
        rewards: ``[N]`` per-turn reward the estimator sees (``reward_mode``: outcome, dense, or
            outcome + dense; the dense part times ``dense_scale``).
        traj_index: ``[N]`` index of the trajectory in the input list.
        group_index: ``[N]`` dense index of the trajectory's group (by ``task.group_id``).
        turn_index: ``[N]`` position of the turn in its trajectory.
        success: ``[N]`` bool, the trajectory was won.
        invalid: ``[N]`` bool, the turn's action was invalid.
        is_replay: ``[N]`` bool, the trajectory came from a replay buffer.
        anchors: per-turn anchor strings.
        dense: ``[N]`` per-turn dense reward.
    """

    turns: list[Turn]
    rewards: torch.Tensor
    traj_index: torch.Tensor
    group_index: torch.Tensor
    turn_index: torch.Tensor
    success: torch.Tensor
    invalid: torch.Tensor
    is_replay: torch.Tensor
    anchors: list[str]
    dense: torch.Tensor


def turn_reward(outcome: float, dense: float, reward_mode: str, dense_scale: float = 1.0) -> float:
    """The reward a turn carries for the advantage under ``reward_mode``."""
    return (outcome if reward_mode != "dense" else 0.0) + (dense_scale * dense if reward_mode != "outcome" else 0.0)


def flatten(trajectories: Sequence[Trajectory], reward_mode: str = "outcome", dense_scale: float = 1.0) -> FlatTurns:
    """Flatten trajectories into per-turn tensors; ``reward_mode`` picks the reward each turn
    carries: ``outcome``, ``dense`` (``dense_scale`` x the dense reward alone) or ``outcome+dense``.
    Replayed trajectories carry the outcome reward alone, whatever the mode, and a dense reward of
    0: RSPO's reward swap, the one place it happens."""
    choices.check("reward_mode", reward_mode, choices.RewardMode)
    turns, rewards, traj_idx, group_idx, turn_idx, success, invalid, replay, anchors, dense = ([] for _ in range(10))
    group_ids: dict[tuple, int] = {}
    for i, traj in enumerate(trajectories):
        # Replay groups and on-policy groups never share an index, even with equal group_id, unless
        # a replayed trajectory joins the on-policy group of its task (RSPO's online baseline).
        key = ("on_policy" if traj.joins_online else traj.source, traj.task.group_id)
        g = group_ids.setdefault(key, len(group_ids))
        for t, turn in enumerate(traj.turns):
            turns.append(turn)
            replayed = traj.source == "replay"  # RSPO's reward swap, the one place it happens: outcome alone
            r = turn_reward(
                turn.outcome_reward,
                0.0 if replayed else turn.dense_reward,
                "outcome" if replayed else reward_mode,
                dense_scale,
            )
            rewards.append(r)
            traj_idx.append(i)
            group_idx.append(g)
            turn_idx.append(t)
            success.append(traj.success)
            invalid.append(not turn.valid)
            replay.append(traj.source == "replay")
            anchors.append(turn.anchor)
            dense.append(0.0 if replayed else turn.dense_reward)
    return FlatTurns(
        turns=turns,
        rewards=torch.tensor(rewards, dtype=torch.float32),
        traj_index=torch.tensor(traj_idx, dtype=torch.long),
        group_index=torch.tensor(group_idx, dtype=torch.long),
        turn_index=torch.tensor(turn_idx, dtype=torch.long),
        success=torch.tensor(success, dtype=torch.bool),
        invalid=torch.tensor(invalid, dtype=torch.bool),
        is_replay=torch.tensor(replay, dtype=torch.bool),
        anchors=anchors,
        dense=torch.tensor(dense, dtype=torch.float32),
    )


def left_pad(rows: Sequence[Sequence[int] | torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token-id rows into ``input_ids`` and ``attention_mask`` ``[n, width]``."""
    lengths = torch.tensor([len(r) for r in rows])
    width = int(lengths.max())
    if all(isinstance(r, torch.Tensor) for r in rows):
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r) :] = r
    else:  # id lists: one numpy conversion of the padded rows (5x faster than torch.tensor on lists)
        input_ids = torch.from_numpy(
            np.array([[pad_id] * (width - len(r)) + list(r) for r in rows], dtype=np.int64).reshape(len(rows), width)
        )
    attention = (torch.arange(width) >= width - lengths[:, None]).long()
    return input_ids, attention


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token (as ``generate`` uses)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def pad_turns(turns: Sequence[Turn], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad prompt+response so every response ends at the last column.

    Returns ``input_ids``/``attention_mask`` ``[N, L]`` and response-window tensors ``[N, T]``
    (T = longest response; column j is absolute position L - T + j): ``targets``,
    ``response_mask``, ``behaviour_logprobs``, ``allowed_ids`` ``[N, T, K]`` (or absent), and
    ``value_positions`` ``[N]`` (the last prompt token).
    """
    n = len(turns)
    input_ids, attention = left_pad([torch.cat([t.prompt_ids, t.response_ids]) for t in turns], pad_id)
    width = input_ids.shape[1]
    window = max(len(t.response_ids) for t in turns)
    response_mask = torch.zeros((n, window), dtype=torch.bool)
    behaviour = torch.zeros((n, window), dtype=torch.float32)
    value_positions = torch.zeros(n, dtype=torch.long)
    constrained = any(t.allowed_ids is not None for t in turns)
    k = max((t.allowed_ids.shape[1] for t in turns if t.allowed_ids is not None), default=1)
    allowed = torch.full((n, window, k), -1, dtype=torch.long) if constrained else None
    for i, t in enumerate(turns):
        r = len(t.response_ids)
        response_mask[i, window - r :] = True
        behaviour[i, window - r :] = t.behaviour_logprobs
        value_positions[i] = width - r - 1
        if allowed is not None and t.allowed_ids is not None:
            allowed[i, window - r :, : t.allowed_ids.shape[1]] = t.allowed_ids
    out = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "response_mask": response_mask,
        "behaviour_logprobs": behaviour,
        "value_positions": value_positions,
    }
    if allowed is not None:
        out["allowed_ids"] = allowed
    return out


def make_train_batch(flat: FlatTurns, pad_id: int, advantages: torch.Tensor | None = None) -> TrainBatch:
    """Assemble the TrainBatch; ``old_logprobs`` start as the behaviour log-probs (scoring gives
    the next stage's), advantages as given (zeros when None), returns zeros and clip scales ones
    until an estimator's result replaces them."""
    padded = pad_turns(flat.turns, pad_id)
    n = len(flat.turns)
    advantages = torch.zeros(n) if advantages is None else advantages
    return TrainBatch(
        input_ids=padded["input_ids"],
        attention_mask=padded["attention_mask"],
        response_mask=padded["response_mask"],
        behaviour_logprobs=padded["behaviour_logprobs"],
        old_logprobs=padded["behaviour_logprobs"].clone(),
        advantages=advantages.float(),
        returns=torch.zeros(n),
        clip_scale=torch.ones(n),
        is_replay=flat.is_replay,
        value_positions=padded["value_positions"],
        allowed_ids=padded.get("allowed_ids"),
    )


def drop_faulty(trajectories: list[Trajectory], group_relative: bool) -> list[Trajectory]:
    """Leave out episodes whose environment failed (``env_error``). For a group-relative estimator
    the group's baseline is computed over its remaining episodes, and a group left with fewer
    than 2 is dropped whole (no baseline)."""
    if not any(t.env_error is not None for t in trajectories):
        return trajectories
    clean = [t for t in trajectories if t.env_error is None]
    if not group_relative:
        return clean
    sizes: dict[int, int] = {}
    for t in clean:
        sizes[t.task.group_id] = sizes.get(t.task.group_id, 0) + 1
    return [t for t in clean if sizes[t.task.group_id] >= 2]
