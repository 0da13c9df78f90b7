"""`landscape prune`: magnitude-prune a checkpoint into a new run whose step 0 is the pruned weights."""

from __future__ import annotations

import click

from cli.common import echo_json, echo_table, json_option, root_of
from cli.options import FiniteFloat, run_api


@click.command()
@click.argument("ref")
@click.option(
    "--remove",
    type=FiniteFloat(0.0, 1.0),
    required=True,
    help="Fraction of weights REMOVED (smallest magnitude). Watson et al.'s 'pruning level p' = 1 - remove.",
)
@click.option(
    "--scope",
    type=click.Choice(["layer", "global"]),
    default="layer",
    show_default=True,
    help="Remove the fraction in every layer, or over all prunable weights together.",
)
@click.option(
    "--rewind",
    type=click.Choice(["init", "none"]),
    default="init",
    show_default=True,
    help="init: survivors take their initial values (the source run's @init); none: keep trained values.",
)
@click.option(
    "--init",
    "init",
    default=None,
    metavar="REF",
    help="Initial weights to rewind to (default: the source run's @init).",
)
@click.option("--run", "run", default=None, help="Name of the new run (default: generated).")
@json_option
@click.pass_context
def prune(
    ctx: click.Context,
    ref: str,
    remove: float,
    scope: str,
    rewind: str,
    init: str | None,
    run: str | None,
    as_json: bool,
) -> None:
    """Prune the Linear/Conv weights of checkpoint REF by magnitude; store the mask with a new run.

    Train from it with `landscape train --from RUN@init ...`: pruned weights stay exactly 0 (masked
    gradients, noise and momentum), and its epsilon composes the DP steps of REF (which chose the mask).
    """
    from landscape.api.pruning import PruneConfig
    from landscape.api.pruning import prune as run_prune

    result = run_api(lambda: run_prune(
        PruneConfig(ref=ref, remove=remove, scope=scope, rewind=rewind, run=run, init=init), root=root_of(ctx)
    ))
    if as_json:
        echo_json(result.to_dict())
        return
    rows = [
        {
            "tensor": r["name"],
            "shape": "x".join(map(str, r["shape"])),
            "weights": r["numel"],
            "kept": r["kept"],
            "kept_fraction": r["kept_fraction"],
        }
        for r in result.layers
    ]
    total = sum(r["numel"] for r in result.layers)
    rows.append(
        {
            "tensor": "total",
            "shape": "",
            "weights": total,
            "kept": sum(r["kept"] for r in result.layers),
            "kept_fraction": result.kept_fraction,
        }
    )
    echo_table(rows)
    rewound = f"rewound to {result.init}" if result.init else "not rewound"
    click.echo(f"run {result.run}: step 0 = {result.source} pruned ({rewound}), mask in run array 'mask'")
    click.echo(f"checkpoint: {result.checkpoint}")
