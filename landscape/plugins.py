"""Code the user names (``package.module:attr``, ``path/to/file.py:attr``, an installed entry point): the one
place landscape imports code that is not its own. Only named code runs (nothing read from a store is handed to
``load`` by itself); ``describe`` records the sha256 of the source and of the local modules it imported, so a
later change is seen; failures are one ``PluginError`` line (docs/own-code.md).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from landscape.errors import LandscapeError, UsageError, one_line, param
from landscape.hashing import sha256_file


class PluginError(UsageError):
    """A code reference cannot be parsed, imported or resolved to the named object."""


@dataclass(frozen=True)
class CodeRef:
    """A parsed reference: ``kind`` is ``"file"`` (``target`` an absolute path) or ``"module"`` (a dotted name)."""

    text: str
    kind: str
    target: str
    attr: str


def is_code_ref(text: Any) -> bool:
    """Whether ``text`` has the form ``x:y`` of a code reference (built-in names such as ``lenet`` do not)."""
    if not isinstance(text, str) or ":" not in text:
        return False
    head, _, attr = text.rpartition(":")
    return bool(head) and bool(attr)


def short_name(text: Any) -> Any:
    """A code reference to a file shortened for tables (``/abs/dir/file.py:make`` -> ``file.py:make``)."""
    if not is_code_ref(text):
        return text
    head, _, attr = text.rpartition(":")
    if head.endswith(".py") or "/" in head or os.sep in head:
        return f"{Path(head).name}:{attr}"
    return text


def parse(text: str) -> CodeRef:
    """Parse ``module:attr`` or ``file.py:attr`` (the file relative to the current directory or absolute)."""
    if not isinstance(text, str) or not is_code_ref(text.strip()):
        raise PluginError(f"{text!r} is not a code reference; use package.module:name or path/to/file.py:name")
    head, _, attr = text.strip().rpartition(":")
    if not all(part.isidentifier() for part in attr.split(".")):
        raise PluginError(f"{text!r}: {attr!r} is not a Python name")
    if head.endswith(".py") or os.sep in head or "/" in head:
        path = Path(head).expanduser()
        if path.suffix != ".py":
            raise PluginError(f"{text!r}: a code file must end in .py")
        return CodeRef(text.strip(), "file", str(path.resolve()), attr)
    if not all(part.isidentifier() for part in head.split(".")):
        raise PluginError(f"{text!r}: {head!r} is neither a module name nor a .py file")
    return CodeRef(text.strip(), "module", head, attr)


# The local modules each user module imported when it was first loaded in this process: {target: (files)}.
_LOCAL: dict[str, tuple[str, ...]] = {}


def _not_user_code() -> tuple[Path, ...]:
    """Folders whose modules are never a user's local code (the interpreter's, site-packages, landscape's)."""
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).resolve().parent)}
    return tuple(Path(p).resolve() for p in paths if p)


def _local_files(main: Path, modules: list[Any]) -> tuple[str, ...]:
    """The source files of ``modules`` that are user code beside ``main`` or in the working directory."""
    roots = (main.parent, Path.cwd().resolve())
    excluded = _not_user_code()
    found = []
    for module in modules:
        origin = getattr(module, "__file__", None)
        if not origin or not str(origin).endswith(".py"):
            continue
        path = Path(origin).resolve()
        if path == main or not path.is_file() or "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        if any(path.is_relative_to(x) for x in excluded) or not any(path.is_relative_to(r) for r in roots):
            continue
        found.append(str(path))
    return tuple(sorted(set(found)))


def _imported(module: Any, before: set[str]) -> list[Any]:
    """The modules first imported while ``module`` ran (not in ``before``), and those its namespace names (a
    helper an earlier user module imported first)."""
    new = [m for name, m in list(sys.modules.items()) if name not in before and m is not module]
    named = [v if inspect.ismodule(v) else sys.modules.get(getattr(v, "__module__", "") or "")
             for v in vars(module).values() if inspect.ismodule(v) or hasattr(v, "__module__")]
    return [m for m in [*new, *named] if m is not None and m is not module]


