"""The import structure of landscape and cli: no import cycle, no upward import (docs/ARCHITECTURE.md, "Layers").

Imports are read statically with ``ast`` (nothing is imported, so this needs no torch). The rule:

- **Edges.** Every ``import`` / ``from ... import`` of a landscape or cli module is an edge, at module level or
  inside a function alike (a function-level import runs as soon as the function does). ``from P import name``
  is an edge to the module ``P.name`` when that is a module, else to ``P``. Not edges: imports under
  ``if TYPE_CHECKING:`` (never executed) and the lazy re-exports inside a package ``__init__``'s module-level
  ``__getattr__`` and ``__dir__`` (PEP 562: a facade such as ``landscape.Recorder`` or ``landscape.api.interpolate``, which runs
  only when a user asks the package for that name, never when one of the package's own modules is imported).
- **Layers.** Every module belongs to exactly one layer of :data:`LAYERS` (its longest matching prefix). A
  module may import its own layer and the layers below it, never a layer above. A string constant naming a
  module (``"landscape.plots.hessian:figure"``, ``"landscape.analyze.calibration"``: the way a spec or a table
  names code to import later) counts as an edge for this rule too, so a hook given as a string may not point
  upward either (:data:`NOT_REFERENCES` lists the few such strings that are not references, and why).
- **Cycles.** No cycle among modules, and none among the units of :data:`LAYERS` (its entries: packages such as
  ``landscape.api``, modules such as ``landscape.store``; the string references do not count here: they are
  imported only when called).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Lowest first. A module may import its own layer and those below, never one above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("landscape", "landscape.errors", "landscape.runtime", "landscape.atomic", "landscape.bounds",
                     "landscape.options", "landscape.plugins", "landscape.verdict", "landscape.refs",
                     "landscape.privacy", "landscape.progress")),
    ("data and models", ("landscape.data", "landscape.models", "landscape.params", "landscape.directions")),
    ("numerics", ("landscape.persample", "landscape.gram", "landscape.curvature", "landscape.spectral",
                  "landscape.evaluate", "landscape.pooling", "landscape.clip")),
    ("store and results", ("landscape.store", "landscape.results", "landscape.gram_hdf5")),
    ("training", ("landscape.train", "landscape.recorder", "landscape.integrations")),
    # user metrics: references -> evaluator Metrics for the analyses (built-in ``ece`` is the calibration analysis')
    ("analyses", ("landscape.analyze", "landscape.plots", "landscape.metrics")),
    ("api", ("landscape.api",)),
    ("applications", ("landscape.figures", "landscape.batch", "landscape.kinds")),
    ("command line", ("cli", "landscape.__main__")),
)

_MODULE_STRING = re.compile(r"^((?:landscape|cli)(?:\.\w+)+)(?::[\w.]+)?$")

#: Whole-string constants that look like a module name but are not a reference to import: (module, string) -> why.
NOT_REFERENCES = {
    ("landscape.plugins", "landscape.models"): "an entry-point group name",
    ("landscape.plugins", "landscape.metrics"): "an entry-point group name",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for top in ("landscape", "cli"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def layer_of(module: str) -> int:
    best, found = -1, None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), rank
    if found is None:
        raise LookupError(f"{module} is in no layer: add it to LAYERS (tests/test_layering.py) and docs/ARCHITECTURE.md")
    return found


def _unit(module: str) -> str:
    """The unit an edge between units is counted for: the entry of :data:`LAYERS` the module falls under (a
    package such as ``landscape.api``, a module such as ``landscape.store``, or ``landscape.train.accounting``,
    listed apart from the rest of ``landscape.train``)."""
    prefixes = [p for _, group in LAYERS for p in group if module == p or module.startswith(p + ".")]
    return max(prefixes, key=len)


def _known(name: str) -> str | None:
    while name and name not in MODULES:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def _skipped_nodes(tree: ast.Module, path: Path) -> set[int]:
    """Nodes whose imports are not edges: ``if TYPE_CHECKING:`` blocks, and a package ``__init__``'s ``__getattr__``
    and ``__dir__`` (PEP 562's two hooks of a lazy facade)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    if path.name == "__init__.py":
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__"):
                skipped |= {id(n) for n in ast.walk(node)}
    return skipped


def _edges() -> tuple[dict[str, set[tuple[str, int]]], dict[str, set[tuple[str, int]]]]:
    """module -> {(imported module, line)} and module -> {(module named in a string, line)}."""
    imports: dict[str, set[tuple[str, int]]] = {m: set() for m in MODULES}
    strings: dict[str, set[tuple[str, int]]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _skipped_nodes(tree, path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in MODULES else source)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                match = _MODULE_STRING.match(node.value)
                if match and _known(match.group(1)) is not None and (module, node.value) not in NOT_REFERENCES:
                    strings[module].add((_known(match.group(1)), node.lineno))
                continue
            for target in targets:
                known = _known(target)
                if known is not None and known != module:
                    imports[module].add((known, node.lineno))
    return imports, strings


IMPORTS, STRINGS = _edges()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_layer():
    missing = []
    for module in MODULES:
        try:
            layer_of(module)
        except LookupError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)


def _upward(imports: dict[str, set[tuple[str, int]]], strings: dict[str, set[tuple[str, int]]]) -> list[str]:
    upward = []
    for module in sorted(imports):
        here = layer_of(module)
        for kind, edges in (("imports", imports[module]), ("names in a string", strings.get(module, set()))):
            for target, line in sorted(edges):
                there = layer_of(target)
                if there > here:
                    upward.append(f"{module}:{line} ({LAYERS[here][0]}) {kind} {target} ({LAYERS[there][0]})")
    return upward


def test_no_upward_import():
    """Imports (module or function level) and module strings go to the same layer or below."""
    upward = _upward(IMPORTS, STRINGS)
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycle_between_modules():
    graph = {m: {t for t, _ in edges} for m, edges in IMPORTS.items()}
    assert _cycles(graph) == []


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for module, edges in IMPORTS.items():
        graph.setdefault(_unit(module), set()).update(_unit(t) for t, _ in edges if _unit(t) != _unit(module))
    assert _cycles(graph) == []


# ------------------------------------------------------------------------------------- the checker itself


def test_the_checker_sees_function_level_imports_and_strings_and_cycles():
    """The rule's edge cases, on modules we know: a function-level import, a spec's module string, the facade
    exemption, TYPE_CHECKING, and that a planted cycle / upward edge would be reported."""
    assert not any(t == "landscape.recorder" for t, _ in IMPORTS["landscape"])  # __getattr__ facade: no edge
    assert any(t == "landscape.train.loop" for t, _ in IMPORTS["landscape.api.pruning"])  # function-level import
    assert any(t.startswith("landscape.plots.") for t, _ in STRINGS["landscape.analyze.specs"])
    assert not any(t == "landscape.train.loop" for t, _ in IMPORTS["landscape.train.callbacks"])  # TYPE_CHECKING
    assert any(t == "landscape.analyze.calibration" for t, _ in STRINGS["landscape.metrics"])  # built-in ece
    planted = {"landscape.store": {("landscape.api.runner", 1)}, "landscape.api.runner": {("landscape.store", 2)}}
    assert _upward(planted, {}) == ["landscape.store:1 (store and results) imports landscape.api.runner (api)"]
    assert _upward({"landscape.results": set()}, {"landscape.results": {("landscape.train.loop", 3)}}) == [
        "landscape.results:3 (store and results) names in a string landscape.train.loop (training)"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert layer_of("landscape.store") < layer_of("landscape.train.loop") < layer_of("landscape.api.runner")
    assert layer_of("landscape.privacy") < layer_of("landscape.store") < layer_of("landscape.train.accounting")
    with pytest.raises(LookupError, match="in no layer"):
        layer_of("somewhere.else")


def test_the_layer_order_is_the_documented_one():
    """docs/ARCHITECTURE.md states the same order as LAYERS (its section "Layers")."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    positions = [section.find(f"**{name}**") for name, _ in LAYERS]
    assert -1 not in positions, [name for (name, _), p in zip(LAYERS, positions, strict=True) if p == -1]
    assert positions == sorted(positions)
