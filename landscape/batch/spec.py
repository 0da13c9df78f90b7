"""Batch specs: YAML in, a validated and expanded job graph out (nothing runs here).

Schema (every key is checked; an unknown one is an error naming its line)::

    root: checkpoints            # store root (default: the command's --root); workers must see the same path
    results: results/fig5        # where analysis results, job records and the summary go (default results/<spec>)
    defaults:                    # options merged into every job of a kind (a job's own options win)
      train: {data: digits, subset: 0.1, epochs: 2}
      instability: {figure: false}
    jobs:
      NAME:                      # a job key: letters, digits, - _ .
        kind: phases             # train, phases, prune or any registered analysis (interpolate, ...)
        grid:                    # optional: one job per combination of values (a cartesian product)
          epsilon: [1, 5, 50]
          seed: [0, 1, 2]
        name: "p-eps{epsilon}-s{seed}"   # optional: the expanded job names (default NAME-epsilon1-seed0)
        after: [other-job]       # optional: explicit dependencies (job keys or expanded names)
        group: "fig5-eps{epsilon}-s{seed}"   # every other key is an option of the kind
        target_epsilon: "{epsilon}"          # a value that is exactly "{var}" keeps the grid value's type

Options are the fields of the kind's configuration (``TrainConfig``; ``PhasesConfig`` plus the training
options of its base; ``PruneConfig``; an analysis' config dataclass and run options, plus ``refs`` (its
references: ``[A, B]`` for a pair, ``[RUN]`` for a target, run globs for instability), ``figure``,
``data_root``, ``download``, ``data_from``). ``kebab-case`` names are accepted as well as ``snake_case``. A
grid variable named like an option of the job also sets that option (unless the job sets it itself).

Dependencies: a job that reads a run another job produces (``train``'s ``run``, ``prune``'s ``run``,
``phases``' ``GROUP-P1`` and ``GROUP-P1-P2-I`` runs) waits for it: any option value that names such a run,
as ``RUN``, ``RUN@selector``, inside ``A:B`` / ``B,C`` / ``pca:RUN`` lists, or through a glob (``G-*``),
makes the edge. ``after:`` adds edges the references cannot show. ``train`` and ``prune`` jobs must name
their ``run`` and ``phases`` jobs their ``group``, so that the graph is known before anything runs.

Safety, checked before anything runs: every run a job reads is in the store or written by a job of the spec,
and no reference is a path; every path a job writes (``pair_dir``; ``data_root`` with ``download: true``)
resolves, symbolic links followed, inside the results directory or the store root; ``subset`` is a count or a
fraction by the command line's rule (:func:`landscape.bounds.subset_value`); grids are counted before they are
built (``MAX_JOBS``), and the text must be UTF-8, nest at most ``MAX_DEPTH`` levels and expand (YAML aliases
and merge keys included) to at most ``MAX_NODES`` values.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import itertools
import json
import math
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from landscape.bounds import subset_value
from landscape.errors import UsageError

TOP_KEYS = ("root", "results", "defaults", "jobs")
JOB_KEYS = ("kind", "grid", "name", "after")
TRAINING_KINDS = ("train", "phases", "prune")
STORE_KINDS = ("align", "figures")  # hand-written commands besides training: permutation alignment, paper figures
# runner.run keyword arguments every analysis takes (besides its config fields and run options)
_RUNNER_OPTIONS = {"figure": "bool", "data_root": "str | None", "download": "bool"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$")
MAX_JOBS = 10_000  # jobs after grid expansion, counted before any is built
MAX_NODES = 1_000_000  # values in the spec with its YAML aliases expanded
MAX_DEPTH = 50  # nesting of mappings and lists
MAX_JOB_NAME = 200  # characters of an expanded job name (a directory and RESULTS/.batch/NAME.json)
# options whose values name checkpoints or runs (split like references: A:B, B,C, pca:RUN, RUN@selector, globs)
REF_OPTIONS = ("refs", "ref", "ref_a", "ref_b", "from_ref", "toward", "plane", "pairs")
_REF_KEYWORDS = {"plane": ("random", "pca"), "pairs": ("siblings", "all")}


class SpecError(UsageError):
    """An invalid batch spec: the message starts with ``FILE:LINE:`` and names the key at fault."""


# ------------------------------------------------------------------------------------- YAML with lines


class _Map(dict):
    """A YAML mapping that remembers the line (1-based) of itself and of each key."""

    line: int = 0
    lines: dict


class _LineLoader(yaml.SafeLoader):
    """The safe loader, with nesting bounded (a 100k-deep spec is one line, not a RecursionError)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise SpecError(f"{self.name}:{mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def flatten_mapping(self, node):
        """YAML merge keys (``<<: [*a, *a]``) copy the merged mappings' entries: counted first (each mapping once),
        so merges of merges cannot expand to billions of entries before anything notices."""
        if _merged_size(node, {}) > MAX_NODES:
            raise SpecError(f"{self.name}:{node.start_mark.line + 1}: merge keys (<<) expand this mapping to more "
                            f"than {MAX_NODES} entries")
        super().flatten_mapping(node)


def _merged_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many entries mapping ``node`` has once its merge keys are flattened (memoised per node)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 0  # a merge cycle counts as nothing (PyYAML refuses it)
    total = 0
    for key, value in node.value if isinstance(node, yaml.MappingNode) else ():
        if key.tag != "tag:yaml.org,2002:merge":
            total += 1
        elif isinstance(value, yaml.MappingNode):
            total += _merged_size(value, memo)
        elif isinstance(value, yaml.SequenceNode):
            total += sum(_merged_size(v, memo) for v in value.value)
        if total > MAX_NODES:
            break
    memo[id(node)] = total
    return total


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise SpecError(f"{loader.name}:{key_node.start_mark.line + 1}: keys must be strings, got {key!r}")
        if key in out:
            raise SpecError(f"{loader.name}:{key_node.start_mark.line + 1}: key '{key}' appears twice")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | Path) -> _Map:
    """The spec file as nested mappings that know their lines; a YAML error is one SpecError line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read batch spec {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise SpecError(f"{path}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") \
            from None
    loader = _LineLoader(text)
    loader.name = str(path)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise SpecError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    finally:
        loader.dispose()
    if not isinstance(data, _Map):
        raise SpecError(f"{path}:1: a batch spec is a mapping with 'jobs' (and optionally {', '.join(TOP_KEYS[:3])})")
    _check_size(data, path)
    return data


def _check_size(data: Any, path: Path) -> None:
    """Refuse a spec whose values, with YAML aliases expanded, hold more than MAX_NODES items (an alias bomb:
    a few lines of ``&a [*b, *b, ...]`` that expand to billions). Stops counting at the limit."""
    count, stack = 0, [data]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise SpecError(f"{path}:1: the spec expands to more than {MAX_NODES} values (YAML aliases repeating "
                            f"aliases?); write it out or split it")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


# ------------------------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class KindInfo:
    """What a job kind accepts: option name -> type annotation (a string, as the dataclasses declare it)."""

    name: str
    options: dict[str, str]
    required: tuple[str, ...] = ()


def _fields(cls: type, skip: Iterable[str] = ()) -> dict[str, str]:
    from landscape.options import renames

    skip = set(skip)
    out = {f.name: str(f.type) for f in dataclasses.fields(cls) if f.name not in skip}
    return out | {old: out[new] for old, new in renames(cls).items() if new in out}  # old names, for one release


def kinds() -> list[str]:
    """Every job kind: the training commands and the registered analyses."""
    from landscape.analyze.registry import names

    return [*TRAINING_KINDS, *STORE_KINDS, *names()]


@dataclass(frozen=True)
class FigureJob:
    """A ``figures`` job: one paper-figure recipe at one scale, its outputs in the job's results directory and its
    runs in the batch's store (reused by any later job or rerun with the same configuration)."""

    recipe: str
    scale: str = "cpu"
    rerun: bool = False
    data_root: str | None = None

    def validate(self) -> FigureJob:
        from landscape.figures import registry
        from landscape.figures.recipe import SCALES

        if self.recipe not in registry.names():
            raise UsageError(f"'recipe': unknown recipe {self.recipe!r}; see `landscape figures --list`")
        if self.scale not in SCALES:
            raise UsageError(f"'scale' must be one of {', '.join(SCALES)}, got {self.scale!r}")
        return self


