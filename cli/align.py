"""`landscape align A B --run RUN`: B permuted to match A (Git Re-Basin weight matching), written as a new run."""

from __future__ import annotations

import click

from cli.common import echo_json, echo_table, json_option, root_of
from cli.options import Count, Seed, run_api


@click.command()
@click.argument("ref_a")
@click.argument("ref_b")
@click.option("--run", "run", default=None, metavar="RUN", help="Name of the new run (default: generated).")
@click.option("-o", "old_run", default=None, metavar="RUN", hidden=True)  # the old name of --run, for one release
@click.option("--seed", type=Seed(), default=0, show_default=True,
              help="Seed of the order in which weight matching visits the permutations.")
@click.option("--max-iter", type=Count(min=1), default=100, show_default=True,
              help="At most this many passes over all permutations.")
@json_option
@click.pass_context
def align(ctx: click.Context, ref_a: str, ref_b: str, run: str | None, old_run: str | None, seed: int,
          max_iter: int, as_json: bool) -> None:
    """Permute the hidden units of checkpoint B to match A (weight matching, Ainsworth et al. 2023).

    The new run's step 0 computes the same function as B; interpolate A against it to see the barrier
    that is not due to unit order: `landscape interpolate A RUN@init`. Works for the built-in models and any
    model that describes its units (a permutation_spec() method or register_spec(); landscape.analyze.align).
    """
    from landscape.api.alignment import align as run_align
    from landscape.errors import UsageError
    from landscape.options import deprecated

    if old_run is not None:  # -o is an output file in every other command
        if run is not None:
            raise UsageError("-o and --run name the same run (-o is its old name); give --run only")
        run_api(lambda: deprecated("align -o", "--run"))
        run = old_run

    result = run_api(lambda: run_align(ref_a, ref_b, run=run, root=root_of(ctx), seed=seed, max_iter=max_iter))
    if as_json:
        echo_json(result.to_dict())
        return
    echo_table(result.permutations)
    state = "converged" if result.converged else "stopped at --max-iter"
    click.echo(f"weight matching {state} after {result.iterations} pass(es); ||B - A|| {result.distance_before:.4g} "
               f"-> {result.distance_after:.4g}")
    click.echo(f"run {result.run}: step 0 = {result.ref_b} permuted to match {result.ref_a}")
    click.echo(f"checkpoint: {result.checkpoint}")
