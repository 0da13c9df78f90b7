"""The job-kind spec: what one kind of job (train, phases, prune, align, import, figures, each analysis) is.

One :class:`JobKind` per kind, one line per kind in the registry :mod:`landscape.kinds`. The batch runner, the
command line and ``landscape.api`` look a kind up there instead of branching on its name:

- **options**: the option fields of ``config`` (a dataclass; :meth:`JobKind.option_types` maps each option to its
  annotation, which batch specs check values against), ``arguments`` the ones given positionally (command-line
  arguments, leading api arguments) and ``required`` the ones a batch job must give (its runs are then known
  before anything runs); ``fields`` names the dataclasses whose fields are the options when they are more than
  ``config``'s (``phases``: the training options, then its own), each with the fields it leaves out, in the
  order the command lists them; ``skip`` are fields that are options of the command only (train's ``resume``);
- **build**: options -> the validated configuration (what runs; default ``config(**options)``, its numbers within
  the fields' declared ranges (:func:`landscape.options.check_fields`) and its ``validate()``);
- **run**: ``run(config, *, root, out)`` through ``landscape.api`` (``root`` the store, ``out`` a directory for
  the files the job writes outside the store, or None for the kind's default) -> the kind's result object;
- **command**: what the command runs, when it is not ``run``: ``command(config, *, root, progress, report)``
  (``progress``: True / False turns the progress display on / off, None follows :mod:`landscape.progress`;
  ``report``: prints one line on stderr); ``given``
  checks which options the command line gave (``given(names -> flags)``: train's ``--resume`` takes no others);
- **produces**: options -> the store runs the job writes (a batch links a job that reads one of them after it);
- **outcome**: ``outcome(result, root, out)`` -> (numbers, files): what a batch records of a finished job;
- **rows** / **notes** / **details**: how a command prints what it ran (a table, lines after it, ``--json``).

``api`` is the public function ``landscape.api.<name>`` when the kind has a hand-written one (``train(config,
root=...)``); without it, the api function is generated from the spec. The command is always generated
(:mod:`cli.kinds`). Kinds live in the modules that implement them (the api, the figures) and are found through
the registry :mod:`landscape.kinds`.
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


_CODE = ("run", "build", "produces", "outcome", "options", "rows", "notes", "details", "api", "command", "given")


@dataclass(frozen=True)
class JobKind:
    """One kind of job (see the module docstring for what each field means)."""

    name: str
    config: type
    run: Callable[..., Any]
    doc: str = ""
    arguments: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()  # config fields that are options of the command only (train's ``resume``)
    fields: tuple[tuple[type, tuple[str, ...]], ...] = ()  # (dataclass, fields left out); default: config's
    build: Callable[[dict[str, Any]], Any] | None = None
    produces: Callable[[dict[str, Any]], list[str]] = _no_runs
    outcome: Callable[[Any, Path, Path | None], tuple[dict[str, Any], list[Path]]] = _no_numbers
    options: Callable[[], dict[str, str]] | None = None  # option -> annotation, when not the config's fields
    rows: Callable[[Any], list[dict[str, Any]]] | None = None
    notes: Callable[[Any], list[str]] | None = None
    details: Callable[[Any], dict[str, Any]] | None = None
    api: Callable[..., Any] | None = None
    command: Callable[..., Any] | None = None
    given: Callable[[dict[str, str]], None] | None = None

    def __getattribute__(self, name: str) -> Any:  # code may be named "module:attribute" (imported on first use)
        value = object.__getattribute__(self, name)
        if isinstance(value, str) and name in _CODE:
            from landscape.analyze.registry import load

            return load(value)
        return value

    def option_fields(self) -> list[tuple[type, dataclasses.Field]]:
        """``(dataclass, field)`` of every option of the kind (command-only ones too), in the command's order."""
        return [(cls, f) for cls, left_out in self.fields or ((self.config, ()),)
                for f in dataclasses.fields(cls) if f.name not in left_out]

    def option_types(self) -> dict[str, str]:
        """Option name -> its type annotation (a string, as the dataclass declares it)."""
        if self.options is not None:
            return self.options()
        return {f.name: str(f.type) for _, f in self.option_fields() if f.name not in self.skip}

    def execute(self, config: Any, *, root: Path, progress: bool | None = None,
                report: Callable[[str], None] | None = None) -> Any:
        """What the command runs: ``command`` (with its progress and report lines), else ``run``."""
        if self.command is not None:
            return self.command(config, root=root, progress=progress, report=report)
        return self.run(config, root=root, out=None)

    def configure(self, options: dict[str, Any]) -> Any:
        """The validated configuration for ``options`` (a UsageError, ValueError or TypeError names what is wrong)."""
        if self.build is not None:
            return self.build(dict(options))
        from landscape.options import check_fields

        config = self.config(**options)
        check_fields(config)
        return validated(config)


def fields_of(cls: type, skip: Iterable[str] = ()) -> dict[str, str]:
    """Field name -> annotation string of dataclass ``cls`` (without ``skip``)."""
    return {f.name: str(f.type) for f in dataclasses.fields(cls) if f.name not in set(skip)}


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
