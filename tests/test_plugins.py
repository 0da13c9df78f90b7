"""landscape.plugins: parsing, loading and describing code the user names."""

from __future__ import annotations

import hashlib
import sys

import pytest

from landscape import plugins
from landscape.errors import UsageError


def _write(path, text):
    path.write_text(text)
    return path


def test_parse_forms(tmp_path):
    ref = plugins.parse("torch.nn:Linear")
    assert (ref.kind, ref.target, ref.attr) == ("module", "torch.nn", "Linear")
    f = _write(tmp_path / "net.py", "def make():\n    return 1\n")
    ref = plugins.parse(f"{f}:make")
    assert (ref.kind, ref.target, ref.attr) == ("file", str(f.resolve()), "make")
    assert not plugins.is_code_ref("lenet") and plugins.is_code_ref("a.b:c")


@pytest.mark.parametrize("bad", ["lenet", "a.b:", ":x", "a b:c", "net.txt/x:y", "mod:1x"])
def test_malformed_references_are_usage_errors(bad):
    with pytest.raises(plugins.PluginError) as info:
        plugins.parse(bad)
    assert isinstance(info.value, UsageError) and "\n" not in str(info.value)


def test_load_file_and_module(tmp_path):
    _write(tmp_path / "helper_mod.py", "VALUE = 41\n")
    f = _write(tmp_path / "net.py", "import helper_mod\ndef make():\n    return helper_mod.VALUE + 1\nNOT_CALLABLE = 3\n")
    assert plugins.load(f"{f}:make")() == 42
    assert str(tmp_path) not in sys.path  # the folder is on sys.path only while the file runs
    assert plugins.load("math:sqrt")(9.0) == 3.0
    assert plugins.load(f"{f}:NOT_CALLABLE", callable_=False) == 3


@pytest.mark.parametrize("ref, words", [
    ("no_such_module_xyz:f", "not importable"),
    ("math:no_such_attr", "has no"),
    ("math:pi", "not a callable"),
])
def test_load_errors_are_one_line(ref, words):
    with pytest.raises(plugins.PluginError, match=words) as info:
        plugins.load(ref)
    assert "\n" not in str(info.value)


def test_file_errors(tmp_path):
    with pytest.raises(plugins.PluginError, match="no such file"):
        plugins.load(f"{tmp_path / 'missing.py'}:f")
    bad = _write(tmp_path / "boom.py", "raise ZeroDivisionError('in the user file')\n")
    with pytest.raises(plugins.PluginError, match="ZeroDivisionError: in the user file"):
        plugins.load(f"{bad}:f")


def test_describe_hashes_the_source_and_detects_changes(tmp_path):
    f = _write(tmp_path / "net.py", "def make():\n    return 1\n")
    info = plugins.describe(f"{f}:make")
    assert info["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert plugins.check_unchanged(info, plugins.describe(f"{f}:make")) is None
    _write(f, "def make():\n    return 2\n")
    reason = plugins.check_unchanged(info, plugins.describe(f"{f}:make"))
    assert reason and "changed" in reason
    # a changed file is loaded as a new module, never the stale one
    assert plugins.load(f"{f}:make")() == 2
    mod = plugins.describe("landscape.plugins:load")
    assert mod["kind"] == "module" and mod["sha256"] == hashlib.sha256(
        open(plugins.__file__, "rb").read()).hexdigest()


def test_describe_does_not_run_a_file(tmp_path):
    marker = tmp_path / "ran"
    f = _write(tmp_path / "net.py", f"open({str(marker)!r}, 'w').close()\ndef make():\n    return 1\n")
    plugins.describe(f"{f}:make")
    assert not marker.exists()


def test_missing_entry_point():
    with pytest.raises(plugins.PluginError, match="no installed package"):
        plugins.load_entry_point("landscape.models", "no-such-model-xyz")
