"""The click command of every registered analysis, generated from its spec
(:mod:`landscape.analyze.registry`): arguments from its input mode, one option per CLI field of the config and
run options, then the runner's options.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import click

from cli.common import echo_json, echo_table, json_option, root_of
from cli.options import (
    CommaList,
    Count,
    DeviceType,
    FieldType,
    FiniteFloat,
    SchedulerAddress,
    Seed,
    SourceName,
    SubsetType,
    add_options,
    data_root_option,
    no_figure_option,
    output_option,
    overwrite_option,
    run_api,
    scheduler_help,
    scheduler_option,
)
from landscape.analyze.registry import Analysis, get
from landscape.bounds import is_seed, scheduler_note
from landscape.options import cli_fields, field_default, flags_of, hints, split_optional


def param_type(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    """click keyword arguments (type / is_flag / multiple) for a config field: a :class:`cli.options.Coerced` type
    made from its annotation and metadata (so the command line converts with the api's and batch specs' one
    coercion, :func:`landscape.options.coerce`)."""
    meta = dict(f.metadata)
    kind = meta.get("kind")
    bounds = {k: meta[k] for k in ("min", "max") if meta.get(k) is not None}
    bounds |= {k: True for k in ("min_open", "max_open") if meta.get(k)}
    members, _ = split_optional(hint)
    base = members[0] if len(members) == 1 else None
    if kind == "subset":
        return {"type": SubsetType(meta)}
    if kind == "device":
        return {"type": DeviceType()}
    if kind in ("model", "data"):  # a registry name, an entry point or code (the registry is read when checked)
        return {"type": SourceName("landscape.data:DATASETS", "landscape.datasets", data=True) if kind == "data"
                else SourceName("landscape.models:MODELS", "landscape.models")}
    if kind in ("directory", "file"):
        return {"type": click.Path(file_okay=kind == "file", dir_okay=kind == "directory")}
    if kind == "json":
        return {"type": FieldType(hint, meta, f.name, name="JSON")}
    if kind == "scheduler":
        return {"type": SchedulerAddress()}
    if kind == "metrics":  # repeatable: --metric REF --metric REF (a reference may hold commas in its JSON)
        return {"type": click.STRING, "multiple": True}
    if kind is None and base is bool:
        return {"is_flag": True}
    if kind is None and base is int:
        return {"type": Seed() if is_seed(f.name) else Count(**bounds)}
    if kind is None and base is float:
        return {"type": FiniteFloat(**bounds)}
    if kind is None and typing.get_origin(base) is tuple:
        number = typing.get_args(base)[0] is float
        return {"type": CommaList(number=number, choices=meta.get("choices"), **bounds)}
    if kind is None and base is str and meta.get("choices"):
        choices = list(meta["choices"])
        choice = FieldType(hint, meta, f.name, name="[" + "|".join(choices) + "]")
        choice.shell_complete = click.Choice(choices).shell_complete  # type: ignore[method-assign]
        return {"type": choice}
    if kind in (None, "text"):
        return {"type": FieldType(hint, meta, f.name)}
    raise TypeError(f"no command-line type for field {f.name!r} annotated {hint}")


def field_option(f: dataclasses.Field, hint: Any):
    """The click option of one config field."""
    meta = f.metadata
    kwargs = param_type(f, hint)
    missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    default = field_default(f)
    if isinstance(default, tuple):
        default = ",".join(str(v) for v in default) if default else None
    if missing or meta.get("required"):
        kwargs["required"] = True  # a field without a default is required everywhere (``prune --remove``)
    elif not kwargs.get("is_flag"):
        kwargs["default"] = default
        kwargs["show_default"] = default not in (None, {})
    if meta.get("envvar"):
        kwargs.update(envvar=meta["envvar"], show_envvar=True)
    if meta.get("metavar"):
        kwargs["metavar"] = meta["metavar"]
    elif isinstance(kwargs.get("type"), FieldType) and kwargs["type"].name.startswith("["):
        kwargs["metavar"] = kwargs["type"].name
    help = scheduler_help(meta["help"]) if meta.get("kind") == "scheduler" else meta.get("help")
    return click.option(*flags_of(f), f.name, help=help or None, **kwargs)


def config_options(cls: type | None) -> list:
    return [] if cls is None else [field_option(f, hints(cls)[f.name]) for f in cli_fields(cls)]


def command(name: str) -> click.Command:
    """The click command of analysis ``name``."""
    spec = get(name)
    arguments = spec.mode.arguments
    variadic = spec.mode.most != len(arguments)
    config_names = [f.name for f in cli_fields(spec.config)]
    run_names = [f.name for f in cli_fields(spec.run_options)] if spec.run_options else []
    runner = []
    if spec.mode.paired:
        runner.append(click.option("--data-from", type=click.Choice(["a", "b"]), default="a", show_default=True,
                                   help="When A and B were trained on different data: evaluate on A's or B's."))
    if spec.has_workers:
        runner.append(click.option("--workers", type=Count(min=1), default=1, show_default=True,
                                   help="Parallel worker processes (spawned, one torch thread each)."))
        runner.append(scheduler_option("Run the parallel parts on this Dask scheduler (workers need the same store "
                                       "path) instead of --workers local processes."))
    runner += [data_root_option, no_figure_option, output_option, overwrite_option, json_option]

    def callback(**kwargs: Any) -> None:
        ctx = click.get_current_context()
        if kwargs.get("scheduler") is None:
            kwargs.pop("scheduler", None)
        refs = [kwargs.pop(arg) for arg, _ in arguments]
        if variadic:
            refs = list(refs[0])
        as_json = kwargs.pop("as_json")
        values = {k: kwargs.pop(k) for k in config_names}
        run_values = {k: kwargs.pop(k) for k in run_names}
        figure = not kwargs.pop("no_figure")
        if kwargs.get("scheduler") is not None:
            from landscape.api.execution import check_parallelism

            check_parallelism(kwargs.get("workers", 1), kwargs["scheduler"])
            click.echo(scheduler_note(kwargs["scheduler"]), err=True)

        def call():
            from landscape.api.runner import run

            config = spec.config(**values)
            return run(name, refs, root=root_of(ctx), config=config, figure=figure, **run_values, **kwargs)

        report(spec, run_api(call), as_json)

    f = add_options(config_options(spec.config) + config_options(spec.run_options) + runner, callback)
    for arg, _ in reversed(arguments):
        f = click.argument(arg, nargs=-1 if variadic else 1)(f)
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
