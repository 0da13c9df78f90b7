"""Atomic file writes of the store and the results: a temporary file beside the target is fsynced, renamed
over it and the directory fsynced (every time: POSIX orders renames only through that fsync), so a killed
process leaves the old file or the complete new one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from landscape.errors import WriteError

#: The errors of a write the system refused for want of room or of a working device (a :class:`WriteError`).
WRITE_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG, errno.EIO})

_TEMP_NAME = re.compile(r"\.(?P<final>.+)\.[A-Za-z0-9_]+\.tmp")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)  # a new file only (not inherited)


def atomic_write(path: str | os.PathLike, write_fn: Callable[[Path], object], *, hasher: Any = None) -> Path:
    """Create or replace ``path`` atomically: ``write_fn(tmp)`` writes the whole content to a new temporary
    file beside it. On any exception ``path`` is untouched; a refused write (:data:`WRITE_ERRNOS`) is a
    :class:`WriteError` naming ``path``. ``hasher`` (:mod:`hashlib`) gets the file's bytes, read back in a
    thread while it is fsynced (a writer that seeks, as HDF5 does, cannot be hashed as it writes).
    """
    path = Path(path)
    with _refused(path):
        while True:
            tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            try:
                os.close(os.open(tmp, _CREATE, 0o666))
                break
            except FileExistsError:
                continue
        try:
            write_fn(tmp)
            _fsync(tmp, hasher)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)
        return path


def atomic_write_hdf5(path: str | os.PathLike, fill: Callable[[Any, Callable[[], None]], object], *,
                      hasher: Any = None, **options: Any) -> Path:
    """:func:`atomic_write` of an HDF5 file: ``fill(f, check)`` writes into the new ``h5py.File`` ``f``. A
    write the system refuses is kept from HDF5 (which would crash the process closing the file) and raised by
    ``check()`` (a streaming writer calls it between pieces), else when ``fill`` returns."""
    import h5py

    def write(tmp: Path) -> None:
        fd = os.open(tmp, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        sink = _Sink(fd)
        try:
            with h5py.File(sink, "w", **options) as f:
                fill(f, sink.check)
        finally:
            os.close(fd)
        sink.check()

    return atomic_write(path, write, hasher=hasher)


class _Sink:
    """The file object h5py's ``fileobj`` driver writes through: the temporary file until the system refuses a
    write. HDF5 is never told (an error in the driver's callbacks can crash the process): the error is kept
    and later writes go to memory (:attr:`held`), so HDF5 sees a consistent file to the end."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pos, self.end = fd, 0, 0
        self.error: OSError | None = None
        self.held: list[tuple[int, bytes]] = []  # (offset, bytes) written after the error, in order

    def check(self) -> None:
        """Raise the refused write's error, if there was one."""
        if self.error is not None:
            raise self.error

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        self.pos = pos if whence == os.SEEK_SET else (self.pos if whence == os.SEEK_CUR else self.end) + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size, at = len(view), self.pos
        if self.error is None:
            try:
                while view:
                    done = os.pwrite(self.fd, view, at)
                    if done == 0:  # no progress and no error: the device takes no more
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    view, at = view[done:], at + done
            except OSError as exc:
                self.error = exc
        if view:
            self.held.append((at, bytes(view)))
        self.pos = self.pos + size
        self.end = max(self.end, self.pos)
        return size

    def read(self, size: int = -1) -> bytes:
        size = max(0, self.end - self.pos) if size is None or size < 0 else size
        data = bytearray(size)
        self._fill(data)
        return bytes(data)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        self._fill(view)
        return len(view)

    def _fill(self, view: Any) -> None:
        """``len(view)`` bytes from the current position (zeros past the end, as HDF5's own drivers read)."""
        at, size = self.pos, len(view)
        got = os.preadv(self.fd, [view], at) if size else 0
        view[got:size] = bytes(size - got)
        for offset, data in self.held:  # later writes win
            lo, hi = max(at, offset), min(at + size, offset + len(data))
            if lo < hi:
                view[lo - at:hi - at] = data[lo - offset:hi - offset]
        self.pos += size

    def truncate(self, size: int | None = None) -> int:
        size = self.pos if size is None else size
        if self.error is None:
            try:
                os.ftruncate(self.fd, size)
            except OSError as exc:
                self.error = exc
        self.held = [(o, d[:size - o]) for o, d in self.held if o < size]
        self.end = size
        return size

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def _refused(path: str | os.PathLike):
    """Turn a refused write (:data:`WRITE_ERRNOS`) into a :class:`WriteError` naming ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS and not isinstance(exc, WriteError):
            kept = "the file is unchanged" if os.path.lexists(path) else "nothing was written"
            raise WriteError(path, exc.errno, exc.strerror, f"; {kept}") from None
        raise


def stale_temp_files(directory: str | os.PathLike, finals: Callable[[str], bool] = lambda _: True) -> list[Path]:
    """Temporary files of :func:`atomic_write` in ``directory`` whose final name satisfies ``finals``; only
    where no writer can be active (a live writer's temporary file looks like a stale one)."""
    out = []
    for entry in Path(directory).iterdir():
        m = _TEMP_NAME.fullmatch(entry.name)
        if m is not None and finals(m.group("final")) and entry.is_file():
            out.append(entry)
    return sorted(out)


def _fsync(path: str | os.PathLike, hasher: Any = None) -> None:
    """fsync ``path``; meanwhile (both wait outside the GIL) a thread feeds its bytes to ``hasher``, if given."""
    failed: list[BaseException] = []

    def feed() -> None:
        try:
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    hasher.update(block)
        except BaseException as exc:
            failed.append(exc)

    reader = threading.Thread(target=feed, name="landscape-hash") if hasher is not None else None
    if reader is not None:
        reader.start()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
        if reader is not None:
            reader.join()
    if failed:
        raise failed[0]


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in ``path`` durable; file systems that cannot fsync a directory are skipped."""
    with contextlib.suppress(OSError):
        _fsync(path)
