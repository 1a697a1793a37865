"""Advantage estimators: pure functions from flat per-turn tensors to per-turn advantages.

Every estimator shares one signature::

    xxx_advantages(rewards [N], traj_index [N], group_index [N], turn_index [N], *, ...) -> AdvantageResult

One row is one agent turn. The turns of a trajectory are contiguous and in order; a trajectory
is identified by its ``(group_index, traj_index)`` pair, so ``traj_index`` may be global or
restart at 0 in every group. ``turn_index`` counts from 0 inside each trajectory. ``rewards``
are per-turn rewards r_t (an outcome reward sits on the last turn; dense rewards on any turn);
R(tau) is the sum of a trajectory's r_t and R_t = sum_{k>=t} gamma^{k-t} r_k.

F is the normaliser of a group-relative advantage: ``norm="std"`` divides by the unbiased std
+ 1e-6, ``norm="mean"`` by 1. A group with fewer than two members, or whose members are all
equal, gives exactly 0 (never NaN).

Everything is computed in float64 on the CPU (N counts turns, not tokens, so this is cheap and
exact); results come back on ``rewards``' device in its floating dtype (the default dtype for
integer rewards). The paper -> code map and every deviation: docs/algorithms.md.

``ESTIMATORS`` maps each name to an :class:`Estimator`, its declared contract (extra per-turn
inputs, group-relative, critic, dense signal). This module imports no config: the wiring that
reads ``AlgorithmConfig`` and a ``FlatTurns`` batch is ``rspo_lightning.credit``.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rspo_lightning import choices

STD_EPS = 1e-6


class AdvantageResult(NamedTuple):
    """What every estimator returns.

    Args:
        advantages: ``[N]`` per-turn advantage.
        returns: ``[N]`` or None: the critic's regression target (advantages + values; gae only).
        clip_scale: ``[N]`` or None: per-turn multiplier of ``algorithm.clip_eps_low/high``
            (1.0 = as configured; a2tgpo only).
    """

    advantages: Tensor
    returns: Tensor | None = None
    clip_scale: Tensor | None = None


# ----------------------------------------------------------------------------------------------
# Layout and validation
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    rewards: Tensor  # [N] float64, CPU
    traj: Tensor  # [N] dense trajectory id, 0..T-1 in order of appearance
    group: Tensor  # [N] dense group id, 0..G-1
    turn: Tensor  # [N] int64 turn index
    traj_group: Tensor  # [T] dense group id of each trajectory
    num_traj: int
    num_groups: int
    device: torch.device
    dtype: torch.dtype

    def out(self, x: Tensor) -> Tensor:
        return x.to(device=self.device, dtype=self.dtype)

    def episode_returns(self) -> Tensor:
        """``[T]`` R(tau) of each trajectory."""
        return _scatter_sum(self.rewards, self.traj, self.num_traj)


def _as_1d(value: Any, name: str) -> Tensor:
    t = torch.as_tensor(value)
    if t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D per-turn tensor [N], got shape {tuple(t.shape)}")
    return t.detach().cpu()


def _check_length(name: str, value: Any, n: int) -> None:
    length = len(value)
    if length != n:
        raise ValueError(f"{name} must have one entry per turn (N={n}), got length {length}")


def _layout(rewards: Any, traj_index: Any, group_index: Any, turn_index: Any) -> _Layout:
    r = _as_1d(rewards, "rewards")
    n = r.shape[0]
    traj_t = _as_1d(traj_index, "traj_index")
    group_t = _as_1d(group_index, "group_index")
    turn_t = _as_1d(turn_index, "turn_index")
    for name, t in (("traj_index", traj_t), ("group_index", group_t), ("turn_index", turn_t)):
        _check_length(name, t, n)
        if t.is_floating_point() or t.is_complex():
            raise ValueError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    if not torch.isfinite(r.double()).all():
        raise ValueError("rewards must be finite, got NaN or inf")

    dtype = rewards.dtype if isinstance(rewards, Tensor) and rewards.is_floating_point() else None
    device = rewards.device if isinstance(rewards, Tensor) else torch.device("cpu")

    keys = list(zip(group_t.tolist(), traj_t.tolist()))
    turns = turn_t.tolist()
    traj_ids: list[int] = []
    seen: set[tuple[int, int]] = set()
    for i, key in enumerate(keys):
        if i > 0 and key == keys[i - 1]:
            if turns[i] <= turns[i - 1]:
                raise ValueError(
                    f"turn_index must increase inside a trajectory, got {turns[i - 1]} then "
                    f"{turns[i]} at rows {i - 1}, {i} (group {key[0]}, trajectory {key[1]})"
                )
            traj_ids.append(traj_ids[-1])
            continue
        if key in seen:
            raise ValueError(
                f"traj_index: the turns of trajectory {key[1]} in group {key[0]} are not "
                f"contiguous (it reappears at row {i}); sort the rows by trajectory"
            )
        seen.add(key)
        traj_ids.append(len(seen) - 1)

    _, group_dense = torch.unique(group_t, return_inverse=True)
    traj = torch.tensor(traj_ids, dtype=torch.long)
    num_traj = len(seen)
    traj_group = torch.zeros(num_traj, dtype=torch.long)
    traj_group[traj] = group_dense.long()
    return _Layout(
        rewards=r.double(),
        traj=traj,
        group=group_dense.long(),
        turn=turn_t.long(),
        traj_group=traj_group,
        num_traj=num_traj,
        num_groups=int(group_dense.max()) + 1 if n else 0,
        device=device,
        dtype=dtype or torch.get_default_dtype(),
    )


def _dense_ids(keys: Sequence[Hashable]) -> tuple[Tensor, int]:
    """Dense integer ids for hashable keys, in order of first appearance."""
    table: dict[Hashable, int] = {}
    ids = [table.setdefault(k, len(table)) for k in keys]
    return torch.tensor(ids, dtype=torch.long), len(table)


# ----------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------


def _scatter_sum(values: Tensor, ids: Tensor, size: int) -> Tensor:
    """``[size]`` sums of ``values`` by integer id."""
    return torch.zeros(size, dtype=values.dtype).index_add_(0, ids, values)


def _group_centre(values: Tensor, groups: Tensor, num_groups: int, norm: str) -> Tensor:
    """(x - mean_group) / F per element; 0 for groups of size < 2 or with all-equal values."""
    count = _scatter_sum(torch.ones_like(values), groups, num_groups)
    total = _scatter_sum(values, groups, num_groups)
    dev = values - (total / count.clamp(min=1))[groups]
    if norm == "std":
        sq = _scatter_sum(dev**2, groups, num_groups)
        std = (sq / (count - 1).clamp(min=1)).sqrt()
        dev = dev / (std[groups] + STD_EPS)
    vmax = torch.zeros(num_groups, dtype=values.dtype).scatter_reduce(0, groups, values, "amax", include_self=False)
    vmin = torch.zeros(num_groups, dtype=values.dtype).scatter_reduce(0, groups, values, "amin", include_self=False)
    degenerate = (count < 2) | (vmax == vmin)
    return torch.where(degenerate[groups], torch.zeros_like(dev), dev)


def _reverse_scan(x: Tensor, segments: Sequence[Hashable], coef: float) -> Tensor:
    """y_t = x_t + coef * y_{t+1} while row t+1 is in the same (contiguous) segment."""
    xs = x.tolist()
    out = [0.0] * len(xs)
    running = 0.0
    for i in range(len(xs) - 1, -1, -1):
        if i == len(xs) - 1 or segments[i + 1] != segments[i]:
            running = 0.0
        running = xs[i] + coef * running
        out[i] = running
    return torch.tensor(out, dtype=torch.float64)


def _check_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def _episode_advantage(lay: _Layout, norm: str, episode_stats: str, step_penalty: Tensor | None = None) -> Tensor:
    """``[N]`` GRPO-style episode advantage, stats over trajectories or over step samples. With
    ``step_penalty`` (step statistics only) each step sample's score is its trajectory's return
    less its own penalty (verl-agent's invalid-action placement)."""
    returns = lay.episode_returns()
    if episode_stats == "trajectory":
        return _group_centre(returns, lay.traj_group, lay.num_groups, norm)[lay.traj]
    scores = returns[lay.traj] if step_penalty is None else returns[lay.traj] - step_penalty
    return _group_centre(scores, lay.group, lay.num_groups, norm)


def _step_penalty(step_penalty: Any, n: int, episode_stats: str) -> Tensor | None:
    if step_penalty is None:
        return None
    if episode_stats != "steps":
        raise ValueError(
            "step_penalty (verl-agent's invalid-action placement) needs episode_stats='steps': each step "
            "sample's own score is lowered, which trajectory statistics cannot express"
        )
    pen = _as_1d(step_penalty, "step_penalty").double()
    _check_length("step_penalty", pen, n)
    return pen


def _check_anchors(anchors: Sequence[str], n: int) -> list[str]:
    if isinstance(anchors, str):
        raise ValueError("anchors must be a sequence of N strings, got a single string")
    _check_length("anchors", anchors, n)
    return [str(a) for a in anchors]


# ----------------------------------------------------------------------------------------------
# Estimators
# ----------------------------------------------------------------------------------------------


def grpo_advantages(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    turn_index: Tensor,
    *,
    norm: str = "std",
    episode_stats: str = "trajectory",
    step_penalty: Tensor | None = None,
) -> AdvantageResult:
    """GRPO (Shao et al., arXiv 2402.03300), outcome supervision, one advantage per trajectory.

    A(tau_i) = (R(tau_i) - mean_j R(tau_j)) / F over the group's trajectories, broadcast to every
    turn (``episode_stats="trajectory"``, the paper). ``episode_stats="steps"`` takes mean and std
    over all turn samples of the group instead, each carrying its trajectory's return, so longer
    trajectories weigh more (verl-agent's trainer, ``compute_mean_std_cross_steps=True``).
    ``norm="mean"`` (F = 1) is the Dr. GRPO variant. Deviation: a group with one trajectory or
    all-equal returns gives exactly 0 (under either ``episode_stats``) rather than relying on the
    1e-6. ``step_penalty`` ``[N]`` (with ``episode_stats="steps"``): taken off each step sample's
    own score, R(tau) - p_t, never off the scores of the trajectory's other turns (verl-agent's
    placement of the invalid-action penalty: ``algorithm.penalty_at: reward``).
    """
    choices.check("norm", norm, choices.Norm)
    choices.check("episode_stats", episode_stats, choices.EpisodeStats)
    lay = _layout(rewards, traj_index, group_index, turn_index)
    pen = _step_penalty(step_penalty, lay.rewards.shape[0], episode_stats)
    return AdvantageResult(lay.out(_episode_advantage(lay, norm, episode_stats, pen)))


def rloo_advantages(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    turn_index: Tensor,
    *,
    episode_stats: str = "trajectory",
) -> AdvantageResult:
    """RLOO (Ahmadian et al., arXiv 2402.14740): leave-one-out baseline, no std normalisation.

    ``episode_stats="trajectory"`` (the paper): A(tau_i) = R(tau_i) - mean_{j != i} R(tau_j),
    broadcast to every turn; a group of one trajectory gives 0. No deviation.
    ``episode_stats="steps"`` (verl-agent-style step statistics, not the paper): the leave-one-out
    runs over the group's turn samples, each carrying its trajectory's return: A_s = R_s -
    (sum over the group's samples of R - R_s) / (count - 1), so longer trajectories weigh more in
    the baseline. A group with one sample, or whose samples all carry the same return (e.g. one
    trajectory), gives exactly 0.
    """
    choices.check("episode_stats", episode_stats, choices.EpisodeStats)
    lay = _layout(rewards, traj_index, group_index, turn_index)
    returns = lay.episode_returns()
    if episode_stats == "trajectory":
        values, groups = returns, lay.traj_group
    else:
        values, groups = returns[lay.traj], lay.group
    count = _scatter_sum(torch.ones_like(values), groups, lay.num_groups)
    total = _scatter_sum(values, groups, lay.num_groups)
    k = count[groups]
    others = (total[groups] - values) / (k - 1).clamp(min=1)
    adv = torch.where(k > 1, values - others, torch.zeros_like(values))
    if episode_stats == "trajectory":
        return AdvantageResult(lay.out(adv[lay.traj]))
    # one trajectory's samples share R, but (total - R) / (k - 1) may round off it by ~1e-17
    vmax = torch.zeros(lay.num_groups, dtype=values.dtype).scatter_reduce(0, groups, values, "amax", include_self=False)
    vmin = torch.zeros(lay.num_groups, dtype=values.dtype).scatter_reduce(0, groups, values, "amin", include_self=False)
    return AdvantageResult(lay.out(torch.where((vmax == vmin)[groups], torch.zeros_like(adv), adv)))


def gae_advantages(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    turn_index: Tensor,
    *,
    values: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> AdvantageResult:
    """GAE (Schulman et al., arXiv 1506.02438) on the turn-level MDP, for PPO with a critic.

    V(s_t) is the critic's value of turn t (read at the last prompt token); V after the last turn
    is 0; delta_t = r_t + gamma V(s_{t+1}) - V(s_t); A_t = sum_l (gamma lam)^l delta_{t+l};
    returns = A + V. Deviation: a truncated episode is treated as terminal (no bootstrap), the
    common choice for LLM agents. ``group_index`` is unused (kept for the shared signature).
    """
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)
    lay = _layout(rewards, traj_index, group_index, turn_index)
    v = _as_1d(values, "values")
    _check_length("values", v, lay.rewards.shape[0])
    v = v.double()
    same_next = torch.zeros_like(lay.traj, dtype=torch.bool)
    same_next[:-1] = lay.traj[1:] == lay.traj[:-1]
    v_next = torch.zeros_like(v)
    v_next[:-1] = v[1:]
    v_next = torch.where(same_next, v_next, torch.zeros_like(v))
    delta = lay.rewards + gamma * v_next - v
    adv = _reverse_scan(delta, lay.traj.tolist(), gamma * lam)
    return AdvantageResult(lay.out(adv), returns=lay.out(adv + v))


def gigpo_advantages(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    turn_index: Tensor,
    *,
    anchors: Sequence[str],
    gamma: float = 0.95,
    omega: float = 1.0,
    norm: str = "std",
    episode_stats: str = "trajectory",
    step_penalty: Tensor | None = None,
) -> AdvantageResult:
    """GiGPO (Feng et al., arXiv 2505.10978): episode + anchor-state step advantages.

    A = A^E + omega * A^S. A^E is GRPO's advantage: ``episode_stats="trajectory"`` takes mean/std
    over the group's trajectory returns (the paper); ``"steps"`` over all step samples of the
    group, each carrying its trajectory's return (the released verl-agent code's default). Step
    groups are the turns of one group with an equal anchor (never pooled across groups);
    A^S_t = (R_t - mean over the step group) / F with R_t the gamma-discounted return-to-go.
    Deviation: a singleton step group (and a singleton episode group) gives 0; the released code
    gives A^E = R(tau) for a group of one trajectory. ``step_penalty`` ``[N]`` (with
    ``episode_stats="steps"``, verl-agent's placement, ``apply_invalid_action_penalty`` after
    ``compute_step_discounted_returns``): off the step sample's own episode score (as in
    ``grpo_advantages``) and off that step's already-discounted return-to-go, nothing else (it
    does not reach the earlier turns through γ).
    """
    choices.check("norm", norm, choices.Norm)
    choices.check("episode_stats", episode_stats, choices.EpisodeStats)
    _check_unit_interval("gamma", gamma)
    lay = _layout(rewards, traj_index, group_index, turn_index)
    names = _check_anchors(anchors, lay.rewards.shape[0])
    pen = _step_penalty(step_penalty, lay.rewards.shape[0], episode_stats)
    episode = _episode_advantage(lay, norm, episode_stats, pen)
    step_ids, num_steps = _dense_ids(list(zip(lay.group.tolist(), names)))
    returns_to_go = _reverse_scan(lay.rewards, lay.traj.tolist(), gamma)
    if pen is not None:  # verl-agent: after discounting, off the invalid step's own return only
        returns_to_go = returns_to_go - pen
    step = _group_centre(returns_to_go, step_ids, num_steps, norm)
    return AdvantageResult(lay.out(episode + omega * step))


def turn_return_advantages(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    turn_index: Tensor,
    gamma: float = 0.9,
    norm: str = "std",
) -> AdvantageResult:
    """Per-turn credit of a dense reward (RSPO's ``explorer_credit: turn``): each turn's discounted
    return-to-go G_t = Σ_{t' >= t} γ^{t'−t} r_{t'} inside its trajectory, centred on the mean over
    every turn of its group and divided by their std (``norm="std"``; ``"mean"``: centred only). Progress deltas then do
    not telescope: a turn that reaches a new subgoal scores above the turns that follow it. A
    group whose G are all equal gives 0."""
    _check_unit_interval("gamma", gamma)
    choices.check("norm", norm, choices.Norm)
    lay = _layout(rewards, traj_index, group_index, turn_index)
    returns = _reverse_scan(lay.rewards, lay.traj.tolist(), gamma)
    return AdvantageResult(lay.out(_group_centre(returns, lay.group, lay.num_groups, norm)))


def success_rate_weights(p: float, *, alpha: float = 4.0, target_range: float = 0.05) -> tuple[float, float]:
    """ProxMO's success-rate-aware episode weights ``(w_plus, w_minus)`` for success rate ``p``.

    w+ = 1 + beta (sigmoid((1-p)^alpha) - 1/2) multiplies successful trajectories' A^E and
    w- = 1 + beta (sigmoid(-p^alpha) - 1/2) failed ones'. Over p in [0, 1] the largest |w - 1| is
    beta (sigmoid(1) - 1/2) (at p = 0 for w+, p = 1 for w-), so beta = target_range /
    (sigmoid(1) - 1/2) makes the weights span exactly [1 - target_range, 1 + target_range].
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"success rate p must be in [0, 1], got {p}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if target_range < 0:
        raise ValueError(f"target_range must be >= 0, got {target_range}")

    def sigmoid(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x))

    beta = target_range / (sigmoid(1.0) - 0.5)
    w_plus = 1.0 + beta * (sigmoid((1.0 - p) ** alpha) - 0.5)
    w_minus = 1.0 + beta * (sigmoid(-(p**alpha)) - 0.5)
    return w_plus, w_minus


def tfidf_cosine_similarity(docs: Sequence[str]) -> Tensor:
    """``[n, n]`` float64 cosine similarity of TF-IDF vectors of ``docs`` (fit on ``docs`` only).

    Whitespace tokens, raw term counts, smoothed idf = log((1 + n) / (1 + df)) + 1 (scikit-learn's
    default formula), rows L2-normalised. Identical strings get similarity exactly 1 (this also
    covers empty strings, whose TF-IDF vector is zero).
    """
    tokens = [d.split() for d in docs]
    vocab = {tok: j for j, tok in enumerate(sorted({t for doc in tokens for t in doc}))}
    n = len(docs)
    tf = torch.zeros(n, len(vocab), dtype=torch.float64)
    for i, doc in enumerate(tokens):
        for tok in doc:
            tf[i, vocab[tok]] += 1.0
    df = (tf > 0).sum(dim=0).double()
    x = tf * (torch.log((1.0 + n) / (1.0 + df)) + 1.0)
    x = x / x.norm(dim=1, keepdim=True).clamp(min=1e-12)
    sim = x @ x.T
    ids, _ = _dense_ids(list(docs))
    return torch.where(ids[:, None] == ids[None, :], torch.ones_like(sim), sim)


def proxmo_advantages(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    turn_index: Tensor,
    *,
    anchors: Sequence[str],
    success: Tensor,
    alpha: float = 4.0,
    target_range: float = 0.05,
    tau: float = 0.1,
    gamma: float = 0.95,
    omega: float = 1.0,
    norm: str = "std",
    episode_stats: str = "trajectory",
) -> AdvantageResult:
    """ProxMO (Fang et al., arXiv 2602.19225): GiGPO with modulated A^E and a soft step baseline.

    A = w * A^E + omega * A^S. A^E is GiGPO's episode advantage; w = w+ for successful and w- for
    failed trajectories, from the group's success rate p (see :func:`success_rate_weights`).
    A^S_i = R_i - sum_j W_ij R_j with W = softmax(S / tau) row-wise over the group's step samples
    (self included) and S the TF-IDF cosine similarity of their anchors; R_i is the discounted
    return-to-go. Choices where the paper or code differ (docs/algorithms.md): p from success
    flags (the code uses the group's mean reward); a trajectory succeeded if any of its turns is
    flagged; TF-IDF fit per group on whitespace tokens (the code fits scikit-learn on the whole
    batch with its regex tokenizer); A^S is not divided by a std; alpha=4, target_range=0.05
    (the code's psc_alpha=5, psc_beta=0.866).
    """
    choices.check("norm", norm, choices.Norm)
    choices.check("episode_stats", episode_stats, choices.EpisodeStats)
    _check_unit_interval("gamma", gamma)
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    lay = _layout(rewards, traj_index, group_index, turn_index)
    n = lay.rewards.shape[0]
    names = _check_anchors(anchors, n)
    ok = _as_1d(success, "success")
    _check_length("success", ok, n)

    traj_success = torch.zeros(lay.num_traj, dtype=torch.float64).scatter_reduce(
        0, lay.traj, ok.double().clamp(0, 1), "amax", include_self=False
    )
    count = _scatter_sum(torch.ones_like(traj_success), lay.traj_group, lay.num_groups)
    wins = _scatter_sum(traj_success, lay.traj_group, lay.num_groups)
    rate = (wins / count.clamp(min=1)).tolist()
    weights = [success_rate_weights(p, alpha=alpha, target_range=target_range) for p in rate]
    w_plus = torch.tensor([w[0] for w in weights], dtype=torch.float64)
    w_minus = torch.tensor([w[1] for w in weights], dtype=torch.float64)
    traj_w = torch.where(traj_success > 0, w_plus[lay.traj_group], w_minus[lay.traj_group])
    episode = traj_w[lay.traj] * _episode_advantage(lay, norm, episode_stats)

    returns_to_go = _reverse_scan(lay.rewards, lay.traj.tolist(), gamma)
    step = torch.zeros(n, dtype=torch.float64)
    for g in range(lay.num_groups):
        rows = (lay.group == g).nonzero().squeeze(1)
        sim = tfidf_cosine_similarity([names[i] for i in rows.tolist()])
        w = torch.softmax(sim / tau, dim=1)
        step[rows] = returns_to_go[rows] - w @ returns_to_go[rows]
    return AdvantageResult(lay.out(episode + omega * step))


def a2tgpo_advantages(
    rewards: Tensor,
    traj_index: Tensor,
    group_index: Tensor,
    turn_index: Tensor,
    *,
    signals: Tensor,
    gamma: float = 1.0,
    adaptive_clip: str = "signal",
    kappa: float = 0.5,
    delta: float = 0.5,
    beta: float = 1.0,
    turn_group_size: int | None = None,
    norm: str = "std",
) -> AdvantageResult:
    """A²TGPO (Chen et al., arXiv 2605.06200): turn-group-normalised signals, adaptive clipping.

    ghat_t = per-turn signal z-scored within its (group, turn index) cell (0 for a single element
    or zero std). A_t = A^E + sum_{k>=t} gamma^{k-t} ghat_k / sqrt(number of terms), A^E as GRPO
    (``norm`` applies to A^E only). ``turn_group_size=m`` stops the sum at the boundaries of
    turn blocks [0..m-1], [m..2m-1], ... ``clip_scale`` is the per-turn multiplier of the
    configured clip half-widths (``algorithm.clip_eps_low/high``, the paper's epsilon), by
    ``adaptive_clip``: ``"signal"`` (paper) clamp(1 + kappa ghat_t, 1 - delta, 1 + delta); ``"inverse_advantage"``
    (the seed's description) 1 / (1 + beta |A_t|). Deviation: the paper's signal is information
    gain; here it is whatever per-turn signal the caller passes (the turn's dense reward in this
    package). (``adaptive_clip``'s old config key ``clip_mode`` is renamed by ``AlgorithmConfig``.)
    """
    choices.check("norm", norm, choices.Norm)
    choices.check("adaptive_clip", adaptive_clip, choices.AdaptiveClip)
    _check_unit_interval("gamma", gamma)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1) so clip_scale stays positive, got {delta}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if turn_group_size is not None and (
        not isinstance(turn_group_size, int) or isinstance(turn_group_size, bool) or turn_group_size < 1
    ):
        raise ValueError(f"turn_group_size must be a positive integer or None, got {turn_group_size!r}")
    lay = _layout(rewards, traj_index, group_index, turn_index)
    n = lay.rewards.shape[0]
    g = _as_1d(signals, "signals")
    _check_length("signals", g, n)
    g = g.double()
    if not torch.isfinite(g).all():
        raise ValueError("signals must be finite, got NaN or inf")

    episode = _episode_advantage(lay, norm, "trajectory")
    cells, num_cells = _dense_ids(list(zip(lay.group.tolist(), lay.turn.tolist())))
    ghat = _group_centre(g, cells, num_cells, "std")
    if turn_group_size is None:
        segments: list[Hashable] = lay.traj.tolist()
    else:
        segments = list(zip(lay.traj.tolist(), (lay.turn // turn_group_size).tolist()))
    acc = _reverse_scan(ghat, segments, gamma)
    terms = _reverse_scan(torch.ones(n, dtype=torch.float64), segments, 1.0)
    adv = episode + acc / terms.sqrt()
    if adaptive_clip == "signal":
        clip_scale = (1.0 + kappa * ghat).clamp(1.0 - delta, 1.0 + delta)
    else:
        clip_scale = 1.0 / (1.0 + beta * adv.abs())
    return AdvantageResult(lay.out(adv), clip_scale=lay.out(clip_scale))


# ----------------------------------------------------------------------------------------------
# Registry: each estimator's declared contract
# ----------------------------------------------------------------------------------------------

#: Old keyword -> new keyword of an estimator; ``AlgorithmConfig`` renames the old one (a FutureWarning;
#: silently in a config unpickled from an old checkpoint).
RENAMED_KWARGS = {"clip_mode": "adaptive_clip"}  # A²TGPO's: algorithm.clip_mode is another thing
#: Per-turn inputs an estimator may declare, beyond rewards and the three indices.
INPUTS = ("anchors", "success", "values", "signals")
#: Arguments the caller supplies (step_penalty only to the estimators that take it), never a config knob.
LAYOUT_ARGS = ("rewards", "traj_index", "group_index", "turn_index", "step_penalty")


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator and what it needs.

    Args:
        fn: the estimator function (returns :class:`AdvantageResult`).
        inputs: extra per-turn inputs beyond rewards and the indices, named as ``fn``'s keywords
            (a subset of :data:`INPUTS`).
        group_relative: the baseline comes from the other episodes of the group (needs
            ``group_size >= 2``; a group of one gives 0).
        needs_critic: needs V(s) values (``values``).
        needs_dense: needs a per-turn dense signal (``signals``).
    """

    fn: Callable[..., AdvantageResult]
    inputs: tuple[str, ...]
    group_relative: bool
    needs_critic: bool
    needs_dense: bool

    def __post_init__(self) -> None:
        params = inspect.signature(self.fn).parameters
        for name in self.inputs:
            if name not in INPUTS or name not in params:
                raise ValueError(
                    f"{self.fn.__name__}: input {name!r} must be one of {list(INPUTS)} and a keyword of the function"
                )

    @property
    def tunables(self) -> list[str]:
        """Sorted keyword names of ``fn`` a config may set (``algorithm.estimator_kwargs``)."""
        params = inspect.signature(self.fn).parameters
        return sorted(p for p in params if p not in LAYOUT_ARGS and p not in self.inputs and p not in RENAMED_KWARGS)


ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator(grpo_advantages, (), group_relative=True, needs_critic=False, needs_dense=False),
    "rloo": Estimator(rloo_advantages, (), group_relative=True, needs_critic=False, needs_dense=False),
    "gae": Estimator(gae_advantages, ("values",), group_relative=False, needs_critic=True, needs_dense=False),
    "gigpo": Estimator(gigpo_advantages, ("anchors",), group_relative=True, needs_critic=False, needs_dense=False),
    "proxmo": Estimator(
        proxmo_advantages, ("anchors", "success"), group_relative=True, needs_critic=False, needs_dense=False
    ),
    "a2tgpo": Estimator(a2tgpo_advantages, ("signals",), group_relative=True, needs_critic=False, needs_dense=True),
    # each turn's discounted return-to-go normalised over its group (RSPO's explorer credit: turn)
    "turn_return": Estimator(turn_return_advantages, (), group_relative=True, needs_critic=False, needs_dense=False),
}
if set(ESTIMATORS) != set(choices.values(choices.Estimator)):  # the config's type lists exactly these
    raise ImportError(
        f"choices.Estimator {choices.values(choices.Estimator)} differs from ESTIMATORS {sorted(ESTIMATORS)}"
    )
#: Estimators whose baseline comes from the group's other episodes.
GROUP_RELATIVE = frozenset(name for name, est in ESTIMATORS.items() if est.group_relative)


def get_estimator(name: str) -> Estimator:
    """The registry entry called ``name``; ValueError listing the valid names otherwise."""
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; valid estimators: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def check_estimator_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
    """Raise ValueError unless every key of ``kwargs`` is a tunable keyword of estimator ``name``.

    A key the module supplies itself (rewards, the indices, the estimator's declared inputs) is
    rejected too. The message names the key, the closest accepted name and every accepted name.
    """
    est = get_estimator(name)
    accepted = est.tunables
    for key in kwargs:
        if key in accepted:
            continue
        if key in RENAMED_KWARGS and RENAMED_KWARGS[key] in accepted:
            continue  # the old name: renamed (with a warning) by AlgorithmConfig
        if key in LAYOUT_ARGS or key in est.inputs:
            raise ValueError(
                f"algorithm.estimator_kwargs: key {key!r} for {name} is supplied by the module from the "
                f"batch and cannot be set; it accepts {accepted}"
            )
        close = difflib.get_close_matches(str(key), accepted, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"algorithm.estimator_kwargs: unknown key {key!r} for {name}{hint}; it accepts {accepted}")


def compute_advantages(name: str, **kwargs: Any) -> AdvantageResult:
    """Run the estimator called ``name`` with ``kwargs`` (rewards, traj_index, ... included).

    An unknown ``name`` is a ValueError listing the valid ones.
    """
    return get_estimator(name).fn(**kwargs)
