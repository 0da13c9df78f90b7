"""Models by name: build from spec, forward shapes, bit-for-bit spec round trips, balanced init, BN -> GN."""

from __future__ import annotations

import json

import click
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from landscape.errors import ModelError
from landscape.models import (
    MODELS,
    balanced_weights,
    build_model,
    convert_batchnorm_to_groupnorm,
    has_batchnorm,
    model_from_spec,
)
from landscape.models import (
    model_options as options_of,
)

IMAGE_SHAPES = [(1, 8, 8), (3, 32, 32)]
CASES = [(name, shape) for name in MODELS for shape in IMAGE_SHAPES] + [
    ("mlp", (12,)), ("two-layer-linear", (12,)), ("resnet18", (1, 28, 28)), ("lenet", (1, 28, 28)),
    ("opacus-cnn", (1, 28, 28)),
]
SMALL = {"resnet18": {}, "mlp": {"widths": [16, 8]}}


def test_registry_has_every_named_model():
    assert set(MODELS) == {"lenet", "opacus-cnn", "resnet18", "mlp", "two-layer-linear"}


@pytest.mark.parametrize(("name", "shape"), CASES)
def test_model_builds_from_spec_and_round_trips_bit_for_bit(name, shape):
    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=7, **SMALL.get(name, {})).eval()
    spec = model.landscape_spec
    assert spec["name"] == name
    assert spec["kwargs"]["input_shape"] == list(shape) and spec["kwargs"]["num_classes"] == 7
    assert set(options_of(name)) <= set(spec["kwargs"])
    x = torch.randn(3, *shape)
    logits = model(x)
    assert logits.shape == (3, 7) and logits.dtype == torch.float32

    spec_json = json.loads(json.dumps(spec))
    assert spec_json == spec
    torch.manual_seed(1)  # the rebuilt model starts from different weights ...
    rebuilt = model_from_spec(spec_json).eval()
    assert rebuilt.landscape_spec == spec
    assert [(k, v.shape) for k, v in rebuilt.state_dict().items()] == [
        (k, v.shape) for k, v in model.state_dict().items()
    ]
    rebuilt.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, strict=True)
    assert torch.equal(rebuilt(x), logits)  # ... and after loading the state_dict agrees bit for bit


@pytest.mark.parametrize("name", ["lenet", "mlp", "two-layer-linear", "opacus-cnn"])
def test_building_uses_the_callers_seed(name):
    def weights():
        return torch.cat([p.detach().flatten() for p in build_model(
            name, input_shape=(1, 8, 8), num_classes=3).parameters()])

    torch.manual_seed(5)
    first = weights()
    torch.manual_seed(5)
    assert torch.equal(first, weights())
    assert not torch.equal(first, weights())  # the builder does not re-seed