def kind_info(kind: str) -> KindInfo:
    """The options of ``kind`` (a KeyError for an unknown kind)."""
    if kind == "train":
        from landscape.train.config import TrainConfig

        return KindInfo(kind, _fields(TrainConfig, skip=("resume",)), required=("run",))
    if kind == "phases":
        from landscape.train.config import PhasesConfig, TrainConfig

        return KindInfo(kind, {**_fields(TrainConfig, skip=("run", "from_ref", "resume")),
                               **_fields(PhasesConfig, skip=("base",))}, required=("group",))
    if kind == "prune":
        from landscape.api.pruning import PruneConfig

        return KindInfo(kind, _fields(PruneConfig), required=("ref", "remove", "run"))
    if kind == "align":
        from landscape.api.alignment import AlignConfig

        return KindInfo(kind, _fields(AlignConfig), required=("ref_a", "ref_b", "run"))
    if kind == "figures":
        return KindInfo(kind, _fields(FigureJob), required=("recipe",))
    from landscape.analyze.registry import get, names

    if kind not in names():
        raise KeyError(kind)
    spec = get(kind)
    # no per-analysis worker pools inside a batch job: the batch is the parallelism (one job per worker)
    options = {"refs": "str | list[str]", **_RUNNER_OPTIONS, **_fields(spec.config)}
    if spec.inputs in ("pair", "pairs"):
        options["data_from"] = "str"
    if spec.run_options is not None:
        options.update(_fields(spec.run_options))
    required = () if spec.inputs == "pairs" else ("refs",)
    return KindInfo(kind, options, required=required)


