"""Process-wide runtime settings: threads, device, seeds, portable mode, and the code version recorded in every
file."""

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

from landscape.errors import OptionError, UsageError, param

if TYPE_CHECKING:
    import torch

THREADS_ENV = "LANDSCAPE_THREADS"
DATA_ENV = "LANDSCAPE_DATA"  # where torchvision data sets live (landscape.data)


def set_threads(threads: int | None = None) -> int | None:
    """Set torch's intra-op threads from ``threads``, else ``$LANDSCAPE_THREADS`` (None: torch's default).
    Before torch loads, ``$OMP_NUM_THREADS`` is set instead: torch is not imported for it."""
    if threads is None:
        env = os.environ.get(THREADS_ENV)
        if env is None:
            return None
        try:
            threads = int(env)
        except ValueError:
            raise UsageError(f"${THREADS_ENV} must be a positive integer, got {env!r}") from None
    if threads < 1:
        raise OptionError("threads", f"must be >= 1, got {threads}")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


_DEVICE_NAME = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device_name(name: str) -> str:
    """The one rule for a ``--device`` value: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (a GPU is checked for
    when the device is used, :func:`resolve_device`)."""
    if not _DEVICE_NAME.match(str(name)):
        raise OptionError("device", f"must be auto, cpu, cuda or cuda:N, got {name!r}")
    return str(name)


_DEVICE: contextvars.ContextVar[str] = contextvars.ContextVar("landscape_device", default="auto")


@contextlib.contextmanager
def using_device(name: str) -> Iterator[None]:
    """``auto`` means ``name`` inside the block (``figures --device``, ``demo --device``)."""
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
    """``auto`` -> :func:`default_device`, cuda when present, else cpu (always cpu in portable mode); ``cuda``
    without a GPU, or in portable mode, is a usage error."""
    import torch

    if device is None or str(device) == "auto":
        device = _DEVICE.get()
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() and not _PORTABLE else "cpu")
    if _PORTABLE and str(device).startswith("cuda"):
        raise UsageError(f"{param('device', str(device))}: portable mode computes on the CPU (GPUs round as their "
                         f"model does); use {param('device', 'cpu')} or leave portable mode")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise OptionError("device", f"must be auto, cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{param('device', 'cuda')} was asked for but no CUDA device is available; use {param('device', 'cpu')}")
    return dev


