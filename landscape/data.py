"""Data sets by name, returned as tensors with a train and a test split.

Every data set is deterministic given its seed and its options; ``Dataset.spec`` records both, so
``dataset_from_spec(spec)`` rebuilds the same tensors bit for bit (files on disk permitting). Images are
``N x C x H x W`` float32, vectors ``N x D`` float32, labels int64 class indices (user data with integer
inputs, e.g. token ids, keeps them as int64).

Registered names (``DATASETS``):

- ``gaussian-signal``: the signal/noise data of Watson et al. Sec. 3.2, eqs. (6)-(9).
- ``digits``: scikit-learn's bundled 8x8 digits (no download), with a fixed stratified train/test split.
- ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``: torchvision's files from ``data_root``
  (else ``$LANDSCAPE_DATA``); fetched only when ``download=True``.

Beyond the registry, :func:`load_dataset` takes (one resolution for all, see :func:`_other_source`):

- a tensor file ``path.npz`` / ``path.h5`` with ``x_train, y_train, x_test, y_test``;
- ``imagefolder``: torchvision ``ImageFolder`` trees ``DATA_ROOT/train`` and ``DATA_ROOT/test``;
- any torchvision classification set by its lower-case class name (``svhn``, ``kmnist``, ``stl10``, ...)
  from ``data_root`` (never downloaded unless ``download=True``);
- an installed entry point of the group ``landscape.datasets``, or code the user names,
  ``module:factory`` / ``file.py:factory`` (:func:`user_arrays`).

Their specs record where the data came from: ``"source": {"path", "sha256"[, "files"]}`` (a directory's sha256
is that of the manifest of its files' hashes), ``"entry_point"`` (package, version) or ``"code"`` (reference and
source sha256); rebuilding checks them, and runs code only when the user named it again.

``subset`` (an int count or a float fraction) draws a seeded, stratified sample of the *train* split; the
test split is never subsampled. Adding a built-in data set is one builder function plus one line in
``DATASETS``.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.errors import DataError
from landscape.runtime import DATA_ENV


@dataclass
class Dataset:
    """A data set held as tensors: float32 inputs (int64 for token ids), int64 labels in ``0..num_classes-1``."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    spec: dict

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-example shape, e.g. ``(1, 8, 8)`` for digits or ``(100,)`` for gaussian-signal."""
        return tuple(self.x_train.shape[1:])

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of the ``"train"`` or ``"test"`` split."""
        if which == "train":
            return self.x_train, self.y_train
        if which == "test":
            return self.x_test, self.y_test
        raise DataError(f"unknown split {which!r}; use 'train' or 'test'")


