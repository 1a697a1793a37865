"""Data modules over recorded trajectories (JSONL): ``TrajectoryDataModule`` (one sample = one turn,
for SFT) and ``TrajectoryEpisodeDataModule`` (one sample = one episode, for the process reward model).

Each turn of each trajectory is one sample: its prompt ids and response ids, plus where it came
from (trajectory index, turn index) and the trajectory's outcome, so a process-reward model can
group turns back into episodes. ``collate_turns`` right-pads a batch into ``input_ids``,
``attention_mask`` and ``labels`` (-100 everywhere except response tokens: the loss is on what
the agent said, never on the prompt).
"""

from __future__ import annotations

import os
import random
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from rspo_lightning.trajectory_io import load_trajectories
from rspo_lightning.types import Trajectory

IGNORE_INDEX = -100


def turn_samples(trajectories: list[Trajectory]) -> list[dict[str, Any]]:
    """One dict per turn: ``prompt_ids [P]``, ``response_ids [R]`` and the turn's provenance.

    Keys besides the ids: ``traj_index`` (position in ``trajectories``), ``turn_index``,
    ``num_turns``, ``outcome`` (the trajectory's outcome return R(tau)), ``success``, ``score``,
    ``valid``, ``dense_reward``, ``progress``.
    """
    samples = []
    for i, traj in enumerate(trajectories):
        outcome = traj.outcome_return
        for t, turn in enumerate(traj.turns):
            samples.append(
                {
                    "prompt_ids": turn.prompt_ids.long(),
                    "response_ids": turn.response_ids.long(),
                    "traj_index": i,
                    "turn_index": t,
                    "num_turns": len(traj.turns),
                    "outcome": outcome,
                    "success": bool(traj.success),
                    "score": float(traj.score),
                    "valid": bool(turn.valid),
                    "dense_reward": float(turn.dense_reward),
                    "progress": float(turn.progress),
                }
            )
    return samples


