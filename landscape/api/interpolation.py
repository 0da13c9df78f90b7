"""The interpolation tour the demo runs (Watson et al. Figs. 5-8): sibling instabilities, then single
pairs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from landscape.analyze.instability import InstabilityTable
from landscape.analyze.interpolate import InterpolationResult
from landscape.analyze.specs import InterpolateConfig
from landscape.store import Store


@dataclasses.dataclass
class Tour:
    """What :func:`tour` made: the sibling table and the single interpolations, with their files."""

    table: InstabilityTable
    interpolations: list[tuple[str, InterpolationResult]]  # (what, result)

    def rows(self) -> list[dict]:
        """One row per interpolated pair (siblings first): the test-split chord barrier beside the
        instabilities; a DP pair is labelled with the epsilon its checkpoints spent (not the phases'
        target)."""
        split = "test" if "test" in self.table.splits else self.table.splits[0]

        def row(pair: str, kind: str, r) -> dict:
            return {"pair": pair, "kind": kind,
                    f"chord_barrier_{split}_loss": r.chord_barrier_loss.get(split, math.nan),
                    f"instability_{split}_loss": r.instability_loss[split],
                    f"instability_{split}_error": r.instability_error[split]}

        rows = [row(r.pair, f"siblings {r.phase2}" + (f" eps={r.epsilon_spent:.3g}"
                                                        if not math.isnan(r.epsilon_spent) else ""), r)
                for r in self.table.rows]
        return rows + [row(":".join(i.ref for i in res.inputs), what, res)
                       for what, res in self.interpolations]

    def files(self) -> list[Path]:
        out = [self.table.path, self.table.csv_path, *self.table.figures]
        for _, res in self.interpolations:
            out += [res.path, *res.figures]
        return [p for p in out if p is not None]


def tour(pattern: str, *, root: str | Path = "checkpoints", out_dir: str | Path = "results",
         config: InterpolateConfig | None = None, workers: int = 1, data_root: str | None = None) -> Tour:
    """Everything interpolation offers for runs made by ``landscape phases`` (the demo calls this).

    1. every sibling pair's instability (Watson et al. Fig. 5) -> ``out_dir/instability.{h5,csv,png,pdf}``;
    2. Phase 1 -> Phase 2 for copy 0 of each Phase-2 optimizer (Watson et al. Fig. 8);
    3. Phase-2 SGD copy 0 vs each other Phase-2 optimizer's copy 0 from the same parent (Figs. 6, 7).
    """
    from landscape.api import instability, interpolate

    config = config or InterpolateConfig()
    out_dir = Path(out_dir)
    store = Store(root)
    table = instability([pattern], pairs="siblings", workers=workers, root=root, config=config,
                        output=out_dir / "instability.h5", data_root=data_root)
    children: dict[tuple[str, str], str] = {}  # (parent run, phase2) -> copy-0 run
    for run in store.runs_matching(pattern):
        ph, lin = run.manifest.get("phases") or {}, run.manifest.get("lineage") or {}
        if ph.get("phase2") is not None and lin.get("parent_run") and int(ph.get("copy") or 0) == 0:
            children[(lin["parent_run"], ph["phase2"])] = run.name
    results: list[tuple[str, InterpolationResult]] = []
    for (parent, phase2), child in sorted(children.items()):
        res = interpolate(f"{parent}@last", f"{child}@last", root=root, config=config,
                          output=out_dir / f"phase1-to-phase2-{child}.h5", data_root=data_root)
        results.append((f"phase 1 -> phase 2 ({phase2})", res))
    for (parent, phase2), child in sorted(children.items()):
        sgd = children.get((parent, "sgd"))
        if phase2 != "sgd" and sgd is not None:
            res = interpolate(f"{sgd}@last", f"{child}@last", root=root, config=config,
                              output=out_dir / f"sgd-vs-{phase2}-{child}.h5", data_root=data_root)
            results.append((f"phase 2 sgd vs {phase2}", res))
    return Tour(table=table, interpolations=results)