@dataclass
class _Arrays:
    """What a builder returns: both splits and the class count."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int


# ---------------------------------------------------------------------------------------------- sampling


def _stratified_counts(class_sizes: np.ndarray, size: int) -> np.ndarray:
    """Per-class counts summing to ``size``, each within 1 of the exact share (largest remainder)."""
    total = int(class_sizes.sum())
    exact = class_sizes * size / total
    counts = np.floor(exact).astype(np.int64)
    remainder = exact - counts
    missing = size - int(counts.sum())
    order = np.argsort(-remainder, kind="stable")
    counts[order[:missing]] += 1
    return counts


def _subset_value(size: Any) -> int | float:
    """``size`` as a plain int (a count) or float (a fraction); anything else is a DataError."""
    if isinstance(size, bool) or not isinstance(size, (int, float, np.integer, np.floating)):
        raise DataError(f"subset must be a count (int) or a fraction (float), got {size!r}")
    return float(size) if isinstance(size, (float, np.floating)) else int(size)


def _resolve_size(size: int | float, total: int) -> int:
    size = _subset_value(size)
    if isinstance(size, float):
        if not 0.0 < size <= 1.0:
            raise DataError(f"subset fraction must be in (0, 1], got {size}; give a count as an integer")
        count = int(round(size * total))
        if count < 1:
            raise DataError(f"subset fraction {size} of {total} examples selects none; use a larger fraction")
        return count
    count = size
    if not 1 <= count <= total:
        raise DataError(f"subset count must be between 1 and {total} (the split's size), got {count}")
    return count


def subset_indices(y: torch.Tensor, size: int | float, seed: int) -> torch.Tensor:
    """Sorted indices of a seeded, stratified sample of ``size`` examples (a count, or a fraction of ``len(y)``).

    Each class gets its exact share ``size * n_c / n`` rounded down, and the leftover places go to the
    classes with the largest remainders, so every class count is within 1 of its exact share. Within a
    class the examples are drawn without replacement with ``numpy.random.default_rng(seed)``.
    """
    labels = np.asarray(torch.as_tensor(y).cpu().numpy()).reshape(-1)
    count = _resolve_size(size, len(labels))
    classes, inverse = np.unique(labels, return_inverse=True)
    counts = _stratified_counts(np.bincount(inverse, minlength=len(classes)), count)
    rng = np.random.default_rng(seed)
    chosen = [
        rng.choice(np.flatnonzero(inverse == c), size=int(k), replace=False)
        for c, k in enumerate(counts)
    ]
    return torch.from_numpy(np.sort(np.concatenate(chosen))).to(torch.int64)


# ---------------------------------------------------------------------------------------------- builders


def gaussian_signal(
    *,
    seed: int,
    ds: int = 10,
    dn: int = 90,
    n: int = 1000,
    n_test: int = 1000,
    noise: float = 1.0,
    signal: float = 2.0,
    key: str = "ones",
    **_: Any,
) -> _Arrays:
    """Watson et al. Sec. 3.2, eqs. (6)-(9): ``x = (x_s, x_n)``, ``x_s ~ N(y v, s^2 I_ds)``, ``x_n ~ N(0, s^2 I_dn)``.

    ``y`` is uniform on {-1, +1} and becomes class 0 (y = -1) or 1 (y = +1); ``s`` is ``noise``. The key
    vector ``v`` has norm ``signal``: ``key="ones"`` gives ``v = signal * 1 / sqrt(ds)`` (the same for every
    seed), ``key="random"`` a uniformly random direction drawn from the seed. Train, test and key use
    independent streams ``default_rng([seed, 0|1|2])``, so ``n`` does not change the test set.
    """
    ds, dn, n, n_test = (_integer(v, k, low) for v, k, low in ((ds, "ds", 1), (dn, "dn", 0), (n, "n", 1),
                                                              (n_test, "n_test", 1)))
    noise, signal = _real(noise, "noise"), _real(signal, "signal")
    if key == "ones":
        v = np.full(ds, signal / math.sqrt(ds))
    elif key == "random":
        direction = np.random.default_rng([seed, 2]).standard_normal(ds)
        v = signal * direction / np.linalg.norm(direction)
    else:
        raise DataError(f"gaussian-signal option key must be 'ones' or 'random', got {key!r}")

    def draw(count: int, stream: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([seed, stream])
        y = rng.integers(0, 2, size=count)
        x = noise * rng.standard_normal((count, ds + dn))
        x[:, :ds] += np.outer(2 * y - 1, v)
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))

    x_train, y_train = draw(n, 0)
    x_test, y_test = draw(n_test, 1)
    return _Arrays(x_train, y_train, x_test, y_test, 2)


def _integer(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or int(value) != value or value < low:
        raise DataError(f"gaussian-signal option {name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value < 0:
        raise DataError(f"gaussian-signal option {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def gaussian_signal_key(spec_or_dataset: dict | Dataset) -> torch.Tensor:
    """The key vector ``v`` (length ``ds``) of a gaussian-signal data set, from its spec."""
    spec = spec_or_dataset.spec if isinstance(spec_or_dataset, Dataset) else spec_or_dataset
    opts = spec["options"]
    ds, signal = opts["ds"], opts["signal"]
    if opts["key"] == "ones":
        v = np.full(ds, signal / math.sqrt(ds))
    else:
        direction = np.random.default_rng([spec["seed"], 2]).standard_normal(ds)
        v = signal * direction / np.linalg.norm(direction)
    return torch.from_numpy(v)


def _standardize(x_train: torch.Tensor, x_test: torch.Tensor, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, -1) + (1,) * (x_train.dim() - 2)
    mean = torch.as_tensor(mean, dtype=torch.float32).reshape(shape)
    std = torch.as_tensor(std, dtype=torch.float32).reshape(shape)
    return (x_train - mean) / std, (x_test - mean) / std


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``load_digits()``'s ``images`` (1797 x 8 x 8) and ``target``, read from the file scikit-learn ships.

    ``sklearn.datasets`` takes ~0.8 s to import (every process that loads digits paid it: each CLI command,
    batch worker and test process); the data is one small gzipped CSV inside the installed package, which
    ``load_digits`` itself reads with ``np.loadtxt``. When the file is not where scikit-learn keeps it, this
    falls back to ``load_digits`` (``tests/test_data.py`` checks both give the same arrays).
    """
    import gzip
    import importlib.util

    found = importlib.util.find_spec("sklearn")  # locates the package without importing it
    locations = list(found.submodule_search_locations or []) if found is not None else []
    path = Path(locations[0], "datasets", "data", "digits.csv.gz") if locations else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def digits(*, seed: int, test_fraction: float = 0.25, split_seed: int = 0, standardize: bool = True,
           **_: Any) -> _Arrays:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes) as ``1 x 8 x 8`` tensors.

    The train/test split is stratified and fixed by ``split_seed`` (not by ``seed``, so runs with different
    seeds share one test set); 1/4 test gives 1,348 train and 449 test images. With ``standardize`` the
    pixels are shifted and scaled by the mean and standard deviation of all train pixels (one channel).
    """
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) \
            or not 0.0 < test_fraction < 1.0:
        raise DataError(f"digits option test_fraction must be in (0, 1), got {test_fraction!r}")
    images, target = digits_arrays()
    x = torch.from_numpy(images.astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(target.astype(np.int64))
    test = subset_indices(y, float(test_fraction), split_seed)
    train_mask = torch.ones(len(y), dtype=torch.bool)
    train_mask[test] = False
    x_train, y_train, x_test, y_test = x[train_mask], y[train_mask], x[test], y[test]
    if standardize:
        x_train, x_test = _standardize(x_train, x_test, x_train.mean(), x_train.std())
    return _Arrays(x_train, y_train, x_test, y_test, 10)


@dataclass(frozen=True)
class _TorchvisionInfo:
    cls: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


_TORCHVISION = {
    "mnist": _TorchvisionInfo("MNIST", 10, (0.1307,), (0.3081,)),
    "fashion-mnist": _TorchvisionInfo("FashionMNIST", 10, (0.2860,), (0.3530,)),
    "cifar10": _TorchvisionInfo("CIFAR10", 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": _TorchvisionInfo("CIFAR100", 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def data_root_of(data_root: str | os.PathLike | None) -> Path | None:
    """``data_root`` if given, else ``$LANDSCAPE_DATA``, else None."""
    if data_root is not None:
        return Path(data_root)
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else None


def _torchvision_split(name: str, root: Path, train: bool, download: bool):
    import torchvision.datasets

    info = _TORCHVISION[name]
    cls = getattr(torchvision.datasets, info.cls)
    try:
        return cls(root=str(root), train=train, download=download)
    except RuntimeError as exc:
        if download:
            raise DataError(f"could not download {name} into {root}: {exc}") from None
        raise DataError(
            f"{name} files not found under {root}; pass --data-root DIR holding them, or add --download to fetch them"
        ) from None
    except OSError as exc:
        raise DataError(f"could not read or download {name} under {root}: {exc}") from None


def _images_tensor(data) -> torch.Tensor:
    """torchvision's raw ``data`` (uint8, N x H x W or N x H x W x C) -> float32 N x C x H x W in [0, 1]."""
    x = torch.as_tensor(np.asarray(data))
    x = x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return x.to(torch.float32).div_(255.0).contiguous()


