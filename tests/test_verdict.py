"""The decision rules of landscape/verdict.py against independent references.

Welch's and the paired t-test against closed forms written here (the Welch-Satterthwaite df by hand, the t
distribution from ``scipy.special.stdtr``) and against ``scipy.stats.ttest_ind`` / ``ttest_rel``; the TOST rule
against the two one-sided tests done separately; the trend rule against ranks computed by a double loop; the
bootstrap interval against a plain Python resampling loop with the same generator.
"""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from landscape.verdict import (
    ALPHA,
    INVALID,
    Verdict,
    all_of,
    below,
    bootstrap_ci,
    far_below,
    greater,
    inconclusive,
    ordered,
    paired_greater,
    similar,
    spread,
)


def welch_by_hand(a, b):
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    t = (ma - mb) / math.sqrt(va + vb)
    return t, df, 1.0 - special.stdtr(df, t)  # one-sided p of a > b


def rule(p_claim, p_other):
    return True if p_claim < ALPHA else (False if p_other < ALPHA else None)


def test_spread_is_the_sample_standard_deviation():
    xs = [0.3, 1.9, 0.7, 0.25]
    assert spread(xs) == pytest.approx(statistics.stdev(xs), rel=1e-12)
    assert math.isnan(spread([1.0])) and math.isnan(spread([]))


finite = st.floats(-100, 100, allow_nan=False, allow_subnormal=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=2, max_size=6), st.lists(finite, min_size=2, max_size=6))
def test_greater_is_welchs_one_sided_t_test(a, b):
    if spread(a) < 1e-6 or spread(b) < 1e-6:
        return
    v = greater("c", "s", a, b)
    t, df, p = welch_by_hand(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    assert v.numbers["t"] == pytest.approx(t, rel=1e-9, abs=1e-12) == pytest.approx(ref.statistic, rel=1e-9)
    assert v.numbers["df"] == pytest.approx(df, rel=1e-9)
    assert v.numbers["p"] == pytest.approx(p, rel=1e-6, abs=1e-12) and v.numbers["p"] == pytest.approx(ref.pvalue,
                                                                                                      abs=1e-9)
    assert v.held is rule(p, 1.0 - p)
    # the (1 - 2 alpha) interval excludes 0 exactly when the one-sided test rejects
    lo, hi = v.numbers["ci low"], v.numbers["ci high"]
    assert (lo > 0) == (v.held is True) and (hi < 0) == (v.held is False)
    assert v.numbers["alpha"] == ALPHA and v.numbers["n A"] == len(a)


def test_greater_worked_cases():
    dp, sgd = [1.8, 1.9, 2.0], [0.01, 0.02, 0.015]
    v = greater("DP > SGD", "paper Fig. 5", dp, sgd, names=("DP", "SGD"))
    assert v.held is True and v.numbers["mean DP"] == pytest.approx(statistics.mean(dp))
    assert greater("c", "s", [0.1, 2.0, 3.7], [0.5, 0.6, 0.7]).held is None
    assert greater("c", "s", sgd, dp).held is False
    one = greater("c", "s", [1.9], [0.01])  # one value a side: no spread, inconclusive however large the gap
    assert one.held is None and math.isnan(one.numbers["sd A"]) and "fewer than 2" in one.test
    # no spread at all: the t statistic is undefined and the sign test over the units decides (p = 0.5^n)
    assert greater("c", "s", [1.0, 1.0], [0.0, 0.0]).held is None  # p 0.25: two units cannot make it sure
    assert greater("c", "s", [1.0] * 5, [0.0] * 5).held is True  # p 1/32
    zero = greater("c", "s", [0.0, 0.0, 0.0], [0.0, 0.0, 0.0])  # e.g. no barrier on any of 3 paths: not certain
    assert zero.held is None and zero.numbers["p against"] == 0.125
    assert zero.numbers["share bound"] == pytest.approx(1 - 0.05 ** (1 / 3))  # up to 63% could have a barrier
    assert greater("c", "s", [0.0] * 5, [0.0] * 5).held is False  # 0 of 5: p 1/32
    assert paired_greater("c", "s", [1.0, 2.0], [1.0, 2.0]).held is None
    assert paired_greater("c", "s", [1.0] * 6, [1.0] * 6).held is False
    # the old "gap > summed sd" rule held here (gap 1.0 > 0.9); Welch at n = 2 (df ~ 1) does not
    assert greater("c", "s", [1.0, 1.6364], [0.0, 0.3818]).held is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=2, max_size=6))
