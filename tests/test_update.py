"""update.py: the iteration's loss J and its per-row weights, fixed once per iteration."""

from __future__ import annotations

import pytest
import torch
from module_helpers import _changed, _module, _scored_batch, _snapshot, _Weights

from rspo_lightning import logprobs, update
from rspo_lightning.batching import flatten, make_train_batch
from rspo_lightning.config import AlgorithmConfig
from rspo_lightning.logprobs import Forward
from rspo_lightning.rspo import diagnostics
from rspo_lightning.types import ReplayWeight, TaskSpec, TrainBatch, Trajectory

SIGNAL = ReplayWeight("signal")  # α from the replay's share of the signal-carrying tokens

T = 4  # response window of the hand batch


def _hand_batch(n_on: int, n_signal: int, n_rep: int) -> TrainBatch:
    """``n_on`` on-policy rows (the first ``n_signal`` with non-zero advantage) and ``n_rep``
    replayed rows (all non-zero); row i has 1 + i % T response tokens and its id in the last
    input column (the column ``TrainBatch.select`` never trims)."""
    n = n_on + n_rep
    lengths = torch.tensor([1 + i % T for i in range(n)])
    response_mask = torch.arange(T)[None, :] >= T - lengths[:, None]
    input_ids = torch.zeros((n, 2 + T), dtype=torch.long)
    input_ids[:, -1] = torch.arange(n)
    advantages = torch.zeros(n)
    advantages[:n_signal] = torch.linspace(-1.0, 2.0, n_signal)
    advantages[n_on:] = torch.linspace(0.5, 3.0, n_rep)
    old = torch.full((n, T), -1.0) * response_mask
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        response_mask=response_mask,
        behaviour_logprobs=old.clone(),
        old_logprobs=old.clone(),
        advantages=advantages,
        returns=torch.zeros(n),
        clip_scale=torch.ones(n),
        is_replay=torch.arange(n) >= n_on,
        value_positions=torch.zeros(n, dtype=torch.long),
    )


