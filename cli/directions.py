"""`landscape directions A` and `landscape surface A` (Watson et al. Fig. 4; Li et al. 2018).

Both mirror their config dataclass (:class:`landscape.analyze.directions.DirectionsConfig`,
:class:`landscape.analyze.surface.SurfaceConfig`) option by option and call ``landscape.api.loss_surfaces``;
they print a short summary and where the files went (``--json``: the same as JSON). Bad option values are
one ``error:`` line with exit code 2, missing checkpoints exit 1.
"""

from __future__ import annotations

import click

from cli.common import echo_json, echo_table, json_option, root_of, workers_option
from cli.options import add_options, evaluation_options, output_option, run_api


def _common_options(f):
    return add_options([
        click.option("--normalize", type=click.Choice(["none", "filter", "layer"]), default=None,
                     help="Direction normalisation (Li et al. 2018): none, filter or layer [default: none for "
                          "directions (isotropic, as Watson et al.), filter for surface]."),
        click.option("--biasbn", type=click.Choice(["zero", "copy", "random"]), default="zero", show_default=True,
                     help="1-D tensors (biases, norm layers) under filter/layer normalisation: zero (Li et al.), "
                          "copy theta, or random rescaled."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random directions."),
        evaluation_options,
    ], f)


@click.command()
@click.argument("ref_a")
@click.option("--n", "n", type=click.IntRange(min=1), default=100, show_default=True,
              help="Number of random directions.")
@click.option("--points", type=click.IntRange(min=2), default=30, show_default=True,
              help="Points per profile: t = linspace(0, 1, points) of the distance.")
@click.option("--distance", default="auto", show_default=True,
              help="How far to go: a number, or auto = ||B - A|| (needs --toward).")
@click.option("--toward", default=None, help="Checkpoint B: also evaluate the straight path from A toward B.")
@click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True,
              help="Data split to evaluate.")
@_common_options
@workers_option
@output_option
@json_option
@click.pass_context
def directions(ctx, ref_a, n, points, distance, toward, split, normalize, biasbn, seed, subset, subset_seed,
               batch_size, device, method, data_root, no_figure, workers, output, as_json) -> None:
    """Loss along N random directions from A against the path toward B (Watson et al. Fig. 4).

    A and B are checkpoint references: PATH.h5 or RUN[@init|@last|@step=N|@epoch=E].
    """
    from landscape.analyze.directions import DirectionsConfig
    from landscape.api.loss_surfaces import directions as run_directions

    config = DirectionsConfig(n=n, points=points, distance=distance, normalize=normalize or "none", biasbn=biasbn,
                              seed=seed, split=split, subset=subset, subset_seed=subset_seed, batch_size=batch_size,
                              device=device, method=method, workers=workers)
    result = run_api(lambda: run_directions(ref_a, toward=toward, root=root_of(ctx), config=config,
                                            output=output, figure=not no_figure, data_root=data_root))
    summary = result.summary()
    if as_json:
        echo_json({"output": str(result.path), "figures": [str(f) for f in result.figures], **summary,
                   "seconds": result.seconds, "points_per_second": result.throughput})
        return
    rows = [{"": "random", "n": summary["n"], "mean": summary["rise_mean"], "median": summary["rise_median"],
             "min": summary["rise_min"], "max": summary["rise_max"]}]
    if result.toward_loss is not None:
        rows.append({"": "toward B", "n": 1, "mean": summary["toward_rise"], "median": summary["toward_rise"],
                     "min": summary["toward_rise"], "max": summary["toward_rise"]})
    click.echo(f"loss rise at distance {result.distance:.4g} ({split} loss at A {summary['base_loss']:.4g}); "
               f"max |cos| between directions {result.max_abs_cos:.3g}")
    echo_table(rows, ["", "n", "mean", "median", "min", "max"])
    if result.toward_loss is not None:
        click.echo(f"{100 * summary['fraction_above_toward']:.0f}% of random directions rise more than toward B")
    click.echo(f"wrote {result.path}" + "".join(f", {f}" for f in result.figures))


@click.command()
@click.argument("ref_a")
@click.option("--plane", default="random", show_default=True,
              help="random (two filter-normalised directions), B,C (plane through A, B, C) or pca:RUN.")
@click.option("--grid", default="25x25", show_default=True, help="Grid points NXxNY (or N).")
@click.option("--range", "range_", default="auto", show_default=True,
              help="auto, LO:HI (both axes) or XLO:XHI,YLO:YHI; auto = -1:1 for random, else around the points.")
@click.option("--splits", default="train,test", show_default=True, help="Data splits to evaluate: train, test or both.")
@_common_options
@click.option("--3d", "three_d", is_flag=True, help="Also draw a 3-D surface view.")
@click.option("--no-resume", is_flag=True, help="Start afresh even if the output file holds a partial surface.")
@click.option("--rows-per-call", type=click.IntRange(min=1), default=None,
              help="Grid rows per evaluation call and file write (default: about 64 points per call).")
@workers_option
@output_option
@json_option
@click.pass_context
def surface(ctx, ref_a, plane, grid, range_, splits, normalize, biasbn, seed, subset, subset_seed, batch_size,
            device, method, data_root, no_figure, three_d, no_resume, rows_per_call, workers, output, as_json) -> None:
    """2-D loss and accuracy surface around A (Li et al. 2018); resumes an interrupted output file.

    Arrays are stored [x, y]: train_loss[i, j] is at (xcoordinates[i], ycoordinates[j]); NaN = not computed.
    """
    from landscape.analyze.surface import SurfaceConfig
    from landscape.api.loss_surfaces import surface as run_surface

    config = SurfaceConfig(plane=plane, grid=grid, range=range_, normalize=normalize or "filter", biasbn=biasbn,
                           seed=seed, splits=splits, subset=subset, subset_seed=subset_seed,
                           batch_size=batch_size, device=device, method=method, workers=workers,
                           rows_per_call=rows_per_call)
    result = run_api(lambda: run_surface(ref_a, root=root_of(ctx), config=config, output=output,
                                         figure=not no_figure, three_d=three_d, resume=not no_resume,
                                         data_root=data_root))
    summary = result.summary()
    if as_json:
        echo_json({"output": str(result.path), "figures": [str(f) for f in result.figures], **summary})
        return
    echo_table([{k: v for k, v in summary.items() if k != "explained_variance"}])
    if result.explained_variance is not None:
        ev = result.explained_variance
        click.echo(f"explained variance: PC1 {100 * ev[0]:.1f}%, PC2 {100 * ev[1]:.1f}%")
    click.echo(f"wrote {result.path}" + "".join(f", {f}" for f in result.figures))
