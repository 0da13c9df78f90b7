"""How an analysis runs, apart from what it computes: :class:`ExecutionOptions` and the one executor
:class:`ProcessPool` (in-process, spawned processes that die with their parent, or Dask tasks)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import torch

from landscape import progress, runtime
from landscape.errors import LandscapeError, OptionError, UsageError, one_line, param
from landscape.runtime import die_with_parent, local_only


def one_thread() -> None:
    """One torch/OpenMP/MKL thread in this (worker) process."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


_STATE: dict[str, Any] = {}


def worker_state() -> dict[str, Any]:
    """What this worker's pool initializer built once per process (the model, data... every job needs)."""
    return _STATE


def set_worker_state(state: dict[str, Any] | None) -> None:
    """Replace :func:`worker_state`."""
    _STATE.clear()
    _STATE.update(state or {})


def _start_worker(parent: int, initializer: Callable | None, initargs: tuple, trusted: tuple = ()) -> None:
    from landscape import plugins

    die_with_parent(parent)
    one_thread()
    refs, accept_changed, device = trusted or ((), False, "auto")
    plugins.trust(refs, accept_changed=accept_changed)
    runtime.set_default_device(device)  # a fresh process: what ``auto`` means in the parent
    if initializer is not None:
        set_worker_state(initializer(*initargs))


