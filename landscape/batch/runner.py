"""Run a validated batch: in this process, on a local Dask cluster, or on an existing Dask scheduler (each job a
future whose arguments are the futures of the jobs it waits for; a job on a worker that dies runs again)."""

from __future__ import annotations

import importlib.util
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape import plugins
from landscape import progress as display
from landscape.batch.jobs import run_job
from landscape.batch.spec import BatchSpec, Job
from landscape.errors import UsageError, param

STATUSES = ("done", "cached", "failed", "skipped")

# The local cluster's workers fork from this process after torch and the job code are imported (spawning
# paid ~5 s CPU per worker to import them again), and skip Dask's statistical profiler (it samples every
# thread's stack every 10 ms: CPU taken from the jobs on a small machine) and its frequent system monitor.
LOCAL_WORKER_CONFIG = {
    "distributed.worker.multiprocessing-method": "fork",
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.admin.system-monitor.gil.enabled": False,
}


@dataclass
class BatchReport:
    """What a batch did: one outcome per job (spec order), the summary files and the wall time."""

    outcomes: list[dict[str, Any]]
    summary_csv: Path | None = None
    summary_h5: Path | None = None
    index_csv: Path | None = None
    seconds: float = 0.0
    dashboard: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    lost_workers: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [o for o in self.outcomes if o["status"] == "failed"]

    @property
    def skipped(self) -> list[dict[str, Any]]:
        return [o for o in self.outcomes if o["status"] == "skipped"]


def payload(job: Job, spec: BatchSpec, threads: int | None) -> dict[str, Any]:
    """What a job needs, as plain data: its own fields, the store and results folders, the thread count and the
    user code named for this batch (``landscape --code``), which a Dask worker must trust as this process does."""
    trusted = plugins.trust_state()
    return {**job.payload(), "root": str(spec.root), "results": str(spec.results), "threads": threads,
            "code": list(trusted.refs), "accept_changed_code": trusted.accept_changed}


def spec_code(spec: BatchSpec) -> list[str]:
    """The user code the spec's own jobs name as a ``model`` or ``data`` (a train job's ``model:
    my_model.py:make`` runs that code, as ``train --model`` does): the batch's other jobs may rebuild what those
    jobs wrote without ``landscape --code``. A reference the spec does not name still needs ``--code``."""
    return plugins.code_refs(*(job.options.get(key) for job in spec.jobs for key in ("model", "data")))


def run_batch(spec: BatchSpec, *, workers: int = 1, scheduler: str | None = None, threads: int | None = None,
              progress: bool | None = None) -> BatchReport:
    """Run every job of ``spec``; ``workers`` local processes (1: this process) or ``scheduler``'s workers.
    ``progress`` True / False turns the progress display on / off, None follows the caller's. Writes the summary
    (``summary.csv``, ``summary.h5``) and the file index (``index.csv``) under ``spec.results``."""
    with display.enabled(progress), JobProgress(spec) as shown:
        start = time.perf_counter()
        if (scheduler is not None or workers > 1) and importlib.util.find_spec("distributed") is None:
            raise UsageError(f"{param('workers')} > 1 and {param('scheduler')} need Dask: "
                             "pip install 'landscape[dist]'")
        client = None
        if scheduler is not None:  # before anything is made; the handshake has the deadline the note says
            from landscape.api.execution import connect_client, scheduler_address
            from landscape.bounds import scheduler_note

            display.note(scheduler_note(scheduler))
            client = connect_client(scheduler_address(scheduler))
        try:
            spec.results.mkdir(parents=True, exist_ok=True)
            spec.root.mkdir(parents=True, exist_ok=True)
        except BaseException:
            if client is not None:
                client.close()
            raise
        lost: list[str] = []
        retried: list[str] = []
        with plugins.trusting(spec_code(spec)):
            if scheduler is None and workers <= 1:
                done: dict[str, dict[str, Any]] = {}
                for job in spec.jobs:
                    shown.running([job.id])
                    done[job.id] = run_job(payload(job, spec, threads), *(done[d] for d in job.deps))
                    shown.finish(done[job.id])
                outcomes, dashboard = [done[j.id] for j in spec.jobs], None
            else:
                outcomes, dashboard = _on_dask(spec, workers, client, threads if threads else 1, shown, lost,
                                               retried)
        report = BatchReport(outcomes=outcomes, seconds=time.perf_counter() - start, dashboard=dashboard,
                             lost_workers=lost, retried=retried)
        report.counts = {s: sum(o["status"] == s for o in outcomes) for s in STATUSES}
        write_summary(spec, report)
        return report