def _module_of(ref: CodeRef):
    if ref.kind == "file":
        path = Path(ref.target)
        if not path.is_file():
            raise PluginError(f"{ref.text!r}: no such file {path}")
        digest = sha256_file(path)
        stem = "".join(c if c.isalnum() or c == "_" else "_" for c in path.stem)
        name = f"landscape_user_{stem}_{digest[:8]}"  # a valid module name: the prefix starts it
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise PluginError(f"{ref.text!r}: {path} cannot be loaded as Python code")
        module = importlib.util.module_from_spec(spec)
        folder = str(path.parent)
        before = set(sys.modules)
        sys.path.insert(0, folder)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:
            sys.modules.pop(name, None)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise _import_failed(ref, path.name, exc) from None
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
        _LOCAL[ref.target] = _local_files(path.resolve(), _imported(module, before))
        return module
    before = set(sys.modules)
    try:
        module = importlib.import_module(ref.target)
    except ModuleNotFoundError as exc:
        raise PluginError(f"{ref.text!r}: module {exc.name or ref.target!r} is not importable") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise _import_failed(ref, ref.target, exc) from None
    origin = getattr(module, "__file__", None)
    if ref.target not in _LOCAL and origin:
        _LOCAL[ref.target] = _local_files(Path(origin).resolve(), _imported(module, before))
    return module


def _import_failed(ref: CodeRef, what: str, exc: BaseException) -> PluginError:
    """The one line for user code that failed while imported, ``sys.exit()`` too (not the command's exit)."""
    if isinstance(exc, SystemExit):
        return PluginError(f"{ref.text!r}: {what} called sys.exit({exc.code!r}) while being imported; a model or "
                           f"data file defines its factory and returns (put script code under `if __name__ == "
                           f"'__main__':`)")
    verb = "running" if ref.kind == "file" else "importing"
    return PluginError(f"{ref.text!r}: {verb} {what} failed: {one_line(exc)}")


def _module_hashes(main: str | None, files: Any) -> dict[str, str | None]:
    """``{file: sha256 or None}`` of local modules, keyed relative to ``main``'s folder where they are under
    it (so code moved with its helpers is the same code)."""
    folder = Path(main).resolve().parent if main else None
    out: dict[str, str | None] = {}
    for f in files:
        path = Path(f) if folder is None else folder / f
        key = str(path.relative_to(folder)) if folder is not None and path.is_relative_to(folder) else str(path)
        out[key] = sha256_file(path) if path.is_file() else None
    return out


def load(text: str | CodeRef, *, callable_: bool = True) -> Any:
    """The named object of a reference the user named (its module imported, or its file executed)."""
    ref = text if isinstance(text, CodeRef) else parse(text)
    obj: Any = _module_of(ref)
    for part in ref.attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{ref.text!r}: {ref.target if ref.kind == 'module' else Path(ref.target).name} "
                              f"has no {ref.attr!r}") from None
    if callable_ and not callable(obj):
        raise PluginError(f"{ref.text!r}: {ref.attr!r} is a {type(obj).__name__}, not a callable")
    return obj


def describe(text: str | CodeRef) -> dict[str, Any]:
    """What a reference points at, for a stored spec: ``{"ref", "kind", "file" | "module", "attr", "sha256"}``
    (a module is imported to find its file: user-named code only)."""
    ref = text if isinstance(text, CodeRef) else parse(text)
    if ref.kind == "file":
        if not Path(ref.target).is_file():
            raise PluginError(f"{ref.text!r}: no such file {ref.target}")
        out = {"ref": ref.text, "kind": "file", "file": ref.target, "attr": ref.attr,
               "sha256": sha256_file(ref.target)}
    else:
        module = _module_of(ref)
        origin = getattr(module, "__file__", None)
        out = {"ref": ref.text, "kind": "module", "module": ref.target, "attr": ref.attr,
               "file": origin, "sha256": sha256_file(origin) if origin and Path(origin).is_file() else None}
    if _LOCAL.get(ref.target):  # imported in this process: the local modules it brought
        out["modules"] = _module_hashes(out.get("file"), _LOCAL[ref.target])
    return out