def test_paired_greater_is_the_paired_t_test(pairs):
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    d = [x - y for x, y in pairs]
    if spread(d) < 1e-6:
        return
    v = paired_greater("c", "s", a, b)
    ref = stats.ttest_rel(a, b, alternative="greater")
    assert v.numbers["t"] == pytest.approx(ref.statistic, rel=1e-6, abs=1e-9)
    assert v.numbers["p"] == pytest.approx(ref.pvalue, abs=1e-9)
    assert v.held is rule(ref.pvalue, 1.0 - ref.pvalue)


def test_paired_greater_worked_cases():
    a, b = [1.1, 2.12, 3.09], [1.0, 2.0, 3.0]  # a steady gap hidden by a per-seed offset
    assert greater("c", "s", a, b).held is None
    v = paired_greater("c", "s", a, b, names=("A", "B"))
    assert v.held is True and v.numbers["mean(A - B)"] == pytest.approx(0.07 + 0.1 / 3) and v.numbers["n seeds"] == 3
    assert paired_greater("c", "s", b, a).held is False
    # mean/sd = 1.013 held under the old "mean > sd" rule (t = 1.75, p = 0.11): not at alpha 0.05
    assert paired_greater("c", "s", [1.0 + x for x in (0.1, 0.9, 1.02)], [1.0, 1.0, 1.0]).held is None
    assert paired_greater("c", "s", [1.0], [0.0]).held is None
    with pytest.raises(ValueError):
        paired_greater("c", "s", [1.0, 2.0], [1.0])


@pytest.mark.parametrize("paired", [False, True])
def test_similar_is_two_one_sided_tests(paired):
    rng = np.random.default_rng(3)
    for _ in range(50):
        a, b = rng.normal(0.9, 0.02, 4), rng.normal(0.9 + rng.uniform(-0.05, 0.05), 0.02, 4)
        margin = 0.03
        v = similar("c", "s", a, b, tolerance=margin, paired=paired)
        if paired:  # TOST: both shifted one-sided tests reject
            lower = stats.ttest_rel(a - margin, b, alternative="less").pvalue   # diff < +margin
            upper = stats.ttest_rel(a + margin, b, alternative="greater").pvalue  # diff > -margin
            beyond_hi = stats.ttest_rel(a - margin, b, alternative="greater").pvalue
            beyond_lo = stats.ttest_rel(a + margin, b, alternative="less").pvalue
        else:
            lower = stats.ttest_ind(a - margin, b, equal_var=False, alternative="less").pvalue
            upper = stats.ttest_ind(a + margin, b, equal_var=False, alternative="greater").pvalue
            beyond_hi = stats.ttest_ind(a - margin, b, equal_var=False, alternative="greater").pvalue
            beyond_lo = stats.ttest_ind(a + margin, b, equal_var=False, alternative="less").pvalue
        expected = True if max(lower, upper) < ALPHA else (False if min(beyond_hi, beyond_lo) < ALPHA else None)
        assert v.held is expected
    v = similar("c", "s", [0.95, 0.952, 0.948], [0.93, 0.929, 0.931], tolerance=0.01, names=("noise", "SGD"))
    assert v.held is False and v.numbers["margin"] == 0.01 and "0.01" in v.test
    assert similar("c", "s", [0.95, 0.95], [0.93, 0.93], tolerance=0.025).held is None  # no spread, 2 units: p 0.25
    assert similar("c", "s", [0.95] * 5, [0.93] * 5, tolerance=0.025).held is True  # sign test over 5: p 1/32
    assert similar("c", "s", [0.95], [0.93, 0.94], tolerance=1.0).held is None


def spearman_by_hand(xs, ys):
    def ranks(v):
        return [sum(w < x for w in v) + (sum(w == x for w in v) + 1) / 2 for x in v]

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((p - mx) * (q - my) for p, q in zip(rx, ry, strict=True))
    rho = cov / math.sqrt(sum((p - mx) ** 2 for p in rx) * sum((q - my) ** 2 for q in ry))
    n = len(xs)
    t = rho * math.sqrt((n - 2) / (1 - rho ** 2)) if abs(rho) < 1 else math.copysign(math.inf, rho)
    return rho, special.stdtr(n - 2, t)  # p of a falling trend (rho < 0)


