"""The analysis registry: one :class:`Analysis` spec per command name, and the input modes (what an analysis'
references are). Imports nothing heavy: ``landscape --help`` goes through it."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InputMode:
    """What an analysis' references are: ``(name, help)`` of its positional ``arguments``, ``least`` to
    ``most`` of them (None: any); ``paired``: A and B compared; ``parallel``: a worker pool; ``globs``: run
    names or globs; ``detail_dir``: the run option naming the directory of per-pair result files."""

    arguments: tuple[tuple[str, str], ...]
    least: int
    most: int | None
    paired: bool = False
    parallel: bool = False
    globs: bool = False
    hooks: tuple[str, ...] = ()
    detail_dir: str | None = None


#: The input modes (see :class:`Analysis` for how ``compute`` is called in each).
INPUT_MODES: dict[str, InputMode] = {
    "checkpoint": InputMode((("ref", "A checkpoint reference: RUN@selector or a checkpoint file."),), 1, 1,
                            hooks=("execute",)),
    "pair": InputMode((("ref_a", "Checkpoint A (RUN@selector or a file)."),
                       ("ref_b", "Checkpoint B (RUN@selector or a file).")), 2, 2, paired=True),
    "pairs": InputMode((("runs", "Run names or globs whose checkpoints are paired."),), 0, None, paired=True,
                       parallel=True, globs=True, detail_dir="pair_dir"),
    "target": InputMode((("target", "A checkpoint, or a run name: every checkpoint of the run."),), 1, 1,
                        parallel=True, hooks=("expand",)),
    "targets": InputMode((("targets", "Runs or checkpoints to compare."),), 1, None, parallel=True),
}

#: The fields of :class:`Analysis` that hold code, which a spec may name as ``"module:attribute"`` (imported on
#: first use, so that declaring an analysis, listing it and its ``--help`` import no torch).
CODE = ("compute", "collect", "prepare", "share", "result", "detail", "figure", "rows", "notes", "details", "stem")


@functools.cache
def load(where: str) -> Any:
    """The object a ``"module:attribute"`` string names."""
    module, attr = where.split(":")
    return functools.reduce(getattr, attr.split("."), importlib.import_module(module))


@dataclass(frozen=True)
class Analysis:
    """One analysis: everything the runner and the CLI need. ``inputs`` (one of :data:`INPUT_MODES`) says how
    ``compute`` (and ``collect``, ``prepare``, ``share``) are called: docs/ARCHITECTURE.md, "Flows";
    ``hooks``: store-side steps attached in :mod:`landscape.api`; ``needs``: ``"init"`` / ``"manifest"`` in
    each Point; ``run_options``: how it runs, not what it computes."""

    name: str
    config: type
    compute: Callable | str
    result: type | str
    inputs: str
    figure: Callable | str | None = None
    rows: Callable | str | None = None
    collect: Callable | str | None = None
    run_options: type | None = None
    prepare: Callable | str | None = None
    share: Callable | str | None = None
    detail: type | str | None = None
    needs: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    parallel: bool = False  # parallel parts the inputs do not show
    stem: Callable | str | None = None  # the default output name when the references do not give one
    details: Callable | str | None = None
    notes: Callable | str | None = None
    output: str = ""  # the default file stem
    csv: bool = False  # the table as CSV too
    doc: str = ""  # the command's --help text (first line + details)
    purpose: str = "evaluate it"  # "<checkpoint> records no data set; cannot <purpose>"

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if isinstance(value, str) and name in CODE:
            return load(value)
        return value

    def __post_init__(self) -> None:
        if self.inputs not in INPUT_MODES:
            raise ValueError(f"Analysis {self.name!r}: inputs must be one of {tuple(INPUT_MODES)}, got {self.inputs!r}")
        if self.mode.parallel and object.__getattribute__(self, "collect") is None:
            raise ValueError(f"Analysis {self.name!r}: inputs {self.inputs!r} needs collect(rows, config, ...)")
        if self.inputs == "pairs" and object.__getattribute__(self, "detail") is None:
            raise ValueError(f"Analysis {self.name!r}: inputs 'pairs' needs detail, the per-pair result class")
        execution = {"workers", "scheduler"} & {f.name for f in dataclasses.fields(self.config)}
        if execution:
            raise ValueError(f"Analysis {self.name!r}: {', '.join(sorted(execution))} is an execution option of the "
                             "runner (landscape.api.execution.ExecutionOptions), not a config field")
        if any(h not in self.mode.hooks for h in self.hooks):
            raise ValueError(f"Analysis {self.name!r}: inputs {self.inputs!r} takes hooks {self.mode.hooks}, "
                             f"got {self.hooks}")

    @property
    def mode(self) -> InputMode:
        return INPUT_MODES[self.inputs]

    @property
    def has_workers(self) -> bool:
        """Whether the analysis has parallel parts, hence the runner's ``--workers`` and ``--scheduler``."""
        return self.mode.parallel or self.parallel


# name -> ("module:ATTRIBUTE", summary); filled by landscape/analyze/__init__.py
_LINES: dict[str, tuple[str, str]] = {}


def register(name: str, where: str, summary: str) -> None:
    """Name an analysis: ``where`` is ``"module:ATTRIBUTE"`` of its spec, imported on first :func:`get`."""
    if name in _LINES and _LINES[name][0] != where:
        raise ValueError(f"analysis {name!r} is registered twice ({_LINES[name][0]} and {where})")
    _LINES[name] = (where, summary)


def names() -> list[str]:
    """Registered analysis names, sorted."""
    return sorted(_LINES)


def summary(name: str) -> str:
    """The one-line summary of an analysis (no import of the analyzer)."""
    return _LINES[name][1]


def get(name: str) -> Analysis:
    """The spec of analysis ``name`` (its module is imported now)."""
    if name not in _LINES:
        raise KeyError(f"no analysis named {name!r}; known: {', '.join(names())}")
    spec = load(_LINES[name][0])
    if spec.name != name:
        raise ValueError(f"{_LINES[name][0]} is the spec of {spec.name!r}, registered as {name!r}")
    return spec