def _torchvision_builder(name: str) -> Callable[..., _Arrays]:
    info = _TORCHVISION[name]

    def build(*, seed: int, data_root=None, download: bool = False, standardize: bool = True, **_: Any) -> _Arrays:
        root = data_root_of(data_root)
        if root is None:
            raise DataError(
                f"{name} is read from disk: pass --data-root DIR (or set ${DATA_ENV}), and --download to fetch it"
            )
        train = _torchvision_split(name, root, True, download)
        test = _torchvision_split(name, root, False, download)
        x_train, x_test = _images_tensor(train.data), _images_tensor(test.data)
        if standardize:
            x_train, x_test = _standardize(x_train, x_test, info.mean, info.std)
        y_train = torch.as_tensor(np.asarray(train.targets), dtype=torch.int64)
        y_test = torch.as_tensor(np.asarray(test.targets), dtype=torch.int64)
        return _Arrays(x_train, y_train, x_test, y_test, info.num_classes)

    build.__doc__ = (
        f"torchvision's {info.cls} from ``data_root``; standardised with the usual channel means {info.mean} "
        f"and standard deviations {info.std}."
    )
    return build


DATASETS: dict[str, Callable[..., _Arrays]] = {
    "gaussian-signal": gaussian_signal,
    "digits": digits,
    "mnist": _torchvision_builder("mnist"),
    "fashion-mnist": _torchvision_builder("fashion-mnist"),
    "cifar10": _torchvision_builder("cifar10"),
    "cifar100": _torchvision_builder("cifar100"),
}

_CALL_ARGS = ("seed", "data_root", "download")

ENTRY_POINT_GROUP = "landscape.datasets"
TENSOR_SUFFIXES = (".npz", ".h5", ".hdf5")
TENSOR_KEYS = ("x_train", "y_train", "x_test", "y_test")
IMAGEFOLDER = "imagefolder"


def dataset_options(name: str) -> dict[str, Any]:
    """The options ``name`` accepts, with their defaults."""
    builder = _builder(name)
    return {
        p.name: p.default
        for p in inspect.signature(builder).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name not in _CALL_ARGS
    }


