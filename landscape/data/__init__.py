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

from landscape.data.arrays import (
    Dataset,
    indices_sha256,
    recording_subsets,
    sample_subset,
    subset_indices,
    take_subset,
)
from landscape.data.builtin import (
    DATASETS,
    data_root_of,
    digits,
    digits_arrays,
    gaussian_signal,
    gaussian_signal_key,
)
from landscape.data.core import dataset_from_spec, dataset_options, load_dataset
from landscape.data.sources import (
    ENTRY_POINT_GROUP,
    IMAGEFOLDER,
    TENSOR_KEYS,
    TENSOR_SUFFIXES,
    directory_digest,
    imagefolder_arrays,
    tensor_file_arrays,
    torchvision_arrays,
    torchvision_class,
    user_arrays,
)

__all__ = [
    "DATASETS", "Dataset", "ENTRY_POINT_GROUP", "IMAGEFOLDER", "TENSOR_KEYS", "TENSOR_SUFFIXES",
    "data_root_of", "dataset_from_spec", "dataset_options", "digits", "digits_arrays", "directory_digest",
    "gaussian_signal", "gaussian_signal_key", "imagefolder_arrays", "indices_sha256", "load_dataset",
    "recording_subsets", "sample_subset", "subset_indices", "take_subset",
    "tensor_file_arrays", "torchvision_arrays", "torchvision_class", "user_arrays",
]
