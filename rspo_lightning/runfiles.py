"""A run folder's safety: temporary files of dead processes only, one writer per run (an advisory
lock the kernel drops when its process dies), and file-system errors named with their fix
whatever exception wraps them (docs/reliability.md)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import shutil
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (ours or another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_owner(path: str) -> int | None:
    """The pid a ``<name>.tmp-<pid>`` file or folder names, or None."""
    _, _, suffix = os.path.basename(path).rpartition(".tmp-")
    return int(suffix) if suffix.isdigit() else None


def remove_stale_temps(pattern: str) -> list[str]:
    """Remove the ``*.tmp-<pid>`` files and folders matching ``pattern`` (a glob) whose process is
    dead (left by a ``kill -9`` mid-write); a live process's, and this process's own, are kept.
    Returns what was removed."""
    removed = []
    for path in glob.glob(pattern):
        pid = temp_owner(path)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def os_error_of(exc: BaseException) -> OSError | None:
    """The first ``OSError`` with an errno in ``exc``'s chain (``__cause__`` / ``__context__``):
    torch wraps a full disk in ``RuntimeError: [enforce fail at inline_container.cc] ...``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def file_error_message(path: str, exc: BaseException, what: str = "write") -> str | None:
    """One line naming ``path``, what went wrong and the fix, for a full disk, a read-only
    folder or a missing parent anywhere in ``exc``'s chain; None for any other error."""
    err = os_error_of(exc)
    if err is None and "unexpected pos" in str(exc):  # torch's zip writer hides ENOSPC when it has no context
        return f"could not {what} {path}: the device is probably full ({exc}); free space and retry"
    if err is None:
        return None
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device to {what} {path}; free space in {folder} (or use another folder) and retry"
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"cannot {what} {path}: {os.strerror(err.errno).lower()} ({folder}); make the folder writable or "
            "choose another (e.g. --trainer.default_root_dir DIR)"
        )
    if err.errno == errno.ENOENT:
        return f"cannot {what} {path}: a folder on its way does not exist ({err.filename or folder}); create it first"
    return None


class RunLock:
    """One writer per run folder: ``fcntl.flock`` on ``.<folder name>.lock`` beside the checkpoint
    folder (inside it, Lightning would call every new run's folder "not empty"), held while the fit
    runs and released by the kernel when its process dies (a ``kill -9`` leaves no stale lock).
    The file holds the owner's pid, for the message a second writer gets."""

    def __init__(self, folder: str | os.PathLike):
        folder = Path(os.path.abspath(folder))
        self.path = folder.parent / f".{folder.name}.lock"
        self._fd: int | None = None
        self.created = False  # whether acquire() made the lock file

    def acquire(self) -> None:
        """Take the lock, or raise ``RunLockedError`` naming the holder and the ways out."""
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunLockedError(
                f"another process (pid {holder}) is writing this run ({self.path.parent}); wait for it to end, or "
                "give this one its own folder: --trainer.logger.init_args.name NAME or --trainer.default_root_dir DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self, discard: bool = False) -> None:
        """Drop the lock; ``discard``: also remove the lock file if this lock created it (a fit that
        wrote nothing leaves no folder behind). Otherwise the file stays: unlinking a lock file
        lets two later processes lock two different files."""
        if self._fd is not None:
            if discard and self.created:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(self._fd)  # closing drops the flock
            self._fd = None


class RunLockedError(RuntimeError):
    """A second writer of one run folder."""
