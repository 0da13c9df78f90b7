"""A second implementation of the verdict rules, written from the formulas (scipy distributions only), and the
recomputation of recipes' verdicts from their summary HDF5 files alone.

Used by tests/test_figures_recipes.py (test-scale summaries) and tests/test_figures_gallery.py (the committed
gallery's cpu-scale summaries); runnable as a script on any gallery folder:

    python tests/verdict_reference.py figures/ cpu        # one line per recipe: agrees / DISAGREES

Nothing here imports landscape.verdict: Welch and paired t by hand with ``scipy.special.stdtr``, the pair
U-statistic's variance by an explicit leave-one-unit-out loop, Holm by sorting, the sign-test fallback, TOST,
Spearman by a ranking loop, the exact binomial test by summing binomial coefficients.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import h5py
import numpy as np
from scipy import special

ALPHA = 0.05


def _three(p_claim: float, p_other: float):
    if math.isnan(p_claim) or math.isnan(p_other):
        return None
    return True if p_claim < ALPHA else (False if p_other < ALPHA else None)


def _t_two_sides(diff, se, df, n):
    """(p of diff > 0, p of diff < 0); the sign test over n units when se is 0."""
    if any(math.isnan(v) for v in (diff, se, df)):
        return math.nan, math.nan
    if se == 0:
        p = 0.5 ** n
        return (p, 1.0) if diff > 0 else (1.0, p)
    t = diff / se
    return 1 - special.stdtr(df, t), special.stdtr(df, t)


def jackknife(values, pairs):
    """Mean, standard error and unit count of values on every pair of units, by an explicit leave-one-out loop."""
    units = sorted({u for p in pairs for u in p})
    n = len(units)
    if n < 3:
        return float(np.mean(values)), math.nan, n
    left = []
    for u in units:
        keep = [v for v, p in zip(values, pairs, strict=True) if u not in p]
        left.append(sum(keep) / len(keep))
    mean_left = sum(left) / n
    return float(np.mean(values)), math.sqrt((n - 1) / n * sum((x - mean_left) ** 2 for x in left)), n


def _group(values, pairs):
    v = [float(x) for x in values]
    if pairs is not None:
        m, se, n = jackknife(v, pairs)
        return m, se ** 2, n - 1, n
    if len(v) < 2:
        return (sum(v) / len(v) if v else math.nan), math.nan, math.nan, len(v)
    m = sum(v) / len(v)
    return m, sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v), len(v) - 1, len(v)


def welch(a, b, min_effect=0.0, pairs_a=None, pairs_b=None):
    """(held, p against) of "a > b + min_effect", Welch (jackknife sides for pair groups)."""
    ma, va, da, na = _group(a, pairs_a)
    mb, vb, db, nb = _group(b, pairs_b)
    if math.isnan(va) or math.isnan(vb):
        return None, math.nan
    se = math.sqrt(va + vb)
    if se == 0:
        df = da + db
    else:
        df = (va + vb) ** 2 / ((va ** 2 / da if va else 0) + (vb ** 2 / db if vb else 0))
    p_gt, p_lt = _t_two_sides(ma - mb - min_effect, se, df, min(na, nb))
    return _three(p_gt, p_lt), p_lt


def paired(a, b, min_effect=0.0):
    d = [float(x) - float(y) - min_effect for x, y in zip(a, b, strict=True)]
    if len(d) < 2:
        return None, math.nan
    m = sum(d) / len(d)
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d))
    p_gt, p_lt = _t_two_sides(m, se, len(d) - 1, len(d))
    return _three(p_gt, p_lt), p_lt


def tost(a, b, margin, is_paired=False):
    if is_paired:
        d = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
        m = sum(d) / len(d)
        se = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1) / len(d))
        df, n = len(d) - 1, len(d)
    else:
        ma, va, da, na = _group(a, None)
        mb, vb, db, nb = _group(b, None)
        m, se = ma - mb, math.sqrt(va + vb)
        df = (va + vb) ** 2 / ((va ** 2 / da if va else 0) + (vb ** 2 / db if vb else 0)) if se else da + db
        n = min(na, nb)
    inside = max(_t_two_sides(m - margin, se, df, n)[1], _t_two_sides(m + margin, se, df, n)[0])
    beyond = min(_t_two_sides(m - margin, se, df, n)[0], _t_two_sides(m + margin, se, df, n)[1])
    return _three(inside, beyond), beyond


def spearman(groups, rising=True):
    xs = [k for k in sorted(groups) for _ in groups[k]]
    ys = [v for k in sorted(groups) for v in groups[k]]

    def ranks(v):
        return [sum(w < x for w in v) + (sum(w == x for w in v) + 1) / 2 for x in v]

    if len(set(ys)) < 2 or len(ys) < 3:
        return None, math.nan
    rho = float(np.corrcoef(ranks(xs), ranks(ys))[0, 1])
    n = len(xs)
    t = rho * math.sqrt((n - 2) / (1 - rho ** 2)) if abs(rho) < 1 else math.copysign(math.inf, rho)
    p_up = 1 - special.stdtr(n - 2, t)
    p_down = special.stdtr(n - 2, t)
    return (_three(p_up, p_down), p_down) if rising else (_three(p_down, p_up), p_up)


def bound(values, limit, below=True, pairs=None):
    m, var, df, n = _group(values, pairs)
    if math.isnan(var):
        return None, math.nan
    p_gt, p_lt = _t_two_sides(m - limit, math.sqrt(var), df, n)
    return (_three(p_lt, p_gt), p_gt) if below else (_three(p_gt, p_lt), p_lt)


def most_above(values, limit):
    v = [x for x in values if math.isfinite(x)]
    n, k = len(v), sum(x > limit for x in v)
    p_more = sum(math.comb(n, j) for j in range(k, n + 1)) / 2 ** n
    p_less = sum(math.comb(n, j) for j in range(0, k + 1)) / 2 ** n
    return _three(p_more, p_less), p_less


def holm(p):
    """Holm's adjusted p-values by the definition: max over j <= i of (k - j) p_(j), capped at 1."""
    order = sorted((v, i) for i, v in enumerate(p) if not math.isnan(v))
    k, out, running = len(order), [math.nan] * len(p), 0.0
    for rank, (v, i) in enumerate(order):
        running = max(running, (k - rank) * v)
        out[i] = min(1.0, running)
    return out


