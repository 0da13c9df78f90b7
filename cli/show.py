"""`landscape show RESULT.h5`: print any result file."""

from __future__ import annotations

import click

from cli.common import echo_json, echo_table, json_option


@click.command()
@click.argument("result", type=click.Path(dir_okay=False))
@json_option
def show(result: str, as_json: bool) -> None:
    """Print a result file: kind, inputs (with sha256), options, scalar attrs and array shapes."""
    from landscape.api.store_views import show as summary

    info = summary(result)
    stats = info.pop("stats")
    if as_json:
        echo_json(info)
        return
    click.echo(f"{info['path']}: {info['kind']}")
    for ref in info["inputs"]:
        click.echo(f"  input  {ref.ref}  sha256={ref.sha256[:16]}…  {ref.path}")
    for key, value in info["params"].items():
        click.echo(f"  param  {key} = {value}")
    for key, value in sorted(info["attrs"].items()):
        if key != "kind":
            click.echo(f"  attr   {key} = {value}")
    rows = [
        {"array": n, "shape": "x".join(map(str, a["shape"])) or "scalar", "dtype": a["dtype"],
         "min": stats[n]["min"], "max": stats[n]["max"]}
        for n, a in sorted(info["arrays"].items())
    ]
    echo_table(rows)
