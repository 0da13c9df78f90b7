"""Errors a user can act on: one line that says what went wrong and what to do, which the command line prints
with ``exit_code`` (1 failure, 2 usage). A message names a parameter with :func:`param`, so that it reads as
the caller wrote it: the Python name from Python, the flag on the command line.
"""

from __future__ import annotations

import errno as _errno
import os
import re
import shlex
from collections.abc import Callable
from typing import Any

_UNSET: Any = object()
# a parameter in a message: NUL name [SOH python-text SOH command-line-text] NUL (see param)
_PARAM = re.compile("\x00([A-Za-z_][A-Za-z0-9_]*)(?:\x01([^\x00\x01]*)\x01([^\x00\x01]*))?\x00")


def _plain(text: str) -> str:
    return text.replace("\x00", "").replace("\x01", "")


def param(name: str, value: Any = _UNSET) -> str:
    """Parameter ``name`` inside an error message, with its ``value`` when given: ``optimizer='sgd'`` from
    Python, ``--optimizer sgd`` on the command line (``True``: the flag alone)."""
    if value is _UNSET:
        return f"\x00{name}\x00"
    if value is True:  # a flag: given on the command line, it is the value
        shown = ""
    else:
        shown = shlex.quote(",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value))
    return f"\x00{name}\x01{_plain(repr(value))}\x01{_plain(shown)}\x00"


def params_in(message: str) -> tuple[str, ...]:
    """The names of the parameters a message written with :func:`param` mentions, in order."""
    return tuple(m.group(1) for m in _PARAM.finditer(message))


def render(message: str, flag: Callable[[str], str] | None = None) -> str:
    """A message written with :func:`param` as Python shows it, or with the flags ``flag(name)`` gives."""
    def one(m: re.Match) -> str:
        name, python, shown = m.groups()
        if flag is None:
            return name if python is None else f"{name}={python}"
        return flag(name) if not shown else f"{flag(name)} {shown}"

    return _PARAM.sub(one, message)


def one_line(exc: BaseException) -> str:
    """The first line of any exception: a LandscapeError's message, else ``Type: message``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, LandscapeError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Rendered:
    """A message that may name parameters (:func:`param`): str() shows their Python names, :attr:`message`
    keeps them for the command line's :func:`render`."""

    @property
    def message(self) -> str:
        """The message as written, parameters kept."""
        return BaseException.__str__(self)

    def __str__(self) -> str:
        return render(self.message)


class LandscapeWarning(_Rendered, UserWarning):
    """A warning whose message may name parameters."""


class LandscapeError(_Rendered, Exception):
    """Base class of every error landscape raises on purpose."""

    exit_code = 1


class UsageError(LandscapeError):
    """Options or arguments that cannot work together (CLI exit code 2)."""

    exit_code = 2


class OptionError(UsageError):
    """A value an option cannot take: ``<name> <reason>``, apart for click, which names the option itself."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{param(name)} {reason}")
        self.name, self.reason = name, reason

    def __reduce__(self):
        return type(self), (self.name, self.reason)


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
    """A computation met NaN or infinite numbers it cannot go on with (the weights of a diverged run)."""


class OutputPathError(ResultError, UsageError):
    """An output path the command must not write (a checkpoint, a user's file, a name too long): exit 2."""

    exit_code = 2


class WriteError(LandscapeError, OSError):
    """The system refused a file's bytes (disk full, a size limit, a failing device): an :class:`OSError` with
    ``errno`` and ``filename``, whose one line names the file; ``note`` says what was kept (:meth:`noted`)."""

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

    @property
    def message(self) -> str:
        return f"cannot write {self.filename}: {self.reason}{self.note}"

    def __str__(self) -> str:
        return self.message

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
