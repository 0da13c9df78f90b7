"""The writers of a :class:`landscape.recorder.Recorder` (the package docstring says when each): the writer
process, where :class:`Writer` is the training process' end (fork, send a checkpoint, wait for it, stop) and
:func:`serve` the writer's loop, with two pipes between them (a pickled header of plain values, then the
tensors' bytes); and :class:`InlineWriter`, the same interface writing in the training process. Both write a
checkpoint with :func:`write_checkpoint`.
"""

from __future__ import annotations

import _thread
import contextlib
import fcntl
import os
import shutil
import signal
import sys
import warnings
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, Pipe
from typing import Any

import numpy as np
import torch

from landscape.errors import CheckpointError, LandscapeError, UsageError
from landscape.runtime import die_with_parent
from landscape.store import Run, RunBusyError

_PIPE_BYTES = 16 << 20  # the writer's job pipe, when the system allows it (else 1 MiB, else its default)
_ALIGN = 64  # byte alignment of each tensor in the writer's job buffer
_IOV_MAX = 1024  # buffers per writev (POSIX guarantees at least 16; Linux allows 1024)
_INLINE_RUNS: set[str] = set()  # the run directories inline writers of this process hold



class Writer:
    """The parent's end of a recorder's writer process (module docstring): ``send`` one checkpoint, ``wait`` for
    it, ``stop``. The child is forked here and runs :func:`serve`; it opens the run by calling ``opener``, which
    is waited for here (``wait_open``) or else by the first ``wait``: a checkpoint can be sent meanwhile.

    Two pipes: jobs (a pickled header of plain values, then the tensors' bytes in one ``writev``: no copy in this
    process) and replies. The jobs pipe is enlarged where the system allows (Linux: up to 1 MiB for anyone), so
    that a small model's checkpoint is in the pipe at once, whether or not the writer runs at that moment."""

    def __init__(self, name: str, opener: Callable[[], tuple[Run, bool]], *, wait_open: bool = True) -> None:
        self.name = name
        self.in_flight: int | None = None  # the step being written
        self.opening = True  # the writer's answer to opening the run is still to be read
        self.opened: int | None = None  # the step of the run's last checkpoint (None: none), once opened
        self.gone = "is closed"  # why nothing can be sent any more, once the writer is gone
        jobs_out, self.jobs = Pipe(duplex=False)
        self.replies, replies_in = Pipe(duplex=False)
        for size in (_PIPE_BYTES, 1 << 20):
            with contextlib.suppress(OSError, AttributeError):
                fcntl.fcntl(self.jobs.fileno(), fcntl.F_SETPIPE_SZ, size)
                break
        parent = self.owner = os.getpid()
        with warnings.catch_warnings():  # python >= 3.12 warns of forking a threaded process: the child takes
            warnings.simplefilter("ignore", DeprecationWarning)  # no lock another thread may hold (see serve)
            pid = os.fork()
        if pid == 0:  # the writer process: never returns into the caller's code
            code = 1
            try:
                self.jobs.close()
                self.replies.close()
                code = serve(jobs_out, replies_in, parent, opener)
            finally:
                os._exit(code)
        jobs_out.close()
        replies_in.close()
        self.pid: int | None = pid
        if wait_open:
            try:
                self.wait_open()
            except BaseException:
                self.stop()
                raise

    def wait_open(self) -> int | None:
        """Wait until the writer has created or opened the run (raise why it could not); the step of its last
        checkpoint (None: none yet)."""
        if self.opening:
            try:
                self.opened = self._reply("the run")
                self.opening = False
            except BaseException as exc:
                self.opening, self.in_flight = False, None  # a checkpoint sent meanwhile was not written
                self.gone = f"could not open it ({exc})"
                self._release()  # the writer has exited
                raise
        return self.opened

    def send(self, header: dict[str, Any], state: Mapping[str, torch.Tensor], extra: Mapping[str, Any],
             privacy: dict[str, Any] | None) -> None:
        """Send one checkpoint (its bytes are in the pipe or the writer when this returns)."""
        layout, buffers, offset = [], [], 0
        items = [(("state_dict", key), value) for key, value in state.items()]
        items += [(("extra", *path), value) for path, value in _flatten(extra)]
        for path, value in items:
            spec, data = _pack(value)
            pad = -offset % _ALIGN  # each tensor at an aligned offset of the writer's buffer
            if pad:
                buffers.append(bytes(pad))
            offset += pad
            layout.append((path, spec, offset))
            if len(data):
                buffers.append(data)
            offset += spec[-1]
        if self.pid is None:
            raise UsageError(f"the recorder of run '{self.name}' {self.gone}")
        try:
            self.jobs.send(("write", {**header, "privacy": privacy, "layout": layout, "nbytes": offset}))
            _write_all(self.jobs.fileno(), buffers)
        except OSError:
            if self.opening:  # the writer could not open the run and exited: its answer says why
                self.wait_open()
            raise self._died(f"checkpoint step {header['step']} was not written") from None
        self.in_flight = header["step"]

    def wait(self) -> None:
        """Wait for the run to be open and the checkpoint in flight written; raise their error."""
        self.wait_open()
        if self.in_flight is not None:
            step = self.in_flight
            try:
                self._reply(f"checkpoint step {step}")
            finally:
                self.in_flight = None

    def stop(self, *, discard_if_empty: bool = False) -> None:
        """Let the writer finish and release the run's lock (waited for), then exit. Idempotent; a no-op in any
        other process (another recorder's writer, forked while this one was open, must not stop this one)."""
        if self.pid is None or os.getpid() != self.owner:
            return
        unread = self.opening + (self.in_flight is not None)  # answers not waited for (a failure on the way)
        self.opening, self.in_flight = False, None
        with contextlib.suppress(OSError, EOFError):
            self.jobs.send(("stop", discard_if_empty))
            for _ in range(unread + 1):
                self.replies.recv()  # the last: the lock is released
        self._release()

    def _release(self) -> None:
        """Close the pipes; the writer process is reaped in the background (tearing down its copy of the
        training process' address space takes tens of ms), by a bare thread (``threading.Thread.start`` waits
        until the thread runs: milliseconds on a busy machine)."""
        self.jobs.close()
        self.replies.close()
        pid, self.pid = self.pid, None
        with contextlib.suppress(ChildProcessError):  # reaped already (SIGCHLD ignored)
            if pid is not None and os.waitpid(pid, os.WNOHANG) == (0, 0):
                _thread.start_new_thread(_reap, (pid,))

    def shutdown(self) -> None:
        """At interpreter exit (or when a recorder is dropped unclosed): write the checkpoint in flight, stop."""
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
        try:
            status, value = self.replies.recv()
        except (EOFError, OSError):
            raise self._died(f"{what} was not written") from None
        if status == "error":
            raise _rebuild(value)
        return value

    def _died(self, what: str) -> CheckpointError:
        how = "ended"
        if self.pid is not None:
            with contextlib.suppress(ChildProcessError):
                _, status = os.waitpid(self.pid, 0)
                how = (f"was killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else
                       f"exited with code {os.waitstatus_to_exitcode(status)}")
            self.pid = None
            self.jobs.close()
            self.replies.close()
        return CheckpointError(f"the writer process of run '{self.name}' {how}; {what}")


