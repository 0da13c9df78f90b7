"""`landscape show RESULT.h5`: print any result file."""

from __future__ import annotations

import click
import numpy as np

from cli.common import echo_json, echo_table, json_option
from landscape.results import read_result


@click.command()
@click.argument("result", type=click.Path(dir_okay=False))
@json_option
def show(result: str, as_json: bool) -> None:
    """Print a result file: kind, inputs (with sha256), options, scalar attrs and array shapes."""
    res = read_result(result)
    arrays = {name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in res.arrays.items()}
    if as_json:
        small = {n: a for n, a in res.arrays.items() if a.size <= 64}
        echo_json({"path": res.path, "kind": res.kind, "attrs": res.attrs, "params": res.params,
                   "inputs": res.inputs, "arrays": arrays, "values": small})
        return
    click.echo(f"{res.path}: {res.kind}")
    for ref in res.inputs:
        click.echo(f"  input  {ref.ref}  sha256={ref.sha256[:16]}…  {ref.path}")
    for key, value in res.params.items():
        click.echo(f"  param  {key} = {value}")
    for key, value in sorted(res.attrs.items()):
        if key != "kind":
            click.echo(f"  attr   {key} = {value}")
    rows = [
        {"array": n, "shape": "x".join(map(str, a.shape)) or "scalar", "dtype": str(a.dtype),
         "min": _stat(a, np.nanmin), "max": _stat(a, np.nanmax)}
        for n, a in sorted(res.arrays.items())
    ]
    echo_table(rows)


def _stat(a: np.ndarray, fn) -> float | None:
    if a.size == 0 or not np.issubdtype(a.dtype, np.number) or np.all(np.isnan(a.astype(float))):
        return None
    return float(fn(a.astype(float)))
