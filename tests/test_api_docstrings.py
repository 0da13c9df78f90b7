"""The API reference (docs/api.md, rendered by mkdocstrings from docstrings) shows no raw Sphinx roles.

mkdocstrings reads Google-style Markdown docstrings: a Sphinx role such as ``:func:`name``` is printed as it is
(``:func:`` and all). Every docstring the page renders (its ``::: name`` entries, their ``members``, and the
public functions, classes, methods and properties of what they render) names code with plain backticks instead.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj|py:\w+):`")


def _resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)


def _docstrings(obj, name: str, seen: set[int], out: list[tuple[str, str]]) -> None:
    """``obj``'s docstring and those of the public members mkdocstrings renders with it."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    doc = obj.__doc__ if isinstance(obj, property) else inspect.getdoc(obj)
    if doc:
        out.append((name, doc))
    if inspect.ismodule(obj):
        members = [(k, v) for k, v in vars(obj).items() if getattr(v, "__module__", None) == obj.__name__
                   and (inspect.isclass(v) or inspect.isfunction(v))]
    elif inspect.isclass(obj):
        members = [(k, getattr(v, "__func__", v)) for k, v in vars(obj).items()
                   if inspect.isfunction(v) or isinstance(v, (property, staticmethod, classmethod))]
    else:
        members = []
    for key, value in members:
        if not key.startswith("_"):
            _docstrings(value, f"{name}.{key}", seen, out)


def rendered_docstrings() -> list[tuple[str, str]]:
    """(qualified name, docstring) of everything docs/api.md renders."""
    text = (REPO / "docs" / "api.md").read_text()
    out: list[tuple[str, str]] = []
    seen: set[int] = set()
    for path, options in re.findall(r"^::: (\S+)\n((?:    .*\n)*)", text, re.M):
        obj = _resolve(path)
        listed = re.search(r"members: \[([^\]]*)\]", options)
        if listed is None:
            _docstrings(obj, path, seen, out)
            continue
        if inspect.getdoc(obj):
            out.append((path, inspect.getdoc(obj)))
        for member in (m.strip() for m in listed.group(1).split(",")):
            _docstrings(getattr(obj, member), f"{path}.{member}", seen, out)
    return out


def test_the_api_page_renders_no_sphinx_role():
    docs = rendered_docstrings()
    names = {name for name, _ in docs}
    assert {"landscape.api.train", "landscape.api.interpolate", "landscape.recorder.Recorder.save",
            "landscape.plugins.trusting", "landscape.evaluate.Metric"} <= names  # what the page shows is read
    found = [f"{name}: ...{doc[max(0, m.start() - 30):m.end() + 30]}..." for name, doc in docs
             for m in ROLE.finditer(doc)]
    assert not found, "Sphinx roles mkdocstrings prints as they are (write ``name`` instead):\n" + "\n".join(found)


def test_the_check_finds_a_role():
    assert ROLE.search("see :func:`landscape.api.train`") and ROLE.search(":class:`~x.Y`")
    assert not ROLE.search("see ``landscape.api.train`` or [`train`][landscape.api.train]")
