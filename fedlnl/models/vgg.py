"""VGG-11 with torchvision's structure (FedCorr Table 10).

``features`` is everything up to the last hidden layer of the classifier (4096 units); ``head`` is
the final Linear. The reference code assigns ``.fc = Linear(4096, M)`` to torchvision's ``vgg11()``,
which has no ``fc`` (its head is ``.classifier``), so its network outputs 1000 logits and softmax,
LID and argmax run over 1000 dimensions (docs/methods/setup.md §1.1). ``reference_head: true`` reproduces that
by giving the head 1000 outputs; the unused, never-trained ``fc`` module of the reference is not
reproduced (it only adds averaged parameters that contribute nothing). Dropout draws its masks from
the client's generator (``models/layers.py``), where the reference code uses torch's global RNG: the
same distribution, but independent of the order clients are trained in.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torchvision
from torch import nn

from fedlnl.conf import checks
from fedlnl.models.layers import AdaptiveAvgPool2d, ClientDropout

REFERENCE_OUTPUTS = 1000
#: where dropout masks come from; recorded in the config (and so in its hash) because runs made when
#: the masks came from torch's global RNG gave other numbers: they are never resumed or skipped as
#: runs of this config
DROPOUT_RNG = ("client",)


class VGG11(nn.Module):
    def __init__(self, num_classes: int, input_shape: Sequence[int], reference_head: bool, dropout_rng: str):
        super().__init__()
        checks.choice("model.dropout_rng", dropout_rng, DROPOUT_RNG, text=True)
        out = REFERENCE_OUTPUTS if reference_head else num_classes
        net = torchvision.models.vgg11(num_classes=out)
        if input_shape[0] != 3:
            net.features[0] = nn.Conv2d(input_shape[0], 64, 3, padding=1)
        # the pool: a deterministic gradient on a GPU; dropout: masks from the client's generator
        # (``layers.random_source``), not torch's global RNG. Same modules, same state dict.
        hidden = [ClientDropout(m.p, m.inplace) if isinstance(m, nn.Dropout) else m for m in net.classifier[:-1]]
        self.body = nn.Sequential(net.features, AdaptiveAvgPool2d(net.avgpool.output_size), nn.Flatten(), *hidden)
        self.feature_dim = net.classifier[-1].in_features
        self.head = net.classifier[-1]

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
