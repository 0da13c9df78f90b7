"""`landscape demo`: the main job end to end on the embedded digits data."""

from __future__ import annotations

import dataclasses
import time

import click

from cli.common import echo_json, echo_table, json_option
from cli.options import Count, DeviceType, FiniteFloat, run_api
from landscape.bounds import DIRECTIONS_MAX, POINTS_MAX
from landscape.options import DEVICE_HELP


@click.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="demo-out", show_default=True,
              help="Directory for the store (OUT/checkpoints unless --root is given) and results.")
@click.option("--epochs", type=Count(min=2), default=8, show_default=True)
@click.option("--k", "ks", default="1,2,4", show_default=True, help="Phase-1 lengths in epochs (comma-separated).")
@click.option("--copies", type=Count(min=2), default=3, show_default=True,
              help="Phase-2 copies per optimizer; 3+ gives the verdicts a spread over sibling pairs.")
@click.option("--target-epsilon", type=FiniteFloat(min=0, min_open=True), default=8.0, show_default=True)
@click.option("--directions", "n_directions", type=Count(min=1, max=DIRECTIONS_MAX), default=50, show_default=True)
@click.option("--points", type=Count(min=2, max=POINTS_MAX), default=30, show_default=True,
              help="Points per interpolation path and per direction profile.")
@click.option("--device", type=DeviceType(), default="auto", show_default=True, help=DEVICE_HELP)
@json_option
@click.pass_context
def demo(ctx: click.Context, out_dir: str, epochs: int, ks: str, copies: int, target_epsilon: float,
         n_directions: int, points: int, device: str, as_json: bool) -> None:
    """Phase-1 SGD, Phase-2 SGD and DP-SGD siblings on digits; their interpolations, instabilities,
    random-direction profiles and figures (Watson et al. Figs. 4-8 at CPU scale)."""
    from landscape.api.demo_job import DemoConfig
    from landscape.api.demo_job import demo as run_demo
    from landscape.errors import UsageError

    try:
        k_values = tuple(sorted({int(k) for k in ks.split(",")}))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {ks!r}", param_hint="--k") from None
    if not all(1 <= k < epochs for k in k_values):
        raise UsageError(f"--k values must be between 1 and --epochs - 1 = {epochs - 1}, got {ks}")
    root = ctx.find_root().params.get("root")
    explicit_root = ctx.find_root().get_parameter_source("root").name != "DEFAULT"
    config = DemoConfig(epochs=epochs, ks=k_values, copies=copies, target_epsilon=target_epsilon,
                        directions=n_directions, points=points, device=device)
    start = time.perf_counter()
    result = run_api(lambda: run_demo(out_dir, root=root if explicit_root else None, config=config))
    seconds = time.perf_counter() - start
    if as_json:
        echo_json({"runs": [dataclasses.asdict(r) for r in result.runs], "instability": result.instability_rows,
                   "directions": result.directions_summary, "verdicts": [v.to_dict() for v in result.verdicts],
                   "files": result.files, "seconds": seconds})
        return
    click.echo("Runs (digits, lenet):")
    echo_table([{"run": r.run, "phase1": r.phase1, "phase2": r.phase2, "epoch": r.epoch, "epsilon": r.epsilon,
                 "test_acc": r.test_acc, "test_loss": r.test_loss} for r in result.runs])
    click.echo("\nBarriers: chord_barrier = sup over the path of the loss above the straight line between the end losses "
               "(the bump the verdicts judge); instability = Watson et al. Def. 2.3, sup over the path minus the "
               "endpoints' mean (never below half the end-loss gap); eps = the epsilon the checkpoints spent:")
    echo_table(result.instability_rows)
    d = result.directions_summary
    click.echo(f"\nRandom directions from a Phase-2 SGD solution at its sibling's distance {d['distance']:.3g}: "
               f"median loss rise {d['rise_median']:.3g} (min {d['rise_min']:.3g}, max {d['rise_max']:.3g}) "
               f"vs {d['toward_rise']:.3g} toward the sibling; max |cos| between directions {d['max_abs_cos']:.3g}.")
    fig4 = result.verdicts[-1].numbers
    if "rise toward sibling" in fig4:
        click.echo(f"Along the paths (mean loss above the start, what the Fig. 4 verdict compares): "
                   f"{fig4['rise toward sibling']:.3g} toward the sibling vs median "
                   f"{fig4['median random rises']:.3g} along the random directions.")
    click.echo("\nVerdicts (computed from the numbers above; rules in landscape/verdict.py, alpha 0.05):")
    for v in result.verdicts:
        click.echo(f"  {v.line()}")
    click.echo("\nFiles:")
    for path in result.files:
        click.echo(f"  {path}")
    click.echo(f"\nDone in {seconds:.0f} s. Inspect any result with: landscape show FILE.h5")
