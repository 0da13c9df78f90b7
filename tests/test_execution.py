"""Execution options apart from configs: ``workers`` / ``scheduler`` are ExecutionOptions of the runner.

They never change a result, so no analysis config has them and no result stores them in ``params``; the command
line (``--workers``, ``--scheduler``) and the api keyword arguments (``workers=``, ``scheduler=``) stay as they were.
Old result files whose params hold ``workers`` still read back (and resume: tests/test_surface.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from landscape.analyze import registry
from landscape.analyze.registry import Analysis
from landscape.api.execution import ExecutionOptions
from landscape.errors import UsageError
from landscape.options import option

# The analyses that had a ``workers`` config field before, and those whose runner options had it.
HAD_FIELD = ("directions", "surface", "hessian", "symmetry", "clipping", "norms")


def test_no_config_has_an_execution_option():
    for name in registry.names():
        spec = registry.get(name)
        fields = {f.name for f in dataclasses.fields(spec.config)}
        assert not fields & {"workers", "scheduler"}, name
        if spec.run_options is not None:
            assert not {f.name for f in dataclasses.fields(spec.run_options)} & {"workers", "scheduler"}, name


@pytest.mark.parametrize("name", registry.names())
def test_workers_and_scheduler_are_where_they_were(name):
    """``--workers`` / ``--scheduler`` and ``workers=`` / ``scheduler=`` on exactly the analyses with parallel parts
    (every one that had them before: pairs, targets and the directions / surface worker pools)."""
    from cli.generate import command
    from landscape.api.runner import api_function

    spec = registry.get(name)
    params = inspect.signature(api_function(name)).parameters
    flags = {o for p in command(name).params for o in p.opts}
    if spec.has_workers:
        assert params["workers"].default == 1 and params["scheduler"].default is None
        assert params["workers"].kind is inspect.Parameter.KEYWORD_ONLY
        assert {"--workers", "--scheduler"} <= flags
    else:
        assert "workers" not in params and "--workers" not in flags
    if name in HAD_FIELD:
        assert spec.has_workers


def test_execution_options_check_their_values():
    assert ExecutionOptions() == ExecutionOptions(1, None)
    assert ExecutionOptions(2.0).workers == 2 and isinstance(ExecutionOptions(2.0).workers, int)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(UsageError, match="^workers must be an integer >= 1"):
            ExecutionOptions(bad)
    with pytest.raises(UsageError, match="not both"):
        ExecutionOptions(2, "tcp://127.0.0.1:1")
    assert ExecutionOptions(1).on_cluster(True) == ExecutionOptions(1)  # no scheduler: unchanged


def test_a_spec_refuses_an_execution_option_in_its_config():
    @dataclasses.dataclass
    class Config:
        n: int = option(1, "n")
        workers: int = option(1, "w")

    with pytest.raises(ValueError, match="workers is an execution option of the runner"):
        Analysis(name="x", config=Config, compute=lambda *a: None, result=object, inputs="target",
                 collect=lambda *a: None)


def test_a_spec_takes_only_the_hooks_of_its_inputs():
    @dataclasses.dataclass
    class Config:
        n: int = option(1, "n")

    Analysis(name="x", config=Config, compute=print, result=object, inputs="checkpoint", hooks=("execute",))
    with pytest.raises(ValueError, match="takes hooks"):
        Analysis(name="x", config=Config, compute=print, result=object, inputs="pair", hooks=("execute",))


def test_hooks_are_attached_by_the_api():
    """directions / surface / clipping name no api code; the api names their hooks."""
    from landscape.api import loss_surfaces, pruning
    from landscape.api.runner import hook

    assert hook(registry.get("directions"), "execute") is loss_surfaces.run_directions
    assert hook(registry.get("surface"), "execute") is loss_surfaces.run_surface
    assert hook(registry.get("clipping"), "expand") is pruning.expand_prune_levels
    for name in registry.names():
        spec = registry.get(name)
        assert not isinstance(spec.figure, str) or spec.figure.startswith("landscape.plots."), name


def test_old_params_with_workers_read_back(tmp_path):
    """A result written when ``workers`` was a config field: its config reads back (the key is dropped), as the
    codec does for every key a config no longer has."""
    import h5py
    from toy_analysis import ToyConfig, ToyResult, ToyRow

    path = tmp_path / "old.h5"
    config = ToyConfig(scale=2.0)
    ToyResult(rows=[ToyRow("r@last", 1.0, 3.0, 0.5)], config=config).to_hdf5(path, inputs=[])
    with h5py.File(path, "r+") as f:
        f.attrs["params"] = json.dumps({**json.loads(f.attrs["params"]), "workers": 3})
    back = ToyResult.from_hdf5(path)
    assert back.config == config and back.rows[0].norm == 3.0
