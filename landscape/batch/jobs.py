"""Running one batch job, wherever it runs (the client process or a Dask worker).

:func:`run_job` is the whole contract: a plain payload (job id, kind, options, configuration hash, the store
root and results directory as absolute paths) in, an outcome mapping out. It never raises for a failing
job: the error becomes the outcome's one-line ``error`` so independent jobs go on (a *killed* worker is
different: Dask sees the lost task and runs it again elsewhere).

Idempotency: a job that finishes writes a record ``<results>/.batch/<job>.json`` (its configuration hash,
key numbers and every output file with its sha256) atomically, after its outputs. A later batch skips the
job (status ``cached``, nothing rewritten) when the record has the same hash and every listed file still
has its sha256. A job killed midway has no record and runs again: a training run resumes from its last
checkpoint (same numbers as an uninterrupted run), an analysis rewrites its result atomically.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from landscape.errors import one_line

RECORDS = ".batch"


def job_dir(results: str | Path, job_id: str) -> Path:
    """Where an analysis job writes its result (and figures, CSV, per-pair files)."""
    return Path(results) / job_id


def record_path(results: str | Path, job_id: str) -> Path:
    return Path(results) / RECORDS / f"{job_id}.json"


def run_job(payload: dict[str, Any], *upstream: dict[str, Any]) -> dict[str, Any]:
    """Run one job unless its outputs are current; ``upstream`` are the outcomes of the jobs it waits for."""
    start = time.perf_counter()
    job_id = payload["id"]
    base = {"id": job_id, "kind": payload["kind"], "hash": payload["hash"], "numbers": {}, "outputs": [],
            "error": None, "seconds": 0.0, "worker": _worker_name()}
    blocked = [u["id"] for u in upstream if u["status"] in ("failed", "skipped")]
    if blocked:
        return {**base, "status": "skipped", "error": f"not run: upstream job(s) failed: {', '.join(blocked)}"}
    record = _current_record(payload)
    if record is not None:
        return {**base, "status": "cached", "numbers": record.get("numbers", {}), "outputs": record["outputs"],
                "seconds": time.perf_counter() - start}
    threads = payload.get("threads")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    try:
        from landscape import plugins

        with plugins.trusting(payload.get("code", ()), accept_changed=payload.get("accept_changed_code", False)):
            numbers, files = _execute(payload)
        outputs = _describe_files(files)
        _write_record(payload, numbers, outputs)
    except Exception as exc:  # one job's failure is its outcome, not the batch's
        return {**base, "status": "failed", "error": one_line(exc), "seconds": time.perf_counter() - start}
    return {**base, "status": "done", "numbers": numbers, "outputs": outputs,
            "seconds": time.perf_counter() - start}


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return get_worker().name
    except (ImportError, ValueError):
        return "client"


# ------------------------------------------------------------------------------------------ records


def _current_record(payload: dict[str, Any]) -> dict[str, Any] | None:
    from landscape.results import sha256_file

    path = record_path(payload["results"], payload["id"])
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("hash") != payload["hash"] or not isinstance(
            record.get("outputs"), list):
        return None
    for entry in record["outputs"]:
        try:
            if sha256_file(entry["path"]) != entry["sha256"]:
                return None
        except (OSError, KeyError, TypeError):
            return None
    return record


def _write_record(payload: dict[str, Any], numbers: dict[str, Any], outputs: list[dict[str, Any]]) -> None:
    from landscape.results import atomic_write

    record = {"id": payload["id"], "kind": payload["kind"], "hash": payload["hash"],
              "options": payload["options"], "numbers": numbers, "outputs": outputs,
              "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    text = json.dumps(record, indent=1, sort_keys=True, default=str)
    atomic_write(record_path(payload["results"], payload["id"]), lambda tmp: Path(tmp).write_text(text))


def _describe_files(files: list[Path]) -> list[dict[str, Any]]:
    from landscape.results import sha256_file

    out = []
    for f in sorted(set(files)):
        if f.is_file() and not f.name.startswith("."):
            out.append({"path": str(f), "bytes": f.stat().st_size, "sha256": sha256_file(f)})
    return out


def _files_under(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")]


# ---------------------------------------------------------------------------------------- executors


def _execute(payload: dict[str, Any]) -> tuple[dict[str, Any], list[Path]]:
    kind, options = payload["kind"], dict(payload["options"])
    root = Path(payload["root"])
    if kind == "train":
        return _train(options, root)
    if kind == "phases":
        return _phases(options, root)
    if kind == "prune":
        return _prune(options, root)
    if kind == "align":
        return _align(options, root)
    if kind == "figures":
        return _figures(options, root, job_dir(payload["results"], payload["id"]))
    return _analysis(kind, options, root, job_dir(payload["results"], payload["id"]))


def _run_numbers(run) -> dict[str, Any]:
    from landscape.api.training import summarize

    s = summarize(run)
    return {k: getattr(s, k) for k in ("step", "epoch", "epsilon", "train_loss", "train_acc", "test_loss",
                                       "test_acc")}


def _train(options: dict[str, Any], root: Path) -> tuple[dict[str, Any], list[Path]]:
    from landscape.api.training import TrainConfig, train
    from landscape.errors import CheckpointError
    from landscape.store import Store
    from landscape.train.config import config_hash
    from landscape.train.loop import DEFAULT_DATA, DEFAULT_MODEL

    config = TrainConfig(**options)
    store = Store(root)
    if config.run in store.run_names():
        # the same job after a kill: resume (a finished run returns at once); a different config is an error
        existing = store.run(config.run).manifest
        full = config if config.from_ref is not None else dataclasses.replace(
            config, model=config.model or DEFAULT_MODEL, data=config.data or DEFAULT_DATA)
        if existing.get("checkpoints") and existing.get("config_hash") != config_hash(full):
            raise CheckpointError(f"run '{config.run}' already exists with a different configuration")
        if existing.get("checkpoints"):
            config = TrainConfig(resume=config.run, data_root=config.data_root, device=config.device)
    run = train(config, root=root, progress=False)
    return _run_numbers(run), _files_under(run.path)


def _phases(options: dict[str, Any], root: Path) -> tuple[dict[str, Any], list[Path]]:
    from landscape.api.training import PhasesConfig, TrainConfig, phases
    from landscape.store import Store

    phase_fields = {f.name for f in dataclasses.fields(PhasesConfig)}
    own = {k: options.pop(k) for k in list(options) if k in phase_fields}
    own = {k: tuple(v) if isinstance(v, list) else v for k, v in own.items()}
    summaries = phases(PhasesConfig(base=TrainConfig(**options), **own), root=root, progress=False)
    store = Store(root)
    files: list[Path] = []
    for s in summaries:
        files.extend(_files_under(store.run(s.run).path))
    accs = [s.test_acc for s in summaries if s.test_acc is not None]
    eps = [s.epsilon for s in summaries if s.epsilon is not None and math.isfinite(s.epsilon)]
    numbers = {"runs": len(summaries), "test_acc_min": min(accs) if accs else None,
               "test_acc_max": max(accs) if accs else None, "epsilon": max(eps) if eps else None}
    return numbers, files


def _prune(options: dict[str, Any], root: Path) -> tuple[dict[str, Any], list[Path]]:
    from landscape.api.pruning import PruneConfig, prune
    from landscape.store import Store

    result = prune(PruneConfig(**options), root=root)
    return {"kept_fraction": result.kept_fraction}, _files_under(Store(root).run(result.run).path)


def _align(options: dict[str, Any], root: Path) -> tuple[dict[str, Any], list[Path]]:
    from landscape.api.alignment import align
    from landscape.store import Store

    result = align(options.pop("ref_a"), options.pop("ref_b"), root=root, **options)
    numbers = {"distance_before": result.distance_before, "distance_after": result.distance_after,
               "iterations": result.iterations, "converged": int(result.converged)}
    return numbers, _files_under(Store(root).run(result.run).path)


def _figures(options: dict[str, Any], root: Path, out_dir: Path) -> tuple[dict[str, Any], list[Path]]:
    """One recipe (runs in the batch's store, files under the job's directory); numbers: the verdict (1 held,
    0 did not hold, NaN inconclusive) and its part counts."""
    from landscape.figures import registry
    from landscape.figures.recipe import make

    made = make(registry.get(options["recipe"]), scale=options.get("scale", "cpu"), out=out_dir, root=root,
                data_root=options.get("data_root"), rerun=bool(options.get("rerun", False)))
    numbers = {"verdict": {True: 1.0, False: 0.0, None: math.nan}[made.verdict.held]}
    numbers.update({f"parts_{k.replace(' ', '_')}": v for k, v in made.verdict.numbers.items()
                    if k in ("held", "did not hold", "inconclusive")})
    return numbers, _files_under(out_dir)


def _analysis(kind: str, options: dict[str, Any], root: Path, out_dir: Path) -> tuple[dict[str, Any], list[Path]]:
    from landscape.api.runner import run
    from landscape.results import read_result

    refs = options.pop("refs", [])
    refs = [refs] if isinstance(refs, str) else list(refs)
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    if options.get("pair_dir"):  # instability's shared per-pair files: relative to the results directory
        options["pair_dir"] = str(out_dir.parent / options["pair_dir"])
    output = out_dir / f"{kind}.h5"
    result = run(kind, refs, root=root, output=output, workers=1, **options)
    path = Path(getattr(result, "path", None) or output)
    attrs = read_result(path, load_arrays=False).attrs
    numbers = {k: _plain(v) for k, v in attrs.items() if _is_number(v)}
    return numbers, _files_under(out_dir)


def _is_number(value: Any) -> bool:
    import numpy as np

    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def pid() -> int:
    """This process' id (tests map Dask workers to processes with ``client.run(pid)``)."""
    return os.getpid()