def _builder(name: str) -> Callable[..., _Arrays]:
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise DataError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}") from None


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    subset: int | float | None = None,
    data_root: str | os.PathLike | None = None,
    download: bool = False,
    **options: Any,
) -> Dataset:
    """Build the data set ``name`` with ``options``; ``subset`` samples the train split (stratified, by ``seed``).

    ``name`` is a built-in (:data:`DATASETS`), a tensor file (``.npz`` / ``.h5`` with ``x_train, y_train,
    x_test, y_test``), ``"imagefolder"`` (``data_root`` holds ``train/`` and ``test/`` ImageFolder trees), a
    torchvision classification set by its lower-case class name (``svhn``, ``kmnist``, ...; read from
    ``data_root``), an installed ``landscape.datasets`` entry point, or a code reference ``module:factory`` /
    ``file.py:factory`` (naming it here is what lets it run; see :func:`user_arrays` for what a factory may
    return). Unknown names and options raise :class:`DataError`; so do image sets whose files are not under
    ``data_root`` (else ``$LANDSCAPE_DATA``) unless ``download`` is set.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"data seed must be an integer, got {seed!r}")
    seed = int(seed)
    if subset is not None:
        subset = _subset_value(subset)
    if isinstance(name, str) and name in DATASETS:
        builder = _builder(name)
        accepted = dataset_options(name)
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            known = ", ".join(accepted) or "none"
            raise DataError(f"data set {name!r} has no option {', '.join(map(repr, unknown))}; its options: {known}")
        filled = {**accepted, **options}
        arrays = builder(seed=seed, data_root=data_root, download=download, **filled)
        provenance: dict[str, Any] = {}
    else:
        name, arrays, filled, provenance = _other_source(name, seed, data_root, download, options, stored=None)
    return _assemble(name, arrays, seed, subset, filled, provenance)


def _assemble(name: str, arrays: _Arrays, seed: int, subset, options: dict, provenance: dict) -> Dataset:
    x_train, y_train = arrays.x_train, arrays.y_train
    if subset is not None:
        keep = subset_indices(y_train, subset, seed)
        x_train, y_train = x_train[keep], y_train[keep]
    spec = {"name": name, "seed": seed, "subset": subset, "options": _jsonable(options), **provenance}
    return Dataset(name, x_train.contiguous(), y_train.contiguous(), arrays.x_test.contiguous(),
                   arrays.y_test.contiguous(), arrays.num_classes, spec)


def dataset_from_spec(spec: dict, *, data_root: str | os.PathLike | None = None, download: bool = False) -> Dataset:
    """Rebuild the data set a ``Dataset.spec`` describes.

    A file or directory source must still have its recorded sha256 (a tensor file found at the recorded path,
    or under ``data_root`` by name); code (``"code"``) runs only when the user named it in this context
    (:func:`landscape.plugins.checked_code`); a spec is never a reason to import anything by itself.
    """
    if not isinstance(spec, dict) or "name" not in spec:
        raise DataError(f"a data spec is a dict with 'name', 'seed', 'subset', 'options'; got {spec!r}")
    options = dict(spec.get("options") or {})
    name, seed, subset = spec["name"], spec.get("seed", 0), spec.get("subset")
    if not any(k in spec for k in ("code", "entry_point", "source")):
        if not isinstance(name, str) or name not in DATASETS:
            raise DataError(f"unknown data set {name!r} in a stored spec; known: {', '.join(DATASETS)} (data from "
                            "files or code records its source, which this spec does not)")
        return load_dataset(name, seed=seed, subset=subset, data_root=data_root, download=download, **options)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"data seed must be an integer, got {seed!r}")
    if subset is not None:
        subset = _subset_value(subset)
    name, arrays, filled, provenance = _other_source(name, int(seed), data_root, download, options, stored=spec)
    return _assemble(name, arrays, int(seed), subset, filled, provenance)


# ------------------------------------------------------------------------------- files, folders and code


def _other_source(name: Any, seed: int, data_root, download: bool, options: dict, *, stored: dict | None):
    """``(spec name, arrays, options, provenance)`` of a data set that is not built in. ``stored`` (a spec read
    back) decides the kind from its provenance, never from the name alone."""
    from landscape import plugins

    if not isinstance(name, str):
        raise DataError(f"a data set name is a string, got {name!r}")
    kind = _kind_of(name, stored)
    if kind == "file":
        recorded = (stored or {}).get("source") or {}
        path = _tensor_file(name, recorded, data_root)
        _no_options(name, options)
        digest = plugins.sha256_file(path)
        if recorded and recorded.get("sha256") != digest:
            raise DataError(f"data file {path} changed since it was recorded (sha256 {str(recorded.get('sha256'))[:12]} "
                            f"then, {digest[:12]} now); restore it or train again")
        return str(path), tensor_file_arrays(path), {}, {"source": {"path": str(path), "sha256": digest}}
    if kind == IMAGEFOLDER:
        recorded = (stored or {}).get("source") or {}
        root = data_root_of(data_root) or (Path(recorded["path"]) if recorded.get("path") else None)
        if root is None:
            raise DataError("imagefolder reads --data-root DIR holding train/ and test/ ImageFolder trees")
        filled = _folder_options(options)
        source = directory_digest(root)
        if recorded and recorded.get("sha256") != source["sha256"]:
            raise DataError(f"image folder {root} changed since it was recorded ({recorded.get('files')} files then, "
                            f"{source['files']} now, different sha256); restore it or train again")
        return IMAGEFOLDER, imagefolder_arrays(root, **filled), filled, {"source": source}
    if kind == "torchvision":
        filled = _folder_options(options, extra=("kwargs",))
        arrays, source = torchvision_arrays(name, data_root, download, **filled)
        recorded = (stored or {}).get("source") or {}
        if recorded.get("sha256") and recorded.get("sha256") != source.get("sha256"):
            raise DataError(f"the {name} files under {source.get('path')} differ from those recorded (sha256); "
                            "restore them or train again")
        return name, arrays, filled, {"source": source}
    if kind == "entry_point":
        factory, info = plugins.load_entry_point(ENTRY_POINT_GROUP, name)
        recorded = (stored or {}).get("entry_point")
        if recorded and (recorded.get("package"), recorded.get("version")) != (info.get("package"), info.get("version")):
            if not plugins.trust_state().accept_changed:
                raise plugins.CodeChangedError(
                    f"data set {name!r}: entry point from {recorded.get('package')} {recorded.get('version')} when "
                    f"recorded, {info.get('package')} {info.get('version')} now; pass --accept-changed-code to use it")
            info = {**info, "accepted_change_from": recorded.get("version")}
        return name, user_arrays(factory, name, seed, data_root, options), options, {"entry_point": info}
    # code
    if stored is not None:
        ref, current = plugins.checked_code(stored["code"], "the stored data set")
    else:
        ref = plugins.parse(name)
        current = plugins.describe(ref)
    factory = plugins.load(ref)
    canonical = plugins.canonical(ref)
    return canonical, user_arrays(factory, canonical, seed, data_root, options), options, {"code": current}


def _kind_of(name: str, stored: dict | None) -> str:
    from landscape import plugins

    if stored is not None:
        if "code" in stored:
            return "code"
        if "entry_point" in stored:
            return "entry_point"
        if name == IMAGEFOLDER:
            return IMAGEFOLDER
        if name.lower().endswith(TENSOR_SUFFIXES):
            return "file"
        if torchvision_class(name) is not None:
            return "torchvision"
        raise DataError(f"data spec {name!r} records a source landscape does not know")
    if name == IMAGEFOLDER:
        return IMAGEFOLDER
    if name.lower().endswith(TENSOR_SUFFIXES):
        return "file"
    if name in plugins.entry_points(ENTRY_POINT_GROUP):
        return "entry_point"
    if plugins.is_code_ref(name):
        return "code"
    if torchvision_class(name) is not None:
        return "torchvision"
    raise DataError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}, imagefolder, a torchvision "
                    "classification set by name (svhn, kmnist, ...), a .npz/.h5 tensor file, or module:factory / "
                    "file.py:factory")


def _no_options(name: str, options: dict) -> None:
    if options:
        raise DataError(f"data set {name!r} takes no options, got {', '.join(map(repr, sorted(options)))}")


def _folder_options(options: dict, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    allowed = {"size": None, "standardize": True, **{k: None for k in extra}}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise DataError(f"image data has no option {', '.join(map(repr, unknown))}; its options: {', '.join(allowed)}")
    filled = {**allowed, **options}
    size = filled["size"]
    if size is not None:
        size = [size, size] if isinstance(size, int) and not isinstance(size, bool) else size
        if not (isinstance(size, (list, tuple)) and len(size) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in size)):
            raise DataError(f"option size must be a positive integer or [height, width], got {filled['size']!r}")
        filled["size"] = [int(size[0]), int(size[1])]
    if not isinstance(filled["standardize"], bool):
        raise DataError(f"option standardize must be true or false, got {filled['standardize']!r}")
    if "kwargs" in filled and filled["kwargs"] is not None and not isinstance(filled["kwargs"], dict):
        raise DataError(f"option kwargs must be a JSON object of constructor arguments, got {filled['kwargs']!r}")
    return filled


def _tensor_file(name: str, recorded: dict, data_root) -> Path:
    path = Path(recorded.get("path") or name).expanduser()
    if path.is_file():
        return path.resolve()
    root = data_root_of(data_root)
    if recorded and root is not None and (root / path.name).is_file():
        return (root / path.name).resolve()  # a moved copy (its sha256 is checked like the original's)
    raise DataError(f"tensor file {path} not found" + (" (recorded in the checkpoint; --data-root DIR holding "
                                                        f"{path.name} finds a moved copy)" if recorded else ""))


def tensor_file_arrays(path: str | os.PathLike) -> _Arrays:
    """The four arrays ``x_train, y_train, x_test, y_test`` of an ``.npz`` or HDF5 file (:func:`_user_tensors`
    says how they become tensors). A missing key, mismatched lengths or non-integer labels: DataError."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as f:
                missing = [k for k in TENSOR_KEYS if k not in f.files]
                if missing:
                    raise DataError(f"{path} has no {', '.join(missing)} (it needs {', '.join(TENSOR_KEYS)}; "
                                    f"found {', '.join(f.files) or 'nothing'})")
                arrays = {k: f[k] for k in TENSOR_KEYS}
        else:
            import h5py

            with h5py.File(path, "r") as f:
                missing = [k for k in TENSOR_KEYS if k not in f]
                if missing:
                    raise DataError(f"{path} has no {', '.join(missing)} (it needs {', '.join(TENSOR_KEYS)}; "
                                    f"found {', '.join(f) or 'nothing'})")
                arrays = {k: np.asarray(f[k]) for k in TENSOR_KEYS}
    except DataError:
        raise
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read tensor file {path}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    return _user_tensors(arrays, str(path))


