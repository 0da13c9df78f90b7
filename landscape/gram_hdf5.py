"""Gram / NTK blocks out of core: :func:`landscape.gram.gram_tiles` streamed into an HDF5 file.

An n x n kernel per parameter tensor takes ``8 n^2`` bytes in float64 (134 MB at n = 4,096, and LeNet has ten
parameter tensors); :func:`landscape.gram.gram_blocks` holds every layer's block at once. Here each tile of a
pair of sample chunks is written as soon as it is formed (and its transpose at the mirrored position), so the
memory in use is two chunks' factors and one tile, whatever n is. The numbers are ``gram_blocks``' (the same
block code, tested tile against block).

File layout (``h5py`` or ``xarray`` read it; nothing here needs landscape to be read back)::

    /blocks/<parameter name>   (rows, rows) float64   K_r, one dataset per trainable parameter tensor
    /K                         (rows, rows) float64   sum_r K_r: the full Gram matrix / empirical NTK (optional)
    attrs: kind, n, rows, layers (JSON list, named_parameters order), chunk, created, landscape_version,
           torch_version

Written atomically (:func:`landscape.atomic.atomic_write`): an interrupted computation leaves no partial file.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import h5py
import torch
from torch import nn

from landscape.atomic import atomic_write
from landscape.errors import UsageError
from landscape.gram import gram_tiles
from landscape.results import check_output_path
from landscape.runtime import code_version

DEFAULT_CHUNK = 512  # samples per chunk: a 512 x 512 float64 tile is 2 MB

__all__ = ["DEFAULT_CHUNK", "gram_blocks_to_hdf5"]


def gram_blocks_to_hdf5(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor | None,
    path: str | Path,
    *,
    kind: str = "loss-grad",
    chunk: int = DEFAULT_CHUNK,
    total: bool = True,
    **options,
) -> Path:
    """Write the per-layer Gram blocks of ``model`` on ``x`` (and ``y`` for ``kind="loss-grad"``) to ``path``,
    tile by tile (``chunk`` samples per chunk); ``total`` also writes their sum ``K``. ``options`` are
    :func:`landscape.gram.gram_tiles`' (strategy, dtype, max_memory, layers, precision). Returns ``path``."""
    path = Path(path)
    if path.suffix.lower() not in (".h5", ".hdf5"):
        raise UsageError(f"{path}: the Gram file must end in .h5 or .hdf5")
    check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = int(x.shape[0])
    rows_total = n
    if kind == "output" and n:  # sample-major (sample, logit) rows
        with torch.no_grad():
            rows_total = n * int(model(x[:1]).shape[1])
    tiles = gram_tiles(model, x, y, kind=kind, chunk=chunk, **options)
    side = max(1, min(rows_total, 256))

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            group = f.create_group("blocks")
            K = f.create_dataset("K", (rows_total, rows_total), dtype="f8", chunks=(side, side)) if total else None
            where, acc, order = None, None, []
            for rows, cols, name, tile in tiles:
                if name not in group:
                    order.append(name)
                    group.create_dataset(name, (rows_total, rows_total), dtype="f8", chunks=(side, side))
                array = tile.to(torch.float64).numpy()
                _put(group[name], rows, cols, array)
                if K is not None:
                    if (rows, cols) != where:
                        if where is not None:
                            _put(K, *where, acc)
                        where, acc = (rows, cols), array.copy()
                    else:
                        acc += array
            if K is not None and where is not None:
                _put(K, *where, acc)
            f.attrs.update({"kind": kind, "n": n, "rows": rows_total, "layers": json.dumps(order),
                            "chunk": int(chunk), "landscape_version": code_version(),
                            "torch_version": str(torch.__version__),
                            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})

    return atomic_write(path, write)


def _put(dataset: h5py.Dataset, rows: slice, cols: slice, array) -> None:
    """``dataset[rows, cols] = array`` and, off the diagonal, its mirror ``dataset[cols, rows] = array.T``."""
    dataset[rows, cols] = array
    if rows != cols:
        dataset[cols, rows] = array.T
