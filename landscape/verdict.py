"""Verdicts: a paper's claim, the rule it was judged by, the measured numbers and whether it held.

A :class:`Verdict` is what the demo (and the figure recipes) print instead of asserting a claim: ``held`` is
computed from ``numbers`` by a stated rule, never written by hand, and is three-valued -- ``True`` (held),
``False`` (did not hold) or ``None`` (inconclusive: the difference is within the spread, or the spread could
not be measured). The helpers below are the common rules; each one states itself in words in ``test``.

Spread is the sample standard deviation (``ddof=1``) of the values in a group (e.g. the instabilities of the
sibling pairs of one Phase-1 length k); a group with fewer than two values has no measurable spread.
"""

from __future__ import annotations

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


def compare(gap: float, noise: float) -> bool | None:
    """The three-valued rule every helper uses: ``True`` if ``gap > noise``, ``False`` if ``gap < -noise``,
    ``None`` if ``|gap| <= noise`` or the noise is not measurable (NaN)."""
    if math.isnan(gap) or math.isnan(noise):
        return None
    if gap > noise:
        return True
    if gap < -noise:
        return False
    return None


GREATER_RULE = ("held if mean(A) - mean(B) > sd(A) + sd(B) (sample sd over {unit}), did not hold if it is "
                "< -(sd(A) + sd(B)), else (or with fewer than 2 {unit} a side) inconclusive")


def greater(claim: str, source: str, a: Sequence[float], b: Sequence[float], *, names: tuple[str, str] = ("A", "B"),
            unit: str = "pairs", note: str = "") -> Verdict:
    """Claim ``A > B`` by more than the spread: see :data:`GREATER_RULE`."""
    a, b = list(map(float, a)), list(map(float, b))
    ma, mb = (float(np.mean(x)) if x else math.nan for x in (a, b))
    sa, sb = spread(a), spread(b)
    na, nb = names
    numbers = {f"mean {na}": ma, f"sd {na}": sa, f"n {na}": len(a), f"mean {nb}": mb, f"sd {nb}": sb,
               f"n {nb}": len(b)}
    test = GREATER_RULE.format(unit=unit).replace("(A)", f"({na})").replace("(B)", f"({nb})")
    return Verdict(claim, source, test, numbers, compare(ma - mb, sa + sb), note)


def all_of(claim: str, source: str, parts: Sequence[Verdict], *, note: str = "") -> Verdict:
    """Claim that holds for every part: held if every part held, did not hold if any part did not, else
    inconclusive."""
    held_n = sum(p.held is True for p in parts)
    failed = sum(p.held is False for p in parts)
    held = False if failed else (True if parts and held_n == len(parts) else None)
    numbers = {"held": held_n, "did not hold": failed, "inconclusive": len(parts) - held_n - failed}
    return Verdict(claim, source, "held if every part held, did not hold if any part did not, else inconclusive",
                   numbers, held, note, tuple(parts))


def ordered(claim: str, source: str, groups: Mapping[float, Sequence[float]], *, decreasing: bool = True,
            key: str = "k", unit: str = "pairs", note: str = "") -> Verdict:
    """Claim that the group means fall (``decreasing``) or rise as ``key`` grows.

    Each consecutive step (in sorted ``key``) is judged by :func:`compare` with gap = the change in the mean
    in the claimed direction and noise = the sum of the two groups' spreads. Held if every step moves as
    claimed, did not hold if any step moves the other way by more than its noise, else inconclusive.
    """
    keys = sorted(groups)
    means = [float(np.mean(groups[k])) if len(groups[k]) else math.nan for k in keys]
    sds = [spread(groups[k]) for k in keys]
    sign = -1.0 if decreasing else 1.0
    steps = [compare(sign * (means[i + 1] - means[i]), sds[i] + sds[i + 1]) for i in range(len(keys) - 1)]
    held = False if any(s is False for s in steps) else (True if steps and all(steps) else None)
    numbers = {key: [_plain(k) for k in keys], "mean": means, "sd": sds}
    way = "falls" if decreasing else "rises"
    test = (f"held if the mean {way} at every step in {key} by more than the two groups' summed sd (sample sd "
            f"over {unit}), did not hold if any step goes the other way by more, else inconclusive")
    return Verdict(claim, source, test, numbers, held, note)


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


def similar(claim: str, source: str, a: Sequence[float], b: Sequence[float], *, tolerance: float,
            names: tuple[str, str] = ("A", "B"), unit: str = "seeds", note: str = "") -> Verdict:
    """Claim ``A ~ B``: held if |mean(A) - mean(B)| <= sd(A) + sd(B) + ``tolerance``, did not hold if it is larger;
    inconclusive with fewer than two values a side (no spread) or NaN. ``tolerance`` is the difference the claim
    still calls "the same" (e.g. one accuracy point), stated in the rule."""
    a, b = list(map(float, a)), list(map(float, b))
    ma, mb = (float(np.mean(x)) if x else math.nan for x in (a, b))
    sa, sb = spread(a), spread(b)
    na, nb = names
    gap = abs(ma - mb)
    bound = sa + sb + tolerance
    held = None if math.isnan(gap) or math.isnan(bound) else bool(gap <= bound)
    numbers = {f"mean {na}": ma, f"sd {na}": sa, f"n {na}": len(a), f"mean {nb}": mb, f"sd {nb}": sb,
               f"n {nb}": len(b), "tolerance": tolerance}
    test = (f"held if |mean({na}) - mean({nb})| <= sd({na}) + sd({nb}) + {tolerance:g} (sample sd over {unit}), "
            f"else did not hold; inconclusive with fewer than 2 {unit} a side")
    return Verdict(claim, source, test, numbers, held, note)


def paired_greater(claim: str, source: str, a: Sequence[float], b: Sequence[float], *,
                   names: tuple[str, str] = ("A", "B"), unit: str = "seeds", note: str = "") -> Verdict:
    """Claim ``A > B`` for paired measurements (``a[i]`` and ``b[i]`` share a seed: the same initialisation or data
    order): held if the mean of the differences ``a[i] - b[i]`` exceeds their sample sd, did not hold if it is below
    minus their sd, else (or with fewer than two pairs) inconclusive."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired values need equal lengths, got {a.size} and {b.size}")
    d = a - b
    m = float(d.mean()) if d.size else math.nan
    sd = spread(d)
    na, nb = names
    numbers = {f"mean {na}": float(a.mean()) if a.size else math.nan,
               f"mean {nb}": float(b.mean()) if b.size else math.nan,
               f"mean({na} - {nb})": m, f"sd({na} - {nb})": sd, f"n {unit}": int(d.size)}
    test = (f"held if mean({na} - {nb}) > sd({na} - {nb}) over {unit} (paired by seed), did not hold if it is "
            f"< -sd, else (or with fewer than 2 {unit}) inconclusive")
    return Verdict(claim, source, test, numbers, compare(m, sd), note)
