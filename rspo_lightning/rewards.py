"""Dense (process) reward sources (docs/design.md §11).

A dense reward source is any object with ``turn_rewards(trajectory) -> list[float]`` (one value
per turn; the ``DenseReward`` Protocol). ``assign_dense_rewards`` writes them into
``Turn.dense_reward``. The module uses them in two places:

- ``reward_mode = "dense"`` (RSPO's explorer B with ``explorer_reward: dense``): each turn's
  reward is ``dense_scale`` x the dense reward alone, no outcome (``outcome+dense`` adds it);
- A²TGPO's per-turn signal g_t is the turn's dense reward.

Sources here: ``EnvProgressReward`` (progress deltas from the env's ``info["progress"]``),
``NoisyReward`` (Gaussian noise on another source, for the robustness ablation) and
``NoveltyBonus`` (another source plus a bonus for each turn that reaches a state new to its episode). The learned
SPA-RL process reward model is ``ProcessRewardModelReward`` (trained by ``rspo_lightning.prm``).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rspo_lightning.types import Trajectory

if TYPE_CHECKING:
    from rspo_lightning.prm import ProcessRewardModule


@runtime_checkable
class DenseReward(Protocol):
    """A per-turn dense reward source."""

    def turn_rewards(self, trajectory: Trajectory) -> list[float]:
        """One dense reward per turn of ``trajectory``, in turn order."""
        ...


@runtime_checkable
class ReadsTokenIds(Protocol):
    """A dense reward that reads the policy's token ids (a learned one): checked against the
    policy's tokenizer at setup."""

    def check_tokenizer(self, tokenizer) -> None: ...


@runtime_checkable
class StatefulReward(Protocol):
    """A dense reward with state a checkpoint keeps (e.g. ``NoveltyBonus``'s visit counts)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def assign_dense_rewards(source: DenseReward, trajectories: Sequence[Trajectory]) -> None:
    """Write ``source``'s per-turn rewards into ``turn.dense_reward`` of every turn."""
    for traj in trajectories:
        values = source.turn_rewards(traj)
        if len(values) != len(traj.turns):
            raise ValueError(
                f"{type(source).__name__}.turn_rewards returned {len(values)} values for {len(traj.turns)} turns"
            )
        for turn, value in zip(traj.turns, values):
            value = float(value)
            if not math.isfinite(value):
                raise ValueError(f"{type(source).__name__} gave a non-finite dense reward {value!r}")
            turn.dense_reward = value


class EnvProgressReward:
    """r_t = scale * (progress_t - progress_{t-1}), progress_{-1} = the progress right after reset.

    ``progress`` is the env's subgoal completion in [0, 1] (``info["progress"]``), so the dense
    return of an episode telescopes to ``scale * (final progress - initial progress)``.

    Args:
        scale: multiplier of the progress delta.
    """

    def __init__(self, scale: float = 1.0):
        if not math.isfinite(scale):
            raise ValueError(f"EnvProgressReward scale must be finite, got {scale!r}")
        self.scale = scale

    def turn_rewards(self, trajectory: Trajectory) -> list[float]:
        out, previous = [], trajectory.initial_progress
        for turn in trajectory.turns:
            out.append(self.scale * (turn.progress - previous))
            previous = turn.progress
        return out


