"""Process-wide runtime settings: threads, device, seeds, and the code version recorded in every file."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from landscape import __version__
from landscape.errors import UsageError

if TYPE_CHECKING:
    import torch

THREADS_ENV = "LANDSCAPE_THREADS"
DATA_ENV = "LANDSCAPE_DATA"  # where torchvision data sets live (landscape.data)


def set_threads(threads: int | None = None) -> int | None:
    """Set torch's intra-op thread count from ``threads``, else ``$LANDSCAPE_THREADS``, else leave torch's default
    (and return None).

    On small machines one thread is often faster than several (docs/benchmarks.md); tests, CI and
    benchmarks run with one. torch is not imported for this (``store ls``, ``show``, ``privacy`` need none): if
    it is not loaded yet, ``$OMP_NUM_THREADS`` is set, which torch reads for its default when it loads (at most
    the number of cores, where ``torch.set_num_threads`` would oversubscribe).
    """
    if threads is None:
        env = os.environ.get(THREADS_ENV)
        if env is None:
            return None
        try:
            threads = int(env)
        except ValueError:
            raise UsageError(f"${THREADS_ENV} must be a positive integer, got {env!r}") from None
    if threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


_DEVICE_NAME = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device_name(name: str) -> str:
    """The one rule for a ``--device`` value: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (UsageError otherwise).

    Whether a GPU is present is checked later, by :func:`resolve_device`, when the device is used.
    """
    if not _DEVICE_NAME.match(str(name)):
        raise UsageError(f"--device {name!r}: use auto, cpu, cuda or cuda:N")
    return str(name)


_DEVICE: contextvars.ContextVar[str] = contextvars.ContextVar("landscape_device", default="auto")


@contextlib.contextmanager
def using_device(name: str) -> Iterator[None]:
    """``auto`` means ``name`` inside the block (``figures --device``, ``demo --device``: every run and analysis
    they start; the api's worker processes are told)."""
    token = _DEVICE.set(check_device_name(name))
    try:
        yield
    finally:
        _DEVICE.reset(token)


def set_default_device(name: str) -> None:
    """What ``auto`` means in this context from now on (a worker process takes its parent's)."""
    _DEVICE.set(check_device_name(name))


def default_device() -> str:
    """What ``auto`` means here: :func:`using_device`'s name, else ``auto`` (CUDA when present, else CPU)."""
    return _DEVICE.get()


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``auto`` -> :func:`default_device`, which is cuda when present, else cpu; an explicit ``cuda`` without a GPU
    is a usage error."""
    import torch

    if device is None or str(device) == "auto":
        device = _DEVICE.get()
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for but no CUDA device is available; use --device cpu")
    return dev


@contextlib.contextmanager
def math_attention() -> Iterator[None]:
    """Attention by its math form inside the block: the same function as PyTorch's fused kernels (the
    inference fast path of ``nn.TransformerEncoderLayer``/``nn.MultiheadAttention``, the fused CPU
    scaled-dot-product kernels), but with every derivative: the fused ones have no forward-mode rule, no second
    derivative and no vmap batching rule. Every ``torch.func`` transform of a model that may hold attention
    runs in it. The fast-path switch is process-wide; it is restored on exit."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch; return a CPU generator seeded with ``seed`` for explicit use."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - seeds legacy global-state users too
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


#: The packages whose versions every run and result records (when installed; read from their metadata, so
#: none is imported for it: Opacus, a test reference, stays unloaded).
ENVIRONMENT_PACKAGES = ("torch", "torchvision", "opacus", "numpy", "dp-accounting")


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, str]:
    """``{"python": ..., "torch": ..., "torchvision": ..., "opacus": ..., ...}``: the versions a run or result is
    made with, each package only when installed (:data:`ENVIRONMENT_PACKAGES`), read without importing anything,
    so every process says the same: the ``__version__`` its ``version.py`` states (torch's and torchvision's
    carry the build, ``2.5.1+cu124``), else the installed metadata's."""
    import platform
    from importlib import metadata

    out = {"python": platform.python_version()}
    for name in ENVIRONMENT_PACKAGES:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        version = dist.version
        with contextlib.suppress(OSError, TypeError):
            text = Path(str(dist.locate_file(f"{name.replace('-', '_')}/version.py"))).read_text()
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
            version = found.group(1) if found else version
        out[name] = str(version)
    return out


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``landscape`` version plus the git commit (``+dirty`` when the tree has changes), when known."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{commit}{'.dirty' if dirty else ''}"


def die_with_parent(parent: int | None = None, interval: float = 0.5) -> None:
    """Make this (worker) process exit when its parent dies, even by SIGKILL.

    On Linux the kernel sends SIGKILL at the parent's death (``prctl(PR_SET_PDEATHSIG)``); everywhere a daemon
    thread also checks every ``interval`` seconds whether the process has been re-parented. A worker blocked
    on a pipe to a dead parent would otherwise live on (and keep multiprocessing's resource tracker alive).
    """
    parent = os.getppid() if parent is None else parent
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
