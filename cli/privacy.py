"""`landscape privacy`: epsilon of a DP-SGD schedule, or the noise multiplier that reaches a target epsilon."""

from __future__ import annotations

from typing import Any

import click

from cli.common import echo_json, json_option
from cli.generate import config_options
from cli.options import add_options
from landscape.api.accounting import PrivacyQuery


@click.command()
@add_options(config_options(PrivacyQuery))
@json_option
def privacy(as_json: bool, **query: Any) -> None:
    """Epsilon for --noise-multiplier, or sigma for --target-epsilon, over Poisson-subsampled Gaussian steps.

    Example: landscape privacy --noise-multiplier 1.1 --batch-size 256 --dataset-size 60000 --epochs 60
    """
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
