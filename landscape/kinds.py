"""The job-kind registry: one :func:`register` line per kind (docs/ARCHITECTURE.md, "How to add a job kind");
every registered analysis is a kind too, run with one worker (in a batch the jobs are the parallelism).
Nothing is imported until a kind is asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Any

from landscape.api.jobkind import JobKind, fields_of
from landscape.options import field_default

# name -> ("module:ATTRIBUTE" of its JobKind, one-line summary, name of its landscape.api function)
_LINES: dict[str, tuple[str, str, str]] = {}


def register(name: str, where: str, summary: str, *, api: str | None = None) -> None:
    """Name a job kind: ``where`` is ``"module:ATTRIBUTE"`` of its :class:`JobKind`, imported on first :func:`get`;
    ``api`` the name of its ``landscape.api`` function when that is not the kind's name (``import`` is a keyword)."""
    from landscape.analyze import registry

    if name in _LINES and _LINES[name][0] != where:
        raise ValueError(f"job kind {name!r} is registered twice ({_LINES[name][0]} and {where})")
    if name in registry.names():
        raise ValueError(f"job kind {name!r} is an analysis already (landscape/analyze/__init__.py)")
    _LINES[name] = (where, summary, api or name.replace("-", "_"))


register("train", "landscape.api.training:TRAIN_JOB", "Train SGD / DP-SGD runs into the store (also --from, --resume).")
register("phases", "landscape.api.training:PHASES_JOB",
         "Phase 1 / Phase 2 SGD and DP-SGD branches (Watson et al. Sec. 4.1.1).")
register("prune", "landscape.api.pruning:JOB", "Magnitude-prune a checkpoint into a new run (mask stored with it).")
register("align", "landscape.api.alignment:JOB",
         "Permute B's hidden units to match A (Git Re-Basin weight matching) into a new run.")
register("figures", "landscape.figures.job:JOB",
         "Regenerate paper figures by recipe (train -> analyse -> plot) with a verdict.")
register("import", "landscape.api.store_views:IMPORT_JOB", "Import a foreign .pt/.safetensors checkpoint into the store.",
         api="import_checkpoint")


def names() -> list[str]:
    """Every job kind: the registered ones in registration order, then the analyses (sorted)."""
    from landscape.analyze import registry

    return [*_LINES, *(n for n in registry.names() if n not in _LINES)]


def summary(name: str) -> str:
    """The one-line summary of a kind (nothing is imported)."""
    if name in _LINES:
        return _LINES[name][1]
    from landscape.analyze import registry

    return registry.summary(name)


def is_analysis(name: str) -> bool:
    from landscape.analyze import registry

    return name not in _LINES and name in registry.names()


def get(name: str) -> JobKind:
    """The spec of kind ``name`` (its module is imported now); a KeyError for an unknown kind."""
    if name in _LINES:
        module, attr = _LINES[name][0].split(":")
        spec = getattr(importlib.import_module(module), attr)
        if spec.name != name:
            raise ValueError(f"{_LINES[name][0]} is the job kind {spec.name!r}, registered as {name!r}")
        return spec
    if is_analysis(name):
        return _analysis_kind(name)
    raise KeyError(name)


def api_names() -> dict[str, str]:
    """``landscape.api`` function name -> kind, for every kind (nothing is imported)."""
    from landscape.analyze import registry

    out = {api: name for name, (_, _, api) in _LINES.items()}
    out.update({n.replace("-", "_"): n for n in registry.names() if n not in _LINES})
    return out


def api_function(name: str) -> Any:
    """The ``landscape.api`` function of kind ``name``: its hand-written one, the runner's function of an
    analysis, or one generated from the spec (positional ``arguments``, then keyword options; ``root`` the
    store, ``out`` the directory of the files it writes)."""
    if is_analysis(name):
        from landscape.api.runner import api_function as analysis_function

        return analysis_function(name)
    spec = get(name)
    if spec.api is not None:
        return spec.api

    def function(*args: Any, root: str | Path = "checkpoints", out: str | Path | None = None, **options: Any) -> Any:
        from landscape.errors import UsageError

        if len(args) > len(spec.arguments):
            raise UsageError(f"{name} takes {len(spec.arguments)} positional argument(s) "
                             f"({', '.join(spec.arguments) or 'none'}), got {len(args)}")
        values = {**dict(zip(spec.arguments, args, strict=False)), **options}
        known = spec.option_types()
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise UsageError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        config = spec.configure(values)
        return spec.run(config, root=Path(root), out=None if out is None else Path(out))

    function.__name__ = function.__qualname__ = _LINES[name][2]
    function.__signature__, function.__doc__ = _signature(spec)
    return function


