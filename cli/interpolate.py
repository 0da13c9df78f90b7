"""`landscape interpolate A B` and `landscape instability RUN_GLOB...` (Watson et al. Def. 2.3, Fig. 5).

Both mirror :class:`landscape.analyze.interpolate.InterpolateConfig` option by option and call
``landscape.api.interpolation``; they print a short table and where the files went (``--json``: the same
as JSON). Incompatible checkpoints are one ``error:`` line naming the first differing tensor (exit 1).
"""

from __future__ import annotations

import click

from cli.common import echo_json, echo_table, json_option, root_of, workers_option
from cli.options import add_options, evaluation_options, output_option, run_api

SUMMARY_COLUMNS = ["split", "loss_A", "loss_B", "max_loss", "instability_loss", "instability_error"]


class SplitList(click.ParamType):
    name = "train,test"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        splits = tuple(s.strip() for s in str(value).split(",") if s.strip())
        bad = [s for s in splits if s not in ("train", "test")]
        if bad or not splits:
            self.fail(f"{value!r}: give train, test or train,test", param, ctx)
        if len(set(splits)) != len(splits):
            self.fail(f"{value!r}: a split is repeated", param, ctx)
        return splits


def interpolation_options(f):
    """The InterpolateConfig fields as click options (shared by both commands)."""
    return add_options([
        click.option("--points", type=click.IntRange(min=2), default=30, show_default=True,
                     help="Number of alphas in linspace(0, 1, points), both endpoints included."),
        click.option("--splits", type=SplitList(), default="train,test", show_default=True,
                     help="Data splits to evaluate."),
        click.option("--bn-recalibrate", is_flag=True,
                     help="Recompute BatchNorm statistics at every point from the training data."),
        evaluation_options,
    ], f)


def _config(points, splits, subset, subset_seed, bn_recalibrate, batch_size, device, method):
    from landscape.analyze.interpolate import InterpolateConfig

    return InterpolateConfig(points=points, splits=tuple(splits), subset=subset, subset_seed=subset_seed,
                             bn_recalibrate=bn_recalibrate, batch_size=batch_size, device=device, method=method)


@click.command()
@click.argument("ref_a")
@click.argument("ref_b")
@interpolation_options
@output_option
@json_option
@click.pass_context
def interpolate(ctx, ref_a, ref_b, points, splits, subset, subset_seed, bn_recalibrate, batch_size, device, method,
                data_root, no_figure, output, as_json) -> None:
    """Loss and accuracy on (1-alpha) A + alpha B, and the instability (Watson et al. Def. 2.3).

    A and B are checkpoint references: PATH.h5 or RUN[@init|@last|@step=N|@epoch=E].
    """
    from landscape.api.interpolation import interpolate as run_interpolate

    result = run_api(lambda: run_interpolate(
        ref_a, ref_b, root=root_of(ctx),
        config=_config(points, splits, subset, subset_seed, bn_recalibrate, batch_size, device, method),
        output=output, figure=not no_figure, data_root=data_root,
    ))
    rows = result.summary()
    if as_json:
        echo_json({"output": str(result.path), "figures": [str(f) for f in result.figures], "rows": rows,
                   "reasons": result.reasons, "seconds": result.seconds, "throughput": result.throughput})
        return
    echo_table(rows, SUMMARY_COLUMNS)
    for key, reason in result.reasons.items():
        click.echo(f"{key}: instability inf ({reason})")
    click.echo(f"wrote {result.path}" + "".join(f", {f}" for f in result.figures))


@click.command()
@click.argument("runs", nargs=-1)
@click.option("--pairs", default="siblings", show_default=True,
              help="siblings (Phase-2 copies of one Phase-1 checkpoint), all, or explicit A:B[,C:D...].")
@interpolation_options
@workers_option
@output_option
@json_option
@click.pass_context
def instability(ctx, runs, pairs, points, splits, subset, subset_seed, bn_recalibrate, batch_size, device, method,
                data_root, no_figure, workers, output, as_json) -> None:
    """Instability of many pairs of final checkpoints: one table (CSV + HDF5) and the plot against k.

    RUNS are run names or globs (e.g. 'phases-*'); with --pairs A:B they may be omitted.
    """
    from landscape.api.interpolation import instability as run_instability

    table = run_api(lambda: run_instability(
        list(runs), pairs=pairs, workers=workers, root=root_of(ctx),
        config=_config(points, splits, subset, subset_seed, bn_recalibrate, batch_size, device, method),
        output=output, figure=not no_figure, data_root=data_root,
    ))
    columns = ["pair", "k", "phase2", "epsilon"] + [f"instability_{s}_{m}" for s in table.splits
                                                    for m in ("loss", "error")]
    if as_json:
        echo_json({"output": str(table.path), "csv": str(table.csv_path), "figures": [str(f) for f in table.figures],
                   "rows": table.records()})
        return
    echo_table([{c: r[c] for c in columns} for r in table.records()], columns)
    click.echo(f"wrote {table.path}, {table.csv_path}" + "".join(f", {f}" for f in table.figures))