def _on_dask(spec: BatchSpec, workers: int, client: Any, threads: int, progress: JobProgress,
             lost: list[str], retried: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    """The jobs on ``client``'s cluster, or (None) on a local cluster of ``workers`` processes made here."""
    from distributed import Client, LocalCluster

    cluster = None
    if client is None:
        dashboard = "127.0.0.1:0" if _has_bokeh() else None
        import dask

        import landscape.batch.jobs  # noqa: F401  (imported before the workers fork: they start warm)
        import landscape.train.loop  # noqa: F401
        with dask.config.set(LOCAL_WORKER_CONFIG):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address=dashboard, silence_logs=logging.CRITICAL,
                                   worker_dashboard_address=None, preload=["landscape.batch.parent_watch"])
        client = Client(cluster)
    try:
        link = client.dashboard_link if (cluster is None or _has_bokeh()) else None
        display.note(f"dask: {len(client.scheduler_info(n_workers=-1)['workers'])} worker(s) at "
                      f"{client.scheduler.address}; dashboard: "
                      f"{link or 'not available (pip install bokeh for the Dask dashboard)'}")
        futures: dict[str, Any] = {}
        for job in spec.jobs:
            futures[job.id] = client.submit(run_job, payload(job, spec, threads), *(futures[d] for d in job.deps),
                                            key=f"batch-{job.id}-{job.hash}", pure=False)
        ids = {f.key: job_id for job_id, f in futures.items()}
        by_id = {j.id: j for j in spec.jobs}
        outcomes: dict[str, dict[str, Any]] = {}
        capacity = max(1, sum(client.nthreads().values()))

        def running() -> list[str]:
            ready = [j for j in spec.jobs if j.id not in outcomes and all(d in outcomes for d in j.deps)]
            return [j.id for j in ready][:capacity]

        progress.running(running())
        watch = WorkerWatch(client, ids)
        pending = dict(futures)
        while pending:
            finished = [job_id for job_id, f in pending.items() if f.done()]
            if not finished:
                watch.poll()
                time.sleep(0.25)
                continue
            for job_id in finished:
                future = pending.pop(job_id)
                try:
                    outcome = future.result()
                except Exception as exc:  # e.g. KilledWorker after too many worker deaths
                    from landscape.errors import one_line

                    job = by_id[job_id]
                    outcome = {"id": job_id, "kind": job.kind, "hash": job.hash, "status": "failed",
                               "error": one_line(exc), "numbers": {}, "outputs": [], "seconds": 0.0, "worker": "?"}
                outcomes[job_id] = outcome
                progress.finish(outcome)
            progress.running(running())
        watch.poll()
        lost.extend(watch.lost)
        retried.extend(watch.retried)
        return [outcomes[j.id] for j in spec.jobs], link
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


class WorkerWatch:
    """Which Dask workers left mid-batch and which jobs were running on them (Dask runs those again on another
    worker): each loss is one progress line, and the batch's report lists them."""

    def __init__(self, client: Any, ids: dict[str, str]):
        self.client, self.ids = client, ids
        self.known = set(client.scheduler_info(n_workers=-1)["workers"])
        self.on: dict[str, list[str]] = {}
        self.lost: list[str] = []
        self.retried: list[str] = []
        self.deaths: dict[str, int] = {}  # job -> how many workers died under it (the scheduler's count)

    def poll(self) -> None:
        try:
            workers = set(self.client.scheduler_info(n_workers=-1)["workers"])
            processing = self.client.processing()
        except Exception:  # the scheduler is busy or closing: look again at the next poll
            return
        gone_now = sorted(self.known - workers)
        # the jobs Dask runs again are those whose count of deaths under them ("suspicious") went up: exact, where
        # the last poll's view of who runs what misses a job that started since (it only says which worker)
        rerun = self._rerun() if gone_now else None
        for gone in gone_now:
            jobs = self.on.get(gone, [])
            if rerun is not None:
                jobs = [j for j in jobs if j in rerun]
                if gone == gone_now[-1]:  # the rest were on no other lost worker: on this one
                    placed = {j for w in gone_now for j in self.on.get(w, [])}
                    jobs += [j for j in rerun if j not in placed]
            self.lost.append(gone)
            self.retried.extend(j for j in jobs if j not in self.retried)
            display.note(f"lost worker {gone}; job(s) rerun on other workers: {', '.join(jobs) or 'none'}")
        self.known = workers
        self.on = {w: [self.ids[k] for k in keys if k in self.ids] for w, keys in processing.items()}

    def _rerun(self) -> list[str] | None:
        """The jobs that a worker's death sent to run again since the last call (None: the scheduler did not
        answer)."""
        def suspicious(dask_scheduler):
            return {key: ts.suspicious for key, ts in dask_scheduler.tasks.items() if ts.suspicious}

        try:
            counts = {self.ids[k]: n for k, n in self.client.run_on_scheduler(suspicious).items() if k in self.ids}
        except Exception:
            return None
        rerun = [job for job, n in counts.items() if n > self.deaths.get(job, 0)]
        self.deaths.update(counts)
        return rerun


