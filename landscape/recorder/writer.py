"""The writers of a :class:`landscape.recorder.Recorder` (the package docstring says when each): the training
process' end of the writer process (:class:`Writer`: start it, send a checkpoint, collect its answer, stop; the
process itself is :mod:`landscape.recorder.writer_main`), and :class:`InlineWriter`, the same interface writing
in the training process. Both write a checkpoint with :func:`write_checkpoint`.
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

import landscape
from landscape.errors import CheckpointError, LandscapeError, UsageError
from landscape.recorder.writer_main import (
    _LENGTH,
    ALIGN,
    close_run,
    data_start,
    nest,
    recv_message,
    send_message,
    write_checkpoint,
)
from landscape.store import Run, RunBusyError
from landscape.store.codec import _view_dtypes

MAX_IN_FLIGHT = 8  # checkpoints sent and not yet written, at most (a save waits for the oldest beyond)
MAX_BYTES_IN_FLIGHT = 128 << 20  # nor more bytes than this (but always one checkpoint)
_IOV_MAX = 1024  # buffers per writev (POSIX guarantees at least 16; Linux allows 1024)
_INLINE_RUNS: set[str] = set()  # the run directories inline writers of this process hold
# The writer process' first line: the parent's module path (the same numpy, h5py, landscape), then the writer.
_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
         "from landscape.recorder.writer_main import main; sys.exit(main(sys.argv[2:]))")


class Writer:
    """The training process' end of a recorder's writer process (:mod:`landscape.recorder.writer_main`):
    ``send`` a checkpoint, ``wait`` for those in flight, ``stop``. The process is started here (a fresh
    interpreter, ``posix_spawn``: no fork of this process) and told to open the run (``init``: the arguments
    of :func:`landscape.recorder.manifest.open_run`); its answer is waited for here (``wait_open``) or else
    by the first call that waits. Checkpoints are sent meanwhile: the writer writes them once it has started.

    Each checkpoint goes into an anonymous in-memory file (one copy, then this process is done with it) whose
    descriptor is passed over the socket; up to :data:`MAX_IN_FLIGHT` checkpoints (and
    :data:`MAX_BYTES_IN_FLIGHT`) may be in flight, so that saves do not wait for the writer's start."""

    def __init__(self, name: str, init: Mapping[str, Any], *, wait_open: bool = True) -> None:
        self.name = name
        self.pending: deque[tuple[int, int]] = deque()  # (step, bytes) sent, answer not read yet
        self.opening = True  # the writer's answer to opening the run is still to be read
        self.opened: int | None = None  # the step of the run's last checkpoint (None: none), once opened
        self.gone = "is closed"  # why nothing can be sent any more, once the writer is gone
        self.stop_sent = False
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, json.dumps(_module_path()), str(theirs.fileno()),
                 str(os.getpid())], stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), env=_writer_env())
        except OSError as exc:
            ours.close()
            raise CheckpointError(f"cannot start the writer process of run '{name}': {exc}") from None
        finally:
            theirs.close()
        self.sock = ours
        self.pid: int | None = self.proc.pid
        self.owner = os.getpid()
        with contextlib.suppress(OSError):  # a writer that died at once: its end of file says so (wait_open)
            send_message(self.sock, {"kind": "open", "run": dict(init)})
        if wait_open:
            try:
                self.wait_open()
            except BaseException:
                self.stop()
                raise

    @property
    def in_flight(self) -> int:
        """Checkpoints sent whose answer has not been read."""
        return len(self.pending)

    def wait_open(self) -> int | None:
        """Wait until the writer has created or opened the run (raise why it could not); the step of its last
        checkpoint (None: none yet)."""
        if self.opening:
            try:
                self.opened = self._reply("the run")
                self.opening = False
            except BaseException as exc:
                self.opening = False
                self.pending.clear()  # checkpoints sent meanwhile were not written
                self.gone = f"could not open it ({exc})"
                self._release()  # the writer has exited
                raise
        return self.opened

    def send(self, header: dict[str, Any], state: Mapping[str, torch.Tensor], extra: Mapping[str, Any],
             privacy: dict[str, Any] | None) -> None:
        """Send one checkpoint (its bytes are in the writer's in-memory file when this returns); first raise a
        failed earlier write's error, and wait for the oldest checkpoint in flight while too many are."""
        layout, buffers, offset = [], [], 0
        items = [(("state_dict", key), value) for key, value in state.items()]
        items += [(("extra", *path), value) for path, value in _flatten(extra)]
        for path, value in items:
            spec, data = _pack(value, path[-1])
            offset += -offset % ALIGN  # each tensor at an aligned offset
            layout.append((path, spec, offset))
            buffers.append((offset, data))
            offset += spec[-1]
        if self.pid is None:
            raise UsageError(f"the recorder of run '{self.name}' {self.gone}")
        self._settle()
        while self.pending and (len(self.pending) >= MAX_IN_FLIGHT or
                                sum(n for _, n in self.pending) + offset > MAX_BYTES_IN_FLIGHT):
            self._collect()
        head = json.dumps({**header, "privacy": privacy, "layout": layout}, default=_json_value).encode()
        chunks = [_LENGTH.pack(len(head)), head, bytes(data_start(len(head)) - _LENGTH.size - len(head))]
        end = 0
        for at, data in buffers:
            if at > end:
                chunks.append(bytes(at - end))
            if len(data):
                chunks.append(data)
            end = at + len(data)
        try:
            with _memory_file() as fd:
                _write_all(fd, chunks)
                send_message(self.sock, {"kind": "write"}, fd)
        except OSError:
            if self.opening:  # the writer could not open the run and exited: its answer says why
                self.wait_open()
            raise self._died(f"checkpoint step {header['step']} was not written") from None
        self.pending.append((header["step"], end))

    def wait(self) -> None:
        """Wait for the run to be open and every checkpoint in flight written; raise the first error."""
        self.wait_open()
        while self.pending:
            self._collect()

    def _settle(self) -> None:
        """Read the answers that have come (without waiting for any); raise a failed write's error."""
        while (self.opening or self.pending) and _readable(self.sock):
            if self.opening:
                self.wait_open()
            else:
                self._collect()

    def _collect(self) -> None:
        """Read the answer of the oldest checkpoint in flight (waiting for it). When its write failed, the
        writer has skipped those sent after it: their answers are read, the writer told to resume, the error
        raised (the recorder then reads the run's last step from disk)."""
        self.wait_open()
        step, _ = self.pending.popleft()
        try:
            self._reply(f"checkpoint step {step}")
        except BaseException:
            while self.pid is not None and self.pending:
                self.pending.popleft()
                with contextlib.suppress(LandscapeError):  # skipped (or the writer died: pid None)
                    self._reply("a checkpoint")
            if self.pid is not None:
                with contextlib.suppress(OSError):  # a writer gone: the next send says so
                    send_message(self.sock, {"kind": "resume"})
            self.pending.clear()
            raise

    def finish(self, *, discard_if_empty: bool = False) -> None:
        """Write the checkpoints in flight and stop, in one round trip: the stop is sent behind them (the writer
        serves messages in order, and prepares no next file once it sees one waiting), then every answer is read;
        the first failed write's error is raised once the writer has stopped and released the run's lock."""
        if self.pid is None or os.getpid() != self.owner:
            return
        with contextlib.suppress(OSError):  # a writer already gone: the answers below say why
            send_message(self.sock, {"kind": "stop", "discard": discard_if_empty})
            self.stop_sent = True
        try:
            self.wait()
        finally:
            self.stop()

    def stop(self, *, discard_if_empty: bool = False) -> None:
        """Let the writer finish and release the run's lock (waited for), then exit. Idempotent; a no-op in any
        other process (one forked from this one, e.g. a data loader's worker)."""
        if self.pid is None or os.getpid() != self.owner:
            return
        unread = self.opening + len(self.pending)  # answers not waited for (a failure on the way)
        self.opening = False
        self.pending.clear()
        with contextlib.suppress(OSError, EOFError, ValueError):
            if not self.stop_sent:
                send_message(self.sock, {"kind": "stop", "discard": discard_if_empty})
                self.stop_sent = True
            for _ in range(unread + 1):
                recv_message(self.sock)  # the last: the lock is released
        self._release()

    def _release(self) -> None:
        """Close the socket; the writer process is reaped in the background (by a bare thread:
        ``threading.Thread.start`` waits until the thread runs, milliseconds on a busy machine)."""
        self.sock.close()
        self.pid = None
        if self.proc.poll() is None:
            _thread.start_new_thread(self.proc.wait, ())

    def shutdown(self) -> None:
        """At interpreter exit (or when a recorder is dropped unclosed): write the checkpoints in flight, stop."""
        if os.getpid() != self.owner:
            return
        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 (nothing can be raised to anyone here)
            print(f"error: landscape.Recorder could not write the last checkpoint of run '{self.name}': {exc}",
                  file=sys.stderr)
        finally:
            self.stop()

    def _reply(self, what: str) -> Any:
        """The writer's next answer: its value, or its error raised (``skipped``: a CheckpointError)."""
        try:
            reply, _ = recv_message(self.sock)
        except (EOFError, OSError, ValueError):
            raise self._died(f"{what} was not written") from None
        if "error" in reply:
            raise _rebuild(reply["error"])
        if reply.get("skipped"):
            raise CheckpointError(f"{what} was not written (an earlier write failed)")
        return reply.get("ok")

    def _died(self, what: str) -> CheckpointError:
        how = "ended"
        if self.pid is not None:
            code = self.proc.wait()
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self.pid = None
            self.sock.close()
        return CheckpointError(f"the writer process of run '{self.name}' {how}; {what}")


