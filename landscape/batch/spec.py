"""Batch specs: YAML in, a validated and expanded job graph out (nothing runs here; the schema and the safety
checks: docs/batch.md)."""

from __future__ import annotations

import itertools
import math
import re
import string
from pathlib import Path
from typing import Any

from landscape import kinds
from landscape.batch.checks import (
    _check_options,
    _check_paths,
    _check_references,
    _check_run_names,
    _check_unique,
)
from landscape.batch.graph import BatchSpec, Job, _hash_jobs, _link, _topological
from landscape.batch.loading import TOP_KEYS, SpecError, _Map, load_yaml

JOB_KEYS = ("kind", "grid", "name", "after")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$")
MAX_JOBS = 10_000  # jobs after grid expansion, counted before any is built
MAX_JOB_NAME = 200  # characters of an expanded job name (a directory and RESULTS/.batch/NAME.json)


def load_spec(path: str | Path, *, root: str | Path | None = None) -> BatchSpec:
    """Read, expand and validate a batch spec; a :class:`SpecError` names the file, line and key at fault.
    ``root``: the store root when the spec gives none. Paths come back absolute (a cluster's workers share them)."""
    path = Path(path)
    data = load_yaml(path)
    where = _where(path)
    for key in data:
        if key not in TOP_KEYS:
            raise SpecError(f"{where(data, key)}: unknown top-level key '{key}'; known: {', '.join(TOP_KEYS)}")
    spec_root = data.get("root", root if root is not None else "checkpoints")
    results = data.get("results", f"results/{path.stem}")
    for key, value in (("root", spec_root), ("results", results)):
        if not isinstance(value, (str, Path)) or not str(value):
            raise SpecError(f"{where(data, key)}: '{key}' must be a path, got {value!r}")
    known_kinds = kinds.names()
    defaults = data.get("defaults") or _Map()
    if not isinstance(defaults, dict):
        raise SpecError(f"{where(data, 'defaults')}: 'defaults' maps job kinds to options")
    for kind, opts in defaults.items():
        if kind not in known_kinds:
            raise SpecError(f"{where(defaults, kind)}: defaults for unknown job kind '{kind}'; "
                            f"known: {', '.join(known_kinds)}")
        if not isinstance(opts, dict):
            raise SpecError(f"{where(defaults, kind)}: defaults.{kind} must be a mapping of options")
    jobs_data = data.get("jobs")
    if not isinstance(jobs_data, dict) or not jobs_data:
        raise SpecError(f"{where(data, 'jobs') if 'jobs' in data else f'{path}:1'}: the spec needs a non-empty "
                        f"'jobs' mapping")
    jobs: list[Job] = []
    afters: dict[str, tuple[Any, int]] = {}
    for key, body in jobs_data.items():
        expanded, after = _expand(key, body, jobs_data, defaults, known_kinds, where)
        jobs.extend(expanded)
        if len(jobs) > MAX_JOBS:
            raise SpecError(f"{where(jobs_data, key)}: the spec expands to more than {MAX_JOBS:,} jobs (up to "
                            f"jobs.{key}); split it into several batches")
        for job in expanded:
            afters[job.id] = after[job.id]
    _check_unique(jobs, path)
    _link(jobs, afters, path)
    ordered = _topological(jobs, path)
    spec = BatchSpec(path=path, root=Path(spec_root).absolute(), results=Path(results).absolute(), jobs=ordered)
    _check_paths(spec)
    _check_references(spec)
    _hash_jobs(ordered)
    return spec


def _where(path: Path):
    def where(mapping: Any, key: str | None = None) -> str:
        line = getattr(mapping, "lines", {}).get(key) if key is not None else None
        return f"{path}:{line or getattr(mapping, 'line', 1)}"

    return where