def _user_tensors(arrays: dict[str, Any], what: str, num_classes: Any = None) -> _Arrays:
    """Both splits as tensors: floating inputs become float32, integer inputs int64 (token ids for an embedding
    layer), labels int64 class indices ``0..C-1`` with ``C`` = ``num_classes`` or the largest label + 1."""
    out = {}
    for key in TENSOR_KEYS:
        value = arrays[key]
        try:
            tensor = torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor) else value)
        except (TypeError, ValueError, RuntimeError):
            raise DataError(f"{what}: {key} is a {type(value).__name__}, not an array of numbers") from None
        out[key] = tensor.detach().cpu()
    for split in ("train", "test"):
        x, y = out[f"x_{split}"], out[f"y_{split}"]
        if y.dim() != 1:
            raise DataError(f"{what}: y_{split} must be one label per example, got shape {list(y.shape)}")
        if x.dim() < 2:
            raise DataError(f"{what}: x_{split} must hold one row per example (N x ...), got shape {list(x.shape)}")
        if len(x) != len(y):
            raise DataError(f"{what}: x_{split} has {len(x)} examples but y_{split} has {len(y)}")
        if len(y) == 0:
            raise DataError(f"{what}: the {split} split is empty")
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise DataError(f"{what}: y_{split} must hold integer class labels, got {y.dtype}")
        if x.is_complex() or x.dtype == torch.bool:
            raise DataError(f"{what}: x_{split} must hold real numbers, got {x.dtype}")
        out[f"x_{split}"] = x.to(torch.float32) if x.is_floating_point() else x.to(torch.int64)
        out[f"y_{split}"] = y.to(torch.int64)
    if out["x_train"].shape[1:] != out["x_test"].shape[1:]:
        raise DataError(f"{what}: train examples have shape {list(out['x_train'].shape[1:])} but test examples "
                        f"{list(out['x_test'].shape[1:])}")
    if out["x_train"].dtype != out["x_test"].dtype:
        raise DataError(f"{what}: x_train is {out['x_train'].dtype} but x_test is {out['x_test'].dtype}")
    labels = torch.cat([out["y_train"], out["y_test"]])
    if int(labels.min()) < 0:
        raise DataError(f"{what}: labels must be class indices >= 0, got {int(labels.min())}")
    top = int(labels.max()) + 1
    if num_classes is None:
        num_classes = top
    elif isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < top:
        raise DataError(f"{what}: num_classes must be an integer >= {top} (the largest label + 1), got {num_classes!r}")
    return _Arrays(out["x_train"], out["y_train"], out["x_test"], out["y_test"], int(num_classes))


