"""A run directory's layout and its manifest: file names, run names, the one manifest schema
(:func:`check_manifest`), atomic JSON writes."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from landscape.atomic import atomic_write
from landscape.errors import CheckpointError, UsageError
from landscape.jsonable import to_jsonable

MANIFEST = "manifest.json"
ARRAYS = "arrays.h5"
MANIFEST_FORMAT = "landscape-run/1"
CHECKPOINT_FORMAT = "landscape-checkpoint/1"
_CHECKPOINT_FILE = re.compile(r"step-(\d+)\.h5")
_MANIFEST_KEYS = frozenset(
    {"format", "name", "created", "code_version", "environment", "portable", "config", "seeds", "lineage",
     "model_spec", "data_spec", "checkpoints"}
)


def _write_json_atomic(path: Path, obj: Any) -> None:
    """``obj`` as JSON, atomically: indented, except that a run manifest's ``checkpoints`` are one line each (json's
    C encoder: a manifest rewritten at every checkpoint costs microseconds per entry, not tens of them)."""
    entries = obj.get("checkpoints") if isinstance(obj, dict) else None
    if not isinstance(entries, list) or not entries:
        text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n"
    else:
        fields = []
        for key, value in obj.items():
            if key == "checkpoints":
                dumped = "[\n" + ",\n".join(f"    {_one_line_json(e)}" for e in entries) + "\n  ]"
            else:
                dumped = json.dumps(to_jsonable(value), indent=2, allow_nan=False).replace("\n", "\n  ")
            fields.append(f"  {json.dumps(str(key))}: {dumped}")
        text = "{\n" + ",\n".join(fields) + "\n}\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _one_line_json(value: Any) -> str:
    """``value`` as one line of JSON: directly when it holds plain JSON types only, else through to_jsonable."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(to_jsonable(value), allow_nan=False)


#: The deepest nesting of arrays and objects a manifest may have (the store's own fields nest 4 deep; a user's
#: config or data options a few more). Deeper JSON is damage: every walk over the parsed value (checking it,
#: writing it again) recurses once per level. JSON nested past Python's recursion limit is refused by the parser.
MAX_JSON_DEPTH = 64


def _deeper_field(fields: dict[str, Any]) -> str | None:
    """The first of ``fields`` (the fields of a manifest, each at level 2) whose value nests deeper than
    :data:`MAX_JSON_DEPTH`, or None; walked without recursion (a cycle is too deep too)."""
    for key, value in fields.items():
        todo = [(value, 2)]
        while todo:
            obj, depth = todo.pop()
            if isinstance(obj, (dict, list, tuple)):
                if depth > MAX_JSON_DEPTH:
                    return key
                todo.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj))
    return None


def check_depth(fields: dict[str, Any]) -> None:
    """A one-line UsageError naming the first manifest field nested deeper than :data:`MAX_JSON_DEPTH`, so that
    no manifest is written that cannot be read back."""
    key = _deeper_field(fields)
    if key is not None:
        raise UsageError(f"manifest field '{key}' nests deeper than {MAX_JSON_DEPTH} levels")


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except RecursionError:
        raise CheckpointError(f"cannot read run manifest {path}: it nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read run manifest {path}: {_one_line(exc)}") from None
    manifest = check_manifest(manifest, path)
    manifest.setdefault("checkpoints", [])
    return manifest


_SHA256 = re.compile(r"[0-9a-f]{64}")
_NON_FINITE = ("nan", "inf", "-inf", "Infinity", "-Infinity", "NaN", "none", "None")


