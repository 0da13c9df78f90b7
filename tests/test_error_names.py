"""Errors name what the caller used: the parameter from Python (and batch specs), the flag on the command line.

Every option of every command is given a value its declaration refuses, once through the Python configuration and
once through ``landscape``; then the checks that span options (``validate()``) and the api functions' own
parameters (device, threads, scheduler, workers, pairs) are given bad values both ways. A static check keeps
literal flags out of the library's messages (they name parameters with :func:`landscape.errors.param`).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import click
import pytest
from conftest import run_cli

from landscape import kinds
from landscape.bounds import COUNT_MAX, is_seed
from landscape.errors import LandscapeError, OptionError, UsageError, param, render
from landscape.options import Options, build, coerce_field, flag_of, hints, split_optional

FLAG = re.compile(r"(?<![\w`-])--[a-z]")
ROOT = Path(__file__).resolve().parents[1]


def python_names_only(message: str, *names: str) -> None:
    assert not FLAG.search(message), message
    assert "\x00" not in message and "\x01" not in message, repr(message)
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?!\w)", message), (name, message)


def flags_only(err: str, *flags: str, code: int, expected: int = 2) -> None:
    line = err.strip()
    assert code == expected and line.startswith("error: ") and "\n" not in line, (code, err)
    assert "\x00" not in line and "\x01" not in line, repr(line)
    for flag in flags:
        assert flag in line, (flag, line)
        name = flag.lstrip("-").replace("-", "_")
        if "_" in name:  # a Python name the flag spells otherwise
            assert not re.search(rf"(?<![\w-]){name}\b", line), (name, line)


# ------------------------------------------------------------------------------------------- one option


def _refused(cls: type, f: dataclasses.Field):
    """A value field ``f``'s declaration refuses, or None where it declares no bound or choice to break."""
    meta = f.metadata
    if meta.get("kind") not in (None, "subset"):
        return None
    members, _ = split_optional(hints(cls)[f.name])
    base = members[0] if len(members) == 1 else None
    if meta.get("choices") and base is str:
        return "bogus"
    if meta.get("kind") == "subset" or (base is int and is_seed(f.name)):
        return -1
    if base in (int, float) and meta.get("min") is not None:
        low = meta["min"]
        return low if meta.get("min_open") else low - 1
    if base is int:
        return COUNT_MAX + 1
    return None


def _cases():
    for name in kinds.names():
        seen = set()
        for cls, f in kinds.get(name).option_fields():
            if f.metadata.get("cli", False) and f.name not in seen and _refused(cls, f) is not None:
                seen.add(f.name)
                yield pytest.param(name, cls, f, id=f"{name}-{f.name}")


@pytest.mark.parametrize("name, cls, f", list(_cases()))
def test_a_refused_option_names_the_parameter_or_the_flag(tmp_path, capsys, name, cls, f):
    bad = _refused(cls, f)
    with pytest.raises(UsageError) as info:
        try:
            config = build(cls, {f.name: bad})
        except TypeError:  # a configuration with required fields (references): its field alone
            coerce_field(cls, f, bad)
        else:
            if not isinstance(config, Options):
                config.validate()
    python_names_only(str(info.value), f.name)

    from cli.main import cli

    command = cli.get_command(click.Context(cli), name)
    arguments = ["x" for p in command.params if isinstance(p, click.Argument)]
    code, _, err = run_cli("--root", tmp_path, name, *arguments, f"{flag_of(f)}={bad}", capsys=capsys)
    flags_only(err, flag_of(f), code=code)


# ------------------------------------------------------------------------------------------- across options


def _config_errors():
    from landscape.analyze.specs import HessianConfig, SurfaceConfig
    from landscape.api.accounting import PrivacyQuery
    from landscape.api.execution import ExecutionOptions
    from landscape.train.config import TrainConfig

    return [
        (lambda: HessianConfig(top_k=20, lanczos_steps=5), ("lanczos_steps", "top_k"),
         ["hessian", "x", "--top-k", "20", "--lanczos-steps", "5"], ("--lanczos-steps", "--top-k")),
        (lambda: SurfaceConfig(grid="1x1"), ("grid",), ["surface", "x", "--grid", "1x1"], ("--grid",)),
        (lambda: TrainConfig(optimizer="sgd", noise_multiplier=1.0).validate(), ("noise_multiplier", "optimizer"),
         ["train", "--optimizer", "sgd", "--noise-multiplier", "1"], ("--noise-multiplier", "--optimizer")),
        (lambda: TrainConfig(optimizer="dpsgd").validate(), ("optimizer='dpsgd'", "noise_multiplier"),
         ["train", "--optimizer", "dpsgd"], ("--optimizer dpsgd", "--noise-multiplier", "--target-epsilon")),
        (lambda: TrainConfig(checkpoint_every="5x").validate(), ("checkpoint_every",),
         ["train", "--checkpoint-every", "5x"], ("--checkpoint-every",)),
        (lambda: TrainConfig(data_kwargs={"subset": 3}).validate(), ("data_kwargs", "subset"),
         ["train", "--data-kwargs", '{"subset": 3}'], ("--data-kwargs", "--subset")),
        (lambda: PrivacyQuery(noise_multiplier=1.0).schedule(), ("sample_rate", "batch_size", "dataset_size"),
         ["privacy", "--noise-multiplier", "1"], ("--sample-rate", "--batch-size", "--dataset-size")),
        (lambda: ExecutionOptions(2, "tcp://127.0.0.1:1"), ("workers", "scheduler"),
         ["surface", "x", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], ("--workers", "--scheduler")),
    ]


