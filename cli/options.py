"""The click parameter types and shared options of the commands; the types convert through
:func:`landscape.options.coerce`, the one coercion of the api and batch specs too."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import click

from cli.common import in_command, warning_line
from landscape.bounds import COUNT_MAX, SCHEDULER_TIMEOUT_S, SEED_MAX
from landscape.errors import OptionError
from landscape.options import SOURCE_HELP, coerce
from landscape.progress import echo


class Coerced(click.ParamType):
    """A click type converting by :func:`landscape.options.coerce` with ``annotation`` and ``meta``; mixed
    into click's own types so that ``--help`` shows ranges and choices as click does."""

    annotation: Any = str
    meta: dict[str, Any] = {}
    field_name: str = ""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        name = self.field_name or (param.name if param is not None and param.name else "value")
        try:
            return coerce(value, self.annotation, self.meta, name=name)
        except OptionError as exc:
            self.fail(in_command(exc.reason), param, ctx)


class SubsetType(Coerced):
    """``--subset``: an integer count (``500``) or a fraction in (0, 1] (``0.05``)."""

    name = "N|FRACTION"
    # the declared range of its values, as click's number ranges state theirs: counts >= 1 or fractions in (0, 1]
    min, max, min_open, max_open = 0, COUNT_MAX, True, False
    annotation = int | float | None

    def __init__(self, meta: dict[str, Any] | None = None):
        self.meta = {**(meta or {}), "kind": "subset"}
        if self.meta.get("min") is not None:  # counts from this one (0: none, norms)
            self.min, self.min_open = self.meta["min"], False


class _Ranged(Coerced):
    """A click number range whose bounds are also the coercion's."""

    def __init__(self, min: float | None = None, max: float | None = None, min_open: bool = False,
                 max_open: bool = False, **kw: Any):
        super().__init__(min=min, max=max, min_open=min_open, max_open=max_open, **kw)
        self.meta = {"min": min, "max": max, "min_open": min_open, "max_open": max_open}


class Count(_Ranged, click.IntRange):
    """An integer count: ``click.IntRange`` whose maximum defaults to :data:`landscape.bounds.COUNT_MAX`."""

    annotation = int

    def __init__(self, min: int | None = None, max: int | None = COUNT_MAX, **kw: Any):
        super().__init__(min=min, max=COUNT_MAX if max is None else max, **kw)


class Seed(Coerced, click.IntRange):
    """A seed: an integer in [0, 2**63 - 1], the one rule of :mod:`landscape.bounds` for every command."""

    name = "SEED"
    annotation, field_name = int, "seed"

    def __init__(self) -> None:
        super().__init__(min=0, max=SEED_MAX)


class SourceName(click.ParamType):
    """``--model`` / ``--data``: a name of the registry dict ``registry`` (``"landscape.models:MODELS"``), an
    entry point of ``group`` or a code reference (not imported here); for data also tensor files, imagefolder
    and torchvision sets. The registry is read when a value is checked: the option imports no torch."""

    def __init__(self, registry: str, group: str, data: bool = False):
        self.registry, self.group, self.data = registry, group, data
        self.name = "NAME|module:factory|file.py:factory" + ("|FILE.npz|FILE.h5" if data else "")

    def known(self) -> tuple[str, ...]:
        import importlib

        module, attr = self.registry.split(":")
        return tuple(getattr(importlib.import_module(module), attr))

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from landscape import plugins

        text = str(value).strip()
        if text in self.known():
            return text
        if self.data and (text == "imagefolder" or text.lower().endswith((".npz", ".h5", ".hdf5"))):
            return text
        if plugins.is_code_ref(text):
            try:
                plugins.parse(text)
            except plugins.PluginError as exc:
                self.fail(str(exc), param, ctx)
            return text
        if text in plugins.entry_points(self.group):
            return text
        if self.data:
            from landscape.data import torchvision_class

            if torchvision_class(text) is not None:
                return text
        extra = ", imagefolder, a torchvision set by name (svhn, kmnist, ...), FILE.npz|FILE.h5" if self.data else ""
        self.fail(f"{text!r} is not one of {', '.join(self.known())}{extra} or module:factory / file.py:factory",
                  param, ctx)


class DeviceType(Coerced):
    """``--device``: auto, cpu, cuda or cuda:N (whether a GPU is there is checked when it is used)."""

    name = "auto|cpu|cuda[:N]"
    meta = {"kind": "device"}


class FiniteFloat(_Ranged, click.FloatRange):
    """``click.FloatRange`` that also refuses NaN, infinities and magnitudes float32 cannot hold."""

    annotation = float


class CommaList(Coerced):
    """Comma-separated strings (``conv1.*,fc.weight``; each one of ``choices``) or finite floats."""

    def __init__(self, number: bool = False, choices: tuple[str, ...] | None = None, **bounds: Any):
        self.annotation = tuple[float, ...] if number else tuple[str, ...]
        self.meta = {**bounds, "choices": tuple(choices) if choices else None}
        self.item = FiniteFloat(**bounds) if number else None  # the items' type, for --help and introspection
        self.name = ",".join(choices) if choices else ("X,Y,..." if number else "A,B,...")


class FieldType(Coerced):
    """The click type of a config field that is not a number (strings, choices, kinds)."""

    def __init__(self, annotation: Any, meta: dict[str, Any], field_name: str, name: str = "TEXT"):
        self.annotation, self.meta, self.field_name, self.name = annotation, dict(meta), field_name, name


class SchedulerAddress(click.ParamType):
    """``--scheduler``: a Dask scheduler address ``tcp://HOST:PORT``, checked before anything runs."""

    name = "tcp://HOST:PORT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from landscape.api.execution import scheduler_address

        try:
            return scheduler_address(str(value))
        except OptionError as exc:
            self.fail(in_command(exc.reason), param, ctx)


def scheduler_help(help: str) -> str:
    """The help of a ``--scheduler`` option: ``help`` and how long the command waits."""
    return (f"{help} Waits up to {SCHEDULER_TIMEOUT_S} s for the scheduler: a malformed address exits 2, an "
            f"unreachable one exits 1.")


def scheduler_option(help: str) -> Callable:
    """``--scheduler ADDRESS`` of every command that can run on a Dask cluster (batch, analyses)."""
    return click.option("--scheduler", type=SchedulerAddress(), default=None, help=scheduler_help(help))


# the path is checked once, by the runner (landscape.results.check_output_path), from the command line too
output_option = click.option("-o", "--output", type=click.Path(), metavar="FILE", default=None,
                             help="Result HDF5 file to write.")
overwrite_option = click.option("--overwrite", is_flag=True,
                                help="Replace a result already under the default output name (refused without it).")


def add_options(options: list[Callable], func: Callable | None = None) -> Callable:
    """Apply click options in the order listed (first = first in --help); bare or as a decorator factory."""
    def apply(f: Callable) -> Callable:
        for option in reversed(options):
            f = option(f)
        return f

    return apply(func) if func is not None else apply


data_root_option = click.option("--data-root", type=click.Path(file_okay=False), default=None,
                                help=SOURCE_HELP["data_root"])
no_figure_option = click.option("--no-figure", is_flag=True, help="Write the result file only.")


def run_api(fn: Callable[[], Any]) -> Any:
    """Call the library with each warning shown as one ``warning: ...`` line on stderr, naming the flags."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kw: echo(f"warning: {warning_line(message)}")  # above any progress bar
        return fn()