def test_paper_geometries():
    opacus = build_model("opacus-cnn", input_shape=(1, 28, 28), num_classes=10)
    linear = [m for m in opacus.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(512, 32), (32, 10)]  # Bu et al. App. C.1
    assert sum(p.numel() for p in opacus.parameters()) == 26010
    lenet = build_model("lenet", input_shape=(1, 28, 28), num_classes=10)
    linear = [m for m in lenet.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(400, 120), (120, 84), (84, 10)]
    assert build_model("opacus-cnn", input_shape=(1, 8, 8), num_classes=10, activation="tanh")(
        torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_resnet18_norm_and_stem_options():
    group = build_model("resnet18", input_shape=(3, 32, 32), num_classes=10)
    assert not has_batchnorm(group)
    assert all(m.num_groups == 32 for m in group.modules() if isinstance(m, nn.GroupNorm))
    assert group.conv1.kernel_size == (3, 3) and isinstance(group.maxpool, nn.Identity)
    assert group.landscape_spec["kwargs"]["stem"] == "cifar"
    assert not any(m.inplace for m in group.modules() if isinstance(m, nn.ReLU))
    batch = build_model("resnet18", input_shape=(1, 72, 72), num_classes=4, norm="batch")
    assert has_batchnorm(batch)
    assert batch.landscape_spec["kwargs"]["stem"] == "imagenet"
    assert batch.conv1.kernel_size == (7, 7) and batch.conv1.in_channels == 1
    assert isinstance(batch.maxpool, nn.MaxPool2d)
    assert batch.eval()(torch.randn(2, 1, 72, 72)).shape == (2, 4)


def test_convert_batchnorm_to_groupnorm_leaves_no_batchnorm_and_original_untouched():
    torch.manual_seed(0)
    model = build_model("resnet18", input_shape=(3, 8, 8), num_classes=5, norm="batch")
    with torch.no_grad():
        model.bn1.weight.fill_(2.0)
    converted = convert_batchnorm_to_groupnorm(model, num_groups=16)
    assert has_batchnorm(model) and not has_batchnorm(converted)
    assert all(m.num_groups == 16 for m in converted.modules() if isinstance(m, nn.GroupNorm))
    assert torch.equal(converted.bn1.weight, model.bn1.weight)
    assert converted(torch.randn(2, 3, 8, 8)).shape == (2, 5)
    spec = converted.landscape_spec
    assert spec["kwargs"]["norm"] == "group" and spec["kwargs"]["groups"] == 16
    model_from_spec(spec).load_state_dict(converted.state_dict(), strict=True)
    assert model.landscape_spec["kwargs"]["norm"] == "batch"

    plain = nn.Sequential(nn.Conv2d(1, 6, 3), nn.BatchNorm2d(6, affine=False), nn.Flatten(), nn.LazyLinear(2))
    assert not has_batchnorm(convert_batchnorm_to_groupnorm(plain, num_groups=4))
    assert convert_batchnorm_to_groupnorm(plain)[1].num_groups == 6  # min(32, 6) groups


@pytest.mark.parametrize(("shape", "hidden", "classes"), [((12,), 32, 2), ((1, 8, 8), 16, 10), ((5,), 3, 1)])
def test_two_layer_linear_balanced_init(shape, hidden, classes):
    """Watson et al. Thm. 3.3's assumption W2^T W2 = W1 W1^T, in float32 storage."""
    torch.manual_seed(0)
    model = build_model("two-layer-linear", input_shape=shape, num_classes=classes, hidden=hidden,
                        balanced_init=True)
    w1 = model.layer1.weight.detach().double()
    w2 = model.layer2.weight.detach().double()
    assert w1.shape == (hidden, torch.Size(shape).numel()) and w2.shape == (classes, hidden)
    assert torch.allclose(w2.T @ w2, w1 @ w1.T, rtol=0, atol=1e-6 * (w2.T @ w2).abs().max().item())
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Linear))
    x = torch.randn(4, *shape)
    assert torch.allclose(model(x), x.flatten(1) @ model.layer1.weight.T @ model.layer2.weight.T)
    unbalanced = build_model("two-layer-linear", input_shape=shape, num_classes=classes, hidden=hidden)
    u1, u2 = unbalanced.layer1.weight.detach().double(), unbalanced.layer2.weight.detach().double()
    assert not torch.allclose(u2.T @ u2, u1 @ u1.T, atol=1e-3)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 6), m=st.integers(1, 12), extra=st.integers(0, 10), seed=st.integers(0, 1000))
def test_balanced_weights_float64_property(k, m, extra, seed):
    d = min(k, m) + extra
    torch.manual_seed(seed)
    w1, w2 = balanced_weights(torch.randn(k, m, dtype=torch.float64), d)
    assert w1.shape == (m, d) and w2.shape == (k, m)
    assert torch.allclose(w2.T @ w2, w1 @ w1.T, rtol=0, atol=1e-12 * max(1.0, (w2.T @ w2).abs().max().item()))


