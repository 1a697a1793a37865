"""SPA-RL process reward model: a per-turn progress estimator trained on whole trajectories.

SPA-RL (Stepwise Progress Attribution, Wang et al., arXiv 2505.20732) redistributes a delayed
outcome reward over the turns of an episode: an LM backbone reads the episode, a head on the
hidden state at the last token of each turn t gives a progress contribution c_t, and the model
is trained so that the contributions add up to the final reward, MSE(Σ_t c_t, R). The dense
reward of turn t is then r_t = c_t + grounding·[turn t's action was valid] (the paper's
"grounding signal"; its size is bounded so that a failing episode cannot out-earn a win, see
``ProcessRewardModelReward``).

- ``ProcessRewardModule`` trains it (``rspo-lightning fit --config configs/household/prm.yaml``);
- ``rspo_lightning.datamodules.TrajectoryEpisodeDataModule`` feeds it whole trajectories (one
  sample = one episode);
- ``rspo_lightning.rewards.ProcessRewardModelReward`` is the trained model as a ``DenseReward``
  source, next to the other dense rewards.

Deviations from the paper and its released code (``prm/train_our_progress_model.py``):

- ``head: linear`` reads the last *hidden state*: ``Linear(H, 1)``. The released code puts its
  ``Linear(V, 1)`` on the LM's output *logits* at that token; a head on the hidden state is the
  same function class up to the (frozen-able) unembedding, and costs no ``[L, V]`` logits.
- The default ``head: mlp_tanh`` (Linear -> Tanh -> Linear -> Tanh) is the head as the RSPO
  paper states it: the per-turn output r̂_t = tanh(MLP(h_t)) is bounded in (−1, 1).
  ``head: linear`` is unbounded, as SPA-RL's released code.
- The grounding bonus defaults to ``success_reward / (2 · max_steps)`` (0.1 with the Household /
  ALFWorld defaults 10 and 50), not SPA-RL's 0.5: with a success reward of 10 and 50 turns, 0.5
  per valid turn would let a failing episode earn 25, more than a win.
- Inputs are token ids recorded during rollout, not a re-rendered chat transcript (see
  ``ProcessRewardModule`` for the exact layout), and a too-long episode is shortened by trimming
  observations, never actions, so every turn keeps its read position (the released code
  truncates the transcript's end, losing the last turns).
- The regression target defaults to the env's ``score`` (ALFWorld 0/1, WebShop [0, 1]), the
  scale SPA-RL's final reward and its 0.5 grounding are set on; ``target: outcome`` uses
  R(τ) = Σ outcome rewards instead (10 on a won Household episode).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import BinaryAUROC
from torchmetrics.regression import PearsonCorrCoef

from rspo_lightning.config import OptimConfig, PolicyConfig
from rspo_lightning.datamodules.trajectory import EpisodeBatch
from rspo_lightning.language_model import hidden_size_of, load_policy
from rspo_lightning.types import Trajectory

HEAD_KINDS = ("mlp_tanh", "linear")
TARGETS = ("score", "outcome", "success")
HEAD_FILE = "prm_head.pt"
CONFIG_FILE = "prm_config.json"


# --------------------------------------------------------------------------- pure helpers


def trajectory_target(trajectory: Trajectory, target: str = "score") -> float:
    """The final reward R a trajectory's contributions must add up to.

    ``"score"``: ``trajectory.score`` (env score in [0, 1]); ``"outcome"``: R(τ), the sum of the
    turns' outcome rewards; ``"success"``: 1.0 for a won episode, else 0.0.
    """
    if target == "score":
        return float(trajectory.score)
    if target == "outcome":
        return trajectory.outcome_return
    if target == "success":
        return 1.0 if trajectory.success else 0.0
    raise ValueError(f"target must be one of {list(TARGETS)}, got {target!r}")


def episode_segments(trajectory: Trajectory, tokenize: Callable[[str], list[int]]) -> list[tuple[list[int], list[int]]]:
    """``(context_ids, response_ids)`` per turn, in turn order.

    Turn 0's context is its full ``prompt_ids`` (system, task, first observation, admissible
    actions); turn t > 0's context is ``tokenize(turn.observation)``, the observation the agent
    answered (later prompts repeat the task and history, which the sequence already holds).
    """
    out = []
    for t, turn in enumerate(trajectory.turns):
        context = turn.prompt_ids.tolist() if t == 0 else (tokenize(turn.observation) if turn.observation else [])
        out.append((list(context), turn.response_ids.tolist()))
    return out


def pack_episode(
    segments: Sequence[tuple[Sequence[int], Sequence[int]]], max_length: int
) -> tuple[list[int], list[int]]:
    """Concatenate ``context_0, response_0, context_1, response_1, ...`` into at most ``max_length`` ids.

    Returns ``(ids, read_positions)``: ``read_positions[t]`` is the index of turn t's last
    response token (where the head reads c_t; a turn with an empty response is read at the last
    token before it).

    When the episode is too long, contexts are trimmed, never responses: the longest contexts
    lose their oldest (leftmost) tokens first, down to a common length c; where that leaves room
    for some contexts to keep c + 1 tokens, the later turns keep them.

    Raises:
        ValueError: ``max_length`` < 1, or the responses alone are longer than ``max_length``.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    if not segments:
        raise ValueError("pack_episode got an episode without turns; drop empty trajectories first")
    contexts = [list(c) for c, _ in segments]
    responses = [list(r) for _, r in segments]
    budget = max_length - sum(len(r) for r in responses)
    if budget < 0:
        raise ValueError(
            f"the episode's responses alone take {max_length - budget} tokens, more than max_length={max_length}; "
            f"raise max_length"
        )
    lengths = [len(c) for c in contexts]
    if sum(lengths) > budget:
        # Largest common cap c with sum(min(len, c)) <= budget (the sum is non-decreasing in c).
        lo, hi = 0, max(lengths)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if sum(min(n, mid) for n in lengths) <= budget:
                lo = mid
            else:
                hi = mid - 1
        keep = [min(n, lo) for n in lengths]
        spare = budget - sum(keep)
        for i in reversed(range(len(keep))):  # later turns keep the (c + 1)-th token first
            if spare == 0:
                break
            if lengths[i] > lo:
                keep[i] += 1
                spare -= 1
        contexts = [c[len(c) - k :] if k else [] for c, k in zip(contexts, keep)]
    ids: list[int] = []
    reads: list[int] = []
    for context, response in zip(contexts, responses):
        ids.extend(context)
        ids.extend(response)
        reads.append(max(len(ids) - 1, 0))
    if not ids:
        raise ValueError("the episode has no tokens at all (empty prompts and responses)")
    return ids, reads


