"""Atomic file writes shared by the checkpoint store and result files (no torch, no h5py).

:func:`atomic_write` writes through a hidden temporary file beside the target (``.<name>.<random>.tmp``),
fsyncs it, renames it over the target and fsyncs the directory: a process killed at any moment leaves
either the old file or the complete new one under the final name, never a half-written file. A killed
writer may leave its temporary file behind; :func:`stale_temp_files` finds those (the store sweeps them
when a run is reopened for writing under its lock).

Why every write fsyncs its directory, even when two files of one directory are renamed in a row (a checkpoint,
then the run manifest that lists it): POSIX orders neither renames nor their durability until the directory is
fsynced, so with one directory fsync after both renames a power cut could keep the manifest's rename and lose
the checkpoint's, leaving a manifest that lists a missing file (which the store reports as a damaged run, never
as "not written"). The fsync of the first rename is what makes "listed in the manifest" imply "on disk"; it
is also the cheapest of the four (the file's own fsync has just committed the file system's journal).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "commit", "fsync_dir", "is_temp_name", "stale_temp_files", "temp_beside"]

_TEMP_NAME = re.compile(r"\.(?P<final>.+)\.[A-Za-z0-9_]+\.tmp")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)  # a new file only (not inherited)


def temp_beside(path: str | os.PathLike) -> Path:
    """A new, empty temporary file for the final name ``path`` (hidden, same directory: the rename cannot cross
    file systems), with ordinary permissions (0666 & ~umask, applied by ``open`` itself).

    OSError from creating it is the caller's to report."""
    path = Path(path)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(tmp, _CREATE, 0o666))
        except FileExistsError:
            continue
        return tmp


def commit(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Make the complete temporary file ``tmp`` durable and rename it over ``path``, then make the rename
    durable (module docstring); ``tmp`` is removed if that fails. Returns ``path``."""
    path = Path(path)
    try:
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write(path: str | os.PathLike, write_fn: Callable[[Path], object]) -> Path:
    """Create or replace ``path`` atomically: ``write_fn(tmp)`` writes the whole content to the temporary
    file ``tmp`` (:func:`temp_beside`), which is then fsynced and renamed over ``path`` (:func:`commit`). On any
    exception (also KeyboardInterrupt) the temporary file is removed and ``path`` is untouched. Returns ``path``.

    The parent directory must exist; OSError from creating the temporary file is the caller's to report.
    """
    tmp = temp_beside(path)
    try:
        write_fn(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return commit(tmp, path)


def is_temp_name(name: str, final: str | None = None) -> bool:
    """Whether ``name`` is a temporary file of :func:`atomic_write` (for the final name ``final``, if given)."""
    m = _TEMP_NAME.fullmatch(name)
    return m is not None and (final is None or m.group("final") == final)


def stale_temp_files(directory: str | os.PathLike, finals: Callable[[str], bool] = lambda _: True) -> list[Path]:
    """Temporary files of :func:`atomic_write` in ``directory`` whose final name satisfies ``finals``.

    Only call this where no writer can be active (e.g. under the store's run lock): a live writer's
    temporary file looks exactly like a stale one.
    """
    out = []
    for entry in Path(directory).iterdir():
        m = _TEMP_NAME.fullmatch(entry.name)
        if m is not None and finals(m.group("final")) and entry.is_file():
            out.append(entry)
    return sorted(out)


def _fsync(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in ``path`` durable; file systems that cannot fsync a directory are skipped."""
    try:
        _fsync(path)
    except OSError:
        pass
