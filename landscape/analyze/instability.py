"""A table of linear interpolation instabilities over many checkpoint pairs (Watson et al. Fig. 5), and how
runs are paired (siblings: trained from one parent checkpoint the same way)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from landscape.analyze.interpolate import compute_pair as interpolate_pair
from landscape.analyze.specs import InstabilityOptions
from landscape.results import StoredResult, stored, table_columns, write_csv

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
    instability_loss: dict[str, float] = stored("column", name="instability_{}_loss")
    instability_error: dict[str, float] = stored("column", name="instability_{}_error")
    # sup_a L_a - ((1-a) L_A + a L_B): the bump above the chord (InterpolationResult.chord_barrier_loss)
    chord_barrier_loss: dict[str, float] = stored("column", name="chord_barrier_{}_loss", default_factory=dict)
    # after aligning B to A (--align); NaN without it
    instability_loss_aligned: dict[str, float] = stored("column", name="instability_{}_loss_aligned",
                                                        default_factory=dict)
    instability_error_aligned: dict[str, float] = stored("column", name="instability_{}_error_aligned",
                                                         default_factory=dict)
    result: str = ""  # the pair's interpolation result file
    epsilon_spent: float = math.nan  # the larger epsilon the two checkpoints spent (NaN when neither is DP)
    reused: bool = False  # read back from its current file in the pair directory, not computed again

    def flat(self, splits: Sequence[str]) -> dict[str, object]:
        return {k: v[0] for k, v in table_columns([self], PairInstability, splits).items()}


@dataclass
class InstabilityTable(StoredResult):
    """All pairs, the splits they were evaluated on, and the interpolation options used."""

    KIND = KIND

    rows: list[PairInstability] = stored("table", order="splits", count="pairs")
    splits: tuple[str, ...] = stored("attr", default=())
    params: dict = field(default_factory=dict)
    csv_path: Path | None = stored("skip", default=None)  # the companion CSV, not in the file

    def records(self) -> list[dict[str, object]]:
        return [r.flat(self.splits) for r in self.rows]

    def columns(self) -> list[str]:
        return list(table_columns([], PairInstability, self.splits))

    def to_csv(self, path: str | Path) -> Path:
        self.csv_path = write_csv(path, self.records(), self.columns())
        return self.csv_path


@dataclass(frozen=True)
class RunInfo:
    """What pairing needs from a run manifest."""

    name: str
    phases: Mapping | None
    lineage: Mapping | None
    config: Mapping | None = None
    privacy: Mapping | None = None


def continued_with(run: RunInfo) -> str | None:
    """How a child run went on from its parent: the Phase-2 optimizer, else its config's optimizer, else
    ``"dpsgd"`` for a recorded run whose privacy is accounted (Opacus), else None."""
    ph, config, privacy = run.phases or {}, run.config or {}, run.privacy or {}
    if ph.get("phase2") is not None:
        return str(ph["phase2"])
    if isinstance(config.get("optimizer"), str):
        return config["optimizer"]
    return "dpsgd" if privacy.get("accounted") else None


def sibling_key(run: RunInfo) -> tuple | None:
    """Siblings are runs trained from the same parent checkpoint that went on the same way, whatever wrote
    them (``phases``, ``train --from``, a Recorder with ``parent=``); copies not trained from their parent
    (pruned, aligned) and runs without a parent are no one's siblings: None."""
    lin, config = run.lineage or {}, run.config or {}
    if not lin.get("parent_run") and not lin.get("parent_sha256"):
        return None
    if lin.get("aligned_to") or config.get("command") in ("prune", "align"):
        return None
    parent = lin.get("parent_sha256") or (lin.get("parent_run"), lin.get("parent_step"))
    return (str(parent), continued_with(run))


def sibling_pairs(runs: Sequence[RunInfo]) -> list[tuple[RunInfo, RunInfo]]:
    """Every pair of runs trained from the same parent checkpoint the same way (:func:`sibling_key`)."""
    groups: dict[tuple, list[RunInfo]] = {}
    for run in runs:
        key = sibling_key(run)
        if key is not None:
            groups.setdefault(key, []).append(run)
    def order(key: tuple) -> tuple[str, ...]:  # by parent run, step and how they went on: phases' group order
        lin = groups[key][0].lineage or {}
        return str(lin.get("parent_run")), str(lin.get("parent_step")), str(key[1]), key[0]

    out = []
    for key in sorted(groups, key=order):
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
        return va if va == vb else f"{va}/{vb}"

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


def compute_pair(a, b, config, labels: Mapping, result=None) -> tuple[PairInstability, object]:
    """One row: A and B interpolated (or ``result``, read back) with the pair's labels; a DP pair's epsilon
    defaults to the larger of the checkpoints' own."""
    reused = result is not None
    result = interpolate_pair(a, b, config) if result is None else result
    eps = labels["epsilon"]
    known = [e for e in (a.checkpoint.epsilon, b.checkpoint.epsilon) if e is not None]
    spent = float(max(known)) if known else math.nan
    if math.isnan(eps) and labels["phase2"] != "sgd":
        eps = spent
    row = PairInstability(
        pair=f"{a.ref}:{b.ref}", ref_a=a.ref, ref_b=b.ref, group=labels["group"], k=labels["k"],
        phase1=labels["phase1"], phase2=labels["phase2"], epsilon=eps,
        instability_loss=dict(result.instability_loss), chord_barrier_loss=dict(result.chord_barrier_loss),
        instability_error=dict(result.instability_error), epsilon_spent=spent,
        instability_loss_aligned=dict(result.instability_loss_aligned),
        instability_error_aligned=dict(result.instability_error_aligned), reused=reused,
    )
    return row, result


def collect(rows: list[PairInstability], config, options: InstabilityOptions) -> InstabilityTable:
    return InstabilityTable(rows=rows, splits=tuple(config.split),
                            params={**dataclasses.asdict(config), "pairs": options.pairs})


def _printed(table: InstabilityTable) -> list[dict]:
    aligned = ("", "_aligned") if table.params.get("align") else ("",)
    columns = ["pair", "k", "phase2", "epsilon", "epsilon_spent"] + [
        c for s in table.splits for c in (f"chord_barrier_{s}_loss", *(f"instability_{s}_{m}{a}"
                                                                         for m in ("loss", "error") for a in aligned))]
    labels = ("k", "epsilon", "epsilon_spent")  # NaN there: not applicable (no phases, an SGD pair), shown "-"
    return [{c: None if c in labels and isinstance(r[c], float) and math.isnan(r[c]) else r[c]
             for c in columns} for r in table.records()]


def _notes(table: InstabilityTable) -> list[str]:
    reused = [r for r in table.rows if r.reused]
    if not reused:
        return []
    where = ", ".join(sorted({str(Path(r.result).parent) for r in reused}))
    return [f"reused {len(reused)} of {len(table.rows)} pairs from {where} (their checkpoints, options, data and "
            f"code version match; remove a file there, or give another --pair-dir, to compute it again)"]


def _details(t: InstabilityTable) -> dict:
    return {"csv": str(t.csv_path), "rows": t.records()}
