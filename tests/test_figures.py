"""Paper-figure recipes: ``--scale test`` end to end, the list, rerun skipping, paper-scale refusal.

The watson-fig5 instabilities are checked against an independent naive loop: the two sibling checkpoints'
state dicts blended by hand at 5 alphas, the test loss evaluated with ``torch.nn.functional.cross_entropy``,
instability = max loss - mean of the end losses (Watson et al. Def. 2.3).
"""

from __future__ import annotations

import itertools

import h5py
import numpy as np
import pytest
import torch

from cli import main as cli_main
from landscape.figures import registry
from landscape.figures.recipe import read_summary
from landscape.verdict import Verdict


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.fixture
def made(figures_test_made):
    """Every registered recipe at --scale test, made once per session (tests/conftest.py)."""
    return figures_test_made


def test_list_names_every_recipe_with_figure_and_claim(capsys):
    code, out, err = run(capsys, "figures", "--list")
    assert code == 0 and err == ""
    lines = out.strip().splitlines()
    assert len(lines) == len(registry.names())
    for name, line in zip(registry.names(), lines, strict=True):
        r = registry.get(name)
        assert line.startswith(name) and r.figure in line and r.claim in line


@pytest.mark.parametrize("name", registry.names())
def test_test_scale_writes_files_numbers_and_verdict(made, name):
    out, _ = made
    path = out / name / f"{name}-test.h5"
    numbers, verdict, figures = read_summary(path)
    assert {p.suffix for p in figures} == {".png", ".pdf"} and all(p.stat().st_size > 1000 for p in figures)
    assert numbers and all(np.isfinite(v).all() for k, v in numbers.items() if not k.startswith("gate/"))
    assert isinstance(verdict, Verdict) and verdict.held in (True, False, None) and verdict.numbers
    with h5py.File(path, "r") as f:
        assert f.attrs["scale"] == "test" and f.attrs["recipe"] == name


def _naive_path(root, a: str, b: str) -> np.ndarray:
    from landscape.api.resolve import Resolver

    r = Resolver(root)
    pa, pb = r.point(f"{a}@last"), r.point(f"{b}@last")
    x, y = pa.split("test")
    model = pa.model().eval()
    sa, sb = pa.model().state_dict(), pb.model().state_dict()
    losses = []
    for alpha in np.linspace(0, 1, 5):
        model.load_state_dict({k: (1 - alpha) * sa[k] + alpha * sb[k] for k in sa})
        with torch.no_grad():
            losses.append(float(torch.nn.functional.cross_entropy(model(x), y)))
    return np.array(losses)


def _naive_train_acc(root, ref: str) -> float:
    """Train accuracy of checkpoint ``ref`` by one plain forward pass over the train split."""
    from landscape.api.resolve import Resolver

    p = Resolver(root).point(ref)
    x, y = p.split("train")
    with torch.no_grad():
        return float((p.model().eval()(x).argmax(1) == y).double().mean())


def test_watson_fig5_lr_choice_is_recomputed_from_the_checkpoints(made):
    """The matched Phase-2 (momentum, lr), recomputed independently: per candidate and arm (SGD, DP per epsilon), every
    Phase-2 copy's worst train accuracy over its last 3 checkpoints by plain forward passes; -1 exactly where the
    search trained nothing (no such run in the store), and a candidate is cut only when one of its trained runs
    already scores no higher than an earlier fully trained candidate's worst run; the chosen lr is the first
    candidate (momentum 0 first, then the smaller lr) with the best worst run over every arm, copy and k -- the
    choice of training every candidate."""
    from landscape.store import Store

    out, root = made
    numbers, _, _ = read_summary(out / "watson-fig5" / "watson-fig5-test.h5")
    store = Store(root)
    momenta, lrs, arms, copies = [0.0, 0.9], [0.05, 0.5], ["sgd", "dp-e8"], 3
    assert numbers["lr_grid/lr"].tolist() == lrs and numbers["lr_grid/momentum"].tolist() == momenta
    candidates = list(itertools.product(momenta, lrs))
    names = set(store.run_names())
    score = {}  # (candidate index, arm, copy) -> the run's score, or None: never trained
    for (i, (m, lr)), arm, c in itertools.product(enumerate(candidates), arms, range(copies)):
        family = "sgd" if arm == "sgd" else "dpsgd"
        run = f"watson-fig5-test-{arm}-k1-m{m:g}-lr{lr:g}-sgd-{family}-{c}"
        stored = numbers[f"lr_grid/{arm}/train_acc"][momenta.index(m)][lrs.index(lr)][c]
        if run not in names:
            assert stored == -1.0, run
            score[(i, arm, c)] = None
            continue
        steps = [t.step for t in store.run(run).checkpoints()][-3:]
        score[(i, arm, c)] = min(_naive_train_acc(root, f"{run}@step={t}") for t in steps)
        assert stored == pytest.approx(score[(i, arm, c)], abs=1e-12), run
    worst, best_i, complete = [], None, -np.inf
    for i in range(len(candidates)):
        values = [score[(i, arm, c)] for arm in arms for c in range(copies)]
        assert values[0] is not None  # the first unit is always trained
        trained = [v for v in values if v is not None]
        if len(trained) < len(values):  # cut: it could not have beaten an earlier candidate
            assert min(trained) <= complete, candidates[i]
            worst.append(-1.0)
            continue
        worst.append(min(trained))
        if worst[-1] > complete:
            best_i, complete = i, worst[-1]
    np.testing.assert_allclose(np.ravel(numbers["lr_grid/worst_run"]), worst, atol=1e-12)
    assert (float(numbers["momentum_chosen"]), float(numbers["lr_chosen"])) == candidates[best_i]


