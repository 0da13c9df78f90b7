"""One writer per run: the per-process, reentrant ``fcntl.flock`` on ``<run>/.lock``."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landscape.errors import CheckpointError

LOCK = ".lock"
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class RunBusyError(CheckpointError):
    """Another process holds a run's write lock (one writer per run)."""


@dataclass(eq=False)
class _FileLock:
    """One ``flock`` this process holds on a run's lock file, shared by every hold of the process."""

    key: str
    fd: int
    inode: int
    holds: int = 1


_LOCKS: dict[str, _FileLock] = {}  # realpath of the lock file -> the lock this process holds on it


def _lock(run_dir: Path, name: str) -> _FileLock:
    """Take (or, in this process, re-enter) the exclusive lock of a run directory; RunBusyError if another
    process holds it. The lock file keeps the holder's pid for that message; it is never removed (removing
    a lock file others may have open would let two processes lock two different files)."""
    key = os.path.realpath(run_dir / LOCK)
    held = _LOCKS.get(key)
    if held is not None:
        try:
            same = os.stat(key).st_ino == held.inode
        except OSError:
            same = False
        if same:
            held.holds += 1
            return held
        del _LOCKS[key]  # the run directory was removed and made again; that entry ends with its holders
    try:
        fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666 & ~_UMASK)
    except OSError as exc:
        raise CheckpointError(f"cannot lock run '{name}' ({key}): {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        except OSError:
            holder = ""
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise RunBusyError(
                f"run '{name}' is being written by another process{pid}; one writer per run: wait for it to end"
            ) from None
        raise CheckpointError(f"cannot lock run '{name}' ({key}): {exc.strerror or exc}") from None
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    lock = _FileLock(key, fd, os.fstat(fd).st_ino)
    _LOCKS[key] = lock
    return lock


def _unlock(lock: _FileLock | None) -> None:
    if lock is None or lock.holds <= 0:
        return
    lock.holds -= 1
    if lock.holds == 0:
        if _LOCKS.get(lock.key) is lock:
            del _LOCKS[lock.key]
        with contextlib.suppress(OSError):
            os.close(lock.fd)
        lock.fd = -1


def _release_holds(hold: list[Any]) -> None:
    """Give back every hold a Run object has (its ``_hold`` = [lock, count])."""
    while hold[1] > 0:
        hold[1] -= 1
        _unlock(hold[0])


def _forget_locks_in_child() -> None:
    """A forked child holds none of its parent's locks: drop (not unlock) the inherited entries."""
    for lock in _LOCKS.values():
        with contextlib.suppress(OSError):
            os.close(lock.fd)
        lock.fd, lock.holds = -1, 0
    _LOCKS.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)
