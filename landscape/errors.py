"""Errors a user can act on.

Library code raises subclasses of :class:`LandscapeError` with a one-line message that says what went
wrong and what to do. The CLI prints that line to stderr and exits with ``exit_code`` (1 for failures,
2 for usage errors); it never shows a traceback for these.
"""

from __future__ import annotations

import errno as _errno
import os


def one_line(exc: BaseException) -> str:
    """``error: ...`` material for any exception: a LandscapeError's message, else ``Type: message``; first line
    only (a user's code or a job may raise anything)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, LandscapeError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class LandscapeError(Exception):
    """Base class of every error landscape raises on purpose."""

    exit_code = 1


class UsageError(LandscapeError):
    """Options or arguments that cannot work together (CLI exit code 2)."""

    exit_code = 2


class DataError(LandscapeError):
    """A data set is unknown, missing on disk, or malformed."""


class ModelError(LandscapeError):
    """A model spec is unknown or cannot be built, or a model is unfit for the requested use."""


class CheckpointError(LandscapeError):
    """A checkpoint or reference cannot be resolved, read or written."""


class UnsafeFileError(CheckpointError):
    """A foreign file would need unsafe deserialisation (pickle code execution) to load."""


class IncompatibleError(LandscapeError):
    """Two checkpoints (or a checkpoint and a model) do not have the same tensors."""


class ResultError(LandscapeError):
    """A result file is missing, corrupt or of the wrong kind."""


class NonFiniteError(LandscapeError):
    """A computation met NaN or infinite numbers it cannot go on with (e.g. the weights of a diverged run): a
    failure of the input, not a usage error."""


class OutputPathError(ResultError, UsageError):
    """An output path the command must not write (it would replace a checkpoint or a user's file, lies below a
    file, has a name too long for the file system): a usage error (exit 2), and a :class:`ResultError`."""

    exit_code = 2


class WriteError(LandscapeError, OSError):
    """The system refused a file's bytes: the disk is full (ENOSPC, EDQUOT), the file would pass a size limit
    (EFBIG: the file system's, or ``ulimit -f``), or the device failed (EIO). An :class:`OSError` with the
    system's ``errno`` and ``filename`` (the file meant), and a failure (exit 1) whose one line names the file.
    Raised by :mod:`landscape.atomic` after its temporary file is removed (the file is as it was before the
    write: ``note`` says so); a writer adds what it knows (:meth:`noted`: a run's last checkpoint)."""

    def __init__(self, path: str | os.PathLike, errno: int | None, strerror: str | None, note: str = ""):
        OSError.__init__(self, errno, strerror, os.fspath(path))
        self.note = note

    @property
    def reason(self) -> str:
        """``disk full (<the system's words>)`` for ENOSPC / EDQUOT, else the system's words."""
        words = self.strerror or _errno.errorcode.get(self.errno or 0, "write failed")
        if self.errno in (_errno.ENOSPC, getattr(_errno, "EDQUOT", _errno.ENOSPC)):
            return f"disk full ({words})"
        if self.errno == _errno.EFBIG:
            return f"{words} (over a file size limit: the file system's, or the shell's ulimit -f)"
        return words

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.reason}{self.note}"

    def __reduce__(self):  # OSError pickles its args; a worker's error crosses processes whole
        return type(self), (self.filename, self.errno, self.strerror, self.note)

    def noted(self, note: str) -> WriteError:
        """The same error with ``note`` (``"; ..."``) after the message."""
        return WriteError(self.filename, self.errno, self.strerror, self.note + note)


class PrivacyError(LandscapeError):
    """A privacy accounting request has no solution (e.g. an unreachable target epsilon)."""


class RecipeError(LandscapeError):
    """One or more figure recipes failed; ``made`` holds the recipes that finished (their files are written)."""

    def __init__(self, message: str, made: list | None = None):
        super().__init__(message)
        self.made = made or []