def test_watson_fig5_barriers_match_a_naive_interpolation_loop(made):
    from scipy import stats

    from landscape.verdict import INVALID

    out, root = made
    numbers, verdict, _ = read_summary(out / "watson-fig5" / "watson-fig5-test.h5")
    from landscape.store import Store

    assert numbers["k"].tolist() == [1.0] and numbers["epsilon"].tolist() == [8.0]
    lr, m = float(numbers["lr_chosen"]), float(numbers["momentum_chosen"])
    group, sgd_group = f"watson-fig5-test-dp-e8-k1-m{m:g}-lr{lr:g}", f"watson-fig5-test-sgd-k1-m{m:g}-lr{lr:g}"
    # one matched Phase 2: SGD and DP siblings train Phase 2 at the chosen lr, momentum and batch, each from its
    # group's Phase-1 SGD run (the same configuration: the same model)
    store = Store(root)
    dp_runs = [store.run(f"{group}-sgd-dpsgd-{i}").manifest for i in range(3)]
    sgd_runs = [store.run(f"{sgd_group}-sgd-sgd-{i}").manifest for i in range(3)]
    assert {m["config"]["optimizer"] for m in dp_runs} == {"dpsgd"} and {
        m["config"]["optimizer"] for m in sgd_runs} == {"sgd"}
    assert {(m["config"]["lr"], m["config"]["momentum"], m["config"]["batch_size"]) for m in dp_runs + sgd_runs} == {
        (lr, m, 32)}
    assert {m["config"]["from_ref"] for m in dp_runs} == {f"{group}-sgd@last"}
    assert {m["config"]["from_ref"] for m in sgd_runs} == {f"{sgd_group}-sgd@last"}
    a, b = store.load(f"{group}-sgd@last").state_dict, store.load(f"{sgd_group}-sgd@last").state_dict
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    phase1 = store.run(f"{group}-sgd").manifest["config"]
    assert (phase1["lr"], phase1["momentum"]) == (0.03, 0.9)
    t = np.linspace(0, 1, 5)
    for family, chord, def23, runs in (
            ("sgd", numbers["sgd"][0], numbers["sgd_instability"][0],
             [f"{sgd_group}-sgd-sgd-{i}" for i in range(3)]),
            ("dpsgd", numbers["dp"][0][0], numbers["dp_instability"][0][0],
             [f"{group}-sgd-dpsgd-{i}" for i in range(3)])):
        paths = [_naive_path(root, a, b) for a, b in itertools.combinations(runs, 2)]
        naive_chord = sorted(float(np.max(v - ((1 - t) * v[0] + t * v[-1]))) for v in paths)
        naive23 = sorted(float(v.max() - (v[0] + v[-1]) / 2) for v in paths)
        assert np.allclose(sorted(chord), naive_chord, rtol=1e-4, atol=1e-6), (family, chord, naive_chord)
        assert np.allclose(sorted(def23), naive23, rtol=1e-4, atol=1e-6), (family, def23, naive23)
    # one (k, epsilon) point at test scale: no corner to except, so it is the one judged part (Welch, alpha 0.05)
    assert len(verdict.parts) == 1 and "Exception" not in verdict.note
    dp, sgd = numbers["dp"][0][0], numbers["sgd"][0]
    if dp.std() + sgd.std() > 0:
        p = stats.ttest_ind(dp, sgd, equal_var=False, alternative="greater").pvalue
        expected = True if p < 0.05 else (False if 1 - p < 0.05 else None)
    else:
        expected = bool(dp.mean() > sgd.mean())  # constants: exactly equal barriers refute "higher"
    part = verdict.parts[0]
    assert part.held is (None if part.note.startswith(INVALID) else expected)


