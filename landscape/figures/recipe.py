"""The :class:`Recipe` spec of a paper figure and its runner :func:`make`: train (resumable) -> ``(numbers,
verdict)`` -> the HDF5 summary ``<out>/<name>/<name>-<scale>.h5`` -> figures drawn from the summary alone.

How to write one: docs/ARCHITECTURE.md, "How to add a figure recipe"; gates and scope: docs/figures.md.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from landscape.atomic import atomic_write_hdf5
from landscape.errors import DataError, UsageError, param
from landscape.figures.registry import SCALES
from landscape.refs import Ref
from landscape.runtime import code_version, kernels, portable_mode
from landscape.verdict import Verdict, inconclusive

if TYPE_CHECKING:
    from landscape.figures.compare import Comparison

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
    """What a usable end model is, stated before a recipe runs (:meth:`text` says it in words; docs/figures.md).
    The collapse rule (``max_drop`` < 1) needs one checkpoint per epoch (``checkpoint_every="1e"``)."""

    min_acc: float
    max_drop: float = 0.1
    window: int = 3
    chance_loss: bool = True

    def text(self) -> str:
        parts = ["finite final train and test loss"]
        if self.chance_loss:
            parts.append("final test loss <= ln C (the uniform prediction's)")
        parts.append(f"final test accuracy >= {self.min_acc:g}")
        if self.max_drop < 1:
            parts.append(f"no more than {self.max_drop:g} below the best of its last {self.window} per-epoch "
                         "checkpoints")
        return "usable model: " + ", ".join(parts)

    def last_and_best(self, acc: np.ndarray) -> tuple[float, float]:
        """The final accuracy and the best of the last ``window`` (NaN where there is none)."""
        recent = acc[-self.window:]
        return (float(acc[-1]) if acc.size else math.nan,
                float(np.nanmax(recent)) if np.any(np.isfinite(recent)) else math.nan)

    def judge(self, acc: np.ndarray, epochs: np.ndarray, losses: tuple[float, float], classes: int | None,
              what: str = "test") -> list[str]:
        """The reasons a model with per-checkpoint accuracy ``acc`` at ``epochs`` and final ``(train, held-out)``
        losses fails this gate (``[]``: it passes); ``what`` names the held-out split in the reasons."""
        last, best = self.last_and_best(acc)
        reasons = []
        if not all(math.isfinite(v) for v in losses):
            reasons.append(f"non-finite final loss (train {losses[0]:.3g}, {what} {losses[1]:.3g})")
        elif self.chance_loss and classes and classes > 1 and losses[1] > math.log(classes):
            reasons.append(f"final {what} loss {losses[1]:.4g} > ln {classes} = {math.log(classes):.4g} (worse than "
                           "the uniform prediction)")
        if not last >= self.min_acc:
            reasons.append(f"final {what} accuracy {last:.3g} < floor {self.min_acc:g}")
        if self.max_drop < 1:
            tail = epochs[-self.window:]
            needed = min(self.window, int(math.floor(float(epochs[-1]) + 1e-9)) + 1) if epochs.size else self.window
            if tail.size < needed or np.any(np.diff(tail) > 1.0 + 1e-9):
                reasons.append(f"collapse rule not checkable: checkpoints at epochs {[round(float(e), 3) for e in tail]}"
                               f" (it needs one per epoch over the last {self.window})")
            elif math.isfinite(best) and last < best - self.max_drop:
                reasons.append(f"collapsed: final {what} accuracy {last:.3g} vs {best:.3g} within the last "
                               f"{self.window} checkpoints")
        return reasons

    def check(self, run) -> GateResult:
        epochs, acc = checkpoint_curve(run, "test_acc")
        losses = (final(run, "train_loss"), final(run, "test_loss"))
        reasons = self.judge(acc, epochs, losses, classes_of(run))
        return GateResult(run.name, *self.last_and_best(acc), losses[1], not reasons, "; ".join(reasons))


def classes_of(run) -> int | None:
    """The number of classes of a run's model (its ``model_spec``), or None when it does not say."""
    kwargs = (run.manifest.get("model_spec") or {}).get("kwargs") or {}
    c = kwargs.get("num_classes")
    return int(c) if isinstance(c, int) else None


# Digits (10 classes, chance 0.1): a LeNet that learned anything clears 0.5 at cpu scale within a few epochs
# (SGD reaches ~0.97). The test scale (2 epochs on 200 examples) checks the plumbing: its models sit near chance,
# so its gate asks for finite losses only.
DEFAULT_GATES = {"test": Gate(min_acc=0.0, max_drop=1.0, chance_loss=False), "cpu": Gate(min_acc=0.5),
                 "paper": Gate(min_acc=0.5)}


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
    draw: Callable                            # draw(Drawing) -> [figure files]: from the summary's numbers alone
    gates: Mapping[str, Gate] = dataclasses.field(default_factory=lambda: dict(DEFAULT_GATES))  # per scale
    # "needs n seeds": the n (seeds or pairs a side) each tested part needs, stated by the recipe (None: no stated
    # need); a part with fewer is marked in the gallery
    needs: int | None = None
    kind: str = "claim"                       # "claim": a paper's empirical claim; "check": an implementation /
                                              # closed-form check, counted apart in the gallery


