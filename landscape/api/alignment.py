"""``landscape align A B``: B permuted to match A (Git Re-Basin weight matching) as a new run with lineage.

Its ``privacy`` composes the DP histories of B *and* A: the permutation is a function of A's weights.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from landscape.api.jobkind import JobKind, run_files, run_option
from landscape.options import check_fields, option

if TYPE_CHECKING:
    import torch

    from landscape.store import Checkpoint, Store

PERMUTATION_ARRAY = "permutation"


@dataclass
class AlignConfig:
    """Options of ``landscape align`` (its command and batch kind are generated from these fields:
    :data:`JOB`)."""

    ref_a: str
    ref_b: str
    run: str | None = option(None, "Name of the new run (default: generated).")
    seed: int = option(0, "Seed of the order in which weight matching visits the permutations.")
    max_iter: int = option(100, "At most this many passes over all permutations.", min=1)


@dataclass
class AlignResult:
    run: str
    checkpoint: Path
    ref_a: str
    ref_b: str
    iterations: int
    converged: bool
    distance_before: float  # ||theta_B - theta_A||_2 (parameters and floating buffers)
    distance_after: float  # ||pi(theta_B) - theta_A||_2
    permutations: list[dict[str, Any]] = field(default_factory=list)  # permutation, units, groups, moved

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "checkpoint": str(self.checkpoint)}


def align(ref_a: str, ref_b: str, *, run: str | None = None, root: str | Path = "checkpoints", seed: int = 0,
          max_iter: int = 100) -> AlignResult:
    """Permute B's hidden units to match A (weight matching) and write the result as a new run at ``root``.

    The new run's step 0 computes the same function as B. Any model whose permutation structure is described
    (a ``permutation_spec()`` method or a registered builder: ``landscape.analyze.align``) can be aligned.
    """
    from landscape.analyze.align import align_states
    from landscape.analyze.permutations import apply_permutation, verified_spec
    from landscape.api._common import check_pair
    from landscape.store import Store
    from landscape.train.pruning import MASK_ARRAY, lineage_of, load_masks

    config = AlignConfig(ref_a, ref_b, run, seed, max_iter)
    check_fields(config)
    store = Store(root)
    a, b = store.load(ref_a), store.load(ref_b)
    check_pair(a, b)
    masks = load_masks(store.run(b.run)) if b.run is not None else None
    model = b.build_model()
    spec = verified_spec(model, _probe_inputs(b))
    alignment = align_states(model, a.state_dict, b.state_dict, seed=seed, max_iter=max_iter, spec=spec)
    stored = {"command": "align", **asdict(config)}
    lineage = {**lineage_of(b, ref_b), "aligned_to": {"ref": ref_a, "run": a.run, "step": a.step, "sha256": a.sha256}}
    new = store.create_run(run, config=stored, seeds={"seed": int(seed)}, lineage=lineage, model_spec=b.model_spec,
                           data_spec=b.data_spec, extra={"privacy": _privacy_of_both(store, b, a)})
    try:
        new.save_array(PERMUTATION_ARRAY, {k: v.numpy() for k, v in alignment.perms.items()})
        if masks is not None:
            new.save_array(MASK_ARRAY, {k: v.numpy() for k, v in
                                        apply_permutation(alignment.spec, alignment.perms, masks).items()})
        same_function = {k: v for k, v in b.metrics.items() if k.startswith(("train_", "test_"))}
        path = new.save_checkpoint(alignment.state, step=0, epoch=0.0, metrics=same_function,
                                   attrs={"aligned": {**stored, "iterations": alignment.perms.iterations}})
    except BaseException:  # no half-made run under the chosen name
        shutil.rmtree(new.path, ignore_errors=True)
        raise
    return AlignResult(
        run=new.name, checkpoint=path, ref_a=ref_a, ref_b=ref_b, iterations=alignment.perms.iterations,
        converged=alignment.perms.converged, distance_before=alignment.distance_before,
        distance_after=alignment.distance_after, permutations=alignment.rows(),
    )


def _align_job(config: AlignConfig, *, root: Path, out: Path | None = None) -> AlignResult:
    return align(config.ref_a, config.ref_b, run=config.run, root=root, seed=config.seed, max_iter=config.max_iter)


def _align_notes(result: AlignResult) -> list[str]:
    state = "converged" if result.converged else "stopped at --max-iter"
    return [f"weight matching {state} after {result.iterations} pass(es); ||B - A|| {result.distance_before:.4g} -> "
            f"{result.distance_after:.4g}", f"run {result.run}: step 0 = {result.ref_b} permuted to match {result.ref_a}",
            f"checkpoint: {result.checkpoint}"]


def _align_outcome(result: AlignResult, root: Path, out: Path | None) -> tuple[dict[str, Any], list[Path]]:
    numbers = {"distance_before": result.distance_before, "distance_after": result.distance_after,
               "iterations": result.iterations, "converged": int(result.converged)}
    return numbers, run_files(root, result.run)


JOB = JobKind(
    name="align", config=AlignConfig, run=_align_job, arguments=("ref_a", "ref_b"),
    required=("ref_a", "ref_b", "run"), produces=run_option, outcome=_align_outcome, api=align,
    rows=lambda result: result.permutations, notes=_align_notes, details=AlignResult.to_dict,
    doc="Permute the hidden units of checkpoint B to match A (weight matching, Ainsworth et al. 2023).\n\n"
        "The new run's step 0 computes the same function as B; interpolate A against it to see the barrier that is "
        "not due to unit order: `landscape interpolate A RUN@init`. Works for the built-in models and any model that "
        "describes its units (a permutation_spec() method or register_spec(); landscape.analyze.align).",
)


def _privacy_of_both(store: Store, b: Checkpoint, a: Checkpoint) -> dict[str, Any]:
    """B's DP history, then A's; for two checkpoints of one run, the later one's, which contains the
    earlier's."""
    from landscape.train.pruning import inherited_privacy

    if a.run is not None and a.run == b.run:
        history = inherited_privacy(store, a if a.step > b.step else b)
        counts = {"B" if b.step >= a.step else "A": len(history.events)}
    else:
        hb, ha = inherited_privacy(store, b), inherited_privacy(store, a)
        history, counts = hb + ha, {"B": len(hb.events), "A": len(ha.events)}
    return {"accounted": False, **history.manifest_fields(), "events_from": counts}


def _probe_inputs(b: Checkpoint) -> torch.Tensor:
    """16 inputs to check a permutation spec on: Gaussian ones of the recorded input shape, else B's test
    data."""
    import torch

    from landscape.api._common import checkpoint_dataset

    shape = (b.model_spec.get("kwargs") or {}).get("input_shape") if isinstance(b.model_spec, dict) else None
    if shape:
        return torch.randn((16, *shape), generator=torch.Generator().manual_seed(0))
    data = checkpoint_dataset(b.data_spec, purpose="check its permutation spec", source=b.ref)
    return data.split("test")[0][:16]
