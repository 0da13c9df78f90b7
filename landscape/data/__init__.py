"""Data sets by name, returned as tensors with a train and a test split.

Every data set is deterministic given its seed and options; ``Dataset.spec`` records both, so
``dataset_from_spec(spec)`` rebuilds the same tensors (and checks recorded file and code hashes, running user
code only when the user named it again). Images are ``N x C x H x W`` float32, vectors ``N x D`` float32,
labels int64. Registered names are in ``DATASETS`` (adding one is a builder and a line there);
:func:`load_dataset` also takes tensor files, ``imagefolder``, torchvision sets by name, entry points of the
group ``landscape.datasets`` and user code (:func:`user_arrays`). ``subset`` (a count or a fraction) draws a
seeded, stratified sample of the train split only. The catalogue: docs/data-models.md.
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
