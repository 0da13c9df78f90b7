"""One coercion for the command line, the api and batch specs (landscape.options), one vocabulary of option names,
and api functions with real signatures and docstrings."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest
from click.testing import CliRunner

from cli.generate import command
from landscape.analyze import registry
from landscape.analyze.specs import InterpolateConfig
from landscape.errors import OptionError, UsageError
from landscape.options import (
    Options,
    build,
    coerce,
    hints,
)

# ------------------------------------------------------------------------------------------------ coercion


@pytest.mark.parametrize("annotation, cli, yaml_value, python, expected", [
    (int, "12", 12, 12.0, 12),
    (float, "0.5", 0.5, 0.5, 0.5),
    (bool, "true", True, True, True),
    (tuple[str, ...], "train,test", ["train", "test"], ("train", "test"), ("train", "test")),
    (tuple[float, ...], "0.1, 1e2", [0.1, 100], (0.1, 100.0), (0.1, 100.0)),
    (int | float | None, "0.3", 0.3, 0.3, 0.3),
    ("tuple[str, ...] | None", "a.*", ["a.*"], ("a.*",), ("a.*",)),
])
def test_the_three_sources_coerce_to_the_same_value(annotation, cli, yaml_value, python, expected):
    values = [coerce(v, annotation, name="x") for v in (cli, yaml_value, python)]
    assert values == [expected] * 3
    assert all(type(v) is type(expected) for v in values)
    assert all(type(a) is type(b) for v in values if isinstance(v, tuple) for a, b in zip(v, expected, strict=True))


@pytest.mark.parametrize("value, annotation, meta, fragment", [
    ("x", int, {}, "x must be an integer, got 'x'"),
    (2.5, int, {}, "x must be an integer, got 2.5"),
    (True, int, {}, "x must be an integer"),
    (1, int, {"min": 2}, "x must be >= 2, got 1"),
    (0.0, float, {"min": 0, "min_open": True}, "x must be > 0, got 0.0"),
    ("nan", float, {}, "x must be a finite number"),
    (1e39, float, {}, "too large"),
    ("val", tuple[str, ...], {"choices": ("train", "test")}, "x must be one of train, test, got 'val'"),
    ("train,train", tuple[str, ...], {"choices": ("train", "test")}, "x repeats 'train'"),
    ("", tuple[str, ...], {}, "x needs at least one value"),
    (-1, int, {}, None),  # counts: only the declared range
    (2**31, int, {}, "x must be <= 2147483647"),
    ("gpu", str, {"kind": "device"}, "x must be auto, cpu, cuda or cuda:N"),
    (0, None, {"kind": "subset"}, "x must be a count in [1, 2147483647], got 0"),
])
def test_a_refused_value_is_one_line_naming_the_parameter(value, annotation, meta, fragment):
    if fragment is None:
        assert coerce(value, annotation, meta, name="x") == value
        return
    with pytest.raises(OptionError) as info:
        coerce(value, annotation, meta, name="x")
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert str(info.value) == f"{info.value.name} {info.value.reason}"


def test_seeds_follow_one_rule_by_their_name():
    assert coerce("7", int, name="seed") == 7
    for bad in (-1, 2**63, "x", 1.5):
        with pytest.raises(OptionError, match=r"^subset_seed must be an integer seed in \[0, 2\*\*63 - 1\]"):
            coerce(bad, int, name="subset_seed")


def test_configs_are_frozen_coerced_and_validated_once(monkeypatch):
    config = InterpolateConfig(points="5", split="test", chunk=64.0)
    assert (config.points, config.split, config.chunk) == (5, ("test",), 64) and type(config.chunk) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.points = 3
    assert build(InterpolateConfig, {}, base=config) is config  # nothing to replace: not rebuilt, not revalidated
    calls = []
    original = InterpolateConfig.validate
    monkeypatch.setattr(InterpolateConfig, "validate", lambda self: calls.append(1) or original(self))
    build(InterpolateConfig, {"points": 7}, base=config)
    assert calls == [1]
    with pytest.raises(UsageError, match="unknown option"):
        build(InterpolateConfig, {"pionts": 7})
    for name in registry.names():  # every analysis' config and run options take part
        spec = registry.get(name)
        for cls in (spec.config, spec.run_options):
            if cls is not None:
                assert issubclass(cls, Options) and cls.__dataclass_params__.frozen, cls


# ------------------------------------------------------------------------------- one call, three sources


@pytest.fixture
def captured(monkeypatch):
    """Calls of the runner's run(): what the command line and the api would run, without running it."""
    calls = []

    def fake_run(name, refs, **kwargs):
        calls.append((name, refs, kwargs))
        raise SystemExit(0)

    monkeypatch.setattr("landscape.api.runner.run", fake_run)
    return calls


