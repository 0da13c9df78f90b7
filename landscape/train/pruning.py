"""Magnitude pruning, masks (``dict[name, bool Tensor]``, True = keep) and rewinding survivors to their initial
values (Watson et al. Sec. 4 "Pruning"), and the privacy history a derived run inherits."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from landscape.errors import CheckpointError, IncompatibleError, OptionError, UsageError
from landscape.privacy import PrivacyEvent, PrivacyHistory

if TYPE_CHECKING:
    from landscape.store import Checkpoint, Run, Store

SCOPES = ("layer", "global")
MASK_ARRAY = "mask"  # name of the run array holding a run's keep-masks {parameter name: bool array}


def load_masks(run: Run) -> dict[str, torch.Tensor] | None:
    """The keep-masks stored with a run (array ``mask``), as bool tensors; None when it has none."""
    if MASK_ARRAY not in run.array_names():
        return None
    return {k: torch.as_tensor(v).to(torch.bool) for k, v in run.load_array(MASK_ARRAY).items()}


def _state(obj: nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(obj, nn.Module):
        return {n: p.detach() for n, p in obj.named_parameters()}
    return dict(obj)


def default_include(name: str, tensor: torch.Tensor) -> bool:
    """Prunable by default: weights of Linear/Conv layers (name ends in ``weight`` and ndim >= 2)."""
    return name.rsplit(".", 1)[-1] == "weight" and tensor.ndim >= 2 and tensor.is_floating_point()


def magnitude_masks(weights: nn.Module | Mapping[str, torch.Tensor], remove: float, scope: str = "layer",
                    include: Iterable[str] | Callable[[str, torch.Tensor], bool] | None = None
                    ) -> dict[str, torch.Tensor]:
    """Bool keep-masks removing EXACTLY ``round(remove * n)`` smallest-magnitude weights (ties by position), ``n``
    each tensor's size (``scope="layer"``) or that of all included tensors (``"global"``). ``include``: names, or
    a predicate ``(name, tensor) -> bool``; default :func:`default_include`."""
    if not (0.0 <= remove <= 1.0) or not math.isfinite(remove):
        raise OptionError("remove", f"must be a fraction in [0, 1], got {remove}")
    if scope not in SCOPES:
        raise OptionError("scope", f"must be layer or global, got {scope!r}")
    state = _state(weights)
    if include is None:
        names = [n for n, t in state.items() if default_include(n, t)]
    elif callable(include):
        names = [n for n, t in state.items() if include(n, t)]
    else:
        names = list(include)
        missing = [n for n in names if n not in state]
        if missing:
            raise IncompatibleError(f"cannot prune {missing[0]!r}: no such tensor")
    if not names:
        raise UsageError("nothing to prune: no tensor matches (default: Linear/Conv weights)")
    masks: dict[str, torch.Tensor] = {}
    for group in [[n] for n in names] if scope == "layer" else [names]:  # float64: exact for every dtype
        mags = [state[n].detach().abs().flatten().cpu().to(torch.float64) for n in group]
        flat = torch.cat(mags)
        keep = torch.ones(flat.numel(), dtype=torch.bool)
        keep[torch.sort(flat, stable=True).indices[: int(round(remove * flat.numel()))]] = False
        for n, part in zip(group, torch.split(keep, [m.numel() for m in mags]), strict=True):
            masks[n] = part.reshape(state[n].shape)
    return masks


def check_masks(masks: Mapping[str, torch.Tensor], state: nn.Module | Mapping[str, torch.Tensor]) -> None:
    """IncompatibleError naming the first mask whose name or shape the model/state dict lacks."""
    tensors = _state(state)
    for n, m in masks.items():
        if n not in tensors:
            raise IncompatibleError(f"mask {n!r} names no tensor of the model "
                                    "(masks from another architecture?)")
        shape = tuple(tensors[n].shape)
        if tuple(m.shape) != shape:
            raise IncompatibleError(f"mask {n!r} has shape {tuple(m.shape)} but the tensor has {shape}")


def apply_masks(
    state: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A new state dict with masked coordinates exactly 0 (other tensors copied)."""
    check_masks(masks, state)
    return {
        n: t.detach().clone() * torch.as_tensor(masks[n]).to(t) if n in masks else t.detach().clone()
        for n, t in state.items()
    }


