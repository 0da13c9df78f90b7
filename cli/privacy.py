"""`landscape privacy`: epsilon of a DP-SGD schedule, or the noise multiplier that reaches a target epsilon."""

from __future__ import annotations

from typing import Any

import click

from cli.common import echo_json, json_option
from cli.options import Count, FiniteFloat


@click.command()
@click.option("--noise-multiplier", type=FiniteFloat(min=0), default=None, help="sigma; prints epsilon.")
@click.option(
    "--target-epsilon", type=FiniteFloat(min=0, min_open=True), default=None, help="Target epsilon; prints the sigma that reaches it."
)
@click.option(
    "--sample-rate",
    type=FiniteFloat(min=0, max=1, min_open=True),
    default=None,
    help="Poisson sample rate q (or --batch-size + --dataset-size).",
)
@click.option("--batch-size", type=Count(min=1), default=None, help="Expected batch size B (q = B / N).")
@click.option("--dataset-size", type=Count(min=1), default=None, help="Training set size N.")
@click.option("--steps", type=Count(min=0), default=None, help="Number of steps T (or --epochs).")
@click.option(
    "--epochs",
    type=Count(min=0),
    default=None,
    help="Whole epochs; T = epochs * ceil(N/B), as `landscape train` runs them (ceil(1/q) per epoch with "
    "--sample-rate).",
)
@click.option("--delta", type=FiniteFloat(min=0, max=1, min_open=True, max_open=True), default=1e-5, show_default=True)
@click.option(
    "--accountant",
    type=click.Choice(["rdp", "pld"]),
    default="rdp",
    show_default=True,
    help="rdp: exact sampled-Gaussian RDP at Opacus' orders (equals Opacus); pld: dp_accounting's privacy "
    "loss distributions (tighter). As `landscape train --accountant`.",
)
@json_option
def privacy(as_json: bool, **query: Any) -> None:
    """Epsilon for --noise-multiplier, or sigma for --target-epsilon, over Poisson-subsampled Gaussian steps.

    Example: landscape privacy --noise-multiplier 1.1 --batch-size 256 --dataset-size 60000 --epochs 60
    """
    from landscape.api.accounting import PrivacyQuery
    from landscape.api.accounting import privacy as answer

    result = answer(PrivacyQuery(**query))
    if as_json:
        echo_json(result.to_dict())
        return
    where = f"q={result.sample_rate:.6g}, steps={result.steps}, delta={result.delta:g}, {result.method}"
    if query["target_epsilon"] is not None:
        click.echo(f"noise multiplier {result.noise_multiplier:.6g} "
                   f"(epsilon {result.epsilon:.4f} <= {query['target_epsilon']:g}; {where})")
    else:
        click.echo(f"epsilon {result.epsilon:.4f} (noise multiplier {result.noise_multiplier:g}; {where})")
