"""Core data types: what flows from the data module through rollout, advantage and update.

Shapes use these letters: P = prompt length of one turn, R = response length of one turn,
K = the widest set of allowed next tokens under constrained decoding, N = number of turn
samples in a batch, L = padded sequence length (prompt + response) of a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from rspo_lightning.choices import ExplorerCredit, OfflineWeighting, RewardMode

Source = Literal["on_policy", "replay"]
PolicyTag = Literal["A", "B"]


@dataclass(frozen=True)
class TaskSpec:
    """What to play: the same spec always yields the same initial state.

    Args:
        env_id: gymnasium id of the environment, e.g. ``"rspo/Household-v0"``.
        split: task split, e.g. ``"train"``, ``"valid_seen"``, ``"valid_unseen"``.
        task_id: index of the task inside the split.
        group_id: id of the group this task seeds; the ``group_size`` trajectories played from
            one spec share it (group-relative advantages compare inside a group only).
    """

    env_id: str
    split: str
    task_id: int
    group_id: int = 0


@dataclass
class Turn:
    """One agent turn = one training sample.

    Args:
        prompt_ids: ``[P]`` int64 token ids of the full prompt (chat template applied).
        response_ids: ``[R]`` int64 token ids exactly as generated (never re-tokenised).
        behaviour_logprobs: ``[R]`` float32 log-probs of ``response_ids`` under the policy that
            generated them, from the temperature-scaled (and, when constrained, renormalised)
            distribution.
        action: the action string sent to ``env.step`` (the parsed action, or the raw text when
            parsing failed).
        valid: False when the action tag was missing/empty or the action was not admissible.
        observation: the observation the prompt was built from (before this turn's action).
        anchor: hashable environment-state key of that observation (GiGPO step groups).
        outcome_reward: outcome reward; non-zero only on the winning (last) turn.
        dense_reward: dense (process) reward of this turn; 0 when no dense source is used.
        privileged: full-state text for an asymmetric critic, or None.
        allowed_ids: ``[R, K]`` int64 allowed next-token ids at each response position under
            constrained decoding, padded with -1; None for free generation.
        progress: the environment's subgoal completion in [0, 1] after this turn's action.
        response_cut: the token budget (``rollout.max_new_tokens``) ended the response before
            ``</action>`` or eos: the action was cut (``rollout/truncated_rate``).
        replay_advantage: for a turn stored in RSPO's replay buffer, its advantage under the
            learner's group-relative estimator over the full collected group with the outcome
            reward (computed at collection); a replayed row trains with it. None elsewhere.
    """

    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    behaviour_logprobs: torch.Tensor
    action: str
    valid: bool
    observation: str
    anchor: str
    outcome_reward: float = 0.0
    dense_reward: float = 0.0
    privileged: str | None = None
    allowed_ids: torch.Tensor | None = None
    progress: float = 0.0
    replay_advantage: float | None = None
    response_cut: bool = False


@dataclass
class Trajectory:
    """One episode played from a TaskSpec.

    Args:
        task: the spec it was played from.
        turns: the turns, in order.
        success: whether the episode was won.
        score: environment score in [0, 1] (e.g. the WebShop reward; 1.0/0.0 for Household).
        task_type: task family, used for per-type metrics.
        source: ``"on_policy"`` (played this iteration) or ``"replay"`` (from the buffer).
        policy_tag: ``"A"`` (outcome learner) or ``"B"`` (dense explorer) played it.
        iteration: the RL iteration in which it was played.
        truncated: the episode hit ``max_steps`` without terminating.
        initial_progress: the environment's ``progress`` right after reset (dense-reward origin).
        env_error: why the environment failed during this episode (raised, timed out, returned
            garbage); None for a clean episode. Faulty episodes are never trained on.
        joins_online: a replayed trajectory that is compared with the on-policy group of the
            same ``task.group_id`` (RSPO's ``replay_baseline="online"``) instead of its own group.
    """

    task: TaskSpec
    turns: list[Turn] = field(default_factory=list)
    success: bool = False
    score: float = 0.0
    task_type: str = ""
    source: Source = "on_policy"
    policy_tag: PolicyTag = "A"
    iteration: int = 0
    truncated: bool = False
    initial_progress: float = 0.0
    env_error: str | None = None
    joins_online: bool = False

    @property
    def outcome_return(self) -> float:
        """R(tau): the sum of the outcome rewards of all turns."""
        return float(sum(t.outcome_reward for t in self.turns))

    @property
    def num_invalid(self) -> int:
        return sum(not t.valid for t in self.turns)


@dataclass(frozen=True)
class ReplayWeight:
    """How J weighs an iteration's replayed rows against its on-policy rows (docs/algorithms.md).

    Args:
        rule: ``alpha``: J = (1 − α) J_on + α J_off, each part the mean over the iteration's rows
            of its kind (the paper's J); ``tokens``: one pooled mean over all rows (each part
            weighs its share); ``signal``: the ``alpha`` rule with α = the replayed rows' share of
            the iteration's signal-carrying size, recomputed every iteration
            (``rspo.diagnostics.iteration_alpha``).
        alpha: α of the ``alpha`` rule.
    """

    rule: OfflineWeighting = "tokens"
    alpha: float = 0.0


Phase = Literal["train", "explore", "collect", "exploit"]


@dataclass(frozen=True)
class IterationPlan:
    """What one RL iteration does, decided before it starts and read, never changed, by the
    module (RSPOLoop makes one per iteration; without it, the data module's reward settings).

    Args:
        phase: ``train`` (no RSPO), or RSPO's ``explore`` (B trains), ``collect`` (B plays into
            the replay buffer; the module updates nothing) or ``exploit`` (A trains on fresh and
            replayed groups).
        policy_tag: which agent the current weights are (``A`` outcome learner, ``B`` RSPO's
            explorer); recorded in the trajectories played.
        reward_mode: the reward on-policy turns carry for the advantage: ``outcome``, ``dense``
            (``dense_scale`` x the dense reward alone) or ``outcome+dense``; replayed turns always
            carry the outcome reward alone (``batching.flatten``: the reward swap).
        dense_scale: multiplier of the dense reward.
        temperature: sampling (and scoring) temperature of the rollouts; None = the rollout's.
        replay_weight: how J weighs the replayed rows.
        credit: ``trajectory`` (the module's estimator) or ``turn`` (each turn's discounted
            return-to-go normalised over its group, discount ``credit_gamma``).
        credit_gamma: discount of ``credit: turn``.
        replay_share: the share of the iteration's groups (over all ranks) drawn from the replay
            buffer in place of on-policy groups (RSPO's α in ``exploit``; 0: none).
        episodes: episodes already played that the iteration trains on in place of playing its
            tasks (they keep their rewards and cost no environment step); None: play the tasks.
    """

    phase: Phase = "train"
    policy_tag: PolicyTag = "A"
    reward_mode: RewardMode = "outcome"
    dense_scale: float = 1.0
    temperature: float | None = None
    replay_weight: ReplayWeight = ReplayWeight()
    credit: ExplorerCredit = "trajectory"
    credit_gamma: float = 0.9
    replay_share: float = 0.0
    episodes: tuple[Trajectory, ...] | None = None

    @property
    def updates(self) -> bool:
        """Whether the iteration trains (every phase but ``collect``)."""
        return self.phase != "collect"


class IterationBatch:
    """What the data module yields for one RL iteration (rollouts happen in the module): made
    once, never changed (``replace`` makes a changed copy).

    Args:
        tasks: this rank's task specs, one per group (the engine plays each ``group_size`` times).
        group_size: episodes played per task spec (G).
        replay: trajectory groups sampled from the replay buffer (each inner list is one group).
        plan: what the iteration does (phase, agent, reward, temperature, replay weight).
        played: episodes already played that the iteration trains on in place of playing
            ``tasks`` (they cost no environment step and are not logged as its rollouts); None:
            play ``tasks``.

    Deliberately not a dataclass (nor a list or dict): Lightning's ``16-true``/``bf16-true``
    precision plugins rebuild such batches with every float tensor cast to half precision,
    which would round the replayed trajectories' behaviour log-probs (and fails outright on
    the frozen ``TaskSpec``). An object of this class passes through them untouched.
    """

    __slots__ = ("tasks", "group_size", "replay", "plan", "played")

    def __init__(
        self,
        tasks: list[TaskSpec],
        group_size: int = 1,
        replay: list[list[Trajectory]] | None = None,
        plan: IterationPlan = IterationPlan(),
        played: list[Trajectory] | None = None,
    ):
        for name, value in zip(self.__slots__, (list(tasks), group_size, list(replay or ()), plan, played)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"IterationBatch is immutable: batch.replace({name}=...) makes a changed copy")

    def replace(self, **changes) -> IterationBatch:
        return IterationBatch(**{**{k: getattr(self, k) for k in self.__slots__}, **changes})

    def __repr__(self) -> str:
        return (
            f"IterationBatch(tasks={list(self.tasks)!r}, group_size={self.group_size}, replay=<{len(self.replay)} "
            f"groups>, plan={self.plan!r}, played={'None' if self.played is None else f'<{len(self.played)} episodes>'})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IterationBatch) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)


@dataclass
class TrainBatch:
    """Padded tensors for the update; one row per turn sample.

    Rows are LEFT-padded so every response ends at the last column: the logits of the last
    ``T + 1`` positions cover every response (T = longest response), which keeps the
    ``[N, T, V]`` logits small. Response-window tensors ``[N, T]``: column j is absolute
    position ``L - T + j``; a log-prob is stored at the column of the token it scores.

    Args:
        input_ids: ``[N, L]`` prompt + response ids, left-padded.
        attention_mask: ``[N, L]`` 1 on real tokens.
        response_mask: ``[N, T]`` True on response tokens (the tokens trained on).
        behaviour_logprobs: ``[N, T]`` log-probs under the policy that generated the tokens.
        old_logprobs: ``[N, T]`` log-probs under the policy before this update.
        advantages: ``[N]`` per-turn advantage.
        returns: ``[N]`` per-turn return target for a critic (zeros without one).
        clip_scale: ``[N]`` per-turn multiplier of ``algorithm.clip_eps_low/high`` (1.0 = as configured;
            A²TGPO sets it per turn).
        is_replay: ``[N]`` bool, the sample came from the replay buffer.
        value_positions: ``[N]`` column in ``input_ids`` of the last prompt token (critic reads V(s)).
        ref_logprobs: ``[N, T]`` log-probs under the frozen reference model, or None without KL.
        allowed_ids: ``[N, T, K]`` allowed next-token ids of constrained samples (-1 pad), or None.
        old_values: ``[N]`` critic values V(s) before the update (PPO), or None.
        critic_rows: per-row prompt ids of a separate (asymmetric) critic, or None.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    clip_scale: torch.Tensor
    is_replay: torch.Tensor
    value_positions: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    allowed_ids: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    critic_rows: list[list[int]] | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor) -> TrainBatch:
        """Rows ``index`` of every tensor (a minibatch), with padding no row needs trimmed off."""
        kw = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                kw[name] = value[index]
            elif isinstance(value, list):
                kw[name] = [value[i] for i in index.tolist()]
            else:
                kw[name] = value
        if len(index) == 0:
            return TrainBatch(**kw)
        # Left padding every selected row has, and response-window columns no row uses.
        lead = int((kw["attention_mask"].cumsum(-1) == 0).sum(-1).min())
        window = int(kw["response_mask"].sum(-1).max())
        cut = kw["response_mask"].shape[1] - window
        kw["input_ids"] = kw["input_ids"][:, lead:]
        kw["attention_mask"] = kw["attention_mask"][:, lead:]
        kw["value_positions"] = kw["value_positions"] - lead
        for name in ("response_mask", "behaviour_logprobs", "old_logprobs", "ref_logprobs", "allowed_ids"):
            if kw[name] is not None:
                kw[name] = kw[name][:, cut:]
        return TrainBatch(**kw)