def all_of(parts):
    """``parts``: [(held, p against)] (p against NaN for deterministic rules); returns (combined, part statuses)."""
    p = [pa for _, pa in parts]
    tested = sum(not math.isnan(x) for x in p)
    adj = holm(p)
    out = []
    for (held, pa), a in zip(parts, adj, strict=True):
        if held is False and tested >= 2 and not math.isnan(pa) and not a < ALPHA:
            held = None
        out.append(held)
    combined = False if False in out else (True if out and all(h is True for h in out) else None)
    return combined, out


# ---------------------------------------------------------------------------------- recipes from their summaries


def read(path):
    with h5py.File(path, "r") as f:
        numbers = {}
        f["numbers"].visititems(lambda k, v: numbers.__setitem__(k, np.asarray(v)) if isinstance(v, h5py.Dataset)
                                else None)
        verdict = json.loads(f.attrs["verdict"])
    return numbers, verdict


def _pairs(copies):
    return list(itertools.combinations(range(copies), 2))


def fig2(n):
    combos = [("sgd", "sgd"), ("sgd", "dpsgd"), ("dpsgd", "sgd"), ("dpsgd", "dpsgd")]
    acc = {c: n[f"{c[0]}-{c[1]}/test_acc"] for c in combos}
    me = float(n["min_effect"])
    parts = [welch(acc[(p1, "sgd")], acc[(p1, "dpsgd")], me) for p1 in ("sgd", "dpsgd")]
    return parts + [paired(n["phase2_gaps"], n["phase1_gaps"], me)]


def fig3(n):
    h = float(n["min_height"])
    inits, sibs = n["init_heights"], n["sibling_heights"]
    ni = int(round((1 + math.sqrt(1 + 8 * len(inits))) / 2))
    ns = int(round((1 + math.sqrt(1 + 8 * len(sibs))) / 2))
    return [welch(inits, sibs, h, _pairs(ni), _pairs(ns)),
            bound(np.asarray(inits) - np.asarray(n["end_gaps"]), 0.0, below=False, pairs=_pairs(ni))]


def fig5(n):
    h = float(n["min_height"])
    ks, eps = list(np.atleast_1d(n["k"])), list(np.atleast_1d(n["epsilon"]))
    sgd = np.atleast_2d(n["sgd/height"])
    dp = np.asarray(n["dp/height"]).reshape(len(eps), len(ks), -1)
    copies = int(round((1 + math.sqrt(1 + 8 * sgd.shape[1])) / 2))
    corner = (len(eps) - 1, len(ks) - 1) if len(ks) > 1 and len(eps) > 1 else None
    return [welch(dp[i, j], sgd[j], h, _pairs(copies), _pairs(copies))
            for i in range(len(eps)) for j in range(len(ks)) if (i, j) != corner]