class InlineWriter:
    """A recorder's writer in the training process itself (``Recorder(writer="inline")``): the run is created or
    opened (its write lock taken by this process) when the recorder opens, and ``send`` writes the checkpoint
    before it returns, through the same store calls as the writer process (:func:`write_checkpoint`). The
    interface is :class:`Writer`'s, with nothing ever in flight."""

    opening = False

    def __init__(self, name: str, opener: Callable[[], tuple[Run, bool]]) -> None:
        self.name = name
        self.owner = os.getpid()
        self.gone = "is closed"
        run, self.created = opener()
        self.key = os.path.realpath(run.path)
        try:
            if self.key in _INLINE_RUNS:  # the store's lock is this process' own: it would let a second writer in
                raise RunBusyError(f"run '{name}' is being written by another Recorder of this process; one writer "
                                   "per run: close that one first")
            infos = run.checkpoints()
        except BaseException:
            run.close()
            raise
        _INLINE_RUNS.add(self.key)
        self.opened: int | None = infos[-1].step if infos else None
        self._run: Run | None = run

    def wait_open(self) -> int | None:
        return self.opened

    def send(self, header: dict[str, Any], state: Mapping[str, torch.Tensor], extra: Mapping[str, Any],
             privacy: dict[str, Any] | None) -> None:
        """Write one checkpoint now (refusing what the writer process would refuse)."""
        pairs = [(path, value if torch.is_tensor(value) else _numeric(np.asarray(value), value))
                 for path, value in _flatten(extra)]
        if self._run is None:
            raise UsageError(f"the recorder of run '{self.name}' {self.gone}")
        write_checkpoint(self._run, header, state, nest(pairs), privacy)

    def wait(self) -> None:
        """Nothing is ever in flight."""

    def finish(self, *, discard_if_empty: bool = False) -> None:
        """Nothing is in flight: release the run's lock."""
        self.stop(discard_if_empty=discard_if_empty)

    def stop(self, *, discard_if_empty: bool = False) -> None:
        """Release the run's lock (idempotent; a no-op in a process forked from this one, which shares the lock)."""
        if self._run is None or os.getpid() != self.owner:
            return
        run, self._run = self._run, None
        _INLINE_RUNS.discard(self.key)
        close_run(run, discard_if_empty and self.created)

    def shutdown(self) -> None:
        self.stop()




