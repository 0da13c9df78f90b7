"""Verdicts: a paper's claim, the rule it was judged by, the measured numbers and whether it held.

``held`` is computed from ``numbers`` by a stated rule at the level :data:`ALPHA`, never written by hand:
True, False or None (inconclusive). The rules, power (:func:`mde`), replication units (:func:`pair_jackknife`)
and multiplicity (:func:`all_of`) are described in docs/figures.md, "How verdicts are decided"."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

STATUS = {True: "held", False: "did not hold", None: "inconclusive"}


@dataclass(frozen=True)
class Verdict:
    """One claim judged against measurements: ``source`` where the claim is made, ``test`` the rule in words,
    ``numbers`` what it was applied to, ``parts`` the verdicts an :func:`all_of` combined, ``scope`` the
    regime it was measured in (printed with it)."""

    claim: str
    source: str
    test: str
    numbers: dict = field(default_factory=dict)
    held: bool | None = None
    note: str = ""
    parts: tuple[Verdict, ...] = ()
    scope: str = ""

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
        """One printable sentence: status, claim, source, scope, the numbers and the rule."""
        scope = f" [{self.scope}]" if self.scope else ""
        text = f"[{self.status}] {self.claim} ({self.source}){scope}: {self.numbers_text()}. Rule: {self.test}."
        return f"{text} {self.note}" if self.note else text

    def to_dict(self) -> dict:
        """JSON- and HDF5-attribute-friendly: plain floats/ints/lists, NaN as None, ``status`` beside ``held``."""
        return {"claim": self.claim, "source": self.source, "test": self.test,
                "numbers": {k: _plain(v) for k, v in self.numbers.items()}, "held": self.held,
                "status": self.status, "note": self.note, **({"scope": self.scope} if self.scope else {}),
                **({"parts": [p.to_dict() for p in self.parts]} if self.parts else {})}

    @classmethod
    def from_dict(cls, d: Mapping) -> Verdict:
        numbers = {k: (math.nan if v is None else v) for k, v in dict(d.get("numbers") or {}).items()}
        return cls(claim=d["claim"], source=d["source"], test=d["test"], numbers=numbers, held=d.get("held"),
                   note=d.get("note", ""), parts=tuple(cls.from_dict(p) for p in d.get("parts") or ()),
                   scope=d.get("scope", ""))


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
POWER = 0.8  # the power at which :func:`mde` states the minimum detectable effect


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


def _t_sides(diff: float, se: float, df: float, n: int = 0) -> tuple[float, float, float]:
    """``(t, p(effect > 0), p(effect < 0))`` of ``diff / se`` with ``df`` degrees of freedom; a zero ``se``
    leaves t undefined and the sign test over ``n`` units decides: ``0.5^n`` on the observed side (a
    difference of exactly 0 counts against a claimed positive effect), 1 on the other."""
    from scipy import stats

    if math.isnan(diff) or math.isnan(se) or math.isnan(df):
        return math.nan, math.nan, math.nan
    if se == 0.0:
        p = 0.5 ** int(n) if n >= 1 else math.nan  # the sign test: all n units on one side
        if diff > 0:
            return math.inf, p, 1.0
        return (math.nan if diff == 0 else -math.inf), 1.0, p
    t = diff / se
    return t, float(stats.t.sf(t, df)), float(stats.t.cdf(t, df))


def _interval(diff: float, se: float, df: float, alpha: float) -> tuple[float, float]:
    from scipy import stats

    if math.isnan(diff) or math.isnan(se) or math.isnan(df):
        return math.nan, math.nan
    q = float(stats.t.ppf(1.0 - alpha, df)) if se > 0 else 0.0
    return diff - q * se, diff + q * se


def mde(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The minimum detectable effect of a one-sided t-test at ``alpha``: the true difference ``delta``
    (beyond any minimum effect) rejected with probability ``power`` (noncentral t, noncentrality
    ``delta / se``); 0 when ``se`` is 0, NaN when it cannot be computed."""
    from scipy import optimize, stats

    if math.isnan(se) or math.isnan(df) or df <= 0:
        return math.nan
    if se == 0.0:
        return 0.0
    crit = float(stats.t.ppf(1.0 - alpha, df))

    def gap(nc: float) -> float:
        return float(stats.nct.sf(crit, df, nc)) - power

    hi = crit + float(stats.norm.ppf(power)) + 1.0
    while gap(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-12)) * se


