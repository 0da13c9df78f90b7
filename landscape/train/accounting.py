"""Privacy accounting for Poisson-subsampled Gaussian steps: exact RDP of our own, PLD from ``dp_accounting``.

``rdp`` (default) is exact at Opacus' orders (the signed series of Mironov, Talwar & Zhang 2019 at fractional
ones; ``dp_accounting``'s RDP drops the signs, an upper bound) with Balle et al. (2020) Thm. 21's conversion, as
Opacus. ``pld`` is tighter and slower. Reference: sigma = 1.1, q = 256/60000, 14062 steps, delta = 1e-5 ->
epsilon 2.59656 (rdp).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Sequence

import numpy as np

from landscape.errors import PrivacyError, UsageError, param
from landscape.privacy import ACCOUNTANTS, PrivacyEvent, PrivacyHistory

# Opacus' default RDP orders (opacus.accountants.RDPAccountant.DEFAULT_ALPHAS)
RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
PLD_DISCRETIZATION = 1e-4
MAX_NOISE_MULTIPLIER = 1e4


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Steps in one epoch: ceil(N/B) (the number of shuffled batches; Poisson sampling uses the same count)."""
    return max(1, math.ceil(n / batch_size))


def schedule_steps(epochs: int, dataset_size: int, batch_size: int) -> int:
    """Steps of ``epochs`` epochs as ``landscape train`` runs them: ``epochs * ceil(N / B)``.

    One epoch is :func:`steps_per_epoch` steps (ceil(N/B): the number of shuffled
    batches of size B; Poisson sampling uses the same count). Not Opacus' ``int(epochs * N / B)``.
    """
    if isinstance(epochs, bool) or int(epochs) != epochs or epochs < 0:
        raise UsageError(f"epochs must be a whole number >= 0 (the trainer runs whole epochs), got {epochs}")
    return int(epochs) * steps_per_epoch(int(dataset_size), int(batch_size))


class AccountantWarning(UserWarning):
    """A child run's epsilon is by another accountant than the one its parent's epsilon came from."""


def history_epsilon(history: PrivacyHistory, own: PrivacyEvent | None, delta: float = 1e-5,
                    method: str = "rdp") -> float:
    """Epsilon of the ancestors' accounted steps composed with ``own`` (exactly, by the accountant), plus the
    declared epsilons; it holds at :meth:`PrivacyHistory.total_delta`. Unknown ancestors are not in it."""
    events = [*history.events, *([own] if own is not None else [])]
    return composed_epsilon(events, delta, method) + history.declared_epsilon