def spawn_pool(workers: int, initializer: Callable | None = None, initargs: tuple = (),
               trusted: tuple | None = None) -> ProcessPoolExecutor:
    """``workers`` spawned processes that die with this one, each running ``initializer(*initargs)``."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_start_worker,
                               initargs=(os.getpid(), initializer, initargs,
                                         _trusted() if trusted is None else trusted))


def _trusted() -> tuple:
    """What a worker takes from its parent, as plain data: the trusted user code and what ``auto`` means."""
    from landscape import plugins

    state = plugins.trust_state()
    return (tuple(state.refs), state.accept_changed, runtime.default_device())


_SCHEDULER: contextvars.ContextVar = contextvars.ContextVar("landscape_scheduler", default=None)

_SCHEMES = ("tcp://", "tls://")


def scheduler_address(address: Any) -> Any:
    """``address`` checked as ``tcp://HOST:PORT`` (or ``tls://``; IPv6 hosts in brackets) before anything
    connects; a ``distributed.Client`` passes unchanged."""
    if address is None or not isinstance(address, str):
        return address
    text = address.strip()
    hint = "give tcp://HOST:PORT (e.g. tcp://127.0.0.1:8786, tcp://[::1]:8786)"
    scheme = next((s for s in _SCHEMES if text.lower().startswith(s)), None)
    if scheme is None:
        raise OptionError("scheduler", f"{address!r} is not a Dask scheduler address; {hint}")
    rest = text[len(scheme):]
    if rest.startswith("["):
        host, sep, port = rest[1:].partition("]")
        if not sep or not host or not port.startswith(":"):
            raise OptionError("scheduler", f"{address!r}: an IPv6 host needs [HOST]:PORT; {hint}")
        port = port[1:]
    else:
        host, sep, port = rest.rpartition(":")
        if not sep:
            host, port = rest, ""
    if not host or any(c in host for c in "/ @?#[]") or (":" in host):
        raise OptionError("scheduler", f"{address!r}: bad host {host!r}; {hint}")
    if not (port.isdigit() and 0 < int(port) < 65536):
        raise OptionError("scheduler", f"{address!r}: the port must be a number in 1..65535, got {port!r}; {hint}")
    return text


@contextlib.contextmanager
def using_scheduler(scheduler: Any):
    """Inside the block every :class:`ProcessPool` runs its jobs on the Dask cluster ``scheduler``."""
    token = _SCHEDULER.set(scheduler_address(scheduler))
    try:
        yield
    finally:
        _SCHEDULER.reset(token)


def check_parallelism(workers: int, scheduler: Any) -> None:
    """``--workers N`` (local processes) and ``--scheduler`` (a Dask cluster) exclude each other."""
    if scheduler is not None and workers > 1:
        raise UsageError(f"give {param('workers')} (local processes) or {param('scheduler')} (a Dask cluster), not both")


def cluster_size(scheduler: Any) -> int:
    """How many workers the Dask cluster at ``scheduler`` (address or client) has."""
    client, own = _connect(scheduler)
    try:
        return max(1, len(client.scheduler_info()["workers"]))
    finally:
        if own:
            client.close()


def _connect(scheduler: Any):
    """``(client, opened_here)``; never made the default client: a library must not change a user's Dask
    session."""
    from distributed import Client

    if isinstance(scheduler, Client):
        local_only("a Dask client")
        return scheduler, False
    return connect_client(scheduler_address(scheduler), set_as_default=False), True


def connect_client(address: str, **kwargs: Any):
    """A ``distributed.Client`` of the scheduler at ``address``, after :func:`probe_scheduler`."""
    from distributed import Client

    from landscape import bounds

    local_only(f"the Dask scheduler at {address}")
    start = time.monotonic()
    probe_scheduler(address)
    left = max(1.0, bounds.SCHEDULER_TIMEOUT_S - (time.monotonic() - start))
    try:
        return Client(address, timeout=left, **kwargs)
    except (OSError, TimeoutError) as exc:
        raise LandscapeError(f"cannot reach the Dask scheduler at {address} within {bounds.SCHEDULER_TIMEOUT_S} s: "
                             f"{_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


_NOT_DASK = ("is not a Dask scheduler: its reply is not Dask's protocol (an HTTP server or the dashboard? a scheduler "
             "listens on port 8786 unless told otherwise; `dask scheduler` prints its address)")


def probe_scheduler(address: str, timeout: float | None = None) -> dict[str, Any]:
    """The identity of the Dask scheduler at ``address``, asked as a client does under one deadline; anything
    else is one line saying what answered. Its own thread and event loop: it works under a running one
    (Jupyter)."""
    import asyncio
    import threading

    from landscape import bounds

    limit = float(bounds.SCHEDULER_TIMEOUT_S if timeout is None else timeout)
    from distributed.security import Security

    args = Security().get_connection_args("client")  # Dask's configuration; tls:// without TLS settings: refused
    if address.lower().startswith("tls://") and args.get("ssl_context") is None:
        raise UsageError(f"{param('scheduler', address)}: tls:// needs Dask's TLS settings (the configuration's "
                         f"distributed.comm.tls.ca-file, .client.cert and .client.key; see Dask's docs on TLS), "
                         f"or give tcp://")
    outcome: dict[str, Any] = {}

    async def identity() -> dict[str, Any]:
        from distributed.comm import connect

        comm = await connect(address, timeout=limit, **args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    def talk() -> None:
        try:
            # connect() gives up on a closed port at ``limit`` by itself ("cannot reach"); the half second more
            # lets that message win over "did not answer"
            outcome["identity"] = asyncio.run(asyncio.wait_for(identity(), limit + 0.5))
        except BaseException as exc:  # noqa: BLE001  (reported in the calling thread)
            outcome["error"] = exc

    thread = threading.Thread(target=talk, name="landscape-scheduler-probe", daemon=True)
    thread.start()
    thread.join(limit + 1.5)  # the loop's own deadline, and a second for it to unwind
    error = outcome.get("error")
    if thread.is_alive() or isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        raise LandscapeError(f"{address} did not answer within {limit:g} s as a Dask scheduler would (it accepts "
                             f"connections but sends nothing back): is it a Dask scheduler?")
    if error is not None:
        text = _first_line(error)
        closed = _closed(error)
        if isinstance(error, OSError) and not closed:
            # connect() tried until the deadline: nothing listens, or the port takes connections and drops them
            closed = _accepts(address)
            if not closed:
                raise LandscapeError(f"cannot reach the Dask scheduler at {address} within {limit:g} s: {text}")
        if closed:
            raise LandscapeError(f"{address} closed the connection during Dask's handshake: it is not a Dask "
                                 f"scheduler, or one that refuses this client")
        if isinstance(error, (MemoryError, ValueError, EOFError, LookupError, TypeError, struct.error)):
            raise LandscapeError(f"{address} {_NOT_DASK}")  # garbage read as Dask's frames (an HTTP reply)
        raise LandscapeError(f"cannot talk to the Dask scheduler at {address}: {one_line(error)}")
    reply = outcome.get("identity")
    kind = reply.get("type") if isinstance(reply, dict) else None
    if kind == "Scheduler":
        return reply
    if isinstance(kind, str) and kind in ("Worker", "Nanny"):
        raise LandscapeError(f"{address} is a Dask {kind.lower()}, not the scheduler: give the scheduler's address "
                             f"(the one its workers were started with: `dask worker ADDRESS`)")
    raise LandscapeError(f"{address} {_NOT_DASK}")


def _closed(exc: BaseException) -> bool:
    from distributed.comm.core import CommClosedError

    return isinstance(exc, (CommClosedError, ConnectionResetError, BrokenPipeError))


def _accepts(address: str) -> bool:
    """Whether a plain TCP connection to ``address`` is accepted within a second (after Dask's connect
    failed)."""
    from distributed.comm import parse_address, parse_host_port

    try:
        host, port = parse_host_port(parse_address(address)[1])
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


_DASK_STATES: dict[str, dict[str, Any]] = {}


def _dask_task(key: str | None, init: tuple | None, trusted: tuple, fn: Callable, *args: Any) -> Any:
    """A job on a Dask worker, with the parent's trusted code and device and the pool's worker state."""
    from landscape import plugins

    one_thread()
    refs, accept_changed, device = trusted
    with plugins.trusting(plugins.TrustState(tuple(refs), bool(accept_changed))), runtime.using_device(device):
        if key is not None:
            if key not in _DASK_STATES:
                initializer, initargs = init
                _DASK_STATES.clear()  # one pool's state at a time
                _DASK_STATES[key] = initializer(*initargs)
            set_worker_state(_DASK_STATES[key])
        return fn(*args)


def _dask_as_completed(futures: Sequence[Any]):
    """Dask futures as they finish. Polled: ``distributed.as_completed`` and ``wait`` look for a default
    client, and ours never is one (a library must not change a user's Dask session)."""
    pending = list(futures)
    while pending:
        done = [f for f in pending if f.done()]
        if not done:
            time.sleep(0.02)
            continue
        for f in done:
            pending.remove(f)
            yield f


class ProcessPool:
    """The api's one executor: in-process for one worker (unless an ``initializer`` needs its own process),
    else ``workers`` spawned processes, or Dask tasks under a ``scheduler``; the results are the same either
    way."""

    def __init__(self, workers: int = 1, *, initializer: Callable | None = None, initargs: tuple = (),
                 scheduler: Any = None):
        self.workers = int(workers)
        self.initializer, self.initargs = initializer, initargs
        self.scheduler = scheduler if scheduler is not None else _SCHEDULER.get()
        self.in_process = initializer is None  # a worker state is built in its own process
        self._pool: ProcessPoolExecutor | None = None
        self._client = None
        self._own_client = False
        self._key: str | None = None
        self._init: Any = None
        self._trusted = _trusted()  # the caller's trusted code, given to every worker

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown(cancel=exc[0] is not None)

    def _dask(self):
        if self._client is None:
            self._client, self._own_client = _connect(self.scheduler)
            if self.initializer is not None:
                import uuid

                self._key = uuid.uuid4().hex
                self._init = self._client.scatter((self.initializer, self.initargs), broadcast=True)
        return self._client

    def submit(self, fn: Callable, *args: Any):
        """A future of ``fn(*args)``, in a worker process or Dask task."""
        if self.scheduler is not None:
            return self._dask().submit(_dask_task, self._key, self._init, self._trusted, fn, *args, pure=False)
        if self._pool is None:
            self._pool = spawn_pool(max(self.workers, 1), self.initializer, self.initargs, self._trusted)
        return self._pool.submit(fn, *args)

    def as_completed(self, futures: Sequence[Any]):
        """The futures as they finish."""
        if self.scheduler is not None:
            return _dask_as_completed(futures)
        from concurrent.futures import as_completed

        return as_completed(futures)

    def map(self, fn: Callable, jobs: Sequence[tuple], *, what: str | None = None, unit: str = "jobs") -> list:
        """``[fn(*job) for job in jobs]``, in order; ``what`` names the jobs on the progress display."""
        with progress.task(what, total=len(jobs), unit=unit) if what is not None else progress.SILENT as task:
            if self.scheduler is None and self.in_process and (self.workers <= 1 or len(jobs) <= 1):
                out = []
                for job in jobs:
                    out.append(fn(*job))
                    task.update(1)
                return out
            futures = [self.submit(fn, *job) for job in jobs]
            for done in self.as_completed(futures):
                done.result()  # a failed job raises as soon as it is known
                task.update(1)
            return [f.result() for f in futures]

    def shutdown(self, cancel: bool = False) -> None:
        """Stop the local processes (``cancel``: drop jobs not started) or close the Dask client this pool
        opened."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None
        if self._client is not None and self._own_client:
            self._client.close()
        self._client = None


def map_jobs(fn: Callable, jobs: Sequence[tuple], workers: int, *, what: str | None = None, unit: str = "jobs") -> list:
    """``[fn(*job) for job in jobs]``, in ``min(workers, len(jobs))`` spawned processes when that is > 1."""
    with ProcessPool(min(workers, len(jobs))) as pool:
        return pool.map(fn, jobs, what=what, unit=unit)


# ------------------------------------------------------------------------------------ execution options


@dataclass(frozen=True)
class ExecutionOptions:
    """How an analysis runs, not what it computes: ``workers`` local processes or a Dask ``scheduler``."""

    workers: int = 1
    scheduler: Any = None

    def __post_init__(self) -> None:
        from landscape.bounds import COUNT_MAX

        w = self.workers
        if isinstance(w, bool) or not isinstance(w, (int, float)) or int(w) != w or not 1 <= w <= COUNT_MAX:
            raise OptionError("workers", f"must be an integer >= 1, got {w}")
        object.__setattr__(self, "workers", int(w))
        check_parallelism(self.workers, self.scheduler)

    def on_cluster(self, parallel: bool) -> ExecutionOptions:
        """The options the work runs with: on a cluster, as many parts as the cluster has workers."""
        scheduler = self.scheduler if self.scheduler is not None else _SCHEDULER.get()
        if scheduler is None:
            return self
        out = ExecutionOptions(1, scheduler)
        if parallel:  # parts for the cluster's workers, not local processes: the --workers/--scheduler check is done
            object.__setattr__(out, "workers", cluster_size(scheduler))
        return out