def check_manifest(manifest: Any, path: str | os.PathLike) -> dict[str, Any]:
    """Check a run manifest (as parsed from JSON) against the store's one schema; return it. A manifest
    without its required fields is damage, never a run nothing vouches for; a checkpoint entry's ``file`` is
    exactly its step's (no entry points outside its run) and has a sha256. A violation is one CheckpointError
    line naming the file and the field."""
    def bad(field: str, what: str, value: Any = None, show: bool = True) -> CheckpointError:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)  # shortened to 60 characters
        got = f", got {text if len(text) <= 60 else text[:57] + '...'}" if show else ""
        return CheckpointError(f"damaged run manifest {path}: field '{field}' {what}{got}")

    if not isinstance(manifest, dict):
        raise CheckpointError(f"damaged run manifest {path}: not a JSON object (got {type(manifest).__name__})")
    for key in ("format", "config", "seeds", "model_spec", "data_spec", "checkpoints"):
        if key not in manifest:
            raise bad(key, "is missing (the store writes it with every run)", show=False)
    deep = _deeper_field({k: v for k, v in manifest.items() if k != "checkpoints"})
    if deep is not None:
        raise bad(deep, f"nests deeper than {MAX_JSON_DEPTH} levels", show=False)
    if manifest["format"] != MANIFEST_FORMAT:
        raise bad("format", f"must be {MANIFEST_FORMAT!r}", manifest["format"])
    for key in ("name", "created", "code_version"):
        if key in manifest and not isinstance(manifest[key], str):
            raise bad(key, "must be a string", manifest[key])
    for key in ("config", "seeds", "model_spec", "data_spec"):
        if key in manifest and not isinstance(manifest[key], dict):
            raise bad(key, "must be an object", manifest[key])
    for key in ("model_spec", "data_spec"):
        if "name" in manifest[key] and not isinstance(manifest[key]["name"], str):
            raise bad(f"{key}.name", "must be a string", manifest[key]["name"])
    for key, value in (manifest.get("seeds") or {}).items():
        if not _is_int(value):
            raise bad(f"seeds.{key}", "must be an integer", value)
    if manifest.get("lineage") is not None and not isinstance(manifest["lineage"], dict):
        raise bad("lineage", "must be an object or null", manifest["lineage"])
    entries = manifest.get("checkpoints", [])
    if not isinstance(entries, list):
        raise bad("checkpoints", "must be a list", entries)
    seen: set[int] = set()
    for i, e in enumerate(entries):
        where = f"checkpoints[{i}]"
        if not isinstance(e, dict):
            raise bad(where, "must be an object", e)
        for key in ("step", "epoch", "file"):
            if key not in e:
                raise bad(f"{where}.{key}", "is missing", show=False)
        step = e["step"]
        if not _is_int(step) or step < 0:
            raise bad(f"{where}.step", "must be a non-negative integer", step)
        if step in seen:
            raise bad(f"{where}.step", "lists a step twice", step)
        seen.add(step)
        if not _is_number(e["epoch"]) or not math.isfinite(e["epoch"]):
            raise bad(f"{where}.epoch", "must be a finite number", e["epoch"])
        if e["file"] != f"step-{step:06d}.h5":
            raise bad(f"{where}.file", f"must be 'step-{step:06d}.h5' (the file of step {step})", e["file"])
        eps = e.get("epsilon")
        if eps is not None and not _is_number(eps) and eps not in _NON_FINITE:
            raise bad(f"{where}.epsilon", "must be a number or null", eps)
        metrics = e.get("metrics", {})
        if not isinstance(metrics, dict) or any(isinstance(v, (dict, list)) for v in metrics.values()):
            raise bad(f"{where}.metrics", "must be an object of numbers", metrics)
        if "sha256" not in e:
            raise bad(f"{where}.sha256", "is missing (an unhashed checkpoint cannot be verified)", show=False)
        sha = e["sha256"]
        if not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
            raise bad(f"{where}.sha256", "must be 64 hex digits", sha)
    schedule = manifest.get("schedule")
    if schedule is not None:
        if not isinstance(schedule, dict):
            raise bad("schedule", "must be an object", schedule)
        for key, low in (("steps_per_epoch", 1), ("total_steps", 0)):
            if key not in schedule:
                raise bad(f"schedule.{key}", "is missing", show=False)
            if not (_is_int(schedule[key]) and schedule[key] >= low):
                raise bad(f"schedule.{key}", f"must be an integer >= {low}", schedule[key])
        if "checkpoint_steps" not in schedule:
            raise bad("schedule.checkpoint_steps", "is missing", show=False)
        steps = schedule["checkpoint_steps"]
        if not isinstance(steps, list) or not all(_is_int(t) and t >= 0 for t in steps):
            raise bad("schedule.checkpoint_steps", "must be a list of non-negative integers", steps)
    privacy = manifest.get("privacy")
    if privacy is not None:
        if not isinstance(privacy, dict):
            raise bad("privacy", "must be an object", privacy)
        for key in ("noise_multiplier", "sample_rate", "delta", "total_delta"):
            if key in privacy and not _is_number(privacy[key]):
                raise bad(f"privacy.{key}", "must be a number", privacy[key])
        if "steps" in privacy and not _is_int(privacy["steps"]):
            raise bad("privacy.steps", "must be an integer", privacy["steps"])
        events = privacy.get("ancestor_events", [])
        if not isinstance(events, list):
            raise bad("privacy.ancestor_events", "must be a list", events)
        for i, ev in enumerate(events):
            if not (isinstance(ev, dict) and set(ev) == {"noise_multiplier", "sample_rate", "steps"}
                    and _is_number(ev["noise_multiplier"]) and _is_number(ev["sample_rate"])
                    and _is_int(ev["steps"])):
                raise bad(f"privacy.ancestor_events[{i}]", "must be {noise_multiplier, sample_rate, steps}", ev)
        for key in ("non_private_ancestors", "unknown_ancestors", "accounted"):
            if key in privacy and not isinstance(privacy[key], bool):
                raise bad(f"privacy.{key}", "must be true or false", privacy[key])
        if "note" in privacy and not isinstance(privacy["note"], str):
            raise bad("privacy.note", "must be a string", privacy["note"])
        declared = privacy.get("declared_ancestors", [])
        if not isinstance(declared, list):
            raise bad("privacy.declared_ancestors", "must be a list", declared)
        for i, d in enumerate(declared):
            if not (isinstance(d, dict) and set(d) == {"epsilon", "delta"} and _is_number(d["delta"])
                    and 0 <= d["delta"] < 1 and _is_number(d["epsilon"]) and 0 <= d["epsilon"] < math.inf):
                raise bad(f"privacy.declared_ancestors[{i}]", "must be {epsilon >= 0, delta in [0, 1)}", d)
    return manifest


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__
