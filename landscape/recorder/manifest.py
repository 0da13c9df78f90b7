"""A recorded run's manifest fields, and creating or continuing the run (``open_run``)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from landscape.errors import UsageError
from landscape.hashing import sha256_file
from landscape.jsonable import to_jsonable
from landscape.params import unwrap
from landscape.privacy import PrivacyHistory
from landscape.store import MANIFEST, Checkpoint, Run, Store

RECORDER_FORMAT = "landscape-recorder/1"


def open_run(store: Store, name: str, fields: dict[str, Any], lineage: dict[str, Any] | None,
             privacy: dict[str, Any], extra: dict[str, Any]) -> tuple[Run, bool]:
    """Create run ``name``, or open it (taking its lock) when it exists and this recorder would have created it.
    Returns the run and whether it was created. ``privacy`` is the run's privacy record at step 0 (its fields but
    ``steps`` are fixed)."""
    if not (store.root / name / MANIFEST).is_file():
        return store.create_run(name, lineage=lineage, extra=extra, **fields), True
    run = store.open_run(name)
    try:
        check_same(run, fields, lineage, privacy)
        if privacy.get("accounted"):  # a recorder killed between a checkpoint and its manifest update
            infos = run.checkpoints()
            last = infos[-1].step if infos else 0
            if run.manifest["privacy"].get("steps") != last:
                run.update_manifest(privacy={**privacy, "steps": last})
    except BaseException:
        run.close()
        raise
    return run, False


def check_same(run: Run, fields: dict[str, Any], lineage: dict[str, Any] | None, privacy: dict[str, Any]) -> None:
    """Refuse, in one line, to write into a run this recorder would not have created."""
    manifest, name = run.manifest, run.name
    if not isinstance(manifest.get("recorder"), dict):
        by = ("landscape train" if "schedule" in manifest else
              "landscape import" if (manifest.get("lineage") or {}).get("imported_from") else "another writer")
        raise UsageError(f"run '{name}' was written by {by}, not by a Recorder; record into a new run name")
    for key, value in fields.items():
        if manifest.get(key) != normal(value):
            raise UsageError(f"run '{name}' was recorded with another {key.replace('_', ' ')} "
                             f"({short(manifest.get(key))}, now {short(normal(value))}); record into a new "
                             "run name")
    recorded_parent = manifest.get("lineage") or {}
    if recorded_parent.get("parent_sha256") != (lineage or {}).get("parent_sha256"):
        was = (f"from parent {recorded_parent.get('parent_run')}@step={recorded_parent.get('parent_step')}"
               if recorded_parent else "without a parent")
        now = f"parent {lineage['parent_ref']}" if lineage else "no parent"
        raise UsageError(f"run '{name}' was recorded {was}, now {now}; give the same parent= (or record into a new "
                         "run name)")
    fixed = {k: v for k, v in normal(privacy).items() if k != "steps"}
    recorded = {k: v for k, v in (manifest.get("privacy") or {}).items() if k != "steps"}
    if recorded != fixed:
        raise UsageError(f"run '{name}' was recorded with other privacy settings ({short(recorded)}, now "
                         f"{short(fixed)}); record into a new run name")


def close_run(run: Run, discard: bool) -> None:
    """Release the run's lock; with ``discard`` (a run this recorder created, left by an error before its first
    checkpoint) remove the run if it holds no checkpoint, freeing the name."""
    try:
        if discard:
            with contextlib.suppress(Exception):
                if not run.checkpoints():
                    shutil.rmtree(run.path, ignore_errors=True)
    finally:
        run.close()


def parent_of(store: Store, parent: Any, model_spec: dict[str, Any]
            ) -> tuple[Checkpoint | None, dict[str, Any] | None, PrivacyHistory]:
    """The parent checkpoint of ``parent=``, the run's lineage and the parent's privacy history."""
    from landscape.train.pruning import MASK_ARRAY, inherited_privacy, lineage_of

    if parent is None:
        return None, None, PrivacyHistory()
    if not isinstance(parent, (str, os.PathLike)) or not str(parent):
        raise UsageError(f"parent= must be a checkpoint reference ('run@last', 'run@step=N' or a file), got {parent!r}")
    ref = str(parent)
    ckpt = store.load(ref)
    if normal(ckpt.model_spec) != normal(model_spec):
        raise UsageError(f"the model ({short(normal(model_spec))}) is not the model of parent {ref} "
                         f"({short(normal(ckpt.model_spec))}); a child run keeps its parent's model")
    if ckpt.run is not None and (store.root / ckpt.run / MANIFEST).is_file() and \
            MASK_ARRAY in store.run(ckpt.run).array_names():
        raise UsageError(f"parent {ref} is a pruned run: a recorder cannot keep its pruned weights at zero in your "
                         "loop; train the child with `landscape train --from`")
    history = inherited_privacy(store, ckpt)
    if history.parent_epsilon is not None:
        history.parent_epsilon["ref"] = ref  # as the user named it, as train --from records it
    return ckpt, lineage_of(ckpt, ref), history


def model_spec(model: nn.Module) -> dict[str, Any]:
    """The ``landscape_spec`` of the model inside ``model``'s wrappers (``landscape.params.unwrap``)."""
    inner = unwrap(model)
    spec = getattr(inner, "landscape_spec", None)
    if not isinstance(spec, Mapping) or "name" not in spec:
        held = next((name for name, module in inner.named_modules()
                     if name and isinstance(getattr(module, "landscape_spec", None), Mapping)), None)
        if held is not None:
            raise UsageError(
                f"the model is a {type(inner).__name__} holding the landscape model at '{held}' (its state dict names "
                f"start '{held}.'), a wrapper the Recorder does not look through (it looks through torch.compile, "
                "DataParallel, DistributedDataParallel and Opacus' GradSampleModule); give it the model inside")
        raise UsageError(f"the model ({type(inner).__name__}) has no landscape_spec: build it with "
                         "landscape.models.build_model(...) so that analyses can rebuild it")
    return jsonable(spec, "the model spec")


def data_spec(data: Any) -> dict[str, Any]:
    spec = getattr(data, "spec", data)
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise UsageError("data= must be a landscape.data.Dataset (or its spec): analyses evaluate the run on it")
    return jsonable(spec, "the data spec")


def jsonable(value: Any, what: str) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(to_jsonable(dict(value)), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} must be JSON-able (numbers, strings, lists, dicts): {exc}") from None


def normal(value: Any) -> Any:
    return json.loads(json.dumps(to_jsonable(value)))


def short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def recorder_record() -> dict[str, Any]:
    """How the run was recorded: the script (``__main__``) and its sha256, torch and python versions."""
    record: dict[str, Any] = {"format": RECORDER_FORMAT, "torch": torch.__version__,
                              "python": platform.python_version()}
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if script and Path(script).is_file():
        record["script"] = str(Path(script).resolve())
        record["script_sha256"] = sha256_file(script)
    return record