def _has_bokeh() -> bool:
    return importlib.util.find_spec("bokeh") is not None


class JobProgress:
    """A batch's jobs on the progress display (:mod:`landscape.progress`): one line per finished job (status, id,
    seconds, error) and the jobs done of the total with the done / cached / running / failed / skipped counts."""

    def __init__(self, spec: BatchSpec):
        self.counts = dict.fromkeys(STATUSES, 0)
        self.active: list[str] = []
        self.task = display.task("batch", total=len(spec.jobs), unit="jobs")
        self._describe()

    def __enter__(self) -> JobProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.task.close()

    def running(self, ids: list[str]) -> None:
        self.active = list(ids)
        self._describe()

    def finish(self, outcome: dict[str, Any]) -> None:
        self.counts[outcome["status"]] += 1
        self.active = [a for a in self.active if a != outcome["id"]]
        line = f"{outcome['status']:7s} {outcome['id']} ({outcome['seconds']:.1f} s)"
        if outcome.get("error"):
            line += f": {outcome['error']}"
        display.note(line)
        self.task.update(1)
        self._describe()

    def _describe(self) -> None:
        c = self.counts
        running = f" ({', '.join(self.active[:3])}{', ...' if len(self.active) > 3 else ''})" if self.active else ""
        self.task.describe_as(f"done {c['done']}, cached {c['cached']}, running {len(self.active)}{running}, "
                              f"failed {c['failed']}, skipped {c['skipped']}")


def summary_rows(spec: BatchSpec, report: BatchReport) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per job: id, kind, status, seconds, error, configuration hash, then its key numbers."""
    fixed = ["job", "kind", "status", "seconds", "error", "hash", "outputs", "worker"]
    number_cols = list(dict.fromkeys(k for o in report.outcomes for k in o.get("numbers") or {}))
    # a result's own scalar named like a fixed column (an analysis' "seconds") gets a prefix
    named = {k: f"result_{k}" if k in fixed else k for k in number_cols}
    cols = [*fixed, *named.values()]
    rows = []
    for o in report.outcomes:
        row = {"job": o["id"], "kind": o["kind"], "status": o["status"], "seconds": round(o["seconds"], 3),
               "error": o.get("error") or "", "hash": o["hash"], "outputs": len(o.get("outputs") or []),
               "worker": str(o.get("worker") or "")}
        for k in number_cols:
            row[named[k]] = (o.get("numbers") or {}).get(k)
        rows.append(row)
    return cols, rows


def write_summary(spec: BatchSpec, report: BatchReport) -> None:
    """``summary.csv`` + ``summary.h5`` (one row per job) and ``index.csv`` (every output file, sha256)."""
    import numpy as np

    from landscape.results import write_csv, write_result

    cols, rows = summary_rows(spec, report)
    out = spec.results
    report.summary_csv = write_csv(out / "summary.csv", [{k: "" if r[k] is None else r[k] for k in cols}
                                                         for r in rows], cols, nan="nan")
    index = [{"job": o["id"], "path": e["path"], "bytes": e["bytes"], "sha256": e["sha256"]}
             for o in report.outcomes for e in o.get("outputs") or []]
    report.index_csv = write_csv(out / "index.csv", index, ["job", "path", "bytes", "sha256"])
    arrays: dict[str, Any] = {}
    for c in cols:
        values = [r[c] for r in rows]
        if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
            arrays[c] = np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)
        else:
            arrays[c] = np.array([("" if v is None else str(v)).encode() for v in values], dtype=bytes)
    for c in ("job", "path", "sha256"):
        arrays[f"index_{c}"] = np.array([r[c].encode() for r in index], dtype=bytes)
    arrays["index_bytes"] = np.array([r["bytes"] for r in index], dtype=np.int64)
    report.summary_h5 = write_result(
        out / "summary.h5", "batch-summary", arrays=arrays,
        attrs={"spec": str(spec.path), "root": str(spec.root), "jobs": len(rows), "seconds": report.seconds,
               **{f"n_{s}": n for s, n in report.counts.items()}, "lost_workers": len(report.lost_workers),
               "retried_jobs": ",".join(report.retried)},
        params={"columns": cols})


def format_table(report: BatchReport) -> str:
    """The summary as an aligned text table (job, kind, status, seconds, error)."""
    head = ["job", "kind", "status", "seconds", "error"]
    rows = [[o["id"], o["kind"], o["status"], f"{o['seconds']:.1f}", o.get("error") or ""] for o in report.outcomes]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head[:-1])]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head[:-1], widths, strict=True)) + "  error"]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + ("  " + r[-1] if r[-1] else ""))
    return "\n".join(lines)
