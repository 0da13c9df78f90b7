"""Verdicts: a paper's claim, the rule it was judged by, the measured numbers and whether it held.

A :class:`Verdict` is what the demo (and the figure recipes) print instead of asserting a claim: ``held`` is
computed from ``numbers`` by a stated rule, never written by hand, and is three-valued -- ``True`` (held),
``False`` (did not hold) or ``None`` (inconclusive: the difference is within the spread, or the spread could
not be measured). The helpers below are the common rules; each one states itself in words in ``test``.

Every statistical rule here is stated once, at one level :data:`ALPHA` (0.05), and reports in the verdict's
``numbers`` the effect it judged, its interval, the sample sizes, the test and alpha, so a reader (or a script
reading a summary's HDF5) can recompute the verdict:

- :func:`greater`: Welch's one-sided t-test of ``A > B`` (unequal variances), with the (1 - 2 alpha) Welch interval
  of ``mean(A) - mean(B)`` and a percentile bootstrap interval beside it (:func:`bootstrap_ci`);
- :func:`paired_greater`: the one-sided paired t-test (``a[i]`` and ``b[i]`` share a seed);
- :func:`paired_ratio`: a ratio claim ("1.7x") against a stated minimum ratio, the paired test on log values;
- :func:`similar`: two one-sided tests (TOST, Schuirmann 1987) against a stated equivalence margin: held when the
  (1 - 2 alpha) interval of the difference lies inside ``[-margin, margin]``;
- :func:`below`: an effect-size bound for "approximately" claims (one-sample one-sided t-test of mean < bound);
- :func:`ordered`: a monotone trend, Spearman's rank correlation of the values with their key, one-sided;
- :func:`far_below`: a value against a sample's quantile (e.g. one path against 100 random directions).

Practical significance: :func:`greater` and :func:`paired_greater` take a stated minimum effect ``min_effect``
(the smallest difference the paper's claim means, e.g. one accuracy point): the test is then of
``A - B > min_effect`` (held only when the difference exceeds the minimum significantly; did not hold when it is
significantly below it), and ``min effect`` is stored with the numbers. Both also report the ``power`` of their test
at the observed effect (:func:`power`): the chance that a rerun with the same n and spread rejects in the observed
direction. A part with power below :data:`POWER` is *underpowered* (the gallery marks it, and a recipe may state
the n it needs).

Each is three-valued: held when the test rejects "no effect" in the claimed direction at ``alpha``, did not hold
when it rejects in the other direction, or when both sides are identical constants (the claimed effect is
exactly absent), or, for :func:`similar`, when the interval lies wholly outside the margin; inconclusive otherwise -- including a group with fewer than two values, where no spread is measurable.
:func:`inconclusive` marks a verdict (and its parts) as resting on an invalid regime (a failed validity gate).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

STATUS = {True: "held", False: "did not hold", None: "inconclusive"}


@dataclass(frozen=True)
class Verdict:
    """One claim judged against measurements.

    ``source`` names where the claim is made (paper and figure/section); ``test`` is the rule applied, in
    words; ``numbers`` the measured values the rule was applied to (floats, ints or lists of them); ``parts``
    the verdicts a combined claim (:func:`all_of`) was judged from.
    """

    claim: str
    source: str
    test: str
    numbers: dict = field(default_factory=dict)
    held: bool | None = None
    note: str = ""
    parts: tuple[Verdict, ...] = ()

    def __post_init__(self) -> None:
        if self.held not in STATUS:
            raise ValueError(f"held must be True, False or None, got {self.held!r}")

    @property
    def status(self) -> str:
        """``"held"``, ``"did not hold"`` or ``"inconclusive"``."""
        return STATUS[self.held]

    def numbers_text(self) -> str:
        """The measured numbers as ``name value, ...`` (3 significant digits)."""
        return ", ".join(f"{k} {_fmt(v)}" for k, v in self.numbers.items())

    def line(self) -> str:
        """One printable sentence: status, claim, source, the numbers and the rule."""
        text = f"[{self.status}] {self.claim} ({self.source}): {self.numbers_text()}. Rule: {self.test}."
        return f"{text} {self.note}" if self.note else text

    def to_dict(self) -> dict:
        """JSON- and HDF5-attribute-friendly: plain floats/ints/lists, NaN as None, ``status`` beside ``held``."""
        return {"claim": self.claim, "source": self.source, "test": self.test,
                "numbers": {k: _plain(v) for k, v in self.numbers.items()}, "held": self.held,
                "status": self.status, "note": self.note, **({"parts": [p.to_dict() for p in self.parts]}
                                                             if self.parts else {})}

    @classmethod
    def from_dict(cls, d: Mapping) -> Verdict:
        numbers = {k: (math.nan if v is None else v) for k, v in dict(d.get("numbers") or {}).items()}
        return cls(claim=d["claim"], source=d["source"], test=d["test"], numbers=numbers, held=d.get("held"),
                   note=d.get("note", ""), parts=tuple(cls.from_dict(p) for p in d.get("parts") or ()))


def _plain(v):
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    v = float(v)
    return None if math.isnan(v) else v


def _fmt(v) -> str:
    if isinstance(v, (list, tuple, np.ndarray)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, (bool, np.bool_, int, np.integer)):
        return str(int(v) if not isinstance(v, (bool, np.bool_)) else bool(v))
    return f"{float(v):.3g}"


def spread(values: Sequence[float]) -> float:
    """Sample standard deviation (``ddof=1``); NaN for fewer than two values."""
    a = np.asarray(values, dtype=float)
    return float(np.std(a, ddof=1)) if a.size >= 2 else math.nan


ALPHA = 0.05  # every rule's level; intervals are (1 - 2 ALPHA) two-sided = the one-sided tests at ALPHA
BOOTSTRAP = 2000  # resamples of :func:`bootstrap_ci`
INVALID = "inconclusive (invalid regime)"
POWER = 0.8  # below this power at the observed effect a verdict is marked underpowered


def _clean(values: Sequence[float]) -> np.ndarray:
    return np.asarray([float(v) for v in values], dtype=float)


def _three_way(p_greater: float, p_less: float, alpha: float) -> bool | None:
    """held if ``p_greater < alpha``, did not hold if ``p_less < alpha``, else (or NaN) inconclusive."""
    if math.isnan(p_greater) or math.isnan(p_less):
        return None
    if p_greater < alpha:
        return True
    if p_less < alpha:
        return False
    return None


def _t_sides(diff: float, se: float, df: float) -> tuple[float, float, float]:
    """``(t, p(effect > 0), p(effect < 0))`` of a t statistic ``diff / se`` with ``df`` degrees of freedom.

    A zero standard error (every value of each group identical) gives p = 0 on the side of a non-zero difference;
    with a zero difference too the effect is exactly 0, which refutes a claimed positive effect: ``(nan, 1, 0)``,
    so a claim "A > B" on e.g. three chord barriers of exactly 0 a side did not hold (no bump at all)."""
    from scipy import stats

    if math.isnan(diff) or math.isnan(se) or math.isnan(df):
        return math.nan, math.nan, math.nan
    if se == 0.0:
        if diff == 0.0:
            return math.nan, 1.0, 0.0
        return math.copysign(math.inf, diff), float(diff <= 0), float(diff >= 0)
    t = diff / se
    return t, float(stats.t.sf(t, df)), float(stats.t.cdf(t, df))


def _interval(diff: float, se: float, df: float, alpha: float) -> tuple[float, float]:
    from scipy import stats

    if math.isnan(diff) or math.isnan(se) or math.isnan(df):
        return math.nan, math.nan
    q = float(stats.t.ppf(1.0 - alpha, df)) if se > 0 else 0.0
    return diff - q * se, diff + q * se


def power(effect: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """Power of a one-sided t-test at ``alpha`` when the true difference (beyond any minimum effect) is ``effect``,
    with standard error ``se`` and ``df`` degrees of freedom: ``P(T > t_{1-alpha, df})`` for ``T`` noncentral t with
    noncentrality ``|effect| / se`` (the rejection in the effect's own direction). 1 when ``se`` is 0 and the effect
    is not; NaN when it cannot be computed (NaN inputs, or no effect and no spread)."""
    from scipy import stats

    if math.isnan(effect) or math.isnan(se) or math.isnan(df):
        return math.nan
    if se == 0.0:
        return math.nan if effect == 0.0 else 1.0
    return float(stats.nct.sf(stats.t.ppf(1.0 - alpha, df), df, abs(effect) / se))


def underpowered(verdict: Verdict, needs: int | None = None) -> str:
    """Why a verdict (one part) is underpowered, or ``""``: its stored ``power`` below :data:`POWER`, or its
    smallest sample size (``n ...`` numbers) below ``needs`` (the n a recipe states it needs)."""
    why = []
    p = verdict.numbers.get("power")
    if isinstance(p, (int, float)) and not math.isnan(float(p)) and float(p) < POWER:
        why.append(f"power {float(p):.2f} < {POWER:g}")
    ns = [int(v) for k, v in verdict.numbers.items() if k.startswith("n ") and isinstance(v, (int, float))
          and not math.isnan(float(v))]
    if needs and ns and min(ns) < needs:
        why.append(f"n {min(ns)} < the {needs} it needs")
    return "; ".join(why)


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), its standard error, Welch-Satterthwaite df)``; NaN with fewer than 2 values a side."""
    a, b = _clean(a), _clean(b)
    if a.size < 2 or b.size < 2:
        diff = float(a.mean() - b.mean()) if a.size and b.size else math.nan
        return diff, math.nan, math.nan
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)) if se > 0 else float(a.size + b.size - 2)
    return float(a.mean() - b.mean()), se, float(df)


