"""Gram / NTK blocks out of core: :func:`landscape.gram.gram_tiles` streamed into an HDF5 file
(``/blocks/<parameter name>``, their sum ``/K``), read back block by block by :class:`KernelFileOperator`.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import h5py
import torch
from torch import nn

from landscape.atomic import atomic_write_hdf5
from landscape.errors import ResultError, UsageError
from landscape.gram import gram_tiles
from landscape.results import check_output_path
from landscape.runtime import code_version

DEFAULT_CHUNK = 512  # samples per chunk: a 512 x 512 float64 tile is 2 MB


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
    """Write the per-layer Gram blocks of ``model`` on ``x`` to ``path`` tile by tile (``options``:
    :func:`landscape.gram.gram_tiles`'); ``total`` also writes their sum ``K``."""
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

    def fill(f: h5py.File, check) -> None:
        group = f.create_group("blocks")
        K = f.create_dataset("K", (rows_total, rows_total), dtype="f8", chunks=(side, side)) if total else None
        where, acc, order = None, None, []
        for rows, cols, name, tile in tiles:
            if name not in group:
                order.append(name)
                group.create_dataset(name, (rows_total, rows_total), dtype="f8", chunks=(side, side))
            array = tile.to(torch.float64).numpy()
            _put(group[name], rows, cols, array)
            check()  # a refused write stops the computation at this tile
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

    return atomic_write_hdf5(path, fill)


def _put(dataset: h5py.Dataset, rows: slice, cols: slice, array) -> None:
    """``dataset[rows, cols] = array`` and, off the diagonal, its mirror ``dataset[cols, rows] = array.T``."""
    dataset[rows, cols] = array
    if rows != cols:
        dataset[cols, rows] = array.T


class KernelFileOperator:
    """A kernel written by :func:`gram_blocks_to_hdf5` (``"K"`` or a parameter's block) as a linear operator,
    streamed ``rows`` rows at a time per product; a context manager (or :meth:`close`) releases the file."""

    def __init__(self, path: str | Path, name: str = "K", *, rows: int = DEFAULT_CHUNK,
                 dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu") -> None:
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"no Gram file {path}")
        if int(rows) != rows or rows < 1:
            raise UsageError(f"rows must be a positive integer, got {rows}")
        try:
            self._file = h5py.File(path, "r", locking=False)
        except OSError as exc:
            raise ResultError(f"cannot read {path} as HDF5: {' '.join(str(exc).split())}") from None
        key = "K" if name == "K" else f"blocks/{name}"
        if key not in self._file:
            layers = json.loads(self._file.attrs.get("layers", "[]"))
            self._file.close()
            raise UsageError(f"{path} has no kernel {name!r} (it has: {', '.join(['K', *layers][:12])})")
        self._kernel = self._file[key]
        shape = self._kernel.shape
        if len(shape) != 2 or shape[0] != shape[1] or shape[0] == 0:
            self._file.close()
            raise ResultError(f"{path}: {key} has shape {shape}, not a non-empty square kernel")
        self.path, self.name, self.rows = path, name, int(rows)
        self.dim = int(shape[0])
        self.dtype = dtype
        self.device = torch.device(device)
        self.products = 0

    def matvec(self, v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``K v`` for ``(d,)`` or each row of ``(B, d)``, in ``v``'s dtype (into ``out`` when given)."""
        self.products += 1 if v.dim() == 1 else int(v.shape[0])
        w = v.to(self.device, self.dtype)
        product = torch.empty_like(w)
        for s in range(0, self.dim, self.rows):
            block = torch.from_numpy(self._kernel[s:s + self.rows]).to(self.device, self.dtype)  # K[s:e, :]
            product[..., s:s + block.shape[0]] = w @ block.T
        if out is None:
            return product.to(v.dtype)
        out.copy_(product)
        return out

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> KernelFileOperator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KernelFileOperator({str(self.path)!r}, {self.name!r}, dim={self.dim})"