def test_balanced_init_needs_rank_room():
    with pytest.raises(ModelError, match="balanced_init needs"):
        build_model("two-layer-linear", input_shape=(2,), num_classes=5, hidden=8, balanced_init=True)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("vgg",), {"input_shape": (1, 8, 8), "num_classes": 2}, "unknown model 'vgg'; known: lenet, opacus-cnn"),
        (("lenet",), {"input_shape": (1, 8, 8), "num_classes": 2, "width": 3}, "no option 'width'; its options"),
        (("resnet18",), {"input_shape": (1, 8, 8), "num_classes": 2, "norm": "layer"}, "norm must be"),
        (("mlp",), {"num_classes": 2}, "needs input_shape and num_classes"),
        (("lenet",), {"input_shape": (12,), "num_classes": 2}, "needs image inputs"),
        (("mlp",), {"input_shape": (4,), "num_classes": 2, "activation": "swish"}, "unknown activation"),
        (("mlp",), {"input_shape": (4,), "num_classes": 0}, "num_classes must be"),
        (("mlp",), {"input_shape": ("a",), "num_classes": 2}, "input_shape must be"),
        (("mlp",), {"input_shape": (4,), "num_classes": 2, "widths": "wide"}, "cannot be built|widths must be"),
        (("two-layer-linear",), {"input_shape": (4,), "num_classes": 2, "hidden": 0}, "hidden must be"),
        (("lenet",), {"input_shape": (1, 2, 2), "num_classes": 2}, "cannot take inputs of shape"),
        (({"kwargs": {}},), {}, "a model spec is a dict"),
    ],
)
def test_bad_requests_are_one_line_model_errors(args, kwargs, message):
    with pytest.raises(ModelError, match=message) as info:
        build_model(*args, **kwargs)
    assert "\n" not in str(info.value)


def test_spec_arguments_override_and_merge():
    spec = build_model("mlp", input_shape=(4,), num_classes=3).landscape_spec
    wider = build_model(spec, widths=[5])
    assert wider.landscape_spec["kwargs"]["widths"] == [5] and wider.landscape_spec["kwargs"]["num_classes"] == 3
    assert build_model(spec, num_classes=6)(torch.randn(1, 4)).shape == (1, 6)


def test_cli_model_options_parse_into_build_model_arguments(tmp_path, capsys):
    """The model options of import (required) and train (optional; generated from their fields) parse into
    build_model's arguments; a bad value is a usage error, also a --model-kwargs key the data set decides."""
    import dataclasses

    from conftest import run_cli

    from cli.generate import field_option
    from cli.options import add_options
    from landscape.api.store_views import ImportConfig
    from landscape.options import hints
    from landscape.train.config import TrainConfig

    def options(cls):
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        return [field_option(by_name[n], hints(cls)[n]) for n in ("model", "model_kwargs")]

    seen = {}

    def record(model, model_kwargs):
        seen["args"] = (model, model_kwargs)

    command = click.command()(add_options(options(ImportConfig), record))
    runner = CliRunner()
    result = runner.invoke(command, ["--model", "resnet18", "--model-kwargs", '{"norm": "batch"}'])
    assert result.exit_code == 0, result.output
    assert seen["args"] == ("resnet18", {"norm": "batch"})
    for bad in ([], ["--model", "vgg"], ["--model", "mlp", "--model-kwargs", "{bad"]):
        assert runner.invoke(command, bad).exit_code == 2, bad
    code, _, err = run_cli("--root", tmp_path, "import", tmp_path / "w.pt", "--model", "mlp", "--data", "digits",
                           "--run", "x", "--model-kwargs", '{"num_classes": 3}', capsys=capsys)
    assert code == 2 and "--model-kwargs cannot hold num_classes: they come from the data set" in err

    optional = click.command()(add_options(options(TrainConfig), record))
    assert runner.invoke(optional, []).exit_code == 0 and seen["args"] == (None, {})