def test_ordered_is_a_one_sided_spearman_trend():
    rng = np.random.default_rng(0)
    for _ in range(40):
        groups = {k: list(rng.normal(-0.3 * k * rng.uniform(0, 1), 0.3, 3)) for k in (1, 2, 4)}
        v = ordered("falls", "s", groups)
        xs = [k for k in groups for _ in groups[k]]
        ys = [y for k in groups for y in groups[k]]
        rho, p_down = spearman_by_hand(xs, ys)
        assert v.numbers["spearman rho"] == pytest.approx(rho, rel=1e-9)
        assert v.numbers["p"] == pytest.approx(p_down, rel=1e-6)
        assert v.held is rule(p_down, 1.0 - p_down)
    falling = {1: [1.9, 1.8], 2: [1.0, 1.1], 4: [0.3, 0.4]}
    v = ordered("falls", "s", falling)
    assert v.held is True and v.numbers["k"] == [1, 2, 4] and v.numbers["mean"] == pytest.approx([1.85, 1.05, 0.35])
    assert ordered("rises", "s", falling, decreasing=False).held is False
    assert ordered("falls", "s", {1: [1.9], 2: [1.0]}).held is None  # two values: no trend measurable


def test_bootstrap_ci_is_a_percentile_interval_of_resampled_means():
    a, b = [0.3, 0.9, 1.4, 2.2], [0.1, 0.2, 0.5]
    lo, hi = bootstrap_ci(a, b, n=500, seed=7)
    rng = np.random.default_rng(7)
    ia = rng.integers(0, len(a), (500, len(a)))
    ib = rng.integers(0, len(b), (500, len(b)))
    stat = sorted(sum(a[j] for j in ia[i]) / len(a) - sum(b[j] for j in ib[i]) / len(b) for i in range(500))
    assert lo == pytest.approx(np.quantile(stat, ALPHA)) and hi == pytest.approx(np.quantile(stat, 1 - ALPHA))
    plo, phi = bootstrap_ci(a, [0.0, 0.5, 1.0, 1.5], paired=True, n=500, seed=7)
    assert (plo, phi) == pytest.approx(bootstrap_ci([0.3, 0.4, 0.4, 0.7], n=500, seed=7), rel=1e-12)
    assert all(math.isnan(x) for x in bootstrap_ci([1.0], [2.0, 3.0]))


def test_all_of_and_inconclusive():
    yes, no, maybe = (Verdict("c", "s", "t", {}, h) for h in (True, False, None))
    assert all_of("c", "s", [yes, yes]).held is True
    assert all_of("c", "s", [yes, maybe]).held is None
    assert all_of("c", "s", [yes, maybe, no]).held is False
    assert all_of("c", "s", []).held is None
    combined = all_of("c", "s", [yes, Verdict("p", "s", "t", {"x": float("nan")}, None)])
    back = Verdict.from_dict(json.loads(json.dumps(combined.to_dict())))  # as a figure summary stores it
    assert back.parts[0] == yes and back.parts[1].held is None and math.isnan(back.parts[1].numbers["x"])
    bad = inconclusive(all_of("c", "s", [yes, no]), "DP accuracy 0.12 below the floor 0.5")
    assert bad.held is None and all(p.held is None for p in bad.parts)
    assert bad.note.startswith(INVALID) and "floor 0.5" in bad.parts[1].note
    assert bad.numbers == {"held": 0, "did not hold": 0, "inconclusive": 2}  # the counts follow the parts


def test_far_below_uses_the_quantile_and_the_median():
    sample = np.linspace(0.0, 1.0, 101)  # q0.1 = 0.1, median = 0.5
    assert far_below("c", "s", 0.05, sample).held is True
    assert far_below("c", "s", 0.3, sample).held is None
    assert far_below("c", "s", 0.5, sample).held is False
    v = far_below("c", "s", 0.05, sample, names=("toward", "random"))
    assert v.numbers["fraction of random above"] == pytest.approx(np.mean(sample > 0.05))
    assert v.numbers["q0.1 random"] == pytest.approx(0.1) and v.numbers["n random"] == 101


