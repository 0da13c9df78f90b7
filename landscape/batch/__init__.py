"""Batch runs: sweeps of training and analysis jobs from a YAML spec, in-process or on Dask (docs/batch.md).

``spec`` reads and validates a spec into an expanded job graph (nothing runs); ``runner`` runs it and writes
the summary; ``jobs`` runs one job on a worker (a job whose outputs exist with the same configuration hash is
skipped).
"""

from landscape.batch.runner import BatchReport, run_batch
from landscape.batch.spec import BatchSpec, Job, SpecError, describe, load_spec, to_dot

__all__ = ["BatchReport", "BatchSpec", "Job", "SpecError", "describe", "load_spec", "run_batch", "to_dot"]