@dataclasses.dataclass
class Drawing:
    """What a recipe's ``draw`` gets: the summary's numbers (float arrays, keys as stored), its verdict, the scale's
    settings, the scale, and where figures go (:meth:`stem`)."""

    name: str
    scale: str
    settings: dict
    numbers: dict
    verdict: Verdict
    out: Path
    sensitivity: list = dataclasses.field(default_factory=list)

    def stem(self, what: str) -> Path:
        return self.out / f"{self.name}-{what}-{self.scale}"


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
    facts: list = dataclasses.field(default_factory=list)       # the scope's facts (eps spent, lr, ...)
    sensitivity: list = dataclasses.field(default_factory=list)  # the verdict at other settings (_selection)
    role: str = ""  # "" for the judged setting; a sensitivity setting's label while it is evaluated

    def scope(self, *facts: str) -> None:
        """Add facts to the verdict's scope ("eps spent 0.93-0.99", "lr 0.01 (chosen)"), once each."""
        for f in facts:
            if f and f not in self.facts:
                self.facts.append(f)

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

    def judged(self, part: Verdict, runs) -> Verdict:
        """``part`` as judged from the end models ``runs``: unchanged when all pass the gate, else inconclusive
        (invalid regime) with the failing runs and reasons."""
        names = [Ref.parse(r).name if isinstance(r, str) else r.name for r in runs]
        results = self.gate(list(dict.fromkeys(names)))
        self.claimed.update(g.run for g in results)
        self.part_runs[f"{self.role}: {part.claim}" if self.role else part.claim] = [g.run for g in results]
        bad = [g for g in results if not g.passed]
        if not bad:
            return part
        return inconclusive(part, "; ".join(f"{g.run}: {g.reason}" for g in bad))

    def stem(self, what: str) -> Path:
        return self.out / f"{self.name}-{what}-{self.scale}"

    def run_name(self, what: str) -> str:
        """The store name of this recipe's run ``what`` at this scale (``NAME-SCALE-what``)."""
        return f"{self.name}-{self.scale}-{what}"

    def train(self, what: str, config, *, gated: bool = True, group: str | None = None):
        """Train (or reuse, resuming if unfinished) ``config`` as run :meth:`run_name` (``group``: ``GROUP-what``,
        shared by recipes). Gated unless ``gated=False`` (a selection run) or a sensitivity setting is evaluated
        (then only the parts judged from it count it)."""
        from landscape.api.training import ensure
        from landscape.store import Store

        name = f"{group}-{what}" if group else self.run_name(what)
        config = dataclasses.replace(config, run=name, data_root=self.data_root)
        run = ensure(Store(self.root), config)
        if gated and not self.role and run.name not in self.trained:
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


def eps_spent(runs) -> list[float]:
    """The privacy budget each run actually spent (its last checkpoint's epsilon; NaN for a non-private run)."""
    out = []
    for r in runs:
        e = r.checkpoints()[-1].epsilon
        out.append(float(e) if e is not None else math.nan)
    return out


def spent_text(values) -> str:
    """``"spent 0.93"`` or ``"spent 0.70-0.93"``: the range of the (non-NaN) ``values``."""
    lo, hi = f"{np.nanmin(values):.3g}", f"{np.nanmax(values):.3g}"
    return f"spent {lo}" if lo == hi else f"spent {lo}-{hi}"


def eps_text(runs) -> str:
    """``"eps spent 0.93"`` or ``"eps spent 0.70-0.93"`` over private runs (``""`` when none is private)."""
    e = [v for v in eps_spent(runs) if math.isfinite(v)]
    return "eps " + spent_text(e) if e else ""


@dataclasses.dataclass
class Made:
    name: str
    scale: str
    verdict: Verdict
    path: Path
    figures: list[Path]
    skipped: bool = False
    comparison: Comparison | None = None  # figures(compare=...): this summary against the reference's


def summary_path(out: Path, name: str, scale: str) -> Path:
    return Path(out) / name / f"{name}-{scale}.h5"


def _settings_json(settings: Mapping) -> str:
    return json.dumps(dict(settings), sort_keys=True, default=str)


SUMMARY_FORMAT = 2  # the summary layout (2: figures drawn from the summary, scope, sensitivity, recipe kind)


def summary_attrs(path: Path) -> dict:
    """The summary's provenance: ``settings`` (dict), ``seconds``, ``landscape_version``, ``created``, ``format``,
    ``recipe_kind``, ``needs`` (JSON; absent in summaries written before they were recorded)."""
    import h5py

    with h5py.File(path, "r") as f:
        out = {k: f.attrs[k] for k in ("seconds", "landscape_version", "created", "format", "recipe_kind", "needs")
               if k in f.attrs}
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


