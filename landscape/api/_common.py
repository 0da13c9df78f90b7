"""What the api modules share: data rebuilt from a checkpoint, pair checks, output names."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from landscape.errors import CheckpointError, IncompatibleError
from landscape.params import check_compatible
from landscape.store import Checkpoint


def checkpoint_dataset(data_spec: dict, data_root: str | None = None, download: bool = False, *,
                       purpose: str = "evaluate it", source: str = "the checkpoint"):
    """The data set a checkpoint's ``data_spec`` describes (the last few cached per process)."""
    if not data_spec:
        raise CheckpointError(f"{source} records no data set (data_spec is empty); cannot {purpose}")
    return _dataset(json.dumps(data_spec, sort_keys=True), data_root, download)


@functools.lru_cache(maxsize=4)
def _dataset(spec_json: str, data_root: str | None, download: bool):
    from landscape.data import dataset_from_spec

    return dataset_from_spec(json.loads(spec_json), data_root=data_root, download=download)


def check_pair(a: Checkpoint, b: Checkpoint, *, b_label: str | None = None) -> None:
    """IncompatibleError naming the first differing tensor, else model option (``b_label``: B's name)."""
    name_b = b_label if b_label is not None else f"B ({b.ref})"
    short_b = b_label if b_label is not None else "B"
    check_compatible(a.state_dict, b.state_dict, names=(f"A ({a.ref})", name_b))
    sa, sb = a.model_spec or {}, b.model_spec or {}
    if sa.get("name") != sb.get("name"):
        raise IncompatibleError(f"incompatible models: A is '{sa.get('name')}' but {short_b} is '{sb.get('name')}'")
    ka, kb = sa.get("kwargs") or {}, sb.get("kwargs") or {}
    for key in list(ka) + [k for k in kb if k not in ka]:
        if ka.get(key) != kb.get(key):
            raise IncompatibleError(
                f"incompatible models: option '{key}' is {json.dumps(ka.get(key))} in A but "
                f"{json.dumps(kb.get(key))} in {short_b}"
            )


def default_output(name: str) -> Path:
    """``results/<name>.h5``; a name too long for a file keeps 150 characters and a hash of the whole."""
    if len(name) > 200:
        import hashlib

        name = f"{name[:150]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return Path("results") / f"{name}.h5"
