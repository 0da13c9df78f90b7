"""Looking into the store and bringing checkpoints in: plain dicts, what ``store ls``, ``store show``,
``show`` and ``import`` print with ``--json``. ``runs``, ``checkpoint`` and ``show`` import no torch."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from landscape.api.jobkind import JobKind, run_files, run_option
from landscape.errors import CheckpointError, one_line, param
from landscape.options import SOURCE_HELP, check_kwargs, option
from landscape.runtime import DATA_ENV

if TYPE_CHECKING:
    import numpy as np


# the largest array (number of elements) whose values ``show`` returns in "values"
SMALL_ARRAY = 64


def runs(root: str | os.PathLike = "checkpoints", pattern: str = "*") -> dict[str, Any]:
    """The runs of the store at ``root`` (names matching ``pattern``) and the damaged ones.

    Returns ``{"root", "runs", "damaged"}``: one summary per readable run (model, data, lineage, steps, last
    epoch, epsilon, ``privacy_note`` and metrics), and ``{"name", "error"}`` per run whose manifest is
    unreadable or whose checkpoint file is missing.
    """
    from landscape.store import Store

    st = Store(root)
    found, damaged = st.scan(pattern)
    summaries = []
    for run in found:
        try:
            summaries.append(_run_summary(run))
        except Exception as exc:  # a field the store's schema does not check: this run's damage alone
            damaged[run.name] = f"run '{run.name}': cannot be summarised: {one_line(exc)}"
    return {"root": str(st.root), "runs": summaries,
            "damaged": [{"name": name, "error": damaged[name]} for name in sorted(damaged)]}


def checkpoint(ref: str, root: str | os.PathLike = "checkpoints") -> dict[str, Any]:
    """What one checkpoint holds, without its values: specs, metrics, tensor names/shapes/dtypes, sha256.

    ``ref`` is ``PATH.h5`` or ``RUN[@init|@last|@step=N|@epoch=E]`` (``RUN`` alone means ``@last``).
    """
    from landscape.privacy import ancestry_note
    from landscape.store import MANIFEST, Store

    st = Store(root)
    ckpt = st.load(ref, tensors=False)  # numpy arrays: no torch import to read shapes
    note = None
    if ckpt.run is not None and (ckpt.path.parent / MANIFEST).is_file() and ckpt.path.parent.name == ckpt.run:
        note = ancestry_note(Store(ckpt.path.parent.parent).run(ckpt.run).manifest)
    tensors = [
        {"name": k, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
         "numel": math.prod(t.shape)}
        for k, t in ckpt.state_dict.items()
    ]
    return {
        "ref": ref, "path": str(ckpt.path), "run": ckpt.run, "step": ckpt.step, "epoch": ckpt.epoch,
        "epsilon": ckpt.epsilon, "privacy_note": note, "metrics": ckpt.metrics, "model_spec": ckpt.model_spec,
        "data_spec": ckpt.data_spec, "sha256": ckpt.sha256, "code_version": ckpt.code_version,
        "parameters": sum(t["numel"] for t in tensors), "tensors": tensors,
        "extra": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in ckpt.extra.items()},
    }


def show(path: str | os.PathLike) -> dict[str, Any]:
    """The summary of one result file: kind, inputs (with sha256), options, scalar attrs, arrays.

    ``stats`` holds each array's nan-ignoring min and max, ``values`` the arrays of at most 64 elements.
    """
    import numpy as np

    from landscape.results import read_result

    res = read_result(path)
    return {
        "path": res.path, "kind": res.kind, "attrs": res.attrs, "params": res.params, "inputs": res.inputs,
        "arrays": {n: {"shape": list(a.shape), "dtype": str(a.dtype)} for n, a in res.arrays.items()},
        "values": {n: a for n, a in res.arrays.items() if a.size <= SMALL_ARRAY},
        "stats": {n: {"min": _stat(a, np.nanmin), "max": _stat(a, np.nanmax)} for n, a in res.arrays.items()},
    }


def import_checkpoint(file: str | os.PathLike, *, run: str, model: str, data: str,
                      model_kwargs: dict[str, Any] | None = None, data_kwargs: dict[str, Any] | None = None,
                      subset: int | float | None = None, data_root: str | None = None, download: bool = False,
                      root: str | os.PathLike = "checkpoints", epsilon: float | None = None,
                      delta: float | None = None, noise_multiplier: float | None = None,
                      sample_rate: float | None = None, steps: int | None = None) -> dict[str, Any]:
    """Import a foreign checkpoint (.pt/.pth state dict or .safetensors) as the step-0 checkpoint of a new
    run.

    The model is built for the data set (either may be a code reference ``module:factory``) and the file's
    keys and shapes must match it; .pt files are read with ``torch.load(weights_only=True)``. The weights'
    privacy history is unknown unless declared: ``epsilon`` with ``delta``, or the DP-SGD that made them
    (``noise_multiplier``, ``sample_rate``, ``steps``). Returns the new run's summary.
    """
    from landscape import plugins
    from landscape.api.accounting import import_privacy
    from landscape.data import load_dataset
    from landscape.models import build_model, check_forward
    from landscape.privacy import ancestry_note
    from landscape.store import Store, check_regular_file, looks_like_torch_file
    from landscape.store import import_checkpoint as store_import

    check_kwargs(data_kwargs, model_kwargs)
    source = Path(file)
    check_regular_file(source)
    target = source.resolve()  # a link is judged by what it points to, before the data set is loaded
    if source.suffix.lower() in (".pt", ".pth") and target.is_file() and not looks_like_torch_file(target):
        link = f" (a link to {target})" if source.is_symlink() else ""
        raise CheckpointError(f"cannot read {file}{link} as a PyTorch file: not a torch.save() file (neither a zip "
                              "archive nor a binary pickle); is it the right file?")
    privacy, declared_epsilon = import_privacy(epsilon, delta, noise_multiplier, sample_rate, steps)
    dataset = load_dataset(name=data, subset=subset, data_root=data_root, download=download,
                           **(data_kwargs or {}))
    built = build_model(model, input_shape=dataset.input_shape, num_classes=dataset.num_classes,
                        **(model_kwargs or {}))
    check_forward(built, dataset.x_train[:2], dataset.num_classes)  # the model must take this data
    spec = built.landscape_spec
    st = Store(root)
    with plugins.trusting([r for r in (model, data) if plugins.is_code_ref(r)]):  # named here: may be rebuilt
        path = store_import(st, file, model_spec=spec, data_spec=dataset.spec, run=run, privacy=privacy,
                            epsilon=declared_epsilon)
    ckpt = st.load(str(path), tensors=False)
    return {"run": run, "ref": f"{run}@init", "path": str(path), "sha256": ckpt.sha256,
            "tensors": len(ckpt.state_dict), "epsilon": ckpt.epsilon,
            "privacy_note": ancestry_note(st.run(run).manifest)}


@dataclass(frozen=True, kw_only=True)
class ImportConfig:
    """The options of :func:`import_checkpoint` (the job kind ``import``: its command is generated from
    them)."""

    file: str = option(help="The .pt/.pth state dict or .safetensors file.", kind="file")
    model: str = option(help=SOURCE_HELP["model"], kind="model")
    model_kwargs: dict[str, Any] | None = option(None, SOURCE_HELP["model_kwargs"], kind="json")
    data: str = option(help=SOURCE_HELP["data"], kind="data")
    data_kwargs: dict[str, Any] | None = option(None, SOURCE_HELP["data_kwargs"], kind="json")
    subset: int | float | None = option(None, SOURCE_HELP["subset"], kind="subset")
    data_root: str | None = option(None, SOURCE_HELP["data_root"], kind="directory", envvar=DATA_ENV)
    download: bool = option(False, SOURCE_HELP["download"])
    run: str = option(help="Name of the new run (step 0 holds the imported weights).")
    epsilon: float | None = option(None, "Declare the weights' (epsilon, delta)-DP guarantee (with --delta); without "
                                         "a declaration their privacy history is unknown.", min=0)
    delta: float | None = option(None, "Delta of --epsilon (or at which to report the declared DP-SGD's epsilon; "
                                       "default 1e-5).", min=0, max=1, max_open=True)
    noise_multiplier: float | None = option(None, "Declare the DP-SGD that made the weights (with --sample-rate and "
                                                  "--steps; composed exactly).", min=0)
    sample_rate: float | None = option(None, "Poisson sample rate of the declared DP-SGD.", min=0, max=1,
                                       min_open=True)
    steps: int | None = option(None, "Steps of the declared DP-SGD.", min=0)

    def validate(self) -> None:
        check_kwargs(self.data_kwargs, self.model_kwargs)


@dataclass(frozen=True)
class Imported:
    """What ``landscape import`` made: the file and :func:`import_checkpoint`'s summary (its ``--json``)."""

    file: str
    done: dict[str, Any]