def read_sensitivity(path: Path) -> list[dict]:
    """The summary's sensitivity entries (``[]`` when the recipe selects nothing): each ``{"role", "setting",
    "label", "verdict": Verdict}`` (:mod:`landscape.figures._selection`)."""
    import h5py

    with h5py.File(path, "r") as f:
        raw = json.loads(f.attrs["sensitivity"]) if "sensitivity" in f.attrs else []
    return [{**e, "verdict": Verdict.from_dict(e["verdict"])} for e in raw]


def drawing(path: Path, out: Path | None = None) -> Drawing:
    """A summary as its recipe's ``draw`` gets it (figures going to ``out``, default: beside the summary)."""
    import h5py

    path = Path(path)
    numbers, verdict, _ = read_summary(path)
    with h5py.File(path, "r") as f:
        name, scale = str(f.attrs["recipe"]), str(f.attrs["scale"])
        settings = json.loads(f.attrs["settings"])
    return Drawing(name, scale, settings, numbers, verdict, Path(out) if out is not None else path.parent,
                   read_sensitivity(path))


def _gate_json(gate: Gate | None) -> str:
    return json.dumps(dataclasses.asdict(gate) if gate else None)


def _finished(path: Path, settings: Mapping, gate: Gate | None) -> bool:
    import h5py

    if not path.is_file():
        return False
    try:
        with h5py.File(path, "r") as f:
            return (f.attrs.get("settings") == _settings_json(settings) and f.attrs.get("gate") == _gate_json(gate)
                    and "verdict" in f.attrs and int(f.attrs.get("format", 0)) == SUMMARY_FORMAT)
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
        raise DataError(f"{recipe.name} {param('scale', 'paper')} needs the {p.data} files under {param('data_root')} or "
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
    numbers, verdict = recipe.make(ctx)
    unclaimed = [g for g in ctx.gate(ctx.trained) if not g.passed and g.run not in ctx.claimed]
    if unclaimed:
        verdict = inconclusive(verdict, "; ".join(f"{g.run}: {g.reason}" for g in unclaimed))
    checked = list(ctx.gates.values())
    if checked:  # the gate table: one entry per checked run (names in the gate_runs attribute)
        numbers = {**numbers, **{f"gate/{k}": [float(getattr(g, k)) for g in checked]
                                 for k in ("final_acc", "best_recent_acc", "final_loss", "passed")}}
    numbers = {k: np.asarray(v, dtype=float) for k, v in numbers.items()}  # as the summary stores them
    for k, v in numbers.items():
        if k.startswith(UNJUDGED):  # judged already (the gate), or NaN by design (a setting not trained)
            continue
        if not np.all(np.isfinite(v)):
            verdict = dataclasses.replace(verdict, held=None, note=(verdict.note + f" {k} has non-finite values.").strip())
    if scale != "paper":
        verdict = dataclasses.replace(verdict, scope=scope_text(recipe, scale, ctx.facts))
    sensitivity = [{**e, "verdict": e["verdict"].to_dict()} for e in ctx.sensitivity]
    figures = recipe.draw(Drawing(recipe.name, scale, settings, numbers, verdict, ctx.out, ctx.sensitivity))
    seconds = time.perf_counter() - start

    def fill(f: h5py.File, check) -> None:
        g = f.create_group("numbers")
        for k, v in numbers.items():
            g.create_dataset(k, data=v)
        f.attrs.update(kind="figure-recipe", recipe=recipe.name, paper=recipe.paper, figure=recipe.figure,
                       claim=recipe.claim, scale=scale, settings=_settings_json(settings),
                       gate=_gate_json(gate), format=SUMMARY_FORMAT, recipe_kind=recipe.kind,
                       gate_runs=json.dumps([g.run for g in checked]),
                       gate_parts=json.dumps(ctx.part_runs), needs=json.dumps(recipe.needs),
                       verdict=json.dumps(verdict.to_dict()), sensitivity=json.dumps(sensitivity),
                       figures=json.dumps([str(p) for p in figures]),
                       seconds=seconds, landscape_version=code_version(), portable=portable_mode(), kernels=kernels(),
                       created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    atomic_write_hdf5(path, fill)
    return Made(recipe.name, scale, verdict, path, [Path(p) for p in figures])


# summary numbers whose NaN entries are by design: judged already (the gate), a setting not trained, an inconclusive
# status code, an empty reliability bin
UNJUDGED = ("gate/", "selection/", "sensitivity/", "verdict/", "reliability/")


def scope_text(recipe: Recipe, scale: str, facts) -> str:
    """What a verdict below paper scale is a test of: the scale, what was scaled down, the recipe's facts, and that
    it is not a test of the paper's regime."""
    p = recipe.paper_scale
    facts = "; ".join(facts)
    what = recipe.scaled_down if scale == "cpu" else "a plumbing check on tiny runs (near-chance models)"
    tail = ("an implementation / numerical check, not a reproduced empirical claim" if recipe.kind == "check"
            else f"not a test of the paper's regime ({p.model} on {p.data})")
    return f"at {scale} scale: {what}" + (f"; {facts}" if facts else "") + f"; {tail}"
