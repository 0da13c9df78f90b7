"""Models and data defined outside landscape, named by the tests as ``tests/user_models.py:factory``.

Not collected by pytest (no ``test_`` prefix): it is the kind of file a researcher brings along.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class TinyCNN(nn.Module):
    """A model defined in a user file: conv - relu - pool - linear, with a parameter of its own (a scale)."""

    def __init__(self, channels: int, num_classes: int, width: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(channels, width, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


def tiny_cnn(input_shape, num_classes, width=4):
    return TinyCNN(input_shape[0], num_classes, width)


def tiny_mlp(input_shape, num_classes, hidden=6):
    """Small enough for an exact Hessian (a few hundred parameters on 8x8 digits with few classes)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.Tanh(),
                         nn.Linear(hidden, num_classes))


def mobilenet(input_shape, num_classes, width_mult=0.25):
    """torchvision's MobileNetV3-Small (not built into landscape), BatchNorm converted to GroupNorm."""
    from torchvision.models import mobilenet_v3_small

    from landscape.models import convert_batchnorm_to_groupnorm

    model = mobilenet_v3_small(weights=None, num_classes=num_classes, width_mult=width_mult)
    return convert_batchnorm_to_groupnorm(model, num_groups=4)


def squeezenet(input_shape, num_classes):
    """torchvision's SqueezeNet 1.1 (no BatchNorm; the converter is the identity on it)."""
    from torchvision.models import squeezenet1_1

    from landscape.models import convert_batchnorm_to_groupnorm

    return convert_batchnorm_to_groupnorm(squeezenet1_1(weights=None, num_classes=num_classes))


class TokenTransformer(nn.Module):
    """Embeddings + a TransformerEncoder + mean pooling + a linear head on integer token sequences."""

    def __init__(self, seq_len: int, num_classes: int, vocab: int = 8, dim: int = 16, heads: int = 2,
                 layers: int = 1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(seq_len, dim) * 0.1)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position).mean(dim=1))


def transformer(input_shape, num_classes, vocab=8, dim=16):
    return TokenTransformer(input_shape[0], num_classes, vocab=vocab, dim=dim)


def images(seed=0, n=64, n_test=32, classes=3, side=32):
    """Synthetic 3 x side x side images whose class shifts one channel's mean (a dict of tensors)."""
    g = torch.Generator().manual_seed(seed)

    def draw(count):
        y = torch.randint(0, classes, (count,), generator=g)
        x = torch.randn(count, 3, side, side, generator=g)
        x[:, 0] += y.view(-1, 1, 1).float()
        return x, y

    x_train, y_train = draw(n)
    x_test, y_test = draw(n_test)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, "num_classes": classes}


def sequences(seed=0, n=96, n_test=48, seq_len=8, vocab=8):
    """Token sequences; the class is whether token 1 occurs more often than token 2 (a tuple of tensors)."""
    g = torch.Generator().manual_seed(seed)

    def draw(count):
        x = torch.randint(0, vocab, (count, seq_len), generator=g)
        y = ((x == 1).sum(1) > (x == 2).sum(1)).long()
        return x, y

    return (*draw(n), *draw(n_test))


class PairDataset(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def dataset_splits(seed=0):
    """The same images as torch Datasets (train, test)."""
    d = images(seed, n=20, n_test=10, side=8)
    return PairDataset(d["x_train"], d["y_train"]), PairDataset(d["x_test"], d["y_test"])
