"""Options shared by the commands that need a model and a data set.

``@data_options`` adds ``--data``, ``--data-kwargs``, ``--subset``, ``--data-root`` and ``--download``;
``@model_options`` adds ``--model`` and ``--model-kwargs``. The command receives them as the keyword
arguments ``data, data_kwargs, subset, data_root, download`` and ``model, model_kwargs``, and turns them into
library arguments with :func:`dataset_arguments` / :func:`model_arguments`::

    @click.command()
    @data_options
    @model_options
    def train(data, data_kwargs, subset, data_root, download, model, model_kwargs, ...):
        dataset = load_dataset(**{"seed": seed, **dataset_arguments(data, data_kwargs, subset, data_root, download)})
        name, kwargs = model_arguments(model, model_kwargs)
        net = build_model(name, input_shape=dataset.input_shape, num_classes=dataset.num_classes, **kwargs)

Unknown data set or model names are click usage errors (exit 2); bad options inside the JSON are the
library's DataError / ModelError (exit 1).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cli.common import parse_json_option
from landscape.bounds import COUNT_MAX, SCHEDULER_TIMEOUT_S, SEED_MAX, subset_value
from landscape.runtime import DATA_ENV

_RESERVED_DATA_KEYS = ("name", "subset", "data_root", "download")


class SubsetType(click.ParamType):
    """``--subset``: an integer count (``500``) or a fraction in (0, 1] (``0.05``); the rule is
    :func:`landscape.bounds.subset_value` (batch specs use it too)."""

    name = "N|FRACTION"
    # the declared range of its values, as click's number ranges state theirs: counts >= 1 or fractions in (0, 1]
    min, max, min_open, max_open = 0, COUNT_MAX, True, False

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | float:
        from landscape.errors import UsageError

        try:
            return subset_value(value, "")
        except UsageError as exc:
            self.fail(str(exc).removeprefix(": "), param, ctx)


class Count(click.IntRange):
    """An integer count: ``click.IntRange`` whose maximum defaults to :data:`landscape.bounds.COUNT_MAX`."""

    def __init__(self, min: int | None = None, max: int | None = COUNT_MAX, **kw: Any):
        super().__init__(min=min, max=COUNT_MAX if max is None else max, **kw)


class Seed(click.IntRange):
    """A seed: an integer in [0, 2**63 - 1], the one rule of :mod:`landscape.bounds` for every command."""

    name = "SEED"

    def __init__(self) -> None:
        super().__init__(min=0, max=SEED_MAX)


class SourceName(click.ParamType):
    """``--model`` / ``--data``: a name of the registry dict ``registry`` (``"landscape.models:MODELS"``), an
    installed entry point of ``group``, or a code reference ``module:factory`` / ``file.py:factory``; for data
    also a ``.npz``/``.h5`` tensor file, ``imagefolder`` and torchvision classification sets by name. The
    registry is read when a value is checked, so defining the option imports no torch (``store ls`` needs none);
    code is not imported here (the library does it, once, when it builds)."""

    def __init__(self, registry: str, group: str, data: bool = False):
        self.registry, self.group, self.data = registry, group, data
        self.name = "NAME|module:factory|file.py:factory" + ("|FILE.npz|FILE.h5" if data else "")

    def get_metavar(self, *args: Any, **kwargs: Any) -> str:  # the registry's names in --help, read when shown
        extra = "|imagefolder|FILE.npz|FILE.h5" if self.data else ""
        return f"[{'|'.join(self.known())}{extra}|module:factory|file.py:factory]"

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


class DeviceType(click.ParamType):
    """``--device``: auto, cpu, cuda or cuda:N (whether a GPU is there is checked when it is used)."""

    name = "auto|cpu|cuda[:N]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from landscape.errors import UsageError
        from landscape.runtime import check_device_name

        try:
            return check_device_name(str(value).strip().lower())
        except UsageError:
            self.fail(f"{value!r}: use auto, cpu, cuda or cuda:N", param, ctx)


FLOAT32_MAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max: models and evaluations run in float32


class FiniteFloat(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN, infinities and magnitudes float32 cannot hold (a NaN passes
    every range comparison; ``1e39`` becomes ``inf`` in a float32 model)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if abs(number) > FLOAT32_MAX:
            self.fail(f"{value!r} is too large (float32 holds magnitudes up to {FLOAT32_MAX:.4g})", param, ctx)
        return number


class CommaList(click.ParamType):
    """Comma-separated strings (``conv1.*,fc.weight``) or, with ``number=True``, finite floats, each in the range
    given by ``min``/``max``/``min_open``/``max_open`` (as :class:`FiniteFloat`)."""

    def __init__(self, number: bool = False, **bounds: Any):
        self.number = number
        self.item = FiniteFloat(**bounds) if number else None
        self.name = "X,Y,..." if number else "A,B,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple:
        if isinstance(value, (tuple, list)):
            return tuple(value)
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        if not items:
            self.fail("give at least one value", param, ctx)
        if self.item is None:
            return tuple(items)
        try:
            numbers = tuple(float(v) for v in items)
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of numbers", param, ctx)
        if not all(math.isfinite(v) for v in numbers):
            self.fail(f"{value!r}: every number must be finite", param, ctx)
        for number in numbers:  # the field's range, float32's magnitude
            try:
                self.item.convert(number, param, ctx)
            except click.BadParameter as exc:
                self.fail(f"{value!r}: {exc.message}", param, ctx)
        return numbers


class SchedulerAddress(click.ParamType):
    """``--scheduler``: a Dask scheduler address ``tcp://HOST:PORT``, checked before anything runs
    (:func:`landscape.api.execution.scheduler_address`); the command then waits up to ten seconds for it."""

    name = "tcp://HOST:PORT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from landscape.api.execution import scheduler_address
        from landscape.errors import UsageError

        try:
            return scheduler_address(str(value))
        except UsageError as exc:
            self.fail(str(exc).removeprefix(f"--scheduler {str(value)!r}: "), param, ctx)


def scheduler_option(help: str) -> Callable:
    """``--scheduler ADDRESS`` of every command that can run on a Dask cluster (batch, figures, analyses)."""
    return click.option("--scheduler", type=SchedulerAddress(), default=None,
                        help=f"{help} Waits up to {SCHEDULER_TIMEOUT_S} s for the scheduler: a malformed address exits 2, an "
                             f"unreachable one exits 1.")


def note_scheduler(scheduler: str | None) -> None:
    """Say on stderr which scheduler the command waits for, and how long."""
    if scheduler is not None:
        from landscape import bounds

        click.echo(f"dask: connecting to the scheduler at {scheduler} (waiting up to {bounds.SCHEDULER_TIMEOUT_S} s)",
                   err=True)


class ResultPath(click.Path):
    """``-o/--output``: a result file to (over)write. Its directory may be missing (it is created) but must not
    lie below a file, and an existing file there must be a landscape result: a checkpoint, a figure or any other
    data is never replaced."""

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from landscape.errors import ResultError
        from landscape.results import check_output_path

        try:
            check_output_path(Path(super().convert(value, param, ctx)))
        except ResultError as exc:
            self.fail(str(exc), param, ctx)
        return value


output_option = click.option("-o", "--output", type=ResultPath(), default=None, help="Result HDF5 file to write.")


def add_options(options: list[Callable], func: Callable | None = None) -> Callable:
    """Apply click options in the order listed (first = first in --help); bare or as a decorator factory."""
    def apply(f: Callable) -> Callable:
        for option in reversed(options):
            f = option(f)
        return f

    return apply(func) if func is not None else apply


_decorator = add_options


def device_option(default: str = "cpu") -> Callable:
    return click.option("--device", type=DeviceType(), default=default, show_default=True,
                        help="auto, cpu, cuda or cuda:N.")


data_root_option = click.option("--data-root", type=click.Path(file_okay=False), default=None,
                                help="Where torchvision data sets live (default $LANDSCAPE_DATA).")
no_figure_option = click.option("--no-figure", is_flag=True, help="Write the result file only.")


def _default_or_required(default: str | None, required: bool | None) -> dict[str, Any]:
    # click >= 8.3 treats an explicit default=None as a given value, so a required option must omit it
    if default is not None:
        return {"default": default, "show_default": True}
    return {"required": required is None or required}


def data_options(func: Callable | None = None, *, default: str | None = "digits",
                 required: bool | None = None) -> Callable:
    """Add the data-set options; use bare (``@data_options``) or with ``default=None`` to make ``--data`` required
    (``default=None, required=False``: optional, ``data`` is None when not given)."""
    options = [
        click.option("--data", type=SourceName("landscape.data:DATASETS", "landscape.datasets", data=True),
                     help="Data set: a name, a torchvision set by name (svhn, kmnist, ...) or imagefolder (both "
                          "with --data-root), a .npz/.h5 tensor file, or module:factory / file.py:factory.",
                     **_default_or_required(default, required)),
        click.option("--data-kwargs", default=None, metavar="JSON",
                     help='Data set options as a JSON object, e.g. \'{"ds": 10, "dn": 90}\'.'),
        click.option("--subset", type=SubsetType(), default=None,
                     help="Train on a stratified subset: a count or a fraction of the train split."),
        click.option("--data-root", type=click.Path(file_okay=False), envvar=DATA_ENV, default=None,
                     show_envvar=True, help="Directory holding torchvision data sets (mnist, cifar10, ...)."),
        click.option("--download", is_flag=True, help="Download a torchvision data set into --data-root if absent."),
    ]
    return _decorator(options, func)


def model_options(func: Callable | None = None, *, default: str | None = "lenet",
                  required: bool | None = None) -> Callable:
    """Add the model options; use bare (``@model_options``) or with ``default=None`` to make ``--model`` required
    (``default=None, required=False``: optional, ``model`` is None when not given)."""
    options = [
        click.option("--model", type=SourceName("landscape.models:MODELS", "landscape.models"),
                     help="Model: a name, or module:factory / file.py:factory (called with input_shape, num_classes "
                          "and --model-kwargs).",
                     **_default_or_required(default, required)),
        click.option("--model-kwargs", default=None, metavar="JSON",
                     help='Model options as a JSON object, e.g. \'{"norm": "batch"}\'.'),
    ]
    return _decorator(options, func)


def dataset_arguments(
    data: str,
    data_kwargs: str | dict | None = None,
    subset: int | float | None = None,
    data_root: str | None = None,
    download: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for ``landscape.data.load_dataset(**args)``; a ``seed`` in ``--data-kwargs`` passes through
    (so it overrides a command's seed when merged as ``{"seed": seed, **args}``)."""
    options = data_kwargs if isinstance(data_kwargs, dict) else parse_json_option(data_kwargs, "--data-kwargs")
    clash = [k for k in _RESERVED_DATA_KEYS if k in options]
    if clash:
        raise click.BadParameter(
            f"{', '.join(clash)} cannot go in the JSON; use the matching command-line option",
            param_hint="--data-kwargs",
        )
    return {"name": data, "subset": subset, "data_root": data_root, "download": download, **options}


def model_arguments(model: str, model_kwargs: str | dict | None = None) -> tuple[str, dict[str, Any]]:
    """``(name, kwargs)`` for ``landscape.models.build_model(name, input_shape=..., num_classes=..., **kwargs)``."""
    options = model_kwargs if isinstance(model_kwargs, dict) else parse_json_option(model_kwargs, "--model-kwargs")
    clash = [k for k in ("input_shape", "num_classes") if k in options]
    if clash:
        raise click.BadParameter(
            f"{', '.join(clash)} come from the data set and cannot be given", param_hint="--model-kwargs"
        )
    return model, options


def run_api(fn: Callable[[], Any]) -> Any:
    """Call the library with each warning shown as one ``warning: ...`` line on stderr (no source lines)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *args, **kw: click.echo(f"warning: {message}", err=True)
        return fn()