# ------------------------------------------------------------------------------------------- jobs


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

    def dependants(self, job_id: str) -> list[str]:
        return [j.id for j in self.jobs if job_id in j.deps]


def load_spec(path: str | Path, *, root: str | Path | None = None) -> BatchSpec:
    """Read, expand and validate a batch spec; a :class:`SpecError` names the file, line and key at fault.

    ``root`` is the store root when the spec gives none. Paths in the spec are relative to the working
    directory; both come back absolute (the workers of a cluster need the same paths: a shared filesystem).
    """
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
    known_kinds = kinds()
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
    info = kind_info(kind)
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
        if opt == "workers" and kind not in TRAINING_KINDS:
            raise SpecError(f"{oat}: option 'workers' does not apply in a batch: jobs run in parallel on the batch's "
                            f"workers (landscape batch --workers N), each analysis in one process")
        if opt not in info.options:
            raise SpecError(f"{oat}: unknown option '{opt}' for job kind '{kind}'; known: "
                            f"{', '.join(sorted(info.options))}")
    after_raw = body.get("after") or []
    if isinstance(after_raw, str):
        after_raw = [after_raw]
    if not isinstance(after_raw, list) or not all(isinstance(a, str) for a in after_raw):
        raise SpecError(f"{where(body, 'after')}: jobs.{key}.after must be a list of job names")
    variables = list(grid)
    jobs, afters = [], {}
    for combo in itertools.product(*(grid[v] for v in variables)):
        env = dict(zip(variables, combo, strict=True))
        opts: dict[str, Any] = {}
        for opt, (value, oat) in raw_options.items():
            opts[opt] = _fill(value, env, oat)
        for var, value in env.items():
            if _norm(var) in info.options and _norm(var) not in raw_options:
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
        opts = _check_options(kind, info, opts, raw_options, grid, env, where, body, key, label, at)
        after = [_fill(a, env, f"{where(body, 'after')}: jobs.{key}.after") for a in after_raw]
        job = Job(id=job_id, key=key, kind=kind, line=int(parent.lines.get(key, body.line)), options=opts, variables=env,
                  produces=tuple(_produces(kind, opts)))
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


def _check_type(value: Any, annotation: Any, opt: str) -> Any:
    """``value`` as the annotation wants it: the one coercion of the command line and the api
    (:func:`landscape.options.coerce`: ``[0.1, 0.5]`` or ``"0.1,0.5"`` for a tuple, ``"3"`` for an int, ...)."""
    from landscape.options import coerce

    return coerce(value, annotation, flag="--" + opt.replace("_", "-"), name=opt)


_WARNED: set[tuple[int, str]] = set()  # (job mapping, spec place) whose deprecated option name was reported


def _renames(kind: str) -> dict[str, str]:
    """Old option name -> current one for the kind's renamed options (an analysis' config and run options)."""
    from landscape.analyze.registry import get, names
    from landscape.options import renames

    if kind not in names():
        return {}
    spec = get(kind)
    return {old: new for cls in (spec.config, spec.run_options) if cls is not None for old, new in renames(cls).items()}


def _check_options(kind, info, opts, raw_options, grid, env, where, body, key, label, at) -> dict[str, Any]:
    """Old option names renamed (one deprecation line per place in the spec), values coerced by their
    annotations, required options present, then the kind's configuration built and validated once."""
    import warnings

    from landscape.options import OptionDeprecationWarning

    def place(opt: str) -> str:
        return raw_options[opt][1] if opt in raw_options else f"{where(grid, opt)}: jobs.{key}.grid.{opt}"

    table = _renames(kind)
    out = {}
    for opt, value in opts.items():
        new = table.get(opt)
        if new is not None:
            if new in opts:
                raise SpecError(f"{place(opt)}: {label}: '{opt}' and '{new}' are the same option ('{opt}' is its "
                                f"old name); give '{new}' only")
            if (id(body), place(opt)) not in _WARNED:  # once per place of this spec, not per grid point
                _WARNED.add((id(body), place(opt)))
                warnings.warn(f"{place(opt)}: option '{opt}' is deprecated and will be removed in the next release; "
                              f"use '{new}'", OptionDeprecationWarning, stacklevel=2)
        name = new or opt
        try:
            if opt == "subset" and kind in TRAINING_KINDS:  # a count or a fraction (300 is 300 examples)
                out[name] = subset_value(value, "'subset'")
                continue
            out[name] = _check_type(value, info.options[opt], name)
        except UsageError as exc:
            raise SpecError(f"{place(opt)}: {label}: {exc}") from None
    for req in info.required:
        if out.get(req) in (None, "", [], ()):
            raise SpecError(f"{at}: {label}: job kind '{kind}' needs option '{req}' in a batch")
    try:
        _build(kind, out)
    except (UsageError, ValueError, TypeError) as exc:
        blame = _blame(str(exc), raw_options, grid, env, where, key)
        raise SpecError(f"{blame or at}: {label}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") \
            from None
    return out


