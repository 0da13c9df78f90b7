"""Watson et al. (2023), Theorem 3.3 (Sec. 3.2): a two-layer linear net ``f(x) = W2 W1 x`` trained by gradient
flow on the mean squared error (eq. 12) of the signal/noise data (eqs. 6-9), from a balanced initialisation
``W2^T W2 = W1 W1^T``, converges (at a global minimum) to ``W_n = 0``: the weights on the noise inputs vanish,
so magnitude pruning removes exactly them.

The design notes: docs/figures.md, "What each recipe measures" (watson-thm33).
"""

from __future__ import annotations

import math

import numpy as np

from landscape.figures import _draw
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import Verdict, all_of

SOURCE = "Watson et al. 2023, Thm. 3.3, Sec. 3.2"
_COMMON = dict(ds=10, noise=1.0, signal=2.0, hidden=32, h=0.1, seed=0)
SCALES = {
    "test": {**_COMMON, "dn": 20, "n": 200, "steps": 200},
    "cpu": {**_COMMON, "dn": 90, "n": 1000, "steps": 6000},
    "paper": {**_COMMON, "dn": 990, "n": 10000, "steps": 6000},
}


def _flow(w1, w2, loss_fn, h: float, steps: int, ds: int, every: int):
    """Gradient flow ``dW/dt = -grad L(W)`` on ``loss_fn(W1, W2)`` integrated by classical Runge-Kutta (RK4) with
    step ``h`` (float64): plain gradient descent breaks the balancedness ``W2^T W2 = W1 W1^T`` that the flow
    conserves by O(h^2) per step, RK4 by O(h^5). Per ``every`` steps: time, loss, ||W_s||, ||W_n||, and the
    imbalance ``||W2^T W2 - W1 W1^T||_F``."""
    import torch

    def grad(a, b):
        a, b = a.detach().requires_grad_(True), b.detach().requires_grad_(True)
        return torch.autograd.grad(loss_fn(a, b), (a, b))

    trace = []
    for t in range(steps + 1):
        if t % every == 0 or t == steps:
            with torch.no_grad():
                trace.append((t * h, float(loss_fn(w1, w2)), float(w1[:, :ds].norm()), float(w1[:, ds:].norm()),
                              float((w2.T @ w2 - w1 @ w1.T).norm())))
        if t == steps:
            break
        k1 = grad(w1, w2)
        k2 = grad(w1 - h / 2 * k1[0], w2 - h / 2 * k1[1])
        k3 = grad(w1 - h / 2 * k2[0], w2 - h / 2 * k2[1])
        k4 = grad(w1 - h * k3[0], w2 - h * k3[1])
        w1 = w1 - h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
        w2 = w2 - h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
    return w1.detach(), w2.detach(), np.array(trace)