class _Capture(torch.optim.SGD):
    """An optimizer that never moves the weights and sums the gradient of every step it is asked to take."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.summed = torch.zeros_like(self.param_groups[0]["params"][0])
        self.steps = 0

    def step(self, closure=None):
        self.summed += self.param_groups[0]["params"][0].grad
        self.steps += 1


def _summed_gradient(
    batch: TrainBatch, den: update.Denominators, algo: AlgorithmConfig, alpha: float | None, seed: int, n_rows: int
) -> tuple[torch.Tensor, int]:
    """Sum over one epoch's optimizer steps of the gradient wrt per-token log-prob parameters
    ``theta [n_rows, T]`` (log-probs = theta, so the ratio is 1 at the start: the gradient is the
    surrogate's, -A per token, weighted as the update weighs it)."""
    theta = torch.nn.Parameter(torch.full((n_rows, T), -1.0))
    opt = _Capture([theta])

    def loss_fn(part: TrainBatch, scale: update.Scale):
        ids, w = part.input_ids[:, -1], part.response_mask.shape[1]
        logprobs = theta[ids][:, T - w :] * part.response_mask
        fwd = Forward(logprobs=logprobs, entropy=torch.zeros_like(logprobs))
        return update.micro_batch_loss(fwd, part, scale, algo)

    update.ppo_update(
        batch,
        loss_fn,
        opt,
        algo,
        dummy=batch.select(torch.arange(1)),
        generator=torch.Generator().manual_seed(seed),
        replay_weight=alpha,
        den=den,
    )
    return opt.summed, opt.steps


def _hand_gradient(batch: TrainBatch, alpha: float, n_on: int, n_rep: int) -> torch.Tensor:
    """(1 − α)/n_on · Σ_online ∇ℓ + α/n_rep · Σ_replay ∇ℓ by hand: ℓ_row = mean over its tokens of
    −A·ratio, so ∂ℓ_row/∂theta[row, token] = −A_row / tokens_row at ratio 1."""
    mask = batch.response_mask.float()
    per_token = -batch.advantages[:, None] / mask.sum(-1, keepdim=True) * mask
    weight = torch.where(batch.is_replay, torch.tensor(alpha / n_rep), torch.tensor((1 - alpha) / n_on))
    return per_token * weight[:, None]


def test_j_weighting_by_hand_any_shuffle_and_with_or_without_the_drop(monkeypatch):
    """100 online rows (20 with non-zero advantage), 10 replayed rows, α = 1/8: the gradients of one
    epoch sum to (N/B) · [(1 − α)/100 · Σ_online ∇ℓ + α/10 · Σ_replay ∇ℓ] (N = 110 rows, B the
    minibatch size), whatever the shuffle, whether the zero-advantage rows are dropped or not,
    and with a minibatch that holds only replayed rows."""
    alpha, n_on, n_signal, n_rep = 0.125, 100, 20, 10
    full = _hand_batch(n_on, n_signal, n_rep)
    algo = AlgorithmConfig(loss_agg="seq-mean-token-mean", ppo_epochs=1, minibatch_size=15, max_grad_norm=0.0)
    den = update.denominators(full, algo.loss_agg)
    assert den == (100.0, 10.0, 110.0)  # rows (seq-mean): every online row counts, the dropped ones included
    expected = (110 / 15) * _hand_gradient(full, alpha, n_on, n_rep)
    kept = full.select(torch.nonzero(full.advantages != 0).flatten())  # drop_zero_advantage: 30 rows
    assert len(kept) == 30
    for seed in (0, 1, 2):  # two minibatches of 15 kept rows, three shuffles
        grad, steps = _summed_gradient(kept, den, algo, alpha, seed, len(full))
        assert steps == 2
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)
    grad, steps = _summed_gradient(full, den, algo, alpha, 0, len(full))  # no drop: 8 minibatches
    assert steps == 8
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)
    # unshuffled, in minibatches of 10: the last one holds only the 10 replayed rows
    monkeypatch.setattr(torch, "randperm", lambda n, generator=None: torch.arange(n))
    grad, steps = _summed_gradient(
        kept,
        den,
        AlgorithmConfig(loss_agg="seq-mean-token-mean", ppo_epochs=1, minibatch_size=10, max_grad_norm=0.0),
        alpha,
        0,
        len(full),
    )
    assert steps == 3 and bool(kept.select(torch.arange(20, 30)).is_replay.all())
    torch.testing.assert_close(grad, (110 / 10) * _hand_gradient(full, alpha, n_on, n_rep), rtol=1e-5, atol=1e-7)


def test_token_mean_counts_every_token_of_the_iteration():
    """Under ``token-mean`` the means divide by the iteration's tokens of each kind: ∂/∂theta of a
    token = −A · (N/B) · w_part / tokens_part, the same for every minibatch; without replay rows
    (GRPO) J = J_on over all tokens."""
    full = _hand_batch(12, 4, 0)
    algo = AlgorithmConfig(ppo_epochs=1, minibatch_size=2, max_grad_norm=0.0)
    den = update.denominators(full, algo.loss_agg)
    tokens = float(full.response_mask.sum())
    assert den == (tokens, 0.0, 12.0)
    kept = full.select(torch.arange(4))
    grad, steps = _summed_gradient(kept, den, algo, None, 0, len(full))
    assert steps == 2
    torch.testing.assert_close(
        grad, (12 / 2) * -full.advantages[:, None] * full.response_mask / tokens, rtol=1e-5, atol=1e-7
    )


def test_term_weights_by_hand():
    assert update.term_weights(30.0, 2.0, 0.125) == (0.875, 0.125)  # alpha whatever the token counts
    assert update.term_weights(30.0, 2.0, None) == (30 / 32, 2 / 32)  # one pooled token-mean
    assert update.term_weights(30.0, 0.0, 0.125) == (1.0, 0.0)  # an iteration without replay rows
    assert update.term_weights(0.0, 2.0, 0.125) == (0.0, 1.0)


