"""Data sets by name as train and test tensors (the catalogue: docs/data-models.md); ``Dataset.spec`` records the
seed and options, so ``dataset_from_spec(spec)`` rebuilds the same tensors."""

from landscape.data.arrays import Dataset, recording_subsets, sample_subset, subset_indices, take_subset
from landscape.data.builtin import DATASETS, data_root_of, digits, digits_arrays, gaussian_signal_key
from landscape.data.core import dataset_from_spec, dataset_options, load_dataset
from landscape.data.sources import directory_digest, torchvision_class

__all__ = [
    "DATASETS", "Dataset", "data_root_of", "dataset_from_spec", "dataset_options", "digits", "digits_arrays",
    "directory_digest", "gaussian_signal_key", "load_dataset", "recording_subsets", "sample_subset",
    "subset_indices", "take_subset", "torchvision_class",
]