def holm(p_values: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), non-decreasing and capped at 1; reject where below
    ``alpha``. NaN p-values stay NaN and do not count."""
    p = [float(x) for x in p_values]
    finite = sorted((v, i) for i, v in enumerate(p) if not math.isnan(v))
    k = len(finite)
    out = [math.nan] * len(p)
    running = 0.0
    for rank, (v, i) in enumerate(finite):
        running = max(running, min(1.0, v * (k - rank)))
        out[i] = running
    return out


def underpowered(verdict: Verdict, needs: int | None = None) -> str:
    """Why a verdict part rests on too few units (its smallest ``n ...`` below ``needs``), or ``""``."""
    ns = [int(v) for k, v in verdict.numbers.items() if k.startswith("n ") and isinstance(v, (int, float))
          and not math.isnan(float(v))]
    if needs and ns and min(ns) < needs:
        return f"n {min(ns)} < the {needs} it needs"
    return ""


def bound_text(verdict: Verdict) -> str:
    """The equivalence statement of a part that did not hold or is inconclusive ("no difference beyond X (95%
    upper bound)", the mde beside it); ``""`` for one that held or has no interval."""
    n = verdict.numbers
    if verdict.held is True or "ci high" not in n or math.isnan(float(n["ci high"])):
        return ""
    conf = 1.0 - float(n.get("alpha", ALPHA))
    if "below" in n:  # a one-sample bound
        text = (f"mean at least {float(n['ci low']):.3g} ({conf:.0%} lower bound)" if n["below"] else
                f"mean at most {float(n['ci high']):.3g} ({conf:.0%} upper bound)")
    elif "margin" in n:  # equivalence: the interval itself
        text = f"difference between {float(n['ci low']):.3g} and {float(n['ci high']):.3g} ({1 - 2 * (1 - conf):.0%} interval)"
    elif "ratio ci high" in n:
        text = f"ratio no more than {float(n['ratio ci high']):.3g} ({conf:.0%} upper bound)"
    else:
        text = f"no difference beyond {float(n['ci high']):.3g} ({conf:.0%} upper bound)"
    if "mde" in n and not math.isnan(float(n["mde"])):
        text += f"; detectable at {POWER:.0%} power: {float(n['mde']):.3g}"
    if "share bound" in n:
        text += f"; no spread: at most {float(n['share bound']):.0%} of units could show the effect (exact bound)"
    return text


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), its standard error, Welch-Satterthwaite df)``; NaN with fewer than 2 values a side."""
    a, b = _clean(a), _clean(b)
    if a.size < 2 or b.size < 2:
        diff = float(a.mean() - b.mean()) if a.size and b.size else math.nan
        return diff, math.nan, math.nan
    return _welch_from(float(a.mean() - b.mean()), a.var(ddof=1) / a.size, a.size - 1, b.var(ddof=1) / b.size,
                       b.size - 1, a.size + b.size - 2)


def _welch_from(diff: float, va: float, dfa: float, vb: float, dfb: float, df0: float) -> tuple[float, float, float]:
    """Welch-Satterthwaite from each side's squared standard error and degrees of freedom."""
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, 0.0, float(df0)
    den = (va ** 2 / dfa if va else 0.0) + (vb ** 2 / dfb if vb else 0.0)
    return diff, se, float((va + vb) ** 2 / den)


def pair_jackknife(values: Sequence[float], pairs: Sequence[tuple[int, int]]) -> tuple[float, float, int]:
    """``(mean, standard error, units)`` of values measured on every pair of some units exactly once
    (``pairs[p]`` names the two units of ``values[p]``): the leave-one-unit-out jackknife standard error
    (Arvesen 1969), df ``n - 1``, NaN below 3 units. Why: docs/figures.md, "Replication unit"."""
    v = _clean(values)
    pairs = [tuple(sorted((int(i), int(j)))) for i, j in pairs]
    if len(pairs) != v.size:
        raise ValueError(f"{v.size} values but {len(pairs)} pairs")
    units = sorted({u for p in pairs for u in p})
    if any(i == j for i, j in pairs) or sorted(pairs) != list(itertools.combinations(units, 2)):
        raise ValueError("pair_jackknife needs every pair of the units exactly once")
    n = len(units)
    if n < 3:
        return (float(v.mean()) if v.size else math.nan), math.nan, n
    left = np.array([v[[k for k, p in enumerate(pairs) if u not in p]].mean() for u in units])
    var = (n - 1) / n * float(np.sum((left - left.mean()) ** 2))
    return float(v.mean()), math.sqrt(var), n


