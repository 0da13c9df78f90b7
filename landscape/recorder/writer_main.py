"""The writer process of a :class:`landscape.recorder.Recorder` (``writer="process"``), and what both writers
share: writing one checkpoint (:func:`write_checkpoint`) and closing the run (:func:`close_run`).

The writer process is a fresh Python interpreter, not a fork of the training process: it imports this module,
the store (numpy, h5py) and nothing of torch or of the user's code, so starting it costs the training process
one ``posix_spawn``, and its imports run on another core while training goes on. Its end in the training
process is :class:`landscape.recorder.writer.Writer`.

The protocol, over one Unix socket: each message is a length-prefixed JSON frame (no pickle: the writer never
unpickles anything, and nothing it reads names code to import). The training process sends ``open`` (the run's
manifest fields: the writer creates or opens the run, :func:`landscape.recorder.manifest.open_run`), ``write``
(with a file descriptor: an anonymous in-memory file holding a JSON header, each tensor's layout, dtype and
shape, then the tensors' bytes), ``resume`` (after a failed write: the writes sent after it were skipped), and
``stop`` (release the run's lock, then exit). The writer answers ``open``, each ``write`` and ``stop`` in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from landscape.recorder.manifest import open_run
from landscape.runtime import die_with_parent
from landscape.store import Run, Store, TensorData
from landscape.store.codec import PreparedFile

_LENGTH = struct.Struct("!I")  # a frame's (and a checkpoint's header's) length prefix
ALIGN = 64  # byte alignment of a checkpoint's tensors in its in-memory file


def data_start(header_bytes: int) -> int:
    """Where the tensors of a checkpoint's in-memory file begin: after its header, aligned."""
    return -(-(_LENGTH.size + header_bytes) // ALIGN) * ALIGN


def main(argv: list[str]) -> int:
    """``python -c ... <socket fd> <parent pid>``: serve the training process until it says stop or dies."""
    fd, parent = int(argv[0]), int(argv[1])
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then stops us
    with socket.socket(fileno=fd) as sock:
        return serve(sock)


def serve(sock: socket.socket) -> int:
    """Open the run, then write each checkpoint the parent sends, in order, until it says stop. After a failed
    write, the writes already sent are skipped (answered ``skipped``) until the parent, having read the failure,
    says ``resume``: a trajectory never gets a later checkpoint over a failed one without the parent knowing."""
    try:
        message, _ = recv_message(sock)
        init = message["run"]
        run, created = open_run(Store(init["root"]), init["name"], init["fields"], init["lineage"],
                                init["privacy"], init["extra"])
        infos = run.checkpoints()
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises it)
        _answer(sock, {"error": describe(exc)})
        return 1
    _answer(sock, {"ok": infos[-1].step if infos else None})
    discard = failed = False
    prepared: PreparedFile | None = None  # the next checkpoint's file, made while the parent trains
    try:
        while True:
            try:
                message, fd = recv_message(sock)
            except (EOFError, OSError, ValueError):
                return 0  # the parent is gone
            kind = message.get("kind")
            if kind == "stop":
                discard = bool(message.get("discard"))
                break
            if kind == "resume":
                failed = False
                continue
            reply: dict[str, Any] = {"skipped": True}
            written = None
            try:
                if not failed:
                    if fd is None:
                        raise ValueError("a write without its data")
                    current, prepared = prepared, None
                    try:
                        written = _write(run, fd, current)
                    finally:
                        if current is not None:
                            current.discard()  # used or not, it is spent (a no-op once committed)
                    reply = {"ok": None}
            except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises it)
                failed = True
                reply = {"error": describe(exc)}
            finally:
                if fd is not None:
                    os.close(fd)
            _answer(sock, reply)
            if written is not None and not _waiting(sock):
                prepared = _prepare(run, *written)
            written = None  # the checkpoint's bytes are not kept while the writer waits
    finally:
        if prepared is not None:
            prepared.discard()
        close_run(run, discard and created)
    _answer(sock, {"ok": None})
    return 0


def _waiting(sock: socket.socket) -> bool:
    """Whether the parent's next message has come (then it is served first: nothing is prepared)."""
    return bool(select.select([sock], [], [], 0)[0])


def _prepare(run: Run, state: dict[str, Any], extra: dict[str, Any]) -> PreparedFile | None:
    """The next checkpoint's file, made from the last one's arrays while training goes on (a recorded loop saves
    checkpoints of one layout: :meth:`landscape.store.Run.prepare_checkpoint`), so that the parent's last save
    waits only for data, attrs, fsyncs and renames at close. None when it cannot be made (the next write then
    makes its file itself, and reports what is wrong)."""
    try:
        return run.prepare_checkpoint(state, extra or None)
    except Exception:  # noqa: BLE001 (not needed: the next write does without it)
        return None


