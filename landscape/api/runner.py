"""Resolve -> compute -> write -> figure for every registered analysis: :func:`run`, the one skeleton behind
the api functions (:func:`api_function`) and the generated commands (docs/ARCHITECTURE.md, "Flows"). The
store-side hooks a spec asks for are named here (:data:`HOOKS`): a spec never names code in ``landscape/api``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from landscape import progress
from landscape.analyze.registry import Analysis, get, load
from landscape.api._common import default_output
from landscape.api.accounting import provenance_attrs
from landscape.api.execution import ExecutionOptions, ProcessPool, map_jobs, using_scheduler
from landscape.api.resolve import Resolver, Target
from landscape.data import recording_subsets
from landscape.errors import UsageError
from landscape.options import build, field_default
from landscape.refs import Ref, slug
from landscape.results import InputRef, check_companions, check_output_path, is_result_file
from landscape.results.paths import changed_options, check_default_output, output_stem
from landscape.runtime import resolve_device


def run(name: str, refs: Sequence[str], *, root: str | Path = "checkpoints", config: Any = None,
        output: str | Path | None = None, figure: bool = True, data_root: str | None = None, download: bool = False,
        data_from: str = "a", workers: int | None = None, scheduler: Any = None, code: Sequence[str] = (),
        accept_changed_code: bool = False, overwrite: bool = False, **options: Any) -> Any:
    """Run analysis ``name`` on references ``refs``; ``options`` are config fields or the spec's run options
    (:data:`RUNNER_OPTIONS` says what the others mean). Returns the result, written and drawn."""
    from landscape import plugins

    with plugins.trusting(code, accept_changed=accept_changed_code):
        spec = get(name)
        run_fields = {f.name for f in dataclasses.fields(spec.run_options)} if spec.run_options else set()
        run_opts = spec.run_options(**{k: options.pop(k) for k in list(options) if k in run_fields}) \
            if spec.run_options else None
        config = build(spec.config, options, base=config)
        execution = ExecutionOptions(1 if workers is None else workers, scheduler)
        execution = execution.on_cluster(spec.has_workers)
        if execution.workers > 1:  # metric objects cannot travel to workers: say so before a pickle hangs
            from landscape.metrics import check_workers

            check_workers(getattr(config, "metrics", None) or (), execution.workers)
        with using_scheduler(execution.scheduler):
            return _run(spec, refs, root, config, run_opts, output, figure, data_root, download, data_from,
                        execution, overwrite)


def _run(spec: Analysis, refs: Sequence[str], root, config: Any, run_opts: Any, output, figure: bool,
         data_root: str | None, download: bool, data_from: str, execution: ExecutionOptions,
         overwrite: bool = False) -> Any:
    workers = execution.workers
    resolver = Resolver(root, data_root=data_root, download=download)
    # parsed once here (a bad reference is a one-line UsageError before anything runs); run globs are not references
    parsed = [str(r) for r in refs] if spec.mode.globs else [Ref.parse(r) for r in refs]
    refs = [str(r) for r in parsed]
    if len(refs) < spec.mode.least or (spec.mode.most is not None and len(refs) > spec.mode.most):
        wanted = f"{spec.mode.least}" if spec.mode.most == spec.mode.least else f"at least {spec.mode.least}"
        raise UsageError(f"{spec.name} takes {wanted} reference(s), got {len(refs)}")
    out = Path(output) if output is not None else default_output(_stem(spec, refs, config, run_opts, data_from))
    if overwrite and getattr(run_opts, "resume", False):  # replace: computed again, not resumed
        run_opts = dataclasses.replace(run_opts, restart=True)
    if output is None and not (getattr(run_opts, "resume", False) and is_result_file(out)):
        check_default_output(out, overwrite=overwrite)  # a resumable partial file is the hook's to check
    check_output_path(out)  # fail before computing: never replace a checkpoint, a user's CSV, figure or pair file
    check_companions(out, csv=spec.csv, figures=figure and spec.figure is not None, pairs=spec.detail is not None)
    attrs: dict[str, Any] = {}
    title = refs[0] if refs else ""
    draws: list[dict] = []  # the example subsets drawn (landscape.data.sample_subset), here and in the workers
    if spec.inputs == "checkpoint":
        with recording_subsets() as draws:
            if "execute" in spec.hooks:
                result, inputs, attrs = hook(spec, "execute")(resolver, parsed[0], config, run_opts, execution, out)
            else:
                point = resolver.point(parsed[0], masks=True, purpose=spec.purpose)
                with progress.task(spec.name, total=1, unit="checkpoints") as task:
                    result = spec.compute(point, config)
                    task.update(1)
                inputs = [point.input_ref()]
    elif spec.inputs == "pair":
        ref_a, ref_b = refs
        a, b, choice = resolver.pair(*parsed, data_from=data_from)
        with recording_subsets() as draws, progress.task(spec.name, total=1, unit="pairs") as task:
            result = spec.compute(a, b, config)
            task.update(1)
        inputs = [a.input_ref(), b.input_ref()]
        attrs = choice.attrs()
        title = f"A = {ref_a}   B = {ref_b}"
    elif spec.inputs == "pairs":
        result, inputs, draws = _pairs(spec, resolver, refs, config, run_opts, data_from, workers, out)
        title = ""
    elif spec.inputs == "target":
        (ref,) = parsed
        targets, extra = hook(spec, "expand")(resolver, ref, config) if "expand" in spec.hooks \
            else (resolver.expand(ref), [])
        jobs = [("compute", spec.name, resolver, t, config) for t in targets]
        rows = _recorded(_map(_point_job, jobs, workers, what=spec.name, unit="checkpoints"), draws)
        result = spec.collect(rows, config, run_opts)
        inputs = extra + _inputs(targets)
    else:  # targets
        groups = [resolver.expand(r) for r in parsed]
        flat = [t for g in groups for t in g]
        with ProcessPool(min(workers, len(flat))) as pool:
            shared = None
            if spec.prepare is not None:
                jobs = [("prepare", spec.name, resolver, t, config) for t in flat]
                first = f"{spec.name} (first pass)"
                values = _map(_point_job, jobs, pool=pool, what=first, unit="checkpoints")
                shared = spec.share(_recorded(values, draws), config)
            jobs = [("compute", spec.name, resolver, t, config, shared) for t in flat]
            outcomes = _map(_point_job, jobs, pool=pool, what=spec.name, unit="checkpoints")
            rows = iter(_recorded(outcomes, draws))
        result = spec.collect([[next(rows) for _ in g] for g in groups], config, run_opts, refs, shared)
        inputs = _inputs(flat)
        title = ""
    if isinstance(getattr(config, "device", None), str):  # the device actually used ("auto" resolved)
        attrs = {**attrs, "device": str(resolve_device(config.device))}
    attrs = {**attrs, **subsets_attr(draws)}
    result.to_hdf5(out, inputs=inputs, attrs={**attrs, **_code_attrs(), **provenance_attrs(inputs)})
    if spec.csv:
        result.to_csv(out.with_suffix(".csv"))
    if figure and spec.figure is not None:
        draw = spec.figure
        result.figures = draw(result, out, title, run_opts) if spec.run_options else draw(result, out, title)
    return result


def _code_attrs() -> dict[str, Any]:
    """The attr ``code``: the user code trusted for this result and whether changed code was accepted."""
    from landscape import plugins

    state = plugins.trust_state()
    if not state.refs:
        return {}
    described = [plugins.describe(ref) for ref in state.refs]
    return {"code": json.dumps({"refs": described, "accept_changed": state.accept_changed}, sort_keys=True)}


def subsets_attr(draws: Sequence[dict]) -> dict[str, str]:
    """The result attr ``subsets``: the distinct example subsets an analysis drew, as JSON."""
    unique = [dict(t) for t in dict.fromkeys(tuple(sorted(d.items())) for d in draws)]
    return {"subsets": json.dumps(unique, sort_keys=True)} if unique else {}


def _recorded(outcomes: list[tuple[Any, list[dict]]], draws: list[dict]) -> list:
    """The values of jobs that return ``(value, subsets drawn)``; their draws are added to ``draws``."""
    for _, drawn in outcomes:
        draws.extend(drawn)
    return [value for value, _ in outcomes]


def _stem(spec: Analysis, refs: list[str], config: Any, run_opts: Any, data_from: str = "a") -> str:
    """The default output name: ``<output>-<A>--<B>...`` (or the spec's ``stem``), then the changed
    options."""
    if spec.stem is not None:
        base = spec.stem(refs, config, run_opts)
    else:
        parts = [slug(r) if spec.mode.globs else _name_part(Ref.parse(r)) for r in refs]
        base = "-".join([spec.output, *(["--".join(parts)] if parts else [])])
    extra = {"data_from": data_from} if data_from != "a" else {}
    return output_stem(base, changed_options(config, run_opts, extra=extra))


def _name_part(ref: Ref) -> str:
    """A reference in a default name: the run with its selector (``sgd_last``), a file by its path
    (``dir_a``)."""
    return slug(ref.label) if ref.file is not None else ref.slug


def _inputs(targets: Sequence[Target]) -> list[InputRef]:
    return [InputRef.of(t.ref, t.path) for t in targets]


# ------------------------------------------------------------------------------------------ api hooks

#: The store-side hooks of the analyses (``Analysis.hooks``): (analysis, hook) -> the api function that does it.
HOOKS = {
    ("directions", "execute"): "landscape.api.loss_surfaces:run_directions",
    ("surface", "execute"): "landscape.api.loss_surfaces:run_surface",
    ("clipping", "expand"): "landscape.api.pruning:expand_prune_levels",
}


def hook(spec: Analysis, kind: str) -> Callable:
    """The ``kind`` hook of ``spec``; a spec asking for one that :data:`HOOKS` lacks is a programming
    error."""
    if (spec.name, kind) not in HOOKS:
        raise LookupError(f"analysis {spec.name!r} asks for an api {kind!r} hook, but landscape.api.runner.HOOKS "
                          "names none")
    return load(HOOKS[(spec.name, kind)])


# -------------------------------------------------------------------------------- jobs (in workers)


def _map(fn: Callable, jobs: list[tuple], workers: int = 1, *, pool: ProcessPool | None = None, what: str,
         unit: str) -> list:
    """``map_jobs`` (or ``pool.map``) of jobs returning ``(value, warnings)``: the warnings re-raised here."""
    out = []
    shown = {"what": what, "unit": unit}
    for value, messages in (pool.map(fn, jobs, **shown) if pool is not None else map_jobs(fn, jobs, workers, **shown)):
        for category, message in messages:
            warnings.warn(message, category, stacklevel=3)
        out.append(value)
    return out


_LIBRARY_NOISE = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def _caught(fn: Callable, *args) -> tuple[Any, list]:
    """``fn(*args)`` and the warnings it raised, but not other libraries' notices about themselves."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn(*args)
    ours = [w for w in caught if not (issubclass(w.category, _LIBRARY_NOISE) and f"{os.sep}landscape{os.sep}"
                                      not in str(w.filename))]
    return value, [(w.category, str(w.message)) for w in ours]


def _point_job(step: str, name: str, resolver: Resolver, target: Target, config: Any, *shared: Any):
    """``spec.compute`` (or ``spec.prepare``) at one checkpoint, with the example subsets it drew."""
    def job():
        spec = get(name)
        with recording_subsets() as draws:
            point = resolver.point(target, masks=True, purpose=spec.purpose, needs=spec.needs)
            value = getattr(spec, step)(point, config, *shared)
        return value, draws

    return _caught(job)


def _pair_job(name: str, resolver: Resolver, ref_a: str, ref_b: str, labels: dict, config: Any, data_from: str,
              out: str):
    def job():
        spec = get(name)
        a, b, choice = resolver.pair(ref_a, ref_b, data_from=data_from)
        refs = [a.input_ref(), b.input_ref()]
        kept, draws = _current_pair_file(spec.detail, out, refs, config, choice.attrs())
        if kept is not None:
            row, _ = spec.compute(a, b, config, labels, result=kept)
        else:
            with recording_subsets() as draws:
                row, detail = spec.compute(a, b, config, labels)
            detail.to_hdf5(out, inputs=refs, attrs={**choice.attrs(), **provenance_attrs(refs), **subsets_attr(draws)})
        row.result = out
        return row, refs, draws

    return _caught(job)


def _current_pair_file(detail: type, out: str, refs: list[InputRef], config: Any, data_attrs: dict[str, Any]
                       ) -> tuple[Any, list[dict]]:
    """The pair's ``detail`` result read back from ``out``, with the subsets it recorded, when it was made
    from the same checkpoint files, options, data and code version (user metrics' too); else ``(None,
    [])``."""
    from landscape.results import read_result
    from landscape.runtime import code_version

    if not Path(out).is_file():
        return None, []
    try:
        head = read_result(out, load_arrays=False)
        if ([i.sha256 for i in head.inputs] != [r.sha256 for r in refs]
                or head.attrs.get("landscape_version") != code_version()
                or any(head.attrs.get(k) != v for k, v in data_attrs.items())):
            return None, []
        kept = detail.from_hdf5(out)
        draws = json.loads(head.attrs.get("subsets") or "[]")
    except Exception:  # unreadable: recomputed (and never overwritten unless it is a landscape result)
        return None, []
    from landscape.metrics import same_code

    if kept.config == config and same_code(getattr(kept, "metric_sources", [])):  # user metrics' code too
        return kept, draws
    return None, []


def _pairs(spec: Analysis, resolver: Resolver, patterns: list[str], config: Any, run_opts: Any, data_from: str,
           workers: int, out: Path) -> tuple[Any, list[InputRef], list[dict]]:
    jobs = resolver.pair_jobs(patterns, run_opts.pairs)
    pair_dir = getattr(run_opts, spec.mode.detail_dir)
    pair_dir = Path(pair_dir) if pair_dir else out.with_name(out.stem + "-pairs")
    tasks = [(spec.name, resolver, a, b, labels, config, data_from, str(pair_dir / f"{slug(a)}--{slug(b)}.h5"))
             for a, b, labels in jobs]
    outcomes = _map(_pair_job, tasks, workers, what=spec.name, unit="pairs")
    inputs = list({ref.sha256 + ref.path: ref for _, refs, _ in outcomes for ref in refs}.values())
    draws = [d for _, _, drawn in outcomes for d in drawn]
    return spec.collect([row for row, _, _ in outcomes], config, run_opts), inputs, draws


# --------------------------------------------------------------------------------- public functions


#: The keyword-only runner options of every api function: name -> (annotation, default, help).
RUNNER_OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "root": (str | Path, "checkpoints", "Checkpoint store root."),
    "output": (str | Path | None, None, "Result HDF5 file to write (default results/<name>-<A>[--<B>...][-<options>]"
                                        ".h5, never replacing a result there unless overwrite)."),
    "figure": (bool, True, "Draw the figure(s) beside the result file."),
    "data_root": (str | None, None, "Where torchvision data sets live (default $LANDSCAPE_DATA)."),
    "download": (bool, False, "Download a torchvision data set into data_root if absent."),
    "data_from": (str, "a", "When A and B were trained on different data: evaluate on A's ('a') or B's ('b')."),
    "workers": (int, 1, "Parallel worker processes (spawned, one torch thread each)."),
    "scheduler": (Any, None, "A Dask scheduler address (tcp://HOST:PORT) or distributed.Client: run the parallel "
                             "parts there instead of local worker processes."),
    "code": (Sequence[str], (), "Model / data code (module:factory, file.py:factory) the checkpoints were built "
                                "with, trusted to rebuild them."),
    "accept_changed_code": (bool, False, "Accept code whose source sha256 changed since it was recorded."),
    "overwrite": (bool, False, "Replace a result already under the default output name (without it: refused)."),
}