def check_unchanged(stored: dict[str, Any], current: dict[str, Any]) -> str | None:
    """None when the source and every local module ``stored`` records still have their hashes (nothing is
    imported), else a one-line reason naming the file that changed."""
    name = stored.get("ref") or current.get("ref")
    if stored.get("sha256") != current.get("sha256"):
        where = current.get("file") or current.get("module") or current.get("ref")
        return (f"the code of {name!r} changed since it was recorded "
                f"({where}: sha256 {str(stored.get('sha256'))[:12]} then, {str(current.get('sha256'))[:12]} now)")
    now = _module_hashes(current.get("file"), list(stored.get("modules") or {}))
    for key, then in (stored.get("modules") or {}).items():
        if now.get(key) != then:
            return (f"the code of {name!r} changed since it was recorded (its local module {key}: sha256 "
                    f"{str(then)[:12]} then, {'missing' if now.get(key) is None else now[key][:12]} now)")
    return None


def entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The installed entry points of ``group`` (e.g. ``landscape.models``), by name."""
    import importlib.metadata  # 40 ms: not for a command's --help

    return {ep.name: ep for ep in importlib.metadata.entry_points(group=group)}


def load_entry_point(group: str, name: str) -> tuple[Any, dict[str, Any]]:
    """The object an installed entry point names, and its provenance (package and version)."""
    found = entry_points(group)
    if name not in found:
        raise PluginError(f"no installed package provides {name!r} in {group}")
    ep = found[name]
    dist = getattr(ep, "dist", None)
    info = {"entry_point": name, "group": group, "value": ep.value,
            "package": dist.metadata["Name"] if dist is not None else None,
            "version": dist.version if dist is not None else None}
    try:
        return ep.load(), info
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # sys.exit() at import too: never the command's own exit
        raise PluginError(f"entry point {name!r} ({ep.value}) of {group} failed to load: {one_line(exc)}") from None


def checked_entry_point(group: str, name: str, recorded: dict | None, what: str) -> tuple[Any, dict]:
    """``load_entry_point`` for a stored spec: another package or version than ``recorded`` is a
    ``CodeChangedError`` unless changed code is accepted (then recorded as ``accepted_change_from``)."""
    factory, info = load_entry_point(group, name)
    then, now = (recorded or {}).get("version"), info.get("version")
    if recorded and (recorded.get("package"), then) != (info.get("package"), now):
        if not _TRUST.get().accept_changed:
            raise CodeChangedError(
                f"{what}: entry point from {recorded.get('package')} {then} when recorded, "
                f"{info.get('package')} {now} now; pass {param('accept_changed_code', True)} to use it")
        info = {**info, "accepted_change_from": then}
    return factory, info


# ------------------------------------------------------------------------------------------- trusted code
#
# Rebuilding a stored spec that names code runs it, so only when the user names the same code again in this
# context (``--code``, ``--model REF``, ``code=[...]``, :func:`trusting`); workers get the refs as strings.


@dataclass(frozen=True)
class TrustState:
    """The code references the user named (their text) and whether a changed source may be used anyway."""

    refs: tuple[str, ...] = ()
    accept_changed: bool = False


_NOTHING_TRUSTED = TrustState()
_TRUST: contextvars.ContextVar[TrustState] = contextvars.ContextVar("landscape_trusted_code",
                                                                    default=_NOTHING_TRUSTED)  # noqa: B039 (frozen)


class CodeChangedError(LandscapeError):
    """The source of stored code differs from what it was when the spec was recorded (exit 1)."""


def trust_state() -> TrustState:
    """The code the user named in this context (what a spawned worker must be given)."""
    return _TRUST.get()


def _checked(refs: Any) -> tuple[str, ...]:
    if refs is None:
        return ()
    return tuple(canonical(ref) for ref in ([refs] if isinstance(refs, (str, CodeRef)) else refs))


def trust(refs: Any = (), *, accept_changed: bool = False) -> None:
    """Let stored specs run ``refs`` for the rest of this context (``accept_changed``: also when their source
    changed since recorded)."""
    _TRUST.set(_with(_TRUST.get(), refs, accept_changed))


def _with(state: TrustState, refs: Any, accept_changed: bool) -> TrustState:
    return TrustState(tuple(dict.fromkeys(state.refs + _checked(refs))), state.accept_changed or bool(accept_changed))


@contextlib.contextmanager
def trusting(refs: Any = (), *, accept_changed: bool = False):
    """``trust`` for the block; a ``TrustState`` (from a parent process) is installed as it is."""
    if isinstance(refs, TrustState):
        token = _TRUST.set(_with(_NOTHING_TRUSTED, refs.refs, refs.accept_changed))
    else:
        token = _TRUST.set(_with(_TRUST.get(), refs, accept_changed))
    try:
        yield _TRUST.get()
    finally:
        _TRUST.reset(token)


def canonical(text: str | CodeRef) -> str:
    """``/absolute/file.py:attr`` or ``package.module:attr``: the form specs record and ``--code`` matches."""
    ref = text if isinstance(text, CodeRef) else parse(text)
    return f"{ref.target}:{ref.attr}"


def named_code(stored: dict[str, Any], what: str) -> CodeRef:
    """The reference the user named for the code ``stored`` records, else a ``PluginError`` saying which
    ``--code`` to pass. A named file of the same name elsewhere counts when it has the recorded sha256 (moved
    with the store) or, changed code accepted, when it is the only one. Nothing is imported to decide."""
    if not isinstance(stored, dict) or stored.get("kind") not in ("file", "module") or not stored.get("attr"):
        raise PluginError(f"{what} records malformed code provenance {stored!r}")
    target = stored.get("file") if stored["kind"] == "file" else stored.get("module")
    wanted = f"{target}:{stored['attr']}"
    state = _TRUST.get()
    for text in state.refs:
        if text == wanted:
            return parse(text)
    if stored["kind"] == "file":
        same_name = [ref for ref in map(parse, state.refs) if ref.kind == "file" and ref.attr == stored["attr"]
                     and Path(ref.target).name == Path(str(target)).name and Path(ref.target).is_file()]
        for ref in same_name:
            if stored.get("sha256") and sha256_file(ref.target) == stored["sha256"]:
                return ref
        if state.accept_changed and len(same_name) == 1:  # moved and changed: the user accepts changed code
            return same_name[0]
    raise PluginError(f"{what} is built by code {wanted!r}, which landscape runs only when you name it: pass "
                      f"{param('code', [wanted])}")


def checked_code(stored: dict[str, Any], what: str) -> tuple[CodeRef, dict[str, Any]]:
    """``named_code`` and its current ``describe``; changed source is a ``CodeChangedError`` unless accepted
    (then recorded as ``accepted_change_from``)."""
    ref = named_code(stored, what)
    current = describe(ref)
    if "modules" not in current and stored.get("modules"):  # not imported yet: the recorded helpers, hashed now
        current = {**current, "modules": _module_hashes(current.get("file"), list(stored["modules"]))}
    reason = check_unchanged(stored, current)
    if reason is not None:
        if not _TRUST.get().accept_changed:
            raise CodeChangedError(f"{what}: {reason}; pass {param('accept_changed_code', True)} to use it as it "
                                   "is now")
        current = {**current, "accepted_change_from": stored.get("sha256")}
    return ref, current


def code_refs(*names: Any) -> list[str]:
    """The code references among ``names`` (model / data names; built-in names and files are not code)."""
    return [n for n in names if is_code_ref(n)]