def pad_episodes(rows: Sequence[Sequence[int]], reads: Sequence[Sequence[int]], pad_id: int) -> dict[str, Tensor]:
    """Right-pad packed episodes.

    Returns ``input_ids [B, L]``, ``attention_mask [B, L]``, ``read_positions [B, T]`` (T = most
    turns in the batch; padding turns read column 0) and ``turn_mask [B, T]`` (True on real turns).
    """
    if not rows or len(rows) != len(reads):
        raise ValueError(f"pad_episodes needs one read list per row, got {len(rows)} rows and {len(reads)} read lists")
    n, width, turns = len(rows), max(len(r) for r in rows), max(len(p) for p in reads)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    read_positions = torch.zeros((n, turns), dtype=torch.long)
    turn_mask = torch.zeros((n, turns), dtype=torch.bool)
    for i, (row, pos) in enumerate(zip(rows, reads)):
        input_ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
        read_positions[i, : len(pos)] = torch.as_tensor(pos, dtype=torch.long)
        turn_mask[i, : len(pos)] = True
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "read_positions": read_positions,
        "turn_mask": turn_mask,
    }


def prm_loss(turn_values: Tensor, turn_mask: Tensor, targets: Tensor) -> Tensor:
    """SPA-RL's objective: mean over trajectories b of (Σ_t c_bt - R_b)^2.

    Args:
        turn_values: ``[B, T]`` per-turn contributions c_t (padding turns may hold anything).
        turn_mask: ``[B, T]`` True on real turns.
        targets: ``[B]`` final reward R of each trajectory.
    """
    if turn_values.shape != turn_mask.shape or targets.shape != turn_values.shape[:1]:
        raise ValueError(
            f"prm_loss needs turn_values and turn_mask [B, T] and targets [B], got {tuple(turn_values.shape)}, "
            f"{tuple(turn_mask.shape)} and {tuple(targets.shape)}"
        )
    values = turn_values.float()
    sums = torch.where(turn_mask.bool(), values, torch.zeros_like(values)).sum(-1)
    return ((sums - targets.to(sums)) ** 2).mean()


