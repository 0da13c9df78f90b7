"""Claim-neutral hyper-parameter selection (the viable candidate with the highest lowest arm score on a held-out
validation split) and the sensitivity of a verdict to that choice (:func:`judge_with_sensitivity`).

The rule, and why: docs/figures.md, "Selection a referee accepts".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

SELECTION_SEED = 1000  # selection runs' seeds start here; evaluation runs use 0, 1, ... (disjoint)
HOLDOUT = 0.2  # the share of the training split held out of every selection run: the validation split
WINDOW = 3  # a selection run's score: its worst validation accuracy over the last WINDOW checkpoints


def for_selection(config, i: int = 0):
    """``config`` (a :class:`~landscape.api.TrainConfig`) as selection run ``i``: seed ``SELECTION_SEED + i``, 80 % of
    what the evaluation run trains on, every epoch checkpointed."""
    subset = config.subset
    if subset is None:
        subset = 1.0 - HOLDOUT
    elif isinstance(subset, float) and subset <= 1.0:
        subset = subset * (1.0 - HOLDOUT)
    else:
        subset = max(2, int(round(int(subset) * (1.0 - HOLDOUT))))
    return dataclasses.replace(config, seed=SELECTION_SEED + i, subset=subset, checkpoint_every="1e")


_SPLITS: dict = {}


def validation(run, data_root: str | None = None):
    """``(x, y)`` of a selection run's validation split: the examples of the full training split its stratified
    subset left out (rebuilt from the run's data spec; cached)."""
    from landscape.data import load_dataset, subset_indices

    spec = run.manifest["data_spec"]
    key = (spec["name"], spec["seed"], repr(spec["subset"]), repr(sorted((spec.get("options") or {}).items())),
           data_root)
    if key not in _SPLITS:
        data = load_dataset(spec["name"], seed=spec["seed"], data_root=data_root, **(spec.get("options") or {}))
        x, y = data.split("train")
        if spec["subset"] is None:
            raise ValueError(f"{run.name} trained on the whole training split: no validation examples left")
        keep = np.zeros(len(y), dtype=bool)
        keep[subset_indices(y, spec["subset"], spec["seed"]).numpy()] = True
        _SPLITS[key] = (x[~keep], y[~keep])
    return _SPLITS[key]


@dataclasses.dataclass
class Score:
    """One selection run on the validation split: accuracy and loss at each of its last :data:`WINDOW`
    checkpoints (epochs), and whether it passes the gate's rule there."""

    run: str
    epochs: list
    acc: list
    loss: list
    viable: bool
    reason: str = ""

    @property
    def worst(self) -> float:
        a = np.asarray(self.acc, dtype=float)
        return float(np.min(a)) if a.size and np.all(np.isfinite(a)) else -math.inf


def score(ctx, run) -> Score:
    """Score a selection run on its validation split (plain forward passes of its last checkpoints)."""
    import torch
    import torch.nn.functional as F

    from landscape.api.resolve import Resolver
    from landscape.figures.recipe import classes_of, final

    x, y = validation(run, ctx.data_root)
    infos = run.checkpoints()[-WINDOW:]
    resolver = Resolver(ctx.root)
    acc, loss = [], []
    for info in infos:
        model = resolver.point(f"{run.name}@step={info.step}").model().eval()
        with torch.no_grad():
            logits = model(x)
        acc.append(float((logits.argmax(1) == y).double().mean()))
        loss.append(float(F.cross_entropy(logits.double(), y)))
    epochs = [float(i.epoch) for i in infos]
    reasons = (ctx.gate_rule.judge(np.asarray(acc), np.asarray(epochs), (final(run, "train_loss"), loss[-1]),
                                   classes_of(run), "validation") if ctx.gate_rule else [])
    return Score(run.name, epochs, acc, loss, not reasons, "; ".join(reasons))


@dataclasses.dataclass
class Selection:
    """The outcome of :func:`select`: per candidate and arm the scored selection runs (``None``: not trained,
    cut), the choice, the viable candidates and each arm's own best (indices into ``candidates``)."""

    candidates: list
    arms: list
    label: Callable[[Any], str]
    runs: dict          # (candidate index, arm) -> [Score] or None
    choice: int
    viable: list        # per candidate: every arm viable
    own_best: dict      # arm -> candidate index
    note: str = ""

    def arm_score(self, i: int, arm: str) -> float:
        """The lowest score of ``arm``'s selection runs at candidate ``i`` (NaN: not trained)."""
        scores = self.runs.get((i, arm))
        return min(s.worst for s in scores) if scores else math.nan

    def arm_viable(self, i: int, arm: str) -> bool:
        scores = self.runs.get((i, arm))
        return bool(scores) and all(s.viable for s in scores)

    def setting(self, **overrides) -> dict:
        """The chosen setting as ``{arm: candidate index}`` (with ``overrides``)."""
        return {arm: overrides.get(arm, self.choice) for arm in self.arms}

    def value(self, i: int):
        return self.candidates[i]

    def describe(self, setting: dict) -> str:
        """A setting in words: one candidate for every arm, or each arm's."""
        if len(set(setting.values())) == 1:
            return self.label(self.candidates[next(iter(setting.values()))])
        return "; ".join(f"{arm} {self.label(self.candidates[i])}" for arm, i in setting.items())

    def numbers(self) -> dict:
        """The summary's ``selection/*``: candidates (rows of their values), per candidate x arm the lowest
        validation score (NaN: cut) and viability (1 / 0, NaN: cut), the chosen index, each arm's own best."""
        rows = [list(c) if isinstance(c, tuple) else [c] for c in self.candidates]
        score = [[self.arm_score(i, a) for a in self.arms] for i in range(len(self.candidates))]
        viable = [[float(self.arm_viable(i, a)) if self.runs.get((i, a)) else math.nan for a in self.arms]
                  for i in range(len(self.candidates))]
        score = [[v if math.isfinite(v) else math.nan for v in row] for row in score]
        return {"selection/candidates": rows, "selection/validation_acc": score, "selection/viable": viable,
                "selection/chosen": self.choice, "selection/own_best": [self.own_best[a] for a in self.arms]}


def select(ctx, candidates: Sequence, arms: Sequence[str], train: Callable[[Any, str], Iterable[list]], *,
           label: Callable[[Any], str] = str, cut: bool = False) -> Selection:
    """Train and score every candidate's selection runs (module docstring). ``train(candidate, arm)`` yields groups
    of selection runs (store :class:`~landscape.store.Run` objects) of that arm at that candidate; with ``cut`` an
    arm stops at a candidate after its first group with a non-viable run."""
    candidates, arms = list(candidates), list(arms)
    runs: dict = {}
    for i, c in enumerate(candidates):
        for arm in arms:
            scored: list[Score] = []
            for group in train(c, arm):
                scored += [score(ctx, r) for r in group]
                if cut and not all(s.viable for s in scored):
                    break
            runs[(i, arm)] = scored
    return _decide(Selection(candidates, arms, label, runs, 0, [], {}))


def _decide(sel: Selection) -> Selection:
    """Fill in the viable candidates, the choice and each arm's own best from the scored runs."""
    n = len(sel.candidates)
    sel.viable = [all(sel.arm_viable(i, a) for a in sel.arms) for i in range(n)]
    lowest = [min((v for a in sel.arms if not math.isnan(v := sel.arm_score(i, a))), default=-math.inf)
              for i in range(n)]
    pool = [i for i, ok in enumerate(sel.viable) if ok] or list(range(n))
    sel.choice = max(pool, key=lambda i: (np.nan_to_num(lowest[i], nan=-np.inf), -i))
    sel.note = "" if any(sel.viable) else ("no candidate's selection runs all passed the validity rule on the "
                                           "validation split; the highest lowest score was taken")
    for a in sel.arms:
        own = [i for i in range(n) if sel.arm_viable(i, a)] or list(range(n))
        sel.own_best[a] = max(own, key=lambda i: (np.nan_to_num(sel.arm_score(i, a), nan=-np.inf), -i))
    return sel


def combine(*selections: Selection) -> Selection:
    """One selection over the arms of several (over the same candidates): a candidate is viable when it is viable
    for every one of them, and the maximin runs over all their arms."""
    first = selections[0]
    if any(s.candidates != first.candidates for s in selections):
        raise ValueError("combined selections need the same candidates")
    runs = {k: v for s in selections for k, v in s.runs.items()}
    arms = [a for s in selections for a in s.arms]
    return _decide(Selection(first.candidates, arms, first.label, runs, 0, [], {}))


def judge_with_sensitivity(ctx, sel: Selection, evaluate: Callable[[dict], tuple[dict, Any]]) -> tuple[dict, Any]:
    """The recipe's ``(numbers, verdict)`` at the chosen setting; ``evaluate({arm: candidate index})`` runs again at
    every other viable candidate and each arm's own best, into ``ctx.sensitivity`` and ``sensitivity/*`` numbers."""
    chosen = sel.setting()
    numbers, verdict = evaluate(chosen)
    entries = [{"role": "chosen", "setting": chosen, "label": sel.describe(chosen), "verdict": verdict}]
    for i, ok in enumerate(sel.viable):
        if ok and i != sel.choice:
            setting = {a: i for a in sel.arms}
            entries.append(_evaluated(ctx, "viable", setting, sel.describe(setting), evaluate))
    if sel.own_best != chosen:
        entries.append(_evaluated(ctx, "own best", dict(sel.own_best), sel.describe(sel.own_best), evaluate))
    ctx.sensitivity = entries
    ctx.scope(f"chosen: {sel.label(sel.candidates[sel.choice])}")
    note = sentence(entries, sel) + (f" {verdict.note}" if verdict.note else "")
    verdict = dataclasses.replace(verdict, note=note)
    entries[0]["verdict"] = verdict
    codes = {True: 1.0, False: 0.0, None: math.nan}
    nparts = max(len(e["verdict"].parts) for e in entries)
    numbers = {**numbers, **sel.numbers(),
               "sensitivity/held": [codes[e["verdict"].held] for e in entries],
               "sensitivity/role": [("chosen", "viable", "own best").index(e["role"]) for e in entries],
               "sensitivity/setting": [[e["setting"][a] for a in sel.arms] for e in entries]}
    if nparts:
        numbers["sensitivity/parts_held"] = [[codes[p.held] for p in e["verdict"].parts] + [math.nan] * (
            nparts - len(e["verdict"].parts)) for e in entries]
    return numbers, verdict


def _evaluated(ctx, role: str, setting: dict, label: str, evaluate) -> dict:
    ctx.role = f"{role} ({label})"
    try:
        _, verdict = evaluate(setting)
    finally:
        ctx.role = ""
    return {"role": role, "setting": setting, "label": label, "verdict": verdict}


def sentence(entries: list[dict], sel: Selection | None = None) -> str:
    """The sensitivity in one sentence (the verdict note's start)."""
    chosen = entries[0]
    viable = [e for e in entries if e["role"] in ("chosen", "viable")]
    held = sum(e["verdict"].held is True for e in viable)
    text = f"Sensitivity: {chosen['verdict'].status} at the chosen setting ({chosen['label']})"
    if sel is not None and not any(sel.viable):
        text += " (no candidate was viable on the validation split)"
    text += f"; held at {held} of {len(viable)} viable setting{'s' if len(viable) != 1 else ''}"
    if len(viable) > 1:
        text += " (" + ", ".join(f"{e['label']}: {e['verdict'].status}" for e in viable) + ")"
    own = [e for e in entries if e["role"] == "own best"]
    if own:
        text += f"; with each arm at its own best ({own[0]['label']}): {own[0]['verdict'].status}"
    else:
        text += "; every arm's own best is the chosen setting"
    statuses = {e["verdict"].status for e in viable + own}
    text += ("; the verdict depends on the setting." if len(statuses) > 1 else
             "; the verdict is the same at every setting evaluated.")
    return text


def per_arm(ctx, candidates: Sequence, configs: dict, *, label: Callable[[Any], str] = lambda lr: f"lr {lr:g}",
            name: Callable[[Any], str] = lambda lr: f"lr{lr:g}", group: str | None = None) -> Selection:
    """:func:`select` for recipes whose arms are single runs: ``configs[arm](candidate)`` is the arm's
    :class:`~landscape.api.TrainConfig` at a candidate; its selection run is ``sel-ARM-NAME`` (one selection seed;
    ``group``: named in that shared group, see :meth:`~landscape.figures.recipe.Context.train`)."""

    def train(candidate, arm):
        config = for_selection(configs[arm](candidate))
        yield [ctx.train(f"sel-{arm}-{name(candidate)}", config, gated=False, group=group)]

    return select(ctx, candidates, list(configs), train, label=label)


def restrict(sel: Selection, arms: Sequence[str]) -> Selection:
    """The same selection runs judged over some of the arms only (e.g. the two norms a claim compares)."""
    runs = {k: v for k, v in sel.runs.items() if k[1] in arms}
    return _decide(Selection(sel.candidates, list(arms), sel.label, runs, 0, [], {}))
