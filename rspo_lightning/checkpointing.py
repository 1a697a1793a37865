"""Checkpoints as a Lightning user meets them: crash-safe writes, corruption found at load, and
saves counted in RL iterations in a place the next run finds.

- ``AtomicCheckpointIO``: writes ``<path>.tmp-<pid>`` in the checkpoint's own directory, fsyncs
  it, renames it over ``<path>`` (atomic on one filesystem, wherever ``$TMPDIR`` is), then writes a
  ``<path>.sha256`` sidecar the same way. A crash mid-write leaves the previous file intact and
  the next save removes the orphan; a full disk raises naming the file and leaves no truncated
  file under a checkpoint name. A load checks the sidecar (a flipped byte is caught) and turns
  every unreadable-file error into one ``CheckpointError`` naming the file, what is wrong, and
  the other checkpoints in its directory.
- ``IterationCheckpoint``: a ``ModelCheckpoint`` whose directory is ``<save_dir>/<name>/checkpoints``
  of the first logger (no ``version_N``: the next run finds ``last.ckpt`` with ``--ckpt_path
  last``), saving ``last.ckpt`` every ``every_n_iterations`` RL iterations (iterations without an
  optimizer step included) and ``iteration=<n>.ckpt`` files at epoch ends.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import zipfile
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from rspo_lightning.rewards import StatefulReward
from rspo_lightning.runfiles import file_error_message, remove_stale_temps

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used (missing, truncated, not a checkpoint, corrupted)."""


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_atomic(path: str, write, before_rename=None) -> None:
    """``write(file)`` into a temporary file next to ``path``, fsync, ``before_rename()``, rename over ``path``."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    remove_stale_temps(glob.escape(path) + ".tmp-*")  # left by a run killed mid-write; a live writer's stay
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.remove(tmp)
        except OSError:
            pass
        message = file_error_message(path, exc, "write checkpoint")
        if message is not None:
            raise CheckpointError(
                f"{message}; the previous checkpoint there is untouched: resume with --ckpt_path last"
            ) from exc
        raise
    try:  # make the rename itself durable
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def other_checkpoints(path: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    found = sorted(
        p
        for p in glob.glob(os.path.join(glob.escape(directory), "*.ckpt"))
        if os.path.abspath(p) != os.path.abspath(path)
    )
    return (
        f"use another checkpoint of {directory}: {', '.join(os.path.basename(p) for p in found)}"
        if found
        else f"there is no other checkpoint in {directory}; start without --ckpt_path"
    )


class AtomicCheckpointIO(TorchCheckpointIO):
    """Torch checkpoints written atomically next to their final path, with a SHA-256 sidecar."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        path = str(path)

        def drop_old_sum() -> (
            None
        ):  # once the new file is whole: a kill before its own sum leaves it unchecked, never mismatched
            if os.path.exists(path + ".sha256"):
                os.remove(path + ".sha256")

        _write_atomic(path, lambda f: torch.save(checkpoint, f), before_rename=drop_old_sum)
        digest = file_sha256(path)
        _write_atomic(path + ".sha256", lambda f: f.write(f"{digest}  {os.path.basename(path)}\n".encode()))

    def load_checkpoint(
        self, path, map_location: Any | None = lambda storage, loc: storage, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return load_checkpoint_file(
            str(path), map_location=map_location, weights_only=True if weights_only is None else weights_only
        )

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        if os.path.exists(str(path) + ".sha256"):
            os.remove(str(path) + ".sha256")


# (file, size, mtime, sum) already hashed to its sidecar's sum in this process: the CLI checks a
# checkpoint before Lightning loads it through AtomicCheckpointIO, which would read it all again
_MATCHED_SUMS: set[tuple] = set()


_UNCHECKED: set[str] = set()  # checkpoints loaded without a sidecar (warned once each)


def load_checkpoint_file(
    path: str, map_location: Any = "cpu", weights_only: bool = True, mmap: bool = False
) -> dict[str, Any]:
    """``torch.load`` of a checkpoint, after checking its size and SHA-256 sidecar; every failure is
    a ``CheckpointError`` naming the file, what is wrong and what to use instead. ``mmap``: tensors
    stay in the file until read (what ``export`` uses: the optimizer's states are never loaded)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path} does not exist; {other_checkpoints(path)}")
    if os.path.getsize(path) == 0:
        raise CheckpointError(
            f"checkpoint {path} is empty (0 bytes: a write that never finished); {other_checkpoints(path)}"
        )
    sidecar = path + ".sha256"
    if os.path.isfile(sidecar):
        try:
            with open(sidecar, "rb") as f:
                expected = f.read(4096).decode("ascii").split()[:1]
        except (OSError, UnicodeDecodeError):
            expected = None
        if not expected or len(expected[0]) != 64 or any(c not in "0123456789abcdef" for c in expected[0]):
            raise CheckpointError(
                f"checkpoint {path}: its checksum file {sidecar} is unreadable or holds no SHA-256, so the "
                f"checkpoint cannot be checked; restore the sidecar, delete it to load unchecked, or "
                f"{other_checkpoints(path)}"
            )
        info = os.stat(path)
        stamp = (os.path.realpath(path), info.st_size, info.st_mtime_ns, tuple(expected))
        if expected and stamp not in _MATCHED_SUMS:
            if file_sha256(path) != expected[0]:
                raise CheckpointError(
                    f"checkpoint {path} does not match its checksum {sidecar} (the file changed or is "
                    f"corrupted after it was written); {other_checkpoints(path)}"
                )
            _MATCHED_SUMS.add(stamp)
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; its directory is at the end
        raise CheckpointError(
            f"checkpoint {path} cannot be read as a PyTorch checkpoint (it is no zip archive, which "
            f"torch.save writes: truncated, or another kind of file); {other_checkpoints(path)}"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except Exception as exc:  # truncated zip, random bytes, text, a pickle of forbidden globals
        what = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"checkpoint {path} cannot be read as a PyTorch checkpoint ({type(exc).__name__}: {what}); "
            f"it is truncated, corrupted or not a checkpoint; {other_checkpoints(path)}"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(
            f"checkpoint {path} holds no Lightning checkpoint (no 'state_dict'); {other_checkpoints(path)}"
        )
    if not os.path.isfile(sidecar) and "rspo_iteration" in checkpoint and os.path.realpath(path) not in _UNCHECKED:
        _UNCHECKED.add(os.path.realpath(path))  # ours always have one: it was deleted, or a kill came between the two
        log.warning("checkpoint %s has no checksum file %s: loaded without the check", path, sidecar)
    return checkpoint


COUNTERS = ("iteration", "skipped_steps", "env_steps", "episodes_dropped")


def save_counters(module: Any, checkpoint: dict) -> None:
    """``AgentRLModule``'s loop state beside its weights: the RL iteration, skipped optimizer steps,
    environment steps, dropped episodes, environment errors, a stateful dense reward's state and
    the logger's version."""
    checkpoint.update({f"rspo_{name}": getattr(module, name) for name in COUNTERS})
    checkpoint["rspo_env_errors"] = module.engine.env_errors if module.engine is not None else 0
    if isinstance(module.dense_reward, StatefulReward):
        checkpoint["rspo_dense_reward"] = module.dense_reward.state_dict()
    logger = module.logger if module._trainer is not None else None  # Lightning's Logger: every one has a version
    version = logger.version if logger is not None else None
    if version is not None:  # the log folder a resumed fit continues in (cli.AgentCLI), as the logger names it
        checkpoint["rspo_log_version"] = version if isinstance(version, str) else f"version_{version}"


def load_counters(module: Any, checkpoint: dict) -> None:
    """Put ``save_counters``'s state back (0 where an older checkpoint lacks it), and drop the
    frozen models that checkpoints written before they left the state dict still hold."""
    frozen = ("_ref.", "critic.backbone.") if module.critic_cfg.freeze_backbone else ("_ref.",)
    if "state_dict" in checkpoint:
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith(frozen)}
    for name in COUNTERS:
        setattr(module, name, int(checkpoint.get(f"rspo_{name}", 0)))
    module._restored_env_errors = int(checkpoint.get("rspo_env_errors", 0))
    if "rspo_dense_reward" in checkpoint and isinstance(module.dense_reward, StatefulReward):
        module.dense_reward.load_state_dict(checkpoint["rspo_dense_reward"])
