"""The job-kind spec: what one kind of job is (train, prune, figures, each analysis...), as the batch runner,
the command line and ``landscape.api`` read it from :mod:`landscape.kinds`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CODE = ("run", "build", "produces", "outcome", "options", "rows", "notes", "details", "api", "command", "given")


@dataclass(frozen=True)
class JobKind:
    """One kind of job: its options (the fields of ``config``, or of ``fields``), how it runs (``run(config,
    *, root, out)``; ``command`` when the command runs something else), the store runs it writes
    (``produces``), what a batch records (``outcome`` -> numbers, files) and what the command prints
    (``rows``, ``notes``, ``details``). Code fields may be ``"module:attribute"`` strings."""

    name: str
    config: type
    run: Callable[..., Any]
    doc: str = ""
    arguments: tuple[str, ...] = ()  # the options given positionally
    required: tuple[str, ...] = ()  # the options a batch job must give
    skip: tuple[str, ...] = ()  # config fields that are options of the command only (train's ``resume``)
    fields: tuple[tuple[type, tuple[str, ...]], ...] = ()  # (dataclass, fields left out); default: config's
    build: Callable[[dict[str, Any]], Any] | None = None  # options -> config (default: config(**options))
    produces: Callable[[dict[str, Any]], list[str]] = lambda options: []
    outcome: Callable[[Any, Path, Path | None], tuple[dict[str, Any], list[Path]]] = \
        lambda result, root, out: ({}, [])
    options: Callable[[], dict[str, str]] | None = None  # option -> annotation, when not the config's fields
    rows: Callable[[Any], list[dict[str, Any]]] | None = None
    notes: Callable[[Any], list[str]] | None = None
    details: Callable[[Any], dict[str, Any]] | None = None
    api: Callable[..., Any] | None = None  # the hand-written landscape.api function, if any
    command: Callable[..., Any] | None = None
    given: Callable[[dict[str, str]], None] | None = None  # checks which options the command line gave

    def __getattribute__(self, name: str) -> Any:  # code may be named "module:attribute" (imported on first use)
        value = object.__getattribute__(self, name)
        if isinstance(value, str) and name in _CODE:
            from landscape.analyze.registry import load

            return load(value)
        return value

    def option_fields(self) -> list[tuple[type, dataclasses.Field]]:
        """``(dataclass, field)`` of every option of the kind (command-only ones too), in the command's
        order."""
        return [(cls, f) for cls, left_out in self.fields or ((self.config, ()),)
                for f in dataclasses.fields(cls) if f.name not in left_out]

    def option_types(self) -> dict[str, str]:
        """Option name -> its type annotation (a string, as the dataclass declares it)."""
        if self.options is not None:
            return self.options()
        return {f.name: str(f.type) for _, f in self.option_fields() if f.name not in self.skip}

    def execute(self, config: Any, *, root: Path, progress: bool | None = None,
                report: Callable[[str], None] | None = None) -> Any:
        """What the command runs."""
        if self.command is not None:
            return self.command(config, root=root, progress=progress, report=report)
        return self.run(config, root=root, out=None)

    def configure(self, options: dict[str, Any]) -> Any:
        """The validated configuration for ``options`` (a UsageError, ValueError or TypeError names what is
        wrong)."""
        if self.build is not None:
            return self.build(dict(options))
        from landscape.options import check_fields

        config = self.config(**options)
        check_fields(config)
        return validated(config)


def fields_of(cls: type) -> dict[str, str]:
    """Field name -> annotation string of dataclass ``cls``."""
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def validated(config: Any) -> Any:
    """``config`` after its ``validate()``, when it has one."""
    if hasattr(config, "validate"):
        config.validate()
    return config


def run_option(options: dict[str, Any]) -> list[str]:
    """``produces`` of a kind that writes the one run its ``run`` option names."""
    return [options["run"]] if options.get("run") else []


def run_files(root: Path, *runs: str) -> list[Path]:
    """The files of the store runs ``runs`` at ``root``: what a job that wrote them made."""
    from landscape.store import Store

    return [f for run in runs for f in files_under(Store(root).run(run).path)]


def files_under(directory: Path) -> list[Path]:
    """The files a job wrote under ``directory`` (hidden ones aside: locks, partial writes)."""
    return [p for p in Path(directory).rglob("*") if p.is_file() and not p.name.startswith(".")]
