"""The main job end to end on the embedded ``digits`` data (what ``make demo`` runs).

1. ``phases``: Phase 1 with SGD, then Phase-2 SGD and DP-SGD siblings (Watson et al. Sec. 4.1.1);
2. ``tour``: every sibling pair's interpolation and instability (Fig. 5), Phase 1 -> Phase 2 (Fig. 8) and
   SGD vs DP (Figs. 6, 7), with figures;
3. random directions from a Phase-2 SGD solution with the path toward its sibling drawn over them (Fig. 4).

Everything is written under one output directory; the function returns what a person needs to read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from landscape.analyze.interpolate import InterpolateConfig
from landscape.api import directions
from landscape.api.interpolation import tour
from landscape.api.training import RunSummary, phases
from landscape.train.config import PhasesConfig, TrainConfig


@dataclasses.dataclass
class DemoConfig:
    """Sizes of the demo; the defaults finish in about a minute of compute on one CPU thread."""

    epochs: int = 8
    ks: tuple[int, ...] = (1, 2, 4)
    copies: int = 2
    lr: float = 0.02
    batch_size: int = 32
    dp_lr: float = 0.5
    dp_momentum: float = 0.0
    max_grad_norm: float = 1.0
    target_epsilon: float = 8.0
    seed: int = 0
    points: int = 30
    directions: int = 50
    normalize: str = "filter"


@dataclasses.dataclass
class DemoResult:
    runs: list[RunSummary]
    instability_rows: list[dict]
    directions_summary: dict
    files: list[Path]


def demo(out_dir: str | Path = "demo-out", *, root: str | Path | None = None, config: DemoConfig | None = None,
         progress: bool | None = None) -> DemoResult:
    """Train the Phase-1/Phase-2 runs on digits and measure their geometry; see the module docstring."""
    config = config or DemoConfig()
    out_dir = Path(out_dir)
    root = Path(root) if root is not None else out_dir / "checkpoints"
    results = out_dir / "results"
    base = TrainConfig(model="lenet", data="digits", epochs=config.epochs, lr=config.lr,
                       batch_size=config.batch_size, seed=config.seed, max_grad_norm=config.max_grad_norm,
                       target_epsilon=config.target_epsilon)
    runs: list[RunSummary] = []
    for k in config.ks:
        runs += phases(PhasesConfig(base=base, k=k, copies=config.copies, phase1=("sgd",),
                                    phase2=("sgd", "dpsgd"), dp_lr=config.dp_lr, dp_momentum=config.dp_momentum,
                                    group=f"demo-k{k}"), root=root, progress=progress)
    made = tour("demo-k*", root=root, out_dir=results, config=InterpolateConfig(points=config.points))
    k = max(config.ks)
    profile = directions(f"demo-k{k}-sgd-sgd-0@last", toward=f"demo-k{k}-sgd-sgd-1@last", root=root,
                         output=results / "directions-sgd-sibling.h5", n=config.directions,
                         points=config.points, distance="auto", normalize=config.normalize, seed=config.seed)
    files = made.files() + [profile.path, *getattr(profile, "figures", [])]
    return DemoResult(runs=runs, instability_rows=made.rows(), directions_summary=profile.summary(),
                      files=[Path(f) for f in files])
