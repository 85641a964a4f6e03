"""Mean absolute error (MAE) as local training — Ghosh, Kumar & Sastry, "Robust Loss Functions under
Label Noise for Deep Neural Networks", AAAI 2017, in the form the APL paper uses it (Ma et al., ICML
2020; official code https://github.com/HanxunH/Active-Passive-Losses at 04bce53, ``loss.py``
``MeanAbsoluteError``), which FedNoisy ships for its FedAvg clients (https://github.com/SMILELab-FL/FedNoisy
at 2b7ca7a). Facts: docs/methods/local_lnl.md §21.11.

Loss: ℓ_MAE = ‖e_y − p‖₁ of the softmax p against the one-hot label: Σ_{k≠y} p_k + (1 − p_y) =
2(1 − p_y). Both codes train with the "reduced MAE" 1 − p_y (half of it; the code's comment gives
the full form): ``scale`` c in c·(1 − p_y) is that switch (L19). ∂/∂z = c·p_y(p − e_y): a sample the
model gives a small p_y barely moves it, so MAE learns slowly (its known underfitting). Batch mean.

Federated adaptation: plain FedAvg whose clients train with ℓ_MAE instead of CE, as SCE
(docs/methods/local_lnl.md §21.7); no state anywhere.

Fidelity switches (``${fidelity:<paper>,<APL / FedNoisy code>}``)
Values and sources of each key: docs/methods/local_lnl.md §23.33; what each key is: ``MAEParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedlnl.conf.checks import positive
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Params, param, rule
from fedlnl.methods.fedavg import FedAvg


def mae_loss(logits: torch.Tensor, labels: torch.Tensor, scale: float) -> torch.Tensor:
    """c·(1 − p_y), batch mean: ‖e_y − p‖₁ = 2(1 − p_y) for c = 2 (Ghosh et al.), the codes'
    reduced MAE for c = 1."""
    p_y = logits.softmax(dim=1).gather(1, labels[:, None]).squeeze(1)
    return (scale * (1.0 - p_y)).mean()


@dataclass(frozen=True)
class MAEParams(Params):
    """MAE's own number (conf/method/mae.yaml; docs/methods/local_lnl.md §21.11)."""

    scale: float = param("L19: c in ℓ = c·(1 − p_y); 2 = ‖e_y − p‖₁, 1 = the codes' reduced MAE",
                         rule(positive, "a number > 0"))


class MAE(FedAvg):
    family = "label-noise learning as local training"

    Params = MAEParams

    def client_update(self, state, client, ctx):
        def loss_fn(model, xb, yb, step, gen):
            return mae_loss(model(xb), yb, self.scale)

        return engine.train_from_global(state, client, ctx, loss_fn=loss_fn, **self.fl.training())