def user_arrays(factory: Callable[..., Any], name: str, seed: int, data_root, options: dict) -> _Arrays:
    """Call a data factory and take what it returns.

    The factory is called as ``factory(**options)`` plus ``seed=`` and ``data_root=`` when its signature names
    them (or takes ``**kwargs``). It returns the tensors (a tuple ``(x_train, y_train, x_test, y_test)`` or a
    dict with those keys and optionally ``num_classes``; numpy arrays are fine), or the two splits as
    ``torch.utils.data.Dataset``s (a tuple ``(train, test)`` or a dict ``{"train", "test"[, "num_classes"]}``)
    whose items are ``(input tensor, integer label)``; those are read into tensors once.
    """
    _check_json(options, name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    call = dict(options)
    for key, value in (("seed", seed), ("data_root", str(data_root) if data_root is not None else None)):
        if key in params or open_kwargs:
            call[key] = value
    try:
        returned = factory(**call)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"data set {name!r}: the factory failed: {type(exc).__name__}: "
                        f"{(str(exc).splitlines() or [''])[0]}") from None
    num_classes = None
    if isinstance(returned, dict):
        num_classes = returned.get("num_classes")
        if all(k in returned for k in TENSOR_KEYS):
            return _user_tensors(returned, f"data set {name!r}", num_classes)
        if "train" in returned and "test" in returned:
            returned = (returned["train"], returned["test"])
        else:
            raise DataError(f"data set {name!r}: the factory returned a dict without {', '.join(TENSOR_KEYS)} "
                            "(or train and test)")
    if isinstance(returned, (tuple, list)) and len(returned) == 2:
        train, test = (_materialise(split, f"data set {name!r}", which) for split, which
                       in zip(returned, ("train", "test"), strict=True))
        return _user_tensors({"x_train": train[0], "y_train": train[1], "x_test": test[0], "y_test": test[1]},
                             f"data set {name!r}", num_classes)
    if isinstance(returned, (tuple, list)) and len(returned) == 4:
        return _user_tensors(dict(zip(TENSOR_KEYS, returned, strict=True)), f"data set {name!r}", num_classes)
    raise DataError(f"data set {name!r}: the factory returned a {type(returned).__name__}; return (x_train, y_train, "
                    "x_test, y_test) tensors or (train, test) torch Datasets")


