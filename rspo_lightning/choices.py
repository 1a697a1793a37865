"""Every configuration choice of the package as one ``Literal`` type, the single source of its
values: jsonargparse turns a ``Literal`` annotation into the choices of ``--help`` and a parse
error that lists them, and ``check`` gives code called from Python the same message.

A module that validates a choice imports its type from here (``values(LossAgg)`` for the
tuple); nothing retypes the strings.
"""

from __future__ import annotations

from typing import Literal, get_args

# -- the update (config.AlgorithmConfig, losses.py) ---------------------------------------------
Estimator = Literal["grpo", "rloo", "gae", "gigpo", "proxmo", "a2tgpo", "turn_return"]  # advantages.ESTIMATORS' keys
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KlEstimator = Literal["k1", "k3", "low_var_kl"]
ClipMode = Literal["additive", "multiplicative"]  # the generalised clip's bounds around its centre
ReplayRegularisers = Literal["exclude", "importance"]
PenaltyAt = Literal["advantage", "reward"]
SwapStrategy = Literal["knn", "bucket", "random"]
LrDecay = Literal["constant", "linear", "cosine"]
GradSync = Literal["auto", "step", "micro_batch"]  # when ranks synchronise gradients (update.ppo_update's no_sync)

# -- the estimators' keywords (advantages.py) ---------------------------------------------------
Norm = Literal["std", "mean"]
EpisodeStats = Literal["trajectory", "steps"]
AdaptiveClip = Literal["signal", "inverse_advantage"]  # A²TGPO's per-turn clip scale (was its clip_mode)

# -- rollout, critic, vLLM ----------------------------------------------------------------------
Backend = Literal["hf", "vllm"]
CriticKind = Literal["shared", "separate"]
VllmDtype = Literal["auto", "float32", "bfloat16", "float16"]
VllmConstraint = Literal["trie", "choice"]

# -- the reward a turn carries (batching.flatten, data.reward_mode) -----------------------------
RewardMode = Literal["outcome", "dense", "outcome+dense"]

# -- RSPO (rspo/loop.py, rspo/buffer.py) --------------------------------------------------------
ExplorerReward = Literal["dense", "outcome+dense", "outcome"]  # B's reward_mode ("outcome": RSPO_O)
ReplayFrom = Literal["explorer", "history", "both"]
BufferFrom = Literal["collect", "explore+collect"]
ExplorerCredit = Literal["trajectory", "turn"]
ReplayBaseline = Literal["collected", "online"]
# J = (1 - α) J_on + α J_off with the fixed α, one pooled token-mean, or α = the replay's share of the signal
OfflineWeighting = Literal["alpha", "tokens", "signal"]
Sampling = Literal["reward", "random", "variance"]
ReplayUnit = Literal["trajectory", "group"]
# what a replay slot may take: any item with signal, only items with a positive advantage (unfilled
# slots go back to on-policy groups), or positive items drawn again until the slots are full
ReplaySlots = Literal["signal", "positive", "positive_repeat"]


def values(choice) -> tuple[str, ...]:
    """The values of a ``Literal`` choice, in their declared order."""
    return get_args(choice)


def check(name: str, value: object, choice, hint: str = "") -> None:
    """ValueError naming the key, the accepted values and what was given, unless ``value`` is one."""
    accepted = get_args(choice)
    if value not in accepted:
        raise ValueError(f"{name} must be one of {list(accepted)}{hint}, got {value!r}")
