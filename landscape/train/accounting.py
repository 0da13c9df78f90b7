"""Privacy accounting for Poisson-subsampled Gaussian steps, with Google's ``dp_accounting`` library.

Every DP-SGD step is ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` (add/remove-one neighbouring);
``T`` steps are that event self-composed ``T`` times. Methods:

- ``rdp``: Renyi DP (Mironov 2017; ``dp_accounting.rdp.RdpAccountant``) evaluated at Opacus' default orders
  ``[1 + x/10 for x in 1..99] + [12..63]``, so our numbers equal Opacus' ``RDPAccountant`` (both convert RDP
  to (eps, delta) with the bound of Canonne et al. 2020, Prop. 12). ``dp_accounting``'s own default orders
  are a different grid and can give slightly different epsilons.
- ``pld``: privacy loss distributions (``dp_accounting.pld.PLDAccountant``, discretisation 1e-4), tighter
  (e.g. 2.38 instead of 2.60 for the reference schedule below) and slower (~0.5 s for 14k steps).

``dp_accounting`` has no PRV accountant (that lives in Opacus / Microsoft's prv_accountant); we offer
``rdp`` and ``pld`` only and ``method="prv"`` is a usage error saying so.

Reference (issue 3): sigma = 1.1, q = 256/60000, 60 epochs = int(60 * 60000 / 256) = 14062 steps,
delta = 1e-5 -> epsilon 2.59656 (rdp).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from landscape.errors import PrivacyError, UsageError

METHODS = ("rdp", "pld")
# Opacus' default RDP orders (opacus.accountants.RDPAccountant.DEFAULT_ALPHAS)
RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
PLD_DISCRETIZATION = 1e-4
MAX_NOISE_MULTIPLIER = 1e4


@dataclass
class PrivacyEvent:
    """``steps`` steps of the Poisson-subsampled Gaussian mechanism (noise multiplier, sample rate)."""

    noise_multiplier: float
    sample_rate: float
    steps: int


def _check_method(method: str) -> str:
    if method == "prv":
        raise UsageError("the PRV accountant is not in dp_accounting; use --method rdp or --method pld")
    if method not in METHODS:
        raise UsageError(f"unknown accounting method {method!r}; choose rdp or pld")
    return method


def _check(noise_multiplier: float | None, sample_rate: float, steps: int, delta: float) -> None:
    if noise_multiplier is not None and not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise UsageError(f"noise multiplier must be a number >= 0, got {noise_multiplier}")
    if not (0 < sample_rate <= 1):
        raise UsageError(f"sample rate must be in (0, 1], got {sample_rate}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 0:
        raise UsageError(f"steps must be a whole number >= 0, got {steps}")
    if not (0 < delta < 1):
        raise UsageError(f"delta must be in (0, 1), got {delta}")


def _event(noise_multiplier: float, sample_rate: float, steps: int):
    import dp_accounting

    step = dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier))
    return dp_accounting.SelfComposedDpEvent(step, int(steps))


@contextlib.contextmanager
def _quiet_absl():
    """dp_accounting logs (via absl) every RDP order it drops at very small sigma; keep stderr clean."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@functools.lru_cache(maxsize=256)
def _rdp_one_step(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """RDP of ONE step at every order of ``RDP_ORDERS`` (composition of identical steps is linear).

    At very small sigma dp_accounting drops the small orders whose series does not converge (their RDP
    becomes inf), which can make our epsilon larger (more conservative) than Opacus' there; for
    sigma >~ 0.7 the two agree to float precision.
    """
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(list(RDP_ORDERS))
    with _quiet_absl():
        acc.compose(_event(noise_multiplier, sample_rate, 1))
    return acc.rdp


def _rdp_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rdp = _rdp_one_step(float(noise_multiplier), float(sample_rate)) * int(steps)
    return float(compute_epsilon(list(RDP_ORDERS), list(rdp), delta)[0])


@functools.lru_cache(maxsize=256)
def _pld_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    from dp_accounting.pld import PLDAccountant

    acc = PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    acc.compose(_event(noise_multiplier, sample_rate, steps))
    return float(acc.get_epsilon(delta))


def epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float = 1e-5, method: str = "rdp"
) -> float:
    """(epsilon, delta)-DP of ``steps`` Poisson-subsampled Gaussian steps; ``inf`` for sigma = 0."""
    _check_method(method)
    _check(noise_multiplier, sample_rate, steps, delta)
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    with _quiet_absl():
        if method == "rdp":
            return _rdp_epsilon(float(noise_multiplier), float(sample_rate), int(steps), float(delta))
        return _pld_epsilon(float(noise_multiplier), float(sample_rate), int(steps), float(delta))


