"""`landscape batch SPEC`: run a YAML sweep of training and analysis jobs, in-process or on Dask."""

from __future__ import annotations

import sys

import click

from cli.common import root_of
from cli.options import Count, run_api, scheduler_option


@click.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option("--workers", type=Count(min=1), default=1, show_default=True,
              help="1: run the jobs one by one in this process; N: on a local Dask cluster of N worker "
                   "processes (one thread each, bound to 127.0.0.1).")
@scheduler_option("Run on an existing Dask cluster (`dask scheduler` + `dask worker`); its workers must see the "
                  "store root and results directory at the same absolute paths (a shared filesystem).")
@click.option("--dry-run", is_flag=True, help="Validate the spec and print the expanded job graph; run nothing.")
@click.option("--dot", "dot_file", default=None, type=click.Path(dir_okay=False),
              help="Also write the job graph as Graphviz dot to this file.")
@click.pass_context
def batch(ctx: click.Context, spec_file: str, workers: int, scheduler: str | None, dry_run: bool,
          dot_file: str | None) -> None:
    """Run the jobs of batch spec SPEC (YAML: jobs, parameter grids, dependencies; see docs/batch.md). The
    whole spec is validated before anything runs. Jobs whose outputs exist with the same
    configuration hash are skipped, so a killed batch resumes when run again. A failing job does not stop
    the jobs that do not need it. Writes summary.csv, summary.h5 and index.csv to the spec's results
    directory; exits 1 when any job failed.
    """
    from landscape.batch import describe, load_spec, to_dot
    from landscape.errors import UsageError

    if scheduler is not None and workers != 1:
        raise UsageError("give --workers N (a local cluster) or --scheduler ADDRESS, not both")
    spec = run_api(lambda: load_spec(spec_file, root=root_of(ctx)))  # a renamed option's warning: one line
    if dot_file is not None:
        from landscape.results import atomic_write

        text = to_dot(spec)
        atomic_write(dot_file, lambda tmp: open(tmp, "w").write(text))
    if dry_run:
        click.echo(describe(spec))
        return
    from landscape.batch.runner import format_table, run_batch

    report = run_batch(spec, workers=workers, scheduler=scheduler)
    click.echo(format_table(report))
    c = report.counts
    click.echo(f"{len(report.outcomes)} job(s) in {report.seconds:.1f} s: {c['done']} done, {c['cached']} "
               f"cached (outputs current), {c['failed']} failed, {c['skipped']} skipped")
    if report.lost_workers:
        click.echo(f"{len(report.lost_workers)} worker(s) lost mid-batch ({', '.join(report.lost_workers)}); "
                   f"job(s) rerun on other workers: {', '.join(report.retried) or 'none'}")
    click.echo(f"summary: {report.summary_csv} {report.summary_h5}; file index: {report.index_csv}")
    if report.failed:
        for o in report.failed:
            click.echo(f"error: job {o['id']} failed: {o['error']}", err=True)
        if report.skipped:
            click.echo(f"skipped (upstream failed): {', '.join(o['id'] for o in report.skipped)}", err=True)
        sys.exit(1)