def test_verdict_dict_is_json_and_round_trips():
    v = greater("c", "Watson et al. Fig. 5", [1.0], [0.5], note="n")
    d = json.loads(json.dumps(v.to_dict(), allow_nan=False))  # NaN spreads become null
    assert d["numbers"]["sd A"] is None and d["held"] is None and d["status"] == "inconclusive"
    back = Verdict.from_dict(d)
    assert back.claim == v.claim and back.held is None and math.isnan(back.numbers["sd A"])
    assert "[inconclusive] c (Watson et al. Fig. 5)" in v.line() and "Rule:" in v.line()
    with pytest.raises(ValueError):
        Verdict("c", "s", "t", {}, held="yes")


# ------------------------------------------------------------------ minimum effect and power


def test_min_effect_shifts_the_test_and_is_stored():
    from landscape.verdict import greater, paired_greater

    a, b = [0.80, 0.81, 0.82, 0.83, 0.84], [0.795, 0.805, 0.815, 0.825, 0.835]  # +0.5 points on every seed
    assert paired_greater("c", "s", a, b).held is True  # no spread: the sign test over 5 seeds, p 1/32
    v = paired_greater("c", "s", a, b, min_effect=0.01)
    # significant, not practical: every difference is 0.005 below the minimum
    assert v.held is False and v.numbers["min effect"] == 0.01 and v.numbers["p against"] == 0.5 ** 5
    assert paired_greater("c", "s", a[:3], b[:3], min_effect=0.01).held is None  # 3 seeds: p 0.125
    w = paired_greater("c", "s", [0.9, 0.93, 0.95], [0.8, 0.81, 0.84], min_effect=0.01)
    d = np.array([0.1, 0.12, 0.11])
    t = (d.mean() - 0.01) / (d.std(ddof=1) / math.sqrt(3))
    assert w.numbers["t"] == pytest.approx(t) and w.numbers["p"] == pytest.approx(1 - special.stdtr(2, t))
    assert w.held is True
    g = greater("c", "s", [1.0, 1.1, 1.2], [0.0, 0.1, 0.2], min_effect=2.0)
    assert g.held is False and "min effect" in g.numbers
    assert "min effect" not in greater("c", "s", [1.0, 1.1], [0.0, 0.1]).numbers  # unstated: nothing added


def test_mde_is_the_effect_scipy_noncentral_t_detects_with_80_percent_power():
    """The minimum detectable effect against scipy's noncentral t power computation, the large-df normal closed
    form (z_{1-alpha} + z_{0.8}) se, and a Monte Carlo of the paired test."""
    from landscape.verdict import POWER, mde

    for se, df in ((0.01, 2.0), (0.3, 4.0), (1.7, 9.0), (0.05, 13.2)):
        d = mde(se, df)
        crit = stats.t.ppf(1 - ALPHA, df)
        assert stats.nct.sf(crit, df, d / se) == pytest.approx(POWER, abs=1e-9)
    assert mde(1.0, 1e6) == pytest.approx(stats.norm.ppf(1 - ALPHA) + stats.norm.ppf(POWER), rel=1e-4)
    rng = np.random.default_rng(0)
    n, sd = 5, 0.6
    delta = mde(sd / math.sqrt(n), n - 1)
    x = rng.normal(delta, sd, size=(40000, n))
    rate = np.mean(x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n)) > special.stdtrit(n - 1, 1 - ALPHA))
    assert rate == pytest.approx(POWER, abs=0.01)
    assert mde(0.0, 3) == 0.0 and math.isnan(mde(math.nan, 3)) and math.isnan(mde(1.0, math.nan))
    v = paired_greater("c", "s", [0.5, 0.9, 0.6, 0.7], [0.5, 0.5, 0.5, 0.5], min_effect=0.1)
    d = np.array([0.0, 0.4, 0.1, 0.2])
    assert v.numbers["mde"] == pytest.approx(0.1 + mde(d.std(ddof=1) / 2, 3), rel=1e-12)  # beyond the minimum
    assert "power" not in v.numbers  # observed power (a function of p) is no longer reported


