"""Output paths of results: default names, and the checks before any work that a result never replaces
another one by accident, nor anything that is not a result, nor passes the file system's limits."""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py

from landscape.errors import OutputPathError, param
from landscape.jsonable import to_jsonable
from landscape.refs import slug

#: Options that never change a result's numbers (beyond rounding): memory bounds, evaluation engines, the
#: device, what is drawn and where partial files go. They are left out of default output names.
NOT_IN_NAME = frozenset({"chunk", "device", "method", "max_memory", "strategy", "rows_per_call",
                         "directions_per_pass", "three_d", "on_rows", "restart", "pair_dir"})
#: The longest options part of a default name written out (``-top_k=3-trace``); a longer one is a hash.
OPTIONS_IN_NAME = 40


def changed_options(*options: Any, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fields of the option dataclasses ``options`` (None skipped) that differ from their defaults,
    without :data:`NOT_IN_NAME`; then ``extra``."""
    out: dict[str, Any] = {}
    for obj in options:
        if obj is None:
            continue
        try:
            default = type(obj)()
        except (TypeError, ValueError):  # a class with required fields: compare with the declared defaults
            default = None
        for f in dataclasses.fields(obj):
            if f.name in NOT_IN_NAME:
                continue
            if default is not None:
                base = getattr(default, f.name)
            elif f.default is not dataclasses.MISSING:
                base = f.default
            elif f.default_factory is not dataclasses.MISSING:
                base = f.default_factory()
            else:
                base = dataclasses.MISSING
            value = getattr(obj, f.name)
            if base is dataclasses.MISSING or to_jsonable(value) != to_jsonable(base):
                out[f.name] = value
    out.update(extra or {})
    return out


def _shown_value(name: str, value: Any) -> str:
    if value is True:
        return name
    if value is False:
        return f"no_{name}"
    if isinstance(value, float):
        return f"{name}={value:g}"
    if isinstance(value, (tuple, list)):
        return f"{name}={','.join(_shown_value('', v).lstrip('=') for v in value)}"
    return f"{name}={'none' if value is None else value}"


def output_stem(base: str, changed: Mapping[str, Any]) -> str:
    """``base`` and the changed options, written out (``-top_k=3-trace``) when short, else hashed."""
    if not changed:
        return base
    shown = "-".join(slug(_shown_value(k, v)) for k, v in changed.items())
    if len(shown) > OPTIONS_IN_NAME:
        blob = json.dumps(to_jsonable(dict(changed)), sort_keys=True, default=str)
        shown = hashlib.sha256(blob.encode()).hexdigest()[:8]
    return f"{base}-{shown}"


def check_default_output(path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Refuse to replace a result under a default name (the same analysis, references and options) unless
    ``overwrite``."""
    path = Path(path)
    if path.is_file() and is_result_file(path) and not overwrite:  # anything else: check_output_path's refusal
        raise OutputPathError(f"refusing to replace {_shown(path)}: a result of the same analysis, references and "
                              f"options is there already (landscape show reads it); pass {param('output')} to write "
                              f"another file, or {param('overwrite', True)} to compute it again and replace it")


def is_result_file(path: str | os.PathLike) -> bool:
    """True when ``path`` is an HDF5 file carrying the result schema's ``kind`` attribute."""
    try:
        with h5py.File(path, "r") as f:
            return "kind" in f.attrs
    except OSError:
        return False


def _shown(path: Path) -> str:
    """A path for a one-line message: an over-long one shortened in the middle."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]}"


NAME_MAX = 255  # bytes of one file name (ext4, xfs, btrfs, apfs)
PATH_MAX = 4096  # bytes of a whole path (Linux)
DERIVED_BYTES = 40  # what a result's companions add to its stem: "-train-reliability.png", ".X.h5.<8>.tmp"


def check_output_path(path: str | os.PathLike) -> None:
    """Refuse an output path that would replace anything but a result, lies below a file or is too long."""
    path = Path(path)
    too_long = [part for part in path.parts if len(os.fsencode(part)) > NAME_MAX]
    if too_long:
        raise OutputPathError(f"cannot write result {_shown(path)}: the name {too_long[0][:40]}... is longer than "
                              f"{NAME_MAX} bytes")
    stem = len(os.fsencode(path.with_suffix("").name))
    if stem + DERIVED_BYTES > NAME_MAX:  # X-train-reliability.png, X-pairs/, .X.h5.abcd1234.tmp ...
        raise OutputPathError(f"cannot write result {_shown(path)}: its name ({stem} bytes without the suffix) leaves "
                              f"no room for the figures and temporary files named after it; use at most "
                              f"{NAME_MAX - DERIVED_BYTES} bytes")
    whole = len(os.fsencode(os.path.abspath(path)))
    if whole + DERIVED_BYTES > PATH_MAX:
        raise OutputPathError(f"cannot write result {_shown(path)}: the path is {whole} bytes; with the files named "
                              f"after it that passes the system's limit of {PATH_MAX} bytes")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"cannot write result {path}: {parent} is a file, not a directory")
            break
    if path.is_dir():
        raise OutputPathError(f"cannot write result {path}: it is a directory")
    if path.exists() and not is_result_file(path):
        raise OutputPathError(f"refusing to overwrite {path}: it is not a landscape result file (a checkpoint or other "
                          "data?); choose another output")


FIGURE_SUFFIXES = (".png", ".pdf")  # what landscape.plots.style.save_figure writes


def companions(path: str | os.PathLike, *, csv: bool = True, figures: bool = True,
               pairs: bool = True) -> list[Path]:
    """The existing files a command writing result ``X.h5`` may replace beside it: ``X.csv``, the figures
    ``X.png`` and ``X-<part>.png`` (and ``.pdf``), the per-pair results ``X-pairs/*.h5``."""
    path = Path(path)
    stem, parent = path.with_suffix("").name, path.parent
    found: list[Path] = []
    if csv:
        found.append(path.with_suffix(".csv"))
    if figures and parent.is_dir():
        for suffix in FIGURE_SUFFIXES:
            found.append(parent / f"{stem}{suffix}")
            # parts are single words (contour, filled, 3d, params, grads, ...): X-a-b.png is another result's
            found += sorted(p for p in parent.glob(f"{glob.escape(stem)}-*{suffix}")
                            if "-" not in p.name[len(stem) + 1:])
    pair_dir = parent / f"{stem}-pairs"
    if pairs and pair_dir.exists():
        found += [pair_dir] if not pair_dir.is_dir() else sorted(pair_dir.iterdir())
    return [p for p in found if p.exists() or p.is_symlink()]


def check_companions(path: str | os.PathLike, *, csv: bool = True, figures: bool = True,
                     pairs: bool = True) -> None:
    """Refuse to write result ``path`` when a file it would write beside it (:func:`companions`) is not
    ours."""
    path = Path(path)
    mine = is_result_file(path)
    pair_dir = path.parent / f"{path.with_suffix('').name}-pairs"
    for other in companions(path, csv=csv, figures=figures, pairs=pairs):
        if other.parent == pair_dir:
            if other.suffix == ".h5" and other.is_file() and is_result_file(other):
                continue
            raise OutputPathError(f"refusing to write the pair results into {pair_dir}: {other.name} there is not a "
                              "landscape result; choose another output")
        if other == pair_dir:
            raise OutputPathError(f"refusing to write the pair results into {pair_dir}: it is a file; "
                              "choose another output")
        if not mine:
            raise OutputPathError(f"refusing to overwrite {other}: it was not written with a result {path.name}; "
                              "choose another output")
