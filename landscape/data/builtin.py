"""The built-in data sets (``DATASETS``): Watson et al.'s gaussian signal/noise data, scikit-learn's digits,
and torchvision's MNIST, Fashion-MNIST, CIFAR-10/100 from local files."""

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

from landscape.data.arrays import Dataset, _Arrays, subset_indices
from landscape.errors import DataError, param
from landscape.runtime import DATA_ENV


def gaussian_signal(*, seed: int, ds: int = 10, dn: int = 90, n: int = 1000, n_test: int = 1000,
                    noise: float = 1.0, signal: float = 2.0, key: str = "ones", **_: Any) -> _Arrays:
    """Watson et al. Sec. 3.2, eqs. (6)-(9): ``x = (x_s, x_n)``, ``x_s ~ N(y v, s^2 I_ds)``, ``x_n ~ N(0, s^2 I_dn)``.

    ``y`` is uniform on {-1, +1} and becomes class 0 (y = -1) or 1 (y = +1); ``s`` is ``noise``. The key
    vector ``v`` has norm ``signal``: ``key="ones"`` gives ``v = signal * 1 / sqrt(ds)`` (the same for every
    seed), ``key="random"`` a uniformly random direction drawn from the seed. Train, test and key use
    independent streams ``default_rng([seed, 0|1|2])``, so ``n`` does not change the test set.
    """
    ds, dn, n, n_test = (_integer(v, k, low) for v, k, low in ((ds, "ds", 1), (dn, "dn", 0), (n, "n", 1),
                                                              (n_test, "n_test", 1)))
    noise, signal = _real(noise, "noise"), _real(signal, "signal")
    if key not in ("ones", "random"):
        raise DataError(f"gaussian-signal option key must be 'ones' or 'random', got {key!r}")
    v = _key_vector(key, ds, signal, seed)

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
    return torch.from_numpy(_key_vector(opts["key"], opts["ds"], opts["signal"], spec["seed"]))


def _key_vector(key: str, ds: int, signal: float, seed: int) -> np.ndarray:
    if key == "ones":
        return np.full(ds, signal / math.sqrt(ds))
    direction = np.random.default_rng([seed, 2]).standard_normal(ds)
    return signal * direction / np.linalg.norm(direction)


def _standardize(x_train: torch.Tensor, x_test: torch.Tensor, mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, -1) + (1,) * (x_train.dim() - 2)
    mean = torch.as_tensor(mean, dtype=torch.float32).reshape(shape)
    std = torch.as_tensor(std, dtype=torch.float32).reshape(shape)
    return (x_train - mean) / std, (x_test - mean) / std


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``load_digits()``'s ``images`` and ``target``, read from the CSV scikit-learn ships (importing
    ``sklearn.datasets`` costs ~0.8 s per process); ``load_digits`` itself when the file is not there."""
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
    """scikit-learn's 8x8 digits (1,797 images, 10 classes) as ``1 x 8 x 8`` tensors, split (stratified) by
    ``split_seed``, not ``seed``, so runs with different seeds share one test set; 1/4 test gives
    1,348 train and 449 test images. ``standardize`` uses the train pixels' mean and standard deviation."""
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


def torchvision_splits(name: str, cls: type, root: Path | None, download: bool, kwargs: dict | None = None) -> list:
    """The train and test data sets of torchvision's ``cls`` under ``root``; what is missing is one DataError."""
    if root is None:
        raise DataError(f"{name} is read from disk: pass {param('data_root')} (or set ${DATA_ENV}), and "
                        f"{param('download', True)} to fetch it")
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
            raise DataError(f"{name} files not found under {root}; pass {param('data_root')} holding them, or add "
                            f"{param('download', True)} to fetch them") from None
        except (OSError, TypeError, ValueError) as exc:
            raise DataError(f"could not read {name} under {root}: {str(exc).splitlines()[0]}") from None
    return made


def _images_tensor(data) -> torch.Tensor:
    """torchvision's raw ``data`` (uint8, N x H x W or N x H x W x C) -> float32 N x C x H x W in [0, 1]."""
    x = torch.as_tensor(np.asarray(data))
    x = x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return x.to(torch.float32).div_(255.0).contiguous()


def _torchvision_builder(name: str) -> Callable[..., _Arrays]:
    info = _TORCHVISION[name]

    def build(*, seed: int, data_root=None, download: bool = False, standardize: bool = True, **_: Any) -> _Arrays:
        import torchvision.datasets

        cls = getattr(torchvision.datasets, info.cls)
        train, test = torchvision_splits(name, cls, data_root_of(data_root), download)
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
