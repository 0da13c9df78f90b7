"""`landscape figures`: regenerate paper figures (train -> analyse -> plot) and print each claim's verdict."""

from __future__ import annotations

from pathlib import Path

import click

from cli.common import root_of
from cli.options import Count, note_scheduler, scheduler_option


@click.command()
@click.argument("names", nargs=-1)
@click.option("--list", "list_", is_flag=True, help="List every recipe with its paper figure and claim.")
@click.option("--scale", type=click.Choice(["test", "cpu", "paper"]), default="cpu", show_default=True,
              help="test: seconds; cpu: minutes on a laptop; paper: the paper's data set and model (GPU).")
@click.option("--out", type=click.Path(file_okay=False), default="figures-out", show_default=True,
              help="Output folder (one subfolder per recipe: figure PNG + PDF, HDF5 summary).")
@click.option("--workers", type=Count(min=1), default=1, show_default=True, help="Worker processes.")
@click.option("--data-root", default=None, help="Folder of the paper's data sets (else $LANDSCAPE_DATA).")
@click.option("--rerun", is_flag=True, help="Make finished recipes again (their trained runs are still reused).")
@scheduler_option("Run the analyses' parallel parts on this Dask scheduler instead of --workers.")
@click.pass_context
def figures(ctx: click.Context, names: tuple[str, ...], list_: bool, scale: str, out: str, workers: int,
            data_root: str | None, rerun: bool, scheduler: str | None) -> None:
    """Make paper figures by recipe NAME (or `all`); finished recipes (same settings) are skipped on rerun.

    Example: landscape figures watson-fig5 --scale cpu --out figures/
    """
    from landscape.errors import UsageError
    from landscape.figures import figures as run
    from landscape.figures import registry

    if list_:
        for name in registry.names():
            r = registry.get(name)
            click.echo(f"{name:14s} {r.paper.split(' (')[0]}, {r.figure}: {r.claim}")
        return
    if not names:
        raise UsageError("name a recipe (or `all`); `landscape figures --list` shows them")
    from landscape.errors import RecipeError

    note_scheduler(scheduler)

    try:
        made = run(list(names), scale=scale, out=out, root=root_of(ctx), workers=workers, data_root=data_root,
                   rerun=rerun, scheduler=scheduler, report=lambda line: click.echo(line, err=True))
    except RecipeError as exc:
        _report(exc.made)
        raise
    _report(made)
    click.echo(f"gallery: {Path(out) / 'README.md'}")


def _report(made) -> None:
    import dataclasses

    for m in made:
        how = "skipped (finished)" if m.skipped else "made"
        click.echo(f"{m.name} [{m.scale}] {how}: {m.path}")
        click.echo(f"  {dataclasses.replace(m.verdict, note='').line()}")
