"""Metrics over all ranks: 2 gloo processes with different episodes each log what one process
logs over the union (``rollout/*``, the PRM's held-out AUROC / Pearson, token-weighted means)."""

import json
import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_metrics import _traj

from rspo_lightning import metrics
from rspo_lightning.prm import EpisodeRanking, pearson, roc_auc

# rank 0 plays 2 episodes, rank 1 plays 3 (of another task type); the third case gives rank 0 none
EPISODES = {
    0: [([True, False, True], True, [0.0, 0.5, 1.0], 0.5, "pick_and_place"), ([False], False, [0.5], 0.0, "heat")],
    1: [
        ([True, True], False, [0.0, 0.5], 0.25, "pick_and_place"),
        ([True], True, [1.0], 1.0, "clean"),
        ([False, False, True, True], False, [0.0, 0.0, 0.5, 0.5], 0.0, "clean"),
    ],
}
# predicted returns, won, final progress per rank (ties across the ranks: 0.5 twice)
RANKING = {
    0: ([0.9, 0.5, 0.1], [1, 0, 0], [1.0, 0.5, 0.0]),
    1: ([0.5, 0.7, 0.2, 0.4], [1, 1, 0, 0], [0.5, 1.0, 0.0, 0.5]),
}
MEANS = {0: ([1.0, 3.0], [2, 6]), 1: ([5.0], [1])}  # values with weights (response tokens)


def _episodes(rank):
    return [_traj(v, s, p, dense=d, task_type=ty) for v, s, p, d, ty in EPISODES[rank]]


def _worker(rank, init, out):
    from torchmetrics import MeanMetric

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        got = {
            "rollout": metrics.rollout_metrics(_episodes(rank), "rollout"),
            "rollout_one_empty": metrics.rollout_metrics(_episodes(rank) if rank else [], "rollout"),
        }
        ranking = EpisodeRanking()
        scores, won, progress = RANKING[rank]
        ranking.update(scores, [bool(w) for w in won], progress)
        got["ranking"] = ranking.compute()
        mean = MeanMetric()
        for v, w in zip(*MEANS[rank]):
            mean.update(torch.tensor(v), weight=w)
        got["mean"] = float(mean.compute())
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(got, f)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    init = f"file://{out / 'rendezvous'}"
    mp.spawn(_worker, args=(init, str(out)), nprocs=2, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_rollout_metrics_are_the_union_of_the_ranks_episodes(ranks):
    union = metrics.rollout_metrics(_episodes(0) + _episodes(1), "rollout")
    assert union["rollout/success_rate"] == pytest.approx(2 / 5)  # by hand: 1 won on each rank of 2 + 3
    assert union["rollout/invalid_rate"] == pytest.approx(4 / 11)  # 2 + 2 invalid of 4 + 7 turns
    assert union["rollout/success_rate/clean"] == pytest.approx(1 / 2)  # only rank 1 plays it
    for r in ranks:
        assert r["rollout"].keys() == union.keys()
        for key, value in union.items():
            assert r["rollout"][key] == pytest.approx(value, rel=1e-12), key
    alone = metrics.rollout_metrics(_episodes(1), "rollout")  # rank 0 played nothing: rank 1's alone
    for r in ranks:
        assert r["rollout_one_empty"] == pytest.approx(alone, rel=1e-12)


def test_prm_ranking_and_weighted_means_are_over_all_ranks(ranks):
    scores = RANKING[0][0] + RANKING[1][0]
    won = RANKING[0][1] + RANKING[1][1]
    progress = RANKING[0][2] + RANKING[1][2]
    auc = roc_auc([s for s, w in zip(scores, won) if w], [s for s, w in zip(scores, won) if not w])
    # by hand: positives 0.9, 0.5, 0.7 against negatives 0.5, 0.1, 0.2, 0.4: 4 + 3.5 (a tie) + 4 of 12
    assert auc == pytest.approx(11.5 / 12)
    corr = pearson(scores, progress)
    weighted = (1.0 * 2 + 3.0 * 6 + 5.0 * 1) / 9
    for r in ranks:
        assert r["ranking"]["episodes"] == 7 and r["ranking"]["won"] == 3
        assert r["ranking"]["auc"] == pytest.approx(auc, abs=1e-6)  # BinaryAUROC sums in float32
        assert r["ranking"]["progress_corr"] == pytest.approx(corr, abs=1e-9)
        assert r["mean"] == pytest.approx(weighted, rel=1e-6)
    one_rank = EpisodeRanking()
    one_rank.update(*RANKING[1][:1], [bool(w) for w in RANKING[1][1]], RANKING[1][2])
    assert one_rank.compute()["auc"] != pytest.approx(auc)  # rank 1 alone would log another AUROC
    lost_only = EpisodeRanking()
    lost_only.update([0.1, 0.2], [False, False], [0.0, 0.5])
    assert math.isnan(lost_only.compute()["auc"])  # NaN without both kinds, as roc_auc
