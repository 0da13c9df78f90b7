"""The :class:`Recipe` spec of a paper figure and the runner that makes it (train -> analyse -> plot).

A recipe is one module in this package with a ``RECIPE`` (see :mod:`landscape.figures.registry`). The runner
(:func:`make`) gives it a :class:`Context` (store root, output folder, scale settings, workers); the recipe
trains through ``landscape.api`` (``phases``/``train`` reuse a run that exists with the same configuration
hash and refuse one that differs, so an interrupted recipe continues), analyses, draws its figure with
:func:`landscape.plots.style.save_figure` (PNG + PDF) and returns ``(numbers, verdict)``. The runner writes
one HDF5 summary ``<out>/<name>/<name>-<scale>.h5`` (the numbers as datasets, the verdict JSON and the scale
settings as attributes, atomically); a summary whose stored settings equal the current ones means the recipe
is finished and is skipped on rerun.

Validity gates: each recipe states, before it runs, what a usable model is (:class:`Gate`: finite
final losses, final test accuracy at or above a floor, no collapse over the last checkpoints). Every end model
the recipe judges is checked: a part judged from a model that fails (:meth:`Context.judged`) becomes
"inconclusive (invalid regime)" with the reason, and a failing run trained through :meth:`Context.train` that
no part claimed makes the whole verdict inconclusive. The gate's rule, every checked run and its numbers go
into the summary (``gate/*`` datasets; ``gate``, ``gate_runs`` and ``gate_parts`` -- each judged part's claim
and its runs -- attributes), so the downgrade can be
recomputed from the HDF5 alone.
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

from landscape.atomic import atomic_write_hdf5
from landscape.errors import DataError, UsageError
from landscape.figures.registry import SCALES
from landscape.refs import Ref
from landscape.runtime import code_version, portable_mode
from landscape.verdict import Verdict, inconclusive

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
class GateResult:
    """One model checked against a :class:`Gate`."""

    run: str
    final_acc: float
    best_recent_acc: float
    final_loss: float
    passed: bool
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Gate:
    """What a usable model is, stated before a recipe runs: its last checkpoint has a finite train and test loss
    and a test accuracy of at least ``min_acc``, and it has not collapsed -- its final test accuracy is no more
    than ``max_drop`` below the best of its last ``window`` checkpoints (the final one included)."""

    min_acc: float
    max_drop: float = 0.1
    window: int = 3

    def text(self) -> str:
        return (f"usable model: finite final train and test loss, final test accuracy >= {self.min_acc:g}, and no "
                f"more than {self.max_drop:g} below the best of its last {self.window} checkpoints")

    def check(self, run) -> GateResult:
        _, acc = checkpoint_curve(run, "test_acc")
        losses = [final(run, m) for m in ("train_loss", "test_loss")]
        last = float(acc[-1]) if acc.size else math.nan
        recent = acc[-self.window:]
        best = float(np.nanmax(recent)) if np.any(np.isfinite(recent)) else math.nan
        loss = losses[1]
        reasons = []
        if not all(math.isfinite(v) for v in losses):
            reasons.append(f"non-finite final loss (train {losses[0]:.3g}, test {losses[1]:.3g})")
        if not last >= self.min_acc:
            reasons.append(f"final test accuracy {last:.3g} < floor {self.min_acc:g}")
        if math.isfinite(best) and last < best - self.max_drop:
            reasons.append(f"collapsed: final test accuracy {last:.3g} vs {best:.3g} within the last "
                           f"{self.window} checkpoints")
        return GateResult(run.name, last, best, loss, not reasons, "; ".join(reasons))


# Digits (10 classes, chance 0.1): a LeNet that learned anything clears 0.5 at cpu scale within a few epochs
# (SGD reaches ~0.97). The test scale (2 epochs on 200 examples) checks the plumbing: its models sit near chance,
# so its gate asks for finite losses only.
DEFAULT_GATES = {"test": Gate(min_acc=0.0, max_drop=1.0), "cpu": Gate(min_acc=0.5), "paper": Gate(min_acc=0.5)}


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
    gates: Mapping[str, Gate] = dataclasses.field(default_factory=lambda: dict(DEFAULT_GATES))  # per scale
    # "needs n seeds": the n (seeds or pairs a side) each tested part needs, stated by the recipe (None: no stated
    # need); a part with fewer, or with power below landscape.verdict.POWER, is marked underpowered in the gallery
    needs: int | None = None


@dataclasses.dataclass
class Context:
    name: str
    scale: str
    settings: dict
    root: Path
    out: Path
    workers: int = 1
    data_root: str | None = None
    gate_rule: Gate | None = None
    gates: dict = dataclasses.field(default_factory=dict)       # run name -> GateResult
    trained: list = dataclasses.field(default_factory=list)     # run names trained through train()
    claimed: set = dataclasses.field(default_factory=set)       # run names some part was judged from
    part_runs: dict = dataclasses.field(default_factory=dict)   # a judged part's claim -> its run names

    def gate(self, runs) -> list[GateResult]:
        """Check ``runs`` (names or Run objects) against this scale's gate, once each; returns their results."""
        from landscape.store import Store

        store = None
        out = []
        for r in runs:
            name = r if isinstance(r, str) else r.name
            if name not in self.gates:
                if isinstance(r, str):
                    store = store or Store(self.root)
                    r = store.run(name)
                self.gates[name] = self.gate_rule.check(r) if self.gate_rule else GateResult(
                    name, math.nan, math.nan, math.nan, True)
            out.append(self.gates[name])
        return out

    def uses(self, runs) -> None:
        """Record end models the recipe trained without :meth:`train` (e.g. through ``ensure``): like a run from
        :meth:`train`, one that fails the gate makes every part not :meth:`judged` from named runs inconclusive."""
        for r in runs:
            name = r if isinstance(r, str) else r.name
            if name not in self.trained:
                self.trained.append(name)

    def judged(self, part: Verdict, runs) -> Verdict:
        """``part`` as judged from the end models ``runs``: unchanged when all pass the gate, else inconclusive
        (invalid regime) with the failing runs and reasons."""
        names = [Ref.parse(r).name if isinstance(r, str) else r.name for r in runs]
        results = self.gate(list(dict.fromkeys(names)))
        self.claimed.update(g.run for g in results)
        self.part_runs[part.claim] = [g.run for g in results]
        bad = [g for g in results if not g.passed]
        if not bad:
            return part
        return inconclusive(part, "; ".join(f"{g.run}: {g.reason}" for g in bad))

    def stem(self, what: str) -> Path:
        return self.out / f"{self.name}-{what}-{self.scale}"

    def run_name(self, what: str) -> str:
        """The store name of this recipe's run ``what`` at this scale (``NAME-SCALE-what``)."""
        return f"{self.name}-{self.scale}-{what}"

    def train(self, what: str, config, *, gated: bool = True):
        """Train ``config`` as run :meth:`run_name` (``what``), or reuse it when it exists with the same
        configuration (resumed when unfinished): reruns of an interrupted recipe continue here. ``gated=False``
        for a run that only selects hyper-parameters (it is no end model a part rests on)."""
        from landscape.api.training import ensure
        from landscape.store import Store

        config = dataclasses.replace(config, run=self.run_name(what), data_root=self.data_root)
        run = ensure(Store(self.root), config)
        if gated and run.name not in self.trained:
            self.trained.append(run.name)
        return run