def _cli_config(captured, *args):
    result = CliRunner().invoke(command(args[0]), list(args[1:]), obj={"root": "unused"})
    assert result.exit_code == 0, result.output
    name, _, kwargs = captured.pop()
    return registry.get(name).config, kwargs["config"], result


def test_command_line_api_and_batch_spec_build_the_same_config(captured, tmp_path):
    from landscape import api, kinds
    from landscape.options import coerce

    want = InterpolateConfig(points=5, split=("test",), chunk=64, subset=0.5)
    _, from_cli, _ = _cli_config(captured, "interpolate", "a", "b", "--points", "5", "--split", "test",
                                 "--chunk", "64", "--subset", "0.5")
    with pytest.raises(SystemExit):
        api.interpolate("a", "b", points=5, split="test", chunk=64, subset=0.5)
    _, _, kwargs = captured.pop()
    from_api = build(InterpolateConfig, {k: v for k, v in kwargs.items() if k in hints(InterpolateConfig)})
    types_ = kinds.get("interpolate").option_types()  # what a batch job's YAML values are checked against
    yaml_values = {"points": 5, "split": ["test"], "chunk": 64, "subset": 0.5}
    from_yaml = build(InterpolateConfig, {k: coerce(v, types_[k], name=k) for k, v in yaml_values.items()})
    assert from_cli == from_api == from_yaml == want


# ------------------------------------------------------------------------------------------ chunk


def test_train_chunk_is_no_part_of_the_run_identity(tmp_path, capsys):
    from cli.main import main
    from landscape.store import Store
    from landscape.train.config import TrainConfig, config_hash

    args = ["--root", str(tmp_path), "train", "--optimizer", "dpsgd", "--noise-multiplier", "1", "--subset", "0.05",
            "--epochs", "1", "--checkpoint-every", "none", "--json"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--run", "c", "--chunk", "4"])
    assert info.value.code in (0, None)
    manifest = Store(tmp_path).run("c").manifest
    assert manifest["config"]["chunk"] == 4
    # a chunk never changes results: it is no part of the run's identity
    assert manifest["config_hash"] == config_hash({**manifest["config"], "chunk": None, "run": "other"})
    assert TrainConfig.from_dict(manifest["config"]).chunk == 4
    with pytest.raises(SystemExit) as info:
        main([*args, "--run", "zero", "--chunk", "0"])
    assert info.value.code == 2 and "'--chunk': must be >= 1, got 0" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- api signatures


@pytest.mark.parametrize("name", registry.names())
def test_api_functions_have_real_signatures_and_document_every_option(name):
    from landscape import api

    spec = registry.get(name)
    function = getattr(api, name.replace("-", "_"))
    params = inspect.signature(function).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    doc = inspect.getdoc(function)
    types_ = typing.get_type_hints(spec.config)
    for cls in (spec.config, spec.run_options):
        for f in dataclasses.fields(cls) if cls is not None else ():
            p = params[f.name]
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default == default, f.name
            if cls is spec.config:
                assert p.annotation == types_[f.name], f.name
            assert f"    {f.name} (" in doc, f.name
            help_text = " ".join(f.metadata.get("help", "").split())
            assert help_text[:40] in " ".join(doc.split()), f.name
    for runner in ("root", "output", "figure", "code"):
        assert params[runner].kind is inspect.Parameter.KEYWORD_ONLY and f"    {runner} (" in doc
    assert "Returns:" in doc and spec.result.__name__ in doc


def test_an_unknown_keyword_is_one_usage_line():
    from landscape import api

    with pytest.raises(UsageError, match="interpolate\\(\\): got an unexpected keyword argument 'pionts'"):
        api.interpolate("a", "b", pionts=3)