def test_replay_diagnostics_against_a_hand_count():
    """Trained rows: 4 on-policy (advantages 1, -2 and two dropped zeros not among them), 2 replayed
    (+3 with 2 tokens, -1 with 1 token); α = 1/8 over an iteration of 10 on-policy tokens."""
    rows = _hand_batch(4, 4, 2)  # lengths 1, 2, 3, 4 | 1, 2 (row i has 1 + i % 4 tokens)
    rows.advantages[:] = torch.tensor([1.0, -2.0, 0.5, 0.0, -1.0, 3.0])
    den = update.Denominators(on=20.0, off=3.0, rows=9.0)  # the iteration's counts, dropped rows included
    d = diagnostics.replay_diagnostics(rows, den, 0.125, "token-mean")
    assert d["rspo/replay_token_share"] == pytest.approx(3 / 13)  # replay tokens 1 + 2 of 1+2+3+4+1+2
    # advantage mass: on-policy w = 0.875/20 per token: (1·1 + 2·2 + 0.5·3 + 0) · 0.875/20; replay w = 0.125/3:
    on_mass, rep_mass = (1 + 4 + 1.5) * 0.875 / 20, (1 * 1 + 3 * 2) * 0.125 / 3
    assert d["rspo/replay_loss_share"] == pytest.approx(rep_mass / (on_mass + rep_mass))
    assert d["rspo/replay_win_share"] == pytest.approx(0.5)
    assert diagnostics.replay_diagnostics(rows.select(torch.arange(4)), den, 0.125, "token-mean") == {}
    # the behaviour policy's distance from A on the replayed tokens: log π_b − log π_A of
    # +0.5 (row 4's one token), +0.1 and −0.3 (row 5's two); an on-policy row's +2.0 does not count
    rows.behaviour_logprobs[0, T - 1] += 2.0
    rows.behaviour_logprobs[4, T - 1] += 0.5
    rows.behaviour_logprobs[5, T - 2] += 0.1
    rows.behaviour_logprobs[5, T - 1] -= 0.3
    d = diagnostics.replay_distance(rows)
    assert d["rspo/replay_log_ratio"] == pytest.approx((0.5 + 0.1 - 0.3) / 3)
    # ratio π_A / π_b outside [0.8, 1.25]: e^-0.5 = 0.61 and e^0.3 = 1.35 are, e^-0.1 = 0.90 is not
    assert d["rspo/replay_ratio_out"] == pytest.approx(2 / 3)
    assert diagnostics.replay_distance(rows.select(torch.arange(4))) == {}


def test_signal_alpha_is_the_replays_share_of_the_signal_carrying_tokens():
    """``offline_weighting: signal``: rows 0-3 on-policy (1, 2, 3, 4 tokens), rows 4-5 replayed
    (1, 2 tokens). Advantages 1, 0, 0, -2 | 3, 0: signal tokens on-policy 1 + 4 = 5, replayed 1:
    α = 1 / 6 under token-mean; by rows 2 and 1: α = 1 / 3. Fixed numbers and None pass through."""
    rows = _hand_batch(4, 4, 2)
    rows.advantages[:] = torch.tensor([1.0, 0.0, 0.0, -2.0, 3.0, 0.0])
    assert diagnostics.iteration_alpha(SIGNAL, rows, "token-mean") == pytest.approx(1 / 6)
    assert diagnostics.iteration_alpha(SIGNAL, rows, "seq-mean-token-mean") == pytest.approx(1 / 3)
    rows.advantages[4] = 0.0  # the replay carries no signal: J is J_on alone
    assert diagnostics.iteration_alpha(SIGNAL, rows, "token-mean") == 0.0
    rows.advantages[:] = 0.0
    assert diagnostics.iteration_alpha(SIGNAL, rows, "token-mean") == 0.0
    assert diagnostics.iteration_alpha(ReplayWeight("alpha", 0.125), rows, "token-mean") == 0.125
    assert diagnostics.iteration_alpha(ReplayWeight("tokens"), rows, "token-mean") is None


# -- the update through a real tiny module (moved from test_module.py / test_rspo.py) ----------


