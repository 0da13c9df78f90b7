"""LeNet-5 written as a researcher would, outside landscape (for ``benchmarks/user_model.py``).

``sequential`` builds exactly the layers of the built-in ``lenet`` on 1x28x28 (so the state dicts match key
for key); ``LeNet`` is the same function as a hand-written module with a functional ``forward``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def sequential(input_shape, num_classes):
    c = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(c, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_classes),
    )


class LeNet(nn.Module):
    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


class LeNetPoolModules(LeNet):
    """The same with its pooling as an ``nn.MaxPool2d`` module (the evaluator rewrites modules, not calls)."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__(channels, num_classes)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


def module(input_shape, num_classes):
    return LeNet(input_shape[0], num_classes)


def module_pools(input_shape, num_classes):
    return LeNetPoolModules(input_shape[0], num_classes)


def as_module_state(sequential_state: dict) -> dict:
    """The built-in's weights under the hand-written module's names."""
    names = {"0": "conv1", "3": "conv2", "7": "fc1", "9": "fc2", "11": "fc3"}
    return {f"{names[k.split('.')[0]]}.{k.split('.')[1]}": v for k, v in sequential_state.items()}
