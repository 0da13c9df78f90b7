"""Every built-in analysis declared: its options and its :class:`~landscape.analyze.registry.Analysis` spec,
whose code is imported when it runs (``--help`` imports no torch)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from landscape import metrics as user_metrics
from landscape.analyze.registry import Analysis
from landscape.bounds import BINS_MAX, DIRECTIONS_MAX, GRID_CELLS_MAX, LANCZOS_STEPS_MAX, POINTS_MAX
from landscape.clip import CLIP_FUNCTIONS, CLIP_STYLES
from landscape.errors import OptionError, UsageError, param
from landscape.options import (
    BIASBN,
    CHUNK_HELP,
    CLIP_FN_HELP,
    CLIP_STYLE_HELP,
    DEVICE_HELP,
    EVAL_CHUNK,
    EVAL_METHODS,
    FLOAT32_MAX,
    GRAM_STRATEGIES,
    KERNELS,
    NORMALIZATIONS,
    PRECISIONS,
    SPLITS,
    SUBSET_HELP,
    SUBSET_SEED_HELP,
    Options,
    option,
)

CLIPS = ("none", *CLIP_STYLES)  # ntk: the unclipped kernel too
KIND_HELP = ("loss-grad: <grad l_i, grad l_j>; output: d f/d w (d f/d w)^T (nM x nM); output-trace: its trace "
             "over logits (n x n).")
PRECISION_HELP = ("auto: float64 for small tensors, the model's dtype for big contractions; float64: the model and "
                  "every contraction in float64; float32: every contraction in the model's dtype.")
_GRID = re.compile(r"^\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*$")
_RANGE = re.compile(r"^\s*([-+0-9.eE]+)\s*:\s*([-+0-9.eE]+)\s*$")


def device_option() -> Any:
    """The ``--device`` option every analysis that computes on a device shares."""
    return option("auto", DEVICE_HELP + " The device used is recorded in the result's attrs.", kind="device")


@dataclass(frozen=True)
class EvaluationOptions(Options):
    """How checkpoints are evaluated (interpolate, directions, surface and calibration configs)."""

    subset: int | float | None = option(None, SUBSET_HELP + " Default: all, of each split.", kind="subset")
    subset_seed: int = option(0, SUBSET_SEED_HELP)
    chunk: int = option(EVAL_CHUNK, CHUNK_HELP, min=1)
    device: str = device_option()
    method: str = option("auto", "Evaluation engine (landscape.evaluate).", choices=EVAL_METHODS)


@dataclass(frozen=True)
class RandomDirectionOptions(EvaluationOptions):
    """How random directions are drawn and the user metrics recorded at every point (directions, surface)."""

    biasbn: str = option("zero", "1-D tensors (biases, norm layers) under filter/layer normalisation: zero (Li et "
                         "al.), copy theta, or random rescaled.", choices=BIASBN)
    seed: int = option(0, "Seed of the random directions.")
    metrics: tuple[str, ...] | None = option(None, user_metrics.METRIC_HELP, flag="--metric",
                                             metavar="REF", kind="metrics")

    def validate(self) -> None:
        self._set("metrics", user_metrics.normalize(self.metrics))


@dataclass(frozen=True)
class KernelOptions(Options):
    """Which kernel of which examples, and how it is computed (the base of NTKConfig and NTKTableConfig)."""

    subset: int | float = option(128, SUBSET_HELP, kind="subset")
    kernel: str = option("loss-grad", KIND_HELP, choices=KERNELS)  # `kind:` is a batch job's kind
    clip_fn: str = option("abadi", CLIP_FN_HELP, choices=tuple(CLIP_FUNCTIONS))
    layers: tuple[str, ...] | None = option(None, "Glob patterns of parameter names to include (default: all "
                                            "trainable).")
    subset_seed: int = option(0, SUBSET_SEED_HELP)
    split: str = option("train", "Data split.", choices=SPLITS)
    max_memory: str | int | None = option("4GB", "Memory budget of the Gram computation (e.g. 4GB, 512MiB).",
                                          kind="text")
    strategy: str = option("auto", "How per-layer Gram blocks are computed.", choices=GRAM_STRATEGIES)
    precision: str = option("auto", PRECISION_HELP, choices=PRECISIONS)
    device: str = device_option()

    def validate(self) -> None:
        from landscape.gram import parse_memory

        parse_memory(self.max_memory)


@dataclass(frozen=True)
class InterpolateConfig(EvaluationOptions):
    """Options of ``landscape interpolate`` / ``instability`` (stored as the result's ``params``)."""

    points: int = option(30, "Number of alphas in linspace(0, 1, points), both endpoints included.", min=2,
                         max=POINTS_MAX)
    split: tuple[str, ...] = option(SPLITS, "Data split(s) to evaluate: train, test or train,test.", choices=SPLITS,
                                    metavar="train,test")
    bn_recalibrate: bool = option(False, "Recompute BatchNorm statistics at every point from the training data.")
    metrics: tuple[str, ...] | None = option(None, user_metrics.METRIC_HELP + " ece: expected calibration error, "
                                             "15 equal-width bins as landscape calibration.", flag="--metric",
                                             metavar="REF", kind="metrics")
    align: bool = option(False, "Also permute B's hidden units to match A (Git Re-Basin weight matching, "
                         "landscape.analyze.align) and report the instability after alignment beside it.")

    def validate(self) -> None:
        self._set("metrics", user_metrics.normalize(self.metrics))


@dataclass(frozen=True)
class InstabilityOptions(Options):
    """How ``instability`` pairs runs (an api keyword and a command-line option, not an analyzer option)."""

    pairs: str = option("siblings", "siblings (runs trained from one parent checkpoint with the same optimizer: "
                        "`landscape phases`, `landscape train --from`, a Recorder's parent=), all, or explicit "
                        "A:B[,C:D...].")
    pair_dir: str | None = option(None, "Directory of the per-pair interpolation files (default: OUTPUT-pairs/ "
                                  "beside the table). A pair's file there is reused, not recomputed, when its "
                                  "checkpoints' sha256, the options, the data and the code version all match.")


@dataclass(frozen=True)
class CalibrationConfig(EvaluationOptions):
    """Options of ``landscape calibration`` (stored as the result's ``params``)."""

    bins: int = option(15, "Number of equal-width confidence bins ((m-1)/M, m/M] for ECE, MCE, the reliability "
                       "diagram and the histograms; also the number of equal-mass bins of the adaptive ECE.", min=1,
                       max=BINS_MAX)
    split: tuple[str, ...] = option(("test",), "Data split(s) to evaluate: train, test or train,test.",
                                    choices=SPLITS, metavar="train,test")


@dataclass(frozen=True)
class ClippingConfig(Options):
    """Options of ``landscape clipping`` (and ``landscape.api.clipping``)."""

    max_grad_norm: float = option(1.0, "Clipping norm C.", min=0, min_open=True)
    batch_size: int = option(256, "Batch size B: examples per batch (R depends on it, as on the batch size of a "
                             "DP-SGD step).", min=1)
    batches: int = option(1, "Number K of disjoint batches (R is reported per batch and over all K x B examples).",
                          min=1)
    clip_style: str = option("flat", CLIP_STYLE_HELP, choices=CLIP_STYLES)
    seed: int = option(0, "Seed of the batch draw.")
    prune_levels: tuple[float, ...] | None = option(
        None, "Fractions of weights removed, e.g. 0,0.3,0.5,0.7,0.9: prune, rewind, retrain, measure R "
        "(Watson Fig. 11).", min=0, max=1, max_open=True)
    split: str = option("train", "Which split the per-sample gradients come from.", choices=SPLITS)
    chunk: int = option(250, CHUNK_HELP, min=1)
    device: str = device_option()


@dataclass(frozen=True)
class DirectionsConfig(RandomDirectionOptions):
    """Options of ``landscape directions`` (stored as the result's ``params``)."""

    directions: int = option(100, "Number of random directions (held in memory together, for their cosines).",
                             min=1, max=DIRECTIONS_MAX)
    points: int = option(30, "Points per profile: t = linspace(0, 1, points) of the distance.", min=2,
                         max=POINTS_MAX)
    distance: float | str = option("auto", "How far to go: a number, or auto = ||B - A|| (needs --toward).",
                                   kind="text")
    split: str = option("train", "Data split to evaluate.", choices=SPLITS)
    normalize: str = option("none", "Direction normalisation (Li et al. 2018): none (isotropic, as Watson et al.), "
                            "filter or layer.", choices=NORMALIZATIONS)

    def validate(self) -> None:
        super().validate()
        self._set("distance", parse_distance(self.distance))


def parse_distance(value: float | str) -> float | str:
    """``"auto"`` or a positive finite number (a string from the command line is parsed)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        try:
            value = float(text)
        except ValueError:
            raise OptionError("distance", f"must be a positive number or 'auto', got {value!r}") from None
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise OptionError("distance", f"must be a positive number or 'auto', got {value}")
    if value > FLOAT32_MAX:
        raise OptionError("distance", f"{value:g} is too large: the models run in float32 (at most 3.4e38)")
    return value


@dataclass(frozen=True)
class DirectionsOptions(Options):
    """The target of ``directions`` (an api keyword and a command-line option)."""

    toward: str | None = option(None, "Checkpoint B: also evaluate the straight path from A toward B.")


@dataclass(frozen=True)
class SurfaceConfig(RandomDirectionOptions):
    """Options of ``landscape surface`` (stored as the result's ``params``)."""

    plane: str = option("random", "random (two filter-normalised directions), B,C (plane through A, B, C) or "
                        "pca:RUN.")
    grid: str = option("25x25", "Grid points NXxNY (or N).")
    range: str = option("auto", "auto, LO:HI (both axes) or XLO:XHI,YLO:YHI; auto = -1:1 for random, else around "
                        "the points.")
    split: tuple[str, ...] = option(SPLITS, "Data split(s) to evaluate: train, test or train,test.", choices=SPLITS,
                                    metavar="train,test")
    normalize: str = option("filter", "Direction normalisation of the random plane (Li et al. 2018): none, filter "
                            "or layer.", choices=NORMALIZATIONS)
    rows_per_call: int | None = option(None, "Grid rows per evaluation call and file write (default: about 64 "
                                       "points per call).", min=1)

    def validate(self) -> None:
        super().validate()
        self._set("plane", self.plane.strip())
        for checked in ("plane_kind", "shape", "ranges"):  # each property refuses a bad value of its option
            getattr(self, checked)

    @property
    def plane_kind(self) -> str:
        """``random`` | ``checkpoints`` | ``pca``."""
        if self.plane == "random":
            return "random"
        if self.plane.startswith("pca:"):
            if not self.plane[4:].strip():
                raise OptionError("plane", "pca:RUN needs a run name after 'pca:'")
            return "pca"
        parts = [p.strip() for p in self.plane.split(",")]
        if len(parts) == 2 and all(parts):
            return "checkpoints"
        raise OptionError("plane", f"takes random, B,C (two checkpoint references) or pca:RUN; got {self.plane!r}")

    @property
    def plane_refs(self) -> list[str]:
        """The checkpoint references (B, C) or the run (pca) the plane names."""
        kind = self.plane_kind
        if kind == "checkpoints":
            return [p.strip() for p in self.plane.split(",")]
        if kind == "pca":
            return [self.plane[4:].strip()]
        return []

    @property
    def shape(self) -> tuple[int, int]:
        """``(nx, ny)`` from ``grid``."""
        m = _GRID.match(str(self.grid))
        if not m:
            raise OptionError("grid", f"takes NXxNY (e.g. 25x25) or N; got {self.grid!r}")
        nx = int(m.group(1))
        ny = int(m.group(2)) if m.group(2) else nx
        if nx < 2 or ny < 2:
            raise OptionError("grid", f"needs at least 2 points per axis; got {self.grid!r}")
        if nx * ny > GRID_CELLS_MAX:
            raise OptionError("grid", f"{self.grid}: at most {GRID_CELLS_MAX} cells (e.g. 1000x1000), got {nx * ny}")
        return nx, ny

    @property
    def ranges(self) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """``((xlo, xhi), (ylo, yhi))`` from ``range``; None for ``auto``."""
        text = str(self.range).strip()
        if text == "auto":
            return None
        parts = text.split(",")
        if len(parts) not in (1, 2):
            raise OptionError("range", f"takes auto, LO:HI or XLO:XHI,YLO:YHI; got {self.range!r}")
        out = []
        for part in parts:
            m = _RANGE.match(part)
            try:
                lo, hi = (float(m.group(1)), float(m.group(2))) if m else (math.nan, math.nan)
            except ValueError:
                lo, hi = math.nan, math.nan
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise OptionError("range", f"takes auto, LO:HI or XLO:XHI,YLO:YHI with LO < HI; got {self.range!r}")
            if max(abs(lo), abs(hi)) > FLOAT32_MAX:  # the plane is walked in float32 weights
                raise OptionError("range", f"{self.range!r}: coordinates must lie within +-{FLOAT32_MAX:.4g} "
                                           "(float32)")
            out.append((lo, hi))
        return (out[0], out[-1])

    def analysis_params(self) -> dict:
        """The options that determine the arrays (all but ``rows_per_call``): must match to resume."""
        from landscape.jsonable import to_jsonable

        p = to_jsonable(self)
        p.pop("rows_per_call", None)
        return p


@dataclass(frozen=True)
class SurfaceOptions(Options):
    """How ``surface`` runs and draws (api keywords and command-line options, not analyzer options)."""

    three_d: bool = option(False, "Also draw a 3-D surface view.", flag="--3d")
    restart: bool = option(False, "Start afresh when the output file holds a partial surface with the same options "
                           "(default: resume it).")
    on_rows: Callable | None = option(None, cli=False)  # on_rows(result, rows) after each block written

    @property
    def resume(self) -> bool:
        """Whether a partial output file with the same options is resumed."""
        return not self.restart


@dataclass(frozen=True)
class HessianConfig(Options):
    """Options of ``landscape hessian`` (and ``landscape.api.hessian``)."""

    top_k: int = option(5, "Largest Hessian eigenvalues to compute (Lanczos); 0 for none.", min=0)
    trace: bool = option(False, "Also estimate the trace (Hutchinson, Rademacher probes, with its standard error).")
    density: bool = option(False, "Also estimate the spectral density (stochastic Lanczos quadrature).")
    subset: int | float = option(1000, SUBSET_HELP + " The loss is taken over them, at every checkpoint.",
                                 kind="subset")
    subset_seed: int = option(0, SUBSET_SEED_HELP)
    seed: int = option(0, "Seed of the Lanczos start vector and the probes.")
    split: str = option("train", "Which split the subset comes from.", choices=SPLITS)
    probes: int = option(100, "Rademacher probes of the trace estimate.", min=1)
    density_probes: int = option(1, "Lanczos runs averaged in the density (Ghorbani et al.: one suffices for "
                                    "large models).", min=1)
    lanczos_steps: int = option(80, "Lanczos steps: the cap for the eigenvalues, the number for the density "
                                    "(memory: steps x parameters).", min=1, max=LANCZOS_STEPS_MAX)
    tol: float = option(1e-4, "Relative residual ||Hu - theta u|| / |theta_1| at which the eigenvalues stop.",
                        min=0, min_open=True, max=1)
    sigma: float = option(0.01, "Gaussian width of the density, as a fraction of the spectral range.",
                          min=0, min_open=True)
    precision: str = option("float32", "Precision of the Hessian-vector products.", choices=PRECISIONS[1:])
    chunk: int = option(250, CHUNK_HELP, min=1)
    device: str = device_option()

    def validate(self) -> None:
        if self.top_k == 0 and not self.trace and not self.density:
            raise UsageError(f"nothing to compute: {param('top_k', 0)} without {param('trace')} or {param('density')}")
        if self.top_k > self.lanczos_steps:
            raise UsageError(f"{param('lanczos_steps')} ({self.lanczos_steps}) must be at least {param('top_k')} ({self.top_k})")


@dataclass(frozen=True)
class NormsConfig(Options):
    """Options of ``landscape norms`` (and ``landscape.api.norms``)."""

    bins: int = option(100, "Bins of the parameter-value histograms (shared by all targets).", min=1,
                       max=BINS_MAX)
    subset: int | float = option(256, SUBSET_HELP + " Their per-sample gradient norms are taken at every "
                                 "checkpoint; 0: none.", kind="subset", min=0)
    grad_epochs: tuple[float, ...] | None = option(None, "Epochs whose gradient-norm histograms are drawn (default: "
                                                   "first after init, and last).", min=0)
    subset_seed: int = option(0, SUBSET_SEED_HELP)
    split: str = option("train", "Which split the per-sample gradients come from.", choices=SPLITS)
    chunk: int = option(250, CHUNK_HELP, min=1)
    device: str = device_option()


@dataclass(frozen=True)
class NTKConfig(KernelOptions):
    """Options of ``landscape ntk`` (stored as the result's params)."""

    clip_style: str = option("none", "Kernel: K (none), K C (flat), sum_r K_r C_r (layerwise).", choices=CLIPS)
    max_grad_norm: float = option(1.0, "Clipping norm C.", min=0, min_open=True)
    layer_max_norms: float | None = option(None, "Layerwise per-layer norm C_r (default C / sqrt(#layers), as in "
                                           "training).", flag="--layer-max-norm", min=0, min_open=True)


@dataclass(frozen=True)
class NTKTableConfig(KernelOptions):
    """Options of ``landscape ntk-table`` (stored as the result's params)."""

    max_grad_norms: tuple[float, ...] = option((0.01, 0.1, 1.0, 10.0, 100.0), "Clipping norms C.", min=0,
                                               min_open=True)
    clip_styles: tuple[str, ...] = option(CLIP_STYLES, "Clipping styles: flat, layerwise.", choices=CLIP_STYLES)


@dataclass(frozen=True)
class SymmetryConfig(Options):
    """Options of ``landscape symmetry`` (and ``landscape.api.symmetry``)."""

    projections: int = option(16, "Random 1-D directions for the skewness (besides the 2-D plane).", min=0)
    seed: int = option(0, "Seed of the projection matrix and the permutations.")
    subset: int | float = option(500, SUBSET_HELP + " Their deviations are taken, the same at every checkpoint.",
                                 kind="subset", min=3)
    subset_seed: int = option(0, SUBSET_SEED_HELP)
    permutations: int = option(999, "Sign-flip permutations for the p-value.", min=1)
    split: str = option("train", "Which split the per-sample gradients come from.", choices=SPLITS)
    chunk: int = option(250, CHUNK_HELP, min=1)
    directions_per_pass: int = option(4, cli=False, min=1)
    device: str = device_option()


INTERPOLATE = Analysis(
    name="interpolate", config=InterpolateConfig, compute="landscape.analyze.interpolate:compute_pair",
    result="landscape.analyze.interpolate:InterpolationResult", inputs="pair",
    figure="landscape.plots.interpolate:interpolation_figure",
    rows="landscape.analyze.interpolate:InterpolationResult.summary", notes="landscape.analyze.interpolate:_notes",
    details="landscape.analyze.interpolate:_details", output="interpolate",
    doc="""Loss and accuracy on (1-alpha) A + alpha B, and the instability (Watson et al. Def. 2.3).

    A and B are checkpoint references: PATH.h5 or RUN[@init|@last|@step=N|@epoch=E]. When A and B were
    trained on different data, every point is evaluated on A's (--data-from b: B's), with a warning.""",
)
INSTABILITY = Analysis(
    name="instability", config=InterpolateConfig, compute="landscape.analyze.instability:compute_pair",
    result="landscape.analyze.instability:InstabilityTable", inputs="pairs",
    collect="landscape.analyze.instability:collect", run_options=InstabilityOptions,
    detail="landscape.analyze.interpolate:InterpolationResult",
    figure="landscape.plots.interpolate:instability_figure", rows="landscape.analyze.instability:_printed",
    notes="landscape.analyze.instability:_notes", details="landscape.analyze.instability:_details",
    output="instability", csv=True,
    doc="""Instability of many pairs of final checkpoints: one table (CSV + HDF5) and the plot against k.

    RUNS are run names or globs (e.g. 'phases-*'); with --pairs A:B they may be omitted. Each pair's
    interpolation is written under <output stem>-pairs/.""",
)
CALIBRATION = Analysis(
    name="calibration", config=CalibrationConfig, compute="landscape.analyze.calibration:compute_point",
    collect="landscape.analyze.calibration:collect_groups", result="landscape.analyze.calibration:CalibrationResult",
    inputs="targets", figure="landscape.plots.calibration:figure", rows="landscape.analyze.calibration:_rows",
    output="calibration",
    doc="""Calibration of checkpoints or whole runs TARGETS... (Bu et al. 2023 Sec. 5; Guo et al. 2017).

    Accuracy, NLL, Brier score, ECE and MCE over equal-width confidence bins ((m-1)/M, m/M], confidence = max
    softmax probability, MCE over non-empty bins), adaptive (equal-mass) ECE; reliability diagrams, confidence
    and true-class probability histograms. A bare run name means every checkpoint of the run (metrics against
    epoch).""",
)
CLIPPING = Analysis(
    name="clipping", config=ClippingConfig, compute="landscape.analyze.clipping:compute_point",
    collect="landscape.analyze.clipping:collect", hooks=("expand",),
    result="landscape.analyze.clipping:ClippingResult", inputs="target",
    figure="landscape.plots.clipping:plot_clipping", rows="landscape.analyze.clipping:_printed", output="clipping",
    purpose="draw per-sample gradients",
    doc="""Clipping ratio R and the Thm. 3.2 bound (Watson et al. Sec. 3.1) at TARGET.

    TARGET is a checkpoint (PATH.h5, RUN@last, RUN@epoch=E, ...) or a run name, meaning every checkpoint of
    the run (one row per checkpoint).""",
)
DIRECTIONS = Analysis(
    name="directions", config=DirectionsConfig, compute="landscape.analyze.directions:random_profiles",
    result="landscape.analyze.directions:DirectionsResult", inputs="checkpoint", run_options=DirectionsOptions,
    hooks=("execute",), parallel=True, figure="landscape.plots.directions:directions_figure",
    rows="landscape.analyze.directions:_rows", notes="landscape.analyze.directions:_notes",
    details="landscape.analyze.directions:_details", output="directions",
    doc="""Loss along N random directions from A against the path toward B (Watson et al. Fig. 4).

    A and B are checkpoint references: PATH.h5 or RUN[@init|@last|@step=N|@epoch=E].""",
)
SURFACE = Analysis(
    name="surface", config=SurfaceConfig, compute="landscape.analyze.surface:compute_surface",
    result="landscape.analyze.surface:SurfaceResult", inputs="checkpoint", run_options=SurfaceOptions,
    hooks=("execute",), parallel=True, figure="landscape.plots.surface:surface_figure",
    rows="landscape.analyze.surface:_rows", notes="landscape.analyze.surface:_notes",
    details="landscape.analyze.surface:SurfaceResult.summary", output="surface",
    doc="""2-D loss and accuracy surface around A (Li et al. 2018); resumes an interrupted output file.

    Arrays are stored [x, y]: train_loss[i, j] is at (xcoordinates[i], ycoordinates[j]); NaN = not computed.""",
)
HESSIAN = Analysis(
    name="hessian", config=HessianConfig, compute="landscape.analyze.hessian:compute_point",
    collect="landscape.analyze.hessian:collect", result="landscape.analyze.hessian:HessianResult", inputs="targets",
    figure="landscape.plots.hessian:plot_hessian", rows="landscape.analyze.hessian:HessianResult.table_rows",
    output="hessian", purpose="take Hessian-vector products", needs=("manifest",),
    doc="""Hessian sharpness (PyHessian, Yao et al. 2020) of runs or checkpoints TARGETS...: top-k eigenvalues
    (Lanczos, with residuals), --trace (Hutchinson, with its standard error), --density (stochastic Lanczos
    quadrature, Ghorbani et al. 2019), on a fixed seeded subset of --subset examples. A run means every checkpoint
    (sharpness against epoch, all runs on one figure).""",
)
NORMS = Analysis(
    name="norms", config=NormsConfig, compute="landscape.analyze.norms:compute_point",
    prepare="landscape.analyze.norms:value_range", share="landscape.analyze.norms:shared_edges",
    collect="landscape.analyze.norms:collect", result="landscape.analyze.norms:NormsResult", inputs="targets",
    figure="landscape.plots.norms:plot_norms", rows="landscape.analyze.norms:NormsResult.ratio_rows", output="norms",
    purpose="draw per-sample gradients", needs=("init", "manifest"),
    doc="""Parameter and gradient norms (Watson Figs. 16-17) of runs or checkpoints TARGETS..., the first the
    baseline of the distance ratios.""",
)
NTK = Analysis(
    name="ntk", config=NTKConfig, compute="landscape.analyze.ntk:compute_point",
    result="landscape.analyze.ntk:NTKResult", inputs="checkpoint", figure="landscape.plots.ntk:plot_ntk",
    rows="landscape.analyze.ntk:_ntk_rows", details="landscape.analyze.ntk:NTKResult.summary", output="ntk",
    purpose="compute the NTK",
    doc="""Empirical NTK at checkpoint REF, with or without clipping: symmetry, positivity, spectra.

    REF is PATH.h5 or RUN@init|@last|@step=N|@epoch=E.""",
)
NTK_TABLE = Analysis(
    name="ntk-table", config=NTKTableConfig, compute="landscape.analyze.ntk_table:table_point",
    result="landscape.analyze.ntk_table:NTKTable", inputs="target",
    collect="landscape.analyze.ntk_table:collect_table", figure="landscape.plots.ntk:plot_ntk_table",
    rows="landscape.analyze.ntk_table:_table_rows", details="landscape.analyze.ntk_table:_table_details",
    output="ntk-table", csv=True, purpose="compute the NTK",
    doc="""Bu et al. Table 1 measured at TARGET: for each clipping norm and style, is the kernel symmetric,
    positive in quadratic form, positive in eigenvalues (with the numbers behind each answer).

    TARGET is a checkpoint (PATH.h5, RUN@last, ...) or a run name, meaning every checkpoint of the run.
    Writes HDF5 + CSV + figure.""",
)
SYMMETRY = Analysis(
    name="symmetry", config=SymmetryConfig, compute="landscape.analyze.symmetry:compute_point",
    collect="landscape.analyze.symmetry:collect", result="landscape.analyze.symmetry:SymmetryResult", inputs="target",
    figure="landscape.plots.symmetry:plot_symmetry", rows="landscape.analyze.symmetry:SymmetryResult.summary_rows",
    output="symmetry", purpose="draw per-sample gradients",
    doc="""Symmetry of the gradient deviations g_i - g_bar (Zhu & Blaschko App. F) at TARGET (checkpoint or run).""",
)
