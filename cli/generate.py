"""The click command of every registered analysis, generated from its spec (:mod:`landscape.analyze.registry`).

Arguments come from the spec's ``inputs`` (``REF_A REF_B``, ``TARGET``, ``TARGETS...``, ``RUNS...``); one
option per CLI field of the config dataclass and of the spec's ``run_options`` (help, choices, flag name and
metavar from the field metadata, the type from the annotation, the default from the field); then the
runner's options (``--data-from`` for pairs, ``--workers``, ``--data-root``, ``--no-figure``, ``-o``,
``--json``). The command calls :func:`landscape.api.runner.run`, prints the spec's rows as a table (its
notes after it) and where the files went; ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import click

from cli.common import echo_json, echo_table, json_option, root_of
from cli.options import (
    CommaList,
    Count,
    DeviceType,
    FiniteFloat,
    Seed,
    SubsetType,
    add_options,
    data_root_option,
    no_figure_option,
    note_scheduler,
    output_option,
    run_api,
    scheduler_option,
)
from landscape.analyze.registry import Analysis, cli_fields, flags_of, get, parallel
from landscape.bounds import is_seed

ARGUMENTS = {"checkpoint": [("ref", 1)], "pair": [("ref_a", 1), ("ref_b", 1)], "pairs": [("runs", -1)], "target": [("target", 1)],
             "targets": [("targets", -1)]}


class Choices(CommaList):
    """A comma list of strings, each one of ``choices``, none repeated."""

    def __init__(self, choices: tuple[str, ...]):
        super().__init__()
        self.choices = tuple(choices)
        self.name = ",".join(choices)

    def convert(self, value: Any, param, ctx) -> tuple:
        items = super().convert(value, param, ctx)
        bad = [v for v in items if v not in self.choices]
        if bad:
            self.fail(f"{value!r}: {bad[0]!r} is not one of {', '.join(self.choices)}", param, ctx)
        if len(set(items)) != len(items):
            self.fail(f"{value!r}: {items[0] if items.count(items[0]) > 1 else 'an item'} is repeated", param, ctx)
        return items


def _base(hint: Any) -> tuple[Any, bool]:
    """The annotation without ``None`` and whether None was allowed."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        return (args[0] if len(args) == 1 else tuple(args)), optional
    return hint, False


def param_type(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """click keyword arguments (type / is_flag) for a config field from its annotation and metadata."""
    meta = f.metadata
    kind = meta.get("kind")
    if kind == "subset":
        return {"type": SubsetType()}
    if kind == "device":
        return {"type": DeviceType()}
    if kind == "text":
        return {"type": click.STRING}
    if kind == "metrics":  # repeatable: --metric REF --metric REF (a reference may hold commas in its JSON)
        return {"type": click.STRING, "multiple": True}
    base, _ = _base(hint)
    bounds = {k: meta[k] for k in ("min", "max") if meta.get(k) is not None}
    for key in ("min_open", "max_open"):
        if meta.get(key):
            bounds[key] = True
    if base is bool:
        return {"is_flag": True}
    if base is int:
        return {"type": Seed() if is_seed(f.name) else Count(**bounds)}
    if base is float:
        return {"type": FiniteFloat(**bounds)}
    if base is str:
        return {"type": click.Choice(list(meta["choices"]))} if meta.get("choices") else {"type": click.STRING}
    if typing.get_origin(base) is tuple:
        item = typing.get_args(base)[0]
        if item is float:
            return {"type": CommaList(number=True, **bounds)}
        return {"type": Choices(meta["choices"]) if meta.get("choices") else CommaList()}
    raise TypeError(f"no command-line type for field {f.name!r} annotated {hint}")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def field_option(f: dataclasses.Field, hint: Any):
    """The click option of one config field."""
    meta = f.metadata
    kwargs = param_type(f, hint)
    default = _default(f)
    if isinstance(default, tuple):
        default = ",".join(str(v) for v in default) if default else None
    if not kwargs.get("is_flag"):
        kwargs["default"] = default
        kwargs["show_default"] = meta.get("show_default", True) if default is not None else False
    if meta.get("metavar"):
        kwargs["metavar"] = meta["metavar"]
    return click.option(*flags_of(f), f.name, help=meta.get("help") or None, **kwargs)


def config_options(cls: type | None) -> list:
    if cls is None:
        return []
    hints = typing.get_type_hints(cls)
    return [field_option(f, hints[f.name]) for f in cli_fields(cls)]


def command(name: str) -> click.Command:
    """The click command of analysis ``name``."""
    spec = get(name)
    config_names = [f.name for f in cli_fields(spec.config)]
    run_names = [f.name for f in cli_fields(spec.run_options)] if spec.run_options else []
    runner = []
    if spec.inputs in ("pair", "pairs"):
        runner.append(click.option("--data-from", type=click.Choice(["a", "b"]), default="a", show_default=True,
                                   help="When A and B were trained on different data: evaluate on A's or B's."))
    if parallel(spec):
        runner.append(click.option("--workers", type=Count(min=1), default=1, show_default=True,
                                   help="Parallel worker processes (spawned, one torch thread each)."))
        runner.append(scheduler_option("Run the parallel parts on this Dask scheduler (workers need the same store "
                                       "path) instead of --workers local processes."))
    runner += [data_root_option, no_figure_option, output_option, json_option]

    def callback(**kwargs: Any) -> None:
        ctx = click.get_current_context()
        if kwargs.get("scheduler") is None:
            kwargs.pop("scheduler", None)
        refs = [kwargs.pop(arg) for arg, _ in ARGUMENTS[spec.inputs]]
        if spec.inputs in ("pairs", "targets"):
            refs = list(refs[0])
        as_json = kwargs.pop("as_json")
        values = {k: kwargs.pop(k) for k in config_names}
        run_values = {k: kwargs.pop(k) for k in run_names}
        figure = not kwargs.pop("no_figure")
        if kwargs.get("scheduler") is not None:
            from landscape.api.execution import check_parallelism

            check_parallelism(kwargs.get("workers", 1), kwargs["scheduler"])
            note_scheduler(kwargs["scheduler"])

        def call():
            from landscape.api.runner import run

            config = spec.config(**values)
            return run(name, refs, root=root_of(ctx), config=config, figure=figure, **run_values, **kwargs)

        report(spec, run_api(call), as_json)

    f = add_options(config_options(spec.config) + config_options(spec.run_options) + runner, callback)
    for arg, nargs in reversed(ARGUMENTS[spec.inputs]):
        f = click.argument(arg, nargs=nargs)(f)
    return click.command(name, help=spec.doc)(f)


def report(spec: Analysis, result: Any, as_json: bool) -> None:
    """Print what the command made: the spec's rows and notes and the files (``--json``: as JSON)."""
    rows = spec.rows(result) if spec.rows is not None else []
    files = [str(result.path)] + ([str(result.csv_path)] if spec.csv else []) + [str(f) for f in result.figures]
    if as_json:
        echo_json({"output": str(result.path), "figures": [str(f) for f in result.figures], "rows": rows,
                   **(spec.details(result) if spec.details is not None else {})})
        return
    echo_table(rows)
    for line in spec.notes(result) if spec.notes is not None else []:
        click.echo(line)
    click.echo("wrote " + ", ".join(files))
