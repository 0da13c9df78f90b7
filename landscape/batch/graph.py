"""A batch's job graph: the expanded jobs, their dependency edges (runs read from the jobs that write them, and
``after:``), a dependency order, configuration hashes, and the graph as text or Graphviz dot."""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from landscape.batch.checks import run_tokens
from landscape.batch.loading import SpecError


@dataclass
class Job:
    """One expanded job: its name, kind, options (templates filled in), dependencies and configuration hash."""

    id: str
    key: str
    kind: str
    line: int
    options: dict[str, Any]
    variables: dict[str, Any] = field(default_factory=dict)
    produces: tuple[str, ...] = ()
    deps: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    hash: str = ""

    def payload(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "options": self.options, "produces": list(self.produces),
                "hash": self.hash}


@dataclass
class BatchSpec:
    """A validated batch: the store root, the results directory and the jobs in dependency order."""

    path: Path
    root: Path
    results: Path
    jobs: list[Job]

    def job(self, job_id: str) -> Job:
        return next(j for j in self.jobs if j.id == job_id)


def _link(jobs: list[Job], afters: dict[str, tuple[list[str], str]], path: Path) -> None:
    producers = {run: job.id for job in jobs for run in job.produces}
    by_key: dict[str, list[str]] = {}
    for job in jobs:
        by_key.setdefault(job.key, []).append(job.id)
    ids = {job.id for job in jobs}
    for job in jobs:
        deps: list[str] = []
        reads = {k: v for k, v in job.options.items() if k not in ("run", "group")}
        for token in run_tokens(list(reads.values())):
            if token in producers:
                deps.append(producers[token])
            elif any(c in token for c in "*?["):
                deps.extend(pid for run, pid in producers.items() if fnmatch.fnmatchcase(run, token))
        after, at = afters[job.id]
        explicit = []
        for name in after:
            if name in by_key:
                explicit.extend(by_key[name])
            elif name in ids:
                explicit.append(name)
            else:
                raise SpecError(f"{at}: jobs.{job.key}.after: no job named '{name}'")
        job.after = tuple(dict.fromkeys(explicit))
        job.deps = tuple(d for d in dict.fromkeys([*deps, *explicit]) if d != job.id)
        if job.id in explicit:
            raise SpecError(f"{at}: cyclic dependency: job '{job.id}' is after itself")


def _topological(jobs: list[Job], path: Path) -> list[Job]:
    """Jobs in a dependency order (spec order among the ready ones); a cycle is a SpecError naming it."""
    by_id = {j.id: j for j in jobs}
    state: dict[str, int] = {}
    order: list[Job] = []

    def visit(job: Job, stack: list[str]) -> None:
        if state.get(job.id) == 2:
            return
        if state.get(job.id) == 1:
            cycle = [*stack[stack.index(job.id):], job.id]
            raise SpecError(f"{path}:{job.line}: cyclic dependency: {' -> '.join(cycle)} (jobs.{job.key})")
        state[job.id] = 1
        for dep in job.deps:
            visit(by_id[dep], [*stack, job.id])
        state[job.id] = 2
        order.append(job)

    for job in jobs:
        visit(job, [])
    return order


def _hash_jobs(ordered: list[Job]) -> None:
    """Configuration hash of each job: its kind, options and the hashes of the jobs it reads (a Merkle chain)."""
    hashes: dict[str, str] = {}
    for job in ordered:
        blob = json.dumps({"kind": job.kind, "options": job.options,
                           "deps": sorted(hashes[d] for d in job.deps)}, sort_keys=True, default=str)
        job.hash = hashes[job.id] = hashlib.sha256(blob.encode()).hexdigest()[:16]


def describe(spec: BatchSpec) -> str:
    """The expanded job graph as text (``landscape batch --dry-run``)."""
    lines = [f"store root: {spec.root}", f"results:    {spec.results}", f"{len(spec.jobs)} job(s):"]
    for job in spec.jobs:
        opts = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in job.options.items())
        lines.append(f"  {job.id}  [{job.kind}]  hash {job.hash}")
        if opts:
            lines.append(f"      options: {opts}")
        if job.produces:
            lines.append(f"      writes runs: {', '.join(job.produces)}")
        if job.deps:
            lines.append(f"      after: {', '.join(job.deps)}")
    return "\n".join(lines)


def to_dot(spec: BatchSpec) -> str:
    """The job graph in Graphviz dot (an edge points from a job to the job that waits for it)."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["digraph batch {", "  rankdir=LR;", "  node [shape=box, fontsize=10];"]
    for job in spec.jobs:
        lines.append(f"  {q(job.id)} [label={q(job.id + chr(10) + job.kind)}];")
    for job in spec.jobs:
        for dep in job.deps:
            style = " [style=dashed]" if dep in job.after else ""
            lines.append(f"  {q(dep)} -> {q(job.id)}{style};")
    lines.append("}")
    return "\n".join(lines) + "\n"
