"""Linear interpolation and instability from checkpoint references (Watson et al. Sec. 2.2, Def. 2.3, Fig. 5).

``interpolate(A, B)`` resolves two references through the store (``PATH.h5`` or ``RUN[@init|@last|@step=N|
@epoch=E]``), checks that they hold the same tensors and model spec, rebuilds the data set from A's
``data_spec`` and the model from A's ``model_spec``, evaluates the path, and writes the result HDF5
(inputs: both checkpoint files with sha256) and a figure (PNG + PDF) beside it.

``instability(RUN_GLOB...)`` pairs runs (Phase-2 siblings made by ``landscape phases``, all pairs, or
explicit ``A:B``), interpolates each pair's final checkpoints (in parallel processes with ``workers``)
and writes one table (CSV + HDF5) and the instability-against-k figure (Watson et al. Fig. 5).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

from landscape.analyze.instability import (
    InstabilityTable,
    PairInstability,
    RunInfo,
    all_pairs,
    pair_labels,
    sibling_pairs,
)
from landscape.analyze.interpolate import InterpolateConfig, InterpolationResult
from landscape.analyze.interpolate import interpolate as interpolate_states
from landscape.api._common import check_pair, checkpoint_dataset, default_output, map_jobs, slug
from landscape.errors import UsageError
from landscape.store import Checkpoint, Store

__all__ = ["InterpolateConfig", "InterpolationResult", "InstabilityTable", "Tour", "interpolate", "instability", "tour",
           "check_pair"]

def interpolate(
    ref_a: str,
    ref_b: str,
    *,
    root: str | Path = "checkpoints",
    config: InterpolateConfig | None = None,
    output: str | Path | None = None,
    figure: bool = True,
    data_root: str | None = None,
    download: bool = False,
) -> InterpolationResult:
    """Interpolate between two checkpoints and write ``output`` (default ``results/interpolate-A--B.h5``).

    The returned result has ``path`` (the HDF5 file) and ``figures`` (PNG and PDF, unless ``figure=False``).
    """
    config = config or InterpolateConfig()
    store = Store(root)
    a, b = store.load(ref_a), store.load(ref_b)
    result = _interpolate_checkpoints(a, b, config, data_root=data_root, download=download)
    out = Path(output) if output is not None else default_output(f"interpolate-{slug(ref_a)}--{slug(ref_b)}")
    result.to_hdf5(out, inputs=[a.input_ref(), b.input_ref()])
    if figure:
        result.figures = _figure(result, ref_a, ref_b, out)
    return result


def _interpolate_checkpoints(a: Checkpoint, b: Checkpoint, config: InterpolateConfig, *, data_root=None,
                             download=False) -> InterpolationResult:
    check_pair(a, b)
    data = checkpoint_dataset(a.data_spec, data_root, download)
    model = a.build_model()
    splits = {s: data.split(s) for s in ("train", "test")}
    return interpolate_states(model, a.state_dict, b.state_dict, splits, config=config)


def _figure(result: InterpolationResult, ref_a: str, ref_b: str, out: Path) -> list[Path]:
    from landscape.plots.interpolate import plot_interpolation
    from landscape.plots.style import save_figure

    fig = plot_interpolation(result, title=f"A = {ref_a}   B = {ref_b}")
    return save_figure(fig, out.with_suffix(""))


# -------------------------------------------------------------------------------------------- many pairs


def instability(
    run_patterns: Sequence[str] = (),
    *,
    pairs: str = "siblings",
    workers: int = 1,
    root: str | Path = "checkpoints",
    config: InterpolateConfig | None = None,
    output: str | Path | None = None,
    figure: bool = True,
    data_root: str | None = None,
    download: bool = False,
) -> InstabilityTable:
    """Interpolate many pairs of final checkpoints and tabulate their instabilities (Watson et al. Fig. 5).

    ``pairs``: ``"siblings"`` (Phase-2 copies of the same Phase-1 checkpoint with the same Phase-2
    optimizer, from the ``phases``/``lineage`` manifest fields), ``"all"`` (every pair of matched runs),
    or explicit ``"A:B"`` references (several separated by commas; ``run_patterns`` may then be empty).
    Writes ``output`` (HDF5, default ``results/instability.h5``), the same table as CSV beside it, each
    pair's interpolation under ``<output stem>-pairs/``, and the figure.
    """
    config = config or InterpolateConfig()
    if workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    store = Store(root)
    jobs = _pair_jobs(store, run_patterns, pairs)
    out = Path(output) if output is not None else default_output("instability")
    pair_dir = out.with_name(out.stem + "-pairs")
    tasks = [(ref_a, ref_b, labels, str(Path(root)), config, str(pair_dir / f"{slug(ref_a)}--{slug(ref_b)}.h5"),
              data_root, download) for ref_a, ref_b, labels in jobs]
    outcomes = map_jobs(_pair_task, [(t,) for t in tasks], workers)
    rows = [row for row, _ in outcomes]
    inputs = list({ref.sha256 + ref.path: ref for _, refs in outcomes for ref in refs}.values())
    table = InstabilityTable(rows=rows, splits=tuple(config.splits), params={**dataclasses.asdict(config),
                                                                          "pairs": pairs},
                             inputs=inputs)
    table.to_hdf5(out, inputs=inputs)
    table.to_csv(out.with_suffix(".csv"))
    if figure:
        from landscape.plots.interpolate import plot_instability
        from landscape.plots.style import save_figure

        table.figures = save_figure(plot_instability(table.records(), splits=table.splits), out.with_suffix(""))
    return table


def _pair_jobs(store: Store, patterns: Sequence[str], pairs: str) -> list[tuple[str, str, dict]]:
    if ":" in pairs:
        jobs = []
        for item in pairs.split(","):
            ref_a, sep, ref_b = item.strip().partition(":")
            if not sep or not ref_a or not ref_b:
                raise UsageError(f"--pairs takes siblings, all, or A:B[,C:D...]; got {item!r}")
            jobs.append((ref_a, ref_b, pair_labels(_info(store, ref_a), _info(store, ref_b))))
        return jobs
    if pairs not in ("siblings", "all"):
        raise UsageError(f"--pairs takes siblings, all, or A:B[,C:D...]; got {pairs!r}")
    if not patterns:
        raise UsageError("give at least one run name or glob (e.g. 'phases-*')")
    runs: dict[str, RunInfo] = {}
    for pattern in patterns:
        matched = store.runs_matching(pattern)
        if not matched:
            raise UsageError(f"no runs match {pattern!r} in {store.root}")
        for run in matched:
            runs[run.name] = RunInfo(run.name, run.manifest.get("phases"), run.manifest.get("lineage"))
    chosen = sibling_pairs(list(runs.values())) if pairs == "siblings" else all_pairs(list(runs.values()))
    if not chosen:
        raise UsageError(
            f"no {'sibling ' if pairs == 'siblings' else ''}pairs among {len(runs)} matched run(s)"
            + (" (siblings are Phase-2 copies from `landscape phases` with the same parent; try --pairs all)"
               if pairs == "siblings" else "")
        )
    return [(f"{x.name}@last", f"{y.name}@last", pair_labels(x, y)) for x, y in chosen]


def _info(store: Store, ref: str) -> RunInfo:
    name = ref.partition("@")[0]
    if name.endswith(".h5") or "/" in name or name not in store.run_names():
        return RunInfo(ref, None, None)
    run = store.run(name)
    return RunInfo(run.name, run.manifest.get("phases"), run.manifest.get("lineage"))


def _pair_task(task) -> tuple[PairInstability, list]:
    ref_a, ref_b, labels, root, config, out, data_root, download = task
    store = Store(root)
    a, b = store.load(ref_a), store.load(ref_b)
    result = _interpolate_checkpoints(a, b, config, data_root=data_root, download=download)
    refs = [a.input_ref(), b.input_ref()]
    result.to_hdf5(out, inputs=refs)
    eps = labels["epsilon"]
    if math.isnan(eps) and labels["phase2"] != "sgd":
        known = [e for e in (a.epsilon, b.epsilon) if e is not None]
        eps = float(max(known)) if known else math.nan
    row = PairInstability(
        pair=f"{ref_a}:{ref_b}", ref_a=ref_a, ref_b=ref_b, group=labels["group"], k=labels["k"],
        phase1=labels["phase1"], phase2=labels["phase2"], epsilon=eps,
        instability_loss=dict(result.instability_loss), instability_error=dict(result.instability_error),
        result=out,
    )
    return row, refs


# ------------------------------------------------------------------------------------------------- demo


@dataclasses.dataclass
class Tour:
    """What :func:`tour` made: the sibling table and the single interpolations, with their files."""

    table: InstabilityTable
    interpolations: list[tuple[str, InterpolationResult]]  # (what, result)

    def rows(self) -> list[dict]:
        """One row per interpolated pair (siblings first), with the test-split instabilities."""
        split = "test" if "test" in self.table.splits else self.table.splits[0]
        rows = [{"pair": r.pair, "kind": f"siblings {r.phase2}" + (f" eps={r.epsilon:g}" if not math.isnan(r.epsilon)
                                                                     else ""),
                 f"instability_{split}_loss": r.instability_loss[split],
                 f"instability_{split}_error": r.instability_error[split]} for r in self.table.rows]
        for what, res in self.interpolations:
            a, b = (i.ref for i in res.inputs)
            rows.append({"pair": f"{a}:{b}", "kind": what, f"instability_{split}_loss": res.instability_loss[split],
                         f"instability_{split}_error": res.instability_error[split]})
        return rows

    def files(self) -> list[Path]:
        out = [self.table.path, self.table.csv_path, *self.table.figures]
        for _, res in self.interpolations:
            out += [res.path, *res.figures]
        return [p for p in out if p is not None]


def tour(
    pattern: str,
    *,
    root: str | Path = "checkpoints",
    out_dir: str | Path = "results",
    config: InterpolateConfig | None = None,
    workers: int = 1,
    data_root: str | None = None,
) -> Tour:
    """Everything interpolation offers for runs made by ``landscape phases`` (the demo calls this).

    1. every sibling pair's instability (Watson et al. Fig. 5) -> ``out_dir/instability.{h5,csv,png,pdf}``;
    2. Phase 1 -> Phase 2 for copy 0 of each Phase-2 optimizer (Watson et al. Fig. 8);
    3. Phase-2 SGD copy 0 vs each other Phase-2 optimizer's copy 0 from the same parent (Figs. 6, 7).
    """
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
