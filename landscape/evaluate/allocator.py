"""glibc allocator tuning during an evaluation (:func:`tuned_allocator`): freed large blocks are kept
instead of being returned to the OS, and the thresholds are set back afterwards."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (glibc malloc.h)
_RESTORED_MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX (64-bit): the dynamic threshold's ceiling
_allocator_lock = threading.Lock()
_allocator_depth = 0


@contextlib.contextmanager
def tuned_allocator() -> Iterator[None]:
    """Within the block, glibc keeps freed large blocks in the process so repeated activations do not page-fault.

    With glibc's default every large activation is mmap'ed and munmap'ed per call, so every page faults again
    (timings: docs/benchmarks.md). :func:`evaluate` enters it for
    the duration of its call; nested blocks (a benchmark or an analysis wrapping many calls) tune once, and
    the outermost block restores on exit. ``LANDSCAPE_MALLOC_TUNE=0`` (or a platform without glibc) makes it
    a no-op.

    Restoring is approximate, because glibc cannot report these settings (``mallopt(3)`` has no getter) and
    any ``mallopt`` of them switches off its *dynamic* mmap threshold for good. On exit the thresholds are set
    to the state that dynamic threshold converges to in a process that frees large tensors (``mallopt(3)``:
    mmap threshold ``DEFAULT_MMAP_THRESHOLD_MAX`` = 32 MiB on 64-bit, trim threshold twice that), or to the
    values given in ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``. So after the call blocks of 32 MiB
    or more are mmapped again and at most 64 MiB of free heap top is kept, instead of everything below 1 GiB
    being kept for the rest of the process (what a process-wide, never-restored setting did). Restoring
    glibc's 128 KiB start values instead would be worse than never having tuned: with the dynamic threshold
    off, every block over 128 KiB would be mmapped and page-faulted afresh.
    """
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


_LIBC: list = []


def _libc():
    """glibc through ctypes (cached), or None where there is no glibc ``mallopt`` (macOS, Windows, musl)."""
    if not _LIBC:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        except (OSError, AttributeError):
            libc = None
        _LIBC.append(libc)
    return _LIBC[0]