def fig8(n):
    h = float(n["min_height"])
    return [welch(n[f"{c}/height"], n["sgd-sgd/height"], h) for c in ("sgd-dpsgd", "dpsgd-sgd", "dpsgd-dpsgd")]


def fig9(n):
    ends = {m: n[f"init/{m}/loss"][:, -1] for m in ("sgd", "clip-only", "noise-only", "dpsgd")}
    grads = {m: n[f"trained/{m}/grad_norm"][:, -1] for m in ("sgd", "clip-only", "noise-only", "dpsgd")}
    return ([paired(ends[m], ends["sgd"]) for m in ("clip-only", "noise-only", "dpsgd")]
            + [paired(ends["dpsgd"], ends[m]) for m in ("clip-only", "noise-only")]
            + [paired(grads[m], grads["sgd"]) for m in ("clip-only", "noise-only", "dpsgd")])


def fig10(n):
    me = float(n["min_effect"])
    return [welch(n["sgd/final"], n["clip-only/final"], me), welch(n["noise-only/final"], n["clip-only/final"], me),
            tost(n["noise-only/final"], n["sgd/final"], float(n["margin"]))]


def fig11(n):
    R, cos = np.atleast_2d(n["R"]), np.atleast_2d(n["cos"])
    levels = len(R)
    return ([paired(R[0], R[i]) for i in range(1, levels)] + [paired(cos[i], cos[0]) for i in range(1, levels)])


def fig13(n):
    me = float(n["min_effect"])
    return [paired(n[f"{m}/final"], n["none/final"], me) for m in ("full", "subset")]


def wang(n):
    acc = np.asarray(n["test_acc"])
    me = float(n["min_effect"])
    return [paired(acc[i, j], acc[i, 0], me) for i in range(acc.shape[0]) for j in range(1, acc.shape[1])]


def zhu_fig2(n):
    sc = np.atleast_1d(n["sigma"]) * np.atleast_1d(n["C"])
    gains = np.atleast_2d(n["gain"])
    rates = list(np.atleast_1d(n["rates"]))
    acc = np.asarray(n["train_acc"])
    rt = rates.index(float(n["r_test"]))
    parts = [spearman({float(s): list(g) for s, g in zip(sc, gains, strict=True)}, rising=True)]
    parts += [paired(acc[i, rt], acc[i, 0], float(n["min_gain"])) for i in np.flatnonzero(np.isclose(sc, n["gain_at"]))]
    parts += [tost(acc[i, rt], acc[i, 0], float(n["margin"]), is_paired=True)
              for i in np.flatnonzero(np.isclose(sc, n["maintained_at"]))]
    return parts


def zhu_figF(n):
    return [bound(np.atleast_2d(n[f"{m}/energy_coefficient"]).max(axis=1), float(n["bound"]))
            for m in ("dpsgd", "dpsgd-rs")]


RECIPES = {"watson-fig2": fig2, "watson-fig3": fig3, "watson-fig5": fig5, "watson-fig8": fig8, "watson-fig9": fig9,
           "watson-fig10": fig10, "watson-fig11": fig11, "watson-fig13": fig13, "wang-lssgd": wang,
           "zhu-fig2": zhu_fig2, "zhu-figF": zhu_figF}
INVALID = "inconclusive (invalid regime)"


def recompute(path) -> tuple[bool, str]:
    """Recompute a summary's verdict from its numbers: ``(agrees, message)``; a part the validity gate made
    inconclusive (its note says so) is inconclusive whatever the rule gives, and its p-value against the claim still
    counts in the Holm family (the parts' p-values, as the rule states)."""
    name = Path(path).name.rsplit("-", 1)[0]
    numbers, verdict = read(path)
    parts = RECIPES[name](numbers)
    invalid = [p.get("note", "").startswith(INVALID) for p in verdict.get("parts", [])]
    parts = [(None, part[1]) if bad else part for part, bad in zip(parts, invalid, strict=True)]
    combined, statuses = all_of(parts)
    stored = [p["held"] for p in verdict["parts"]]
    if verdict.get("note", "").startswith(INVALID):
        combined = None
    ok = statuses == stored and combined == verdict["held"]
    return ok, f"{name}: stored {stored} -> {verdict['held']}, recomputed {statuses} -> {combined}"


def main(argv) -> int:
    out, scale = Path(argv[1]), argv[2]
    bad = 0
    for name in RECIPES:
        path = out / name / f"{name}-{scale}.h5"
        if not path.is_file():
            print(f"{name}: no summary")
            continue
        ok, message = recompute(path)
        bad += not ok
        print(("agrees   " if ok else "DISAGREES ") + message)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
