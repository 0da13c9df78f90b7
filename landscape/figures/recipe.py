"""The :class:`Recipe` spec of a paper figure and the runner that makes it (train -> analyse -> plot).

A recipe is one module in this package with a ``RECIPE`` (see :mod:`landscape.figures.registry`). The runner
(:func:`make`) gives it a :class:`Context` (store root, output folder, scale settings, workers); the recipe
trains through ``landscape.api`` (``phases``/``train`` reuse a run that exists with the same configuration
hash and refuse one that differs, so an interrupted recipe continues), analyses, draws its figure with
:func:`landscape.plots.style.save_figure` (PNG + PDF) and returns ``(numbers, verdict)``. The runner writes
one HDF5 summary ``<out>/<name>/<name>-<scale>.h5`` (the numbers as datasets, the verdict JSON and the scale
settings as attributes, atomically); a summary whose stored settings equal the current ones means the recipe
is finished and is skipped on rerun.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from landscape.atomic import atomic_write
from landscape.errors import DataError, UsageError
from landscape.runtime import code_version
from landscape.verdict import Verdict

SCALES = ("test", "cpu", "paper")
SYNTHETIC = ("digits", "gaussian-signal")  # bundled or generated: paper scale needs no files


@dataclasses.dataclass(frozen=True)
class PaperScale:
    """What the paper ran: data set, model, epochs, hyper-parameters, expected GPU hours."""

    data: str
    model: str
    epochs: int
    hyper: str
    gpu_hours: float


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One paper figure: where the claim is made, what was scaled down, the settings per scale, ``make``."""

    name: str
    paper: str
    figure: str
    claim: str
    scaled_down: str
    scales: Mapping[str, Mapping]           # "test" / "cpu" / "paper" -> settings passed to ``make``
    paper_scale: PaperScale
    make: Callable                            # make(ctx) -> (numbers: dict[str, array-like], Verdict)


@dataclasses.dataclass
class Context:
    name: str
    scale: str
    settings: dict
    root: Path
    out: Path
    workers: int = 1
    data_root: str | None = None

    def stem(self, what: str) -> Path:
        return self.out / f"{self.name}-{what}-{self.scale}"

    def run_name(self, what: str) -> str:
        """The store name of this recipe's run ``what`` at this scale (``NAME-SCALE-what``)."""
        return f"{self.name}-{self.scale}-{what}"

    def train(self, what: str, config):
        """Train ``config`` as run :meth:`run_name` (``what``), or reuse it when it exists with the same
        configuration (resumed when unfinished): reruns of an interrupted recipe continue here."""
        from landscape.api.training import ensure
        from landscape.store import Store

        config = dataclasses.replace(config, run=self.run_name(what), data_root=self.data_root)
        return ensure(Store(self.root), config, progress=False)


def checkpoint_curve(run, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(epochs, values)`` of a per-checkpoint metric (``train_loss``, ``test_acc``, ...) along a run, from its
    manifest (the trainer evaluates the full splits at every checkpoint)."""
    infos = run.checkpoints()
    return (np.array([i.epoch for i in infos], dtype=float),
            np.array([float(i.metrics.get(metric, math.nan)) for i in infos], dtype=float))


def final(run, metric: str) -> float:
    """The last checkpoint's ``metric``."""
    return float(checkpoint_curve(run, metric)[1][-1])


@dataclasses.dataclass
class Made:
    name: str
    scale: str
    verdict: Verdict
    path: Path
    figures: list[Path]
    skipped: bool = False


def summary_path(out: Path, name: str, scale: str) -> Path:
    return Path(out) / name / f"{name}-{scale}.h5"


def _settings_json(settings: Mapping) -> str:
    return json.dumps(dict(settings), sort_keys=True, default=str)


def summary_attrs(path: Path) -> dict:
    """The summary's provenance: ``settings`` (dict), ``seconds``, ``landscape_version``, ``created`` (absent in
    summaries written before they were recorded)."""
    import h5py

    with h5py.File(path, "r") as f:
        out = {k: f.attrs[k] for k in ("seconds", "landscape_version", "created") if k in f.attrs}
        out["settings"] = json.loads(f.attrs["settings"])
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in out.items()}


def read_summary(path: Path) -> tuple[dict, Verdict, list[Path]]:
    """``(numbers, verdict, figures)`` of a written summary."""
    import h5py

    with h5py.File(path, "r") as f:
        numbers: dict = {}
        f["numbers"].visititems(lambda k, v: numbers.__setitem__(k, np.asarray(v)) if isinstance(v, h5py.Dataset)
                                else None)
        verdict = Verdict.from_dict(json.loads(f.attrs["verdict"]))
        figures = [Path(p) for p in json.loads(f.attrs["figures"])]
    return numbers, verdict, figures


def _finished(path: Path, settings: Mapping) -> bool:
    import h5py

    if not path.is_file():
        return False
    try:
        with h5py.File(path, "r") as f:
            return f.attrs.get("settings") == _settings_json(settings) and "verdict" in f.attrs
    except OSError:
        return False


def _check_paper(recipe: Recipe, data_root: str | None) -> None:
    """``--scale paper`` needs the paper's data set on disk; refuse in one line otherwise."""
    from landscape.data import data_root_of

    p = recipe.paper_scale
    if p.data in SYNTHETIC:
        return
    root = data_root_of(data_root)
    names = {p.data, p.data.replace("cifar", "cifar-"), p.data.replace("-", "")}
    if root is None or not any(any(root.glob(f"*{n}*")) for n in names):
        raise DataError(f"{recipe.name} --scale paper needs the {p.data} files under --data-root or "
                        f"$LANDSCAPE_DATA (none found); paper scale: {p.model} on {p.data}, {p.epochs} epochs, "
                        f"{p.hyper}, ~{p.gpu_hours:g} GPU hours")


def make(recipe: Recipe, *, scale: str = "cpu", out: str | Path = "figures-out", root: str | Path = "checkpoints",
         workers: int = 1, data_root: str | None = None, rerun: bool = False) -> Made:
    """Run one recipe at ``scale``: train (reusing runs), analyse, plot, write the summary, return a :class:`Made`."""
    import h5py

    if scale not in SCALES:
        raise UsageError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")
    if scale == "paper":
        _check_paper(recipe, data_root)
    settings = dict(recipe.scales[scale])
    out = Path(out)
    path = summary_path(out, recipe.name, scale)
    if not rerun and _finished(path, settings):
        _, verdict, figures = read_summary(path)
        return Made(recipe.name, scale, verdict, path, figures, skipped=True)
    ctx = Context(recipe.name, scale, settings, Path(root),
                  out / recipe.name, workers, data_root)
    ctx.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    numbers, verdict, figures = recipe.make(ctx)
    seconds = time.perf_counter() - start
    for k, v in numbers.items():
        a = np.asarray(v, dtype=float)
        if not np.all(np.isfinite(a)):
            verdict = dataclasses.replace(verdict, held=None, note=(verdict.note + f" {k} has non-finite values.").strip())

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            g = f.create_group("numbers")
            for k, v in numbers.items():
                g.create_dataset(k, data=np.asarray(v, dtype=float))
            f.attrs.update(kind="figure-recipe", recipe=recipe.name, paper=recipe.paper, figure=recipe.figure,
                           claim=recipe.claim, scale=scale, settings=_settings_json(settings),
                           verdict=json.dumps(verdict.to_dict()), figures=json.dumps([str(p) for p in figures]),
                           seconds=seconds, landscape_version=code_version(),
                           created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    atomic_write(path, write)
    return Made(recipe.name, scale, verdict, path, [Path(p) for p in figures])
