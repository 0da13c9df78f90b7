"""Running one batch job, wherever it runs (the client process or a Dask worker): a plain payload in, an outcome
mapping out. A finished job's record ``<results>/.batch/<job>.json``, written after its outputs, lets a later
batch skip it while the hash and every file's sha256 still match."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from landscape.errors import one_line


def record_path(results: str | Path, job_id: str) -> Path:
    return Path(results) / ".batch" / f"{job_id}.json"


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
        from landscape import kinds, plugins
        from landscape.results import sha256_file

        with plugins.trusting(payload.get("code", ()), accept_changed=payload.get("accept_changed_code", False)):
            # the job's kind builds its configuration from the options, runs it and says what it made; analyses
            # and figures write under the job's directory <results>/<job>
            spec = kinds.get(payload["kind"])
            out, root = Path(payload["results"]) / payload["id"], Path(payload["root"])
            numbers, files = spec.outcome(spec.run(spec.configure(dict(payload["options"])), root=root, out=out),
                                          root, out)
        outputs = [{"path": str(f), "bytes": f.stat().st_size, "sha256": sha256_file(f)}
                   for f in sorted(set(files)) if f.is_file() and not f.name.startswith(".")]
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


def pid() -> int:
    """This process' id (tests map Dask workers to processes with ``client.run(pid)``)."""
    return os.getpid()
