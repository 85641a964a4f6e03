"""ResNet-18/34, CIFAR variant (He et al. 2016; the stem FedCorr uses for CIFAR-10/100).

3x3 conv stem with stride 1 and no max-pool, four stages of BasicBlocks (64, 128, 256, 512
channels; stride 2 from the second stage, 1x1 conv + BN shortcut when the shape changes), adaptive
average pool, Linear(512, M). ResNet-18 has 11,173,962 parameters for M = 10.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


def _stage(in_planes: int, planes: int, num_blocks: int, stride: int) -> nn.Sequential:
    strides = [stride] + [1] * (num_blocks - 1)
    blocks = [BasicBlock(in_planes if i == 0 else planes, planes, s) for i, s in enumerate(strides)]
    return nn.Sequential(*blocks)


class ResNet(nn.Module):
    def __init__(self, num_classes: int, input_shape: Sequence[int], num_blocks: Sequence[int]):
        super().__init__()
        self.conv1 = nn.Conv2d(input_shape[0], 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        widths = (64, 128, 256, 512)
        self.layers = nn.Sequential(
            *(
                _stage(widths[max(i - 1, 0)], w, n, 1 if i == 0 else 2)
                for i, (w, n) in enumerate(zip(widths, num_blocks))
            )
        )
        self.feature_dim = 512
        self.head = nn.Linear(512, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def resnet18(num_classes: int, input_shape: Sequence[int]) -> ResNet:
    return ResNet(num_classes, input_shape, (2, 2, 2, 2))


def resnet34(num_classes: int, input_shape: Sequence[int]) -> ResNet:
    return ResNet(num_classes, input_shape, (3, 4, 6, 3))
