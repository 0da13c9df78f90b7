"""A small user model: what `--model examples/my_model.py:small_cnn` and `build_model(...)` build.

The factory takes the data set's ``input_shape`` and ``num_classes`` (landscape passes them) and its own
options. GroupNorm instead of BatchNorm, so per-sample gradients (DP-SGD, Opacus, landscape's ntk, clipping,
norms) are well defined.
"""

from __future__ import annotations

from torch import nn


def small_cnn(input_shape=(1, 8, 8), num_classes=10, width=8, groups=2):
    """conv(3x3, width) -> GroupNorm -> ReLU -> conv(3x3, 2 width, stride 2) -> GroupNorm -> ReLU -> linear."""
    channels, height, width_in = input_shape
    features = 2 * width * ((height + 1) // 2) * ((width_in + 1) // 2)
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1), nn.GroupNorm(groups, width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.GroupNorm(groups, 2 * width), nn.ReLU(),
        nn.Flatten(), nn.Linear(features, num_classes),
    )
