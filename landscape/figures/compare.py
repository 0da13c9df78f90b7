"""Two summaries of one recipe side by side: which verdict parts move between machines or float kernels
(training is chaotic: another CPU's kernels can flip a part decided near alpha). Used by ``landscape figures
--compare``; docs/figures.md, "Verdicts on another machine".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from landscape.verdict import STATUS, Verdict

WHOLE = "whole claim"


@dataclass(frozen=True)
class PartChange:
    """One verdict part in both summaries: ``status`` (``held`` / ``did not hold`` / ``inconclusive``, or ``absent``
    where a summary has no such part), the claim's ``p`` and the ``p_against`` that decides "did not hold" (Holm's
    adjusted value where the part has one; NaN where the rule has no p-value)."""

    claim: str
    status: tuple[str, str]
    p: tuple[float, float]
    p_against: tuple[float, float]

    @property
    def moved(self) -> bool:
        return self.status[0] != self.status[1]

    def line(self) -> str:
        def side(i: int) -> str:
            ps = [f"{k} {v[i]:.3g}" for k, v in (("p", self.p), ("p against", self.p_against)) if math.isfinite(v[i])]
            return self.status[i] + (f" ({', '.join(ps)})" if ps else "")

        return f"{'moved' if self.moved else 'same '}  {self.claim}: {side(0)} | {side(1)}"

    def to_dict(self) -> dict:
        return {"claim": self.claim, "moved": self.moved, "status": list(self.status),
                "p": [_plain(v) for v in self.p], "p_against": [_plain(v) for v in self.p_against]}


@dataclass(frozen=True)
class Comparison:
    """Summary ``b`` of a recipe against the reference ``a`` (:func:`compare`)."""

    recipe: str
    scale: str
    paths: tuple[Path, Path]
    parts: tuple[PartChange, ...]  # the whole verdict first, then its parts
    chosen: tuple[str, str] | None  # the selected setting of each, when the recipe selects one
    arrays_differ: tuple[str, ...]  # the stored numbers (datasets) that are not bit-identical
    arrays: int
    kernels: tuple[str, str]
    settings_differ: tuple[str, ...]

    @property
    def moved(self) -> list[PartChange]:
        """The parts (and the whole claim) whose outcome differs."""
        return [p for p in self.parts if p.moved]

    def lines(self) -> list[str]:
        """The comparison as printed: a heading, one line per part (reference | this one), the setting and
        numbers."""
        a, b = self.paths
        parts = [p for p in self.parts if p.claim != WHOLE]
        head = (f"compare {self.recipe} [{self.scale}]: {len([p for p in parts if p.moved])} of {len(parts)} parts "
                f"moved; the whole claim {'moved' if self.parts[0].moved else 'did not move'}")
        lines = [head, f"  reference {a} ({self.kernels[0]}) | this {b} ({self.kernels[1]})"]
        lines += [f"  {p.line()}" for p in self.parts]
        if self.chosen is not None:
            lines.append(f"  {'moved' if self.chosen[0] != self.chosen[1] else 'same '}  chosen setting: "
                         f"{self.chosen[0]} | {self.chosen[1]}")
        differ = len(self.arrays_differ)
        lines.append(f"  numbers: {'bit-identical' if not differ else f'{differ} of {self.arrays} arrays differ'}"
                     + (f" ({', '.join(self.arrays_differ[:6])}{', ...' if differ > 6 else ''})" if differ else ""))
        if self.settings_differ:
            lines.append(f"  settings differ: {', '.join(self.settings_differ)} (not the same recipe settings)")
        return lines

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "scale": self.scale, "paths": [str(p) for p in self.paths],
                "moved": [p.claim for p in self.moved], "parts": [p.to_dict() for p in self.parts],
                "chosen": list(self.chosen) if self.chosen is not None else None,
                "arrays_differ": list(self.arrays_differ), "arrays": self.arrays, "kernels": list(self.kernels),
                "settings_differ": list(self.settings_differ)}


def compare(a: str | Path, b: str | Path) -> Comparison:
    """Summary ``b`` against the reference ``a`` (two HDF5 summaries of one recipe at one scale): per verdict part
    both outcomes and p-values and whether it moved, the chosen settings, the arrays that differ, the kernels.

    Raises :class:`~landscape.errors.UsageError` (one line) when a file is not a recipe summary or the two are of
    different recipes or scales."""
    from landscape.errors import UsageError

    a, b = Path(a), Path(b)
    sa, sb = _read(a), _read(b)
    if (sa["recipe"], sa["scale"]) != (sb["recipe"], sb["scale"]):
        raise UsageError(f"cannot compare {a} ({sa['recipe']} at {sa['scale']} scale) with {b} ({sb['recipe']} at "
                         f"{sb['scale']} scale): not the same recipe and scale")
    parts = [_change(WHOLE, sa["verdict"], sb["verdict"])]
    pa, pb = _by_claim(sa["verdict"]), _by_claim(sb["verdict"])
    for key in [*pa, *(k for k in pb if k not in pa)]:
        parts.append(_change(key[0], pa.get(key), pb.get(key)))
    chosen = (sa["chosen"], sb["chosen"]) if sa["chosen"] is not None or sb["chosen"] is not None else None
    keys = sorted(set(sa["numbers"]) | set(sb["numbers"]))
    differ = tuple(k for k in keys if not _same(sa["numbers"].get(k), sb["numbers"].get(k)))
    settings = tuple(sorted(k for k in set(sa["settings"]) | set(sb["settings"])
                            if sa["settings"].get(k) != sb["settings"].get(k)))
    return Comparison(sa["recipe"], sa["scale"], (a, b), tuple(parts),
                      None if chosen is None else (chosen[0] or "none", chosen[1] or "none"),
                      differ, len(keys), (sa["kernels"], sb["kernels"]), settings)


def _read(path: Path) -> dict:
    import h5py

    from landscape.errors import UsageError
    from landscape.figures.recipe import read_sensitivity, read_summary

    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("kind") != "figure-recipe":
                raise UsageError(f"{path} is not a figure recipe's summary")
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        numbers, verdict, _ = read_summary(path)
    except OSError as exc:
        raise UsageError(f"cannot read the summary {path}: {exc}") from None
    chosen = next((e["label"] for e in read_sensitivity(path) if e.get("role") == "chosen"), None)
    portable = bool(attrs.get("portable", False))
    kernels = "portable" if portable else str(attrs.get("kernels", "kernels not recorded"))
    return {"recipe": str(attrs["recipe"]), "scale": str(attrs["scale"]), "numbers": numbers,
            "verdict": verdict, "settings": json.loads(attrs["settings"]),
            "chosen": chosen, "kernels": kernels}


def _by_claim(verdict: Verdict) -> dict[tuple[str, int], Verdict]:
    """The parts by (claim, how many parts before it share the claim): a part that one summary lacks (an arm cut
    after its first non-viable setting) is matched with none."""
    out: dict[tuple[str, int], Verdict] = {}
    for p in verdict.parts:
        out[(p.claim, sum(k[0] == p.claim for k in out))] = p
    return out


def _change(claim: str, a: Verdict | None, b: Verdict | None) -> PartChange:
    def get(v: Verdict | None, *keys: str) -> float:
        for key in keys:
            x = v.numbers.get(key) if v is not None else None
            if isinstance(x, (int, float)) and not isinstance(x, bool):
                return float(x)
        return math.nan

    return PartChange(claim, tuple(STATUS[v.held] if v is not None else "absent" for v in (a, b)),
                      (get(a, "p"), get(b, "p")),
                      (get(a, "p against (Holm)", "p against"), get(b, "p against (Holm)", "p against")))


def _same(x: np.ndarray | None, y: np.ndarray | None) -> bool:
    if x is None or y is None:
        return x is None and y is None
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.dtype.kind in "fc":
        return bool(np.array_equal(x, y, equal_nan=True))
    return bool(np.array_equal(x, y))


def _plain(v: float) -> float | None:
    return None if math.isnan(v) else float(v)
