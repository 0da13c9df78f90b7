"""Golden arrays: every analysis of today's code on fixed seeds, saved so a refactor can be checked against them.

Issue 10 reshapes the api / CLI / result code and requires that interpolate, instability, directions,
surface, clipping, symmetry, norms, ntk and ntk-table give identical arrays before and after. This script

1. trains a tiny deterministic Phase 1 / Phase 2 family (``landscape.api.phases``: a small LeNet on 300
   digits, one SGD Phase-1 epoch, then SGD and DP-SGD siblings, two copies each, two epochs) into a
   temporary store,
2. runs each analysis through ``landscape.api`` with small fixed options (:func:`run_analyses`), writing every
   result to an explicit path (no figures),
3. flattens every array of each result file (as ``landscape.results.read_result(path).arrays`` gives them)
   and its numeric scalar attrs, plus every trained checkpoint's weights, into one dict.

Run from the repository root (one torch thread; the script sets it):

    PYTHONPATH=. python tests/golden/make_golden.py          # writes tests/golden/golden.npz (~220 kB)

``tests/test_golden.py`` imports :func:`build` and compares a fresh build with ``golden.npz`` exactly.
Regenerate the file only when a change of the numbers is intended, and say why in the commit message.

Keys of ``golden.npz``:
    ``weights/<run>@step=<N>/<tensor>``   a stored checkpoint's state dict
    ``<analysis>/<array>``                an array of the analysis's result file (``/`` for HDF5 groups)
    ``<analysis>@<attr>``                 a numeric (int/float/bool) scalar attr of the result file, or one of
                                          the content-hash attrs :data:`HASH_ATTRS`
Strings are stored as numpy unicode arrays (bytes decoded as UTF-8, the build directory written ``$WORK``).

Excluded, by name (:data:`EXCLUDED`): timings and dates, which differ on every run (today the attrs
``seconds``, ``throughput``, ``created``), and the versions (``landscape_version``, ``torch_version``).
Other string attrs (``kind``, ``inputs``, ``params``, labels) are not compared.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

GOLDEN = Path(__file__).with_name("golden.npz")

# A key is excluded when any path component (array name or attr name) matches one of these patterns.
EXCLUDED = (
    r".*seconds.*",      # wall-clock timings (surface/directions/ntk timings, training wall_seconds)
    r".*throughput.*",   # points or samples per second
    r"created",          # the result's creation date
    r".*_version",       # landscape_version, torch_version: provenance, not numbers
)
# String attrs that are content hashes of arrays not stored in the file (the surface's random plane, the
# symmetry projection matrix): kept, since equal hashes mean equal directions. Other string attrs (kind,
# labels, JSON of options) are not compared.
HASH_ATTRS = ("plane_sha256", "matrix_fingerprint")
# The machine's floating-point fingerprint (:func:`machine_fingerprint`), saved beside the arrays.
MACHINE_KEY = "machine@fingerprint"
_EXCLUDED_RE = re.compile("|".join(f"(?:{p})" for p in EXCLUDED))

GROUP = "g"  # phases group: runs g-sgd, g-sgd-sgd-{0,1}, g-sgd-dpsgd-{0,1}
SGD_A, SGD_B = f"{GROUP}-sgd-sgd-0@last", f"{GROUP}-sgd-sgd-1@last"
DP_A, DP_B = f"{GROUP}-sgd-dpsgd-0@last", f"{GROUP}-sgd-dpsgd-1@last"


def excluded(key: str) -> bool:
    """True when a key of the golden dict names a timing, a date or a version (see :data:`EXCLUDED`)."""
    parts = re.split(r"[/@]", key)
    return any(_EXCLUDED_RE.fullmatch(p) for p in parts)


def train_runs(root: Path) -> None:
    """Phase 1 (SGD, 1 epoch) -> Phase 2 SGD and DP-SGD (sigma 1.0), 2 copies each, 2 epochs: 5 runs."""
    from landscape.api import PhasesConfig, TrainConfig, phases

    base = TrainConfig(model="lenet", model_kwargs={"channels": [2, 4], "hidden": [16]}, data="digits",
                       subset=300, epochs=3, lr=0.1, momentum=0.9, batch_size=32, seed=3, device="cpu",
                       max_grad_norm=1.0, noise_multiplier=1.0)
    phases(PhasesConfig(base=base, k=1, copies=2, phase1=("sgd",), phase2=("sgd", "dpsgd"), dp_lr=0.5,
                        dp_momentum=0.0, group=GROUP), root=root, progress=False)


def run_analyses(root: Path, out: Path) -> dict[str, Path]:
    """Every analysis of ``landscape.api`` with small fixed options; returns {analysis name: result file}.

    Each result goes to an explicit ``output`` path, so the check does not depend on default file names or
    on what a function returns. Several analyses run twice with different options to cover more routes
    (subset, filter-normalised directions, a checkpoint plane, layerwise clipping, float64 and output NTKs).
    """
    from landscape import api
    from landscape.api import DirectionsConfig, InterpolateConfig, SurfaceConfig

    common: dict[str, Any] = {"root": root, "figure": False}
    files: dict[str, Path] = {}

    def path(name: str) -> Path:
        files[name] = out / f"{name}.h5"
        return files[name]

    api.interpolate(DP_A, DP_B, config=InterpolateConfig(points=7), output=path("interpolate"), **common)
    api.interpolate(f"{GROUP}-sgd@last", SGD_A, config=InterpolateConfig(points=5, split=("test",), subset=100),
                    output=path("interpolate_subset"), **common)
    api.instability(pairs=f"{SGD_A}:{SGD_B},{DP_A}:{DP_B}", config=InterpolateConfig(points=5),
                    output=path("instability"), **common)
    api.directions(SGD_A, toward=SGD_B, config=DirectionsConfig(directions=3, points=5, subset=200),
                   output=path("directions"), **common)
    api.directions(DP_A, config=DirectionsConfig(directions=2, points=4, distance=0.5, normalize="filter", split="test"),
                   output=path("directions_filter"), **common)
    api.surface(SGD_A, config=SurfaceConfig(grid="4x3", subset=200), output=path("surface"), **common)
    api.surface(SGD_A, config=SurfaceConfig(plane=f"{SGD_B},{DP_A}", grid="3x3", split=("test",)),
                output=path("surface_plane"), **common)
    api.clipping(f"{GROUP}-sgd-dpsgd-0", max_grad_norm=0.5, batch_size=64, batches=2, output=path("clipping"),
                 **common)
    api.clipping(SGD_A, clip_style="layerwise", batch_size=64, output=path("clipping_layerwise"), **common)
    api.symmetry(f"{GROUP}-sgd", projections=4, subset=100, permutations=49, output=path("symmetry"), **common)
    api.norms([f"{GROUP}-sgd-sgd-0", f"{GROUP}-sgd-dpsgd-0"], bins=10, subset=32, output=path("norms"),
              **common)
    api.ntk(DP_A, subset=16, output=path("ntk"), **common)
    api.ntk(SGD_A, subset=12, clip_style="layerwise", max_grad_norm=0.1, precision="float64", output=path("ntk_layerwise"),
            **common)
    api.ntk(f"{GROUP}-sgd@init", subset=3, kernel="output", clip_style="flat", max_grad_norm=0.5, output=path("ntk_output"),
            **common)
    api.ntk_table(f"{GROUP}-sgd", subset=10, max_grad_norms=(0.1, 1.0), output=path("ntk_table"), **common)
    return files


def _plain(value: Any, workdir: Path) -> np.ndarray:
    """An array as saved in the npz: string arrays become unicode, with the build directory written ``$WORK``."""
    a = np.asarray(value)
    if a.dtype.kind in "OSU":
        def text(v: Any) -> str:
            return (v.decode() if isinstance(v, bytes) else str(v)).replace(str(workdir), "$WORK")

        a = np.vectorize(text, otypes=[str])(a) if a.size else a.astype(str)
    return a


def result_arrays(name: str, path: Path, workdir: Path) -> dict[str, np.ndarray]:
    """The arrays and numeric scalar attrs of one result file, keyed ``name/array`` and ``name@attr``."""
    from landscape.results import read_result

    result = read_result(path)
    flat = {f"{name}/{k}": _plain(v, workdir) for k, v in result.arrays.items()}
    for k, v in result.attrs.items():
        if isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating)) or k in HASH_ATTRS:
            flat[f"{name}@{k}"] = _plain(v, workdir)
    return {k: v for k, v in flat.items() if not excluded(k)}


def weights(root: Path) -> dict[str, np.ndarray]:
    """Every checkpoint's state dict in the store, keyed ``weights/<run>@step=<N>/<tensor>``."""
    from landscape.store import Store

    store = Store(root)
    flat: dict[str, np.ndarray] = {}
    for run in sorted(store.run_names()):
        for info in store.run(run).checkpoints():
            ckpt = store.load(f"{run}@step={info.step}")
            for k, v in ckpt.state_dict.items():
                flat[f"weights/{run}@step={info.step}/{k}"] = v.detach().cpu().numpy()
    return flat


