"""Every numeric option of every command, fed 0, -1, nan, inf and 1e39: exit 2 with one ``error:`` line.

The commands are found by walking the click tree of ``cli.main.cli`` (hand-written and generated from the
analysis registry alike), so a new command or option is covered without touching this file. Whether 0 or -1
is a legal value comes from the option's declared range (``min``/``max``/``min_open``/``max_open`` of its
click type); those values are skipped, every other one must be refused by click before any work, so each
case runs in-process in milliseconds.
"""

from __future__ import annotations

import math

import click
import pytest

from cli.main import cli, main
from cli.options import CommaList, SubsetType

VALUES = ("0", "-1", "nan", "inf", "1e39")


def walk(command: click.Command, path: tuple[str, ...] = ()):
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from walk(command.get_command(ctx, name), (*path, name))


def bounds(kind: click.ParamType) -> tuple | None:
    """``(min, max, min_open, max_open)`` of a numeric click type; None when it is not numeric."""
    if isinstance(kind, CommaList):
        return bounds(kind.item) if kind.item is not None else None
    if not isinstance(kind, (click.types.IntParamType, click.types.FloatParamType, SubsetType)):
        return None
    return tuple(getattr(kind, k, None) for k in ("min", "max", "min_open", "max_open"))


def legal(value: float, lo, hi, lo_open, hi_open) -> bool:
    if not math.isfinite(value):
        return False
    if lo is not None and (value < lo or (lo_open and value == lo)):
        return False
    return not (hi is not None and (value > hi or (hi_open and value == hi)))


def cases():
    for path, command in walk(cli):
        for param in command.params:
            if not isinstance(param, click.Option) or (b := bounds(param.type)) is None:
                continue
            for value in VALUES:
                if value in ("0", "-1") and legal(float(value), *b):
                    continue
                yield pytest.param(path, command, param, value, id=f"{' '.join(path) or 'landscape'} "
                                                                   f"{param.opts[0]} {value}")


CASES = list(cases())


def test_the_walk_finds_the_commands_and_their_numeric_options():
    names = {" ".join(c.values[0]) for c in CASES}
    # hand-written, generated (registry) and nested commands, and the group's own --threads
    assert {"", "train", "phases", "privacy", "interpolate", "surface", "instability", "ntk"} <= names
    assert len(CASES) > 150


@pytest.mark.parametrize("path, command, param, value", CASES)
def test_bad_number_is_one_usage_line(tmp_path, capsys, path, command, param, value):
    # the bad option first, so click converts it before anything else; one dummy value per argument
    arguments = ["x" for p in command.params if isinstance(p, click.Argument)]
    if path:
        argv = ["--root", str(tmp_path), *path, f"{param.opts[0]}={value}", *arguments]
    else:
        argv = [param.opts[0], value, "--root", str(tmp_path), "show", "x"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert exit_.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert param.opts[0] in lines[0] or param.name in lines[0], err
