"""The options of ``landscape train`` and ``landscape phases`` (their click commands are generated from the
fields' metadata)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

from landscape.clip import CLIP_FUNCTIONS, CLIP_STYLES
from landscape.errors import LandscapeWarning, OptionError, UsageError, param
from landscape.options import (
    CHUNK_HELP,
    CLIP_FN_HELP,
    CLIP_STYLE_HELP,
    DEVICE_HELP,
    SOURCE_HELP,
    check_kwargs,
    coerce_field,
    option,
)
from landscape.privacy import ACCOUNTANTS
from landscape.runtime import DATA_ENV

OPTIMIZERS = ("sgd", "dpsgd", "clip-only", "noise-only")
DP_OPTIMIZERS = ("dpsgd", "clip-only", "noise-only")
SAMPLINGS = ("poisson", "shuffle")

# Fields that name or locate a run rather than define what it computes: left out of the config hash.
_NOT_HASHED = ("run", "resume", "device", "chunk", "data_root", "download")


class SamplingWarning(LandscapeWarning):
    """Shuffled batches with a DP optimizer: the accountant's epsilon assumes Poisson sampling."""


@dataclass
class TrainConfig:
    """Every option of one training run (``landscape train``). ``noise_multiplier`` and ``target_epsilon`` are
    alternatives: give one (``dpsgd``, ``noise-only``) or neither (``sgd``, ``clip-only``)."""

    data: str | None = option(None, SOURCE_HELP["data"] + " Default: digits (a child run: its parent's).",
                              kind="data")
    data_kwargs: dict[str, Any] = option(help=SOURCE_HELP["data_kwargs"], kind="json", default_factory=dict)
    subset: float | None = option(None, SOURCE_HELP["subset"], kind="subset")
    data_root: str | None = option(None, SOURCE_HELP["data_root"], kind="directory", envvar=DATA_ENV)
    download: bool = option(False, SOURCE_HELP["download"])
    model: str | None = option(None, SOURCE_HELP["model"] + " Default: lenet (a child run: its parent's).",
                               kind="model")
    model_kwargs: dict[str, Any] = option(help=SOURCE_HELP["model_kwargs"], kind="json", default_factory=dict)
    data_seed: int = option(0, "Seed of the data set (subset draw, synthetic data).")
    epochs: int = option(10, "Epochs of ceil(N/B) steps each (as `landscape privacy --epochs` counts).", min=1)
    lr: float = option(0.05, "Learning rate.", min=0, min_open=True)
    momentum: float = option(0.9, min=0, max=1, max_open=True)
    weight_decay: float = option(0.0, min=0)
    batch_size: int = option(64, "Batch size B (the expected batch size q*N under Poisson sampling).", min=1)
    seed: int = option(0, "Seeds initialisation, data order and noise.")
    device: str = option("auto", DEVICE_HELP, kind="device")
    checkpoint_every: str = option("1e", "Ns (steps), Ee (epochs) or none; init and final are always kept.")
    max_grad_norm: float = option(1.0, "Clipping norm C.", min=0, min_open=True)
    noise_multiplier: float | None = option(None, "Noise multiplier sigma.", min=0)
    target_epsilon: float | None = option(None, "Find sigma so that epsilon after training equals this (instead of "
                                                "--noise-multiplier).", min=0, min_open=True)
    delta: float = option(1e-5, min=0, max=1, min_open=True, max_open=True)
    accountant: str | None = option(None, "Privacy accountant. Default: rdp; a child run continues with its "
                                          "parent's (pld for a parent accounted by Opacus' prv or gdp, which "
                                          "landscape cannot compute; both epsilons are then recorded).",
                                    choices=ACCOUNTANTS)
    clip_style: str = option("flat", CLIP_STYLE_HELP, choices=CLIP_STYLES)
    clip_fn: str = option("abadi", CLIP_FN_HELP, choices=tuple(CLIP_FUNCTIONS))
    sampling: str | None = option(None, "Default: poisson for DP optimizers (what the accountant assumes), shuffle "
                                        "for sgd.", choices=SAMPLINGS)
    sparsify: float = option(0.0, "Random sparsification rate R* with gradual cooling (Zhu & Blaschko Alg. 1).",
                             min=0, max=1, max_open=True)
    smooth: float = option(0.0, "Laplacian smoothing sigma_LS (DP-LSSGD).", min=0)
    chunk: int | None = option(None, CHUNK_HELP, min=1)
    optimizer: str = option("sgd", "sgd, dpsgd (clip + noise), clip-only, noise-only.", choices=OPTIMIZERS)
    run: str | None = option(None, "Run name (default: a generated unique id).")
    from_ref: str | None = option(None, "Start from a checkpoint (RUN[@init|@last|@step=N|@epoch=E] or PATH.h5): a "
                                        "child run.", flag="--from", metavar="REF")
    resume: str | None = option(None, "Continue a killed run from its last checkpoint (from step 0 if it was killed "
                                      "before its first).", metavar="RUN")

    @property
    def is_dp(self) -> bool:
        """True for the DP-SGD family (per-sample gradients through the Privatizer)."""
        return self.optimizer in DP_OPTIMIZERS

    @property
    def sampling_method(self) -> str:
        """The sampling actually used: the explicit choice, else poisson for DP and shuffle for sgd."""
        if self.sampling is not None:
            return self.sampling
        return "poisson" if self.is_dp else "shuffle"

    @property
    def accounted(self) -> bool:
        """Whether this run has a finite privacy guarantee (clipping and noise both on)."""
        return self.optimizer == "dpsgd"

    def validate(self) -> TrainConfig:
        """Check option combinations; raise ``UsageError`` (exit 2) with a one-line message."""
        for f in dataclasses.fields(self):  # each option by its declaration, as the command line checks it (type,
            # bounds, finiteness, choices, seeds, device), and held as the command line holds it ("10" becomes 10)
            setattr(self, f.name, coerce_field(TrainConfig, f, getattr(self, f.name)))
        if self.noise_multiplier is not None and self.target_epsilon is not None:
            raise UsageError(f"give {param('noise_multiplier')} or {param('target_epsilon')}, not both")
        if not self.is_dp:
            dp_only = {
                "noise_multiplier": self.noise_multiplier is not None,
                "target_epsilon": self.target_epsilon is not None,
                "sparsify": self.sparsify > 0,
                "smooth": self.smooth > 0,
            }
            given = [param(k) for k, v in dp_only.items() if v]
            if given:
                raise UsageError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} a DP {param('optimizer')} "
                                 "(dpsgd, clip-only or noise-only)")
        if self.optimizer in ("dpsgd", "noise-only") and self.noise_multiplier is None and self.target_epsilon is None:
            raise UsageError(f"{param('optimizer', self.optimizer)} needs {param('noise_multiplier')} or {param('target_epsilon')}")
        if self.optimizer == "clip-only" and (self.noise_multiplier or self.target_epsilon is not None):
            raise UsageError(f"{param('optimizer', 'clip-only')} adds no noise; drop {param('noise_multiplier')} and {param('target_epsilon')}")
        if self.optimizer == "noise-only" and self.target_epsilon is not None:
            raise UsageError(f"{param('optimizer', 'noise-only')} has no privacy guarantee to calibrate; use {param('noise_multiplier')}")
        if self.from_ref is not None and self.resume is not None:
            raise UsageError(f"give {param('from_ref')} or {param('resume')}, not both")
        parse_every(self.checkpoint_every)
        check_kwargs(self.data_kwargs, self.model_kwargs)
        return self

    def warn_sampling(self) -> None:
        """Warn when shuffled batches are combined with an accounted DP optimizer."""
        if self.accounted and self.sampling_method == "shuffle":
            warnings.warn(f"{param('sampling', 'shuffle')} with DP: the reported epsilon assumes Poisson subsampling (sample rate "
                          "B/N) and is not a guarantee for shuffled batches", SamplingWarning, stacklevel=2)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Rebuild from a manifest's ``config`` (unknown keys are ignored; missing ones take defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def config_hash(config: TrainConfig | dict[str, Any]) -> str:
    """Hash of the non-default fields (open_lth ``desc.py``): new defaulted options keep old hashes."""
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_dict(config)
    default = TrainConfig()
    diff = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(TrainConfig)
        if f.name not in _NOT_HASHED and getattr(cfg, f.name) != getattr(default, f.name)
        and not (f.name == "accountant" and cfg.accountant == "rdp")  # the default a run resolves to: old hashes
    }
    blob = json.dumps(diff, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


_EVERY = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([se])\s*$", re.IGNORECASE)


def parse_every(spec: str | None) -> tuple[str, float] | None:
    """``"50s"`` -> ("steps", 50); ``"1e"`` / ``"0.5e"`` -> ("epochs", E); ``"none"`` -> None (init and final
    only). A zero interval (``0s``) is an error rather than a silent ``none``."""
    if spec is None or str(spec).strip().lower() == "none":
        return None
    m = _EVERY.match(str(spec))
    if not m:
        raise OptionError("checkpoint_every", f"{spec!r}: use N followed by s (steps) or e (epochs), e.g. 50s or 1e")
    value, unit = float(m.group(1)), m.group(2).lower()
    if value <= 0:
        raise OptionError("checkpoint_every", f"{spec!r}: the interval must be positive; use 'none' for init and "
                                              "final checkpoints only")
    if unit == "s" and value != int(value):
        raise OptionError("checkpoint_every", f"{spec!r}: a step count must be a whole number")
    return ("steps", value) if unit == "s" else ("epochs", value)


def checkpoint_steps(spec: str | None, steps_per_epoch: int, total_steps: int) -> list[int]:
    """The global steps at which checkpoints are written: 0, every interval, and ``total_steps``."""
    every = parse_every(spec)
    steps = {0, total_steps}
    if every is not None:
        unit, value = every
        interval = max(1.0, value if unit == "steps" else value * steps_per_epoch)
        k = 1
        while (s := int(math.floor(k * interval + 1e-9))) < total_steps:
            if s > 0:
                steps.add(s)
            k += 1
    return sorted(steps)


PHASE_FAMILIES = ("sgd", "dpsgd")


@dataclass
class PhasesConfig:
    """``landscape phases`` (Watson et al. 2023, Sec. 4.1.1): Phase 1 trains ``k`` epochs with each family from
    ONE initialisation; Phase 2 continues each for ``epochs - k`` epochs in ``copies`` copies seeded
    ``base.seed + 1 + i`` (differing only in data order and noise). ``base`` holds the shared training options;
    the lr/momentum overrides, unset, change neither the runs nor any hash (docs/training.md)."""

    base: TrainConfig
    k: int = option(1, "Phase-1 epochs (Watson et al. Sec. 4.1.1).", min=1, required=True)
    copies: int = option(2, "Phase-2 copies per combination (they differ only in data order and noise).", min=1)
    phase1: tuple[str, ...] = option(PHASE_FAMILIES, "Phase-1 families: sgd,dpsgd.", choices=PHASE_FAMILIES,
                                     metavar="TEXT")
    phase2: tuple[str, ...] = option(PHASE_FAMILIES, "Phase-2 families: sgd,dpsgd.", choices=PHASE_FAMILIES,
                                     metavar="TEXT")
    dp_lr: float | None = option(None, "Learning rate of DP phases (default: --lr).", min=0, min_open=True)
    dp_momentum: float | None = option(None, "Momentum of DP phases (default: --momentum).", min=0, max=1,
                                       max_open=True)
    group: str | None = option(None, "Name prefix of the runs (default: phases-<hash>).")
    phase2_sgd_lr: float | None = option(None, "Learning rate of Phase-2 SGD copies (default: --lr).", min=0,
                                         min_open=True)
    phase2_sgd_momentum: float | None = option(None, "Momentum of Phase-2 SGD copies (default: --momentum).", min=0,
                                               max=1, max_open=True)

    def validate(self) -> PhasesConfig:
        for f in dataclasses.fields(self):  # each option by its declaration (bounds, finiteness), as the CLI does
            if f.name in ("copies", "dp_lr", "dp_momentum", "phase2_sgd_lr", "phase2_sgd_momentum"):
                coerce_field(PhasesConfig, f, getattr(self, f.name))
        if not 1 <= self.k < self.base.epochs:
            raise UsageError(f"{param('k')} must be between 1 and {param('epochs')} - 1 = {self.base.epochs - 1}, got {self.k}")
        for name, families in (("phase1", self.phase1), ("phase2", self.phase2)):
            bad = [f for f in families if f not in PHASE_FAMILIES]
            if bad or not families:
                raise OptionError(name, f"takes a comma-separated list of sgd, dpsgd; got {','.join(families) or 'nothing'}")
        if self.base.from_ref is not None or self.base.resume is not None:
            raise UsageError(f"phases start from scratch; {param('from_ref')} and {param('resume')} do not apply")
        if "dpsgd" in (*self.phase1, *self.phase2):
            if self.base.noise_multiplier is None and self.base.target_epsilon is None:
                raise UsageError(f"a dpsgd phase needs {param('noise_multiplier')} or {param('target_epsilon')}")
        for phase, families in ((1, self.phase1), (2, self.phase2)):
            for family in families:
                self.phase_config(family, epochs=self.base.epochs, seed=self.base.seed, phase=phase).validate()
        if self.group is not None:  # every derived name, before Phase 1 trains
            from landscape.store import check_run_name

            for name in self.run_names(self.group):
                try:
                    check_run_name(name)
                except UsageError:
                    shown = name if len(name) <= 60 else f"{name[:30]}...{name[-20:]}"
                    raise UsageError(f"{param('group')} makes the run name {shown!r} ({len(name)} characters), which is "
                                     "not a valid run name: 1-200 letters, digits or _ . , + = -, not starting "
                                     f"with '.' or '-'; choose a shorter or plainer {param('group')}") from None
        return self

    def run_names(self, group: str) -> list[str]:
        """The runs of group ``group``: ``G-p1`` for each Phase-1 family and ``G-p1-p2-i`` for its copies."""
        return [name for p1 in self.phase1
                for name in (f"{group}-{p1}", *(f"{group}-{p1}-{p2}-{i}" for p2 in self.phase2
                                               for i in range(self.copies)))]

    def phase_config(self, family: str, *, epochs: int, seed: int, noise_multiplier: float | None = None,
                     from_ref: str | None = None, run: str | None = None, phase: int = 1) -> TrainConfig:
        """The TrainConfig of one run of Phase ``phase`` (1 or 2; ``family`` sgd or dpsgd)."""
        dp = family == "dpsgd"
        lr, momentum = self.base.lr, self.base.momentum
        if dp:
            lr = self.dp_lr if self.dp_lr is not None else lr
            momentum = self.dp_momentum if self.dp_momentum is not None else momentum
        elif phase == 2:
            lr = self.phase2_sgd_lr if self.phase2_sgd_lr is not None else lr
            momentum = self.phase2_sgd_momentum if self.phase2_sgd_momentum is not None else momentum
        fields = {**self.base.to_dict(), "optimizer": family, "epochs": epochs, "seed": seed, "run": run,
                  "from_ref": from_ref, "resume": None, "lr": lr, "momentum": momentum}
        if from_ref is not None:
            fields.update(model=None, model_kwargs={}, data=None, data_kwargs={}, subset=None)
        if not dp:
            fields.update(noise_multiplier=None, target_epsilon=None, sparsify=0.0, smooth=0.0)
        elif noise_multiplier is not None:
            fields.update(noise_multiplier=noise_multiplier, target_epsilon=None)
        return TrainConfig(**fields)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