class InlineWriter:
    """A recorder's writer in the training process itself (``Recorder(writer="inline")``): the run is created or
    opened (its write lock taken by this process) when the recorder opens, and ``send`` writes the checkpoint
    before it returns, through the same store calls as the writer process (:func:`write_checkpoint`). The
    interface is :class:`Writer`'s, with nothing ever in flight."""

    in_flight = None
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
        write_checkpoint(self._run, header, state, _nest(pairs), privacy)

    def wait(self) -> None:
        """Nothing is ever in flight."""

    def stop(self, *, discard_if_empty: bool = False) -> None:
        """Release the run's lock (idempotent; a no-op in a process forked from this one, which shares the lock)."""
        if self._run is None or os.getpid() != self.owner:
            return
        run, self._run = self._run, None
        _INLINE_RUNS.discard(self.key)
        close_run(run, discard_if_empty and self.created)

    def shutdown(self) -> None:
        self.stop()


def serve(jobs: Connection, replies: Connection, parent: int, opener: Callable[[], tuple[Run, bool]]) -> int:
    """The writer process: open the run, then write each checkpoint the parent sends until it says stop.

    Forked from the training process, it uses only what it made itself after the fork (the pipes, the run and
    its lock, new HDF5 files): no lock another thread of the parent may have held at the fork."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler
    try:
        run, created = opener()
        infos = run.checkpoints()
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises it)
        _answer(replies, ("error", _describe(exc)))
        return 1
    _answer(replies, ("ok", infos[-1].step if infos else None))
    discard = False
    try:
        while True:
            try:
                kind, message = jobs.recv()
                if kind == "stop":
                    discard = bool(message)
                    break
                buffer = bytearray(message["nbytes"])
                _read_all(jobs.fileno(), buffer)
            except (EOFError, OSError):
                return 0  # the parent is gone
            try:
                _write(run, message, buffer)
                reply: tuple[str, Any] = ("ok", None)
            except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises it)
                reply = ("error", _describe(exc))
            _answer(replies, reply)
    finally:
        close_run(run, discard and created)
    _answer(replies, ("ok", None))
    return 0


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


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


def _read_all(fd: int, buffer: bytearray) -> None:
    view, got = memoryview(buffer), 0
    while got < len(buffer):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError("the recorder's parent is gone")
        got += n


def _write(run: Run, message: dict[str, Any], buffer: bytearray) -> None:
    state: dict[str, torch.Tensor] = {}
    extra: list[tuple[tuple[str, ...], Any]] = []
    for path, spec, offset in message["layout"]:
        value = _unpack(spec, buffer, offset)
        if path[0] == "state_dict":
            state[path[1]] = value
        else:
            extra.append((path[1:], value))
    write_checkpoint(run, message, state, _nest(extra), message["privacy"])


def write_checkpoint(run: Run, header: Mapping[str, Any], state: Mapping[str, torch.Tensor],
                     extra: Mapping[str, Any], privacy: dict[str, Any] | None) -> None:
    """One checkpoint of a recorded run, by either writer: the store's atomic checkpoint write (its sha256 into
    the manifest), then a DP run's privacy record (its step count) into the manifest."""
    run.save_checkpoint(state, step=header["step"], epoch=header["epoch"], epsilon=header["epsilon"],
                        metrics=header["metrics"], extra=extra or None, attrs=header["attrs"])
    if privacy is not None:
        run.update_manifest(privacy=privacy)


