"""A small convolutional network for any input size (e.g. the 8x8 digits used in tests)."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from fedlnl.models.layers import AdaptiveAvgPool2d


class CNN(nn.Module):
    """Two 3x3 conv layers (padding 1, ReLU) -> adaptive average pool to ``pool``x``pool`` -> Linear(M)."""

    def __init__(
        self, num_classes: int, input_shape: Sequence[int], channels: Sequence[int], pool: int
    ):
        super().__init__()
        c1, c2 = channels
        self.body = nn.Sequential(
            nn.Conv2d(input_shape[0], c1, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(inplace=True),
            AdaptiveAvgPool2d(pool),  # torch's on the CPU; a deterministic gradient on a GPU
            nn.Flatten(),
        )
        self.feature_dim = c2 * pool * pool
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
