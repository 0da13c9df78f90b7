"""What an Opacus ``PrivacyEngine`` knows, for ``landscape.Recorder(..., privacy=OpacusPrivacy(...))``
(docs/own-code.md). Nothing here imports Opacus: its objects are read through their attributes."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

from landscape.errors import UsageError


class OpacusPrivacy:
    """The privacy source (``landscape.recorder.PrivacySource``) of an Opacus training loop: ``engine`` the
    ``PrivacyEngine``, ``optimizer`` and ``data_loader`` what ``make_private`` returned (the loader may be omitted
    once the accountant counted a step), ``delta`` that of every epsilon recorded."""

    def __init__(self, engine: Any, optimizer: Any, data_loader: Any = None, *, delta: float = 1e-5) -> None:
        self.accountant = getattr(engine, "accountant", None)
        if self.accountant is None or not callable(getattr(self.accountant, "get_epsilon", None)):
            raise UsageError("the PrivacyEngine has no accountant to read epsilon from; create it with "
                             "PrivacyEngine(accountant='rdp') (or 'prv', 'gdp')")
        if not isinstance(getattr(optimizer, "noise_multiplier", None), (int, float)) or not hasattr(optimizer,
                                                                                                  "max_grad_norm"):
            raise UsageError("optimizer= must be the DPOptimizer that make_private returned (it has no "
                             "noise_multiplier / max_grad_norm)")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise UsageError(f"delta must be in (0, 1), got {delta}")
        self.optimizer = optimizer
        self.delta = float(delta)
        self.sampling = "poisson" if hasattr(data_loader, "sample_rate") else "shuffle"
        if data_loader is not None:
            self.sample_rate = float(getattr(data_loader, "sample_rate", None) or 1.0 / len(data_loader))
        else:
            history = list(getattr(self.accountant, "history", []))
            if not history:
                raise UsageError("give data_loader= (the loader make_private returned): its sample rate is "
                                 "not known before the first step")
            self.sample_rate = float(history[-1][1])
            self.sampling = "poisson"

    def _history(self) -> list[tuple[float, float, int]]:
        """The accountant's ``(noise multiplier, sample rate, steps)`` entries, which must all be this run's."""
        history = [tuple(h) for h in getattr(self.accountant, "history", [])]
        sigma_now = float(self.optimizer.noise_multiplier)
        for sigma, q, _ in history:
            if (float(sigma), float(q)) != (sigma_now, self.sample_rate):
                raise UsageError(
                    f"the accountant counted steps with noise multiplier {sigma:g} and sample rate {q:g}, not "
                    f"{sigma_now:g} and {self.sample_rate:g}; a recorded DP run has one noise multiplier and one "
                    "sample rate (no noise schedule)")
        return history

    def record(self) -> dict[str, Any]:
        """The ``manifest["privacy"]`` fields (as ``landscape train`` writes them for a DP run)."""
        mechanism = self.accountant.mechanism() if callable(getattr(self.accountant, "mechanism", None)) else "unknown"
        norm = self.optimizer.max_grad_norm  # a list with Opacus' clipping="per_layer"
        return {"noise_multiplier": float(self.optimizer.noise_multiplier), "sample_rate": self.sample_rate,
                "max_grad_norm": [float(v) for v in norm] if isinstance(norm, (list, tuple)) else float(norm),
                "delta": self.delta,
                "accountant": str(mechanism), "sampling": self.sampling, "source": "opacus"}

    def steps(self) -> int:
        return int(sum(int(n) for _, _, n in self._history()))

    def epsilon(self, ancestors: Sequence[Any] = ()) -> float:
        """``accountant.get_epsilon(delta)`` (0 before the first step, where Opacus' PRV accountant fails), composed
        with the ``ancestors``' steps by a copy of the accountant with their entries first in its history."""
        accountant = self.accountant
        if ancestors:
            accountant = copy.deepcopy(accountant)
            accountant.history = [(float(e.noise_multiplier), float(e.sample_rate), int(e.steps)) for e in ancestors
                                  ] + list(accountant.history)
        elif self.steps() == 0:
            return 0.0
        eps = float(accountant.get_epsilon(self.delta))
        return eps if not math.isnan(eps) else math.inf

    def state(self) -> dict[str, Any]:
        return {"history": [[float(s), float(q), int(n)] for s, q, n in self._history()]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.accountant.history = [(float(s), float(q), int(n)) for s, q, n in state["history"]]
