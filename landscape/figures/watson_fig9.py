"""Watson et al. (2023), Fig. 9 (Sec. 4.1.4): five steps on one fixed batch of 128 (lr 0.1, C = 1, noise scale
0.4) with SGD, clip-only, noise-only and DP-SGD, from the initialisation and from a model trained 10 epochs
with SGD; training loss and gradient norm per step, averaged over batches.

The design notes: docs/figures.md, "What each recipe measures" (watson-fig9).
"""

from __future__ import annotations

import copy

import numpy as np

from landscape.figures import _draw
from landscape.figures.recipe import PaperScale, Recipe
from landscape.verdict import all_of, paired_greater

SOURCE = "Watson et al. 2023, Fig. 9, Sec. 4.1.4"
METHODS = ("sgd", "clip-only", "noise-only", "dpsgd")
_COMMON = dict(model="lenet", data="digits", lr=0.1, C=1.0, sigma=0.4, batch=128, steps=5, train_lr=0.03,
               train_batch=32)
SCALES = {
    "test": {**_COMMON, "subset": 300, "train_epochs": 1, "batches": 2, "noise_seeds": 2},
    "cpu": {**_COMMON, "subset": None, "train_epochs": 10, "batches": 10, "noise_seeds": 5},
    "paper": {**_COMMON, "model": "resnet18", "data": "cifar10", "subset": None, "train_epochs": 10,
              "train_lr": 0.1, "train_batch": 128, "batches": 10, "noise_seeds": 5},
}


def batch_gradient_norm(model, x, y) -> float:
    """``||(1/n) sum_i grad l_i||`` of the batch at the model's parameters (plain autograd)."""
    import torch
    import torch.nn.functional as F

    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))


def five_steps(model, x, y, method: str, *, lr: float, C: float, sigma: float, steps: int, seed: int):
    """``(losses, grad_norms)`` at steps 0..``steps`` of ``method`` on the fixed batch ``x, y`` (model copied)."""
    import torch
    import torch.nn.functional as F

    from landscape.train.privatize import PrivacyConfig, Privatizer

    model = copy.deepcopy(model).train()
    priv = Privatizer(model, PrivacyConfig(optimizer=method, max_grad_norm=C, noise_multiplier=sigma),
                      expected_batch_size=len(y), generator=torch.Generator().manual_seed(seed))
    losses, norms = [], []
    for t in range(steps + 1):
        with torch.no_grad():
            losses.append(float(F.cross_entropy(model(x), y)))
        norms.append(batch_gradient_norm(model, x, y))
        if t == steps:
            break
        priv.compute_gradients(x, y)
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
        model.zero_grad(set_to_none=True)
    return np.array(losses), np.array(norms)


def make(ctx):
    import torch

    from landscape.api import TrainConfig
    from landscape.api.resolve import Resolver

    s = ctx.settings
    run = ctx.train("sgd", TrainConfig(model=s["model"], data=s["data"], subset=s["subset"], epochs=s["train_epochs"],
                                       lr=s["train_lr"], batch_size=s["train_batch"], seed=0, checkpoint_every="1e"))
    resolver = Resolver(ctx.root)
    numbers, curves = {}, {}
    for start in ("init", "trained"):
        point = resolver.point(f"{run.name}@{'init' if start == 'init' else 'last'}")
        model = point.model()
        x_all, y_all = point.split("train")
        perm = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(0))
        for m in METHODS:
            seeds = range(s["noise_seeds"]) if m in ("noise-only", "dpsgd") else range(1)
            per_batch = []
            for b in range(s["batches"]):
                idx = perm[b * s["batch"]:(b + 1) * s["batch"]]
                runs = [five_steps(model, x_all[idx], y_all[idx], m, lr=s["lr"], C=s["C"], sigma=s["sigma"],
                                   steps=s["steps"], seed=1000 * b + k) for k in seeds]
                per_batch.append(np.mean([r for r in runs], axis=0))  # (2, steps + 1): loss, grad norm
            curves[(start, m)] = np.asarray(per_batch)  # (batches, 2, steps + 1)
            numbers[f"{start}/{m}/loss"] = curves[(start, m)][:, 0]
            numbers[f"{start}/{m}/grad_norm"] = curves[(start, m)][:, 1]
        numbers[f"{start}/batch_indices"] = perm[:s["batches"] * s["batch"]].numpy().reshape(s["batches"], -1)

    def end(start, m, what):
        return curves[(start, m)][:, 0 if what == "loss" else 1, -1]

    parts = [paired_greater(f"from init, {m} ends above SGD's loss", SOURCE, end("init", m, "loss"),
                            end("init", "sgd", "loss"), names=(m, "SGD"), unit="batches") for m in METHODS[1:]]
    parts += [paired_greater(f"from init, DP-SGD ends above {m}'s loss", SOURCE, end("init", "dpsgd", "loss"),
                             end("init", m, "loss"), names=("DP-SGD", m), unit="batches")
              for m in ("clip-only", "noise-only")]
    parts += [paired_greater(f"from the trained model, {m} ends with a larger gradient norm than SGD", SOURCE,
                             end("trained", m, "grad"), end("trained", "sgd", "grad"), names=(m, "SGD"),
                             unit="batches") for m in METHODS[1:]]
    verdict = all_of("from init SGD ends lowest and DP-SGD highest; from a trained model every variant's gradient "
                     "norm exceeds SGD's", SOURCE, parts)
    ctx.scope(f"lr {s['lr']:g}, C {s['C']:g}, noise scale {s['sigma']:g}, batch {s['batch']}, {s['steps']} steps; "
              f"trained start: SGD {s['train_epochs']} epochs")
    numbers["steps"] = s["steps"]
    return numbers, verdict


