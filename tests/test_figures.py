"""Paper-figure recipes: ``--scale test`` end to end, the list, rerun skipping, paper-scale refusal, the selection
rule and the validity gate.

The watson-fig5 heights and chord barriers are checked against an independent naive loop: the two sibling
checkpoints' state dicts blended by hand at 5 alphas, the test loss evaluated with
``torch.nn.functional.cross_entropy``; the selection rule against an exhaustive search on random score tables.
"""

from __future__ import annotations

import itertools
import math

import h5py
import numpy as np
import pytest
import torch

from cli import main as cli_main
from landscape.figures import registry
from landscape.figures.recipe import UNJUDGED, read_summary
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
    assert numbers and all(np.isfinite(v).all() for k, v in numbers.items() if not k.startswith(UNJUDGED))
    assert any("-figure-" in p.name for p in figures) and verdict.scope.startswith("at test scale")
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


def test_watson_fig5_heights_match_a_naive_interpolation_loop_and_sigma_spends_the_label(made):
    from scipy import special

    from landscape.store import Store
    from landscape.verdict import INVALID

    out, root = made
    numbers, verdict, _ = read_summary(out / "watson-fig5" / "watson-fig5-test.h5")
    assert numbers["k"].tolist() == [1.0] and numbers["epsilon"].tolist() == [8.0]
    m, lr = (float(v) for v in numbers["selection/candidates"][int(numbers["selection/chosen"])])
    group, sgd_group = f"watson-fig5-test-dp-e8-k1-m{m:g}-lr{lr:g}", f"watson-fig5-test-sgd-k1-m{m:g}-lr{lr:g}"
    store = Store(root)
    dp_runs = [store.run(f"{group}-sgd-dpsgd-{i}") for i in range(3)]
    sgd_runs = [store.run(f"{sgd_group}-sgd-sgd-{i}").manifest for i in range(3)]
    assert {(r.manifest["config"]["lr"], r.manifest["config"]["momentum"]) for r in dp_runs} == {(lr, m)}
    assert {(r["config"]["lr"], r["config"]["momentum"]) for r in sgd_runs} == {(lr, m)}
    # the DP Phase 2 (1 of 2 epochs, no DP Phase 1) spends the labelled epsilon: sigma calibrated for k
    spent = [r.checkpoints()[-1].epsilon for r in dp_runs]
    assert all(8.0 * 0.99 <= e <= 8.0 + 1e-9 for e in spent), spent
    np.testing.assert_allclose(numbers["eps_spent"], [[np.mean(spent)]])
    a, b = store.load(f"{group}-sgd@last").state_dict, store.load(f"{sgd_group}-sgd@last").state_dict
    assert all(torch.equal(a[k], b[k]) for k in a)  # one Phase-1 model for both families
    t = np.linspace(0, 1, 5)
    for height, chord, runs in ((numbers["sgd/height"][0], numbers["sgd/chord"][0],
                                 [f"{sgd_group}-sgd-sgd-{i}" for i in range(3)]),
                                (numbers["dp/height"][0][0], numbers["dp/chord"][0][0], [r.name for r in dp_runs])):
        paths = [_naive_path(root, a, b) for a, b in itertools.combinations(runs, 2)]
        np.testing.assert_allclose(height, [float(v.max() - max(v[0], v[-1])) for v in paths], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(chord, [float(np.max(v - ((1 - t) * v[0] + t * v[-1]))) for v in paths],
                                   rtol=1e-4, atol=1e-6)
    # one (k, epsilon) point: no corner, one part; the sibling pairs share copies: the jackknife over 3 copies
    assert len(verdict.parts) == 1 and "Exception" not in verdict.note
    part = verdict.parts[0]
    dp, sgd = numbers["dp/height"][0][0], numbers["sgd/height"][0]

    def jack(v):  # pairs (0,1), (0,2), (1,2): leaving copy u out leaves the one pair without it
        left = [v[2], v[1], v[0]]
        return math.sqrt(2 / 3 * sum((x - np.mean(left)) ** 2 for x in left))

    se = math.sqrt(jack(dp) ** 2 + jack(sgd) ** 2)
    diff = dp.mean() - sgd.mean() - float(numbers["min_height"])
    if se > 0:
        df = se ** 4 / ((jack(dp) ** 4 if jack(dp) else 0) / 2 + (jack(sgd) ** 4 if jack(sgd) else 0) / 2)
        p = 1 - special.stdtr(df, diff / se)
        expected = True if p < 0.05 else (False if 1 - p < 0.05 else None)
    else:  # no spread: the sign test over 3 copies (p 0.125) cannot decide
        expected = None
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
        assert float(numbers[f"{norm}/toward_rise"]) == pytest.approx(np.mean(toward[1:]) - toward[0])
        direction = numbers[f"{norm}/direction_loss"]
        np.testing.assert_allclose(rises, direction[:, 1:].mean(axis=1) - direction[:, 0])
        np.testing.assert_allclose(numbers[f"{norm}/random_end_rise"], direction[:, -1] - direction[:, 0])
        assert rises.shape == (8,) and 0 <= float(numbers[f"{norm}/max_abs_cos"]) <= 1
        assert np.allclose(direction[:, 0], a, rtol=1e-4, atol=1e-6)
    # flat against the stated scale (2% of ln 10), rises judged by an exact binomial test over the directions
    scale = float(numbers["scale"])
    assert scale == pytest.approx(0.02 * math.log(10))
    flat = verdict.parts[0]
    assert flat.held is bool(np.ptp(numbers["none/toward_loss"]) < scale)
    import verdict_reference as ref

    for j, norm in enumerate(("none", "filter")):
        assert verdict.parts[1 + 2 * j].numbers["p"] == pytest.approx(
            sum(math.comb(8, i) for i in range(int(np.sum(numbers[f"{norm}/random_end_rise"] > scale)), 9)) / 256)
        assert ref.most_above(numbers[f"{norm}/random_end_rise"], scale)[0] is verdict.parts[1 + 2 * j].held or \
            "Holm" in verdict.parts[1 + 2 * j].note
    assert len(verdict.parts) == 5


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


def test_gate_needs_per_epoch_checkpoints_for_its_collapse_rule_and_a_loss_below_ln_c():
    from landscape.figures.recipe import Gate

    gate = Gate(min_acc=0.5)
    ok = gate.judge(np.array([0.1, 0.8, 0.9, 0.92]), np.array([0.0, 1.0, 2.0, 3.0]), (0.2, 0.3), 10)
    assert ok == []
    sparse = gate.judge(np.array([0.1, 0.92]), np.array([0.0, 8.0]), (0.2, 0.3), 10)  # init and final only
    assert len(sparse) == 1 and sparse[0].startswith("collapse rule not checkable")
    short = gate.judge(np.array([0.1, 0.6]), np.array([0.0, 1.0]), (0.2, 0.3), 10)  # a 1-epoch run: every epoch kept
    assert short == []
    collapsed = gate.judge(np.array([0.9, 0.95, 0.7]), np.array([3.0, 4.0, 5.0]), (0.2, 0.3), 10)
    assert collapsed and collapsed[0].startswith("collapsed")
    chance = gate.judge(np.array([0.6, 0.6, 0.6]), np.array([1.0, 2.0, 3.0]), (2.0, math.log(10) + 0.01), 10)
    assert chance and "ln 10" in chance[0]
    assert Gate(min_acc=0.0, max_drop=1.0, chance_loss=False).judge(  # the test scale's: finite losses only
        np.array([0.1, 0.1]), np.array([0.0, 5.0]), (2.4, 2.4), 10) == []


def test_selection_rule_chooses_the_viable_maximin_and_the_cut_changes_nothing(monkeypatch):
    """``_selection.select`` on random score tables against an exhaustive recomputation: the chosen candidate is
    the first viable one with the highest lowest arm score, each arm's own best the first with its highest score
    among its viable candidates; cutting an arm after its first non-viable group gives the same choice, viable set
    and own bests while training less."""
    from types import SimpleNamespace

    from landscape.figures import _selection

    rng = np.random.default_rng(0)
    saved = 0
    for _ in range(200):
        candidates, arms, groups = [0.01, 0.05, 0.1, 0.5], ["sgd", "dp-e1", "dp-e8"], 3
        table = {(c, a, g): (float(rng.choice([0.3, 0.6, 0.8, 0.9])), bool(rng.random() < 0.8))
                 for c in candidates for a in arms for g in range(groups)}
        monkeypatch.setattr(_selection, "score", lambda ctx, run, table=table: _selection.Score(
            str(run), [0.0], [table[run][0]], [0.1], table[run][1]))
        calls = []

        def train(c, a, calls=calls, groups=groups):
            for g in range(groups):
                calls.append((c, a, g))
                yield [(c, a, g)]

        full = _selection.select(SimpleNamespace(), candidates, arms, train)
        n_full = len(calls)
        calls.clear()
        cut = _selection.select(SimpleNamespace(), candidates, arms, train, cut=True)
        saved += n_full - len(calls)
        viable = [all(table[(c, a, g)][1] for a in arms for g in range(groups)) for c in candidates]
        lowest = [min(table[(c, a, g)][0] for a in arms for g in range(groups)) for c in candidates]
        pool = [i for i, v in enumerate(viable) if v] or list(range(len(candidates)))
        choice = max(pool, key=lambda i: (lowest[i], -i))
        assert full.viable == viable and full.choice == choice
        assert cut.viable == viable and (cut.choice == choice or not any(viable))  # none viable: partial scores
        for a in arms:
            ok = [i for i, c in enumerate(candidates) if all(table[(c, a, g)][1] for g in range(groups))]
            own = max(ok or range(len(candidates)), key=lambda i: (min(table[(candidates[i], a, g)][0]
                                                                        for g in range(groups)), -i))
            assert full.own_best[a] == own
            if ok:
                assert cut.own_best[a] == own
    assert saved > 200  # the cut trains less


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
