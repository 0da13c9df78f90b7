"""The job-kind registry (landscape.kinds): every command, api function and batch kind comes from one spec.

``tests/toy_kind.py`` is docs/ARCHITECTURE.md's recipe "How to add a job kind" followed as written; registered
with its one line it runs from the command line, the api and a batch spec (where a job reading its run waits
for it), and appears in ``landscape --help``.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

import cli.main
from landscape import kinds
from landscape.api.training import TrainConfig
from landscape.batch import load_spec, run_batch
from landscape.store import Store

BUILT_IN = ["train", "phases", "prune", "align", "figures", "import"]


@pytest.fixture
def toy(monkeypatch):
    """The recipe's one registry line (undone after the test)."""
    monkeypatch.setattr(kinds, "_LINES", dict(kinds._LINES))
    kinds.register("toy-scale", "toy_kind:JOB", "Scale a checkpoint's weights into a new run.")  # the recipe's line
    yield
    import landscape.api as api

    api.__dict__.pop("toy_scale", None)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from landscape.api import train

    root = tmp_path_factory.mktemp("kinds") / "ck"
    train(TrainConfig(model="lenet", data="digits", subset=100, epochs=1, batch_size=50, run="a"), root=root,
          progress=False)
    return Store(root)


def _weights(store: Store, ref: str) -> dict[str, torch.Tensor]:
    return store.load(ref).state_dict


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main.main(list(args))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_the_toy_kind_is_the_recipe_as_written():
    """tests/toy_kind.py is docs/ARCHITECTURE.md's code line for line (its docstring and the name aside)."""
    root = Path(__file__).resolve().parents[1]
    section = (root / "docs" / "ARCHITECTURE.md").read_text().split("## How to add a job kind", 1)[1]
    block = textwrap.dedent(section.split("```python\n", 1)[1].split("```", 1)[0])
    toy = (root / "tests" / "toy_kind.py").read_text().split('"""', 2)[2].replace("toy-scale", "scale")
    assert [line for line in toy.splitlines() if line.strip()] == [line for line in block.splitlines() if line.strip()]
    line = 'register("scale", "landscape.api.scaling:JOB", "Scale a checkpoint\'s weights into a new run.")'
    assert line in section.split("```", 2)[2]


def test_the_toy_analysis_is_the_recipe_as_written():
    """tests/toy_analysis.py is step 1 of docs/ARCHITECTURE.md's "How to add an analysis" line for line (its docstring
    and its names aside: ``toy-norm`` / ``Toy...`` for ``param-norm`` / ``ParamNorm...``)."""
    root = Path(__file__).resolve().parents[1]
    section = (root / "docs" / "ARCHITECTURE.md").read_text().split("## How to add an analysis", 1)[1]
    block = textwrap.dedent(section.split("```python\n", 1)[1].split("```", 1)[0])
    toy = (root / "tests" / "toy_analysis.py").read_text().split('"""', 2)[2]
    toy = toy.replace("toy-norm", "param-norm").replace("Toy", "ParamNorm")
    assert [line for line in toy.splitlines() if line.strip()] == [line for line in block.splitlines() if line.strip()]
    line = 'register("param-norm", "landscape.analyze.param_norm:SPEC", "Parameter norm and loss along a run.")'
    assert line in section.split("```", 2)[2]


def test_every_kind_is_registered_with_a_spec():
    names = kinds.names()
    assert names[:len(BUILT_IN)] == BUILT_IN and "interpolate" in names
    for name in BUILT_IN:
        spec = kinds.get(name)
        assert spec.name == name and spec.api is not None and set(spec.required) <= set(spec.option_types())
    assert kinds.api_names()["import_checkpoint"] == "import"
    from landscape import api
    from landscape.api.store_views import import_checkpoint

    assert api.import_checkpoint is import_checkpoint and api.train is kinds.get("train").api
    with pytest.raises(KeyError):
        kinds.get("no-such-kind")
    with pytest.raises(ValueError, match="registered twice"):
        kinds.register("train", "elsewhere:JOB", "Another train.")
    with pytest.raises(ValueError, match="is an analysis"):
        kinds.register("interpolate", "elsewhere:JOB", "Another interpolate.")


