"""`landscape store ls|show`: look into the checkpoint store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cli.common import echo_json, echo_table, format_value, json_option, root_of
from landscape.plugins import short_name

# final metrics shown by `store ls`, in this order when present (others follow alphabetically, up to MAX)
PREFERRED_METRICS = ("test_acc", "test_loss", "train_acc", "train_loss")
MAX_METRIC_COLUMNS = 4


@click.group()
def store() -> None:
    """List runs and inspect checkpoints in the store (--root, env LANDSCAPE_ROOT)."""


@store.command("ls")
@click.argument("root", required=False, type=click.Path(file_okay=False))
@json_option
@click.pass_context
def ls(ctx: click.Context, root: str | None, as_json: bool) -> None:
    """List runs: checkpoints, steps, epoch, epsilon, final metrics.

    ROOT defaults to the global --root. Temporary files of interrupted writes are never listed. A damaged
    run (unreadable manifest, missing checkpoint file) is reported in one line on stderr (under "damaged"
    with --json) and the others are listed.
    """
    from landscape.api.store_views import runs
    from landscape.errors import CheckpointError

    root = root or root_of(ctx)
    if not Path(root).is_dir():  # as every command that reads a store: one line, exit 1
        what = "not a directory" if Path(root).exists() else "no such directory"
        raise CheckpointError(f"no store at {root} ({what}); give its directory with --root or LANDSCAPE_ROOT")
    listing = runs(root)
    for entry in listing["damaged"]:
        click.echo(f"warning: skipping a damaged run: {entry['error']}", err=True)
    summaries, damaged = listing["runs"], listing["damaged"]
    if as_json:
        echo_json(listing)
        return
    if not summaries:
        click.echo(f"no {'readable ' if damaged else ''}runs in {listing['root']}")
        return
    metric_names = _metric_columns(s["final_metrics"] for s in summaries)
    rows = []
    for s in summaries:
        steps = s["steps"]
        row = {
            "run": s["name"],
            "model": short_name(s["model"]),  # user code by its file name; store show / --json give the full path
            "data": short_name(s["data"]),
            "ckpts": len(steps),
            "steps": f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else (str(steps[0]) if steps else "-"),
            "epoch": s["last_epoch"],
            "epsilon": s["epsilon"],
        }
        row.update({m: s["final_metrics"].get(m) for m in metric_names})
        rows.append(row)
    echo_table(rows)
    for s in summaries:
        if s["privacy_note"]:
            click.echo(f"note: run {s['name']}: {s['privacy_note']}")


@store.command("show")
@click.argument("ref")
@json_option
@click.pass_context
def show(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Show one checkpoint: specs, metrics, tensor shapes, sha256.

    REF is PATH.h5 or RUN[@init|@last|@step=N|@epoch=E] (RUN alone means @last).
    """
    from landscape.api.store_views import checkpoint

    info = checkpoint(ref, root_of(ctx))
    if as_json:
        echo_json(info)
        return
    for key in ("path", "run", "step", "epoch", "epsilon", "sha256", "code_version", "parameters"):
        click.echo(f"{key:<13}{format_value(info[key])}")
    if info["privacy_note"]:
        click.echo(f"{'privacy':<13}{info['privacy_note']}")
    click.echo(f"{'model':<13}{_spec_text(info['model_spec'])}")
    click.echo(f"{'data':<13}{_spec_text(info['data_spec'])}")
    click.echo(f"{'metrics':<13}{' '.join(f'{k}={format_value(v)}' for k, v in info['metrics'].items()) or '-'}")
    if info["extra"]:
        click.echo(f"{'extra':<13}{', '.join(info['extra'])}")
    click.echo("")
    echo_table(
        [{"tensor": t["name"], "shape": "x".join(map(str, t["shape"])) or "scalar", "dtype": t["dtype"]}
         for t in info["tensors"]]
    )


def _metric_columns(all_metrics: Any) -> list[str]:
    names: set[str] = set()
    for metrics in all_metrics:
        names.update(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    ordered = [m for m in PREFERRED_METRICS if m in names] + sorted(names - set(PREFERRED_METRICS))
    return ordered[:MAX_METRIC_COLUMNS]


def _spec_text(spec: dict) -> str:
    if not spec:
        return "-"
    options = spec.get("kwargs", spec.get("options"))
    rest = {k: v for k, v in spec.items() if k not in ("name", "kwargs", "options")}
    parts = [str(spec.get("name", "?"))]
    parts += [f"{k}={v}" for k, v in (options or {}).items()]
    parts += [f"{k}={v}" for k, v in rest.items() if v is not None]
    return " ".join(parts)
