"""Data sets by name, returned as tensors with a train and a test split.

Every data set is deterministic given its seed and its options; ``Dataset.spec`` records both, so
``dataset_from_spec(spec)`` rebuilds the same tensors bit for bit (files on disk permitting). Images are
``N x C x H x W`` float32, vectors ``N x D`` float32, labels int64 class indices.

Registered names (``DATASETS``):

- ``gaussian-signal``: the signal/noise data of Watson et al. Sec. 3.2, eqs. (6)-(9).
- ``digits``: scikit-learn's bundled 8x8 digits (no download), with a fixed stratified train/test split.
- ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``: torchvision's files from ``data_root``
  (else ``$LANDSCAPE_DATA``); fetched only when ``download=True``.

``subset`` (an int count or a float fraction) draws a seeded, stratified sample of the *train* split; the
test split is never subsampled. Adding a data set is one builder function plus one line in ``DATASETS``.
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
    """A data set held as tensors: float32 inputs, int64 labels in ``0..num_classes-1``."""

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

    Unknown names and options raise :class:`DataError`; so do image sets whose files are not under
    ``data_root`` (else ``$LANDSCAPE_DATA``) unless ``download`` is set.
    """
    builder = _builder(name)
    accepted = dataset_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        known = ", ".join(accepted) or "none"
        raise DataError(f"data set {name!r} has no option {', '.join(map(repr, unknown))}; its options: {known}")
    filled = {**accepted, **options}
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DataError(f"data seed must be an integer, got {seed!r}")
    seed = int(seed)
    if subset is not None:
        subset = _subset_value(subset)
    arrays = builder(seed=seed, data_root=data_root, download=download, **filled)
    x_train, y_train = arrays.x_train, arrays.y_train
    if subset is not None:
        keep = subset_indices(y_train, subset, seed)
        x_train, y_train = x_train[keep], y_train[keep]
    spec = {"name": name, "seed": seed, "subset": subset, "options": _jsonable(filled)}
    return Dataset(name, x_train.contiguous(), y_train.contiguous(), arrays.x_test.contiguous(),
                   arrays.y_test.contiguous(), arrays.num_classes, spec)


def dataset_from_spec(spec: dict, *, data_root: str | os.PathLike | None = None, download: bool = False) -> Dataset:
    """Rebuild the data set a ``Dataset.spec`` describes."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise DataError(f"a data spec is a dict with 'name', 'seed', 'subset', 'options'; got {spec!r}")
    return load_dataset(
        spec["name"], seed=spec.get("seed", 0), subset=spec.get("subset"), data_root=data_root,
        download=download, **(spec.get("options") or {}),
    )


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
