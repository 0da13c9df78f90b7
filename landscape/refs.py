"""Checkpoint references: the one parser of ``PATH.h5`` and ``RUN[@init|@last|@step=N|@epoch=E]``
(docs/ARCHITECTURE.md, "References"), and run names, single safe path components. Torch-free and store-free.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from landscape.errors import UsageError

SYNTAX = "PATH.h5 or RUN[@init|@last|@step=N|@epoch=E]"
SELECTORS = ("init", "last", "step", "epoch")

_RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,+=-]{0,199}")
_SLUG = re.compile(r"[^A-Za-z0-9_.=-]+")


def is_run_name(name: object) -> bool:
    """Whether ``name`` is a valid run name (see :func:`check_run_name`)."""
    return isinstance(name, str) and bool(_RUN_NAME.fullmatch(name)) and not name.endswith(".h5")


def check_run_name(name: str) -> None:
    """Run names are single safe path components: letters, digits and ``_ . , + = -``, not starting with . or -."""
    if not is_run_name(name):
        raise UsageError(
            f"bad run name {name!r}: use 1-200 letters, digits or _ . , + = - "
            "(not starting with '.' or '-', no '/' or '@', not ending in .h5)"
        )


def parse_selector(selector: str) -> tuple[str, int | float | None]:
    """``"init"``, ``"last"``, ``"step=N"`` or ``"epoch=E"`` -> ``(kind, value)``; anything else a UsageError."""
    if selector in ("init", "last"):
        return selector, None
    kind, sep, text = selector.partition("=")
    if sep and kind == "step":
        try:
            step = int(text)
        except ValueError:
            raise UsageError(f"bad selector '@{selector}': the step must be an integer") from None
        if step < 0:
            raise UsageError(f"bad selector '@{selector}': the step must be a non-negative integer")
        return "step", step
    if sep and kind == "epoch":
        try:
            epoch = float(text)
        except ValueError:
            raise UsageError(f"bad selector '@{selector}': the epoch must be a number") from None
        if not math.isfinite(epoch):
            raise UsageError(f"bad selector '@{selector}': the epoch must be a finite number")
        return "epoch", epoch
    raise UsageError(f"bad selector '@{selector}': expected @init, @last, @step=N or @epoch=E")


def run_part(text: str) -> str:
    """``text`` without its selector, unchecked: ``G-*@last`` -> ``G-*`` (a batch scans option values for the
    runs and globs they mention)."""
    return text.partition("@")[0]


def slug(text: str) -> str:
    """Text as a file-name part: ``dir/a.h5`` -> ``a``; characters other than letters, digits and ``_ . = -``
    become ``_`` (``run@step=3`` -> ``run_step=3``)."""
    text = str(text)
    return _SLUG.sub("_", Path(text).stem if text.endswith(".h5") else text).strip("_")


@dataclass(frozen=True)
class Ref:
    """One checkpoint reference: a checkpoint ``file``, or a ``run`` with an optional selector ``at`` (``init``,
    ``last``, ``step``, ``epoch``; None for a bare run name) and its ``value`` (N or E)."""

    run: str | None = None
    file: str | None = None
    at: str | None = None
    value: int | float | None = None

    def __post_init__(self) -> None:
        if (self.run is None) == (self.file is None):
            raise ValueError("a Ref names either a run or a file")
        if self.file is not None and (self.at is not None or self.value is not None):
            raise ValueError("a checkpoint file takes no selector")
        if self.at is not None and self.at not in SELECTORS:
            raise ValueError(f"unknown selector {self.at!r}")
        if (self.value is None) != (self.at in (None, "init", "last")):
            raise ValueError(f"selector {self.at!r} with value {self.value!r}")

    @classmethod
    def parse(cls, text: str | os.PathLike | Ref) -> Ref:
        """The reference ``text`` names (a :class:`Ref` is returned as it is); a one-line UsageError otherwise."""
        if isinstance(text, Ref):
            return text
        if isinstance(text, os.PathLike):
            text = os.fspath(text)
        if not isinstance(text, str):
            raise UsageError(f"a checkpoint reference is a string ({SYNTAX}), got {type(text).__name__}")
        ref = text.strip()
        if not ref:
            raise UsageError(f"empty checkpoint reference; expected {SYNTAX}")
        if ref.endswith(".h5") or os.sep in ref or "/" in ref:
            if not ref.endswith(".h5"):
                raise UsageError(f"bad checkpoint reference '{ref}': expected {SYNTAX}")
            return cls(file=ref)
        name, at, selector = ref.partition("@")
        if at and not selector:
            raise UsageError(f"bad checkpoint reference '{ref}': after '@' give init, last, step=N or epoch=E")
        check_run_name(name)
        if not at:
            return cls(run=name)
        kind, value = parse_selector(selector)
        return cls(run=name, at=kind, value=value)

    @classmethod
    def at_step(cls, run: str, step: int) -> Ref:
        """``RUN@step=N``."""
        return cls(run=run, at="step", value=int(step))

    @property
    def bare(self) -> bool:
        """A run name without a selector (a whole run where an analysis measures along runs, else ``@last``)."""
        return self.run is not None and self.at is None

    @property
    def selector(self) -> str:
        """The selector as text (``last`` for a bare run name); empty for a file."""
        if self.file is not None:
            return ""
        if self.at in ("step", "epoch"):
            return f"{self.at}={_number(self.value)}"
        return self.at or "last"

    @property
    def name(self) -> str:
        """The run, or the file's stem (``dir/a.h5`` -> ``a``): what a table's ``run`` column shows."""
        return self.run if self.run is not None else Path(self.file).stem

    @property
    def label(self) -> str:
        """The run, or the file's path without ``.h5`` and with ``/`` as ``_``: the part of a one-reference
        analysis' default output name (``results/hessian-<label>.h5``)."""
        if self.run is not None:
            return self.run
        return Path(self.file.replace("/", "_").removesuffix(".h5")).name

    @property
    def slug(self) -> str:
        """The reference as a file-name part, selector kept (``run@step=3`` -> ``run_step=3``; ``dir/a.h5`` -> ``a``)."""
        return slug(str(self))

    def __str__(self) -> str:
        if self.file is not None:
            return self.file
        return self.run if self.at is None else f"{self.run}@{self.selector}"


def _number(value: int | float | None) -> str:
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)