COLORS = {"sgd": "#0072B2", "clip-only": "#009E73", "noise-only": "#CC79A7", "dpsgd": "#D55E00"}


def draw(d):
    from landscape.plots import style

    n = d.numbers
    steps = np.arange(int(n["steps"]) + 1)
    fig, axes = style.subplots(2, 2, figsize=(9.5, 6.6), layout="constrained")
    for row, start in enumerate(("init", "trained")):
        for col, (what, key) in enumerate((("loss", "loss"), ("gradient norm", "grad_norm"))):
            ax = axes[row, col]
            sgd = np.atleast_2d(n[f"{start}/sgd/{key}"]).mean(axis=0)
            means = [np.atleast_2d(n[f"{start}/{m}/{key}"]).mean(axis=0) for m in METHODS]
            span = float(np.ptp(np.concatenate(means))) or 1.0
            for i, m in enumerate(METHODS):
                c = np.atleast_2d(n[f"{start}/{m}/{key}"])
                mean, sd = c.mean(axis=0), c.std(axis=0, ddof=1) if c.shape[0] > 1 else np.zeros(c.shape[1])
                same = m != "sgd" and float(np.max(np.abs(mean - sgd))) < 0.01 * span
                x = _draw.dodge(steps, i, len(METHODS), width=0.3)
                ax.errorbar(x, mean, yerr=sd, marker=style.MARKERS[i], ls=style.LINESTYLES[i], color=COLORS[m],
                            capsize=2, ms=4, label=m + (" (= SGD within 1% of the panel's range)" if same else ""))
            ax.axhline(sgd[0], color="0.3", ls=":", lw=0.8, label="step 0 (all methods)")
            ax.set(xlabel="step on the fixed batch (series offset sideways)", ylabel=f"train {what}",
                   title=f"from {'initialisation' if start == 'init' else 'trained model'}")
    axes[0, 0].legend(fontsize=7, title="mean, bars: sd over batches", title_fontsize=7)
    axes[1, 1].legend(fontsize=7, title="mean, bars: sd over batches", title_fontsize=7)
    return _draw.finish(fig, d, f"Fig. 9 ({d.scale}): {d.verdict.status}", axes)


RECIPE = Recipe(
    name="watson-fig9", paper="Watson et al. 2023 (clipping, pruning and loss landscapes)", figure="Fig. 9",
    claim="on a fixed batch, DP-SGD reduces the loss least from init; from a trained model all variants' gradients "
          "exceed SGD's",
    scaled_down="LeNet on digits, 5 steps on 10 fixed batches of 128, 5 noise draws, trained start 10 SGD epochs",
    scales=SCALES,
    paper_scale=PaperScale(data="cifar10", model="resnet18 (GroupNorm)", epochs=10,
                           hyper="lr 0.1, C = 1, noise scale 0.4, batch 128, 5 steps", gpu_hours=1.0),
    make=make,
    draw=draw,
)
