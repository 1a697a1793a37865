"""Trajectories on disk (JSONL).

File format: one JSON object per line, one trajectory per object. Every field of
``Trajectory`` and ``Turn`` is stored; tensors become lists (int64 ids as ints, float32
log-probs as floats, which JSON holds exactly), ``TaskSpec`` becomes a dict. With a tokenizer,
``save_trajectories`` also writes each turn's decoded ``prompt_text`` / ``response_text`` for
people reading the file; loading ignores them (the ids are the data).

Expert demonstrations and recorded rollouts (their command line, ``python -m
rspo_lightning.demos``) are in ``rspo_lightning.demos``; this module needs no env, policy or
rollout engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, fields
from typing import Any

import torch

from rspo_lightning.types import TaskSpec, Trajectory, Turn

FORMAT_VERSION = 1

_TURN_TENSORS = {"prompt_ids": torch.long, "response_ids": torch.long, "behaviour_logprobs": torch.float32}
_TURN_FIELDS = tuple(f.name for f in fields(Turn))
_TRAJ_FIELDS = tuple(f.name for f in fields(Trajectory))


# --------------------------------------------------------------------------- (de)serialise


def _tensor_to_list(value: torch.Tensor) -> list:
    return value.detach().cpu().tolist()


def turn_to_dict(turn: Turn, tokenizer=None) -> dict[str, Any]:
    """A JSON-ready dict of every ``Turn`` field (plus decoded texts when a tokenizer is given)."""
    out: dict[str, Any] = {}
    for name in _TURN_FIELDS:
        value = getattr(turn, name)
        out[name] = _tensor_to_list(value) if isinstance(value, torch.Tensor) else value
    if tokenizer is not None:
        out["prompt_text"] = tokenizer.decode(turn.prompt_ids.tolist())
        out["response_text"] = tokenizer.decode(turn.response_ids.tolist())
    return out


def turn_from_dict(data: dict[str, Any]) -> Turn:
    """Inverse of ``turn_to_dict`` (decoded texts are ignored)."""
    kw = {k: v for k, v in data.items() if k in _TURN_FIELDS}
    missing = {
        "prompt_ids",
        "response_ids",
        "behaviour_logprobs",
        "action",
        "valid",
        "observation",
        "anchor",
    } - kw.keys()
    if missing:
        raise ValueError(f"turn is missing fields {sorted(missing)}")
    for name, dtype in _TURN_TENSORS.items():
        kw[name] = torch.tensor(kw[name], dtype=dtype)
    if kw.get("allowed_ids") is not None:
        allowed = kw["allowed_ids"]
        # An empty [R, 0] tensor serialises as R empty lists; keep its shape.
        kw["allowed_ids"] = (
            torch.tensor(allowed, dtype=torch.long)
            if allowed and allowed[0]
            else torch.empty((len(allowed), 0), dtype=torch.long)
        )
    return Turn(**kw)


def trajectory_to_dict(traj: Trajectory, tokenizer=None) -> dict[str, Any]:
    """A JSON-ready dict of every ``Trajectory`` field."""
    out: dict[str, Any] = {"version": FORMAT_VERSION}
    for name in _TRAJ_FIELDS:
        value = getattr(traj, name)
        if name == "task":
            value = asdict(value)
        elif name == "turns":
            value = [turn_to_dict(t, tokenizer) for t in value]
        out[name] = value
    return out


def trajectory_from_dict(data: dict[str, Any]) -> Trajectory:
    """Inverse of ``trajectory_to_dict``."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    version = data.get("version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(f"unsupported trajectory format version {version!r}; this reader knows {FORMAT_VERSION}")
    if "task" not in data:
        raise ValueError("trajectory has no 'task'")
    kw = {k: v for k, v in data.items() if k in _TRAJ_FIELDS}
    kw["task"] = TaskSpec(**kw["task"])
    kw["turns"] = [turn_from_dict(t) for t in kw.get("turns", [])]
    return Trajectory(**kw)


def save_trajectories(path: str, trajectories: Iterable[Trajectory], tokenizer=None, *, append: bool = False) -> int:
    """Write trajectories to ``path`` as JSONL, one per line; returns how many were written.

    Args:
        path: output file (parent directories are created).
        trajectories: what to write.
        tokenizer: when given, each turn also stores ``prompt_text`` / ``response_text`` (for
            people reading the file; ignored by ``load_trajectories``).
        append: add to the end of an existing file instead of overwriting it.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    n = 0
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for traj in trajectories:
            # allow_nan: a -inf log-prob (a token the behaviour policy could not have sampled)
            # must survive; Python's json reads its own NaN/Infinity back.
            f.write(json.dumps(trajectory_to_dict(traj, tokenizer), ensure_ascii=False, allow_nan=True))
            f.write("\n")
            n += 1
    return n


def load_trajectories(path: str) -> list[Trajectory]:
    """Read a JSONL file written by ``save_trajectories``; blank lines are skipped.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a line is not a valid trajectory (the message names the path and line number).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"trajectory file {path!r} does not exist; write one with rspo_lightning.trajectory_io.save_trajectories "
            f"or `python -m rspo_lightning.demos expert ... --out {path}`"
        )
    out: list[Trajectory] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(trajectory_from_dict(json.loads(line)))
            except (ValueError, TypeError, KeyError) as e:  # JSONDecodeError is a ValueError
                raise ValueError(f"{path}:{lineno}: not a valid trajectory line: {e}") from e
    return out