def rewind(state: Mapping[str, torch.Tensor], init_state: Mapping[str, torch.Tensor],
           masks: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Lottery-ticket rewind: every tensor takes its value from ``init_state``, masked coordinates exactly 0;
    ``state`` (the trained weights) must have the same names and shapes."""
    for n, t in state.items():
        if n not in init_state:
            raise IncompatibleError(f"the initial weights lack {n!r}")
        if tuple(init_state[n].shape) != tuple(t.shape):
            raise IncompatibleError(
                f"{n!r} has shape {tuple(t.shape)} but {tuple(init_state[n].shape)} in the initial weights"
            )
    extra = [n for n in init_state if n not in state]
    if extra:
        raise IncompatibleError(f"the initial weights have {extra[0]!r}, the trained ones do not")
    return apply_masks({n: init_state[n] for n in state}, masks)


@torch.no_grad()
def mask_params_(model: nn.Module, masks: Mapping[str, torch.Tensor]) -> None:
    """Zero the masked coordinates of the model's parameters in place."""
    params = dict(model.named_parameters())
    check_masks(masks, params)
    for n, m in masks.items():
        params[n].mul_(torch.as_tensor(m).to(params[n]))


@torch.no_grad()
def mask_optimizer_state_(
    optimizer: torch.optim.Optimizer, model: nn.Module, masks: Mapping[str, torch.Tensor]
) -> None:
    """Zero the masked coordinates of every per-parameter optimizer buffer (momentum, Adam moments)."""
    by_param = {id(p): n for n, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        name = by_param.get(id(p))
        if name is None or name not in masks:
            continue
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                value.mul_(torch.as_tensor(masks[name]).to(value))


def lineage_of(checkpoint: Checkpoint, ref: str) -> dict[str, Any]:
    """The ``manifest["lineage"]`` of a run whose step 0 derives from ``checkpoint`` (named ``ref``)."""
    return {
        "parent_run": checkpoint.run,
        "parent_step": checkpoint.step,
        "parent_epoch": checkpoint.epoch,
        "parent_ref": ref,
        "parent_sha256": checkpoint.sha256,
    }


def inherited_privacy(store: Store, checkpoint: Checkpoint) -> PrivacyHistory:
    """The privacy history of the weights at ``checkpoint``: its run's ancestor events and own accounted steps,
    the epsilon it reports, and whether a non-private or unknown (imported, undeclared) step came before. The
    one place child, pruned and aligned runs learn their history from."""
    privacy = manifest = None
    if checkpoint.run is not None:
        with contextlib.suppress(CheckpointError):
            manifest = store.run(checkpoint.run).manifest
            privacy = manifest.get("privacy")
    if not privacy:
        imported = bool(((manifest or {}).get("lineage") or {}).get("imported_from"))
        return PrivacyHistory(non_private=checkpoint.step > 0 and not imported, unknown=imported)
    history = PrivacyHistory.from_manifest(privacy)
    history.parent_epsilon = None
    if checkpoint.step > 0:
        if privacy.get("accounted"):
            history.events.append(PrivacyEvent(float(privacy["noise_multiplier"]), float(privacy["sample_rate"]),
                                               int(checkpoint.step)))
        else:
            history.non_private = True
    if privacy.get("accounted") and checkpoint.epsilon is not None:
        history.parent_epsilon = {
            "ref": f"{checkpoint.run}@step={checkpoint.step}", "epsilon": float(checkpoint.epsilon),
            "delta": float(privacy.get("total_delta", privacy.get("delta", math.nan))),
            "accountant": str(privacy.get("accountant")),
            **({"source": str(privacy["source"])} if privacy.get("source") else {})}
    return history


def _pruned_privacy(store: Store, source: Checkpoint, init: Checkpoint | None) -> dict[str, Any]:
    """``manifest["privacy"]`` of a pruned run: the history of the source (which chose the mask) and of the
    weights it was rewound to. Both from one run: the later checkpoint's history contains the earlier's.
    From two runs: both histories, composed (conservative if they share DP ancestors: never under-reports)."""
    history = inherited_privacy(store, source)
    if init is not None:
        if init.run is not None and init.run == source.run:
            if init.step > source.step:
                history = inherited_privacy(store, init)
        else:
            history = history + inherited_privacy(store, init)
    return {"accounted": False, **history.manifest_fields()}


def prune_into_run(store: Store, source: Checkpoint, remove: float, *, source_ref: str, scope: str = "layer",
                   init: Checkpoint | None = None, init_ref: str | None = None, run: str | None = None
                   ) -> tuple[Run, dict[str, torch.Tensor]]:
    """Magnitude-prune ``source`` into a new run whose step 0 holds the survivors, rewound to ``init`` when given;
    returns it and the keep-masks. The run records the masks, its lineage and both checkpoints' privacy."""
    masks = magnitude_masks(source.state_dict, remove, scope=scope)
    if init is not None:
        state = rewind(source.state_dict, init.state_dict, masks)
        data_spec = init.data_spec or source.data_spec
    else:
        state = apply_masks(source.state_dict, masks)
        data_spec = source.data_spec
    stored = {
        "command": "prune", "ref": source_ref, "remove": float(remove), "scope": scope,
        "rewind": "init" if init is not None else "none", "run": run, "init": init_ref,
        "init_ref": init_ref if init is not None else None, "init_sha256": init.sha256 if init is not None else None,
    }
    new = store.create_run(
        run, config=stored, seeds={}, lineage=lineage_of(source, source_ref), model_spec=source.model_spec,
        data_spec=data_spec, extra={"privacy": _pruned_privacy(store, source, init)},
    )
    new.save_array(MASK_ARRAY, {n: m.numpy() for n, m in masks.items()})
    new.save_checkpoint(state, step=0, epoch=0.0, attrs={"pruned": stored})
    return new, masks