def bootstrap_ci(a: Sequence[float], b: Sequence[float] | None = None, *, paired: bool = False,
                 alpha: float = ALPHA, n: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """Seeded percentile bootstrap (1 - 2 ``alpha``) interval of ``mean(a) - mean(b)`` (without ``b``: of
    ``mean(a)``; ``paired``: of the differences); NaN with fewer than 2 values a side. Reported beside the t
    interval, never deciding alone (with n = 3 it takes only a few values)."""
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


def _side(values: np.ndarray, pairs) -> tuple[float, float, float, int]:
    """``(mean, squared standard error, df, independent units)`` of one group: plain, or a pair U-statistic."""
    if pairs is None:
        if values.size < 2:
            return (float(values.mean()) if values.size else math.nan), math.nan, math.nan, int(values.size)
        return float(values.mean()), float(values.var(ddof=1) / values.size), float(values.size - 1), int(values.size)
    m, se, n = pair_jackknife(values, pairs)
    return m, se ** 2, float(n - 1), n


def greater(claim: str, source: str, a: Sequence[float], b: Sequence[float], *, names: tuple[str, str] = ("A", "B"),
            unit: str = "pairs", note: str = "", alpha: float = ALPHA, min_effect: float = 0.0,
            pairs_a: Sequence[tuple[int, int]] | None = None,
            pairs_b: Sequence[tuple[int, int]] | None = None) -> Verdict:
    """Claim ``A > B`` (independent groups) by at least ``min_effect``: Welch's one-sided t-test at ``alpha``,
    decided as its ``test`` says. ``pairs_a`` / ``pairs_b``: that side's values are measured on every pair of
    some units, its standard error :func:`pair_jackknife`'s (and no bootstrap interval)."""
    a, b = _clean(a), _clean(b)
    na, nb = names
    ma, va, dfa, ua = _side(a, pairs_a)
    mb, vb, dfb, ub = _side(b, pairs_b)
    diff = ma - mb if a.size and b.size else math.nan
    if math.isnan(va) or math.isnan(vb) or math.isnan(diff):
        se, df = math.nan, math.nan
    else:
        _, se, df = _welch_from(diff, va, dfa, vb, dfb, dfa + dfb)
    t, p_gt, p_lt = _t_sides(diff - min_effect, se, df, min(ua, ub))
    lo, hi = _interval(diff, se, df, alpha)
    blo, bhi = (bootstrap_ci(a, b, alpha=alpha) if pairs_a is None and pairs_b is None else (math.nan, math.nan))
    units = {**({f"units {na}": ua} if pairs_a is not None else {}), **({f"units {nb}": ub} if pairs_b is not None
                                                                         else {})}
    numbers = {f"mean {na}": ma, f"sd {na}": spread(a), f"n {na}": int(a.size), f"mean {nb}": mb, f"sd {nb}": spread(b),
               f"n {nb}": int(b.size), **units, "difference": diff, "ci low": lo, "ci high": hi,
               "bootstrap ci low": blo, "bootstrap ci high": bhi, "t": t, "df": df, "p": p_gt, "p against": p_lt,
               "alpha": alpha, **_minimum(min_effect), "mde": _mde_total(se, df, alpha, min_effect),
               **_no_spread(se, min(ua, ub), alpha)}
    gt, lt = (f"{na} > {nb}", f"{na} < {nb}") if not min_effect else (
        f"{na} - {nb} > {min_effect:g}", f"{na} - {nb} < {min_effect:g}")
    shared = (f"; {'/'.join(n for n, p in ((na, pairs_a), (nb, pairs_b)) if p is not None)} measured on pairs of "
              "independent units: standard error by the leave-one-unit-out jackknife, df = units - 1"
              if units else "")
    test = (f"Welch one-sided t-test over {unit}: held if p({gt}) < {alpha:g}, did not hold if "
            f"p({lt}) < {alpha:g}, else inconclusive (also with fewer than 2 {unit} a side; with no spread at all, "
            f"the sign test over the units, p = 0.5^n){shared}; "
            f"interval = {1 - 2 * alpha:.0%} Welch interval of mean({na}) - mean({nb})")
    return Verdict(claim, source, test, numbers, _three_way(p_gt, p_lt, alpha), note)


def _mde_total(se: float, df: float, alpha: float, min_effect: float) -> float:
    """The smallest true difference the test detects at :data:`POWER`: the minimum effect plus :func:`mde`."""
    return float(min_effect) + mde(se, df, alpha)


def _no_spread(se: float, n: int, alpha: float) -> dict:
    """``{"share bound": 1 - alpha^(1/n)}`` when the sign test replaced the t-test (no spread at all): the exact
    one-sided (1 - alpha) upper bound on the share of the ``n`` units that could show the effect."""
    return {"share bound": 1.0 - alpha ** (1.0 / n)} if se == 0.0 and n >= 1 else {}


def paired_greater(claim: str, source: str, a: Sequence[float], b: Sequence[float], *,
                   names: tuple[str, str] = ("A", "B"), unit: str = "seeds", note: str = "",
                   alpha: float = ALPHA, min_effect: float = 0.0) -> Verdict:
    """Claim ``A > B`` by at least ``min_effect`` for paired values (``a[i]``, ``b[i]`` share a seed): the
    one-sided paired t-test of ``mean(a - b) > min_effect`` at ``alpha``, reported as :func:`greater`."""
    a, b = _clean(a), _clean(b)
    if a.shape != b.shape:
        raise ValueError(f"paired values need equal lengths, got {a.size} and {b.size}")
    d = a - b
    m = float(d.mean()) if d.size else math.nan
    sd = spread(d)
    se, df = (sd / math.sqrt(d.size), float(d.size - 1)) if d.size >= 2 else (math.nan, math.nan)
    t, p_gt, p_lt = _t_sides(m - min_effect, se, df, d.size)
    lo, hi = _interval(m, se, df, alpha)
    blo, bhi = bootstrap_ci(a, b, paired=True, alpha=alpha)
    na, nb = names
    numbers = {f"mean {na}": float(a.mean()) if a.size else math.nan,
               f"mean {nb}": float(b.mean()) if b.size else math.nan,
               f"mean({na} - {nb})": m, f"sd({na} - {nb})": sd, f"n {unit}": int(d.size), "ci low": lo,
               "ci high": hi, "bootstrap ci low": blo, "bootstrap ci high": bhi, "t": t, "df": df, "p": p_gt,
               "p against": p_lt, "alpha": alpha, **_minimum(min_effect), "mde": _mde_total(se, df, alpha, min_effect),
               **_no_spread(se, d.size, alpha)}
    test = (f"paired one-sided t-test over {unit}: held if p(mean({na} - {nb}) > {min_effect:g}) < {alpha:g}, did not "
            f"hold if p(< {min_effect:g}) < {alpha:g}, else (or with fewer than 2 {unit}) inconclusive; with no spread "
            f"(every difference equal) the sign test over the {unit}, p = 0.5^n; interval = {1 - 2 * alpha:.0%} "
            "t interval of the mean difference")
    return Verdict(claim, source, test, numbers, _three_way(p_gt, p_lt, alpha), note)


def _minimum(min_effect: float) -> dict:
    """``{"min effect": m}`` when a minimum effect is stated (an unstated one, 0, adds nothing)."""
    return {"min effect": float(min_effect)} if min_effect else {}


def paired_ratio(claim: str, source: str, a: Sequence[float], b: Sequence[float], *, min_ratio: float,
                 names: tuple[str, str] = ("A", "B"), unit: str = "seeds", note: str = "",
                 alpha: float = ALPHA) -> Verdict:
    """Claim ``A / B > min_ratio`` for paired positive values: :func:`paired_greater` on the logarithms, with
    the geometric-mean ``ratio``, its interval (the log interval exponentiated) and ``min ratio``."""
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
    """Claim ``A ~ B`` within the margin ``tolerance``: two one-sided tests (TOST) at ``alpha``, held if the
    (1 - 2 alpha) t interval of the difference (Welch, or ``paired``) lies inside the margin, did not hold if
    wholly outside; ``p`` the larger TOST p-value, ``p against`` the smaller one beyond the margin."""
    a, b = _clean(a), _clean(b)
    if paired:
        if a.shape != b.shape:
            raise ValueError(f"paired values need equal lengths, got {a.size} and {b.size}")
        d = a - b
        diff = float(d.mean()) if d.size else math.nan
        se, df = (spread(d) / math.sqrt(d.size), float(d.size - 1)) if d.size >= 2 else (math.nan, math.nan)
        n = int(d.size)
    else:
        diff, se, df = welch(a, b)
        n = int(min(a.size, b.size))
    lo, hi = _interval(diff, se, df, alpha)
    _, p_beyond_hi, p_inside_hi = _t_sides(diff - tolerance, se, df, n)  # p(diff > +margin), p(diff < +margin)
    _, p_inside_lo, p_beyond_lo = _t_sides(diff + tolerance, se, df, n)  # p(diff > -margin), p(diff < -margin)
    p_same = max(p_inside_hi, p_inside_lo)
    p_against = min(p_beyond_hi, p_beyond_lo)
    held = _three_way(p_same, p_against, alpha)
    na, nb = names
    numbers = {f"mean {na}": float(a.mean()) if a.size else math.nan, f"sd {na}": spread(a), f"n {na}": int(a.size),
               f"mean {nb}": float(b.mean()) if b.size else math.nan, f"sd {nb}": spread(b), f"n {nb}": int(b.size),
               "difference": diff, "ci low": lo, "ci high": hi, "margin": float(tolerance), "p": p_same,
               "p against": p_against, "alpha": alpha, **_no_spread(se, n, alpha)}
    test = (f"equivalence (TOST) over {unit}{', paired' if paired else ''}: held if the {1 - 2 * alpha:.0%} t "
            f"interval of mean({na}) - mean({nb}) lies inside +-{tolerance:g}, did not hold if it lies wholly "
            f"outside, else (or with fewer than 2 {unit} a side) inconclusive")
    return Verdict(claim, source, test, numbers, held, note)


def below(claim: str, source: str, values: Sequence[float], bound: float, *, name: str = "value",
          unit: str = "seeds", note: str = "", alpha: float = ALPHA,
          pairs: Sequence[tuple[int, int]] | None = None) -> Verdict:
    """Claim that a quantity is below the effect-size ``bound`` ("approximately": below a stated size, not
    exactly none): the one-sample one-sided t-test of ``mean < bound``; ``pairs`` as in :func:`greater`."""
    return _bound(claim, source, values, bound, below=True, name=name, unit=unit, note=note, alpha=alpha,
                  pairs=pairs)


def above(claim: str, source: str, values: Sequence[float], bound: float, *, name: str = "value",
          unit: str = "seeds", note: str = "", alpha: float = ALPHA,
          pairs: Sequence[tuple[int, int]] | None = None) -> Verdict:
    """Claim that a quantity exceeds an effect-size ``bound``: the one-sample one-sided t-test of ``mean > bound``
    (held / did not hold / inconclusive as :func:`below`, mirrored; ``pairs`` as there)."""
    return _bound(claim, source, values, bound, below=False, name=name, unit=unit, note=note, alpha=alpha,
                  pairs=pairs)


def _bound(claim, source, values, bound, *, below: bool, name, unit, note, alpha, pairs=None) -> Verdict:
    v = _clean(values)
    m, var, df, units = _side(v, pairs)
    se = math.sqrt(var) if not math.isnan(var) else math.nan
    t, p_gt, p_lt = _t_sides(m - bound, se, df, units)
    p_claim, p_other = (p_lt, p_gt) if below else (p_gt, p_lt)
    lo, hi = _interval(m, se, df, alpha)
    numbers = {f"mean {name}": m, f"sd {name}": spread(v), f"n {unit}": int(v.size),
               **({"units": units} if pairs is not None else {}), "bound": float(bound), "below": bool(below),
               "ci low": lo, "ci high": hi, "t": t, "p": p_claim, "p against": p_other, "alpha": alpha,
               **_no_spread(se, units, alpha)}
    way, other = ("<", ">") if below else (">", "<")
    test = (f"effect-size bound: one-sample one-sided t-test over {unit}; held if p(mean {name} {way} {bound:g}) < "
            f"{alpha:g}, did not hold if p(mean {name} {other} {bound:g}) < {alpha:g}, else (or with fewer than 2 "
            f"{unit}) inconclusive")
    return Verdict(claim, source, test, numbers, _three_way(p_claim, p_other, alpha), note)


def ordered(claim: str, source: str, groups: Mapping[float, Sequence[float]], *, decreasing: bool = True,
            key: str = "k", unit: str = "pairs", note: str = "", alpha: float = ALPHA) -> Verdict:
    """Claim that the values fall (``decreasing``) or rise as ``key`` grows: the one-sided Spearman rank
    correlation over every value (``scipy.stats.spearmanr``); inconclusive below 3 values or 2 keys."""
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
               "spearman rho": rho, "p": p_claim, "p against": p_other, "alpha": alpha}
    way = "falls" if decreasing else "rises"
    test = (f"monotone trend: Spearman rank correlation of the values ({unit}) with {key}, one-sided; held if it "
            f"{way} with p < {alpha:g}, did not hold if the opposite trend has p < {alpha:g}, else inconclusive")
    return Verdict(claim, source, test, numbers, _three_way(p_claim, p_other, alpha), note)


