"""`landscape store ls|show` and `landscape import`: look into the checkpoint store and bring checkpoints in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cli.common import echo_json, echo_table, format_value, json_option, root_of
from cli.options import FiniteFloat, data_options, dataset_arguments, model_arguments, model_options
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

    listing = runs(root or root_of(ctx))
    for entry in listing["damaged"]:
        click.echo(f"warning: skipping a damaged run: {entry['error']}", err=True)
    summaries, damaged = listing["runs"], listing["damaged"]
    if as_json:
        echo_json(listing)
        return
    if not summaries:
        click.echo(f"no {'readable ' if damaged else ''}runs in {listing['root']}"
                   + ("" if Path(listing["root"]).is_dir() else " (no such directory)"))
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


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@model_options(default=None)
@data_options(default=None)
@click.option("--run", "run_name", required=True, help="Name of the new run (step 0 holds the imported weights).")
@click.option("--epsilon", type=FiniteFloat(min=0), default=None,
              help="Declare the weights' (epsilon, delta)-DP guarantee (with --delta); without a declaration their "
              "privacy history is unknown.")
@click.option("--delta", type=FiniteFloat(min=0, max=1, max_open=True), default=None,
              help="Delta of --epsilon (or at which to report the declared DP-SGD's epsilon; default 1e-5).")
@click.option("--noise-multiplier", type=FiniteFloat(min=0), default=None,
              help="Declare the DP-SGD that made the weights (with --sample-rate and --steps; composed exactly).")
@click.option("--sample-rate", type=FiniteFloat(min=0, max=1, min_open=True), default=None,
              help="Poisson sample rate of the declared DP-SGD.")
@click.option("--steps", type=click.IntRange(min=0), default=None, help="Steps of the declared DP-SGD.")
@json_option
@click.pass_context
def import_checkpoint(
    ctx: click.Context, file: str, model: str, model_kwargs: str | None, data: str, data_kwargs: str | None,
    subset: int | float | None, data_root: str | None, download: bool, run_name: str, epsilon: float | None,
    delta: float | None, noise_multiplier: float | None, sample_rate: float | None, steps: int | None,
    as_json: bool,
) -> None:
    """Import a foreign checkpoint FILE (.pt/.pth state dict, or .safetensors) as a new run.

    .pt files are read with torch.load(weights_only=True): a file that would run code is refused. Opacus'
    `_module.` key prefix is stripped; keys and shapes must match the model built for the data set.
    The weights' privacy history is unknown unless declared (--epsilon with --delta, or --noise-multiplier,
    --sample-rate and --steps): runs trained from them then say that their epsilon covers only the steps
    landscape saw.
    """
    from landscape.api.store_views import import_checkpoint as do_import

    name, kwargs = model_arguments(model, model_kwargs)
    data_args = dataset_arguments(data, data_kwargs, subset, data_root, download)
    done = do_import(file, run=run_name, model=name, model_kwargs=kwargs, data=data_args.pop("name"),
                     subset=data_args.pop("subset"), data_root=data_args.pop("data_root"),
                     download=data_args.pop("download"), data_kwargs=data_args, root=root_of(ctx), epsilon=epsilon,
                     delta=delta, noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    if as_json:
        echo_json(done)
        return
    click.echo(f"imported {file} -> {run_name}@init ({done['tensors']} tensors) at {done['path']}")
    if done["epsilon"] is not None:
        click.echo(f"privacy: declared epsilon {done['epsilon']:.4g}")
    elif done["privacy_note"]:
        click.echo(f"privacy: {done['privacy_note']} (declare it with --epsilon/--delta)")


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
