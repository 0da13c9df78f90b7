"""``landscape privacy``, the privacy record of imported weights and the caveat results carry about their
inputs' ancestry. Accounting itself is :mod:`landscape.train.accounting`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from landscape.errors import CheckpointError, UsageError, param
from landscape.options import Options, option
from landscape.privacy import ACCOUNTANTS, DeclaredPrivacy, PrivacyEvent, PrivacyHistory, ancestry_note


@dataclass(frozen=True)
class PrivacyQuery(Options):
    """Options of ``landscape privacy``."""

    noise_multiplier: float | None = option(None, "Noise multiplier sigma; prints epsilon.", min=0)
    target_epsilon: float | None = option(None, "Target epsilon; prints the sigma that reaches it.", min=0,
                                          min_open=True)
    sample_rate: float | None = option(None, "Poisson sample rate q (or --batch-size and --dataset-size).", min=0,
                                       max=1, min_open=True)
    batch_size: int | None = option(None, "Expected batch size B (q = B / N).", min=1)
    dataset_size: int | None = option(None, "Training set size N.", min=1)
    steps: int | None = option(None, "Number of steps T (or --epochs).", min=0)
    epochs: int | None = option(None, "Whole epochs; T = epochs * ceil(N/B), as `landscape train` runs them "
                                "(ceil(1/q) per epoch with --sample-rate).", min=0)
    delta: float = option(1e-5, "The delta of (epsilon, delta).", min=0, max=1, min_open=True, max_open=True)
    accountant: str = option("rdp", "rdp: exact sampled-Gaussian RDP at Opacus' orders (equals Opacus); pld: "
                             "dp_accounting's privacy loss distributions (tighter).", choices=ACCOUNTANTS)

    def schedule(self) -> tuple[float, int]:
        """``(q, steps)``; a usage error when the options conflict or are missing."""
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise UsageError(f"give exactly one of {param('noise_multiplier')} and {param('target_epsilon')}")
        pair = (self.batch_size, self.dataset_size)
        if self.sample_rate is not None and any(v is not None for v in pair):
            raise UsageError(f"give either {param('sample_rate')} or {param('batch_size')} with {param('dataset_size')}, not both")
        if self.sample_rate is None:
            if any(v is None for v in pair):
                raise UsageError(f"give {param('sample_rate')}, or both {param('batch_size')} and {param('dataset_size')}")
            if self.batch_size < 1 or self.dataset_size < 1 or self.batch_size > self.dataset_size:
                raise UsageError(
                    f"need 1 <= {param('batch_size')} <= {param('dataset_size')}, got {self.batch_size} and {self.dataset_size}"
                )
            q = self.batch_size / self.dataset_size
        else:
            q = float(self.sample_rate)
        if (self.steps is None) == (self.epochs is None):
            raise UsageError(f"give exactly one of {param('steps')} and {param('epochs')}")
        from landscape.train import accounting

        if self.steps is not None:
            steps = int(self.steps)
        elif self.sample_rate is None:
            steps = accounting.schedule_steps(self.epochs, self.dataset_size, self.batch_size)
        else:
            # ceil(N/B) with N/B = 1/q; the tolerance keeps q = B/N from rounding an exact N/B up
            per_epoch = max(1, math.ceil(1.0 / q - 1e-9)) if q > 0 else 0
            steps = accounting.schedule_steps(self.epochs, per_epoch, 1)
        return q, steps


@dataclass
class PrivacyAnswer:
    noise_multiplier: float
    epsilon: float
    delta: float
    sample_rate: float
    steps: int
    method: str
    target_epsilon: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def privacy(query: PrivacyQuery) -> PrivacyAnswer:
    """Epsilon of the schedule (``noise_multiplier`` given) or the calibrated sigma (``target_epsilon``)."""
    from landscape.train import accounting

    q, steps = query.schedule()
    if query.target_epsilon is not None:
        sigma = accounting.noise_for_epsilon(query.target_epsilon, q, steps, query.delta, query.accountant)
    else:
        sigma = float(query.noise_multiplier)
    eps = accounting.epsilon(sigma, q, steps, query.delta, query.accountant)
    return PrivacyAnswer(noise_multiplier=sigma, epsilon=eps, delta=query.delta, sample_rate=q, steps=steps,
                         method=query.accountant, target_epsilon=query.target_epsilon)


def import_privacy(epsilon: float | None = None, delta: float | None = None,
                   noise_multiplier: float | None = None, sample_rate: float | None = None,
                   steps: int | None = None) -> tuple[dict[str, Any], float | None]:
    """``(manifest["privacy"], epsilon at the checkpoint)`` of imported weights: unknown when nothing is
    declared; ``epsilon`` with ``delta`` a guarantee added to descendants' by basic composition;
    ``noise_multiplier``, ``sample_rate`` and ``steps`` an ancestor event composed exactly (its epsilon
    reported at ``delta``, default 1e-5)."""
    mechanism = (noise_multiplier, sample_rate, steps)
    if epsilon is not None and any(v is not None for v in mechanism):
        raise UsageError(f"declare either {param('epsilon')} and {param('delta')} or {param('noise_multiplier')}, {param('sample_rate')} and {param('steps')}, not both")
    if epsilon is not None or (delta is not None and all(v is None for v in mechanism)):
        if epsilon is None or delta is None:
            raise UsageError(f"{param('epsilon')} and {param('delta')} declare one guarantee: give both")
        declared = DeclaredPrivacy(epsilon, delta)
        history = PrivacyHistory(declared=[declared])
        return {"accounted": False, "delta": float(delta), **history.manifest_fields(0.0)}, float(epsilon)
    if any(v is not None for v in mechanism):
        if any(v is None for v in mechanism):
            raise UsageError(f"{param('noise_multiplier')}, {param('sample_rate')} and {param('steps')} declare the weights' DP-SGD together: "
                             "give all three")
        from landscape.train import accounting

        delta = 1e-5 if delta is None else delta
        eps = accounting.epsilon(noise_multiplier, sample_rate, steps, delta)  # checks them
        event = PrivacyEvent(float(noise_multiplier), float(sample_rate), int(steps))
        history = PrivacyHistory(events=[event])
        return {"accounted": False, "delta": float(delta), **history.manifest_fields()}, eps
    return {"accounted": False, **PrivacyHistory(unknown=True).manifest_fields()}, None


def provenance_attrs(inputs: Sequence[Any]) -> dict[str, str]:
    """``{"privacy_note": "run a, b: note; ..."}`` for a result whose input checkpoints belong to runs whose
    ancestry qualifies their epsilon; else ``{}``."""
    from landscape.store import MANIFEST, Store

    notes: dict[str, list[str]] = {}
    for run_dir in dict.fromkeys(Path(ref.path).parent for ref in inputs):  # each run's manifest read once
        if not (run_dir / MANIFEST).is_file():
            continue
        try:
            manifest = Store(run_dir.parent).run(run_dir.name).manifest
        except (CheckpointError, UsageError, OSError):
            continue
        note = ancestry_note(manifest)
        if note is not None:
            notes.setdefault(note, []).append(run_dir.name)
    if not notes:
        return {}
    return {"privacy_note": "; ".join(f"run{'s' if len(runs) > 1 else ''} {', '.join(runs)}: {note}"
                                      for note, runs in notes.items())}
