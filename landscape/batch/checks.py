"""Checks of a batch spec's jobs: option values against their kind's annotations, the paths a job writes, the
runs a job reads, and unique job and run names. All run before anything runs."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from landscape import kinds
from landscape.batch.loading import SpecError
from landscape.bounds import subset_value
from landscape.errors import LandscapeError, UsageError, params_in
from landscape.refs import check_run_name, run_part

if TYPE_CHECKING:
    from landscape.batch.graph import BatchSpec, Job

# options whose values name checkpoints or runs (split like references: A:B, B,C, pca:RUN, RUN@selector, globs)
REF_OPTIONS = ("refs", "ref", "ref_a", "ref_b", "from_ref", "toward", "plane", "pairs")
_REF_KEYWORDS = {"plane": ("random", "pca"), "pairs": ("siblings", "all")}


def _check_options(kind, info, types, opts, raw_options, grid, env, where, body, key, label,
                   at) -> dict[str, Any]:
    """Values coerced by their annotations (the command line's one coercion), required options present, then the
    kind's configuration built and validated once."""
    from landscape.options import coerce

    def place(opt: str) -> str:
        return raw_options[opt][1] if opt in raw_options else f"{where(grid, opt)}: jobs.{key}.grid.{opt}"

    out = {}
    for opt, value in opts.items():
        try:
            if opt == "subset" and not kinds.is_analysis(kind):  # a count or a fraction (300 is 300 examples)
                out[opt] = subset_value(value, opt)
                continue
            out[opt] = coerce(value, types[opt], name=opt)
        except UsageError as exc:
            raise SpecError(f"{place(opt)}: {label}: {exc}") from None
    for req in info.required:
        if out.get(req) in (None, "", [], ()):
            raise SpecError(f"{at}: {label}: job kind '{kind}' needs option '{req}' in a batch")
    try:
        info.configure(out)
    except (UsageError, ValueError, TypeError) as exc:
        blame = _blame(exc, raw_options, grid, env, where, key)
        raise SpecError(f"{blame or at}: {label}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") \
            from None
    return out


def _check_run_names(produces: tuple[str, ...], raw_options, grid, env, where, key, label, at) -> tuple[str, ...]:
    """The runs a job writes (its kind's ``produces``: train's, phases', prune's, align's, import's), each a run
    name of the store's one rule (:func:`landscape.refs.check_run_name`): ``run: ../x`` is refused with the
    spec, not when the job runs."""
    for run in produces:
        try:
            check_run_name(run)
        except UsageError as exc:
            blame = _blame("'run' 'group'", raw_options, grid, env, where, key)  # the option naming the run
            raise SpecError(f"{blame or at}: {label}: it would write the run {run!r}; {exc}") from None
    return produces


def _blame(exc: Exception | str, raw_options, grid, env, where, key) -> str | None:
    """The spec line of the option (or grid variable) an error names (:func:`landscape.errors.params_in`, or
    quoted), if any."""
    names = set(params_in(exc.message)) if isinstance(exc, LandscapeError) else set()
    names |= {m for m in re.findall(r"'([a-z_]+)'", str(exc))}
    for name in names:
        if name in raw_options:
            at, value = raw_options[name][1], raw_options[name][0]
            used = [v for v in env if isinstance(value, str) and "{" + v + "}" in value]
            if used:
                return f"{where(grid, used[0])}: jobs.{key}.grid.{used[0]} (via {raw_options[name][1].split(': ')[-1]})"
            return at
        if name in grid:
            return f"{where(grid, name)}: jobs.{key}.grid.{name}"
    return None


def _inside(target: Path, spec: BatchSpec) -> bool:
    """Whether ``target`` (symbolic links followed) lies in the results directory or the store root."""
    real = target.resolve()
    return any(real.is_relative_to(anchor.resolve()) for anchor in (spec.results, spec.root))


def _check_paths(spec: BatchSpec) -> None:
    """Every path a job writes stays in the results directory or the store root (after ``..`` and symbolic
    links): ``pair_dir`` (relative to the results directory) and, with ``download: true``, ``data_root`` (which
    it then writes; a ``data_root`` that is only read may be anywhere, and is relative to the working
    directory)."""
    def refuse(job: Job, opt: str, value: Any, real: Path, why: str) -> SpecError:
        return SpecError(f"{spec.path}:{job.line}: jobs.{job.key} ({job.id}): '{opt}' {value!r} resolves to {real}, "
                         f"outside the results directory {spec.results} and the store root {spec.root}; {why}")

    for job in spec.jobs:
        pair_dir = job.options.get("pair_dir")
        if pair_dir:
            target = spec.results / str(pair_dir)
            if not _inside(target, spec):
                raise refuse(job, "pair_dir", pair_dir, target.resolve(), "a spec writes nowhere else")
        if job.options.get("download"):
            data_root = job.options.get("data_root")
            if not data_root:
                raise SpecError(f"{spec.path}:{job.line}: jobs.{job.key} ({job.id}): 'download: true' needs a "
                                f"'data_root' inside the results directory or the store root (where it downloads)")
            target = Path(str(data_root)).absolute()
            if not _inside(target, spec):
                raise refuse(job, "data_root", data_root, target.resolve(),
                             "a spec downloads only there (without download, data_root is read from anywhere)")


def _check_references(spec: BatchSpec) -> None:
    """Every run a job reads exists in the store or is written by a job of the spec (which then runs first), and
    no reference is a path (``../x.h5``, ``/abs/step-000000.h5``): checked before anything runs."""
    from landscape.store import Store

    existing = set(Store(spec.root).run_names())
    produced = {run for job in spec.jobs for run in job.produces}
    known = existing | produced
    for job in spec.jobs:
        at = f"{spec.path}:{job.line}: jobs.{job.key} ({job.id})"
        for opt in REF_OPTIONS:
            if job.options.get(opt) in (None, "", [], ()):
                continue
            for token in run_tokens(job.options[opt]):
                if token in _REF_KEYWORDS.get(opt, ()):  # random, pca, siblings, all: keywords, not runs
                    continue
                if "/" in token or "\\" in token or token.startswith(".") or token.endswith(".h5"):
                    raise SpecError(f"{at}: '{opt}' names the path {token!r}; a batch reads runs of its store "
                                    f"(RUN, RUN@SELECTOR or a glob such as G-*), not files")
                if any(c in token for c in "*?["):
                    if not any(fnmatch.fnmatchcase(run, token) for run in known):
                        raise SpecError(f"{at}: '{opt}' {token!r} matches no run of the store {spec.root} and no "
                                        f"run a job of the spec writes")
                elif token not in known:
                    raise SpecError(f"{at}: '{opt}' names the run {token!r}, which is not in the store {spec.root} "
                                    f"and no job of the spec writes")


def _check_unique(jobs: list[Job], path: Path) -> None:
    seen: dict[str, Job] = {}
    for job in jobs:
        if job.id in seen:
            other = seen[job.id]
            raise SpecError(f"{path}:{job.line}: duplicate job name '{job.id}' after expansion (jobs.{job.key} and "
                            f"jobs.{other.key} at line {other.line}); give the grid's variables in 'name'")
        seen[job.id] = job
    producers: dict[str, Job] = {}
    for job in jobs:
        for run in job.produces:
            if run in producers:
                other = producers[run]
                raise SpecError(f"{path}:{job.line}: duplicate run name '{run}' after expansion: job '{job.id}' "
                                f"(jobs.{job.key}) and job '{other.id}' (jobs.{other.key}, line {other.line}) "
                                f"both write it; put the grid's variables in the run name")
            producers[run] = job


_SPLIT = re.compile(r"[,:\s]+")


def run_tokens(value: Any) -> Iterable[str]:
    """Every run name (or glob) a value could name: strings split at , : and blanks, selectors dropped."""
    if isinstance(value, str):
        for token in _SPLIT.split(value):
            if token:
                yield run_part(token)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from run_tokens(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from run_tokens(v)
