"""What one checkpoint save costs, by the way its HDF5 file is written (a full disk must be one error line, never
a crash: :mod:`landscape.atomic`).

``Run.save_checkpoint`` of a LeNet (MNIST-sized, 0.2 MiB) and of a ResNet-18-sized state dict (torchvision's
``resnet18(weights=None)``, 44.6 MiB), each a fresh step of its own run (checkpoint file, sha256, manifest, four
fsyncs), run interleaved in one process (one torch thread), the file written:

- ``guarded (store)``: as the store writes it, through :func:`landscape.atomic.atomic_write_hdf5` (h5py's
  ``fileobj`` driver over the temporary file; a refused write is kept from HDF5; the sha256 read back while the
  file is fsynced).
- ``h5py file``: h5py writing the temporary file itself (its default ``sec2`` driver): how the store wrote
  before, which crashes the process when a write fails (HDF5 cannot close the file; h5py then segfaults).
- ``in memory``: the whole file built in memory (HDF5's ``core`` driver, no backing store), its image then
  written with :func:`landscape.atomic.atomic_write`: the other way to keep a failed write from HDF5.
- ``torch.save + fsync``: the reference of a durable plain save (file and directory fsynced), not a store write.
- ``sha256 (file)`` and ``sha256 (memory)``: the part of a save that hashes the checkpoint (its sha256 goes into
  the manifest), read back from the page cache as the store does, and of the same bytes already in memory: what
  a hash computed while writing could at best cost (HDF5 does not write a file in order, so a running hash of
  its writes is not the file's).

Printed: median milliseconds per save, ms per MiB, and the per-round ratios of each to ``h5py file`` (median and
min-max). The machine is usually shared: quote ratios, and run this on an idle machine for numbers.

    OMP_NUM_THREADS=1 python benchmarks/store_write.py [--repeats 30] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _common import interleaved, one_thread, ratios

import landscape.store.core as core
from landscape import atomic
from landscape.hashing import sha256_file
from landscape.store import Store


def plain_h5py(path, fill, hasher=None, **options):
    """The store's write before: h5py writes the temporary file itself."""
    import h5py

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w", **options) as f:
            fill(f, lambda: None)

    return atomic.atomic_write(path, write, hasher=hasher)


_names = itertools.count()


def in_memory(path, fill, hasher=None, **options):
    """The file built in memory (HDF5's core driver), its image written atomically."""
    import h5py

    f = h5py.File(f"image-{os.getpid()}-{next(_names)}", "w", driver="core", backing_store=False, **options)
    try:
        fill(f, lambda: None)
        f.flush()
        image = f.id.get_file_image()
    finally:
        f.close()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as out:
            out.write(image)

    return atomic.atomic_write(path, write, hasher=hasher)


WRITERS = {"guarded (store)": atomic.atomic_write_hdf5, "h5py file": plain_h5py, "in memory": in_memory}


def states() -> dict:
    import torch
    import torchvision

    from landscape.models import lenet

    torch.manual_seed(0)
    return {"LeNet": lenet((1, 28, 28), 10).state_dict(),
            "ResNet-18": torchvision.models.resnet18(weights=None).state_dict()}


def measure(label: str, state: dict, root: Path, repeats: int) -> None:
    """Time each writer's save (and torch.save + fsync) of ``state`` interleaved; print the table."""
    import torch

    mib = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    here = root / label
    store = Store(here)
    runs = {name: store.create_run(f"r{i}", config={}, seeds={}, model_spec={}, data_spec={})
            for i, name in enumerate(WRITERS)}
    steps = itertools.count()

    def save(name: str):
        def call() -> None:
            core.atomic_write_hdf5 = WRITERS[name]
            runs[name].save_checkpoint(state, step=next(steps), epoch=0.0)
        return call

    def torch_save() -> None:
        path = here / f"torch-{next(steps)}.pt"
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        atomic.fsync_dir(path.parent)

    def tidy(name: str) -> None:  # each method meets an equally empty directory
        for path in [*here.glob("r*/step-*.h5"), *here.glob("torch-*.pt")]:
            path.unlink()

    kept = store.create_run("hashed", config={}, seeds={}, model_spec={}, data_spec={})
    hashed = kept.save_checkpoint(state, step=0, epoch=0.0)
    image = hashed.read_bytes()
    kept.close()

    repeats = repeats if mib < 1 else max(5, repeats // 3)
    try:
        times = interleaved({**{name: save(name) for name in WRITERS}, "torch.save + fsync": torch_save,
                             "sha256 (file)": lambda: sha256_file(hashed),
                             "sha256 (memory)": lambda: hashlib.sha256(image).hexdigest()},
                            repeats=repeats, after=tidy)
    finally:
        core.atomic_write_hdf5 = atomic.atomic_write_hdf5
        for run in runs.values():
            run.close()
    print(f"\n{label} ({mib:.1f} MiB), {repeats} rounds")
    print(f"  {'writer':<20} {'median ms':>10} {'ms/MiB':>8} {'x h5py file':>12} {'(min-max)':>14}")
    for name, values in times.items():
        med = statistics.median(values)
        r = ratios(times, name, "h5py file")
        print(f"  {name:<20} {1e3 * med:10.2f} {1e3 * med / mib:8.2f} {statistics.median(r):12.2f} "
              f"  ({min(r):.2f}-{max(r):.2f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="rounds for LeNet (ResNet-18: a third, >= 5)")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    one_thread()
    root = Path(tempfile.mkdtemp(prefix="landscape-store-write-", dir=args.dir))
    try:
        for label, state in states().items():
            measure(label, state, root, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