def test_rerun_skips_finished_recipes(made, capsys):
    out, root = made
    path = out / "watson-fig5" / "watson-fig5-test.h5"
    before = path.stat().st_mtime_ns
    code, text, err = run(capsys, "--root", str(root), "figures", "watson-fig5", "--scale", "test", "--out", str(out))
    assert code == 0 and "skipped (finished)" in text
    assert any(f"[{status}]" in text for status in ("held", "did not hold", "inconclusive"))
    assert path.stat().st_mtime_ns == before


def test_paper_scale_without_data_is_one_line_exit_1(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("LANDSCAPE_DATA", raising=False)
    code, out, err = run(capsys, "--root", str(tmp_path), "figures", "watson-fig5", "--scale", "paper",
                         "--data-root", str(tmp_path), "--out", str(tmp_path))
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and "cifar10" in err and "GPU hours" in err
    assert not (tmp_path / "watson-fig5").exists() and list(tmp_path.iterdir()) == []  # nothing written
    code, out, err = run(capsys, "--root", str(tmp_path), "figures", "all", "--scale", "paper",
                         "--data-root", str(tmp_path), "--out", str(tmp_path / "gal"))
    assert code == 1 and err.count("\n") == 1 and not (tmp_path / "gal").exists()  # no gallery README either


def test_unknown_recipe_and_missing_name_are_usage_errors(capsys):
    for args in (["figures", "nope"], ["figures"]):
        code, out, err = run(capsys, *args)
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


def _naive_loss(root, ref: str, split: str) -> float:
    from landscape.api.resolve import Resolver

    p = Resolver(root).point(ref)
    x, y = p.split(split)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(p.model().eval()(x), y))


def test_watson_fig4_path_ends_are_the_two_solutions_losses(made):
    out, root = made
    numbers, verdict, _ = read_summary(out / "watson-fig4" / "watson-fig4-test.h5")
    a = _naive_loss(root, "watson-fig4-test-sgd-sgd-0@last", "train")
    b = _naive_loss(root, "watson-fig4-test-sgd-sgd-1@last", "train")
    for norm in ("none", "filter"):
        toward, rises = numbers[f"{norm}/toward_loss"], numbers[f"{norm}/random_rises"]
        assert np.allclose([toward[0], toward[-1]], [a, b], rtol=1e-4, atol=1e-6)
        # the rise is along the whole path (mean over t > 0 above the start), not the far end's loss
        assert float(numbers[f"{norm}/toward_rise"]) == pytest.approx(np.mean(toward[1:]) - toward[0])
        direction = numbers[f"{norm}/direction_loss"]
        np.testing.assert_allclose(rises, direction[:, 1:].mean(axis=1) - direction[:, 0])
        assert rises.shape == (8,) and 0 <= float(numbers[f"{norm}/max_abs_cos"]) <= 1
        # every direction starts at the solution's loss
        assert np.allclose(numbers[f"{norm}/direction_loss"][:, 0], a, rtol=1e-4, atol=1e-6)
    assert verdict.numbers["held"] + verdict.numbers["did not hold"] + verdict.numbers["inconclusive"] == 2


