"""The analysis registry: one :class:`Analysis` spec per analysis, looked up by command name.

Each ``landscape/analyze/<module>.py`` defines ``SPEC = Analysis(...)`` (or several, e.g. ``NTK_SPEC``) and
``landscape/analyze/__init__.py`` names it in one line (``name -> "module:ATTRIBUTE"`` plus the one-line
summary shown by ``landscape --help``), so listing the analyses imports neither torch nor the analyzers.
The api runner (:mod:`landscape.api.runner`) and the CLI generator (:mod:`cli.generate`) read everything
else from the spec: the config dataclass (whose fields carry their command-line options in
``field(metadata=...)``, see :func:`option`), the pure ``compute``, the result class, its figure and the rows
the command prints. See ``docs/ARCHITECTURE.md`` ("How to add an analysis").

This module imports nothing heavy (no torch): ``landscape --help`` goes through it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from landscape.options import build, cli_fields, flag_of

#: What the references of an analysis are and how ``compute`` is called (see :class:`Analysis`).
INPUTS = ("checkpoint", "pair", "pairs", "target", "targets")


@dataclass(frozen=True)
class Analysis:
    """One analysis: everything the runner and the CLI need.

    ``inputs`` says what the command's references are and what ``compute`` receives
    (``landscape.api.resolve.Point`` objects: reference, run, step, epoch, checkpoint, data set, masks):

    - ``"checkpoint"``: one reference; ``compute(point, config) -> result``.
    - ``"pair"``: two references A B; ``compute(a, b, config) -> result``.
    - ``"pairs"``: run globs paired by ``--pairs`` (siblings, all, A:B,...); ``compute(a, b, config, labels)
      -> row`` per pair (in worker processes), then ``collect(rows, config, run_options) -> result``.
    - ``"target"``: one reference; a bare run name means every checkpoint of the run (or the api's ``expand``
      hook decides, see ``hooks``); ``compute(point, config) -> row`` per checkpoint (in worker processes), then
      ``collect(rows, config, run_options) -> result``.
    - ``"targets"``: several references compared (e.g. norms), each expanded as for ``"target"``; optionally
      ``prepare(point, config) -> value`` per checkpoint and ``share(values, config) -> shared`` first (e.g.
      histogram edges common to all), then ``compute(point, config, shared) -> row`` per checkpoint and
      ``collect(groups of rows, config, run_options, refs, shared) -> result``.

    ``hooks`` names the store-side steps the analysis needs from :mod:`landscape.api`, which attaches them under
    the analysis' name (:func:`landscape.api.runner.attach`; a spec never names code above its own layer):
    ``"execute"`` (``execute(resolver, ref, config, run_options, execution, path) -> (result, inputs, attrs)``
    replaces resolve + compute for a ``"checkpoint"`` analysis that needs more than one Point: directions toward
    B, a surface's plane through other checkpoints or a run's trajectory, resumable partial writes to ``path``,
    its own worker payload), ``"expand"`` (``expand(resolver, ref, config) -> (targets, extra inputs)`` for a
    ``"target"`` analysis: clipping's ``--prune-levels`` retrains pruned copies). ``parallel``: the analysis
    has parallel parts although its inputs alone do not say so (an ``execute`` hook with a worker pool); then
    the runner's ``workers`` / ``scheduler`` (:class:`landscape.api.execution.ExecutionOptions`, never part of
    the config) apply. ``stem(refs, config, run_options) -> str`` names the default output when the references
    alone do not (``landscape.refs.slug`` makes a reference a file-name part; the references arrive as text, the
    hooks' ``ref`` as a parsed :class:`landscape.refs.Ref`).

    ``needs`` asks the resolver for more in each Point: ``"init"`` (the run's initial weights),
    ``"manifest"`` (the run's manifest).

    ``run_options``: an optional second dataclass of options that change how the analysis is run but are not
    the analyzer's config (``--pairs``, ``--toward``, ``--no-resume``); its fields carry CLI metadata too and are
    keyword arguments of the api function. ``figure(result, path, title) -> [paths]`` (or ``"module:function"``,
    imported only when drawing) draws the figures beside result file ``path``;
    ``rows(result) -> [dict]`` is what the command prints (and ``--json`` gives as ``rows``); ``details(result)
    -> dict`` adds fields to ``--json`` and ``notes(result) -> [str]`` lines after the table. ``output`` is the
    default file stem (``results/<output>-<A>.h5``). ``csv``: also write the table as CSV beside the HDF5.
    """

    name: str
    config: type
    compute: Callable
    result: type
    inputs: str
    figure: Callable | str | None = None
    rows: Callable | None = None
    collect: Callable | None = None
    run_options: type | None = None
    prepare: Callable | None = None
    share: Callable | None = None
    needs: tuple[str, ...] = ()
    hooks: tuple[str, ...] = ()
    parallel: bool = False
    stem: Callable | None = None
    details: Callable | None = None
    notes: Callable | None = None
    output: str = ""
    csv: bool = False
    doc: str = ""  # the command's --help text (first line + details)
    purpose: str = "evaluate it"  # "<checkpoint> records no data set; cannot <purpose>"

    def __post_init__(self) -> None:
        if self.inputs not in INPUTS:
            raise ValueError(f"Analysis {self.name!r}: inputs must be one of {INPUTS}, got {self.inputs!r}")
        if self.inputs in ("pairs", "target", "targets") and self.collect is None:
            raise ValueError(f"Analysis {self.name!r}: inputs {self.inputs!r} needs collect(rows, config, ...)")
        execution = {"workers", "scheduler"} & {f.name for f in dataclasses.fields(self.config)}
        if execution:
            raise ValueError(f"Analysis {self.name!r}: {', '.join(sorted(execution))} is an execution option of the "
                             "runner (landscape.api.execution.ExecutionOptions), not a config field")
        allowed = {"checkpoint": ("execute",), "target": ("expand",)}.get(self.inputs, ())
        if any(h not in allowed for h in self.hooks):
            raise ValueError(f"Analysis {self.name!r}: inputs {self.inputs!r} takes hooks {allowed}, got {self.hooks}")


# name -> ("module:ATTRIBUTE", summary); filled by landscape/analyze/__init__.py
_LINES: dict[str, tuple[str, str]] = {}


def register(name: str, where: str, summary: str) -> None:
    """Name an analysis: ``where`` is ``"landscape.analyze.<module>:SPEC"``, imported on first :func:`get`."""
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
    module, attr = _LINES[name][0].split(":")
    spec = getattr(importlib.import_module(module), attr)
    if spec.name != name:
        raise ValueError(f"{_LINES[name][0]} is the spec of {spec.name!r}, registered as {name!r}")
    return spec


# ------------------------------------------------------------------------------------ config fields
# Options are declared and coerced by landscape.options (one coercion for the command line, the api and batch
# specs); the names below are re-exported so an analysis module imports Analysis and option from one place.


def flags(cls: type | None) -> Mapping[str, str]:
    """Field name -> command-line flag for every CLI field of ``cls``."""
    return {} if cls is None else {f.name: flag_of(f) for f in cli_fields(cls)}


def check_bounds(config: Any) -> None:
    """Every option field of ``config`` a value its declaration accepts (:func:`landscape.options.coerce_field`:
    the declared range, finite numbers, the seed rule, counts at most ``COUNT_MAX``): for dataclasses that are not
    :class:`landscape.options.Options` (those are checked when made). A violation is one UsageError naming the flag."""
    from landscape.options import coerce_field

    for f in dataclasses.fields(config):
        if "help" in f.metadata or "cli" in f.metadata:
            coerce_field(type(config), f, getattr(config, f.name))


def config_with(cls: type, config: Any, options: Mapping[str, Any]) -> Any:
    """``config`` (or a new ``cls``) with keyword ``options`` replacing fields (:func:`landscape.options.build`:
    coerced and validated once; unknown options are one UsageError)."""
    return build(cls, options, base=config)


def parallel(spec: Analysis) -> bool:
    """Whether the analysis has parallel parts, hence the runner's ``--workers`` and ``--scheduler`` (a Dask
    cluster): inputs with several checkpoints or pairs, or a spec that says so (``parallel=True``)."""
    return spec.inputs not in ("checkpoint", "pair") or spec.parallel