def most_above(claim: str, source: str, values: Sequence[float], bound: float, *, name: str = "value",
               unit: str = "directions", note: str = "", alpha: float = ALPHA) -> Verdict:
    """Claim that most of a sample exceeds ``bound``: the exact one-sided binomial test against one half."""
    from scipy import stats

    v = _clean(values)
    v = v[np.isfinite(v)]
    n, k = int(v.size), int(np.sum(v > bound))
    p_more = float(stats.binom.sf(k - 1, n, 0.5)) if n else math.nan
    p_less = float(stats.binom.cdf(k, n, 0.5)) if n else math.nan
    numbers = {f"{unit} above {bound:.3g}": k, f"n {unit}": n, f"median {name}": float(np.median(v)) if n else math.nan,
               "bound": float(bound), "p": p_more, "p against": p_less, "alpha": alpha}
    test = (f"exact one-sided binomial test over {unit}: held if the share of {name} above {bound:g} exceeds one half "
            f"with p < {alpha:g}, did not hold if it falls short of one half with p < {alpha:g}, else inconclusive")
    return Verdict(claim, source, test, numbers, _three_way(p_more, p_less, alpha), note)


def inconclusive(verdict: Verdict, reason: str) -> Verdict:
    """The verdict (and every part) marked inconclusive because it rests on an invalid regime, with ``reason``."""
    note = f"{INVALID}: {reason}." + (f" {verdict.note}" if verdict.note else "")
    parts = tuple(inconclusive(p, reason) for p in verdict.parts)
    numbers = dict(verdict.numbers)
    if parts and {"held", "did not hold", "inconclusive"} <= set(numbers):  # an all_of: its counts follow the parts
        numbers.update({"held": 0, "did not hold": 0, "inconclusive": len(parts)})
    return dataclasses.replace(verdict, held=None, note=note, numbers=numbers, parts=parts)