def _import_command(config: ImportConfig, *, root: Path, progress: bool, report: Any) -> Imported:
    return Imported(config.file, import_checkpoint(root=root, **dataclasses.asdict(config)))


def _import_notes(made: Imported) -> list[str]:
    done = made.done
    lines = [f"imported {made.file} -> {done['run']}@init ({done['tensors']} tensors) at {done['path']}"]
    if done["epsilon"] is not None:
        lines.append(f"privacy: declared epsilon {done['epsilon']:.4g}")
    elif done["privacy_note"]:
        lines.append(f"privacy: {done['privacy_note']} (declare it with {param('epsilon')} and {param('delta')})")
    return lines


def _import_job(config: ImportConfig, *, root: Path, out: Path | None = None) -> dict[str, Any]:
    """An import job: a run of that name whose step 0 has the file's weights is the job done before."""
    from landscape.hashing import sha256_file
    from landscape.store import Store

    store = Store(root)
    if config.run in store.run_names():
        run = store.run(config.run)
        if run.checkpoints() and (run.manifest.get("lineage") or {}).get("sha256") == sha256_file(config.file):
            ckpt = store.load(f"{config.run}@init", tensors=False)
            return {"run": config.run, "ref": f"{config.run}@init", "path": str(ckpt.path), "sha256": ckpt.sha256,
                    "tensors": None, "epsilon": ckpt.epsilon, "privacy_note": None}
    return import_checkpoint(root=root, **dataclasses.asdict(config))


