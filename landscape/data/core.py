"""Data sets by name: :func:`load_dataset` (the registry, then tensor files, folders, torchvision sets, entry points and code) and :func:`dataset_from_spec` (the same tensors again from a stored spec)."""

from __future__ import annotations

import inspect
import os
from typing import Any

import numpy as np

from landscape.data.arrays import Dataset, _Arrays, _subset_value, subset_indices
from landscape.data.builtin import DATASETS
from landscape.data.sources import _jsonable, _other_source
from landscape.errors import DataError

_CALL_ARGS = ("seed", "data_root", "download")


def dataset_options(name: str) -> dict[str, Any]:
    """The options ``name`` accepts, with their defaults."""
    try:
        builder = DATASETS[name]
    except (KeyError, TypeError):
        raise DataError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}") from None
    return {
        p.name: p.default
        for p in inspect.signature(builder).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name not in _CALL_ARGS
    }


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    subset: int | float | None = None,
    data_root: str | os.PathLike | None = None,
    download: bool = False,
    **options: Any,
) -> Dataset:
    """Build the data set ``name`` with ``options``; ``subset`` samples the train split (stratified, by ``seed``).

    ``name`` is a built-in (:data:`DATASETS`), a ``.npz`` / ``.h5`` tensor file, ``"imagefolder"``, a torchvision
    classification set by its lower-case class name, a ``landscape.datasets`` entry point, or a code reference
    ``module:factory`` / ``file.py:factory`` (naming it here is what lets it run); the catalogue is
    docs/data-models.md. Image sets are read from ``data_root`` (else ``$LANDSCAPE_DATA``) unless ``download``.
    """
    seed, subset = _seed_and_subset(seed, subset)
    if isinstance(name, str) and name in DATASETS:
        builder = DATASETS[name]
        accepted = dataset_options(name)
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            known = ", ".join(accepted) or "none"
            raise DataError(f"data set {name!r} has no option {', '.join(map(repr, unknown))}; its options: {known}")
        filled = {**accepted, **options}
        arrays = builder(seed=seed, data_root=data_root, download=download, **filled)
        provenance: dict[str, Any] = {}
    else:
        name, arrays, filled, provenance = _other_source(name, seed, data_root, download, options, stored=None)
    return _assemble(name, arrays, seed, subset, filled, provenance)


def _seed_and_subset(seed: Any, subset: Any) -> tuple[int, int | float | None]:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"data seed must be an integer, got {seed!r}")
    return int(seed), None if subset is None else _subset_value(subset)


def _assemble(name: str, arrays: _Arrays, seed: int, subset, options: dict, provenance: dict) -> Dataset:
    x_train, y_train = arrays.x_train, arrays.y_train
    if subset is not None:
        keep = subset_indices(y_train, subset, seed)
        x_train, y_train = x_train[keep], y_train[keep]
    spec = {"name": name, "seed": seed, "subset": subset, "options": _jsonable(options), **provenance}
    if arrays.inputs is not None:
        spec["inputs"] = arrays.inputs
    return Dataset(name, x_train.contiguous(), y_train.contiguous(), arrays.x_test.contiguous(),
                   arrays.y_test.contiguous(), arrays.num_classes, spec)


def dataset_from_spec(spec: dict, *, data_root: str | os.PathLike | None = None, download: bool = False) -> Dataset:
    """Rebuild the data set a ``Dataset.spec`` describes: a file or directory source must still have its recorded
    sha256 (a moved tensor file is found under ``data_root`` by name); code runs only when the user named it in
    this context, never because a spec names it."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise DataError(f"a data spec is a dict with 'name', 'seed', 'subset', 'options'; got {spec!r}")
    options = dict(spec.get("options") or {})
    name, seed, subset = spec["name"], spec.get("seed", 0), spec.get("subset")
    if not any(k in spec for k in ("code", "entry_point", "source")):
        if not isinstance(name, str) or name not in DATASETS:
            raise DataError(f"unknown data set {name!r} in a stored spec; known: {', '.join(DATASETS)} (data from "
                            "files or code records its source, which this spec does not)")
        return load_dataset(name, seed=seed, subset=subset, data_root=data_root, download=download, **options)
    seed, subset = _seed_and_subset(seed, subset)
    name, arrays, filled, provenance = _other_source(name, seed, data_root, download, options, stored=spec)
    if spec.get("inputs") != arrays.inputs:
        raise DataError(f"data set {name}: its spec records the inputs converted as {spec.get('inputs') or 'stored'}, "
                        f"but this version reads them as {arrays.inputs or 'stored'}: the tensors would differ; use "
                        f"the landscape version that trained it")
    return _assemble(name, arrays, seed, subset, filled, provenance)