def test_instability_plot_shows_the_chord_barrier_beside_def_2_3():
    """The instability figure (demo, tour, Fig. 5 tables) draws the judged chord barrier in its own row above
    Def. 2.3, with the plotted means equal to the rows' means; tables without chord barriers keep two rows."""
    from landscape.plots.interpolate import plot_instability

    rows = [dict(k=k, phase2=o, epsilon=None if o == "sgd" else 7.0, chord_barrier_test_loss=0.1 * k + i,
                 instability_test_loss=0.2 * k, instability_test_error=0.01) for k in (1, 2) for o in ("sgd", "dpsgd")
            for i in range(2)]
    fig = plot_instability(rows, splits=["test"])
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == ["test loss barrier above chord", "test Def. 2.3 loss instability", "test error barrier"]
    sgd_line = fig.axes[0].lines[0]
    np.testing.assert_allclose(np.asarray(sgd_line.get_ydata(), dtype=float), [0.1 + 0.5, 0.2 + 0.5])
    old = [{k: v for k, v in r.items() if not k.startswith("chord")} for r in rows]
    assert [ax.get_ylabel() for ax in plot_instability(old, splits=["test"]).axes] == labels[1:]


def test_claim_blind_selection_scores_the_worst_recent_checkpoint_and_picks_the_first_best():
    """``worst_recent`` is the minimum over a run's last ``window`` checkpoints (an oscillating run scores its dip);
    ``best`` picks the first highest score (NaN loses) and returns tuple candidates as they are."""
    from types import SimpleNamespace

    from landscape.figures.recipe import best, worst_recent

    infos = [SimpleNamespace(epoch=e, metrics={"train_acc": a}) for e, a in enumerate([0.1, 0.9, 0.5, 0.95])]
    run = SimpleNamespace(checkpoints=lambda: infos)
    assert worst_recent(run, "train_acc", 1) == 0.95
    assert worst_recent(run, "train_acc", 3) == 0.5
    assert worst_recent(run, "train_acc", 10) == 0.1
    assert best([0.01, 0.1, 1.0], [0.5, float("nan"), 0.5]) == 0.01
    assert best([(0.0, 0.1), (0.9, 0.01)], [0.6, 0.7]) == (0.9, 0.01)


def _counts(settings, keys=("seeds", "noise_seeds", "copies"), prefix="") -> dict:
    """The sample counts in a recipe's settings (nested settings such as ``runs`` / ``grid`` included)."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_counts(value, keys, f"{prefix}{key}."))
        elif key in keys:
            out[prefix + key] = value
    return out


@pytest.mark.parametrize("name", registry.names())
def test_cpu_scale_runs_the_seeds_its_recipe_says_it_needs_and_no_fewer_than_paper_scale(name):
    # a recipe that states it needs n seeds runs n at cpu scale (its gallery marks then come from power alone), and
    # the cpu scale never runs fewer seeds / noise draws / copies than the paper scale it stands in for
    r = registry.get(name)
    cpu, paper = _counts(dict(r.scales["cpu"])), _counts(dict(r.scales["paper"]))
    assert cpu.keys() == paper.keys()
    assert all(cpu[k] >= paper[k] for k in cpu), (cpu, paper)
    if r.needs:
        assert cpu and min(cpu.values()) >= r.needs, (cpu, r.needs)


def test_bounded_worst_run_search_chooses_what_training_everything_chooses():
    """``_phase_grid.search`` against the exhaustive rule on random score tables (ties included): the same choice,
    the trained scores unchanged, -1 only for arms it skipped, and it skips an arm only of a candidate that already
    has a run no better than an earlier fully trained candidate's worst run."""
    from landscape.figures import _phase_grid as grid
    from landscape.figures.recipe import best

    rng = np.random.default_rng(0)
    arms, skipped = ["sgd", "dp-e1", "dp-e8"], 0
    for _ in range(300):
        candidates = [0.01, 0.05, 0.1, 0.5, 1.0]
        full = {(c, a): rng.choice([0.1, 0.5, 0.8, 0.9], size=4).tolist() for c in candidates for a in arms}
        calls = []

        def score(c, a, full=full, calls=calls):
            calls.append((c, a))
            return full[(c, a)]

        choice, scores = grid.search(candidates, arms, score)
        exhaustive = [min(v for a in arms for v in full[(c, a)]) for c in candidates]
        assert choice == best(candidates, exhaustive)
        complete = -np.inf
        for i, c in enumerate(candidates):
            done = [a for a in arms if (c, a) in calls]
            assert done == arms[:len(done)] and done  # in arm order, the first always
            for a in arms:
                assert scores[a][i] == (full[(c, a)] if a in done else [grid.NOT_TRAINED] * 4)
            if len(done) < len(arms):
                skipped += 1
                assert min(v for a in done for v in full[(c, a)]) <= complete
            else:
                complete = max(complete, exhaustive[i])
    assert skipped > 100  # the cut happens (and saves training)