def test_non_finite_loss_skips_the_step_and_never_touches_the_weights():
    """``update.ppo_update`` without a Trainer: a NaN loss (and gradient) in one step leaves the
    weights alone and counts a skipped step; the finite steps around it do move them."""
    torch.manual_seed(0)
    m = _module(algorithm=AlgorithmConfig(ppo_epochs=3, minibatch_size=1000))  # one optimizer step per epoch
    batch = _scored_batch(m)
    opt = torch.optim.SGD(m.policy.parameters(), lr=0.1)
    calls = {"n": 0}

    def poisoned(mb, scale):
        loss, stats = m.loss(mb, scale)
        calls["n"] += 1
        return (loss * float("nan"), stats) if calls["n"] == 2 else (loss, stats)  # the second epoch's step

    snapshots = []  # the weights at every backward (one micro-batch per step here)

    def backward(loss):
        snapshots.append(_snapshot(m.policy))
        loss.backward()

    result = update.ppo_update(
        batch,
        poisoned,
        opt,
        m.algo,
        dummy=logprobs.dummy_batch(m.engine.pad_id),
        generator=torch.Generator().manual_seed(0),
        backward=backward,
    )
    assert calls["n"] == 3 and result.skipped == 1 and result.steps == 2
    first, second, third = snapshots
    assert _changed(first, _Weights(second))  # the first step moved the weights
    assert not _changed(second, _Weights(third))  # the skipped one did not
    assert _changed(third, m.policy)  # the third step moved them again
    assert all(torch.isfinite(v).all() for v in m.policy.state_dict().values())
    assert all(torch.isfinite(torch.tensor(v)) for v in result.stats.values())
    # every step poisoned: nothing moves at all
    pol1 = _snapshot(m.policy)
    result = update.ppo_update(
        batch,
        lambda mb, scale: (m.loss(mb, scale)[0] * float("nan"), {}),
        opt,
        m.algo,
        dummy=logprobs.dummy_batch(m.engine.pad_id),
        generator=torch.Generator().manual_seed(0),
    )
    assert result.skipped == 3 and result.steps == 0 and not _changed(pol1, m.policy)


def test_alpha_weighting_of_the_policy_loss_by_hand():
    torch.manual_seed(0)
    m = _module()
    m.configure_model()
    trajs = m.engine.collect([TaskSpec("rspo/Household-v0", "train", i, i) for i in range(2)], 2)
    turns = [t for tr in trajs for t in tr.turns][:3]
    flat = flatten(
        [
            Trajectory(task=TaskSpec("x", "train", 0, 0), turns=turns[:2]),
            Trajectory(task=TaskSpec("x", "train", 1, 1), turns=turns[2:], source="replay"),
        ]
    )
    adv = torch.tensor([1.0, -2.0, 4.0])
    batch = make_train_batch(flat, m.engine.pad_id, adv)
    batch, _ = m.score(batch)  # old := current log-probs, and on-policy behaviour := old
    batch.behaviour_logprobs[batch.is_replay] = batch.old_logprobs[batch.is_replay]  # ratio 1 on every token
    n = batch.response_mask.sum(-1).tolist()  # response tokens per row
    # with ratio 1 every token's loss is -A: L_on = -(n0*1 + n1*(-2)) / (n0 + n1), L_off = -4
    l_on, l_off = -(n[0] * 1.0 + n[1] * -2.0) / (n[0] + n[1]), -4.0
    fwd = logprobs.forward(m.policy, batch, m.rollout_cfg.temperature)
    total, _ = update.micro_batch_loss(fwd, batch, update.Scale(pg_on=0.75, pg_off=0.25), m.algo)
    assert float(total) == pytest.approx(0.75 * l_on + 0.25 * l_off, abs=1e-5)
    # the pooled token-mean (offline_weighting: tokens) weighs each part by its tokens
    pooled, _ = update.micro_batch_loss(fwd, batch, update.pooled_scale(batch, m.algo.loss_agg), m.algo)
    assert float(pooled) == pytest.approx(-(n[0] * 1.0 + n[1] * -2.0 + n[2] * 4.0) / sum(n), abs=1e-5)


def test_micro_batches_group_rows_of_similar_length_by_hand():
    from rspo_lightning.update import micro_batch_rows

    lengths = torch.tensor([5, 2, 9, 2, 7])
    # sorted by length, ties in row order: rows 1, 3 (2 tokens), 0 (5), 4 (7), 2 (9)
    assert [r.tolist() for r in micro_batch_rows(lengths, 2)] == [[1, 3], [0, 4], [2]]
    # one micro-batch keeps the minibatch's own order (bitwise the same update as before)
    assert [r.tolist() for r in micro_batch_rows(lengths, 5)] == [[0, 1, 2, 3, 4]]
    assert [r.tolist() for r in micro_batch_rows(lengths, 8)] == [[0, 1, 2, 3, 4]]