def _write(run: Run, fd: int, prepared: PreparedFile | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One checkpoint from its in-memory file: ``[header length][JSON header][tensor bytes]``, each tensor at
    its layout's offset from :func:`data_start`; returns its weights and extra arrays."""
    size = os.fstat(fd).st_size
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = os.preadv(fd, [view[got:]], got)
        if n == 0:
            raise EOFError("a checkpoint's data ended early")
        got += n
    (length,) = _LENGTH.unpack_from(buffer, 0)
    header = json.loads(bytes(buffer[_LENGTH.size:_LENGTH.size + length]))
    start = data_start(length)
    state: dict[str, Any] = {}
    pairs: list[tuple[list[str], Any]] = []
    for path, spec, offset in header["layout"]:
        value = unpack(spec, buffer, start + offset)
        if path[0] == "state_dict":
            state[path[1]] = value
        else:
            pairs.append((path[1:], value))
    extra = nest(pairs)
    write_checkpoint(run, header, state, extra, header["privacy"], prepared)
    return state, extra


def unpack(spec: list[Any], buffer: bytearray, offset: int) -> Any:
    """A tensor (:class:`landscape.store.TensorData`) or an array of a checkpoint's data (a view: no copy).
    ``spec`` = [kind ("torch" or "numpy"), the torch dtype's name or None, numpy's dtype descr, shape, bytes]."""
    kind, torch_dtype, descr, shape, nbytes = spec
    dtype = np.lib.format.descr_to_dtype(descr)
    if dtype.hasobject:
        raise ValueError(f"dtype {descr!r} is not numeric")
    shape = tuple(int(n) for n in shape)
    if nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize or offset + nbytes > len(buffer):
        raise ValueError(f"{nbytes} bytes do not hold {descr} of shape {shape}")
    array = np.frombuffer(buffer, dtype=dtype, count=nbytes // dtype.itemsize if dtype.itemsize else 0,
                          offset=offset).reshape(shape) if nbytes else np.empty(shape, dtype=dtype)
    return TensorData(array, str(torch_dtype)) if kind == "torch" else array


def write_checkpoint(run: Run, header: Mapping[str, Any], state: Mapping[str, Any], extra: Mapping[str, Any],
                     privacy: dict[str, Any] | None, prepared: PreparedFile | None = None) -> None:
    """One checkpoint of a recorded run, by either writer: the store's atomic checkpoint write (its sha256 into
    the manifest; into the ``prepared`` file when it has this layout), then a DP run's privacy record (its step
    count) into the manifest."""
    run.save_checkpoint(state, step=header["step"], epoch=header["epoch"], epsilon=header["epsilon"],
                        metrics=header["metrics"], extra=extra or None, attrs=header["attrs"], prepared=prepared)
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


def nest(pairs: Any) -> dict[str, Any]:
    """The nested mapping of ``(path, value)`` pairs."""
    out: dict[str, Any] = {}
    for path, value in pairs:
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def describe(exc: BaseException) -> list[str]:
    """An error as [module, class name, message], for the parent to raise again."""
    return [type(exc).__module__, type(exc).__qualname__, str(exc)]


# -- frames ---------------------------------------------------------------------------------------------


def send_message(sock: socket.socket, message: Mapping[str, Any], fd: int | None = None) -> None:
    """One length-prefixed JSON frame (with ``fd`` passed along, SCM_RIGHTS)."""
    payload = json.dumps(message).encode()
    frame = _LENGTH.pack(len(payload)) + payload
    sent = socket.send_fds(sock, [frame], [fd]) if fd is not None else sock.send(frame)
    if sent < len(frame):
        sock.sendall(frame[sent:])


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], int | None]:
    """The next frame and the file descriptor sent with it (None: none). EOFError when the peer is gone."""
    head, fds = b"", []
    while len(head) < _LENGTH.size:
        data, got, _, _ = socket.recv_fds(sock, _LENGTH.size - len(head), 1)
        if not data:
            for extra in got:
                os.close(extra)
            raise EOFError("the other end is gone")
        head += data
        fds += got
    (length,) = _LENGTH.unpack(head)
    payload = bytearray()
    while len(payload) < length:
        data = sock.recv(length - len(payload))
        if not data:
            raise EOFError("the other end is gone")
        payload += data
    message = json.loads(bytes(payload))
    if not isinstance(message, dict):
        raise ValueError("not a message")
    return message, (fds[0] if fds else None)


def _answer(sock: socket.socket, reply: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the parent is gone: nobody to tell
        send_message(sock, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