def _references(spec: Analysis) -> list[tuple[str, Any, str]]:
    """``(name, annotation, help)`` of the api function's leading parameters: the input mode's arguments."""
    many = spec.mode.most != 1 and len(spec.mode.arguments) == 1
    return [(name, Sequence[str] if many else str | Path, text) for name, text in spec.mode.arguments]


def _runner_names(spec: Analysis) -> list[str]:
    names = ["root", "output", "figure", "data_root", "download"]
    if spec.mode.paired:
        names.append("data_from")
    if spec.has_workers:
        names += ["workers", "scheduler"]
    return names + ["code", "accept_changed_code", "overwrite"]


def api_signature(spec: Analysis) -> inspect.Signature:
    """The api function's signature: the references, ``config``, then every option as a typed keyword."""
    from landscape.options import hints

    P = inspect.Parameter
    params = [P(n, P.POSITIONAL_OR_KEYWORD, annotation=t, default=() if spec.mode.least == 0 else P.empty)
              for n, t, _ in _references(spec)]
    params.append(P("config", P.POSITIONAL_OR_KEYWORD, default=None, annotation=spec.config | None))
    for cls in (spec.config, spec.run_options):
        if cls is None:
            continue
        types_ = hints(cls)
        params += [P(f.name, P.KEYWORD_ONLY, default=field_default(f, P.empty), annotation=types_.get(f.name, f.type))
                   for f in dataclasses.fields(cls)]
    params += [P(n, P.KEYWORD_ONLY, default=RUNNER_OPTIONS[n][1], annotation=RUNNER_OPTIONS[n][0])
               for n in _runner_names(spec)]
    return inspect.Signature(params, return_annotation=spec.result)