def build(workdir: str | Path) -> tuple[dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Train into ``workdir/store``, analyse into ``workdir/results``: (weights, {analysis: its arrays}).

    Runs with one torch thread (restored afterwards): reductions then have one fixed order.
    """
    import torch

    workdir = Path(workdir).resolve()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root, out = workdir / "store", workdir / "results"
        train_runs(root)
        w = weights(root)
        files = run_analyses(root, out)
        return w, {name: result_arrays(name, p, workdir) for name, p in files.items()}
    finally:
        torch.set_num_threads(threads)


def machine_fingerprint() -> str:
    """sha256 of what this machine's torch kernels give for a fixed LeNet-sized step (no landscape code).

    Different CPUs (AVX2 / AVX-512 dispatch, MKL and oneDNN code paths) round convolutions, matrix products and
    reductions differently in the last bit; training amplifies that, so the saved weights are bit-identical
    only on a machine whose kernels round as the saving machine's did. This probe runs the kernels training
    uses (conv2d, max-pool, linear, log-softmax, their backward passes, an SGD update; one thread, float32 and
    float64) on seeded data and hashes the results: equal fingerprints mean the exact comparison applies.
    """
    import hashlib

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        digest = hashlib.sha256()
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(64, 1, 8, 8, generator=g, dtype=torch.float64).to(dtype)
            y = torch.randint(0, 10, (64,), generator=g)
            conv1 = torch.randn(6, 1, 3, 3, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
            conv2 = torch.randn(16, 6, 3, 3, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
            lin = torch.randn(10, 16 * 2 * 2, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
            h = torch.nn.functional.max_pool2d(torch.tanh(torch.nn.functional.conv2d(x, conv1, padding=1)), 2)
            h = torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(h, conv2, padding=1)), 2)
            loss = torch.nn.functional.cross_entropy(h.flatten(1) @ lin.T, y)
            loss.backward()
            with torch.no_grad():
                for p in (conv1, conv2, lin):
                    p.sub_(0.1 * p.grad)
                    digest.update(p.grad.numpy().tobytes())
                    digest.update(p.numpy().tobytes())
            digest.update(loss.detach().numpy().tobytes())
        return digest.hexdigest()
    finally:
        torch.set_num_threads(threads)


def flatten(w: dict[str, np.ndarray], results: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    flat = {MACHINE_KEY: np.array(machine_fingerprint())}
    flat.update(w)
    for arrays in results.values():
        flat.update(arrays)
    return flat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=GOLDEN, help=f"output .npz (default {GOLDEN})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="landscape-golden-") as tmp:
        flat = flatten(*build(tmp))
    np.savez_compressed(args.out, **flat)
    print(f"{args.out}: {len(flat)} arrays, {args.out.stat().st_size / 1024:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, when run as a script
    sys.exit(main())
