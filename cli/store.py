"""`landscape store ls|show` and `landscape import`: look into the checkpoint store and bring checkpoints in."""

from __future__ import annotations

import math
from typing import Any

import click

from cli.common import echo_json, echo_table, format_value, json_option, root_of
from cli.options import data_options, dataset_arguments, model_arguments, model_options

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
    from landscape.store import Store

    st = Store(root or root_of(ctx))
    runs, damaged = st.scan()
    for message in damaged.values():
        click.echo(f"warning: skipping a damaged run: {message}", err=True)
    summaries = [_run_summary(run) for run in runs]
    if as_json:
        echo_json({"root": str(st.root), "runs": summaries,
                   "damaged": [{"name": name, "error": message} for name, message in damaged.items()]})
        return
    if not summaries:
        click.echo(f"no {'readable ' if damaged else ''}runs in {st.root}"
                   + ("" if st.root.is_dir() else " (no such directory)"))
        return
    metric_names = _metric_columns(s["final_metrics"] for s in summaries)
    rows = []
    for s in summaries:
        steps = s["steps"]
        row = {
            "run": s["name"],
            "model": s["model"],
            "data": s["data"],
            "ckpts": len(steps),
            "steps": f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else (str(steps[0]) if steps else "-"),
            "epoch": s["last_epoch"],
            "epsilon": s["epsilon"],
        }
        row.update({m: s["final_metrics"].get(m) for m in metric_names})
        rows.append(row)
    echo_table(rows)


@store.command("show")
@click.argument("ref")
@json_option
@click.pass_context
def show(ctx: click.Context, ref: str, as_json: bool) -> None:
    """Show one checkpoint: specs, metrics, tensor shapes, sha256.

    REF is PATH.h5 or RUN[@init|@last|@step=N|@epoch=E] (RUN alone means @last).
    """
    from landscape.store import Store

    ckpt = Store(root_of(ctx)).load(ref, tensors=False)  # numpy arrays: no torch import to print shapes
    tensors = [
        {"name": k, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
         "numel": math.prod(t.shape)}
        for k, t in ckpt.state_dict.items()
    ]
    info = {
        "ref": ref, "path": str(ckpt.path), "run": ckpt.run, "step": ckpt.step, "epoch": ckpt.epoch,
        "epsilon": ckpt.epsilon, "metrics": ckpt.metrics, "model_spec": ckpt.model_spec,
        "data_spec": ckpt.data_spec, "sha256": ckpt.sha256, "code_version": ckpt.code_version,
        "parameters": sum(t["numel"] for t in tensors), "tensors": tensors,
        "extra": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in ckpt.extra.items()},
    }
    if as_json:
        echo_json(info)
        return
    for key in ("path", "run", "step", "epoch", "epsilon", "sha256", "code_version", "parameters"):
        click.echo(f"{key:<13}{format_value(info[key])}")
    click.echo(f"{'model':<13}{_spec_text(ckpt.model_spec)}")
    click.echo(f"{'data':<13}{_spec_text(ckpt.data_spec)}")
    click.echo(f"{'metrics':<13}{' '.join(f'{k}={format_value(v)}' for k, v in ckpt.metrics.items()) or '-'}")
    if ckpt.extra:
        click.echo(f"{'extra':<13}{', '.join(ckpt.extra)}")
    click.echo("")
    echo_table(
        [{"tensor": t["name"], "shape": "x".join(map(str, t["shape"])) or "scalar", "dtype": t["dtype"]}
         for t in tensors]
    )


@click.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@model_options(default=None)
@data_options(default=None)
@click.option("--run", "run_name", required=True, help="Name of the new run (step 0 holds the imported weights).")
@json_option
@click.pass_context
def import_checkpoint(
    ctx: click.Context, file: str, model: str, model_kwargs: str | None, data: str, data_kwargs: str | None,
    subset: int | float | None, data_root: str | None, download: bool, run_name: str, as_json: bool,
) -> None:
    """Import a foreign checkpoint FILE (.pt/.pth state dict, or .safetensors) as a new run.

    .pt files are read with torch.load(weights_only=True): a file that would run code is refused. Opacus'
    `_module.` key prefix is stripped; keys and shapes must match the model built for the data set.
    """
    from landscape.data import load_dataset
    from landscape.models import build_model
    from landscape.store import Store
    from landscape.store import import_checkpoint as do_import

    dataset = load_dataset(**dataset_arguments(data, data_kwargs, subset, data_root, download))
    name, kwargs = model_arguments(model, model_kwargs)
    spec = build_model(name, input_shape=dataset.input_shape, num_classes=dataset.num_classes,
                       **kwargs).landscape_spec
    st = Store(root_of(ctx))
    path = do_import(st, file, model_spec=spec, data_spec=dataset.spec, run=run_name)
    ckpt = st.load(str(path))
    if as_json:
        echo_json({"run": run_name, "ref": f"{run_name}@init", "path": str(path), "sha256": ckpt.sha256,
                   "tensors": len(ckpt.state_dict)})
        return
    click.echo(f"imported {file} -> {run_name}@init ({len(ckpt.state_dict)} tensors) at {path}")


def _run_summary(run: Any) -> dict[str, Any]:
    infos = run.checkpoints()
    last = infos[-1] if infos else None
    manifest = run.manifest
    return {
        "name": run.name,
        "path": str(run.path),
        "created": manifest.get("created"),
        "model": (manifest.get("model_spec") or {}).get("name"),
        "data": (manifest.get("data_spec") or {}).get("name"),
        "lineage": manifest.get("lineage"),
        "steps": [i.step for i in infos],
        "last_epoch": last.epoch if last else None,
        "epsilon": last.epsilon if last else None,
        "final_metrics": dict(last.metrics) if last else {},
    }


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