class ProgressHead(nn.Module):
    """Per-turn progress c_t from a hidden state ``[..., H]`` -> ``[...]``, in float32.

    ``"mlp_tanh"``: tanh(Linear(hidden, 1)(tanh(Linear(H, hidden)(h)))), bounded in (−1, 1) (the
    RSPO paper's head; the output tanh is applied in ``forward``, so ``net[-1]`` is the last
    Linear for both kinds and the state-dict keys are those of the unbounded version);
    ``"linear"``: Linear(H, 1), unbounded (SPA-RL's released code). The last Linear starts at
    zero, so an untrained model gives c_t = 0 (neutral dense rewards) and the first updates add
    no noise. In floating point the tanh saturates: a pre-activation beyond ~9 (float32) gives
    exactly ±1.
    """

    def __init__(self, hidden_size: int, kind: str = "mlp_tanh", head_hidden: int | None = None):
        super().__init__()
        if kind not in HEAD_KINDS:
            raise ValueError(f"head must be one of {list(HEAD_KINDS)}, got {kind!r}")
        if kind == "mlp_tanh":
            width = head_hidden or hidden_size
            self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.Tanh(), nn.Linear(width, 1))
        else:
            self.net = nn.Sequential(nn.Linear(hidden_size, 1))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        self.kind = kind

    def forward(self, hidden: Tensor) -> Tensor:
        out = self.net(hidden.to(self.net[0].weight.dtype)).squeeze(-1)
        return torch.tanh(out) if self.kind == "mlp_tanh" else out


# --------------------------------------------------------------------------- data


# --------------------------------------------------------------------------- the model


