"""`landscape clipping`, `landscape symmetry`, `landscape norms`: gradient geometry at checkpoints.

Each mirrors its config dataclass (ClippingConfig, SymmetryConfig, NormsConfig) option by option, calls
``landscape.api.geometry`` and prints a short table (``--json``: the same as JSON).
"""

from __future__ import annotations

import click

from cli.common import echo_json, echo_table, json_option, root_of, workers_option
from cli.options import (
    CommaList,
    FiniteFloat,
    add_options,
    data_root_option,
    no_figure_option,
    output_option,
    run_api,
)

split_option = click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True,
                            help="Which split the per-sample gradients come from.")
chunk_option = click.option("--chunk", type=click.IntRange(min=1), default=250, show_default=True,
                            help="Examples per engine pass (memory bound; results do not depend on it).")


def _common_options(f):
    """Options every geometry command shares, after its own."""
    return add_options([split_option, chunk_option, workers_option, output_option, data_root_option,
                        no_figure_option, json_option], f)


def _floats(values: tuple[float, ...] | None) -> list[float] | None:
    return None if values is None else list(values)


def _finish(result, as_json: bool, rows: list[dict], columns: list[str] | None = None) -> None:
    if as_json:
        echo_json({"output": str(result.output), "figures": [str(f) for f in result.figures], "rows": rows})
        return
    echo_table(rows, columns)
    click.echo(f"wrote {result.output}" + (f" and {len(result.figures)} figure files" if result.figures else ""))


@click.command()
@click.argument("target")
@click.option("--max-grad-norm", "-C", type=FiniteFloat(min=0, min_open=True), default=1.0, show_default=True, help="Clipping norm C.")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Examples per batch B.")
@click.option("--batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="Number K of disjoint batches (R is reported per batch and over all K x B examples).")
@click.option("--clip-style", type=click.Choice(["flat", "layerwise"]), default="flat", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the batch draw.")
@click.option("--prune-levels", type=CommaList(number=True), default=None,
              help="Fractions of weights removed, e.g. 0,0.3,0.5,0.7,0.9: prune, rewind, retrain, measure R "
                   "(Watson Fig. 11).")
@_common_options
@click.pass_context
def clipping(ctx, target, max_grad_norm, batch_size, batches, clip_style, seed, split, chunk, prune_levels,
             workers, output, data_root, no_figure, as_json) -> None:
    """Clipping ratio R and the Thm. 3.2 bound (Watson et al. Sec. 3.1) at TARGET.

    TARGET is a checkpoint (PATH.h5, RUN@last, RUN@epoch=E, ...) or a run name, meaning every checkpoint of
    the run (one row per checkpoint).
    """
    from landscape.api.geometry import clipping as run_clipping

    result = run_api(lambda: run_clipping(
        target, root=root_of(ctx), output=output, figure=not no_figure, data_root=data_root,
        max_grad_norm=max_grad_norm, batch_size=batch_size, batches=batches, clip_style=clip_style, seed=seed,
        split=split, chunk=chunk, prune_levels=_floats(prune_levels), workers=workers,
    ))
    rows = result.summary_rows()
    columns = (["prune_level"] if prune_levels else []) + [
        "ref", "epoch", "R", "R_batch_mean", "projection", "bound", "assumption_held", "bound_held",
        "fraction_clipped", "cos_clipped_mean",
    ]
    _finish(result, as_json, rows, columns)


@click.command()
@click.argument("target")
@click.option("--projections", "-P", type=click.IntRange(min=0), default=16, show_default=True,
              help="Random 1-D directions for the skewness (besides the 2-D plane).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the projection matrix, the example draw and the permutations.")
@click.option("--batch-size", type=click.IntRange(min=3), default=500, show_default=True,
              help="Examples whose deviations are drawn (the same for every checkpoint).")
@click.option("--permutations", type=click.IntRange(min=1), default=999, show_default=True,
              help="Sign-flip permutations for the p-value.")
@_common_options
@click.pass_context
def symmetry(ctx, target, projections, seed, batch_size, permutations, split, chunk, workers, output, data_root,
             no_figure, as_json) -> None:
    """Symmetry of the gradient deviations g_i - g_bar (Zhu & Blaschko App. F) at TARGET (checkpoint or run)."""
    from landscape.api.geometry import symmetry as run_symmetry

    result = run_api(lambda: run_symmetry(
        target, root=root_of(ctx), output=output, figure=not no_figure, data_root=data_root,
        projections=projections, seed=seed, batch_size=batch_size, permutations=permutations, split=split,
        chunk=chunk, workers=workers,
    ))
    _finish(result, as_json, result.summary_rows())


@click.command()
@click.argument("targets", nargs=-1, required=True)
@click.option("--bins", type=click.IntRange(min=1), default=100, show_default=True,
              help="Bins of the parameter-value histograms (shared by all targets).")
@click.option("--grad-samples", type=click.IntRange(min=0), default=256, show_default=True,
              help="Examples whose per-sample gradient norms are taken at every checkpoint (0: none).")
@click.option("--grad-epochs", type=CommaList(number=True), default=None,
              help="Epochs whose gradient-norm histograms are drawn (default: first after init, and last).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the example draw.")
@_common_options
@click.pass_context
def norms(ctx, targets, bins, grad_samples, grad_epochs, seed, split, chunk, workers, output, data_root,
          no_figure, as_json) -> None:
    """Parameter and gradient norms (Watson Figs. 16-17) of runs or checkpoints TARGETS..., the first the baseline
    of the distance ratios."""
    from landscape.api.geometry import norms as run_norms

    result = run_api(lambda: run_norms(
        list(targets), root=root_of(ctx), output=output, figure=not no_figure, data_root=data_root, bins=bins,
        grad_samples=grad_samples, grad_epochs=_floats(grad_epochs), seed=seed, split=split, chunk=chunk,
        workers=workers,
    ))
    _finish(result, as_json, result.ratio_rows())
