"""The click command of a job kind (:mod:`landscape.kinds`) that has no hand-written one, generated from its spec.

One argument per field the spec names in ``arguments``, one option per other config field with :func:`option`
metadata (help, flag, choices, bounds and type as for an analysis' options: :func:`cli.generate.config_options`),
then ``--json``. The command builds the kind's configuration, runs it through the kind's ``run`` (on the store
of the global ``--root``), prints the spec's ``rows`` as a table and its ``notes`` after it; ``--json`` prints
``details(result)`` (else the rows) as JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cli.common import echo_json, echo_table, json_option, root_of
from cli.generate import deprecated_values
from cli.options import add_options, run_api


def command(name: str) -> click.Command:
    """The generated click command of job kind ``name``."""
    from landscape import kinds

    spec = kinds.get(name)

    def callback(**kwargs: Any) -> None:
        ctx = click.get_current_context()
        as_json = kwargs.pop("as_json")
        kwargs.update(run_api(lambda: deprecated_values(spec.config, kwargs, ctx)))  # a renamed option's old flag
        config = spec.configure(kwargs)
        result = run_api(lambda: spec.run(config, root=Path(root_of(ctx)), out=None))
        rows = spec.rows(result) if spec.rows is not None else []
        if as_json:
            echo_json(spec.details(result) if spec.details is not None else rows)
            return
        if rows:
            echo_table(rows)
        for line in spec.notes(result) if spec.notes is not None else []:
            click.echo(line)

    f = add_options(_field_options(spec.config, spec.arguments) + [json_option], callback)
    for arg in reversed(spec.arguments):
        f = click.argument(arg)(f)
    return click.command(name, help=spec.doc)(f)


def _field_options(cls: type, skip: tuple[str, ...]) -> list:
    """The options of ``cls``'s CLI fields other than ``skip`` (:func:`cli.generate.config_options`' options)."""
    from cli.generate import field_option, old_options
    from landscape.analyze.registry import cli_fields
    from landscape.options import hints

    types_ = hints(cls)
    return [option for f in cli_fields(cls) if f.name not in skip
            for option in [field_option(f, types_[f.name]), *old_options(f, types_[f.name])]]
