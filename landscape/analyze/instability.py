"""A table of linear interpolation instabilities over many checkpoint pairs (Watson et al. Fig. 5).

One :class:`PairInstability` row per pair: which runs, the Phase-1 length ``k``, the Phase-1 and Phase-2
optimizers, epsilon, and Watson et al. Def. 2.3 per split for the loss and the error. Pure: rows in, CSV /
HDF5 out; pairing runs from manifests is :func:`sibling_pairs` / :func:`all_pairs` on plain manifest data.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from landscape.results import InputRef, read_result, write_result

KIND = "instability"


@dataclass
class PairInstability:
    """One interpolated pair (final checkpoints of two runs)."""

    pair: str
    ref_a: str
    ref_b: str
    group: str | None
    k: float  # Phase-1 length in epochs (NaN when the runs were not made by `landscape phases`)
    phase1: str | None
    phase2: str | None  # the Phase-2 optimizer ("sgd" | "dpsgd"); for mixed pairs "sgd/dpsgd"
    epsilon: float  # the DP target of the phases group, else the checkpoints' epsilon (NaN for SGD)
    instability_loss: dict[str, float]
    instability_error: dict[str, float]
    result: str = ""  # the pair's interpolation result file

    def flat(self, splits: Sequence[str]) -> dict[str, object]:
        row: dict[str, object] = {
            "pair": self.pair, "ref_a": self.ref_a, "ref_b": self.ref_b, "group": self.group or "",
            "k": self.k, "phase1": self.phase1 or "", "phase2": self.phase2 or "", "epsilon": self.epsilon,
        }
        for s in splits:
            row[f"instability_{s}_loss"] = self.instability_loss.get(s, math.nan)
            row[f"instability_{s}_error"] = self.instability_error.get(s, math.nan)
        row["result"] = self.result
        return row


_TEXT = ("pair", "ref_a", "ref_b", "group", "phase1", "phase2", "result")


@dataclass
class InstabilityTable:
    """All pairs, the splits they were evaluated on, and the interpolation options used."""

    rows: list[PairInstability]
    splits: tuple[str, ...]
    params: dict = field(default_factory=dict)
    inputs: list[InputRef] = field(default_factory=list)
    path: Path | None = None
    csv_path: Path | None = None
    figures: list[Path] = field(default_factory=list)

    def records(self) -> list[dict[str, object]]:
        return [r.flat(self.splits) for r in self.rows]

    def columns(self) -> list[str]:
        return list(PairInstability("", "", "", None, math.nan, None, None, math.nan, {}, {}).flat(self.splits))

    def to_csv(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.columns())
            writer.writeheader()
            for rec in self.records():
                writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()})
        self.csv_path = path
        return path

    def to_hdf5(self, path: str | Path, inputs: Sequence[InputRef] = ()) -> Path:
        records = self.records()
        arrays = {}
        for col in self.columns():
            values = [rec[col] for rec in records]
            if col in _TEXT:
                arrays[col] = np.array([str(v).encode() for v in values], dtype=object).astype("S")
            else:
                arrays[col] = np.array(values, dtype=np.float64)
        inputs = list(inputs) or self.inputs
        self.path = write_result(path, KIND, arrays=arrays, attrs={"splits": ",".join(self.splits),
                                                                   "pairs": len(self.rows)},
                                 params=self.params, inputs=inputs)
        self.inputs = inputs
        return self.path

    @classmethod
    def from_hdf5(cls, path: str | Path) -> InstabilityTable:
        r = read_result(path, KIND)
        splits = tuple(s for s in str(r.attrs.get("splits", "")).split(",") if s)
        n = int(r.attrs.get("pairs", 0))
        cols = {k: (np.array([v.decode() if isinstance(v, bytes) else str(v) for v in a]) if k in _TEXT else a)
                for k, a in r.arrays.items()}
        rows = []
        for i in range(n):
            rows.append(PairInstability(
                pair=str(cols["pair"][i]), ref_a=str(cols["ref_a"][i]), ref_b=str(cols["ref_b"][i]),
                group=str(cols["group"][i]) or None, k=float(cols["k"][i]), phase1=str(cols["phase1"][i]) or None,
                phase2=str(cols["phase2"][i]) or None, epsilon=float(cols["epsilon"][i]),
                instability_loss={s: float(cols[f"instability_{s}_loss"][i]) for s in splits},
                instability_error={s: float(cols[f"instability_{s}_error"][i]) for s in splits},
                result=str(cols["result"][i]),
            ))
        return cls(rows=rows, splits=splits, params=r.params, inputs=r.inputs, path=Path(path))


# --------------------------------------------------------------------------------------------- pairing


@dataclass(frozen=True)
class RunInfo:
    """What pairing needs from a run manifest."""

    name: str
    phases: Mapping | None
    lineage: Mapping | None


def sibling_key(run: RunInfo) -> tuple | None:
    """Siblings share the phases group, the parent (run, step) and the Phase-2 optimizer; None if not a Phase-2 run."""
    ph, lin = run.phases or {}, run.lineage or {}
    if not ph or ph.get("phase2") is None or not lin.get("parent_run"):
        return None
    return (ph.get("group"), lin.get("parent_run"), lin.get("parent_step"), ph.get("phase1"), ph.get("phase2"))


def sibling_pairs(runs: Sequence[RunInfo]) -> list[tuple[RunInfo, RunInfo]]:
    """Every pair of Phase-2 copies made from the same Phase-1 checkpoint with the same Phase-2 optimizer."""
    groups: dict[tuple, list[RunInfo]] = {}
    for run in runs:
        key = sibling_key(run)
        if key is not None:
            groups.setdefault(key, []).append(run)
    out = []
    for key in sorted(groups, key=lambda k: tuple(str(v) for v in k)):
        members = sorted(groups[key], key=lambda r: (_copy_of(r), r.name))
        out += list(itertools.combinations(members, 2))
    return out


def all_pairs(runs: Sequence[RunInfo]) -> list[tuple[RunInfo, RunInfo]]:
    return list(itertools.combinations(sorted(runs, key=lambda r: r.name), 2))


def pair_labels(a: RunInfo, b: RunInfo) -> dict[str, object]:
    """k, phase1, phase2 and the epsilon target of a pair from its manifests (NaN / None when absent)."""
    pa, pb = a.phases or {}, b.phases or {}

    def same(key):
        va, vb = pa.get(key), pb.get(key)
        if va == vb:
            return va
        return f"{va}/{vb}"

    k = pa.get("k") if pa.get("k") == pb.get("k") else None
    eps = pa.get("epsilon_target") if pa.get("epsilon_target") == pb.get("epsilon_target") else None
    phase2 = same("phase2")
    if phase2 == "sgd":
        eps = None
    return {"group": same("group"), "k": math.nan if k is None else float(k), "phase1": same("phase1"),
            "phase2": phase2, "epsilon": math.nan if eps is None else float(eps)}


def _copy_of(run: RunInfo) -> int:
    c = (run.phases or {}).get("copy")
    return int(c) if isinstance(c, (int, float)) else 0

