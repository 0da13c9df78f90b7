"""What is known of the privacy of the steps a run's starting weights were trained with
(:class:`PrivacyHistory`): accounted DP steps, steps without a guarantee, guarantees declared for imported
weights (basic composition), or nothing known (docs/privacy.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from landscape.errors import UsageError

ACCOUNTANTS = ("rdp", "pld")  # the accountants landscape computes (landscape.train.accounting)


@dataclass
class PrivacyEvent:
    """``steps`` steps of the Poisson-subsampled Gaussian mechanism (noise multiplier, sample rate)."""

    noise_multiplier: float
    sample_rate: float
    steps: int


UNKNOWN_ANCESTRY = "epsilon covers only the steps landscape saw; ancestors' privacy unknown"


@dataclass
class DeclaredPrivacy:
    """An (epsilon, delta) guarantee declared for weights landscape did not train (``import --epsilon --delta``)."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        epsilon, delta = self.epsilon, self.delta
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 <= epsilon < math.inf:
            raise UsageError(f"declared epsilon must be a finite number >= 0, got {epsilon}")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < 1:
            raise UsageError(f"declared delta must be a number in [0, 1), got {delta}")


@dataclass
class PrivacyHistory:
    """What is known about the privacy of the steps before a run's own (the module docstring)."""

    events: list[PrivacyEvent] = field(default_factory=list)
    non_private: bool = False
    unknown: bool = False
    declared: list[DeclaredPrivacy] = field(default_factory=list)
    # what the parent checkpoint itself reported: {ref, epsilon, delta, accountant[, source]} (None: nothing)
    parent_epsilon: dict[str, Any] | None = None

    @classmethod
    def of(cls, history: PrivacyHistory | Sequence[PrivacyEvent]) -> PrivacyHistory:
        """A history as is, or a plain list of ancestor events as one."""
        return history if isinstance(history, PrivacyHistory) else cls(events=list(history))

    @classmethod
    def from_manifest(cls, privacy: Mapping[str, Any] | None) -> PrivacyHistory:
        """The ancestors recorded in a run's ``manifest["privacy"]`` (absent fields: nothing of that kind)."""
        privacy = privacy or {}
        return cls(events=[PrivacyEvent(**e) for e in privacy.get("ancestor_events", [])],
                   non_private=bool(privacy.get("non_private_ancestors")),
                   unknown=bool(privacy.get("unknown_ancestors")),
                   declared=[DeclaredPrivacy(**d) for d in privacy.get("declared_ancestors", [])],
                   parent_epsilon=dict(privacy["parent_epsilon"]) if privacy.get("parent_epsilon") else None)

    def __add__(self, other: PrivacyHistory) -> PrivacyHistory:
        """Both histories (weights that depend on two checkpoints; no single parent's epsilon)."""
        return PrivacyHistory([*self.events, *other.events], self.non_private or other.non_private,
                              self.unknown or other.unknown, [*self.declared, *other.declared])

    def manifest_fields(self, delta: float | None = None) -> dict[str, Any]:
        """The ``manifest["privacy"]`` fields of this history (unknown and declared ones only if any)."""
        out: dict[str, Any] = {"ancestor_events": [asdict(e) for e in self.events],
                               "non_private_ancestors": self.non_private}
        if self.unknown:
            out["unknown_ancestors"] = True
            out["note"] = UNKNOWN_ANCESTRY
        if self.declared:
            out["declared_ancestors"] = [asdict(d) for d in self.declared]
            if delta is not None:
                out["total_delta"] = self.total_delta(delta)
        if self.parent_epsilon:
            out["parent_epsilon"] = dict(self.parent_epsilon)
        return out

    def accountant_note(self, run: str, accountant: str) -> str | None:
        """One line when a child's epsilon is not by the accountant its parent's was (never a silent jump)."""
        parent = self.parent_epsilon or {}
        if not parent or parent.get("accountant") == accountant:
            return None
        by = str(parent.get("accountant"))
        why = ("which landscape cannot compute" if by not in ACCOUNTANTS else "another accountant than this run's")
        source = f" ({parent['source']})" if parent.get("source") else ""
        return (f"run '{run}' accounts every step, its parent's too, with {accountant}; its parent "
                f"{parent.get('ref')} reported epsilon {float(parent.get('epsilon', math.nan)):.4g} by "
                f"{by}{source}, {why}: both are recorded (manifest privacy.accountant, privacy.parent_epsilon)")

    @property
    def declared_epsilon(self) -> float:
        return float(sum(d.epsilon for d in self.declared))

    def total_delta(self, delta: float) -> float:
        """The delta a run's epsilon holds at: its own plus the declared ones (basic composition)."""
        return float(delta + sum(d.delta for d in self.declared))


def continuing_accountant(parent: str | None) -> str:
    """The accountant a child run continues with: its parent's if ours, else ``pld``; ``rdp`` for none."""
    if parent is None:
        return "rdp"
    return parent if parent in ACCOUNTANTS else "pld"


def ancestry_note(manifest: Mapping[str, Any] | None) -> str | None:
    """What every report of a run's epsilon must add about its ancestors (unknown or declared), or None."""
    manifest = manifest or {}
    privacy = manifest.get("privacy")
    if not privacy:
        imported = isinstance(manifest.get("lineage"), Mapping) and manifest["lineage"].get("imported_from")
        return UNKNOWN_ANCESTRY if imported else None
    history = PrivacyHistory.from_manifest(privacy)
    if history.unknown or not history.declared:
        return UNKNOWN_ANCESTRY if history.unknown else None
    delta = privacy.get("total_delta", history.total_delta(0.0))
    return f"epsilon includes the declared epsilon of imported ancestors and holds at delta {delta:.3g}"