def test_underpowered_reads_the_stated_need_and_bound_text_states_the_equivalence():
    from landscape.verdict import bound_text, underpowered

    strong = paired_greater("c", "s", [1.0, 1.01, 1.02], [0.0, 0.0, 0.0])
    assert underpowered(strong) == "" and underpowered(strong, needs=5) == "n 3 < the 5 it needs"
    assert bound_text(strong) == ""  # held: no equivalence statement
    null = paired_greater("c", "s", [1.0, 1.0002, 0.9999, 1.0001], [1.0, 1.0, 1.0, 1.0])
    assert null.held is None
    text = bound_text(null)
    assert text.startswith(f"no difference beyond {null.numbers['ci high']:.3g} (95% upper bound)")
    assert f"{null.numbers['mde']:.3g}" in text
    flat = below("c", "s", [0.3, 0.31, 0.29], 0.1)
    assert flat.held is False and bound_text(flat).startswith(f"mean at least {flat.numbers['ci low']:.3g}")


def test_holm_against_a_hand_computed_example():
    """Holm (1979) step-down: p sorted 0.01, 0.02, 0.03, 0.04 of k = 4 -> 0.04, 0.06, 0.06, 0.06 (running maximum
    of 4*0.01, 3*0.02, 2*0.03, 1*0.04); NaN entries are not hypotheses."""
    from landscape.verdict import holm

    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.013, 0.2, 0.5, 0.6, 0.7, 0.9]) == pytest.approx([0.078, 1.0, 1.0, 1.0, 1.0, 1.0])
    out = holm([0.001, math.nan, 0.5])
    assert out[0] == pytest.approx(0.002) and math.isnan(out[1]) and out[2] == 0.5
    rng = np.random.default_rng(1)
    for _ in range(200):  # the family-wise rule by brute force: reject H_(i) iff every p_(j), j <= i, < alpha/(k-j+1)
        p = list(rng.uniform(0, 0.1, rng.integers(1, 7)))
        order = sorted(range(len(p)), key=p.__getitem__)
        reject, ok = set(), True
        for j, i in enumerate(order):
            ok = ok and p[i] < ALPHA / (len(p) - j)
            if ok:
                reject.add(i)
        assert {i for i, a in enumerate(holm(p)) if a < ALPHA} == reject


def test_all_of_applies_holm_on_the_did_not_hold_side_only():
    def part(held, p_against):
        return Verdict("p", "s", "t", {"p against": p_against}, held)

    # one part of six refutes at 0.013 alone; Holm's bound is 0.05/6: inconclusive, not "did not hold"
    v = all_of("c", "s", [part(False, 0.013)] + [part(None, 0.5)] * 5)
    assert v.held is None and v.parts[0].held is None and "Holm" in v.parts[0].note
    assert v.parts[0].numbers["p against (Holm)"] == pytest.approx(0.078)
    assert all_of("c", "s", [part(False, 0.001)] + [part(None, 0.5)] * 5).held is False  # 0.006 < 0.05
    # held needs no correction: every part held at alpha on its own (intersection-union)
    assert all_of("c", "s", [part(True, 0.97), part(True, 0.96)]).held is True
    # parts without a p-value (deterministic rules) keep their status
    assert all_of("c", "s", [Verdict("d", "s", "t", {}, False), part(None, 0.5)]).held is False
    assert "intersection-union" in v.test and "Holm" in v.test