def checkpoint_curve(run, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``(epochs, values)`` of a per-checkpoint metric (``train_loss``, ``test_acc``, ...) along a run, from its
    manifest (the trainer evaluates the full splits at every checkpoint)."""
    infos = run.checkpoints()
    return (np.array([i.epoch for i in infos], dtype=float),
            np.array([float(i.metrics.get(metric, math.nan)) for i in infos], dtype=float))


def final(run, metric: str) -> float:
    """The last checkpoint's ``metric``."""
    return float(checkpoint_curve(run, metric)[1][-1])


def lr_scores(ctx, what: str, config, lrs, metric: str = "train_acc", window: int = 1) -> list[float]:
    """Claim-blind hyper-parameter search, step 1: train ``config`` (its seed) at each learning rate of ``lrs`` as run
    ``what-lrLR-SEED`` (not gated: selection runs are no end models) and return each run's score: its final
    ``metric``, or with ``window`` > 1 the worst ``metric`` over its last ``window`` checkpoints (a score that sees
    an oscillating run, as the validity gate's collapse rule does). The run at the chosen lr is the same run the
    recipe then uses for that seed (same name and configuration)."""
    return [worst_recent(ctx.train(f"{what}-lr{lr:g}-{config.seed}", dataclasses.replace(config, lr=lr),
                                   gated=False), metric, window) for lr in lrs]


def worst_recent(run, metric: str = "train_acc", window: int = 1) -> float:
    """A selection run's score: the worst ``metric`` over its last ``window`` checkpoints (1: the final value)."""
    return float(np.min(checkpoint_curve(run, metric)[1][-window:]))


def best(values, scores):
    """Step 2: the value with the highest score (NaN scores lose; ties: the first, i.e. the smaller lr); a float, or
    the candidate itself when the candidates are tuples (e.g. ``(momentum, lr)``)."""
    a = np.nan_to_num(np.asarray(scores, dtype=float), nan=-np.inf)
    value = list(values)[int(np.argmax(a))]
    return value if isinstance(value, tuple) else float(value)


@dataclasses.dataclass
class Made:
    name: str
    scale: str
    verdict: Verdict
    path: Path
    figures: list[Path]
    skipped: bool = False


def gate_numbers(checked: list[GateResult]) -> dict[str, np.ndarray]:
    """The gate table of a summary: one entry per checked run (names in the ``gate_runs`` attribute)."""
    if not checked:
        return {}
    return {"gate/final_acc": [g.final_acc for g in checked], "gate/best_recent_acc": [g.best_recent_acc
                                                                                      for g in checked],
            "gate/final_loss": [g.final_loss for g in checked], "gate/passed": [float(g.passed) for g in checked]}


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


def _gate_json(gate: Gate | None) -> str:
    return json.dumps(dataclasses.asdict(gate) if gate else None)


def _finished(path: Path, settings: Mapping, gate: Gate | None) -> bool:
    import h5py

    if not path.is_file():
        return False
    try:
        with h5py.File(path, "r") as f:
            return (f.attrs.get("settings") == _settings_json(settings) and f.attrs.get("gate") == _gate_json(gate)
                    and "verdict" in f.attrs)
    except OSError:
        return False


def paper_line(recipe: Recipe) -> str:
    """What ``--scale paper`` would run, generated from the recipe's paper settings (so the printed line cannot
    drift from them), with the paper's model, data, the hyper-parameters it assumes and the GPU-hour estimate."""
    p = recipe.paper_scale

    def flat(settings: Mapping, prefix: str = "") -> list[str]:
        out = []
        for k, v in settings.items():
            if isinstance(v, Mapping):
                out += flat(v, "")
            elif k not in ("model", "data", "subset", "seed"):
                out.append(f"{prefix}{k} {v}")
        return out

    settings = ", ".join(dict.fromkeys(flat(recipe.scales.get("paper", {})))) or "the defaults"
    return f"{p.model} on {p.data}; settings that would run: {settings} ({p.hyper}); ~{p.gpu_hours:g} GPU hours"


def check_paper(recipe: Recipe, data_root: str | None) -> None:
    """``--scale paper`` needs the paper's data set on disk; refuse in one line otherwise."""
    from landscape.data import data_root_of

    p = recipe.paper_scale
    if p.data in SYNTHETIC:
        return
    root = data_root_of(data_root)
    names = {p.data, p.data.replace("cifar", "cifar-"), p.data.replace("-", "")}
    if root is None or not any(any(root.glob(f"*{n}*")) for n in names):
        raise DataError(f"{recipe.name} --scale paper needs the {p.data} files under --data-root or "
                        f"$LANDSCAPE_DATA (none found); paper scale: {paper_line(recipe)}")


def make(recipe: Recipe, *, scale: str = "cpu", out: str | Path = "figures-out", root: str | Path = "checkpoints",
         workers: int = 1, data_root: str | None = None, rerun: bool = False) -> Made:
    """Run one recipe at ``scale``: train (reusing runs), analyse, plot, write the summary, return a :class:`Made`."""
    import h5py

    if scale not in SCALES:
        raise UsageError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")
    if scale == "paper":
        check_paper(recipe, data_root)
    settings = dict(recipe.scales[scale])
    out = Path(out)
    path = summary_path(out, recipe.name, scale)
    gate = recipe.gates.get(scale)
    if not rerun and _finished(path, settings, gate):
        _, verdict, figures = read_summary(path)
        return Made(recipe.name, scale, verdict, path, figures, skipped=True)
    ctx = Context(recipe.name, scale, settings, Path(root),
                  out / recipe.name, workers, data_root, gate_rule=gate)
    ctx.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    numbers, verdict, figures = recipe.make(ctx)
    seconds = time.perf_counter() - start
    unclaimed = [g for g in ctx.gate(ctx.trained) if not g.passed and g.run not in ctx.claimed]
    if unclaimed:
        verdict = inconclusive(verdict, "; ".join(f"{g.run}: {g.reason}" for g in unclaimed))
    checked = list(ctx.gates.values())
    numbers = {**numbers, **gate_numbers(checked)}
    for k, v in numbers.items():
        if k.startswith("gate/"):  # a diverged model's loss: the gate has judged it already
            continue
        a = np.asarray(v, dtype=float)
        if not np.all(np.isfinite(a)):
            verdict = dataclasses.replace(verdict, held=None, note=(verdict.note + f" {k} has non-finite values.").strip())

    def fill(f: h5py.File, check) -> None:
        g = f.create_group("numbers")
        for k, v in numbers.items():
            g.create_dataset(k, data=np.asarray(v, dtype=float))
        f.attrs.update(kind="figure-recipe", recipe=recipe.name, paper=recipe.paper, figure=recipe.figure,
                       claim=recipe.claim, scale=scale, settings=_settings_json(settings),
                       gate=_gate_json(gate),
                       gate_runs=json.dumps([g.run for g in checked]),
                       gate_parts=json.dumps(ctx.part_runs), needs=json.dumps(recipe.needs),
                       verdict=json.dumps(verdict.to_dict()), figures=json.dumps([str(p) for p in figures]),
                       seconds=seconds, landscape_version=code_version(), portable=portable_mode(),
                       created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    atomic_write_hdf5(path, fill)
    return Made(recipe.name, scale, verdict, path, [Path(p) for p in figures])
