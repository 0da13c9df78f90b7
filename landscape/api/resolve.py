"""References -> store -> checkpoints: the one place that opens the store for an analysis, and
:meth:`Resolver.point`, the one load-and-verify step (docs/ARCHITECTURE.md, "References, Points and subsets").
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from landscape.api._common import check_pair, checkpoint_dataset
from landscape.errors import CheckpointError, LandscapeWarning, OptionError, UsageError, param
from landscape.refs import Ref
from landscape.store import Checkpoint, CheckpointInfo, Store, load_verified


@dataclass(frozen=True)
class Target:
    """One checkpoint to analyse, not yet loaded (its sha256 is checked when it is)."""

    ref: str
    path: str
    run: str | None
    step: int
    epoch: float
    tag: tuple = ()  # what an analysis' expand() attached, as (key, value) pairs (e.g. the pruning level)
    sha256: str | None = None

    @classmethod
    def of(cls, run: str, info: CheckpointInfo, tag: tuple = ()) -> Target:
        """Checkpoint ``info`` of run ``run``, as ``RUN@step=N``."""
        return cls(str(Ref.at_step(run, info.step)), str(info.path), run, info.step, info.epoch, tag, info.sha256)


@dataclass
class Point:
    """A resolved checkpoint, as an analyzer's ``compute`` receives it: ``data`` is the data set to evaluate
    on (the checkpoint's own, or the one chosen for a pair), ``masks`` the run's pruning mask or None."""

    ref: str
    run: str | None
    step: int
    epoch: float
    checkpoint: Checkpoint
    data: Any = None
    masks: dict[str, torch.Tensor] | None = None
    init: dict[str, torch.Tensor] | None = None  # the run's @init weights (when asked for)
    manifest: dict | None = None  # the run's manifest (when asked for)
    tag: dict = field(default_factory=dict)

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return self.checkpoint.state_dict

    def model(self) -> torch.nn.Module:
        """A fresh model with this checkpoint's weights (strictly loaded)."""
        return self.checkpoint.build_model()

    def split(self, name: str, subset: int | float | None = None, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of split ``name`` of ``data``, or the ``subset`` of it the one sampler draws."""
        from landscape.data import take_subset

        return take_subset(*self.data.split(name), subset, seed, split=name)

    def input_ref(self):
        return self.checkpoint.input_ref()


@dataclass
class DataChoice:
    """Which data set a pair is evaluated on, and both checkpoints' specs (recorded in the result)."""

    data_from: str
    spec_a: dict = field(default_factory=dict)
    spec_b: dict = field(default_factory=dict)

    def attrs(self) -> dict[str, Any]:
        return {"data_from": self.data_from, "data_spec_a": json.dumps(self.spec_a, sort_keys=True),
                "data_spec_b": json.dumps(self.spec_b, sort_keys=True)}


class Resolver:
    """Turns references into checkpoints and points for one store root (picklable: sent to workers)."""

    def __init__(self, root: str | os.PathLike = "checkpoints", *, data_root: str | None = None,
                 download: bool = False):
        self.root = str(root)
        self.data_root = data_root
        self.download = download

    @property
    def store(self) -> Store:
        return Store(self.root)

    def expand(self, target: str | Ref) -> list[Target]:
        """A bare run name -> every checkpoint of the run; anything else -> the one checkpoint it names."""
        ref = Ref.parse(target)
        store = self.store
        if ref.bare and ref.run in store.run_names():
            infos = store.run(ref.run).checkpoints()
            if not infos:
                raise CheckpointError(f"run '{ref.run}' has no checkpoints yet")
            return [Target.of(ref.run, i) for i in infos]
        ckpt = store.load(ref)
        return [Target(str(ref), str(ckpt.path), ckpt.run, ckpt.step, ckpt.epoch, sha256=ckpt.sha256)]

    def dataset(self, ckpt: Checkpoint, *, purpose: str = "evaluate it"):
        return checkpoint_dataset(ckpt.data_spec, self.data_root, self.download, purpose=purpose,
                                  source=str(ckpt.path) if ckpt.run is None else "the checkpoint")

    def point(self, target: Target | str | Ref, *, like: Point | None = None, label: str | None = None,
              data: bool = True, masks: bool = False, purpose: str = "evaluate it",
              needs: tuple[str, ...] = ()) -> Point:
        """The one load-and-verify step: one checkpoint (a :class:`Target` or a reference) with its sha256
        checked against its run's manifest, and against ``like`` when given (the same tensors and model;
        ``label`` names it in the message). ``data``, ``masks`` and ``needs`` (``"init"``, ``"manifest"``) say
        what to add."""
        if isinstance(target, Target):
            ckpt = load_verified(target.path, ref=target.ref, sha256=target.sha256)
        else:
            ckpt = self.store.load(target)
            target = Target(ckpt.ref, str(ckpt.path), ckpt.run, ckpt.step, ckpt.epoch, sha256=ckpt.sha256)
        if like is not None:
            check_pair(like.checkpoint, ckpt, b_label=label)
        run = self._run(target.run) if needs else None
        init = None
        if "init" in needs and run is not None:
            try:
                info = run.select("init")
                init = load_verified(info.path, sha256=info.sha256).state_dict
            except CheckpointError:
                init = None
        return Point(ref=target.ref, run=target.run, step=target.step, epoch=target.epoch, checkpoint=ckpt,
                     data=self.dataset(ckpt, purpose=purpose) if data else None,
                     masks=self.masks(target.run) if masks else None, init=init,
                     manifest=run.manifest if "manifest" in needs and run is not None else None,
                     tag=dict(target.tag))

    def _run(self, name: str | None):
        if name is None:
            return None
        try:
            return self.store.run(name)
        except CheckpointError:
            return None

    def pair(self, ref_a: str | Ref, ref_b: str | Ref, *, data_from: str = "a") -> tuple[Point, Point, DataChoice]:
        """A and B checked compatible (same tensors, same model), both with the data set ``data_from``
        picks."""
        if data_from not in ("a", "b"):
            raise OptionError("data_from", f"must be a or b, got {data_from!r}")
        a = self.point(ref_a, data=False)
        b = self.point(ref_b, like=a, data=False)
        choice = compare_data(a.checkpoint, b.checkpoint, data_from)
        data = self.dataset((a if data_from == "a" else b).checkpoint)
        a.data = b.data = data
        return a, b, choice

    def masks(self, run: str | None) -> dict[str, torch.Tensor] | None:
        """The pruning mask stored with ``run`` (run array ``mask``), or None."""
        from landscape.train.pruning import load_masks

        r = self._run(run)
        return None if r is None else load_masks(r)

    def run_info(self, ref: str | Ref):
        """What pairing needs from the manifest of the run a reference names (a file outside a run: none)."""
        from landscape.analyze.instability import RunInfo

        ref = Ref.parse(ref)
        if ref.run is None or ref.run not in self.store.run_names():
            return RunInfo(str(ref), None, None)
        return _run_info(self.store.run(ref.run))

    def pair_jobs(self, patterns: Sequence[str], pairs: str) -> list[tuple[str, str, dict]]:
        """``(ref_a, ref_b, labels)`` per pair: explicit ``A:B[,C:D...]``, or the final checkpoints of the
        runs matching ``patterns`` paired as ``siblings`` or ``all``."""
        from landscape.analyze.instability import RunInfo, all_pairs, pair_labels, sibling_pairs

        if ":" in pairs:
            jobs = []
            for item in pairs.split(","):
                ref_a, sep, ref_b = item.strip().partition(":")
                if not sep or not ref_a or not ref_b:
                    raise OptionError("pairs", f"takes siblings, all, or A:B[,C:D...]; got {item!r}")
                a, b = Ref.parse(ref_a), Ref.parse(ref_b)  # a bad reference fails here, before any worker starts
                jobs.append((str(a), str(b), pair_labels(self.run_info(a), self.run_info(b))))
            return jobs
        if pairs not in ("siblings", "all"):
            raise OptionError("pairs", f"takes siblings, all, or A:B[,C:D...]; got {pairs!r}")
        if not patterns:
            raise UsageError("give at least one run name or glob (e.g. 'phases-*')")
        store = self.store
        runs: dict[str, RunInfo] = {}
        for pattern in patterns:
            matched = store.runs_matching(pattern)
            if not matched:
                raise UsageError(f"no runs match {pattern!r} in {store.root}")
            for run in matched:
                runs[run.name] = _run_info(run)
        chosen = sibling_pairs(list(runs.values())) if pairs == "siblings" else all_pairs(list(runs.values()))
        if not chosen:
            raise UsageError(
                f"no {'sibling ' if pairs == 'siblings' else ''}pairs among {len(runs)} matched run(s)"
                + (" (siblings are runs trained from one parent checkpoint the same way: `landscape phases`, "
                   f"`train --from`, a Recorder's parent=; try {param('pairs', 'all')})" if pairs == "siblings" else "")
            )
        return [(str(Ref(run=x.name, at="last")), str(Ref(run=y.name, at="last")), pair_labels(x, y)) for x, y in chosen]


def _run_info(run):
    """A run's manifest fields that pairing reads (:class:`landscape.analyze.instability.RunInfo`)."""
    from landscape.analyze.instability import RunInfo

    m = run.manifest
    return RunInfo(run.name, m.get("phases"), m.get("lineage"), m.get("config"), m.get("privacy"))


def compare_data(a: Checkpoint, b: Checkpoint, data_from: str = "a", *, what: str = "A and B") -> DataChoice:
    """Compare the data specs of A and B; when they differ, warn in one line which one is used."""
    spec_a, spec_b = a.data_spec or {}, b.data_spec or {}
    if spec_a != spec_b:
        keys = sorted(k for k in set(spec_a) | set(spec_b) if spec_a.get(k) != spec_b.get(k))
        diff = "; ".join(f"{k}: {json.dumps(spec_a.get(k), sort_keys=True)} vs {json.dumps(spec_b.get(k), sort_keys=True)}"
                         for k in keys)
        used, other = ("A", "b") if data_from == "a" else ("B", "a")
        warnings.warn(f"{what} ({a.ref}, {b.ref}) were trained on different data ({diff}); evaluating on {used}'s "
                      f"({param('data_from', other)} for the other)", LandscapeWarning, stacklevel=3)
    return DataChoice(data_from=data_from, spec_a=spec_a, spec_b=spec_b)


def compare_others(a: Checkpoint, others: Sequence[Checkpoint], *, what: str) -> dict[str, Any]:
    """Checkpoints that only place a direction or a plane, everything evaluated on A's data: warn in one line
    when any was trained on other data than A; the result attrs record A's spec and each differing one."""
    spec_a = a.data_spec or {}
    differing = {o.ref: o.data_spec or {} for o in others if (o.data_spec or {}) != spec_a}
    if differing:
        names = ", ".join(list(differing)[:3]) + (f" and {len(differing) - 3} more" if len(differing) > 3 else "")
        warnings.warn(f"{what} {names} {'was' if len(differing) == 1 else 'were'} trained on different data than "
                      f"A ({a.ref}); every point is evaluated on A's data", UserWarning, stacklevel=3)
    attrs: dict[str, Any] = {"data_spec_a": json.dumps(spec_a, sort_keys=True)}
    if differing:
        attrs["data_specs_other"] = json.dumps(differing, sort_keys=True)
    return attrs
