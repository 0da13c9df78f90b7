"""What a Recorder accepts as its model: the module inside the wrappers that only prefix its state dict names,
with the tensors (names, shapes, kinds of dtype) of the model its ``landscape_spec`` builds, since that is the
model every analysis rebuilds to read the run."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from landscape.errors import LandscapeError, UsageError
from landscape.params import first_mismatch
from landscape.store import PREFIXES

HOW_TO_FIX = ("analyses rebuild the model from its spec: make the change inside the factory (e.g. apply Opacus' "
              "ModuleValidator.fix there), or build the model with build_model from a factory that returns the "
              "changed model")


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside wrappers whose state dict is their one child's under a prefix (:data:`PREFIXES`):
    torch.compile's ``OptimizedModule`` (``_orig_mod``), Opacus' ``GradSampleModule`` (``_module``),
    ``DataParallel`` and ``DistributedDataParallel`` (``module``), nested in any order."""
    while "landscape_spec" not in vars(model):
        for prefix in PREFIXES:
            inner = model._modules.get(prefix[:-1])
            if isinstance(inner, nn.Module) and _prefixed(model, inner, prefix):
                model = inner
                break
        else:
            break
    return model


def _prefixed(outer: nn.Module, inner: nn.Module, prefix: str) -> bool:
    return list(outer.state_dict(keep_vars=True)) == [prefix + k for k in inner.state_dict(keep_vars=True)]


def model_spec(model: nn.Module) -> dict[str, Any]:
    """The ``landscape_spec`` of an unwrapped model; a one-line refusal for a model without one, naming a wrapper
    the recorder does not know when the spec is inside it."""
    spec = vars(model).get("landscape_spec")
    if isinstance(spec, Mapping) and "name" in spec:
        return dict(spec)
    inside = next((name for name, sub in model.named_modules() if "landscape_spec" in vars(sub)), None)
    if inside is not None:
        raise UsageError(f"the model is a {type(model).__name__} around the model build_model made (at '{inside}'), "
                         "a wrapper the Recorder does not know: its state dict names are not the inner model's; "
                         f"pass the inner model (model.{inside})")
    raise UsageError(f"the model ({type(model).__name__}) has no landscape_spec: build it with "
                     "landscape.models.build_model(...) so that analyses can rebuild it")


def reference(spec: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors (on the meta device: shapes and dtypes only) of the model ``spec`` builds, built the way
    analyses build it, without moving the caller's random number generators."""
    from landscape import plugins
    from landscape.models import model_from_spec

    code = spec.get("code") or {}
    named = [f"{code.get('file') or code.get('module')}:{code.get('attr')}"] if code else []
    try:
        with _kept_rng(), plugins.trusting(named):
            try:
                with torch.device("meta"):  # no memory, no initialisation
                    model = model_from_spec(dict(spec))
            except Exception:  # noqa: BLE001 (a factory that needs real tensors: built on the CPU)
                model = model_from_spec(dict(spec))
    except LandscapeError as exc:
        raise UsageError(f"the model cannot be rebuilt from its spec, so no analysis could read the run: {exc}") \
            from None
    return {k: v.detach().to("meta") for k, v in model.state_dict().items()}


@contextlib.contextmanager
def _kept_rng() -> Iterator[None]:
    states = random.getstate(), np.random.get_state()  # noqa: NPY002 (the user's global state, kept)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])  # noqa: NPY002


def mismatch(built: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> str | None:
    """What differs between the tensors of the model the spec builds and ``state`` (the first name), or None."""
    m = first_mismatch(built, state, dtypes=True)
    if m is None:
        return None
    if m.kind == "only_a":
        return f"tensor '{m.name}' of the model its spec builds is missing from yours"
    if m.kind == "only_b":
        return f"your model has tensor '{m.name}', which the model its spec builds does not"
    if m.kind == "shape":
        return f"tensor '{m.name}' has shape {tuple(m.b)} in your model but {tuple(m.a)} in the model its spec builds"
    return (f"tensor '{m.name}' is {str(m.b).removeprefix('torch.')} in your model but "
            f"{str(m.a).removeprefix('torch.')} in the model its spec builds")
