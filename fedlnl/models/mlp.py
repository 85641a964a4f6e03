"""A fully connected network on flattened inputs (for tests and tiny datasets)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """Flatten -> [Linear -> ReLU] per hidden size -> Linear(M). Features are the last hidden layer."""

    def __init__(self, num_classes: int, input_shape: Sequence[int], hidden: Sequence[int]):
        super().__init__()
        sizes = [math.prod(input_shape), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU(inplace=True)]
        self.body = nn.Sequential(*layers)
        self.feature_dim = sizes[-1]
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
