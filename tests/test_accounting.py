"""Privacy accounting through dp_accounting: reference numbers, calibration, errors, the running accountant."""

from __future__ import annotations

import math

import pytest

from landscape.errors import PrivacyError, UsageError
from landscape.train.accounting import Accountant, epsilon, noise_for_epsilon

Q = 256 / 60000
STEPS = int(60 * 60000 / 256)  # 14062, as Opacus counts 60 epochs


def test_reference_epsilon_rdp():
    assert STEPS == 14062
    assert epsilon(1.1, Q, STEPS, 1e-5, "rdp") == pytest.approx(2.5966, abs=1e-3)


def test_matches_opacus_rdp():
    opacus = pytest.importorskip("opacus.accountants")
    acc = opacus.RDPAccountant()
    acc.history = [(1.1, Q, STEPS)]
    assert epsilon(1.1, Q, STEPS, 1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-8)


def test_pld_is_tighter_than_rdp():
    e_pld = epsilon(1.1, Q, 2000, 1e-5, "pld")
    assert 0 < e_pld < epsilon(1.1, Q, 2000, 1e-5, "rdp")


def test_target_epsilon_three():
    sigma = noise_for_epsilon(3.0, Q, STEPS, 1e-5, "rdp")
    e = epsilon(sigma, Q, STEPS, 1e-5)
    assert 3.0 * 0.99 <= e <= 3.0
    assert 0.9 < sigma < 1.1  # less noise than for 2.6


def test_edge_cases_and_errors():
    assert epsilon(1.0, 0.01, 0, 1e-5) == 0.0
    assert math.isinf(epsilon(0.0, 0.01, 10, 1e-5))
    for bad in [
        dict(sample_rate=0),
        dict(sample_rate=1.5),
        dict(delta=0),
        dict(delta=1),
        dict(steps=-1),
        dict(steps=2.5),
        dict(noise_multiplier=-1),
    ]:
        args = dict(noise_multiplier=1.0, sample_rate=0.01, steps=10, delta=1e-5) | bad
        with pytest.raises(UsageError):
            epsilon(**args)
    with pytest.raises(UsageError, match="PRV"):
        epsilon(1.0, 0.01, 10, 1e-5, "prv")
    with pytest.raises(UsageError):
        noise_for_epsilon(0.0, Q, 100)
    with pytest.raises(PrivacyError, match="out of reach"):
        noise_for_epsilon(1e-9, 1.0, 10**6, 1e-5)


def test_accountant_accumulates():
    acc = Accountant(1.1, Q, 1e-5)
    assert acc.epsilon() == 0.0
    acc.step(STEPS - 62)
    acc.step(62)
    assert acc.epsilon() == pytest.approx(2.5966, abs=1e-3)
    again = Accountant(2.0, 0.5)
    again.load_state_dict(acc.state_dict())
    assert again.steps == STEPS and again.epsilon() == acc.epsilon()


def test_composition_of_equal_events_equals_one_longer_run():
    from landscape.train.accounting import PrivacyEvent, composed_epsilon, epsilon

    q = 256 / 60000
    split = [PrivacyEvent(1.1, q, 4000), PrivacyEvent(1.1, q, 6000)]
    assert composed_epsilon(split, 1e-5, "rdp") == pytest.approx(epsilon(1.1, q, 10000, 1e-5, "rdp"), rel=1e-12)
    assert composed_epsilon(split, 1e-5, "pld") == pytest.approx(epsilon(1.1, q, 10000, 1e-5, "pld"), rel=1e-3)
    mixed = [PrivacyEvent(0.8, q, 3000), PrivacyEvent(1.5, q, 3000)]
    assert epsilon(1.5, q, 3000) < composed_epsilon(mixed) < epsilon(0.8, q, 6000)
    assert composed_epsilon([PrivacyEvent(1.0, q, 0)]) == 0.0


def test_noise_for_epsilon_with_history_composes_and_refuses_a_spent_budget():
    from landscape.train.accounting import PrivacyEvent, composed_epsilon, noise_for_epsilon

    q = 64 / 1347
    history = [PrivacyEvent(1.0, q, 50)]
    sigma = noise_for_epsilon(8.0, q, 100, 1e-5, history=history)
    total = composed_epsilon([*history, PrivacyEvent(sigma, q, 100)], 1e-5)
    assert 8.0 * 0.995 <= total <= 8.0
    with pytest.raises(PrivacyError, match="already spent"):
        noise_for_epsilon(0.5, q, 100, 1e-5, history=history)