class ProcessRewardModule(pl.LightningModule):
    """SPA-RL progress estimator: LM backbone + per-turn head, trained with MSE(Σ_t c_t, R).

    Input layout of one trajectory (token ids, causal LM, right-padded)::

        prompt_ids(turn 0) | response_ids(turn 0) | obs(turn 1) | response_ids(turn 1) | ...
                                              ^ c_0                                ^ c_1

    where obs(t) is ``turn.observation`` tokenised without special tokens, the observation the
    agent answered at turn t (turn 0's prompt already holds the task and first observation;
    later prompts would repeat it). This is SPA-RL's transcript (task, then alternating action
    and observation) built from the recorded ids instead of re-rendered text. c_t is read at
    the last response token of turn t, so it sees the episode up to and including action t and
    nothing after. Over ``max_length`` tokens, observations (and turn 0's prompt) lose their
    oldest tokens, longest first; actions are never cut (``pack_episode``).

    Args:
        policy: the backbone. ``source`` must be loadable without a corpus (a Hugging Face
            directory such as the ``--save-policy`` one that tokenised the trajectories, a
            ``.gguf`` path or ``smollm2``): the recorded ids only mean something under the
            tokenizer that wrote them, so ``tiny`` is refused. ``gradient_checkpointing`` applies.
        optim: AdamW settings of the head and (unless frozen) the backbone; the schedule's
            ``warmup_iterations`` / ``decay_iterations`` count optimizer steps.
        head: ``mlp_tanh`` (Linear -> Tanh -> Linear -> Tanh, the paper's head, c_t in (−1, 1))
            or ``linear`` (one unbounded Linear on the hidden state; the released code's single
            linear layer).
        head_hidden: width of the ``mlp_tanh`` hidden layer; None = the backbone's hidden size.
        freeze_backbone: train the head only (the backbone runs without gradients, in eval mode).
        max_length: longest packed episode in tokens (at most the backbone's context length);
            None = the backbone's context length (``max_position_embeddings``, else 2048).
        target: the final reward R: ``score`` (env score, SPA-RL's scale), ``outcome`` (sum of
            outcome rewards) or ``success`` (1/0).
    """

    def __init__(
        self,
        policy: PolicyConfig = PolicyConfig(),
        optim: OptimConfig = OptimConfig(lr=1e-5),
        head: str = "mlp_tanh",
        head_hidden: int | None = None,
        freeze_backbone: bool = False,
        max_length: int | None = None,
        target: str = "score",
    ):
        super().__init__()
        if head not in HEAD_KINDS:
            raise ValueError(f"model.head must be one of {list(HEAD_KINDS)}, got {head!r}")
        if target not in TARGETS:
            raise ValueError(f"model.target must be one of {list(TARGETS)}, got {target!r}")
        if max_length is not None and max_length < 2:
            raise ValueError(f"model.max_length must be >= 2 or null (the backbone's context), got {max_length}")
        if head_hidden is not None and head_hidden < 1:
            raise ValueError(f"model.head_hidden must be >= 1 or null, got {head_hidden}")
        self.save_hyperparameters()
        self.policy_cfg = policy
        self.optim_cfg = optim
        self.head_kind = head
        self.head_hidden = head_hidden
        self.freeze_backbone = freeze_backbone
        self.max_length = max_length
        self.target = target
        self.backbone = None
        self.tokenizer = None
        self.head = None
        # held-out means and ranking over every rank's episodes (torchmetrics sync them in compute)
        self.val_loss, self.val_mae, self.val_ranking = MeanMetric(), MeanMetric(), EpisodeRanking()

    # -- building ------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.backbone is not None:
            return
        if self.policy_cfg.source == "tiny":
            raise ValueError(
                "ProcessRewardModule cannot build model.policy.source: tiny: the tiny word-level tokenizer is trained on a "
                "corpus, and the trajectories' token ids only mean something under the tokenizer that wrote them. Set "
                "model.policy.source to the directory that tokenizer was saved in (`python -m rspo_lightning.demos "
                "expert --save-policy DIR ...`, or the RL run's exported policy)"
            )
        backbone, tokenizer = load_policy(
            self.policy_cfg.source,
            gguf_file=self.policy_cfg.gguf_file,
            trust_remote_code=self.policy_cfg.trust_remote_code,
        )
        context = getattr(backbone.config, "max_position_embeddings", None)
        context = context if isinstance(context, int) else None
        if self.max_length is None:
            self.max_length = context or 2048
        elif context is not None and self.max_length > context:
            raise ValueError(
                f"model.max_length={self.max_length} is longer than the backbone's context "
                f"(max_position_embeddings={context}); set model.max_length <= {context} or null"
            )
        if self.policy_cfg.gradient_checkpointing and not self.freeze_backbone:
            backbone.gradient_checkpointing_enable()
        if self.freeze_backbone:
            backbone.requires_grad_(False)
        self.backbone, self.tokenizer = backbone, tokenizer
        self.head = ProgressHead(hidden_size_of(backbone), self.head_kind, self.head_hidden)
        self.train(self.training)

    def setup(self, stage: str) -> None:
        self.configure_model()

    def train(self, mode: bool = True):
        super().train(mode)
        if self.freeze_backbone and self.backbone is not None:
            self.backbone.eval()  # a frozen backbone never uses dropout
        return self

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            params, lr=self.optim_cfg.lr, betas=self.optim_cfg.betas, weight_decay=self.optim_cfg.weight_decay
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.optim_cfg.lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -- forward -------------------------------------------------------------------------
    def _tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, trajectories: Sequence[Trajectory]) -> dict[str, Tensor]:
        """Pack and right-pad trajectories (see the class docstring) on this module's device."""
        if self.tokenizer is None:
            raise RuntimeError("ProcessRewardModule has no backbone yet; call configure_model() first")
        rows, reads = [], []
        for k, traj in enumerate(trajectories):
            if not traj.turns:
                raise ValueError(f"trajectory {k} ({traj.task}) has no turns; there is nothing to score")
            try:
                ids, pos = pack_episode(episode_segments(traj, self._tokenize), self.max_length)
            except ValueError as e:
                raise ValueError(f"trajectory {k} ({traj.task}): {e} (model.max_length)") from e
            rows.append(ids)
            reads.append(pos)
        enc = pad_episodes(rows, reads, self.tokenizer.pad_token_id)
        return {k: v.to(self.device) for k, v in enc.items()}

    def forward(self, input_ids: Tensor, attention_mask: Tensor, read_positions: Tensor) -> Tensor:
        """Per-turn contributions c ``[B, T]`` (float32) read at ``read_positions [B, T]``."""
        decoder = self.backbone.get_decoder() if hasattr(self.backbone, "get_decoder") else self.backbone
        with torch.no_grad() if self.freeze_backbone else nullcontext():
            out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]  # [B, L, H]
        index = read_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        return self.head(hidden.gather(1, index))

    @torch.no_grad()
    def turn_values(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        """c_t of every turn of every trajectory (eval mode restored afterwards); [] for an empty one."""
        was_training = self.training
        self.eval()
        try:
            scored = [t for t in trajectories if t.turns]
            values = []
            if scored:
                enc = self.encode(scored)
                out = self(enc["input_ids"], enc["attention_mask"], enc["read_positions"]).cpu()
                values = [out[i, : len(t.turns)].tolist() for i, t in enumerate(scored)]
            it = iter(values)
            return [next(it) if t.turns else [] for t in trajectories]
        finally:
            self.train(was_training)

    # -- loss ----------------------------------------------------------------------------
    def episode_loss(self, trajectories: Sequence[Trajectory]) -> tuple[Tensor, Tensor]:
        """``(MSE of Σ_t c_t against R, mean absolute error of Σ_t c_t)`` over ``trajectories``."""
        enc = self.encode(trajectories)
        values = self(enc["input_ids"], enc["attention_mask"], enc["read_positions"])
        targets = torch.tensor(
            [trajectory_target(t, self.target) for t in trajectories], dtype=torch.float32, device=values.device
        )
        loss = prm_loss(values, enc["turn_mask"], targets)
        with torch.no_grad():
            sums = torch.where(enc["turn_mask"], values, torch.zeros_like(values)).sum(-1)
            mae = (sums - targets).abs().mean()
        return loss, mae

    def training_step(self, batch: EpisodeBatch, batch_idx: int) -> Tensor:
        loss, mae = self.episode_loss(batch.trajectories)
        n = len(batch)
        self.log("train/prm_loss", loss.detach(), on_step=True, prog_bar=True, batch_size=n)
        self.log("train/prm_mae", mae, on_step=True, batch_size=n)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, batch_size=n)
        return loss

    def validation_step(self, batch: EpisodeBatch, batch_idx: int) -> None:
        loss, mae = self.episode_loss(batch.trajectories)
        n = len(batch)
        self.val_loss.update(loss.detach(), weight=n)
        self.val_mae.update(mae, weight=n)
        self.log("val/prm_loss", self.val_loss, on_epoch=True, prog_bar=True, batch_size=n)
        self.log("val/prm_mae", self.val_mae, on_epoch=True, batch_size=n)
        predicted = [sum(v) for v in self.turn_values(batch.trajectories)]
        self.val_ranking.update(
            predicted, [t.success for t in batch.trajectories], [t.turns[-1].progress for t in batch.trajectories]
        )

    def on_validation_epoch_end(self) -> None:
        """How well the predicted return Σ_t c_t ranks the held-out episodes of every rank:
        ``val/prm_auc`` (ROC AUC of won against lost episodes; NaN without both) and
        ``val/prm_progress_corr`` (Pearson correlation with the episode's final subgoal progress,
        where the env reports one)."""
        ranking = self.val_ranking.compute()  # a collective: every rank, sanity check included
        self.val_ranking.reset()
        if not ranking["episodes"] or self.trainer.sanity_checking:
            return
        self.ranking = ranking
        self.log("val/prm_auc", ranking["auc"])
        self.log("val/prm_progress_corr", ranking["progress_corr"])

    # -- export --------------------------------------------------------------------------
    def save_pretrained(self, directory: str) -> str:
        """Backbone + tokenizer as a Hugging Face directory, plus ``prm_head.pt`` and ``prm_config.json``.

        ``ProcessRewardModule.from_pretrained(directory)`` or ``ProcessRewardModelReward(directory)``
        loads it back (weights only, no pickled objects).
        """
        os.makedirs(directory, exist_ok=True)
        self.backbone.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        torch.save({k: v.detach().cpu() for k, v in self.head.state_dict().items()}, os.path.join(directory, HEAD_FILE))
        with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(
                {
                    "head": self.head_kind,
                    "head_hidden": self.head_hidden,
                    "max_length": self.max_length,
                    "target": self.target,
                },
                f,
                indent=2,
            )
        return directory

    @classmethod
    def from_pretrained(cls, directory: str, map_location: str | torch.device = "cpu") -> ProcessRewardModule:
        """Load a directory written by ``save_pretrained`` (in eval mode)."""
        head_path, config_path = os.path.join(directory, HEAD_FILE), os.path.join(directory, CONFIG_FILE)
        if not (os.path.isfile(head_path) and os.path.isfile(config_path)):
            raise FileNotFoundError(
                f"{directory!r} has no {HEAD_FILE} / {CONFIG_FILE}; pass a directory written by "
                f"ProcessRewardModule.save_pretrained (a PRM fit exports <log_dir>/prm)"
            )
        with open(config_path, encoding="utf-8") as f:
            cfg = json.load(f)
        module = cls(
            policy=PolicyConfig(source=directory),
            head=cfg["head"],
            head_hidden=cfg.get("head_hidden"),
            max_length=int(cfg["max_length"]),
            target=cfg.get("target", "score"),
        )
        module.configure_model()
        module.head.load_state_dict(torch.load(head_path, map_location="cpu", weights_only=True))
        return module.to(map_location).eval()

    def on_train_end(self) -> None:
        # Sharded strategies would need a full-state gather first; a PRM fit here runs unsharded.
        if self.trainer.is_global_zero:
            directory = os.path.join(self.trainer.log_dir or self.trainer.default_root_dir, "prm")
            self.save_pretrained(directory)
            self.export_dir = directory
            r = getattr(self, "ranking", None)
            ranking = (
                (
                    f"; held-out ranking: ROC AUC {r['auc']:.3f} (won vs lost, {r['won']} of {r['episodes']} episodes won), "
                    f"correlation with final progress {r['progress_corr']:.3f}"
                )
                if r
                else ""
            )
            print(f"prm: saved to {directory}{ranking}")


