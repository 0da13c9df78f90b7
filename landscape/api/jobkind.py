"""The job-kind spec: what one kind of job (train, phases, prune, align, import, figures, each analysis) is.

One :class:`JobKind` per kind, one line per kind in the registry :mod:`landscape.kinds`. The batch runner, the
command line and ``landscape.api`` look a kind up there instead of branching on its name:

- **options**: the fields of ``config`` (a dataclass; :meth:`JobKind.option_types` maps each option to its
  annotation, which batch specs check values against), ``arguments`` the ones given positionally (command-line
  arguments, leading api arguments) and ``required`` the ones a batch job must give (its runs are then known
  before anything runs); ``option_classes`` are further dataclasses whose fields are options too (an analysis'
  run options, the training options of ``phases``), so that their renamed fields' old names are known;
- **build**: options -> the validated configuration (what runs; default ``config(**options)``, its numbers within
  the fields' declared ranges (:func:`landscape.analyze.registry.check_bounds`) and its ``validate()``);
- **run**: ``run(config, *, root, out)`` through ``landscape.api`` (``root`` the store, ``out`` a directory for
  the files the job writes outside the store, or None for the kind's default) -> the kind's result object;
- **produces**: options -> the store runs the job writes (a batch links a job that reads one of them after it);
- **outcome**: ``outcome(result, root, out)`` -> (numbers, files): what a batch records of a finished job;
- **rows** / **notes** / **details**: how a command prints the result (a table, lines after it, ``--json``).

``api`` is the public function ``landscape.api.<name>`` when the kind has a hand-written one (``train(config,
root=...)``); without it, the api function and the command are generated from the spec. Kinds live in the
modules that implement them (the api, the figures) and are found through the registry :mod:`landscape.kinds`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _no_runs(options: dict[str, Any]) -> list[str]:
    return []


def _no_numbers(result: Any, root: Path, out: Path | None) -> tuple[dict[str, Any], list[Path]]:
    return {}, []


@dataclass(frozen=True)
class JobKind:
    """One kind of job (see the module docstring for what each field means)."""

    name: str
    config: type
    run: Callable[..., Any]
    doc: str = ""
    arguments: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()  # config fields that are no option of the kind (train's ``resume``)
    build: Callable[[dict[str, Any]], Any] | None = None
    produces: Callable[[dict[str, Any]], list[str]] = _no_runs
    outcome: Callable[[Any, Path, Path | None], tuple[dict[str, Any], list[Path]]] = _no_numbers
    options: Callable[[], dict[str, str]] | None = None  # option -> annotation, when not the config's fields
    rows: Callable[[Any], list[dict[str, Any]]] | None = None
    notes: Callable[[Any], list[str]] | None = None
    details: Callable[[Any], dict[str, Any]] | None = None
    api: Callable[..., Any] | None = None
    option_classes: tuple[type, ...] = ()  # further dataclasses whose fields are options (phases: TrainConfig)

    def renames(self) -> dict[str, str]:
        """Old option name -> current one, for the renamed fields of ``config`` and ``option_classes`` (the old
        names are accepted for one release with a deprecation line)."""
        from landscape.options import renames

        return {old: new for cls in (self.config, *self.option_classes) if cls is not None
                for old, new in renames(cls).items()}

    def option_types(self) -> dict[str, str]:
        """Option name -> its type annotation (a string, as the dataclass declares it)."""
        if self.options is not None:
            return self.options()
        return fields_of(self.config, skip=self.skip)

    def configure(self, options: dict[str, Any]) -> Any:
        """The validated configuration for ``options`` (a UsageError, ValueError or TypeError names what is wrong)."""
        if self.build is not None:
            return self.build(dict(options))
        from landscape.analyze.registry import check_bounds

        config = self.config(**options)
        check_bounds(config)
        return validated(config)


def fields_of(cls: type, skip: Iterable[str] = ()) -> dict[str, str]:
    """Field name -> annotation string of dataclass ``cls`` (without ``skip``; renamed fields' old names too)."""
    from landscape.options import renames

    skip = set(skip)
    out = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.name not in skip}
    return out | {old: out[new] for old, new in renames(cls).items() if new in out}  # old names, for one release


def validated(config: Any) -> Any:
    """``config`` after its ``validate()`` (when it has one; a ``validate`` returning nothing keeps ``config``)."""
    check = getattr(config, "validate", None)
    checked = check() if check is not None else None
    return checked if isinstance(checked, type(config)) else config


def run_option(options: dict[str, Any]) -> list[str]:
    """``produces`` of a kind that writes the one run its ``run`` option names."""
    return [options["run"]] if options.get("run") else []


def files_under(directory: Path) -> list[Path]:
    """The files a job wrote under ``directory`` (hidden ones aside: locks, partial writes)."""
    return [p for p in Path(directory).rglob("*") if p.is_file() and not p.name.startswith(".")]