def _import_outcome(done: dict[str, Any], root: Path, out: Path | None) -> tuple[dict[str, Any], list[Path]]:
    numbers = {k: done[k] for k in ("tensors", "epsilon") if isinstance(done.get(k), (int, float))}
    return numbers, run_files(root, done["run"])


IMPORT_JOB = JobKind(
    name="import", config=ImportConfig, run=_import_job, arguments=("file",), required=("file", "run", "model", "data"),
    produces=run_option, outcome=_import_outcome, api=import_checkpoint, command=_import_command,
    notes=_import_notes, details=lambda made: made.done,
    doc="""Import a foreign checkpoint FILE (.pt/.pth state dict, or .safetensors) as a new run.

    .pt files are read with torch.load(weights_only=True): a file that would run code is refused. The key
    prefixes of wrappers (torch.compile's `_orig_mod.`, Opacus' `_module.`, DataParallel's `module.`) are
    stripped; keys and shapes must match the model built for the data set.
    The weights' privacy history is unknown unless declared (--epsilon with --delta, or --noise-multiplier,
    --sample-rate and --steps): runs trained from them then say that their epsilon covers only the steps
    landscape saw.
    """,
)


def _run_summary(run: Any) -> dict[str, Any]:
    from landscape.privacy import ancestry_note

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
        "privacy_note": ancestry_note(manifest),
        "final_metrics": dict(last.metrics) if last else {},
    }


def _stat(a: np.ndarray, fn: Any) -> float | None:
    import numpy as np

    if a.size == 0 or not np.issubdtype(a.dtype, np.number) or np.all(np.isnan(a.astype(float))):
        return None
    return float(fn(a.astype(float)))