@pytest.mark.parametrize("case", range(8))
def test_a_check_across_options_names_parameters_or_flags(tmp_path, capsys, case):
    python, names, args, flags = _config_errors()[case]
    with pytest.raises(UsageError) as info:
        python()
    python_names_only(str(info.value), *names)
    code, _, err = run_cli("--root", tmp_path, *args, capsys=capsys)
    flags_only(err, *flags, code=code)


def test_api_parameters_that_are_no_config_field(tmp_path, capsys):
    from landscape import api
    from landscape.api.execution import scheduler_address
    from landscape.runtime import check_device_name, set_threads

    for call, names in ((lambda: set_threads(0), ("threads",)), (lambda: check_device_name("gpu"), ("device",)),
                        (lambda: scheduler_address("foo"), ("scheduler",)),
                        (lambda: api.directions("x", distance="auto", root=tmp_path), ("distance='auto'", "toward")),
                        (lambda: api.instability("x", pairs="bogus", root=tmp_path), ("pairs",))):
        with pytest.raises(UsageError) as info:
            call()
        python_names_only(str(info.value), *names)
    for args, flags in ((["--threads", "0", "store", "ls"], ("--threads",)),
                        (["interpolate", "a", "b", "--device", "gpu"], ("--device",)),
                        (["surface", "x", "--scheduler", "foo"], ("--scheduler",)),
                        (["directions", "x", "--distance", "auto"], ("--distance auto", "--toward")),
                        (["instability", "x", "--pairs", "bogus"], ("--pairs",))):
        code, _, err = run_cli("--root", tmp_path, *args, capsys=capsys)
        flags_only(err, *flags, code=code)


def test_a_batch_spec_names_its_keys(tmp_path):
    from landscape.batch import SpecError, load_spec

    spec = tmp_path / "s.yaml"
    spec.write_text(f"root: {tmp_path}\njobs:\n  h:\n    kind: hessian\n    ref: x\n    top_k: 20\n"
                    "    lanczos_steps: 5\n")
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    python_names_only(str(info.value), "lanczos_steps", "top_k")


# ------------------------------------------------------------------------------------------- the mechanism


def test_param_renders_both_ways_and_survives_pickling():
    import pickle

    group = '{"norm": "group"}'
    exc = UsageError(f"{param('optimizer', 'clip-only')} adds no noise; drop {param('noise_multiplier')} "
                     f"({param('download', True)}, {param('model_kwargs', group)})")
    assert str(exc) == ("optimizer='clip-only' adds no noise; drop noise_multiplier (download=True, "
                        "model_kwargs='{\"norm\": \"group\"}')")
    cli = render(exc.message, lambda name: "--" + name.replace("_", "-"))
    assert cli == "--optimizer clip-only adds no noise; drop --noise-multiplier (--download, --model-kwargs " \
                  "'{\"norm\": \"group\"}')"
    again = pickle.loads(pickle.dumps(exc))
    assert again.message == exc.message and str(again) == str(exc)
    option = pickle.loads(pickle.dumps(OptionError("points", "must be >= 2, got 1")))
    assert (str(option), option.name, option.reason) == ("points must be >= 2, got 1", "points", "must be >= 2, got 1")


def _literal_flags(node: ast.AST) -> list[str]:
    texts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    # a command shown in backquotes (`landscape figures --list`) is a command, not a parameter
    return [t for t in texts if FLAG.search(re.sub(r"`[^`]*`", "", t))]


def test_library_messages_write_no_flags():
    """Errors and warnings of the library name parameters with ``param`` (rendered per caller), never ``--flag``."""
    found = []
    for path in sorted((ROOT / "landscape").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            call = node.exc if isinstance(node, ast.Raise) else node
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if isinstance(node, ast.Raise) or name in ("warn", "OptionError") or name.endswith("Error"):
                found += [f"{path.relative_to(ROOT)}:{call.lineno}: {t!r}" for t in _literal_flags(call)]
    assert not found, "\n".join(sorted(set(found)))


def test_a_landscape_error_without_parameters_is_its_text():
    assert str(LandscapeError("plain words")) == "plain words"
