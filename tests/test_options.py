"""One coercion for the command line, the api and batch specs (landscape.options), one vocabulary of option names
with the old names kept for one release, and api functions with real signatures and docstrings."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
import warnings

import pytest
from click.testing import CliRunner

from cli.generate import command
from landscape.analyze import registry
from landscape.analyze.hessian import HessianConfig
from landscape.analyze.interpolate import InterpolateConfig
from landscape.analyze.ntk import NTKConfig
from landscape.errors import UsageError
from landscape.options import (
    OptionDeprecationWarning,
    OptionError,
    Options,
    build,
    coerce,
    from_params,
    hints,
    renames,
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
    values = [coerce(v, annotation, flag="--x") for v in (cli, yaml_value, python)]
    assert values == [expected] * 3
    assert all(type(v) is type(expected) for v in values)
    assert all(type(a) is type(b) for v in values if isinstance(v, tuple) for a, b in zip(v, expected, strict=True))


@pytest.mark.parametrize("value, annotation, meta, fragment", [
    ("x", int, {}, "--x must be an integer, got 'x'"),
    (2.5, int, {}, "--x must be an integer, got 2.5"),
    (True, int, {}, "--x must be an integer"),
    (1, int, {"min": 2}, "--x must be >= 2, got 1"),
    (0.0, float, {"min": 0, "min_open": True}, "--x must be > 0, got 0.0"),
    ("nan", float, {}, "--x must be a finite number"),
    (1e39, float, {}, "too large"),
    ("val", tuple[str, ...], {"choices": ("train", "test")}, "--x must be one of train, test, got 'val'"),
    ("train,train", tuple[str, ...], {"choices": ("train", "test")}, "--x repeats 'train'"),
    ("", tuple[str, ...], {}, "--x needs at least one value"),
    (-1, int, {}, None),  # counts: only the declared range
    (2**31, int, {}, "--x must be <= 2147483647"),
    ("gpu", str, {"kind": "device"}, "use auto, cpu, cuda or cuda:N"),
    (0, None, {"kind": "subset"}, "a count must be in [1, 2147483647], got 0"),
])
def test_a_refused_value_is_one_line_naming_the_flag(value, annotation, meta, fragment):
    if fragment is None:
        assert coerce(value, annotation, meta, flag="--x") == value
        return
    with pytest.raises(OptionError) as info:
        coerce(value, annotation, meta, flag="--x")
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert str(info.value) == f"{info.value.flag} {info.value.reason}"


def test_seeds_follow_one_rule_by_their_name():
    assert coerce("7", int, flag="--seed", name="seed") == 7
    for bad in (-1, 2**63, "x", 1.5):
        with pytest.raises(OptionError, match=r"--subset-seed must be an integer seed in \[0, 2\*\*63 - 1\]"):
            coerce(bad, int, flag="--subset-seed", name="subset_seed")


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
    from landscape.batch.checks import _check_type

    want = InterpolateConfig(points=5, split=("test",), chunk=64, subset=0.5)
    _, from_cli, _ = _cli_config(captured, "interpolate", "a", "b", "--points", "5", "--split", "test",
                                 "--chunk", "64", "--subset", "0.5")
    with pytest.raises(SystemExit):
        api.interpolate("a", "b", points=5, split="test", chunk=64, subset=0.5)
    _, _, kwargs = captured.pop()
    from_api = build(InterpolateConfig, {k: v for k, v in kwargs.items() if k in hints(InterpolateConfig)})
    types_ = kinds.get("interpolate").option_types()  # what a batch job's YAML values are checked against
    yaml_values = {"points": 5, "split": ["test"], "chunk": 64, "subset": 0.5}
    from_yaml = build(InterpolateConfig, {k: _check_type(v, types_[k], k) for k, v in yaml_values.items()})
    assert from_cli == from_api == from_yaml == want


# ------------------------------------------------------------------------------------- renamed options


RENAMED = {  # analysis -> {old option: new option}: the vocabulary's renames
    "interpolate": {"batch_size": "chunk", "splits": "split"},
    "instability": {"batch_size": "chunk", "splits": "split"},
    "calibration": {"batch_size": "chunk", "splits": "split"},
    "surface": {"batch_size": "chunk", "splits": "split"},
    "directions": {"batch_size": "chunk", "n": "directions"},
    "hessian": {"batch_size": "chunk", "n": "subset"},
    "ntk": {"n": "subset", "kind": "kernel"},
    "ntk-table": {"n": "subset", "kind": "kernel"},
    "norms": {"grad_samples": "subset"},
    "symmetry": {"batch_size": "subset"},
    "clipping": {},
}


@pytest.mark.parametrize("name", sorted(RENAMED))
def test_old_names_still_work_with_one_deprecation_line(name, captured):
    spec = registry.get(name)
    assert renames(spec.config) == RENAMED[name]
    args = {"pair": ["a", "b"], "pairs": [], "checkpoint": ["a"], "target": ["a"], "targets": ["a"]}[spec.inputs]
    for old, new in RENAMED[name].items():
        value = {"splits": "test", "batch_size": "40", "n": "12", "grad_samples": "12", "kind": "output"}[old]
        flag = "--" + old.replace("_", "-")
        cls, config, result = _cli_config(captured, name, *args, flag, value)
        assert getattr(config, new) == getattr(build(cls, {new: value}), new)
        lines = [ln for ln in result.output.splitlines() if ln.startswith("warning:")]
        assert lines == [f"warning: {flag} is deprecated and will be removed in the next release; use "
                         f"--{new.replace('_', '-')}"]
        with pytest.warns(OptionDeprecationWarning, match=f"option '{old}' is deprecated.*use '{new}'"):
            assert build(cls, {old: value}) == build(cls, {new: value})
        both = CliRunner().invoke(command(name), [*args, flag, value, "--" + new.replace("_", "-"), value],
                                  obj={"root": "unused"})
        assert isinstance(both.exception, UsageError) and "give --" in str(both.exception)


def test_old_names_read_back_from_result_files_silently():
    old = {"points": 5, "splits": ["test"], "batch_size": 64, "subset": None, "subset_seed": 0, "device": "cpu",
           "method": "auto", "bn_recalibrate": False, "metrics": [], "align": False, "gone": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert from_params(InterpolateConfig, old) == InterpolateConfig(points=5, split=("test",), chunk=64,
                                                                         device="cpu")
        assert from_params(NTKConfig, {"n": 16, "precision": "double"}) == NTKConfig(subset=16, precision="float64")


def test_old_precision_names_are_aliases(captured):
    with pytest.warns(OptionDeprecationWarning, match="--precision double is deprecated.*--precision float64"):
        assert NTKConfig(precision="double").precision == "float64"
    with pytest.warns(OptionDeprecationWarning):
        assert NTKConfig(precision="single").precision == "float32"
        assert HessianConfig(precision="double").precision == "float64"  # one vocabulary: float32 | float64
    _, config, result = _cli_config(captured, "ntk", "a", "--precision", "single")
    assert config.precision == "float32" and "warning: --precision single is deprecated" in result.output


def test_old_names_in_a_batch_spec_warn_once_per_place(tmp_path):
    from landscape.batch import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text("jobs:\n  i:\n    kind: interpolate\n    refs: [a, b]\n    grid: {points: [3, 4]}\n"
                    "    batch_size: 32\n    splits: test\n")
    with pytest.warns(OptionDeprecationWarning) as caught:
        with pytest.raises(UsageError, match="no run|not in the store|refs"):
            load_spec(spec)
    messages = [str(w.message) for w in caught]
    assert f"{spec}:6: jobs.i.batch_size: option 'batch_size' is deprecated and will be removed in the next " \
           "release; use 'chunk'" in messages
    assert sum("batch_size" in m for m in messages) == 1 and sum("'splits'" in m for m in messages) == 1


def test_privacy_accountant_was_method(capsys):
    from cli.main import main

    def run(*args):
        with pytest.raises(SystemExit) as info:
            main(["privacy", "--noise-multiplier", "1.1", "--batch-size", "256", "--dataset-size", "60000",
                  "--epochs", "3", "--json", *args])
        out, err = capsys.readouterr()
        return info.value.code, out, err

    code, new, err = run("--accountant", "pld")
    assert code in (0, None) and not err
    code, old, err = run("--method", "pld")
    assert code in (0, None) and json.loads(old) == json.loads(new)
    assert err.strip() == "warning: --method is deprecated and will be removed in the next release; use --accountant"


def test_align_run_name_was_dash_o(tmp_path, capsys):
    from cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["--root", str(tmp_path), "align", "a", "b", "-o", "x"])
    err = capsys.readouterr().err.splitlines()
    assert info.value.code == 1 and err[0] == ("warning: align -o is deprecated and will be removed in the next "
                                               "release; use --run")
    assert err[1].startswith("error: ") and len(err) == 2


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def test_train_chunk_was_microbatch_on_the_command_line(tmp_path, capsys):
    from cli.main import main
    from landscape.store import Store
    from landscape.train.config import TrainConfig, config_hash

    args = ["--root", str(tmp_path), "train", "--optimizer", "dpsgd", "--noise-multiplier", "1", "--subset", "0.05",
            "--epochs", "1", "--checkpoint-every", "none", "--json"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--run", "old", "--microbatch", "4"])
    assert info.value.code in (0, None)
    assert _warnings(capsys.readouterr().err) == [
        "warning: --microbatch is deprecated and will be removed in the next release; use --chunk"]
    manifest = Store(tmp_path).run("old").manifest
    assert manifest["config"]["chunk"] == 4 and "microbatch" not in manifest["config"]
    # a chunk never changes results: it is no part of the run's identity
    assert manifest["config_hash"] == config_hash({**manifest["config"], "chunk": None, "run": "other"})
    with pytest.raises(SystemExit) as info:
        main([*args, "--run", "both", "--microbatch", "4", "--chunk", "4"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--microbatch and --chunk are the same option" in err
    with pytest.raises(SystemExit) as info:
        main([*args, "--run", "zero", "--microbatch", "0"])
    assert info.value.code == 2 and "'--microbatch': must be >= 1, got 0" in capsys.readouterr().err
    assert TrainConfig.from_dict(manifest["config"]).chunk == 4


def test_phases_chunk_was_microbatch_on_the_command_line(monkeypatch, tmp_path):
    import landscape.api.training as training
    from cli.main import cli

    seen = {}
    monkeypatch.setattr(training, "phases", lambda config, **kw: seen.setdefault("config", config) and [])
    result = CliRunner().invoke(cli, ["--root", str(tmp_path), "phases", "--k", "1", "--epochs", "2",
                                      "--noise-multiplier", "1", "--microbatch", "3"])
    assert result.exit_code == 0, result.output
    assert seen["config"].base.chunk == 3
    assert _warnings(result.output) == [
        "warning: --microbatch is deprecated and will be removed in the next release; use --chunk"]


def test_train_config_takes_microbatch_as_a_keyword_with_one_warning():
    from landscape.train.config import TrainConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = TrainConfig(optimizer="dpsgd", noise_multiplier=1.0, microbatch=8)
    assert config == TrainConfig(optimizer="dpsgd", noise_multiplier=1.0, chunk=8)
    assert [str(w.message) for w in caught] == [
        "option 'microbatch' is deprecated and will be removed in the next release; use 'chunk'"]
    assert all(w.category is OptionDeprecationWarning for w in caught)
    with pytest.raises(UsageError, match="'microbatch' and 'chunk' are the same option"):
        TrainConfig(microbatch=8, chunk=8)
    with pytest.raises(UsageError, match="--chunk must be >= 1, got 0"):
        TrainConfig(chunk=0).validate()


def test_a_manifest_written_with_microbatch_loads_with_its_hash_unchanged():
    from landscape.train.config import TrainConfig, config_hash

    # the ``config`` of a manifest written before the rename, and its ``config_hash`` as that version computed it
    old = {"model": "lenet", "model_kwargs": {}, "data": "digits", "data_kwargs": {}, "subset": None, "data_seed": 0,
           "data_root": None, "download": False, "epochs": 2, "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0,
           "batch_size": 32, "seed": 0, "device": "auto", "checkpoint_every": "1e", "optimizer": "dpsgd",
           "max_grad_norm": 1.0, "noise_multiplier": 1.1, "target_epsilon": None, "delta": 1e-05,
           "accountant": "rdp", "clip_style": "flat", "clip_fn": "abadi", "sampling": None, "sparsify": 0.0,
           "smooth": 0.0, "microbatch": 8, "run": "old", "from_ref": None, "resume": None}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stored file is not the user's call: read silently
        config = TrainConfig.from_dict(old)
        assert config.chunk == 8
        assert config_hash(old) == config_hash(config) == "cba6568353c2553f"
    new = config.to_dict()
    assert "microbatch" not in new and new["chunk"] == 8 and config_hash(new) == "cba6568353c2553f"


def test_old_training_names_in_a_batch_spec_warn_once_per_place(tmp_path):
    from landscape.batch import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text("jobs:\n  t:\n    kind: train\n    run: x\n    optimizer: dpsgd\n    noise_multiplier: 1.0\n"
                    "    microbatch: 4\n  p:\n    kind: phases\n    group: g{seed}\n    k: 1\n    epochs: 2\n"
                    "    noise_multiplier: 1.0\n    grid: {seed: [0, 1]}\n    microbatch: 3\n")
    with pytest.warns(OptionDeprecationWarning) as caught:
        jobs = {job.id: job for job in load_spec(spec, root=tmp_path / "store").jobs}
    messages = [str(w.message) for w in caught]
    assert messages == [f"{spec}:7: jobs.t.microbatch: option 'microbatch' is deprecated and will be removed in "
                        "the next release; use 'chunk'",
                        f"{spec}:15: jobs.p.microbatch: option 'microbatch' is deprecated and will be removed in "
                        "the next release; use 'chunk'"]
    assert jobs["t"].options["chunk"] == 4 and "microbatch" not in jobs["t"].options
    assert {job.options["chunk"] for job in jobs.values() if job.kind == "phases"} == {3}


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


def test_landscape_batch_prints_the_deprecation_as_one_line(tmp_path, capsys, monkeypatch):
    from cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("jobs:\n  i:\n    kind: hessian\n    refs: [a]\n    n: 32\n")
    with pytest.raises(SystemExit):
        main(["batch", "s.yaml", "--dry-run"])
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("warning: s.yaml:5: jobs.i.n: option 'n' is deprecated and will be removed in the next "
                      "release; use 'subset'") and err[1].startswith("error: ") and len(err) == 2