def close_run(run: Run, discard: bool) -> None:
    """Release the run's lock; with ``discard`` (a run this recorder created, left by an error before its first
    checkpoint) remove the run if it holds no checkpoint, freeing the name."""
    try:
        if discard:
            with contextlib.suppress(Exception):
                if not run.checkpoints():
                    shutil.rmtree(run.path, ignore_errors=True)
    finally:
        run.close()


def _answer(conn: Connection, reply: tuple[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the parent is gone: nobody to tell
        conn.send(reply)


def _describe(exc: BaseException) -> tuple[str, str, str]:
    return type(exc).__module__, type(exc).__qualname__, str(exc)


def _rebuild(described: tuple[str, str, str]) -> BaseException:
    """The writer's error in the parent: the same landscape error class (already imported: nothing is imported
    by name), anything else as a CheckpointError naming it."""
    module, qualname, message = described
    cls = getattr(sys.modules.get(module), qualname, None)
    if isinstance(cls, type) and issubclass(cls, LandscapeError):
        return cls(message)
    return CheckpointError(f"{qualname}: {message}")


def _pack(value: Any) -> tuple[tuple[Any, ...], Any]:
    """``(spec, bytes)`` of a CPU tensor or an array: ``spec`` = (kind, dtype, shape, byte count)."""
    if torch.is_tensor(value):
        flat = value.detach().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy() if flat.numel() else b""
        return ("torch", str(value.dtype).removeprefix("torch."), tuple(value.shape), len(data)), data
    array = _numeric(np.ascontiguousarray(value), value)
    data = array.reshape(-1).view(np.uint8)
    return ("numpy", np.lib.format.dtype_to_descr(array.dtype), array.shape, data.nbytes), data


def _numeric(array: np.ndarray, value: Any) -> np.ndarray:
    if array.dtype.hasobject:
        raise UsageError(f"cannot store {type(value).__name__} of dtype {array.dtype}: not a numeric array")
    return array


def _unpack(spec: tuple[Any, ...], buffer: bytearray, offset: int) -> Any:
    """A tensor or array of the writer's job buffer (a view: no copy)."""
    kind, dtype, shape, nbytes = spec
    if kind == "torch":
        dtype = getattr(torch, dtype)
        if not nbytes:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).reshape(shape)
    dtype = np.lib.format.descr_to_dtype(dtype)
    if not nbytes:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(buffer, dtype=np.uint8, count=nbytes, offset=offset).view(dtype).reshape(shape)


def _flatten(arrays: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = []
    for key, value in arrays.items():
        if isinstance(value, Mapping):
            out.extend(_flatten(value, (*prefix, str(key))))
        else:
            out.append(((*prefix, str(key)), value))
    return out


def _nest(pairs: Any) -> dict[str, Any]:
    """The nested mapping of ``(path, value)`` pairs (:func:`_flatten` undone)."""
    out: dict[str, Any] = {}
    for path, value in pairs:
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out