def bootstrap_ci(a: Sequence[float], b: Sequence[float] | None = None, *, paired: bool = False,
                 alpha: float = ALPHA, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap (1 - 2 ``alpha``) interval of ``mean(a) - mean(b)`` (``b`` None: of ``mean(a)``).

    Unpaired: ``a`` and ``b`` are resampled independently; paired: the differences ``a[i] - b[i]`` are resampled.
    Seeded (``numpy.random.default_rng(seed)``), so a summary's interval is reproducible; NaN with fewer than 2
    values a side. With n = 3 a side the bootstrap interval is too narrow (it can take only a few values): it is
    reported beside the t interval, never used alone to decide.
    """
    a = _clean(a)
    if b is not None and paired:
        a, b = a - _clean(b), None
    b = None if b is None else _clean(b)
    if a.size < 2 or (b is not None and b.size < 2):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    stat = a[rng.integers(0, a.size, (n, a.size))].mean(axis=1)
    if b is not None:
        stat = stat - b[rng.integers(0, b.size, (n, b.size))].mean(axis=1)
    lo, hi = np.quantile(stat, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def greater(claim: str, source: str, a: Sequence[float], b: Sequence[float], *, names: tuple[str, str] = ("A", "B"),
            unit: str = "pairs", note: str = "", alpha: float = ALPHA, min_effect: float = 0.0) -> Verdict:
    """Claim ``A > B`` (independent groups), by at least ``min_effect``: Welch's one-sided t-test at ``alpha``.

    Held if ``p(A - B > min_effect) < alpha``, did not hold if ``p(A - B < min_effect) < alpha``, else (or with fewer
    than 2 {unit} a side) inconclusive. ``numbers``: the means, sds and n, the difference, its Welch and bootstrap
    intervals, t, df, the one-sided p, alpha, the minimum effect (when stated) and the :func:`power` at the observed
    effect.
    """
    a, b = _clean(a), _clean(b)
    na, nb = names
    diff, se, df = welch(a, b)
    t, p_gt, p_lt = _t_sides(diff - min_effect, se, df)
    lo, hi = _interval(diff, se, df, alpha)
    blo, bhi = bootstrap_ci(a, b, alpha=alpha)
    numbers = {f"mean {na}": float(a.mean()) if a.size else math.nan, f"sd {na}": spread(a), f"n {na}": int(a.size),
               f"mean {nb}": float(b.mean()) if b.size else math.nan, f"sd {nb}": spread(b), f"n {nb}": int(b.size),
               "difference": diff, "ci low": lo, "ci high": hi, "bootstrap ci low": blo, "bootstrap ci high": bhi,
               "t": t, "df": df, "p": p_gt, "alpha": alpha, **_minimum(min_effect),
               "power": power(diff - min_effect, se, df, alpha)}
    gt, lt = (f"{na} > {nb}", f"{na} < {nb}") if not min_effect else (
        f"{na} - {nb} > {min_effect:g}", f"{na} - {nb} < {min_effect:g}")
    test = (f"Welch one-sided t-test over {unit}: held if p({gt}) < {alpha:g}, did not hold if "
            f"p({lt}) < {alpha:g} or both sides are the same constant, else inconclusive (also with fewer "
            f"than 2 {unit} a side); "
            f"interval = {1 - 2 * alpha:.0%} Welch interval of mean({na}) - mean({nb})")
    return Verdict(claim, source, test, numbers, _three_way(p_gt, p_lt, alpha), note)


def paired_greater(claim: str, source: str, a: Sequence[float], b: Sequence[float], *,
                   names: tuple[str, str] = ("A", "B"), unit: str = "seeds", note: str = "",
                   alpha: float = ALPHA, min_effect: float = 0.0) -> Verdict:
    """Claim ``A > B`` by at least ``min_effect`` for paired measurements (``a[i]`` and ``b[i]`` share a seed: the
    same initialisation or data order): the one-sided paired t-test of ``mean(a - b) > min_effect`` at ``alpha``
    (held / did not hold / inconclusive, the numbers and the power as in :func:`greater`)."""
    a, b = _clean(a), _clean(b)
    if a.shape != b.shape:
        raise ValueError(f"paired values need equal lengths, got {a.size} and {b.size}")
    d = a - b
    m = float(d.mean()) if d.size else math.nan
    sd = spread(d)
    se, df = (sd / math.sqrt(d.size), float(d.size - 1)) if d.size >= 2 else (math.nan, math.nan)
    t, p_gt, p_lt = _t_sides(m - min_effect, se, df)
    lo, hi = _interval(m, se, df, alpha)
    blo, bhi = bootstrap_ci(a, b, paired=True, alpha=alpha)
    na, nb = names
    numbers = {f"mean {na}": float(a.mean()) if a.size else math.nan,
               f"mean {nb}": float(b.mean()) if b.size else math.nan,
               f"mean({na} - {nb})": m, f"sd({na} - {nb})": sd, f"n {unit}": int(d.size), "ci low": lo,
               "ci high": hi, "bootstrap ci low": blo, "bootstrap ci high": bhi, "t": t, "df": df, "p": p_gt,
               "alpha": alpha, **_minimum(min_effect), "power": power(m - min_effect, se, df, alpha)}
    test = (f"paired one-sided t-test over {unit}: held if p(mean({na} - {nb}) > {min_effect:g}) < {alpha:g}, did not "
            f"hold if p(< {min_effect:g}) < {alpha:g} or every difference is {min_effect:g}, else (or with fewer than 2 "
            f"{unit}) inconclusive; "
            f"interval = {1 - 2 * alpha:.0%} "
            "t interval of the mean difference")
    return Verdict(claim, source, test, numbers, _three_way(p_gt, p_lt, alpha), note)


def _minimum(min_effect: float) -> dict:
    """``{"min effect": m}`` when a minimum effect is stated (an unstated one, 0, adds nothing)."""
    return {"min effect": float(min_effect)} if min_effect else {}


def paired_ratio(claim: str, source: str, a: Sequence[float], b: Sequence[float], *, min_ratio: float,
                 names: tuple[str, str] = ("A", "B"), unit: str = "seeds", note: str = "",
                 alpha: float = ALPHA) -> Verdict:
    """Claim ``A / B > min_ratio`` for paired positive measurements (a distance ratio, "1.7x"): :func:`paired_greater`
    on the logarithms, ``mean(log a - log b) > log(min_ratio)``, i.e. the geometric-mean ratio exceeds the stated
    minimum. ``numbers`` add the geometric-mean ``ratio``, its (1 - 2 alpha) interval (the log interval
    exponentiated) and ``min ratio``; positive values only (a ratio of a non-positive distance means nothing)."""
    a, b = _clean(a), _clean(b)
    if not (np.all(a > 0) and np.all(b > 0)):
        raise ValueError("paired_ratio needs positive values")
    if not min_ratio > 0:
        raise ValueError(f"min_ratio must be positive, got {min_ratio}")
    na, nb = names
    v = paired_greater(claim, source, np.log(a), np.log(b), names=(f"log {na}", f"log {nb}"), unit=unit, note=note,
                       alpha=alpha, min_effect=math.log(min_ratio))
    m = v.numbers[f"mean(log {na} - log {nb})"]
    numbers = {**v.numbers, "ratio": math.exp(m), "ratio ci low": math.exp(v.numbers["ci low"]),
               "ratio ci high": math.exp(v.numbers["ci high"]), "min ratio": float(min_ratio)}
    test = (f"paired one-sided t-test on log values over {unit}: held if p(geometric-mean ratio {na}/{nb} > "
            f"{min_ratio:g}) < {alpha:g}, i.e. p(mean(log {na} - log {nb}) > log {min_ratio:g}) < {alpha:g}; did not "
            f"hold if p(< log {min_ratio:g}) < {alpha:g}, else (or with fewer than 2 {unit}) inconclusive; interval = "
            f"{1 - 2 * alpha:.0%} t interval of the mean log ratio, exponentiated")
    return dataclasses.replace(v, numbers=numbers, test=test)


def similar(claim: str, source: str, a: Sequence[float], b: Sequence[float], *, tolerance: float,
            names: tuple[str, str] = ("A", "B"), unit: str = "seeds", note: str = "", alpha: float = ALPHA,
            paired: bool = False) -> Verdict:
    """Claim ``A ~ B`` within an equivalence margin ``tolerance`` (the difference the claim still calls "the same",
    stated in the rule): two one-sided tests (TOST) at ``alpha``.

    Held if the (1 - 2 alpha) t interval of ``mean(A) - mean(B)`` (Welch, or paired) lies inside
    ``[-tolerance, tolerance]`` (both one-sided tests reject a difference beyond the margin), did not hold if it
    lies wholly outside (the difference exceeds the margin, significantly), else (or with fewer than 2 {unit} a
    side) inconclusive.
    """
    a, b = _clean(a), _clean(b)
    if paired:
        if a.shape != b.shape:
            raise ValueError(f"paired values need equal lengths, got {a.size} and {b.size}")
        d = a - b
        diff = float(d.mean()) if d.size else math.nan
        se, df = (spread(d) / math.sqrt(d.size), float(d.size - 1)) if d.size >= 2 else (math.nan, math.nan)
    else:
        diff, se, df = welch(a, b)
    lo, hi = _interval(diff, se, df, alpha)
    if math.isnan(lo) or math.isnan(hi):
        held = None
    elif -tolerance <= lo and hi <= tolerance:
        held = True
    elif lo > tolerance or hi < -tolerance:
        held = False
    else:
        held = None
    na, nb = names
    numbers = {f"mean {na}": float(a.mean()) if a.size else math.nan, f"sd {na}": spread(a), f"n {na}": int(a.size),
               f"mean {nb}": float(b.mean()) if b.size else math.nan, f"sd {nb}": spread(b), f"n {nb}": int(b.size),
               "difference": diff, "ci low": lo, "ci high": hi, "margin": float(tolerance), "alpha": alpha}
    test = (f"equivalence (TOST) over {unit}{', paired' if paired else ''}: held if the {1 - 2 * alpha:.0%} t "
            f"interval of mean({na}) - mean({nb}) lies inside +-{tolerance:g}, did not hold if it lies wholly "
            f"outside, else (or with fewer than 2 {unit} a side) inconclusive")
    return Verdict(claim, source, test, numbers, held, note)


def below(claim: str, source: str, values: Sequence[float], bound: float, *, name: str = "value",
          unit: str = "seeds", note: str = "", alpha: float = ALPHA) -> Verdict:
    """Claim that a quantity is below an effect-size ``bound`` (an "approximately" claim: approximately symmetric =
    an asymmetry below a stated size, not exactly none): the one-sample one-sided t-test of ``mean < bound``.

    Held if ``p(mean < bound) < alpha`` (the upper (1 - alpha) confidence bound of the mean is below ``bound``),
    did not hold if ``p(mean > bound) < alpha``, else (or with fewer than 2 {unit}) inconclusive.
    """
    v = _clean(values)
    m = float(v.mean()) if v.size else math.nan
    se, df = (spread(v) / math.sqrt(v.size), float(v.size - 1)) if v.size >= 2 else (math.nan, math.nan)
    t, p_gt, p_lt = _t_sides(m - bound, se, df)  # p_lt: mean < bound
    if se == 0.0 and m == bound:  # exactly at the bound: not below it
        p_gt, p_lt = 0.0, 1.0
    lo, hi = _interval(m, se, df, alpha)
    numbers = {f"mean {name}": m, f"sd {name}": spread(v), f"n {unit}": int(v.size), "bound": float(bound),
               "ci low": lo, "ci high": hi, "t": t, "p": p_lt, "alpha": alpha}
    test = (f"effect-size bound: one-sample one-sided t-test over {unit}; held if p(mean {name} < {bound:g}) < "
            f"{alpha:g}, did not hold if p(mean {name} > {bound:g}) < {alpha:g}, else (or with fewer than 2 {unit}) "
            "inconclusive")
    return Verdict(claim, source, test, numbers, _three_way(p_lt, p_gt, alpha), note)


def ordered(claim: str, source: str, groups: Mapping[float, Sequence[float]], *, decreasing: bool = True,
            key: str = "k", unit: str = "pairs", note: str = "", alpha: float = ALPHA) -> Verdict:
    """Claim that the values fall (``decreasing``) or rise as ``key`` grows: a monotone trend.

    Spearman's rank correlation rho between ``key`` and every value of every group (ties get mean ranks), with
    its one-sided p-value (t approximation, ``scipy.stats.spearmanr``): held if the trend in the claimed
    direction has p < ``alpha``, did not hold if the opposite trend has, else (or with fewer than 3 values, or
    fewer than 2 keys) inconclusive. The group means, sds and sizes are reported beside rho.
    """
    from scipy import stats

    keys = sorted(groups)
    xs = [float(k) for k in keys for _ in groups[k]]
    ys = [float(v) for k in keys for v in groups[k]]
    means = [float(np.mean(groups[k])) if len(groups[k]) else math.nan for k in keys]
    sds = [spread(groups[k]) for k in keys]
    rho = p_down = p_up = math.nan
    if len(ys) >= 3 and len(set(xs)) >= 2 and np.all(np.isfinite(ys)) and len(set(ys)) >= 2:
        rho = float(stats.spearmanr(xs, ys).statistic)
        p_up = float(stats.spearmanr(xs, ys, alternative="greater").pvalue)
        p_down = float(stats.spearmanr(xs, ys, alternative="less").pvalue)
    p_claim, p_other = (p_down, p_up) if decreasing else (p_up, p_down)
    numbers = {key: [_plain(k) for k in keys], "mean": means, "sd": sds, "n": [len(groups[k]) for k in keys],
               "spearman rho": rho, "p": p_claim, "alpha": alpha}
    way = "falls" if decreasing else "rises"
    test = (f"monotone trend: Spearman rank correlation of the values ({unit}) with {key}, one-sided; held if it "
            f"{way} with p < {alpha:g}, did not hold if the opposite trend has p < {alpha:g}, else inconclusive")
    return Verdict(claim, source, test, numbers, _three_way(p_claim, p_other, alpha), note)


def inconclusive(verdict: Verdict, reason: str) -> Verdict:
    """The verdict (and every part) marked inconclusive because it rests on an invalid regime, with ``reason``."""
    note = f"{INVALID}: {reason}." + (f" {verdict.note}" if verdict.note else "")
    parts = tuple(inconclusive(p, reason) for p in verdict.parts)
    numbers = dict(verdict.numbers)
    if parts and {"held", "did not hold", "inconclusive"} <= set(numbers):  # an all_of: its counts follow the parts
        numbers.update({"held": 0, "did not hold": 0, "inconclusive": len(parts)})
    return dataclasses.replace(verdict, held=None, note=note, numbers=numbers, parts=parts)


def all_of(claim: str, source: str, parts: Sequence[Verdict], *, note: str = "") -> Verdict:
    """Claim that holds for every part: held if every part held, did not hold if any part did not, else
    inconclusive."""
    held_n = sum(p.held is True for p in parts)
    failed = sum(p.held is False for p in parts)
    held = False if failed else (True if parts and held_n == len(parts) else None)
    numbers = {"held": held_n, "did not hold": failed, "inconclusive": len(parts) - held_n - failed}
    return Verdict(claim, source, "held if every part held, did not hold if any part did not, else inconclusive",
                   numbers, held, note, tuple(parts))


def far_below(claim: str, source: str, value: float, sample: Sequence[float], *, quantile: float = 0.1,
              names: tuple[str, str] = ("value", "sample"), note: str = "") -> Verdict:
    """Claim that ``value`` is far below a sample: held if it is below the sample's ``quantile``, did not hold if
    it is at or above the sample's median, inconclusive in between (or with NaN)."""
    s = np.asarray(sample, dtype=float)
    s = s[np.isfinite(s)]
    nv, ns = names
    lo = float(np.quantile(s, quantile)) if s.size else math.nan
    med = float(np.median(s)) if s.size else math.nan
    value = float(value)
    if math.isnan(value) or math.isnan(med):
        held = None
    elif value < lo:
        held = True
    elif value >= med:
        held = False
    else:
        held = None
    frac = float(np.mean(s > value)) if s.size else math.nan
    numbers = {nv: value, f"median {ns}": med, f"q{quantile:g} {ns}": lo, f"fraction of {ns} above": frac,
               f"n {ns}": int(s.size)}
    test = (f"held if {nv} < the {quantile:g} quantile of {ns}, did not hold if {nv} >= their median, "
            "else inconclusive")
    return Verdict(claim, source, test, numbers, held, note)