class EpisodeRanking(nn.Module):
    """How well predicted episode returns rank held-out episodes, over every rank's episodes:
    ROC AUC of won against lost (NaN without both kinds) and the Pearson correlation with final
    progress (NaN when either side is constant), as torchmetrics' ``BinaryAUROC`` (exact, ties
    1/2; its sums are float32, within 1e-7 of ``roc_auc``) and ``PearsonCorrCoef`` (float64);
    ``compute`` syncs over ranks. ``roc_auc`` and
    ``pearson`` below are the hand oracles."""

    def __init__(self) -> None:
        super().__init__()
        self.auc = BinaryAUROC().set_dtype(torch.float64)
        self.corr = PearsonCorrCoef().set_dtype(torch.float64)
        self.won = SumMetric().set_dtype(torch.float64)
        self.episodes = SumMetric().set_dtype(torch.float64)

    def update(self, scores: Sequence[float], won: Sequence[bool], progress: Sequence[float]) -> None:
        device = self.won.device
        x = torch.tensor(list(map(float, scores)), dtype=torch.float64, device=device)
        w = torch.tensor([int(b) for b in won], dtype=torch.long, device=device)
        self.auc.update(x, w)
        self.corr.update(x, torch.tensor(list(map(float, progress)), dtype=torch.float64, device=device))
        self.won.update(w.sum().double())
        self.episodes.update(torch.tensor(float(len(w)), dtype=torch.float64, device=device))

    def compute(self) -> dict[str, float]:
        episodes, won = int(self.episodes.compute()), int(self.won.compute())
        if episodes == 0:
            return {"auc": float("nan"), "progress_corr": float("nan"), "episodes": 0, "won": 0}
        auc = float(self.auc.compute()) if 0 < won < episodes else float("nan")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*variance.*close to zero")  # constant: NaN
            corr = float(self.corr.compute()) if episodes > 1 else float("nan")
        return {"auc": auc, "progress_corr": corr, "episodes": episodes, "won": won}

    def reset(self) -> None:
        for metric in (self.auc, self.corr, self.won, self.episodes):
            metric.reset()


def roc_auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """P(a positive scores above a negative), ties counting 1/2 (the Mann-Whitney form of ROC
    AUC); NaN without both kinds."""
    if not positives or not negatives:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; NaN when either side is constant or there are fewer than 2 points."""
    n = len(x)
    if n < 2:
        return float("nan")
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


# --------------------------------------------------------------------------- dense reward


def load_checkpoint(path: str, map_location) -> ProcessRewardModule:
    """A Lightning ``.ckpt`` of a PRM fit, unpickled with ``weights_only=True`` (only the config
    dataclasses of its hyper-parameters are allow-listed)."""
    # the config dataclasses are allow-listed where they are defined (rspo_lightning.config)
    return ProcessRewardModule.load_from_checkpoint(path, map_location=map_location, weights_only=True)
