"""glibc allocator tuning during an evaluation (:func:`tuned_allocator`): freed large blocks are kept
instead of being returned to the OS, and the thresholds are set back afterwards."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Iterator

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (glibc malloc.h)
_RESTORED_MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX (64-bit): the dynamic threshold's ceiling
_allocator_lock = threading.Lock()
_allocator_depth = 0


@contextlib.contextmanager
def tuned_allocator() -> Iterator[None]:
    """Within the block, glibc keeps freed large blocks so repeated activations do not page-fault; nested blocks
    tune once; ``LANDSCAPE_MALLOC_TUNE=0`` (or no glibc) makes it a no-op. On exit the thresholds become what
    glibc's dynamic threshold converges to (mmap 32 MiB, trim 64 MiB, or ``MALLOC_*_THRESHOLD_``): glibc cannot
    report the old ones, and its 128 KiB start values would page-fault every larger block afresh."""
    global _allocator_depth
    libc = _libc() if os.environ.get("LANDSCAPE_MALLOC_TUNE", "1") != "0" else None
    if libc is None:
        yield
        return
    with _allocator_lock:
        _allocator_depth += 1
        if _allocator_depth == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30)
            libc.mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1)
    try:
        yield
    finally:
        with _allocator_lock:
            _allocator_depth -= 1
            if _allocator_depth == 0:
                mmap_threshold = _env_threshold("MALLOC_MMAP_THRESHOLD_", _RESTORED_MMAP_THRESHOLD)
                libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
                libc.mallopt(_M_TRIM_THRESHOLD, _env_threshold("MALLOC_TRIM_THRESHOLD_", 2 * mmap_threshold))


def _env_threshold(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if 0 <= value < (1 << 31) else default


@functools.cache
def _libc():
    """glibc through ctypes, or None where there is no glibc ``mallopt`` (macOS, Windows, musl)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc
