"""Content hashes of files: :func:`sha256_file` and :class:`InputRef` (a file a result or run was made from,
with its sha256). Torch-free; below the store and the results, which both record them."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class InputRef:
    """A checkpoint (or other file) a result was computed from, with its content hash."""

    ref: str
    path: str
    sha256: str

    @classmethod
    def of(cls, ref: str, path: str | os.PathLike) -> InputRef:
        return cls(ref=ref, path=str(path), sha256=sha256_file(path))