def all_of(claim: str, source: str, parts: Sequence[Verdict], *, note: str = "") -> Verdict:
    """Claim that holds for every part: held if every part held (intersection-union), did not hold if some
    part did after Holm's correction (:func:`holm`) over the parts' ``p against``; a part refuted only before
    it turns inconclusive, with ``p against (Holm)``. Parts without a p-value keep their status."""
    parts = list(parts)
    p_against = [float(p.numbers.get("p against", math.nan)) if isinstance(p.numbers.get("p against"), (int, float))
                 else math.nan for p in parts]
    adjusted = holm(p_against)
    tested = sum(not math.isnan(p) for p in p_against)
    judged = []
    for part, raw, adj in zip(parts, p_against, adjusted, strict=True):
        if math.isnan(raw) or tested < 2:
            judged.append(part)
            continue
        numbers = {**part.numbers, "p against (Holm)": adj}
        if part.held is False and not adj < ALPHA:
            judged.append(dataclasses.replace(
                part, held=None, numbers=numbers,
                note=(f"did not hold at alpha {ALPHA:g} alone (p against {raw:.3g}), not after Holm's correction over "
                      f"{tested} parts (adjusted {adj:.3g})." + (f" {part.note}" if part.note else ""))))
        else:
            judged.append(dataclasses.replace(part, numbers=numbers))
    held_n = sum(p.held is True for p in judged)
    failed = sum(p.held is False for p in judged)
    held = False if failed else (True if judged and held_n == len(judged) else None)
    numbers = {"held": held_n, "did not hold": failed, "inconclusive": len(judged) - held_n - failed}
    adjusted_by = (f"after Holm's step-down correction over the {tested} parts' p-values against the claim (parts "
                   "without a p-value unadjusted)" if tested >= 2 else "(no two parts with a p-value: nothing to adjust)")
    test = ("held if every part held at alpha (intersection-union: no correction needed), did not hold if some part "
            f"did not hold {adjusted_by}, else inconclusive")
    return Verdict(claim, source, test, numbers, held, note, tuple(judged))


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
    held = True if value < lo else (False if value >= med else None)  # NaN compares False: inconclusive
    frac = float(np.mean(s > value)) if s.size else math.nan
    numbers = {nv: value, f"median {ns}": med, f"q{quantile:g} {ns}": lo, f"fraction of {ns} above": frac,
               f"n {ns}": int(s.size)}
    test = (f"held if {nv} < the {quantile:g} quantile of {ns}, did not hold if {nv} >= their median, "
            "else inconclusive")
    return Verdict(claim, source, test, numbers, held, note)