def composed_epsilon(events: Sequence[PrivacyEvent], delta: float = 1e-5, method: str = "rdp") -> float:
    """(epsilon, delta)-DP of a sequence of differently parameterised runs of steps (e.g. a Phase-2 run and
    its DP ancestors), composed by the accountant: RDP vectors add; PLD composes the events.

    One event is exactly :func:`epsilon`.
    """
    _check_method(method)
    events = [e for e in events if e.steps > 0]
    for e in events:
        _check(e.noise_multiplier, e.sample_rate, e.steps, delta)
    if not events:
        return 0.0
    if len(events) == 1:
        e = events[0]
        return epsilon(e.noise_multiplier, e.sample_rate, e.steps, delta, method)
    if any(e.noise_multiplier == 0 for e in events):
        return math.inf
    with _quiet_absl():
        if method == "rdp":
            from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

            rdp = sum(int(e.steps) * _rdp_one_step(float(e.noise_multiplier), float(e.sample_rate)) for e in events)
            return float(compute_epsilon(list(RDP_ORDERS), list(rdp), delta)[0])
        import dp_accounting

        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
        acc.compose(dp_accounting.ComposedDpEvent([_event(e.noise_multiplier, e.sample_rate, e.steps)
                                                   for e in events]))
        return float(acc.get_epsilon(delta))


def noise_for_epsilon(
    target_epsilon: float,
    sample_rate: float,
    steps: int,
    delta: float = 1e-5,
    method: str = "rdp",
    *,
    history: Sequence[PrivacyEvent] = (),
    rtol: float = 0.005,
) -> float:
    """Smallest-found noise multiplier whose epsilon is ``<= target_epsilon`` and within ``rtol`` of it.

    Bisection on the accountant like Opacus' ``get_noise_multiplier``: double an upper bracket until its
    epsilon is below the target, then bisect until ``target * (1 - rtol) <= epsilon <= target``. With a
    ``history`` (earlier DP steps, e.g. a DP parent run) the epsilon is that of the composition.
    """
    _check_method(method)
    _check(None, sample_rate, steps, delta)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise UsageError(f"target epsilon must be a positive number, got {target_epsilon}")
    if steps == 0:
        raise PrivacyError("zero steps spend no privacy; there is no noise multiplier to find")
    history = [e for e in history if e.steps > 0]
    if history:
        spent = composed_epsilon(history, delta, method)
        if spent >= target_epsilon:
            raise PrivacyError(f"the parent run already spent epsilon {spent:.3g} >= --target-epsilon "
                               f"{target_epsilon:g}; raise the target or give --noise-multiplier")

    def eps(s: float) -> float:
        return composed_epsilon([*history, PrivacyEvent(s, sample_rate, steps)], delta, method)

    hi = 1.0
    while eps(hi) > target_epsilon:
        hi *= 2.0
        if hi > MAX_NOISE_MULTIPLIER:
            raise PrivacyError(
                f"epsilon {target_epsilon} is out of reach for q={sample_rate:.4g}, {steps} steps, "
                f"delta={delta:g} even with noise multiplier {MAX_NOISE_MULTIPLIER:g}; raise the target"
            )
    lo = 0.0
    e_hi = eps(hi)
    for _ in range(200):
        if e_hi >= target_epsilon * (1.0 - rtol):
            return hi
        mid = 0.5 * (lo + hi)
        e_mid = eps(mid)
        if e_mid > target_epsilon:
            lo = mid
        else:
            hi, e_hi = mid, e_mid
        if hi - lo < 1e-9 * hi:
            break
    return hi


class Accountant:
    """Epsilon so far for a run of identical steps (one noise multiplier and sample rate).

    ``step(n)`` counts steps; ``epsilon()`` is cheap for ``rdp`` (one cached per-step RDP vector times the
    step count) and cached per step count for ``pld``. ``state_dict`` / ``load_state_dict`` for resume.
    """

    def __init__(self, noise_multiplier: float, sample_rate: float, delta: float = 1e-5, method: str = "rdp"):
        _check_method(method)
        _check(noise_multiplier, sample_rate, 0, delta)
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)
        self.delta = float(delta)
        self.method = method
        self.steps = 0

    def step(self, n: int = 1) -> None:
        if n < 0:
            raise UsageError(f"cannot count a negative number of steps ({n})")
        self.steps += int(n)

    def epsilon(self, delta: float | None = None) -> float:
        return epsilon(
            self.noise_multiplier,
            self.sample_rate,
            self.steps,
            self.delta if delta is None else delta,
            self.method,
        )

    def state_dict(self) -> dict:
        return {
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "delta": self.delta,
            "method": self.method,
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.__init__(state["noise_multiplier"], state["sample_rate"], state["delta"], state["method"])
        self.steps = int(state["steps"])