def collate_turns(samples: list[dict[str, Any]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad turn samples into a batch.

    Returns:
        ``input_ids [B, L]`` prompt + response, right-padded with ``pad_id``;
        ``attention_mask [B, L]`` 1 on real tokens;
        ``labels [B, L]`` = ``input_ids`` on response tokens, -100 on prompt and padding (the HF
        convention: the model at column t-1 predicts ``labels[:, t]``; the loss shifts);
        ``prompt_lengths [B]``, ``turn_end [B]`` (column of each row's last real token, where a
        process-reward head reads the turn), and ``traj_index``, ``turn_index``, ``num_turns``,
        ``outcome``, ``success``, ``score``, ``valid``, ``dense_reward``, ``progress`` ``[B]``.
    """
    if not samples:
        raise ValueError("collate_turns got an empty batch")
    lengths = [len(s["prompt_ids"]) + len(s["response_ids"]) for s in samples]
    width = max(lengths)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    for i, s in enumerate(samples):
        p, r = len(s["prompt_ids"]), len(s["response_ids"])
        input_ids[i, :p] = s["prompt_ids"]
        input_ids[i, p : p + r] = s["response_ids"]
        attention_mask[i, : p + r] = 1
        labels[i, p : p + r] = s["response_ids"]
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "prompt_lengths": torch.tensor([len(s["prompt_ids"]) for s in samples], dtype=torch.long),
        "turn_end": torch.tensor(lengths, dtype=torch.long) - 1,
    }
    for key, dtype in (
        ("traj_index", torch.long),
        ("turn_index", torch.long),
        ("num_turns", torch.long),
        ("outcome", torch.float32),
        ("success", torch.bool),
        ("score", torch.float32),
        ("valid", torch.bool),
        ("dense_reward", torch.float32),
        ("progress", torch.float32),
    ):
        batch[key] = torch.tensor([s[key] for s in samples], dtype=dtype)
    return batch


class _ListDataset(Dataset):
    def __init__(self, items: list):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


class _Collate:
    """Picklable ``collate_turns`` with a fixed pad id (DataLoader workers pickle it)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, samples):
        return collate_turns(samples, self.pad_id)


class TrajectoryDataModule(pl.LightningDataModule):
    """Per-turn samples (prompt ids, response ids, outcome) from trajectory JSONL files.

    Args:
        train_path: JSONL file of trajectories (``rspo_lightning.trajectory_io.save_trajectories``,
            or ``python -m rspo_lightning.demos expert ... --out FILE``).
        val_path: JSONL file of validation trajectories; None = hold out ``val_fraction`` of
            ``train_path``'s trajectories.
        batch_size: turn samples per batch.
        val_fraction: share of the training trajectories held out for validation when
            ``val_path`` is None (split by trajectory, so no episode is in both); 0 = no validation.
        seed: seed of the hold-out split and of the shuffling.
        pad_id: token id written into padding columns (masked out by ``attention_mask`` and
            ``labels``, so any id of the vocabulary works).
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        train_path: str,
        val_path: str | None = None,
        batch_size: int = 32,
        val_fraction: float = 0.05,
        seed: int = 0,
        pad_id: int = 0,
        num_workers: int = 0,
    ):
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1, got {batch_size}")
        if not 0 <= val_fraction < 1:
            raise ValueError(f"data.val_fraction must be in [0, 1), got {val_fraction}")
        for name, path in (("train_path", train_path), ("val_path", val_path)):
            if path is not None and not os.path.isfile(path):
                raise FileNotFoundError(
                    f"data.{name}: {path!r} is not a file; write expert demos with "
                    f"`python -m rspo_lightning.demos expert --out {path} ...` or point it at a saved JSONL"
                )
        self.train_path = train_path
        self.val_path = val_path
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.pad_id = pad_id
        self.num_workers = num_workers
        self.train_trajectories: list[Trajectory] = []
        self.val_trajectories: list[Trajectory] = []
        self.train_samples: list[dict[str, Any]] = []
        self.val_samples: list[dict[str, Any]] = []

    def setup(self, stage: str | None = None) -> None:
        if self.train_samples:
            return
        train = load_trajectories(self.train_path)
        if not any(t.turns for t in train):
            raise ValueError(f"data.train_path: {self.train_path!r} holds no turns")
        if self.val_path is not None:
            val = load_trajectories(self.val_path)
        elif self.val_fraction > 0 and len(train) >= 2:
            order = list(range(len(train)))
            random.Random(self.seed).shuffle(order)
            n_val = min(len(train) - 1, max(1, round(self.val_fraction * len(train))))
            held = set(order[:n_val])
            val = [t for i, t in enumerate(train) if i in held]
            train = [t for i, t in enumerate(train) if i not in held]
        else:
            val = []
        self.train_trajectories, self.val_trajectories = train, val
        self.train_samples, self.val_samples = self.samples(train), self.samples(val)

    def samples(self, trajectories: list[Trajectory]) -> list:
        """What one sample is: a turn (``turn_samples``)."""
        return turn_samples(trajectories)

    def collate_fn(self) -> Any:
        return _Collate(self.pad_id)

    def _loader(self, items: list, shuffle: bool) -> DataLoader:
        gen = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(
            _ListDataset(items),
            batch_size=self.batch_size,
            shuffle=shuffle,
            generator=gen,
            collate_fn=self.collate_fn(),
            num_workers=self.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_samples, shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        return self._loader(self.val_samples, shuffle=False) if self.val_samples else []


class EpisodeBatch:
    """A batch of whole trajectories (``trajectories: list[Trajectory]``).

    Deliberately neither a dataclass nor a sequence: Lightning's device transfer then leaves it
    as it is, so the trajectories stay on the CPU; ``ProcessRewardModule.encode`` tokenises their
    observations, packs and pads them and moves only the resulting tensors.
    """

    __slots__ = ("trajectories",)

    def __init__(self, trajectories: list[Trajectory]):
        self.trajectories = trajectories

    def __len__(self) -> int:
        return len(self.trajectories)


def collate_episodes(trajectories: list[Trajectory]) -> EpisodeBatch:
    """DataLoader ``collate_fn``: trajectories -> ``EpisodeBatch`` (module level: workers pickle it)."""
    if not trajectories:
        raise ValueError("collate_episodes got an empty batch")
    return EpisodeBatch(list(trajectories))


class TrajectoryEpisodeDataModule(TrajectoryDataModule):
    """Whole trajectories (one sample = one episode) from trajectory JSONL files, for the PRM.

    ``TrajectoryDataModule`` shuffles single turns, which scatters an episode over batches; a
    process reward model (``rspo_lightning.prm``) regresses a sum over all turns of an episode,
    so it needs episodes whole. Loading and the by-trajectory hold-out split are
    ``TrajectoryDataModule``'s; only what a sample is differs. Trajectories without turns are
    left out.

    Args:
        train_path: JSONL file of trajectories (``rspo_lightning.trajectory_io.save_trajectories``);
            mix won and lost episodes, or the model has nothing to attribute.
        val_path: JSONL file of validation trajectories; None = hold out ``val_fraction`` of
            ``train_path``'s trajectories.
        batch_size: trajectories per batch.
        val_fraction: share of the training trajectories held out for validation when
            ``val_path`` is None; 0 = no validation.
        seed: seed of the hold-out split and of the shuffling.
        num_workers: DataLoader worker processes.
    """

    def __init__(
        self,
        train_path: str,
        val_path: str | None = None,
        batch_size: int = 8,
        val_fraction: float = 0.05,
        seed: int = 0,
        num_workers: int = 0,
    ):
        super().__init__(
            train_path,
            val_path=val_path,
            batch_size=batch_size,
            val_fraction=val_fraction,
            seed=seed,
            num_workers=num_workers,
        )

    def samples(self, trajectories: list[Trajectory]) -> list:
        return [t for t in trajectories if t.turns]

    def collate_fn(self) -> Any:
        return collate_episodes

    @property
    def train_episodes(self) -> list[Trajectory]:
        return self.train_samples

    @property
    def val_episodes(self) -> list[Trajectory]:
        return self.val_samples