def _check_json(options: dict, name: str) -> None:
    import json

    try:
        json.dumps(options)
    except (TypeError, ValueError):
        raise DataError(f"data set {name!r}: options must be JSON values, got {options!r}") from None


def _materialise(split: Any, what: str, which: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``torch.utils.data.Dataset`` of ``(tensor, int label)`` items as stacked ``(x, y)`` tensors."""
    if not hasattr(split, "__getitem__") or not hasattr(split, "__len__"):
        raise DataError(f"{what}: the {which} split is a {type(split).__name__}, not a torch Dataset")
    xs, ys = [], []
    for i in range(len(split)):
        item = split[i]
        ok = isinstance(item, (tuple, list)) and len(item) == 2
        if ok:
            x, y = item
            if isinstance(y, torch.Tensor) and y.numel() == 1 and not y.is_floating_point():
                y = int(y.item())
            elif isinstance(y, np.integer):
                y = int(y)
            ok = isinstance(x, (torch.Tensor, np.ndarray)) and isinstance(y, int) and not isinstance(y, bool)
        if not ok:
            raise DataError(f"{what}: item {i} of the {which} Dataset is {_describe_item(item)}, not (tensor, int label)")
        xs.append(torch.as_tensor(x))
        ys.append(y)
    if not xs:
        raise DataError(f"{what}: the {which} Dataset is empty")
    try:
        return torch.stack(xs), torch.tensor(ys, dtype=torch.int64)
    except RuntimeError:
        raise DataError(f"{what}: the {which} Dataset's inputs have different shapes") from None


def _describe_item(item: Any) -> str:
    if isinstance(item, (tuple, list)):
        return "(" + ", ".join(type(v).__name__ for v in item) + ")"
    return f"a {type(item).__name__}"


def directory_digest(root: str | os.PathLike) -> dict[str, Any]:
    """``{"path", "sha256", "files"}``: the sha256 of the manifest of every file below ``root`` (one line
    ``relative/path<TAB>sha256`` per file, sorted), so any added, removed, renamed or changed file shows."""
    from landscape.plugins import sha256_file

    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data directory {root} not found")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    lines = "".join(f"{p.relative_to(root).as_posix()}\t{sha256_file(p)}\n" for p in files)
    import hashlib

    return {"path": str(root.resolve()), "sha256": hashlib.sha256(lines.encode()).hexdigest(), "files": len(files)}


def _pil_tensor(image, size) -> torch.Tensor:
    from torchvision.transforms.functional import pil_to_tensor, resize

    if size is not None:
        image = resize(image, list(size))
    return pil_to_tensor(image)


def _stack_images(images: list[torch.Tensor], what: str) -> torch.Tensor:
    shapes = {tuple(i.shape) for i in images}
    if len(shapes) > 1:
        raise DataError(f"{what}: images have different sizes ({', '.join(map(str, sorted(shapes)[:3]))}...); "
                        "give the option size, e.g. --data-kwargs '{\"size\": 32}'")
    return torch.stack(images).to(torch.float32).div_(255.0)


def _channel_standardize(x_train: torch.Tensor, x_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [d for d in range(x_train.dim()) if d != 1]
    return _standardize(x_train, x_test, x_train.mean(dim=dims), x_train.std(dim=dims).clamp_min(1e-12))


def imagefolder_arrays(root: str | os.PathLike, *, size=None, standardize: bool = True) -> _Arrays:
    """torchvision ``ImageFolder`` trees ``root/train`` and ``root/test`` (one folder per class, the same class
    folders in both) as float32 ``N x C x H x W`` in [0, 1] (RGB), resized to ``size`` when given; with
    ``standardize`` each channel is shifted and scaled by its train mean and standard deviation."""
    from torchvision.datasets import ImageFolder

    root = Path(root)
    splits = []
    for which in ("train", "test"):
        folder = root / which
        if not folder.is_dir():
            raise DataError(f"imagefolder needs {folder} (one sub-folder per class); it is missing")
        try:
            tree = ImageFolder(str(folder))
        except (FileNotFoundError, OSError, RuntimeError) as exc:
            raise DataError(f"imagefolder {folder}: {str(exc).splitlines()[0]}") from None
        splits.append(tree)
    train, test = splits
    if train.classes != test.classes:
        raise DataError(f"imagefolder {root}: train/ has classes {train.classes[:5]} but test/ has {test.classes[:5]}")
    x = [_stack_images([_pil_tensor(tree.loader(p), size) for p, _ in tree.samples], f"imagefolder {root}")
         for tree in splits]
    y = [torch.tensor(tree.targets, dtype=torch.int64) for tree in splits]
    if standardize:
        x = list(_channel_standardize(*x))
    return _Arrays(x[0], y[0], x[1], y[1], len(train.classes))


def torchvision_class(name: str):
    """The torchvision data-set class whose lower-case name is ``name`` (``svhn`` -> ``SVHN``), or None."""
    if not isinstance(name, str) or not name.replace("-", "").isalnum():
        return None
    import torchvision.datasets

    wanted = name.lower().replace("-", "")
    for attr in getattr(torchvision.datasets, "__all__", dir(torchvision.datasets)):
        cls = getattr(torchvision.datasets, attr, None)
        if isinstance(cls, type) and attr.lower() == wanted:
            return cls
    return None


def torchvision_arrays(name: str, data_root, download: bool, *, size=None, standardize: bool = True,
                       kwargs: dict | None = None) -> tuple[_Arrays, dict[str, Any]]:
    """A torchvision classification set by class name, read from ``data_root`` (fetched only with ``download``),
    as float32 images in [0, 1] (per-channel standardised on the train split when ``standardize``), and its
    source ``{"path", "sha256", "files", "class"}`` (the digest of the set's own folder)."""
    cls = torchvision_class(name)
    root = data_root_of(data_root)
    if root is None:
        raise DataError(f"{name} is read from disk: pass --data-root DIR (or set ${DATA_ENV}), and --download to fetch it")
    params = inspect.signature(cls.__init__).parameters
    if "train" in params:
        arguments = [{"train": True}, {"train": False}]
    elif "split" in params:
        arguments = [{"split": "train"}, {"split": "test"}]
    else:
        raise DataError(f"torchvision's {cls.__name__} has no train/test split; arrange it as an imagefolder tree")
    made = []
    for split in arguments:
        try:
            made.append(cls(root=str(root), download=download, **split, **(kwargs or {})))
        except (RuntimeError, FileNotFoundError) as exc:
            if download:
                raise DataError(f"could not download {name} into {root}: {str(exc).splitlines()[0]}") from None
            raise DataError(f"{name} files not found under {root}; pass --data-root DIR holding them, or add "
                            "--download to fetch them") from None
        except (OSError, TypeError, ValueError) as exc:
            raise DataError(f"could not read {name} under {root}: {str(exc).splitlines()[0]}") from None
    xs, ys = zip(*(_torchvision_tensors(ds, name, size) for ds in made), strict=True)
    x_train, x_test = xs
    if standardize:
        x_train, x_test = _channel_standardize(x_train, x_test)
    classes = getattr(made[0], "classes", None)
    num_classes = len(classes) if classes else int(max(int(ys[0].max()), int(ys[1].max())) + 1)
    own = next((Path(p) for p in (getattr(made[0], "raw_folder", None), getattr(made[0], "_base_folder", None))
                if p and Path(p).is_dir()), None)
    source = {**directory_digest(own), "class": cls.__name__} if own is not None else \
        {"path": str(Path(root).resolve()), "sha256": None, "class": cls.__name__}
    return _Arrays(x_train, ys[0], x_test, ys[1], num_classes), source


def _torchvision_tensors(ds, name: str, size) -> tuple[torch.Tensor, torch.Tensor]:
    data = getattr(ds, "data", None)
    targets = getattr(ds, "targets", getattr(ds, "labels", None))
    if size is None and data is not None and targets is not None and np.asarray(data).dtype == np.uint8:
        array = np.asarray(data)
        if array.ndim == 3 or (array.ndim == 4 and array.shape[-1] in (1, 3)):
            return _images_tensor(array), torch.as_tensor(np.asarray(targets), dtype=torch.int64)
        if array.ndim == 4 and array.shape[1] in (1, 3):  # SVHN, STL10: already N x C x H x W
            return torch.from_numpy(array).to(torch.float32).div_(255.0), \
                torch.as_tensor(np.asarray(targets), dtype=torch.int64)
    images, labels = [], []
    for i in range(len(ds)):
        image, label = ds[i]
        images.append(_pil_tensor(image, size))
        labels.append(int(label))
    return _stack_images(images, name), torch.tensor(labels, dtype=torch.int64)


def _jsonable(options: dict) -> dict:
    out = {}
    for key, value in options.items():
        if isinstance(value, (np.integer,)):
            value = int(value)
        elif isinstance(value, (np.floating,)):
            value = float(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out
