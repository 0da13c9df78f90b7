"""Batch specs as YAML that knows its lines (errors name ``FILE:LINE``), read by the safe loader within stated
limits of nesting and of values once aliases and merge keys expand (a few lines cannot expand to billions)."""

from __future__ import annotations

from pathlib import Path

import yaml

from landscape.errors import UsageError

TOP_KEYS = ("root", "results", "defaults", "jobs")
MAX_NODES = 1_000_000  # values in the spec with its YAML aliases expanded
MAX_DEPTH = 50  # nesting of mappings and lists


class SpecError(UsageError):
    """An invalid batch spec: the message starts with ``FILE:LINE:`` and names the key at fault."""


class _Map(dict):
    """A YAML mapping that remembers the line (1-based) of itself and of each key."""

    line: int = 0
    lines: dict


class _LineLoader(yaml.SafeLoader):
    """The safe loader, with nesting bounded (a 100k-deep spec is one line, not a RecursionError)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise SpecError(f"{self.name}:{mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def flatten_mapping(self, node):
        """YAML merge keys (``<<: [*a, *a]``) copy the merged mappings' entries: counted first (each mapping once),
        so merges of merges cannot expand to billions of entries before anything notices."""
        if _merged_size(node, {}) > MAX_NODES:
            raise SpecError(f"{self.name}:{node.start_mark.line + 1}: merge keys (<<) expand this mapping to more "
                            f"than {MAX_NODES} entries")
        super().flatten_mapping(node)


def _merged_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many entries mapping ``node`` has once its merge keys are flattened (memoised per node)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 0  # a merge cycle counts as nothing (PyYAML refuses it)
    total = 0
    for key, value in node.value if isinstance(node, yaml.MappingNode) else ():
        if key.tag != "tag:yaml.org,2002:merge":
            total += 1
        elif isinstance(value, yaml.MappingNode):
            total += _merged_size(value, memo)
        elif isinstance(value, yaml.SequenceNode):
            total += sum(_merged_size(v, memo) for v in value.value)
        if total > MAX_NODES:
            break
    memo[id(node)] = total
    return total


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    out.line = node.start_mark.line + 1
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise SpecError(f"{loader.name}:{key_node.start_mark.line + 1}: keys must be strings, got {key!r}")
        if key in out:
            raise SpecError(f"{loader.name}:{key_node.start_mark.line + 1}: key '{key}' appears twice")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | Path) -> _Map:
    """The spec file as nested mappings that know their lines; a YAML error is one SpecError line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read batch spec {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise SpecError(f"{path}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") \
            from None
    loader = _LineLoader(text)
    loader.name = str(path)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise SpecError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    finally:
        loader.dispose()
    if not isinstance(data, _Map):
        raise SpecError(f"{path}:1: a batch spec is a mapping with 'jobs' (and optionally {', '.join(TOP_KEYS[:3])})")
    # an alias bomb (a few lines of ``&a [*b, *b, ...]``) expands to billions: count the values up to the limit
    count, stack = 0, [data]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise SpecError(f"{path}:1: the spec expands to more than {MAX_NODES} values (YAML aliases repeating "
                            f"aliases?); write it out or split it")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return data