def _writer_env() -> dict[str, str]:
    """The writer process' environment: this one's, with one thread for each numerical library it might load.
    It never computes, but numpy's import starts OpenBLAS' thread pool, one thread per core unless told otherwise:
    threads that compete with the training loop for its cores."""
    return {**os.environ, **dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")}


def _module_path() -> list[str]:
    """Where the writer process finds its modules: this landscape first, then this process' ``sys.path``."""
    here = str(Path(landscape.__file__).resolve().parents[1])
    return list(dict.fromkeys([here, *(os.path.abspath(p) if p else os.getcwd() for p in sys.path)]))


@contextlib.contextmanager
def _memory_file():
    """A file descriptor of an anonymous in-memory file (Linux ``memfd``; elsewhere an unlinked temporary file)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("landscape-checkpoint")
        try:
            yield fd
        finally:
            os.close(fd)
    else:
        with tempfile.TemporaryFile() as f:
            yield f.fileno()


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _write_all(fd: int, buffers: list[Any]) -> None:
    """All of ``buffers`` into ``fd`` (``writev``: from their memory, no copy; partial writes continued)."""
    views = [memoryview(b).cast("B") for b in buffers]
    while views:
        done = os.writev(fd, views[:_IOV_MAX])
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def _rebuild(described: list[str]) -> BaseException:
    """The writer's error in the parent: the same landscape error class (already imported: nothing is imported
    by name), anything else as a CheckpointError naming it."""
    module, qualname, message = described
    cls = getattr(sys.modules.get(module), qualname, None)
    if isinstance(cls, type) and issubclass(cls, LandscapeError):
        return cls(message)
    return CheckpointError(f"{qualname}: {message}")


def _json_value(value: Any) -> Any:
    """A metric JSON cannot hold as it is (numpy scalars and arrays, tensors) as plain numbers."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) or torch.is_tensor(value):
        return value.tolist()
    raise TypeError(f"cannot record {type(value).__name__} {value!r}")


