"""Batch runs: sweeps of training and analysis jobs from a YAML spec, in-process or on Dask.

``landscape.batch.spec`` reads and validates a spec into an expanded job graph (nothing runs);
``landscape.batch.runner`` runs it (this process, a ``distributed.LocalCluster`` or an existing scheduler) and
writes the summary; ``landscape.batch.jobs`` is what runs one job on a worker (idempotent: a job whose
outputs exist with the same configuration hash is skipped). See docs/batch.md.

>>> from landscape.batch import load_spec, run_batch
>>> report = run_batch(load_spec("examples/watson-fig5.yaml"), workers=2)
"""

from landscape.batch.runner import BatchReport, run_batch
from landscape.batch.spec import BatchSpec, Job, SpecError, describe, load_spec, to_dot

__all__ = ["BatchReport", "BatchSpec", "Job", "SpecError", "describe", "load_spec", "run_batch", "to_dot"]
