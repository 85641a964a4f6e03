"""torchvision ResNet-50 (ImageNet stem), ``fc`` replaced by Linear(2048, M) (FedCorr, Clothing1M).

With ``pretrained: true`` the ImageNet weights of torchvision's ``resnet50(pretrained=True)``
(IMAGENET1K_V1, as used by the reference code) are loaded before the head is replaced. They come
from the torch hub cache (``$TORCH_HOME/hub/checkpoints``) or are downloaded once.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torchvision
from torch import nn
from torchvision.models import ResNet50_Weights

WEIGHTS = ResNet50_Weights.IMAGENET1K_V1
#: the stem and four stages halve the image five times: below 32 pixels a stage halves a 1x1 map
MIN_SIZE = 32


def imagenet_state_dict() -> dict[str, torch.Tensor]:
    """The ImageNet ResNet-50 weights from the hub cache (downloading them if possible)."""
    try:
        return torch.hub.load_state_dict_from_url(WEIGHTS.url, map_location="cpu", progress=False)
    except Exception as err:  # offline, proxy, corrupt file: all mean the same to the user
        where = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(WEIGHTS.url))
        raise RuntimeError(
            f"ResNet-50 ImageNet weights unavailable ({type(err).__name__}: {err}); download "
            f"{WEIGHTS.url} to {where} (set TORCH_HOME to use another torchvision cache) "
            f"or set model.pretrained=false"
        ) from err


class ResNet50(nn.Module):
    def __init__(self, num_classes: int, input_shape: Sequence[int], pretrained: bool):
        super().__init__()
        if min(input_shape[1:]) < MIN_SIZE:
            h, w = input_shape[1:]
            raise ValueError(f"ResNet-50 (ImageNet stem, stride 32) needs inputs of at least {MIN_SIZE}x{MIN_SIZE} "
                             f"pixels, got {h}x{w}: its later stages would only stride over 1x1 maps")
        self.net = torchvision.models.resnet50()
        if pretrained:
            if input_shape[0] != 3:
                raise ValueError(f"pretrained ResNet-50 needs 3 input channels, got {input_shape[0]}")
            self.net.load_state_dict(imagenet_state_dict())
        elif input_shape[0] != 3:
            self.net.conv1 = nn.Conv2d(input_shape[0], 64, 7, stride=2, padding=3, bias=False)
        self.feature_dim = self.net.fc.in_features
        self.net.fc = nn.Identity()
        self.head = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