@functools.cache
def _storage(dtype: torch.dtype) -> tuple[torch.dtype, str]:
    """The dtype a tensor's bytes are stored as (:func:`landscape.store.codec._view_dtypes` for those numpy
    lacks) and numpy's descr of it."""
    view = _view_dtypes().get(dtype, dtype)
    try:
        descr = np.lib.format.dtype_to_descr(torch.empty(0, dtype=view).numpy().dtype)
    except (TypeError, RuntimeError):
        raise UsageError(f"cannot store a tensor of dtype {str(dtype).removeprefix('torch.')}") from None
    return view, descr


def _pack(value: Any, name: str) -> tuple[list[Any], Any]:
    """``(spec, bytes)`` of a CPU tensor or an array: ``spec`` as :func:`landscape.recorder.writer_main.unpack`
    reads it."""
    if torch.is_tensor(value):
        if value.is_sparse or value.layout != torch.strided:
            raise UsageError(f"cannot store '{name}': only dense tensors are supported")
        _, descr = _storage(value.dtype)
        flat = value.detach().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy() if flat.numel() else b""
        return ["torch", str(value.dtype).removeprefix("torch."), descr, list(value.shape), len(data)], data
    array = _numeric(np.ascontiguousarray(value), value)
    data = array.reshape(-1).view(np.uint8)
    return ["numpy", None, np.lib.format.dtype_to_descr(array.dtype), list(array.shape), data.nbytes], data


def _numeric(array: np.ndarray, value: Any) -> np.ndarray:
    if array.dtype.hasobject:
        raise UsageError(f"cannot store {type(value).__name__} of dtype {array.dtype}: not a numeric array")
    return array


def _flatten(arrays: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for key, value in arrays.items():
        if isinstance(value, Mapping):
            out.extend(_flatten(value, (*prefix, str(key))))
        else:
            out.append(((*prefix, str(key)), value))
    return out