@contextlib.contextmanager
def math_attention() -> Iterator[None]:
    """Attention by its math form inside the block: the same function as PyTorch's fused kernels, with every
    derivative (the fused ones have no forward-mode rule, second derivative or vmap rule); for every
    ``torch.func`` transform of a model. The process-wide fast-path switch is restored on exit."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


# ------------------------------------------------------------------------------------------ portable mode

PORTABLE_ENV = "LANDSCAPE_PORTABLE"

#: What portable mode sets in the environment before torch and numpy load (their libraries read it once, when
#: they start): the code paths that every x86-64 CPU runs alike, instead of the fastest for this one.
PORTABLE_SETTINGS = {
    "ATEN_CPU_CAPABILITY": "default",  # torch's own kernels as compiled for any x86-64, not their AVX2 / AVX-512 ones
    "MKL_CBWR": "COMPATIBLE",  # MKL (torch's matrix products): its reproducible code path for any x86-64 CPU
    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",  # one thread: one order of every reduction
    "OPENBLAS_NUM_THREADS": "1",
    "OPENBLAS_CORETYPE": "Prescott",  # numpy's / scipy's OpenBLAS: kernels for any x86-64, not this CPU's
    # numpy's loops for its baseline, not the AVX2 / AVX-512 ones (exp, log, tanh, sin... differ in the last bit);
    # the names of numpy >= 2.4 and of earlier versions (numpy ignores names it does not know)
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_KNL AVX512_KNM "
                                "AVX512_SKX AVX512_CLX AVX512_CNL AVX2 FMA3 F16C AVX",
}

_PORTABLE = False  # use_portable() succeeded in this process


def portable_requested() -> bool:
    """Whether ``$LANDSCAPE_PORTABLE`` asks for portable mode (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get(PORTABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def use_portable() -> None:
    """Portable mode: every float kernel pinned to a code path any x86-64 CPU runs alike, so a seed gives
    bit-identical results on every machine (docs/reproducibility.md). A process whose torch or numpy loaded
    without :data:`PORTABLE_SETTINGS` is a UsageError that says how to start it."""
    global _PORTABLE
    before = {key: os.environ.get(key) for key in (*PORTABLE_SETTINGS, PORTABLE_ENV)}
    for key, value in PORTABLE_SETTINGS.items():  # read by a library when it loads: only before it is
        if ("numpy" if key.startswith(("NPY_", "OPENBLAS_")) else "torch") not in sys.modules:
            os.environ[key] = value
    os.environ[PORTABLE_ENV] = "1"  # the processes this one starts (workers) are portable too
    import torch

    problems = [p for p in _portable_problems(torch) if not p.startswith("torch uses")]
    if problems:  # refused: the environment is left as it was (a later command of this process is not portable)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise UsageError(f"portable mode must be chosen before torch and numpy are loaded, and this process loaded "
                         f"them without it ({', '.join(problems[:3])}{more}): start the process with "
                         f"{PORTABLE_ENV}=1, or call landscape.runtime.use_portable() before importing torch")
    torch.backends.mkldnn.enabled = False
    torch.backends.nnpack.set_flags(False)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    _PORTABLE = True


def _portable_problems(torch) -> list[str]:  # noqa: ANN001 -- the torch module
    """What in this process is not as portable mode pins it (empty: portable)."""
    problems = []
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "DEFAULT":
        problems.append(f"torch runs its {capability} kernels")
    problems += [f"${k} is not {v}" for k, v in PORTABLE_SETTINGS.items()
                 if k not in ("NPY_DISABLE_CPU_FEATURES", "ATEN_CPU_CAPABILITY") and os.environ.get(k) != v]
    umath = sys.modules.get("numpy._core._multiarray_umath") or sys.modules.get("numpy.core._multiarray_umath")
    if umath is not None:  # numpy is loaded: the loops it dispatches to
        on = [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]
        if on:
            problems.append(f"numpy runs its {'/'.join(on)} loops")
    if torch.backends.mkldnn.enabled:
        problems.append("torch uses oneDNN")
    if torch._C._get_nnpack_enabled():
        problems.append("torch uses NNPACK")
    if torch.get_num_threads() != 1:
        problems.append(f"torch uses {torch.get_num_threads()} threads")
    if not torch.are_deterministic_algorithms_enabled():
        problems.append("torch uses nondeterministic algorithms")
    return problems


def local_only(what: str) -> None:
    """A UsageError in portable mode: ``what`` (a Dask cluster) computes where no kernels are pinned."""
    if portable_mode():
        raise UsageError(f"{what}: portable mode computes in this machine's processes only ({param('workers')}), not on "
                         "a cluster whose workers choose their own kernels")


def portable_mode() -> bool:
    """Whether this process is in portable mode now (nothing pinned changed since); results record it."""
    torch = sys.modules.get("torch")
    return _PORTABLE and (torch is None or not _portable_problems(torch))


def kernels() -> str:
    """The float kernels this process computes with, in words (a summary records it beside ``portable``)."""
    import torch

    onednn = (f"up to {os.environ.get('ONEDNN_MAX_CPU_ISA') or os.environ.get('DNNL_MAX_CPU_ISA') or 'the CPU ISA'}"
              if torch.backends.mkldnn.enabled else "off")
    return (f"torch {torch.backends.cpu.get_cpu_capability()}, oneDNN {onednn}, "
            f"MKL {os.environ.get('MKL_CBWR') or 'auto'}, {torch.get_num_threads()} thread(s)")


def _version() -> str:
    """``landscape.__version__``, read from the loaded package (it imports this module in portable mode)."""
    return sys.modules["landscape"].__version__


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - seeds legacy global-state users too
    torch.manual_seed(seed)


#: The packages whose versions every run and result records (when installed; read from their metadata, so
#: none is imported for it: Opacus, a test reference, stays unloaded).
ENVIRONMENT_PACKAGES = ("torch", "torchvision", "opacus", "numpy", "dp-accounting")


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, str]:
    """The versions of python and the installed :data:`ENVIRONMENT_PACKAGES` a run or result is made with,
    read without importing anything (``version.py``'s, which carries torch's build, else the metadata's)."""
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
        return _version()
    return f"{_version()}+g{commit}{'.dirty' if dirty else ''}"


def die_with_parent(parent: int | None = None, interval: float = 0.5) -> None:
    """Make this (worker) process exit when its parent dies, even by SIGKILL (``PR_SET_PDEATHSIG`` on Linux,
    and a thread that watches for re-parenting): a worker blocked on a pipe to a dead parent would live on."""
    parent = os.getppid() if parent is None else parent
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