def _check_method(method: str) -> str:
    if method == "prv":
        raise UsageError("the PRV accountant is not in dp_accounting; use rdp or pld")
    if method not in ACCOUNTANTS:
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
    """dp_accounting may log via absl (it did for every RDP order it dropped); keep stderr clean."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# ------------------------------------------------------------------ RDP of the sampled Gaussian mechanism

# Relative truncation of the fractional-order series (see _log_a_fractional) and the chunk sizes it is summed in.
SERIES_RTOL = 1e-16
_FIRST_CHUNK, _MAX_CHUNK, _MAX_TERMS = 256, 1 << 16, 1 << 24


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    """``log A_alpha`` at an integer order: the finite binomial sum (Mironov et al. 2019, Sec. 3.3), its ``k >= 2``
terms with ``expm1`` summed in log space, so ``log A = log1p(A - 1)`` keeps full precision when the RDP is tiny."""
    from scipy import special

    if alpha < 2:
        return 0.0
    k = np.arange(2, alpha + 1, dtype=np.float64)
    x = (k * k - k) / (2.0 * sigma * sigma)
    log_expm1 = np.where(x > 30.0, x, np.log(np.expm1(np.minimum(x, 30.0))))  # log(e^x - 1)
    with np.errstate(divide="ignore"):
        log_terms = (special.gammaln(alpha + 1.0) - special.gammaln(k + 1.0) - special.gammaln(alpha - k + 1.0)
                     + k * math.log(q) + (alpha - k) * math.log1p(-q) + log_expm1)
    return float(np.logaddexp(0.0, special.logsumexp(log_terms)))


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    """``log A_alpha`` at a fractional order (Mironov et al. 2019, Sec. 3.3), with the terms' signs kept: the two
generalized binomial series split at ``z0``, summed in chunks until the last term past ``k = alpha`` is below
``SERIES_RTOL`` times the sum (docs/privacy.md, "How the RDP is computed", says why that bounds the error)."""
    from scipy import special

    s2 = sigma * sigma
    z0 = s2 * math.log(1.0 / q - 1.0) + 0.5
    lq, l1q = math.log(q), math.log1p(-q)
    gauss_tail = alpha * l1q - z0 * z0 / (2.0 * s2) + math.log(0.5)  # common factor past the split
    sqrt2s = math.sqrt(2.0) * sigma
    lg_alpha = special.gammaln(alpha + 1.0)
    start, chunk = 0, _FIRST_CHUNK
    scale = None
    total = 0.0
    while True:
        k = np.arange(start, start + chunk, dtype=np.float64)
        j = alpha - k
        log_binom = lg_alpha - special.gammaln(k + 1.0) - special.gammaln(j + 1.0)
        sign = special.gammasgn(j + 1.0)
        # k-side: Phi((z0 - k)/s); for k > z0 the erfcx form (no cancellation)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            near0 = k * lq + j * l1q + (k * k - k) / (2.0 * s2) + special.log_ndtr((z0 - k) / sigma)
            far0 = gauss_tail + np.log(special.erfcx(np.maximum(k - z0, 0.0) / sqrt2s))
            near1 = j * lq + k * l1q + (j * j - j) / (2.0 * s2) + special.log_ndtr((j - z0) / sigma)
            far1 = gauss_tail + np.log(special.erfcx(np.maximum(z0 - j, 0.0) / sqrt2s))
        log0 = log_binom + np.where(k > z0, far0, near0)
        log1 = log_binom + np.where(j < z0, far1, near1)
        top = float(max(log0.max(), log1.max()))
        if scale is None or top > scale:  # keep exp() in range when the terms peak after the first chunk
            total = 0.0 if scale is None else total * math.exp(scale - top)
            scale = top
        terms = sign * (np.exp(log0 - scale) + np.exp(log1 - scale))
        total += float(terms.sum())
        start += chunk
        last = float(abs(terms[-1]))
        if start - 1 > alpha + 1 and total > 0 and last <= SERIES_RTOL * total:
            return scale + math.log(total)
        if start >= _MAX_TERMS:  # not reached for q in (0, 1) and sigma > 0 met in practice; be conservative
            raise PrivacyError(f"the RDP series did not converge (q={q:g}, sigma={sigma:g}, order {alpha:g})")
        chunk = min(2 * chunk, _MAX_CHUNK)


def sgm_rdp(noise_multiplier: float, sample_rate: float, orders: Sequence[float] = ()) -> np.ndarray:
    """RDP of ONE step of the sampled Gaussian mechanism at each order (default ``RDP_ORDERS``).

    ``eps(alpha) = log(A_alpha) / (alpha - 1)`` (Mironov et al. 2019, Sec. 3.3): exact at integer orders,
    the signed convergent series at fractional ones; ``q = 1`` is the Gaussian mechanism ``alpha / (2 s^2)``,
    ``q = 0`` costs 0, ``sigma = 0`` is ``inf``.
    """
    orders = tuple(float(a) for a in (orders or RDP_ORDERS))
    return np.array(_sgm_rdp_cached(float(noise_multiplier), float(sample_rate), orders))


@functools.lru_cache(maxsize=512)
def _sgm_rdp_cached(sigma: float, q: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    out = []
    for a in orders:
        if not a > 1:
            raise UsageError(f"RDP orders must be > 1, got {a}")
        if q == 0:
            out.append(0.0)
        elif sigma == 0:
            out.append(math.inf)
        elif q == 1:
            out.append(a / (2.0 * sigma * sigma))
        elif a.is_integer():
            out.append(_log_a_integer(q, sigma, int(a)) / (a - 1.0))
        else:
            out.append(_log_a_fractional(q, sigma, a) / (a - 1.0))
    return tuple(out)


def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> tuple[float, float]:
    """``(epsilon, optimal order)``: ``min_alpha rdp(alpha) + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1)``.

    Balle et al. (2020), "Hypothesis testing interpretations and Renyi differential privacy", Thm. 21 (the
    conversion of Opacus' ``get_privacy_spent``; Canonne et al. 2020, Prop. 12); clipped at 0.
    """
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        eps = r - (math.log(delta) + np.log(a)) / (a - 1.0) + np.log((a - 1.0) / a)
    if np.isnan(eps).all():
        return math.inf, math.nan
    i = int(np.nanargmin(eps))
    return max(0.0, float(eps[i])), float(a[i])


def _rdp_epsilon_of(events: Sequence[PrivacyEvent], delta: float) -> float:
    rdp = sum(int(e.steps) * sgm_rdp(e.noise_multiplier, e.sample_rate) for e in events)
    return rdp_to_epsilon(RDP_ORDERS, rdp, delta)[0]


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
    if method == "rdp":  # our own RDP logs nothing (quieting absl at every step cost ~3% of a DP run)
        return _rdp_epsilon_of([PrivacyEvent(float(noise_multiplier), float(sample_rate), int(steps))], float(delta))
    with _quiet_absl():
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
    if method == "rdp":
        return _rdp_epsilon_of(events, delta)
    with _quiet_absl():
        import dp_accounting

        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
        acc.compose(dp_accounting.ComposedDpEvent([_event(e.noise_multiplier, e.sample_rate, e.steps)
                                                   for e in events]))
        return float(acc.get_epsilon(delta))


def noise_for_epsilon(target_epsilon: float, sample_rate: float, steps: int, delta: float = 1e-5,
                      method: str = "rdp", *, history: PrivacyHistory | Sequence[PrivacyEvent] = (),
                      rtol: float = 0.005) -> float:
    """Smallest-found noise multiplier whose epsilon is ``<= target_epsilon`` and within ``rtol`` of it.

    Bisection on the accountant like Opacus' ``get_noise_multiplier``: double an upper bracket until its
    epsilon is below the target, then bisect until ``target * (1 - rtol) <= epsilon <= target``. With a
    ``history`` (earlier DP steps, e.g. a DP parent run, or a :class:`PrivacyHistory` with declared
    guarantees) the epsilon is that of the composition (:func:`history_epsilon`).
    """
    _check_method(method)
    _check(None, sample_rate, steps, delta)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise UsageError(f"target epsilon must be a positive number, got {target_epsilon}")
    if steps == 0:
        raise PrivacyError("zero steps spend no privacy; there is no noise multiplier to find")
    history = PrivacyHistory.of(history)
    history = PrivacyHistory([e for e in history.events if e.steps > 0], declared=history.declared)
    key = (float(target_epsilon), float(sample_rate), int(steps), float(delta), method, float(rtol), repr(history))
    if key not in _NOISE_FOUND:  # runs that share a calibration (copies, seeds) bisect once per process
        _NOISE_FOUND[key] = _bisect_noise(target_epsilon, sample_rate, steps, delta, method, history, rtol)
    return _NOISE_FOUND[key]


_NOISE_FOUND: dict = {}


def _bisect_noise(target_epsilon: float, sample_rate: float, steps: int, delta: float, method: str,
                  history: PrivacyHistory, rtol: float) -> float:
    if history.events or history.declared:
        spent = history_epsilon(history, None, delta, method)
        if spent >= target_epsilon:
            raise PrivacyError(f"the parent run already spent epsilon {spent:.3g} >= "
                               f"{param('target_epsilon', format(target_epsilon, 'g'))}; raise the target or give "
                               f"{param('noise_multiplier')}")

    def eps(s: float) -> float:
        return history_epsilon(history, PrivacyEvent(s, sample_rate, steps), delta, method)

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
