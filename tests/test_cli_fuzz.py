"""Every numeric option of every command, fed 0, -1, nan, inf, 1e39, abc and 2**63: exit 2 with one ``error:``
line, no traceback, nothing hangs.

The commands are found by walking the click tree of ``cli.main.cli`` (hand-written and generated from the
analysis registry alike), so a new command or option is covered without touching this file. Whether a value is
legal comes from the option's declared range (``min``/``max``/``min_open``/``max_open`` of its click type:
counts stop at ``landscape.bounds.COUNT_MAX``, seeds at ``SEED_MAX``); legal values are skipped (they would start
real work), every other one must be refused by click before any work, so each case runs in-process in
milliseconds. Options the command line takes as text but the analysis reads as a number (``--distance``,
``--max-memory``, found from the config's annotations) get the same values and must end in one line with exit
0, 1 or 2. Every case runs under an alarm: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import typing

import click
import pytest

from cli.main import cli, main
from cli.options import CommaList, FieldType, SubsetType
from landscape.analyze.registry import get, names
from landscape.options import FLOAT32_MAX

VALUES = ("0", "-1", "nan", "inf", "1e39", "abc", str(2**63))
CASE_SECONDS = 20


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


def legal(text: str, kind: click.ParamType, lo, hi, lo_open, hi_open) -> bool:
    """Whether option type ``kind`` accepts ``text``: an integer for integer types (counts, seeds; a subset count),
    a finite number within float32 for the others, inside the declared range."""
    integer = isinstance(kind, click.types.IntParamType) or (
        isinstance(kind, CommaList) and isinstance(kind.item, click.types.IntParamType)) or (
        isinstance(kind, SubsetType) and text.lstrip("-").isdigit())
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        return False
    if isinstance(kind, SubsetType) and isinstance(value, float):
        return value == value and 0 < value <= 1
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        return False
    if lo is not None and (value < lo or (lo_open and value == lo)):
        return False
    return not (hi is not None and (value > hi or (hi_open and value == hi)))


def numeric_text(path: tuple[str, ...], param: click.Parameter) -> bool:
    """A free-text option of an analysis whose config field holds a number (``float | str``, ``str | int``)."""
    if len(path) != 1 or path[0] not in names() or not isinstance(param.type, FieldType) or param.type.meta.get("choices"):
        return False
    spec = get(path[0])
    for cls in (spec.config, spec.run_options):
        if cls is not None and param.name in {f.name for f in dataclasses.fields(cls)}:
            return bool({int, float} & set(typing.get_args(typing.get_type_hints(cls)[param.name])))
    return False


def cases():
    for path, command in walk(cli):
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            b = bounds(param.type)
            if b is None and not numeric_text(path, param):
                continue
            for value in VALUES:
                if b is not None and legal(value, param.type, *b):
                    continue
                yield pytest.param(path, command, param, value, b is None,
                                   id=f"{' '.join(path) or 'landscape'} {param.opts[0]} {value}")


CASES = list(cases())


def test_the_walk_finds_the_commands_and_their_numeric_options():
    found = {" ".join(c.values[0]) for c in CASES}
    # hand-written, generated (registry) and nested commands, and the group's own --threads
    assert {"", "train", "phases", "privacy", "interpolate", "surface", "instability", "ntk"} <= found
    text = {(" ".join(c.values[0]), c.values[2].opts[0]) for c in CASES if c.values[4]}
    assert {("directions", "--distance"), ("ntk", "--max-memory")} <= text
    assert {c.values[3] for c in CASES} == set(VALUES)
    assert len(CASES) > 700


def _hang(signum, frame):
    raise TimeoutError(f"a fuzz case ran past {CASE_SECONDS} s")


@pytest.fixture
def alarm():
    old = signal.signal(signal.SIGALRM, _hang)
    signal.alarm(CASE_SECONDS)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("path, command, param, value, text", CASES)
def test_bad_number_is_one_usage_line(tmp_path, capsys, alarm, path, command, param, value, text):
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
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning: ")]
    if text:  # a number the analysis parses: refused (2) or, when legal, the dummy reference fails (1)
        assert exit_.value.code in (0, 1, 2), err
        assert len(lines) <= 1 and all(line.startswith("error: ") for line in lines), err
        return
    assert exit_.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert param.opts[0] in lines[0] or param.name in lines[0], err