class NoisyReward:
    """Another dense source plus i.i.d. Gaussian noise N(0, sigma^2) per turn.

    Args:
        base: the dense source whose rewards are perturbed (default: ``EnvProgressReward()``).
        sigma: standard deviation of the noise; 0 returns ``base`` unchanged.
        seed: seed of the noise generator (the sequence of draws is reproducible).
    """

    def __init__(self, base: DenseReward | None = None, sigma: float = 0.1, seed: int = 0):
        if not (sigma >= 0 and math.isfinite(sigma)):
            raise ValueError(f"NoisyReward sigma must be a finite number >= 0, got {sigma!r}")
        self.base = base if base is not None else EnvProgressReward()
        self.sigma = sigma
        self.seed = seed
        self._rng = random.Random(seed)

    def turn_rewards(self, trajectory: Trajectory) -> list[float]:
        return [
            r + (self._rng.gauss(0.0, self.sigma) if self.sigma > 0 else 0.0)
            for r in self.base.turn_rewards(trajectory)
        ]

    def state_dict(self) -> dict:
        return {"rng": self._rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self._rng.setstate(_as_tuple(state["rng"]))


class NoveltyBonus:
    """Another dense source plus ``bonus`` for each turn whose action reaches a state not seen
    earlier in the episode: turn t earns it when ``anchor_{t+1}`` (the state key after its action)
    is none of ``anchor_0 .. anchor_t``. The last turn's next state is not recorded, so it earns
    none (a win is paid by the base's progress). Progress deltas telescope (a B trained on them
    learns "reach progress 0.5 and hold"); this term does not: it pays covering the house, and
    nothing for a loop back to a visited state.

    ``bonus * (max_steps - 1)`` bounds what novelty adds to an episode: keep it below the
    progress gap between a win and a loss (0.5 for pick-and-place) so that a long wandering
    failure cannot out-earn a win (0.03 x 14 = 0.42 in the hard setting's 15 steps).

    Args:
        base: the dense source the bonus is added to (default: ``EnvProgressReward()``).
        bonus: the reward of one turn that reaches a new state, a finite number >= 0.
    """

    def __init__(self, base: DenseReward | None = None, bonus: float = 0.03):
        if not (_is_number(bonus) and 0 <= bonus < float("inf")):
            raise ValueError(f"NoveltyBonus bonus must be a finite number >= 0, got {bonus!r}")
        self.base = base if base is not None else EnvProgressReward()
        self.bonus = float(bonus)

    def turn_rewards(self, trajectory: Trajectory) -> list[float]:
        anchors = [turn.anchor for turn in trajectory.turns]
        seen: set[str] = set()
        out = []
        for t, r in enumerate(self.base.turn_rewards(trajectory)):
            seen.add(anchors[t])
            reaches_new = t + 1 < len(anchors) and anchors[t + 1] not in seen
            out.append(r + self.bonus * reaches_new)
        return out

    def state_dict(self) -> dict:  # the base's state (NoisyReward's generator) travels in checkpoints
        return {"base": self.base.state_dict()} if hasattr(self.base, "state_dict") else {}

    def load_state_dict(self, state: dict) -> None:
        if "base" in state and hasattr(self.base, "load_state_dict"):
            self.base.load_state_dict(state["base"])


def _as_tuple(value):
    """random.Random state survives a checkpoint round trip as lists; setstate needs tuples."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def grounding_bonus(grounding: float | None, success_reward: float, max_steps: int) -> float:
    """The per-valid-turn grounding bonus ``ProcessRewardModelReward`` adds (see its docstring).

    None -> ``success_reward / (2 * max_steps)``; an explicit value is returned as a float once
    ``grounding * max_steps < success_reward`` holds.

    Raises:
        ValueError: ``success_reward`` not a finite number > 0, ``max_steps`` not an integer
            >= 1, ``grounding`` not a finite number or None, or a bonus that lets ``max_steps``
            valid turns earn at least ``success_reward``.
    """
    if not (_is_number(success_reward) and 0 < success_reward < float("inf")):
        raise ValueError(
            f"success_reward must be a finite number > 0 (the env's reward for a win), got {success_reward!r}"
        )
    if not (isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps >= 1):
        raise ValueError(f"max_steps must be an integer >= 1 (the env's episode length cap), got {max_steps!r}")
    if grounding is None:
        return float(success_reward) / (2 * max_steps)
    if not (_is_number(grounding) and abs(grounding) < float("inf")):
        raise ValueError(f"grounding must be a finite number or None, got {grounding!r}")
    if grounding * max_steps >= success_reward:
        raise ValueError(
            f"grounding={grounding} per valid turn over max_steps={max_steps} turns earns {grounding * max_steps:g}, "
            f"not less than success_reward={success_reward}: a failing episode would out-earn a win. Use grounding < "
            f"{success_reward / max_steps:g} (None = success_reward / (2 * max_steps) = {success_reward / (2 * max_steps):g}), "
            f"or pass the env's actual success_reward and max_steps"
        )
    return float(grounding)


GROUNDING_MODES = ("penalty", "bonus")


class ProcessRewardModelReward:
    """Dense reward from a trained SPA-RL progress estimator: r_t = c_t − grounding·[turn t invalid]
    (``grounding_mode: penalty``, default) or c_t + grounding·[turn t valid] (``bonus``, SPA-RL's).

    Implements ``rspo_lightning.rewards.DenseReward``. The model scores the whole trajectory in
    one forward pass; c_t depends on the episode up to action t only.

    Args:
        model: a ``ProcessRewardModule`` (built), a directory written by
            ``ProcessRewardModule.save_pretrained`` (a PRM fit exports ``<log_dir>/prm``), or a
            Lightning ``.ckpt`` of a PRM fit (its ``model.policy.source`` must still exist).
            Loading never runs checkpoint code: weights only, ``trust_remote_code`` as the
            checkpoint's policy config says (off by default).
        grounding: the valid/invalid contrast per turn (``turn.valid``). None (default) =
            ``success_reward / (2 * max_steps)`` (0.1 with the defaults). An explicit value must
            satisfy ``grounding * max_steps < success_reward`` (under ``bonus`` a failing episode
            of valid turns would otherwise out-earn a win even with the outcome in the reward;
            SPA-RL's 0.5 fails this with 10 and 50: 25 >= 10); 0 turns it off.
        grounding_mode: ``penalty`` takes ``grounding`` off each invalid turn: the same per-turn
            contrast as SPA-RL's bonus (r_valid − r_invalid = grounding) shifted by −grounding
            per turn, so episode length earns nothing and a long all-valid failure cannot
            out-earn a short win through it, with or without the outcome in the reward (RSPO's
            ``explorer_reward: dense`` has none). ``bonus`` adds it to each valid turn (SPA-RL);
            RSPOLoop refuses it under ``explorer_reward: dense``.
        success_reward: the env's reward on the winning turn (Household / ALFWorld default 10).
        max_steps: the env's episode length cap (Household / ALFWorld default 50).
        device: where the model runs; None = where it already is (``cpu`` when loaded from disk).
    """

    def __init__(
        self,
        model: ProcessRewardModule | str,
        grounding: float | None = None,
        device: str | None = None,
        success_reward: float = 10.0,
        max_steps: int = 50,
        grounding_mode: str = "penalty",
    ):
        from rspo_lightning.prm import ProcessRewardModule, load_checkpoint  # a model: loaded only when used

        if grounding_mode not in GROUNDING_MODES:
            raise ValueError(
                f"ProcessRewardModelReward grounding_mode must be one of {GROUNDING_MODES}, got {grounding_mode!r}"
            )
        self.grounding = grounding_bonus(grounding, success_reward, max_steps)
        self.grounding_mode = grounding_mode
        if isinstance(model, str):
            if os.path.isdir(model):
                model = ProcessRewardModule.from_pretrained(model)
            elif os.path.isfile(model):
                model = load_checkpoint(model, "cpu")
            else:
                raise FileNotFoundError(
                    f"ProcessRewardModelReward: model={model!r} is neither a save_pretrained directory nor a "
                    f"checkpoint file: set it (--model.dense_reward.init_args.model, or RSPOLoop's dense_reward) to "
                    f"the <log_dir>/prm folder of a PRM fit; train one with `rspo-lightning fit --config "
                    f"configs/<env>/prm.yaml` (README: RSPO with a learned process reward)"
                )
        if not isinstance(model, ProcessRewardModule):
            raise TypeError(
                f"ProcessRewardModelReward needs a ProcessRewardModule or a path, got {type(model).__name__}"
            )
        model.configure_model()
        if device is not None:
            model = model.to(device)
        self.model = model.eval()

    def check_tokenizer(self, tokenizer) -> None:
        """The PRM reads the episodes' token ids, so the policy must tokenize as the PRM's
        tokenizer does; the module calls this at setup (a mismatch would score garbage silently)."""
        mine, theirs = self.model.tokenizer.get_vocab(), tokenizer.get_vocab()
        if mine != theirs:
            differ = len(set(mine.items()) ^ set(theirs.items()))
            raise ValueError(
                f"ProcessRewardModelReward: the PRM's tokenizer ({len(mine)} tokens) is not the policy's "
                f"({len(theirs)} tokens; {differ} (token, id) pairs differ), and the PRM reads the policy's token ids. "
                "Fit the PRM on episodes recorded by a policy with this tokenizer (the same model.policy.source, "
                "or for `tiny` the same env and prompts), as README 'RSPO with a learned process reward' does"
            )

    def turn_rewards(self, trajectory: Trajectory) -> list[float]:
        values = self.model.turn_values([trajectory])[0]
        return [
            c + grounding_term(self.grounding, self.grounding_mode, turn.valid)
            for c, turn in zip(values, trajectory.turns)
        ]


def grounding_term(grounding: float, mode: str, valid: bool) -> float:
    """The grounding part of one turn's PRM reward: −grounding on an invalid turn (``penalty``) or
    +grounding on a valid one (``bonus``)."""
    if mode == "penalty":
        return 0.0 if valid else -grounding
    return grounding if valid else 0.0