def make(ctx):
    import torch

    from landscape.data import gaussian_signal_key, load_dataset
    from landscape.models import build_model

    s = ctx.settings
    ds, dn, sd = s["ds"], s["dn"], s["noise"]
    data = load_dataset("gaussian-signal", seed=s["seed"], ds=ds, dn=dn, n=s["n"], n_test=10, noise=sd,
                        signal=s["signal"])
    torch.manual_seed(s["seed"])
    model = build_model("two-layer-linear", input_shape=data.input_shape, num_classes=1, hidden=s["hidden"],
                        balanced_init=True).double()
    w1_0, w2_0 = model.layer1.weight.detach(), model.layer2.weight.detach()
    v = gaussian_signal_key(data.spec).double()
    d = ds + dn
    S = sd ** 2 * torch.eye(d, dtype=torch.float64)
    S[:ds, :ds] += torch.outer(v, v)
    b = torch.zeros(d, dtype=torch.float64)
    b[:ds] = v
    w_star = torch.linalg.solve(S, b)
    loss_star = float(0.5 - 0.5 * b @ w_star)

    def population(w1, w2):
        w = (w2 @ w1).reshape(-1)
        return 0.5 * w @ S @ w - w @ b + 0.5

    x = data.x_train.double().reshape(len(data.y_train), -1)
    y = 2.0 * data.y_train.double() - 1.0

    def sample(w1, w2):
        return 0.5 * ((x @ (w2 @ w1).T).reshape(-1) - y).pow(2).mean()

    every = max(1, s["steps"] // 200)
    runs = {name: _flow(w1_0, w2_0, fn, s["h"], s["steps"], ds, every)
            for name, fn in (("population", population), ("sample", sample))}
    _, _, pop = runs["population"]
    w1s, w2s, smp = runs["sample"]
    w_ls = torch.linalg.lstsq(x, y.reshape(-1, 1)).solution.reshape(-1)
    loss_ls = float(sample(torch.outer(torch.ones(1, dtype=torch.float64), w_ls), torch.ones(1, 1, dtype=torch.float64)))
    predicted = float(w_ls[ds:].norm() / math.sqrt(float(w_ls.norm())))

    ratio = pop[-1, 3] / pop[0, 3]
    gap = pop[-1, 1] - loss_star
    converged = gap < 1e-9
    part_pop = Verdict(
        "on the population, gradient flow from a balanced init drives W_n to 0", SOURCE,
        "held if ||W_n(T)||/||W_n(0)|| < 1e-3 and L(T) - L* < 1e-9; did not hold if converged with a larger "
        "ratio; inconclusive if not converged",
        {"||W_n(0)||": pop[0, 3], "||W_n(T)||": pop[-1, 3], "ratio": ratio, "L(T) - L*": gap,
         "||W_s(T)||": pop[-1, 2], "time T": pop[-1, 0], "max imbalance": float(pop[:, 4].max())},
        None if not converged else bool(ratio < 1e-3))
    s_gap = smp[-1, 1] - loss_ls
    rel = abs(smp[-1, 3] - predicted) / predicted
    part_smp = Verdict(
        "on a finite sample, W_n ends at the balanced global minimum's ||w_LS,n|| / sqrt(||w_LS||)", SOURCE,
        "held if abs(||W_n(T)|| - prediction) / prediction < 0.01 and L(T) - L_LS < 1e-9; did not hold if converged "
        "with a larger difference; inconclusive if not converged",
        {"||W_n(T)||": smp[-1, 3], "prediction": predicted, "relative difference": rel, "L(T) - L_LS": s_gap,
         "||W_s(T)||": smp[-1, 2], "max imbalance": float(smp[:, 4].max())},
        None if not s_gap < 1e-9 else bool(rel < 0.01))
    verdict = all_of("gradient flow from a balanced init sends the noise-input weights W_n to 0 (Thm. 3.3)", SOURCE,
                     [part_pop, part_smp])
    ctx.scope(f"d_s {ds}, d_n {dn}, hidden {s['hidden']}, n {s['n']}, RK4 step {s['h']:g} for {s['steps']} steps, "
              "float64")
    numbers = {"time": pop[:, 0], "population/loss_minus_min": pop[:, 1] - loss_star,
               "population/W_s": pop[:, 2], "population/W_n": pop[:, 3], "population/imbalance": pop[:, 4],
               "sample/loss_minus_min": smp[:, 1] - loss_ls, "sample/W_s": smp[:, 2], "sample/W_n": smp[:, 3],
               "sample/imbalance": smp[:, 4], "sample/predicted_W_n": predicted,
               "w_star_noise_norm": float(w_star[ds:].norm()), "sample_final_W_n_entries": w1s[:, ds:].reshape(-1)}
    return numbers, verdict


def draw(d):
    from landscape.plots import style

    n = d.numbers
    t = np.asarray(n["time"])
    fig, axes = style.subplots(1, 2, figsize=(9.5, 3.6), layout="constrained")
    colors = {"population": style.method_color("sgd"), "sample": style.method_color("dpsgd")}
    for name in ("population", "sample"):
        for key, ls, what in (("W_n", "-", "||W_n||"), ("W_s", "--", "||W_s||")):
            v, dropped = _draw.positive(n[f"{name}/{key}"])
            note = f" ({int(dropped.sum())} points exactly 0, not drawn)" if dropped.any() else ""
            axes[0].plot(t, v, color=colors[name], lw=1.8 if key == "W_n" else 1.0, ls=ls, label=f"{what} ({name}){note}")
        v, dropped = _draw.positive(n[f"{name}/loss_minus_min"])
        note = f" ({int(dropped.sum())} points <= 0 at float64 rounding, not drawn)" if dropped.any() else ""
        axes[1].plot(t, v, color=colors[name], ls="-" if name == "population" else "--",
                     label=("population L - L*" if name == "population" else "sample L - L_LS") + note)
    axes[0].axhline(float(n["sample/predicted_W_n"]), color=colors["sample"], lw=0.8, ls=":",
                    label="sample: predicted ||W_n|| at the minimum")
    axes[0].set(xlabel="gradient-flow time t", ylabel="Frobenius norm", yscale="log",
                title=d.verdict.parts[0].status if d.verdict.parts else "")
    axes[0].legend(fontsize=6)
    axes[1].set(xlabel="gradient-flow time t", ylabel="loss above the global minimum", yscale="log",
                title=d.verdict.parts[1].status if len(d.verdict.parts) > 1 else "")
    axes[1].legend(fontsize=7)
    return _draw.finish(fig, d, f"Thm. 3.3 ({d.scale}), closed-form check: {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-thm33", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Thm. 3.3",
    claim="numerical check of a theorem (not an empirical claim): gradient flow from a balanced init drives the "
          "noise-input weights W_n of a two-layer linear net to 0",
    scaled_down="nothing to scale: population and a 1,000-example sample, d_s 10, d_n 90, hidden 32, float64",
    scales=SCALES,
    paper_scale=PaperScale(data="gaussian-signal", model="two-layer linear (balanced init)", epochs=0,
                           hyper="gradient flow (RK4, step 0.1, t = 600) on the population and on n = 10,000",
                           gpu_hours=0.0),
    make=make,
    draw=draw,
    kind="check",
)