def _signature(spec: JobKind) -> tuple[inspect.Signature, str]:
    """The generated api function's signature (``help()`` and IDEs show every option) and docstring."""
    positional, keyword, lines = [], [], []
    for _, f in spec.option_fields():
        if f.name in spec.skip:
            continue
        default = field_default(f, inspect.Parameter.empty)
        if f.name in spec.arguments:
            positional.append(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=f.type))
        else:
            keyword.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                             annotation=f.type))
        if f.metadata.get("help"):
            lines.append(f"    {f.name}: {f.metadata['help']}")
    keyword += [inspect.Parameter("root", inspect.Parameter.KEYWORD_ONLY, default="checkpoints"),
                inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, default=None)]
    doc = spec.doc + ("\n\nOptions:\n" + "\n".join(lines) if lines else "")
    return inspect.Signature(positional + keyword), doc


# ------------------------------------------------------------------------------ analyses as job kinds

# the runner's keyword arguments a batch job of an analysis may give (besides its config fields and run options)
BATCH_RUNNER_OPTIONS = ("figure", "data_root", "download")


@dataclasses.dataclass(frozen=True)
class AnalysisJob:
    """An analysis job checked: its references and the options :func:`landscape.api.runner.run` takes."""

    refs: tuple[str, ...]
    options: dict[str, Any]


def _analysis_kind(name: str) -> JobKind:
    from landscape.analyze.registry import get as analysis
    from landscape.api.runner import RUNNER_OPTIONS

    spec = analysis(name)
    runner = (*BATCH_RUNNER_OPTIONS, *(("data_from",) if spec.mode.paired else ()))

    def option_types() -> dict[str, Any]:
        options = {"refs": "str | list[str]", **{k: RUNNER_OPTIONS[k][0] for k in runner}, **fields_of(spec.config)}
        if spec.run_options is not None:
            options.update(fields_of(spec.run_options))
        return options

    def build(options: dict[str, Any]) -> AnalysisJob:
        from landscape.errors import UsageError
        from landscape.options import build

        options = dict(options)
        refs = options.pop("refs", [])
        refs = [refs] if isinstance(refs, str) else list(refs)
        least, most = spec.mode.least, spec.mode.most
        if len(refs) < least or (most is not None and len(refs) > most):
            wanted = f"{least}" if most == least else f"at least {least}"
            raise UsageError(f"'refs': {name} takes {wanted} reference(s), got {len(refs)}")
        rest = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
        config_options = {k: v for k, v in rest.items() if k not in runner}
        if spec.run_options is not None:
            run_fields = {f.name for f in dataclasses.fields(spec.run_options)}
            spec.run_options(**{k: config_options.pop(k) for k in list(config_options) if k in run_fields})
        build(spec.config, config_options)
        return AnalysisJob(tuple(refs), rest)

    def run(job: AnalysisJob, *, root: Path, out: Path | None) -> Any:
        from landscape.api.runner import run as run_analysis

        options = dict(job.options)
        out = Path(out) if out is not None else Path("results")
        detail_dir = spec.mode.detail_dir
        if detail_dir and options.get(detail_dir):  # per-pair files shared by jobs: relative to the results directory
            options[detail_dir] = str(out.parent / options[detail_dir])
        return run_analysis(name, list(job.refs), root=root, output=out / f"{name}.h5", workers=1, **options)

    def outcome(result: Any, root: Path, out: Path | None) -> tuple[dict[str, Any], list[Path]]:
        from landscape.api.jobkind import files_under
        from landscape.results import read_result

        path = Path(getattr(result, "path", None) or Path(out or "results") / f"{name}.h5")
        attrs = read_result(path, load_arrays=False).attrs
        numbers = {k: v.item() if hasattr(v, "item") else v for k, v in attrs.items() if _is_number(v)}
        return numbers, files_under(out if out is not None else path.parent)

    return JobKind(name=name, config=spec.config, run=run, doc=spec.doc, required=("refs",) if spec.mode.least
                   else (), build=build, outcome=outcome, options=option_types, rows=spec.rows,
                   notes=spec.notes, details=spec.details,
                   fields=tuple((cls, ()) for cls in (spec.config, spec.run_options) if cls is not None))


def _is_number(value: Any) -> bool:
    import numpy as np

    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
