"""Options and output helpers shared by the command modules."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence
from typing import Any

import click

from landscape.errors import LandscapeError, LandscapeWarning, render
from landscape.jsonable import to_jsonable


def root_of(ctx: click.Context) -> str:
    """The store root chosen with the global ``--root``."""
    return ctx.find_root().obj["root"]


json_option = click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(to_jsonable(obj), indent=2))


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def echo_table(rows: Sequence[dict[str, Any]]) -> None:
    """Print rows as an aligned plain-text table (to stdout), the first row's keys as columns."""
    if not rows:
        click.echo("(nothing)")
        return
    columns = list(rows[0])
    cells = [[format_value(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def os_error_line(exc: OSError) -> tuple[str, int]:
    """The one line (without ``error:``) and exit code of an OSError no command turned into a landscape error:
    a name too long is a usage error (2), anything else a failure (1) naming the file and its words."""
    name = os.fsdecode(exc.filename) if exc.filename is not None else ""
    shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]}"
    if exc.errno == errno.ENAMETOOLONG:
        return (f"{shown}: file name too long ({len(os.fsencode(name))} bytes; the system allows 255 a name and "
                f"4096 a path)", 2)
    words = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        words = f"disk full ({words})"
    return (f"{shown}: {words}" if shown else words), 1


def command_flags(*commands: click.Command | None) -> dict[str, str]:
    """Parameter name -> how ``commands`` (and their subcommands) spell it (``from_ref`` -> ``--from``)."""
    out: dict[str, str] = {}
    for command in commands:
        if command is None:
            continue
        for p in command.params:
            if isinstance(p, click.Option) and p.name:
                out.setdefault(p.name, next((o for o in p.opts if o.startswith("--")), p.opts[0]))
            elif p.name:
                out.setdefault(p.name, p.human_readable_name)
        if isinstance(command, click.Group):
            for name in command.commands:
                for k, v in command_flags(command.commands[name]).items():
                    out.setdefault(k, v)
    return out


def error_line(exc: LandscapeError | LandscapeWarning, *commands: click.Command | None) -> str:
    """The one line (without ``error:``) of a LandscapeError, each parameter named as ``commands``' flag."""
    return " ".join(_with_flags(exc.message, command_flags(*commands)).splitlines())


def _with_flags(message: str, flags: dict[str, str]) -> str:
    return render(message, lambda name: flags.get(name) or "--" + name.replace("_", "-"))


def in_command(message: str) -> str:
    """A message written with :func:`landscape.errors.param` as the running command shows it (its flags)."""
    ctx = click.get_current_context(silent=True)
    return _with_flags(message, command_flags(*([ctx.command, ctx.find_root().command] if ctx is not None else [])))


def warning_line(message: Warning | str) -> str:
    """A warning as the running command shows it (a LandscapeWarning's parameters as its flags)."""
    return in_command(message.message) if isinstance(message, LandscapeWarning) else str(message)