def test_pair_jackknife_against_a_naive_loop_and_the_additive_closed_form():
    """Pairs that share units: for additive pair values v_ij = a_i + a_j the mean is 2 mean(a) and its variance
    4 var(a) / n exactly, which the leave-one-unit-out jackknife reproduces; for any values it equals a naive
    recomputation (a loop dropping each unit's pairs)."""
    import itertools

    from landscape.verdict import pair_jackknife

    rng = np.random.default_rng(2)
    for n in (3, 4, 5, 7):
        pairs = list(itertools.combinations(range(n), 2))
        a = rng.normal(size=n)
        m, se, units = pair_jackknife([a[i] + a[j] for i, j in pairs], pairs)
        assert units == n and m == pytest.approx(2 * a.mean())
        assert se == pytest.approx(math.sqrt(4 * a.var(ddof=1) / n), rel=1e-10)
        v = rng.normal(size=len(pairs))
        left = [np.mean([v[p] for p, (i, j) in enumerate(pairs) if u not in (i, j)]) for u in range(n)]
        naive = math.sqrt((n - 1) / n * sum((x - np.mean(left)) ** 2 for x in left))
        assert pair_jackknife(v, pairs)[1] == pytest.approx(naive, rel=1e-12)
    with pytest.raises(ValueError, match="every pair"):
        pair_jackknife([1.0, 2.0], [(0, 1), (1, 2)])
    # Welch with one side on pairs: that side's se is the jackknife, its df units - 1
    pairs = list(itertools.combinations(range(5), 2))
    sib = list(rng.normal(0.0, 0.1, len(pairs)))
    dp = [0.5, 0.6, 0.4, 0.55, 0.45]
    g = greater("c", "s", dp, sib, pairs_b=pairs)
    _, se_b, _ = pair_jackknife(sib, pairs)
    va = np.var(dp, ddof=1) / 5
    se = math.sqrt(va + se_b ** 2)
    df = (va + se_b ** 2) ** 2 / (va ** 2 / 4 + se_b ** 4 / 4)
    assert g.numbers["t"] == pytest.approx((np.mean(dp) - np.mean(sib)) / se) and g.numbers["df"] == pytest.approx(df)
    assert g.numbers["units B"] == 5 and math.isnan(g.numbers["bootstrap ci low"])


def test_most_above_is_the_exact_binomial_test_and_above_mirrors_below():
    from landscape.verdict import above, most_above

    v = most_above("c", "s", [0.3] * 9 + [0.0], 0.1)
    assert v.numbers["p"] == pytest.approx(11 / 2 ** 10)
    assert v.held is True and most_above("c", "s", [0.0] * 10, 0.1).held is False
    assert most_above("c", "s", [0.3] * 6 + [0.0] * 4, 0.1).held is None
    up = above("c", "s", [0.3, 0.31, 0.29], 0.1)
    down = below("c", "s", [0.3, 0.31, 0.29], 0.1)
    assert up.held is True and down.held is False and up.numbers["p"] == down.numbers["p against"]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 50.0), st.floats(0.5, 50.0)), min_size=3, max_size=8),
       st.floats(1.0, 2.0))
def test_paired_ratio_is_the_paired_t_test_on_logs(pairs, min_ratio):
    """A ratio claim against a minimum ratio is scipy's paired t-test of log a - log b - log(min_ratio) > 0, and its
    ratio is the geometric mean of a / b."""
    from landscape.verdict import paired_ratio

    a, b = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    v = paired_ratio("c", "s", a, b, min_ratio=min_ratio)
    d = np.log(a) - np.log(b) - math.log(min_ratio)
    assert v.numbers["ratio"] == pytest.approx(float(np.exp(np.mean(np.log(a / b)))), rel=1e-9)
    assert v.numbers["min ratio"] == min_ratio
    assert v.numbers["ratio ci low"] <= v.numbers["ratio"] <= v.numbers["ratio ci high"] or math.isnan(
        v.numbers["ratio ci low"])
    if np.ptp(d) > 1e-9 * max(1.0, float(np.abs(d).max())):
        g = stats.ttest_rel(np.log(a) - math.log(min_ratio), np.log(b), alternative="greater").pvalue
        assert v.numbers["p"] == pytest.approx(g, rel=1e-6, abs=1e-12)
        assert v.held is rule(g, 1.0 - g)


def test_paired_ratio_worked_cases_and_bad_input():
    from landscape.verdict import paired_ratio

    sgd = [13.0, 13.4, 13.1]
    assert paired_ratio("c", "s", [31.4, 31.6, 31.5], sgd, min_ratio=1.2).held is True  # 2.4x
    assert paired_ratio("c", "s", [13.5, 13.7, 13.4], sgd, min_ratio=1.2).held is False  # ~1.02x, far below 1.2
    v = paired_ratio("c", "s", [15.0, 17.5, 14.0], sgd, min_ratio=1.2)  # ~1.19x with a wide spread
    assert v.held is None
    with pytest.raises(ValueError, match="positive"):
        paired_ratio("c", "s", [1.0, -1.0], [1.0, 1.0], min_ratio=1.2)
    with pytest.raises(ValueError, match="positive"):
        paired_ratio("c", "s", [1.0, 2.0], [1.0, 1.0], min_ratio=0.0)