def _expand(key: str, body: Any, parent: Any, defaults: Any, known_kinds: list[str], where) -> tuple[list[Job], dict]:
    at = where(parent, key)
    if not isinstance(key, str) or not _NAME.match(key):
        raise SpecError(f"{at}: job name {key!r}: use letters, digits and - _ . = (starting with a letter or digit)")
    if not isinstance(body, dict):
        raise SpecError(f"{at}: job '{key}' must be a mapping with 'kind' and options")
    kind = body.get("kind")
    if kind is None:
        raise SpecError(f"{at}: job '{key}' has no 'kind'; known kinds: {', '.join(known_kinds)}")
    if kind not in known_kinds:
        raise SpecError(f"{where(body, 'kind')}: jobs.{key}.kind: unknown job kind {kind!r}; "
                        f"known: {', '.join(known_kinds)}")
    info = kinds.get(kind)
    options = info.option_types()
    grid = body.get("grid") or {}
    if not isinstance(grid, dict):
        raise SpecError(f"{where(body, 'grid')}: jobs.{key}.grid must map variables to lists of values")
    for var, values in grid.items():
        gat = f"{where(grid, var)}: jobs.{key}.grid.{var}"
        if not _NAME.match(var) or not var.isidentifier():
            raise SpecError(f"{gat}: a grid variable must be an identifier")
        if not isinstance(values, list) or not values:
            raise SpecError(f"{gat}: must be a non-empty list of values, got {values!r}")
        for v in values:
            if v is None or isinstance(v, (dict, list)):
                raise SpecError(f"{gat}: bad grid value {v!r} (a number, string or boolean)")
            if isinstance(v, float) and v != v:
                raise SpecError(f"{gat}: bad grid value {v!r}")
        if len(set(map(repr, values))) != len(values):
            raise SpecError(f"{gat}: repeats a value ({values!r})")
    size = math.prod(len(v) for v in grid.values())
    if size > MAX_JOBS:
        raise SpecError(f"{where(body, 'grid')}: jobs.{key}.grid expands to {size:,} jobs "
                        f"({' x '.join(str(len(v)) for v in grid.values())}); a batch holds at most {MAX_JOBS:,}")
    name_template = body.get("name")
    if name_template is not None and not isinstance(name_template, str):
        raise SpecError(f"{where(body, 'name')}: jobs.{key}.name must be a string template")
    raw_options: dict[str, tuple[Any, str]] = {}
    for opt_key, value in (defaults.get(kind) or {}).items():
        raw_options[_norm(opt_key)] = (value, f"{where(defaults[kind], opt_key)}: defaults.{kind}.{opt_key}")
    for opt_key, value in body.items():
        if opt_key in JOB_KEYS:
            continue
        raw_options[_norm(opt_key)] = (value, f"{where(body, opt_key)}: jobs.{key}.{opt_key}")
    for opt, (_value, oat) in raw_options.items():
        if opt == "workers" and opt not in options:
            raise SpecError(f"{oat}: option 'workers' does not apply in a batch: jobs run in parallel on the batch's "
                            f"workers (`landscape batch --workers N`), each analysis in one process")
        if opt not in options:
            raise SpecError(f"{oat}: unknown option '{opt}' for job kind '{kind}'; known: "
                            f"{', '.join(sorted(options))}")
    after_raw = body.get("after") or []
    if isinstance(after_raw, str):
        after_raw = [after_raw]
    if not isinstance(after_raw, list) or not all(isinstance(a, str) for a in after_raw):
        raise SpecError(f"{where(body, 'after')}: jobs.{key}.after must be a list of job names")
    variables = list(grid)
    jobs, afters = [], {}
    for combo in itertools.product(*(grid[v] for v in variables)):
        env = dict(zip(variables, combo, strict=True))
        opts: dict[str, Any] = {opt: _fill(value, env, oat) for opt, (value, oat) in raw_options.items()}
        for var, value in env.items():
            if _norm(var) in options and _norm(var) not in raw_options:
                opts[_norm(var)] = value
        if name_template is not None:
            job_id = _fill(name_template, env, f"{where(body, 'name')}: jobs.{key}.name")
        else:
            job_id = "-".join([key, *(f"{v}{_slug(env[v])}" for v in variables)])
        if not isinstance(job_id, str) or not _NAME.match(job_id):
            raise SpecError(f"{at}: job '{key}' expands to the bad job name {job_id!r}")
        if len(job_id) > MAX_JOB_NAME:  # it names the job's results directory and record file
            raise SpecError(f"{at}: job '{key}' expands to a job name of {len(job_id)} characters ({job_id[:40]}...); "
                            f"at most {MAX_JOB_NAME}")
        label = f"jobs.{key}" + (f" ({', '.join(f'{v}={env[v]}' for v in variables)})" if variables else "")
        opts = _check_options(kind, info, options, opts, raw_options, grid, env, where, body, key, label, at)
        after = [_fill(a, env, f"{where(body, 'after')}: jobs.{key}.after") for a in after_raw]
        produces = _check_run_names(tuple(info.produces(opts)), raw_options, grid, env, where, key, label, at)
        job = Job(id=job_id, key=key, kind=kind, line=int(parent.lines.get(key, body.line)), options=opts, variables=env,
                  produces=produces)
        jobs.append(job)
        afters[job_id] = (after, where(body, "after"))
    return jobs, afters


def _norm(name: str) -> str:
    return str(name).replace("-", "_")


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", str(value))


def _fill(value: Any, env: dict[str, Any], at: str) -> Any:
    """Fill ``{var}`` templates in strings (recursively in lists and mappings); ``"{var}"`` alone keeps the type."""
    if isinstance(value, str):
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
        unknown = [f for f in fields if f not in env]
        if unknown:
            raise SpecError(f"{at}: unknown template variable {{{unknown[0]}}}; the grid defines "
                            f"{', '.join(env) or 'no variables'} (write {{{{ and }}}} for literal braces)")
        if re.fullmatch(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", value):
            return env[value[1:-1]]
        if not fields:
            return value.replace("{{", "{").replace("}}", "}")
        try:
            return value.format(**env)
        except (ValueError, IndexError, KeyError) as exc:
            raise SpecError(f"{at}: bad template {value!r} ({exc})") from None
    if isinstance(value, list):
        return [_fill(v, env, at) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, env, at) for k, v in value.items()}
    return value