def test_a_new_kind_is_one_module_and_one_registry_line(toy, store, tmp_path, capsys):
    source = _weights(store, "a@last")
    # the api: a generated function, positional arguments then options
    import inspect

    from landscape import api

    assert list(inspect.signature(api.toy_scale).parameters) == ["ref", "run", "factor", "root", "out"]
    assert "factor: Multiply every weight by this." in api.toy_scale.__doc__
    made = api.toy_scale("a@last", root=store.root, run="s-api", factor=0.5)
    assert made.run == "s-api" and Store(store.root).run("s-api").manifest["lineage"]["parent_ref"] == "a@last"
    for key, value in _weights(store, "s-api@init").items():
        torch.testing.assert_close(value, 0.5 * source[key], rtol=0, atol=0)
    with pytest.raises(Exception, match="factor"):
        api.toy_scale("a@last", root=store.root, run="s-bad", factor=0.0)  # bounds from option(min=0, min_open)
    # the command line: generated from the config's fields, listed in --help with the registry's line
    code, out, _ = _cli(capsys, "--help")
    assert code == 0 and "toy-scale" in out and "Scale a checkpoint's weights into a new run." in out
    code, out, err = _cli(capsys, "--root", str(store.root), "toy-scale", "a@last", "--run", "s-cli", "--factor",
                          "3", "--json")
    assert code == 0, err
    assert json.loads(out) == [{"run": "s-cli", "source": "a@last", "factor": 3.0}]
    for key, value in _weights(store, "s-cli@init").items():
        torch.testing.assert_close(value, 3 * source[key], rtol=0, atol=0)
    code, out, err = _cli(capsys, "--root", str(store.root), "toy-scale", "a@last", "--factor", "0")
    assert code == 2 and err.count("\n") == 1 and "--factor" in err
    code, out, err = _cli(capsys, "--root", str(store.root), "toy-scale", "a@last", "--run", "s-cli2")
    assert code == 0 and out.splitlines()[0].split() == ["run", "source", "factor"] and "checkpoint:" in out
    # a batch spec: the interpolation reads the toy job's run, so it waits for it
    spec_file = tmp_path / "toy.yaml"
    spec_file.write_text(f"""
root: {store.root}
results: {tmp_path / 'results'}
jobs:
  scaled:
    kind: toy-scale
    ref: a@last
    run: s-batch
    factor: 2
  between:
    kind: interpolate
    refs: [a@last, s-batch@init]
    points: 3
    figure: false
""")
    spec = load_spec(spec_file)
    assert spec.job("between").deps == ("scaled",) and spec.job("scaled").produces == ("s-batch",)
    report = run_batch(spec)
    assert [o["status"] for o in report.outcomes] == ["done", "done"], report.outcomes
    assert report.outcomes[0]["numbers"] == {"factor": 2.0}
    for key, value in _weights(store, "s-batch@init").items():
        torch.testing.assert_close(value, 2 * source[key], rtol=0, atol=0)
    assert run_batch(load_spec(spec_file)).counts["cached"] == 2  # idempotent: nothing rewritten


def test_batch_kinds_are_checked_by_their_spec(toy, store, tmp_path):
    from landscape.batch import SpecError

    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(f"root: {store.root}\njobs:\n  s:\n    kind: toy-scale\n    ref: a@last\n")
    with pytest.raises(SpecError, match="needs option 'run'"):
        load_spec(spec_file)
    spec_file.write_text(f"root: {store.root}\njobs:\n  s:\n    kind: toy-scale\n    ref: a@last\n    run: x\n"
                         f"    factor: -1\n")
    with pytest.raises(SpecError, match=r"bad.yaml:7: .*: factor must be > 0"):
        load_spec(spec_file)


def test_import_is_a_batch_kind(store, tmp_path):
    from safetensors.torch import save_file

    weights = {k: v.contiguous() for k, v in _weights(store, "a@last").items()}
    save_file(weights, str(tmp_path / "w.safetensors"))
    spec_file = tmp_path / "imp.yaml"
    spec_file.write_text(f"""
root: {store.root}
results: {tmp_path / 'results'}
jobs:
  bring:
    kind: import
    file: {tmp_path / 'w.safetensors'}
    run: imported
    model: lenet
    data: digits
    subset: 100
  norm:
    kind: clipping
    refs: [imported]
    batch_size: 16
    figure: false
""")
    spec = load_spec(spec_file)
    assert spec.job("norm").deps == ("bring",)
    report = run_batch(spec)
    assert [o["status"] for o in report.outcomes] == ["done", "done"], report.outcomes
    for key, value in _weights(store, "imported@init").items():
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0)
    (tmp_path / "results" / ".batch" / "bring.json").unlink()  # killed after the import, before its record
    again = run_batch(load_spec(spec_file))
    assert [o["status"] for o in again.outcomes] == ["done", "cached"], again.outcomes


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_kind_command_is_generated_from_its_dataclasses(name):
    """No command of a job kind is written by hand: its options are the option fields of the kind's dataclasses
    (a field added to ``PhasesConfig`` or ``TrainConfig`` with option() metadata is an option of the command
    without further code), its arguments the spec's ``arguments``."""
    import dataclasses

    assert not hasattr(cli.main, "HAND_WRITTEN")
    command = cli.main.cli.get_command(None, name)
    assert command.callback.__module__ == "cli.kinds"
    spec = kinds.get(name)
    fields = [f for cls, left_out in spec.fields or ((spec.config, ()),) for f in dataclasses.fields(cls)
              if f.name not in left_out and f.metadata.get("cli")]
    params = [p.name for p in command.params if not getattr(p, "hidden", False) and p.name != "as_json"]
    assert params == [*spec.arguments, *(f.name for f in fields if f.name not in spec.arguments)]


def test_prune_command_is_generated_with_its_required_option(store, capsys):
    """``prune`` has no hand-written command: its options, help and output come from its spec, and ``remove`` (a
    field without a default) is a required option."""
    with pytest.raises(SystemExit) as info:
        cli.main.main(["--root", str(store.root), "prune", "a@last"])
    assert info.value.code == 2 and "Missing option '--remove'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main.main(["--root", str(store.root), "prune", "a@last", "--remove", "0.5", "--run", "kinds-p50"])
    out = capsys.readouterr().out.splitlines()
    assert info.value.code in (0, None)
    assert out[0].split() == ["tensor", "shape", "weights", "kept", "kept_fraction"]
    assert out[-3].startswith("total") and abs(float(out[-3].split()[-1]) - 0.5) < 0.01
    assert out[-2] == "run kinds-p50: step 0 = a@last pruned (rewound to a@init), mask in run array 'mask'"
    assert out[-1].startswith("checkpoint: ") and out[-1].endswith("step-000000.h5")
