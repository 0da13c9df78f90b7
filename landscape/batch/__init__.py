"""Batch runs: sweeps of training and analysis jobs from a YAML spec, in-process or on Dask (docs/batch.md)."""

from landscape.batch.graph import BatchSpec, Job, describe, to_dot
from landscape.batch.loading import SpecError
from landscape.batch.runner import BatchReport, run_batch
from landscape.batch.spec import load_spec

__all__ = ["BatchReport", "BatchSpec", "Job", "SpecError", "describe", "load_spec", "run_batch", "to_dot"]
