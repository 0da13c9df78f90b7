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
from dataclasses import dataclass, field
from typing import Any

from landscape.refs import slug  # noqa: F401 (importable from here as before: the one slug is landscape.refs')

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


def option(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | tuple[str, ...] | None = None,
           choices: tuple | None = None, metavar: str | None = None, min: float | None = None,
           max: float | None = None, min_open: bool = False, max_open: bool = False, kind: str | None = None,
           cli: bool = True, show_default: Any = True, default_factory: Callable | None = None) -> Any:
    """A config dataclass field with its command-line option in the field's metadata.

    The option's type comes from the annotation: ``int``/``float`` (finite; ``min``/``max`` bounds), ``bool``
    (a flag), ``str`` (free, or one of ``choices``), ``tuple[str, ...]``/``tuple[float, ...]`` (a comma list;
    ``choices`` limit the items; ``X | None`` defaults to None). ``kind`` names a special parameter type
    instead (``"device"``, ``"subset"`` for ``int | float | None`` counts or fractions, ``"text"`` for a
    string the config parses itself, ``"metrics"`` for a repeatable ``--metric REF`` of
    :mod:`landscape.metrics`). ``flag`` overrides ``--field-name`` (a tuple adds aliases such as
    ``("--max-grad-norm", "-C")``); ``min_open`` / ``max_open`` make ``min`` / ``max`` exclusive; ``cli=False``
    keeps a field out of the command line (api only).
    """
    meta = {"help": help, "flag": flag, "choices": choices, "metavar": metavar, "min": min, "max": max,
            "min_open": min_open, "max_open": max_open, "kind": kind, "cli": cli, "show_default": show_default}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def cli_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of config dataclass ``cls`` that are command-line options: its own first, then inherited ones
    (``EvaluationOptions``' subset/batch/device options come after an analysis' own)."""
    own = set(cls.__dict__.get("__annotations__", {}))
    fields = [f for f in dataclasses.fields(cls) if f.metadata.get("cli", False)]
    return [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]


def flags_of(f: dataclasses.Field) -> tuple[str, ...]:
    """``("--points",)`` for field ``points``, ``("--bn-recalibrate",)`` for ``bn_recalibrate``, or the metadata's
    flag(s) (``("--max-grad-norm", "-C")``)."""
    flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    return (flag,) if isinstance(flag, str) else tuple(flag)


def flag_of(f: dataclasses.Field) -> str:
    """The main flag of a config field (the first of :func:`flags_of`)."""
    return flags_of(f)[0]


def flags(cls: type | None) -> Mapping[str, str]:
    """Field name -> command-line flag for every CLI field of ``cls``."""
    return {} if cls is None else {f.name: flag_of(f) for f in cli_fields(cls)}


def check_bounds(config: Any) -> None:
    """Every number of ``config`` within its field's declared range (``min``/``max``/``min_open``/``max_open``),
    finite, seeds by the one rule of :mod:`landscape.bounds` and counts at most ``COUNT_MAX``: what the command
    line's types check, for the api and batch specs. A violation is one UsageError line naming the flag."""
    import math

    from landscape.bounds import COUNT_MAX, check_seed, is_seed, subset_value
    from landscape.errors import UsageError

    for f in dataclasses.fields(config):
        value, meta = getattr(config, f.name), f.metadata
        if "min" not in meta or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        flag = flag_of(f)
        if meta.get("kind") == "subset":
            subset_value(value, flag)
            continue
        if is_seed(f.name):
            check_seed(flag, value)
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")
        lo, hi = meta.get("min"), meta.get("max")
        if hi is None and isinstance(value, int) and meta.get("kind") is None:
            hi = COUNT_MAX
        if lo is not None and (value < lo or (meta.get("min_open") and value == lo)):
            raise UsageError(f"{flag} must be {'>' if meta.get('min_open') else '>='} {lo}, got {value}")
        if hi is not None and (value > hi or (meta.get("max_open") and value == hi)):
            raise UsageError(f"{flag} must be {'<' if meta.get('max_open') else '<='} {hi}, got {value}")


def config_with(cls: type, config: Any, options: dict[str, Any]) -> Any:
    """``config`` (or ``cls()``) with keyword ``options`` replacing fields, bounds checked (:func:`check_bounds`);
    a UsageError names unknown options. Configs that check themselves in ``validate()`` (rather than
    ``__post_init__``) are checked here too. The api runner, the hand-written api functions and batch specs use it."""
    from landscape.errors import UsageError

    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    out = dataclasses.replace(config if config is not None else cls(), **options)
    check_bounds(out)
    validate = getattr(out, "validate", None)
    if validate is not None:
        validate()
    return out


def parallel(spec: Analysis) -> bool:
    """Whether the analysis has parallel parts, hence the runner's ``--workers`` and ``--scheduler`` (a Dask
    cluster): inputs with several checkpoints or pairs, or a spec that says so (``parallel=True``)."""
    return spec.inputs not in ("checkpoint", "pair") or spec.parallel