def api_doc(spec: Analysis) -> str:
    """The api function's docstring (Google style, as the docs site reads it): every parameter and the
    return."""
    import textwrap

    from landscape.options import describe, type_name

    def arg(name: str, type_text: str, text: str) -> list[str]:
        return textwrap.wrap(f"{name} ({type_text}): {text}", 110, initial_indent="    ", subsequent_indent="        ")

    lines = [inspect.cleandoc(spec.doc or spec.compute.__doc__ or spec.name), "",
             f"Keyword options replace the fields of ``config`` (default ``{spec.config.__name__}()``); a value may "
             "be given as on the command line (``split=\"train,test\"``) or as a Python value.", "", "Args:"]
    for name, annotation, text in _references(spec):
        lines += arg(name, type_name(annotation), text)
    lines += arg("config", f"{spec.config.__name__} | None", "All options at once (keywords replace its fields).")
    for cls in (spec.config, spec.run_options):
        for name, type_text, default, text in describe(cls) if cls is not None else ():
            lines += arg(name, type_text, f"{text or 'Api only.'} Default: {default}.")
    for name in _runner_names(spec):
        annotation, default, text = RUNNER_OPTIONS[name]
        lines += arg(name, type_name(annotation), f"{text} Default: {default!r}.")
    lines += ["", "Returns:", f"    {spec.result.__name__}: the result, with ``.path`` (the HDF5 file) and ``.figures``."]
    return "\n".join(lines) + "\n"


def api_function(name: str) -> Callable:
    """The public ``landscape.api`` function of analysis ``name``, with a real signature and docstring; only
    the keywords a call gives replace fields of ``config`` (coerced as on the command line)."""
    spec = get(name)
    signature = api_signature(spec)
    ref_names = [n for n, _, _ in _references(spec)]

    def function(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise UsageError(f"{function.__name__}(): {exc}") from None
        values = dict(bound.arguments)  # only what the call gave: the config's own fields stay otherwise
        if len(ref_names) == 2:
            ref_values = [values.pop("ref_a"), values.pop("ref_b")]
        else:
            value = values.pop(ref_names[0], ())
            ref_values = [value] if isinstance(value, (str, Path)) else list(value)
        return run(name, ref_values, **values)

    function.__name__ = function.__qualname__ = name.replace("-", "_")
    function.__module__ = "landscape.api"
    function.__signature__ = signature
    function.__doc__ = api_doc(spec)
    return function
