"""The click command of a job kind (:mod:`landscape.kinds`) that is no analysis, generated from its spec: one
argument per field in ``arguments``, one option per other field with ``option()`` metadata, then ``--json``.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import click

from cli.common import echo_json, echo_table, json_option, root_of
from cli.generate import field_option, param_type
from cli.options import add_options, run_api
from landscape.errors import LandscapeError
from landscape.options import hints, split_optional
from landscape.progress import echo


def command(name: str) -> click.Command:
    """The generated click command of job kind ``name``."""
    from landscape import kinds

    spec = kinds.get(name)
    fields = [(cls, f) for cls, f in spec.option_fields() if f.metadata.get("cli", False)]

    def callback(**kwargs: Any) -> None:
        ctx = click.get_current_context()
        as_json = kwargs.pop("as_json")
        for arg in spec.arguments:  # an argument of any number given none: the field's default
            if kwargs[arg] == ():
                del kwargs[arg]
        if spec.given is not None:
            source = click.core.ParameterSource.COMMANDLINE
            run_api(lambda: spec.given({p.name: p.opts[0] for p in ctx.command.params
                                        if p.name != "as_json" and ctx.get_parameter_source(p.name) == source}))
        config = run_api(lambda: spec.configure(kwargs))
        try:
            result = run_api(lambda: spec.execute(config, root=Path(root_of(ctx)),  # progress: landscape --quiet's
                                                  report=echo))
        except LandscapeError as exc:  # what finished before the error (figures: the recipes made), then the error
            if getattr(exc, "partial", None) is not None:
                _echo_notes(spec, exc.partial)
            raise
        rows = spec.rows(result) if spec.rows is not None else []
        if as_json:
            echo_json(spec.details(result) if spec.details is not None else rows)
            return
        if rows:
            echo_table(rows)
        _echo_notes(spec, result)

    options = [field_option(f, hints(cls)[f.name]) for cls, f in fields if f.name not in spec.arguments]
    f = add_options(options + [json_option], callback)
    by_name = {f.name: (cls, f) for cls, f in spec.option_fields()}
    for arg in reversed(spec.arguments):  # typed by the field's option metadata; a tuple field takes any number
        cls, field = by_name[arg]
        hint = hints(cls)[field.name]
        kwargs = param_type(field, hint) if field.metadata.get("cli", False) else {}
        if typing.get_origin(split_optional(hint)[0][0]) is tuple:
            kwargs = {"nargs": -1}
        f = click.argument(arg, **kwargs)(f)
    return click.command(name, help=spec.doc)(f)


def _echo_notes(spec: Any, result: Any) -> None:
    for line in spec.notes(result) if spec.notes is not None else []:
        click.echo(line)