def _blame(message: str, raw_options, grid, env, where, key) -> str | None:
    """The spec line of the option (or grid variable) an error message names, if any."""
    names = {m.replace("-", "_") for m in re.findall(r"--([a-z0-9-]+)", message)}
    names |= {m for m in re.findall(r"'([a-z_]+)'", message)}
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


def _build(kind: str, options: dict[str, Any]) -> Any:
    """The kind's configuration object (validated) for ``options``: what the executor will run."""
    options = dict(options)
    if kind == "train":
        from landscape.train.config import TrainConfig

        return TrainConfig(**options).validate()
    if kind == "phases":
        from landscape.train.config import PhasesConfig, TrainConfig

        phase_fields = {f.name for f in dataclasses.fields(PhasesConfig)}
        own = {k: options.pop(k) for k in list(options) if k in phase_fields}
        return PhasesConfig(base=TrainConfig(**options), **own).validate()
    if kind == "prune":
        from landscape.api.pruning import PruneConfig

        config = PruneConfig(**options)
        config.validate()
        if not 0 <= float(config.remove) < 1:
            raise UsageError(f"'remove' must be in [0, 1), got {config.remove}")
        return config
    if kind == "align":
        from landscape.api.alignment import AlignConfig

        config = AlignConfig(**options)
        config.validate()
        return config
    if kind == "figures":
        return FigureJob(**options).validate()
    from landscape.analyze.registry import config_with, get

    spec = get(kind)
    refs = options.pop("refs", [])
    refs = [refs] if isinstance(refs, str) else list(refs)
    count = {"checkpoint": 1, "pair": 2, "target": 1}.get(spec.inputs)
    if count is not None and len(refs) != count:
        raise UsageError(f"'refs': {kind} takes {count} reference(s), got {len(refs)}")
    if spec.inputs == "targets" and not refs:
        raise UsageError(f"'refs': {kind} needs at least one reference")
    for name in (*_RUNNER_OPTIONS, "data_from"):
        options.pop(name, None)
    run_fields = {f.name for f in dataclasses.fields(spec.run_options)} if spec.run_options else set()
    run_opts = {k: options.pop(k) for k in list(options) if k in run_fields}
    if spec.run_options is not None:
        spec.run_options(**run_opts)
    return config_with(spec.config, None, options)


def _produces(kind: str, options: dict[str, Any]) -> list[str]:
    """The store runs a job writes (known from its options alone)."""
    if kind in ("train", "prune", "align"):
        return [options["run"]]
    if kind == "phases":
        from landscape.train.config import PhasesConfig

        defaults = {f.name: f.default for f in dataclasses.fields(PhasesConfig) if f.name != "base"}
        group, copies = options["group"], options.get("copies", defaults["copies"])
        phase1 = options.get("phase1", defaults["phase1"])
        phase2 = options.get("phase2", defaults["phase2"])
        out = []
        for p1 in phase1:
            out.append(f"{group}-{p1}")
            out.extend(f"{group}-{p1}-{p2}-{i}" for p2 in phase2 for i in range(copies))
        return out
    return []


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


def _reference_tokens(opt: str, value: Any) -> list[str]:
    """The run names (or globs) a reference option names; keywords (``random``, ``pca``, ``siblings``, ``all``)
    are not runs."""
    keywords = _REF_KEYWORDS.get(opt, ())
    return [t for t in _references(value) if t not in keywords]


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
            for token in _reference_tokens(opt, job.options[opt]):
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


def _references(value: Any) -> Iterable[str]:
    """Every run name a value could name: strings split at , : and blanks, selectors (@...) dropped."""
    if isinstance(value, str):
        for token in _SPLIT.split(value):
            if token:
                yield token.split("@", 1)[0]
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _references(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _references(v)


def _link(jobs: list[Job], afters: dict[str, tuple[list[str], str]], path: Path) -> None:
    producers = {run: job.id for job in jobs for run in job.produces}
    by_key: dict[str, list[str]] = {}
    for job in jobs:
        by_key.setdefault(job.key, []).append(job.id)
    ids = {job.id for job in jobs}
    for job in jobs:
        deps: list[str] = []
        reads = {k: v for k, v in job.options.items() if k not in ("run", "group")}
        for token in _references(list(reads.values())):
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


# ------------------------------------------------------------------------------------------- views


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
