"""Two rules of docs/ARCHITECTURE.md, checked statically over landscape/ and cli/ with ``ast``:

- **Nothing splits on ``@``.** Checkpoint references are parsed in one place, ``landscape/refs.py``: no other
  module calls ``split`` / ``rsplit`` / ``partition`` / ``rpartition`` (or ``re.split``) with a separator
  containing ``@``.
- **Nothing branches on a kind's name.** Code reads what a kind does from its spec (``landscape.kinds``, the
  analysis registry), never compares a kind's or command's name with a literal name: no ``==`` / ``!=`` /
  ``in`` / ``not in`` / ``match`` of an expression naming a kind (``name``, ``kind``, ``command``,
  ``spec.name``, ``config.get("command")``, ...) against string literals that are all kind or command names
  (one, a tuple/list/set of them, or a module constant made of them; a dict is a table, such as
  ``COMMANDS``). :data:`KIND_NAME_EXCEPTIONS` lists the places ARCHITECTURE.md names as the exceptions, and
  nothing else.

Each checker is also run on a planted violation, so a checker that finds nothing cannot pass unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The one module that may split text on ``@`` (the reference parser).
REFERENCE_PARSER = "landscape/refs.py"

#: (file, function) -> why it may compare a kind's name with literal names (ARCHITECTURE.md's list).
KIND_NAME_EXCEPTIONS = {
    ("cli/main.py", "interrupted"): "RESUMED_BY_RERUN: the commands a rerun continues, for the Ctrl-C line",
    ("landscape/analyze/instability.py", "sibling_key"):
        "a run's recorded writer (prune, align) makes copies that were not trained from their parent",
}

_SPLITTERS = ("split", "rsplit", "partition", "rpartition")
# what an expression naming a kind or a command is called
_KIND_WORDS = ("name", "kind", "command", "cmd", "subcommand", "invoked_subcommand")


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for top in ("landscape", "cli")
            for p in sorted((ROOT / top).rglob("*.py"))}


def _kind_names() -> set[str]:
    from cli.main import COMMANDS
    from landscape import kinds

    return set(kinds.names()) | set(COMMANDS)


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    """Every node -> the name of the innermost function it is in ("" at module level)."""
    where: dict[ast.AST, str] = {}

    def visit(node: ast.AST, inside: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else inside
            where[child] = name
            visit(child, name)

    visit(tree, "")
    return where


def at_splits(source: str) -> list[int]:
    """Lines of ``source`` that split text on ``@``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        sep = node.args[0]  # the separator, or re.split's pattern
        if node.func.attr in _SPLITTERS and isinstance(sep, ast.Constant) and isinstance(sep.value, str) \
                and "@" in sep.value:
            lines.append(node.lineno)
    return lines


def _literals(node: ast.AST, constants: dict[str, set[str]]) -> set[str] | None:
    """The strings a literal side of a comparison holds (a string, a tuple/list/set of them, a module constant
    of those); None when the side is not such a literal. A dict is a table (a registry), not a branch."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return {e.value for e in node.elts}
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    return None


def _names_a_kind(node: ast.AST) -> bool:
    """Whether an expression is called like a kind or command name: ``name``, ``spec.name``, ``job.kind``,
    ``config.get("command")``, ``options["kind"]``, ``ctx.invoked_subcommand``."""
    if isinstance(node, ast.Name):
        word = node.id
    elif isinstance(node, ast.Attribute):
        word = node.attr
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and node.args and isinstance(node.args[0], ast.Constant):
        word = str(node.args[0].value)
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        word = str(node.slice.value)
    else:
        return False
    return word in _KIND_WORDS or word.endswith(("_kind", "_command", "_name"))


def kind_branches(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, function)`` of every comparison in ``source`` of a kind-like expression with literal kind
    names (``match`` cases included). A module's ``__getattr__`` / ``__dir__`` compare attribute names, not
    kinds."""
    tree = ast.parse(source)
    constants: dict[str, set[str]] = {}
    for stmt in tree.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else getattr(
            stmt, "target", None) if isinstance(stmt, ast.AnnAssign) else None
        value = _literals(stmt.value, {}) if isinstance(target, ast.Name) and stmt.value is not None else None
        if value:
            constants[target.id] = value
    where = _functions(tree)
    found = []
    for node in ast.walk(tree):
        if where.get(node) in ("__getattr__", "__dir__"):
            continue
        if isinstance(node, ast.Compare) and len(node.comparators) == 1:
            left, right = node.left, node.comparators[0]
            for subject, literal in ((left, right), (right, left)):
                held = _literals(literal, constants)
                if held and held <= names and _names_a_kind(subject):
                    found.append((node.lineno, where.get(node, "")))
                    break
        if isinstance(node, ast.Match) and _names_a_kind(node.subject):
            for case in node.cases:
                values = [p.value for p in ast.walk(case.pattern) if isinstance(p, ast.MatchValue)]
                if any((_literals(v, constants) or {""}) <= names for v in values):
                    found.append((case.pattern.lineno, where.get(node, "")))
    return found


def test_nothing_but_the_reference_parser_splits_on_at():
    offenders = [f"{path}:{line}" for path, text in _sources().items() if path != REFERENCE_PARSER
                 for line in at_splits(text)]
    assert offenders == [], f"split on '@' outside {REFERENCE_PARSER} (use landscape.refs): {offenders}"
    assert at_splits(_sources()[REFERENCE_PARSER]), "the reference parser itself is found"


def test_nothing_branches_on_a_kind_name():
    names = _kind_names()
    found = {(path, function): line for path, text in _sources().items()
             for line, function in kind_branches(text, names)}
    offenders = [f"{path}:{line} ({function})" for (path, function), line in found.items()
                 if (path, function) not in KIND_NAME_EXCEPTIONS]
    assert offenders == [], f"a kind's name compared with literal names (read the spec instead): {offenders}"
    assert set(KIND_NAME_EXCEPTIONS) <= set(found), "an exception that no longer exists leaves the list"


@pytest.mark.parametrize("planted", [
    "a, b = ref.split('@')", "a = ref.rsplit('@', 1)[0]", "a, _, b = ref.partition('@')",
    "ref.rpartition('@')", "import re\nparts = re.split('@', ref)",
])
def test_the_at_checker_finds_a_planted_split(planted):
    assert at_splits(planted) != []


def test_the_at_checker_lets_other_splits_be():
    assert at_splits("a = text.split(':')\nb = text.partition('=')\nc = '@' in text") == []


@pytest.mark.parametrize("planted", [
    "def f(spec):\n    if spec.name == 'directions':\n        pass",
    "def f(kind):\n    return kind in ('train', 'phases')",
    "def f(job):\n    return 'prune' != job.kind",
    "def f(config):\n    return config.get('command') == 'align'",
    "TRAINERS = ('train', 'phases')\ndef f(command):\n    return command in TRAINERS",
    "def f(name):\n    match name:\n        case 'surface':\n            pass",
])
def test_the_kind_checker_finds_a_planted_branch(planted):
    assert kind_branches(planted, _kind_names()) != []


def test_the_kind_checker_lets_other_comparisons_be():
    # a split called "train", a module's lazy attribute "train": not kinds
    source = ("def f(split, key):\n    return split == 'train' or key == 'phases'\n"
              "def __getattr__(name):\n    if name == 'train':\n        pass")
    assert kind_branches(source, _kind_names()) == []
