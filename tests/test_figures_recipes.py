"""The paper-figure recipes' numbers against independent references (issue 12).

Every recipe runs once at ``--scale test`` per session (``figures_test_made`` in conftest.py); here each recipe's
stored numbers are recomputed another way: accuracies and losses by a plain forward pass over the stored
checkpoints, barriers by blending state dicts by hand, ECE and true-class probabilities by a numpy loop over
softmax outputs, the Fig. 9 steps by a hand-written SGD / per-example clipping loop, distances from the origin
by ``torch.linalg.norm``, Thm. 3.3's minimum in closed form; and each verdict is the stated rule applied by hand.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from landscape.figures.recipe import read_summary


@pytest.fixture
def made(figures_test_made):
    return figures_test_made


def summary(made, name):
    out, _ = made
    return read_summary(out / name / f"{name}-test.h5")


def point(root, ref):
    from landscape.api.resolve import Resolver

    return Resolver(root).point(ref)


def naive_metrics(root, ref, split="test"):
    """``(accuracy, mean cross-entropy, softmax)`` of checkpoint ``ref`` on ``split`` by one plain forward pass."""
    p = point(root, ref)
    x, y = p.split(split)
    with torch.no_grad():
        logits = p.model().eval()(x).double()
    return (float((logits.argmax(1) == y).double().mean()), float(F.cross_entropy(logits, y)),
            torch.softmax(logits, 1).numpy(), y.numpy())


def naive_barrier(root, a, b, points=5, split="test"):
    """Watson Def. 2.3 by hand: max loss on the straight path minus the mean of the end losses."""
    pa, pb = point(root, f"{a}@last"), point(root, f"{b}@last")
    x, y = pa.split(split)
    model = pa.model().eval()
    sa, sb = pa.model().state_dict(), pb.model().state_dict()
    losses = []
    for alpha in np.linspace(0, 1, points):
        model.load_state_dict({k: (1 - alpha) * sa[k] + alpha * sb[k] for k in sa})
        with torch.no_grad():
            losses.append(float(F.cross_entropy(model(x), y)))
    return max(losses) - (losses[0] + losses[-1]) / 2


def paired(a, b):
    d = np.asarray(a, float) - np.asarray(b, float)
    m, sd = d.mean(), d.std(ddof=1)
    return True if m > sd else (False if m < -sd else None)


def unpaired(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    gap, noise = a.mean() - b.mean(), a.std(ddof=1) + b.std(ddof=1)
    return True if gap > noise else (False if gap < -noise else None)


def combine(parts):
    return False if False in parts else (True if all(p is True for p in parts) else None)


# -------------------------------------------------------------------------------------------- Watson


GRID = "watson-phase-grid-test"


def test_fig2_final_accuracies_are_the_checkpoints_and_the_verdict_is_the_rule(made):
    _, root = made
    numbers, verdict, _ = summary(made, "watson-fig2")
    acc = {}
    for p1, p2 in itertools.product(("sgd", "dpsgd"), repeat=2):
        acc[(p1, p2)] = [naive_metrics(root, f"{GRID}-{p1}-{p2}-{i}@last")[0] for i in range(2)]
        np.testing.assert_allclose(numbers[f"{p1}-{p2}/test_acc"], acc[(p1, p2)], atol=1e-12)
    gaps2 = [abs(a - b) for p1 in ("sgd", "dpsgd") for a, b in zip(acc[(p1, "sgd")], acc[(p1, "dpsgd")], strict=True)]
    gaps1 = [abs(a - b) for p2 in ("sgd", "dpsgd") for a, b in zip(acc[("sgd", p2)], acc[("dpsgd", p2)], strict=True)]
    np.testing.assert_allclose(numbers["phase2_gaps"], gaps2, atol=1e-12)
    parts = [unpaired(acc[(p1, "sgd")], acc[(p1, "dpsgd")]) for p1 in ("sgd", "dpsgd")] + [unpaired(gaps2, gaps1)]
    assert verdict.held is combine(parts)


@pytest.mark.parametrize("name", ["watson-fig6-7", "watson-fig8", "watson-fig3"])
def test_barriers_match_a_naive_interpolation_loop(made, name):
    _, root = made
    numbers, verdict, _ = summary(made, name)
    if name == "watson-fig6-7":
        checks = {"sgd/sgd_vs_dp": [(f"{GRID}-sgd-sgd-0", f"{GRID}-sgd-dpsgd-0"), (f"{GRID}-sgd-sgd-1", f"{GRID}-sgd-dpsgd-1")],
                  "dpsgd/sgd_siblings": [(f"{GRID}-dpsgd-sgd-0", f"{GRID}-dpsgd-sgd-1")]}
    elif name == "watson-fig8":
        checks = {"dpsgd-sgd/barrier": [(f"{GRID}-dpsgd", f"{GRID}-dpsgd-sgd-0"), (f"{GRID}-dpsgd", f"{GRID}-dpsgd-sgd-1")]}
    else:
        checks = {"init_barriers": [("watson-fig3-test-init0", "watson-fig3-test-init1")],
                  "sibling_barriers": [(f"{GRID}-sgd-sgd-0", f"{GRID}-sgd-sgd-1")]}
    for key, pairs in checks.items():
        naive = [naive_barrier(root, a, b) for a, b in pairs]
        np.testing.assert_allclose(numbers[key], naive, rtol=1e-4, atol=1e-6, err_msg=key)
    if name == "watson-fig8":  # three parts: each other pair's barriers vs SGD->SGD's (2 copies each)
        parts = [unpaired(numbers[f"{c}/barrier"], numbers["sgd-sgd/barrier"]) for c in ("sgd-dpsgd", "dpsgd-sgd",
                                                                                       "dpsgd-dpsgd")]
        assert verdict.held is combine(parts)


def test_fig9_sgd_and_clip_only_steps_match_a_hand_written_loop(made):
    _, root = made
    numbers, verdict, _ = summary(made, "watson-fig9")
    p = point(root, "watson-fig9-test-sgd@init")
    x_all, y_all = p.split("train")
    idx = torch.as_tensor(numbers["init/batch_indices"][0].astype(np.int64))
    x, y = x_all[idx], y_all[idx]
    for method in ("sgd", "clip-only"):
        model = p.model().train()
        losses = []
        for t in range(6):
            with torch.no_grad():
                losses.append(float(F.cross_entropy(model(x), y)))
            if t == 5:
                break
            grads = []
            for i in range(len(y)):  # per-example gradients one by one
                g = torch.autograd.grad(F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]), list(model.parameters()))
                if method == "clip-only":
                    norm = torch.sqrt(sum((t_ ** 2).sum() for t_ in g))
                    g = [t_ * min(1.0, 1.0 / float(norm)) for t_ in g]
                grads.append(g)
            with torch.no_grad():
                for j, param in enumerate(model.parameters()):
                    param -= 0.1 * sum(g[j] for g in grads) / len(y)
        np.testing.assert_allclose(numbers[f"init/{method}/loss"][0], losses, rtol=2e-4, err_msg=method)
    ends = {m: numbers[f"init/{m}/loss"][:, -1] for m in ("sgd", "clip-only", "noise-only", "dpsgd")}
    grads = {m: numbers[f"trained/{m}/grad_norm"][:, -1] for m in ("sgd", "clip-only", "noise-only", "dpsgd")}
    parts = ([paired(ends[m], ends["sgd"]) for m in ("clip-only", "noise-only", "dpsgd")]
             + [paired(ends["dpsgd"], ends[m]) for m in ("clip-only", "noise-only")]
             + [paired(grads[m], grads["sgd"]) for m in ("clip-only", "noise-only", "dpsgd")])
    assert verdict.held is combine(parts)


def test_fig10_curves_end_at_the_checkpoints_accuracy(made):
    _, root = made
    numbers, verdict, _ = summary(made, "watson-fig10")
    final = {}
    for m in ("sgd", "noise-only", "clip-only"):
        final[m] = [naive_metrics(root, f"watson-fig10-test-{m}-{s}@last")[0] for s in range(2)]
        np.testing.assert_allclose(numbers[f"{m}/final"], final[m], atol=1e-12)
        assert numbers[f"{m}/test_acc"].shape == (2, 3)  # seeds x (init + 2 epochs)
    gap = abs(np.mean(final["noise-only"]) - np.mean(final["sgd"]))
    similar = gap <= np.std(final["noise-only"], ddof=1) + np.std(final["sgd"], ddof=1) + 0.01
    parts = [unpaired(final["sgd"], final["clip-only"]), unpaired(final["noise-only"], final["clip-only"]), similar]
    assert verdict.held is combine(parts)


def test_fig11_R_table_is_the_clipping_results_and_the_paired_rule(made):
    from landscape.analyze.clipping import ClippingResult

    out, _ = made
    numbers, verdict, _ = summary(made, "watson-fig11")
    for seed in range(2):
        res = ClippingResult.from_hdf5(out / "watson-fig11" / f"watson-fig11-clipping-{seed}-test.h5")
        assert [r.prune_level for r in res.rows] == [0.0, 0.7]
        np.testing.assert_allclose(numbers["R"][:, seed], [r.total.R for r in res.rows])
    assert verdict.held is paired(numbers["R"][0], numbers["R"][1])


def test_fig13_pruned_runs_keep_their_masks_and_accuracies_are_the_checkpoints(made):
    _, root = made
    numbers, verdict, _ = summary(made, "watson-fig13")
    for k in ("none", "full", "subset"):
        np.testing.assert_allclose(numbers[f"{k}/final"],
                                   [naive_metrics(root, f"watson-fig13-test-dp-{k}-{s}@last")[0] for s in range(2)],
                                   atol=1e-12)
    state = point(root, "watson-fig13-test-dp-full-0@last").model().state_dict()
    weights = [v for n, v in state.items() if n.endswith("weight") and v.dim() > 1]
    for w in weights:  # 70% of every layer removed and still exactly 0 after DP training
        assert abs(float((w == 0).double().mean()) - 0.7) < 0.01
    assert verdict.held is combine([paired(numbers[f"{m}/final"], numbers["none/final"]) for m in ("full", "subset")])


def test_fig16_17_distances_are_parameter_norms(made):
    _, root = made
    numbers, verdict, _ = summary(made, "watson-fig16-17")
    for m, key in (("sgd", "sgd"), ("dp", "dp")):
        for seed in range(2):
            model = point(root, f"watson-fig16-17-test-{m}-{seed}@last").model()
            norm = float(torch.linalg.norm(torch.cat([q.detach().double().reshape(-1) for q in model.parameters()])))
            assert numbers[f"{key}/dist_origin"][seed, -1] == pytest.approx(norm, rel=1e-9)
    assert verdict.held is combine([paired(numbers["dp/dist_origin"][:, -1], numbers["sgd/dist_origin"][:, -1]),
                                    paired(numbers["dp/grad_curve"][:, -1], numbers["sgd/grad_curve"][:, -1])])


def test_thm33_population_flow_against_the_closed_form_minimum(made):
    numbers, verdict, _ = summary(made, "watson-thm33")
    assert float(numbers["w_star_noise_norm"]) == 0.0  # b^T S^-1 has no noise part: S block-diagonal, b = (v, 0)
    loss_gap = numbers["population/loss_minus_min"]
    assert np.all(loss_gap >= -1e-12) and np.all(np.diff(loss_gap) <= 1e-12)  # gradient flow never raises the loss
    # RK4 keeps W2^T W2 = W1 W1^T to ~1e-5 (plain gradient descent with the same step drifts to ~1e-2)
    assert numbers["population/imbalance"].max() < 1e-4
    assert numbers["population/W_n"][-1] < numbers["population/W_n"][0]
    assert verdict.numbers["held"] + verdict.numbers["inconclusive"] + verdict.numbers["did not hold"] == 2
    assert numbers["population/loss_minus_min"][-1] > 1e-9 and verdict.held is None  # test scale: not converged


# ------------------------------------------------------------------------------------------------ Bu


def test_bu_table1_guarantee_flags_follow_the_numbers(made):
    from landscape.analyze.ntk import EIG_RTOL, SYM_RTOL, NTKTable

    out, _ = made
    _, verdict, _ = summary(made, "bu-table1")
    table = NTKTable.from_hdf5(out / "bu-table1" / "bu-table1-ntk-table-test.h5")
    unclipped = [r for r in table.rows if r.style == "none" or r.fraction_clipped == 0]
    flat = [r for r in table.rows if r.style == "flat"]
    assert unclipped and flat
    ok1 = all(r.asymmetry <= SYM_RTOL and r.min_sym_eig >= -EIG_RTOL * r.norm and r.min_real_eig >= -EIG_RTOL * r.norm
              for r in unclipped)
    ok2 = all(r.min_real_eig >= -EIG_RTOL * r.norm and r.max_abs_imag_eig <= EIG_RTOL * r.norm for r in flat)
    assert verdict.held is (ok1 and ok2)


def _ece(probs, y, bins=15):
    conf, pred = probs.max(1), probs.argmax(1)
    total = 0.0
    for m in range(bins):
        lo, hi = m / bins, (m + 1) / bins
        sel = (conf > lo) & (conf <= hi)
        if sel.any():
            total += sel.mean() * abs((pred[sel] == y[sel]).mean() - conf[sel].mean())
    return total


def test_bu_ece_nll_and_true_class_probabilities_by_a_numpy_loop(made):
    _, root = made
    numbers, verdict, _ = summary(made, "bu-fig6-7")
    n11, v11, _ = summary(made, "bu-fig11")
    for key, run in (("C1", "bu-calibration-test-C1-0"), ("C100", "bu-calibration-test-C100-1"),
                     ("sgd", "bu-calibration-test-sgd-0")):
        seed = int(run[-1])
        acc, nll, probs, y = naive_metrics(root, f"{run}@last")
        assert numbers[f"{key}/accuracy"][seed] == pytest.approx(acc, abs=1e-12)
        assert numbers[f"{key}/nll"][seed] == pytest.approx(nll, rel=1e-5)
        assert numbers[f"{key}/ece"][seed] == pytest.approx(_ece(probs, y), abs=1e-6)
        true = probs[np.arange(len(y)), y]
        assert n11[f"{key}/fraction_near_0"][seed] == pytest.approx(np.mean(true <= 1 / 15), abs=1e-12)
        assert n11[f"{key}/fraction_near_1"][seed] == pytest.approx(np.mean(true > 14 / 15), abs=1e-12)
    parts = [paired(numbers["C1/ece"], numbers["C100/ece"]), paired(numbers["C1/nll"], numbers["C100/nll"]),
             unpaired(numbers["C1/ece"], numbers["sgd/ece"])]
    assert verdict.held is combine(parts)
    assert v11.held is combine([paired(n11["C1/fraction_near_0"], n11["C100/fraction_near_0"]),
                                paired(n11["C1/fraction_near_1"], n11["C100/fraction_near_1"])])


# ------------------------------------------------------------------------------------- Zhu and Wang


def test_zhu_fig2_accuracies_and_gains(made):
    _, root = made
    numbers, verdict, _ = summary(made, "zhu-fig2")
    for (i, (sigma, c)), (j, r), seed in itertools.product(enumerate([(1.0, 0.25), (2.0, 1.0)]),
                                                          enumerate([0.0, 0.5]), range(2)):
        run = f"zhu-fig2-test-s{sigma:g}-C{c:g}-r{r:g}-{seed}@last"
        assert numbers["train_acc"][i, j, seed] == pytest.approx(naive_metrics(root, run, "train")[0], abs=1e-12)
    gains = numbers["train_acc"][:, 1] - numbers["train_acc"][:, 0]
    np.testing.assert_allclose(numbers["gain"], gains, atol=1e-12)
    step = gains[1].mean() - gains[0].mean()
    noise = gains[0].std(ddof=1) + gains[1].std(ddof=1)
    assert verdict.held is (True if step > noise else (False if step < -noise else None))


def test_zhu_figF_rejection_count_and_binomial_allowance(made):
    from scipy.stats import binom

    numbers, verdict, _ = summary(made, "zhu-figF")
    parts = []
    for m in ("dpsgd", "dpsgd-rs"):
        p = numbers[f"{m}/p_value"]
        assert p.shape == (2, 3) and np.all((p > 0) & (p <= 1))
        parts.append(int((p < 0.05).sum()) <= int(binom.ppf(0.95, p.size, 0.05)))
    assert verdict.held is combine(parts)


def test_wang_lssgd_accuracies_and_smoothing_recorded(made):
    from landscape.store import Store

    _, root = made
    numbers, verdict, _ = summary(made, "wang-lssgd")
    for j, S in enumerate((0.0, 1.0, 2.0)):
        for seed in range(2):
            run = f"wang-lssgd-test-e1-S{S:g}-{seed}"
            assert numbers["test_acc"][0, j, seed] == pytest.approx(naive_metrics(root, f"{run}@last")[0], abs=1e-12)
            config = Store(root).run(run).manifest["config"]
            assert config["smooth"] == S and config["optimizer"] == "dpsgd"
    parts = [paired(numbers["test_acc"][0, j], numbers["test_acc"][0, 0]) for j in (1, 2)]
    assert verdict.held is combine(parts)
    assert not math.isnan(numbers["test_acc"].mean())
