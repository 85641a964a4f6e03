"""NCE+RCE, the Active Passive Loss of Ma, Huang, Wang, Romano, Erfani & Bailey, "Normalized Loss
Functions for Deep Learning with Noisy Labels", ICML 2020 (official code:
https://github.com/HanxunH/Active-Passive-Losses at 04bce53, ``loss.py`` ``NCEandRCE``), as local
training. FedNoisy (https://github.com/SMILELab-FL/FedNoisy at 2b7ca7a) carries the class but its
``--criterion`` offers NCE and RCE only apart. Facts: docs/methods/local_lnl.md §21.12.

Loss: ℓ_APL = α·ℓ_NCE + β·ℓ_RCE. The active term, the normalised cross-entropy
ℓ_NCE = (−log p_y) / (−Σ_k log p_k) ∈ [0, 1]; the passive term, SCE's reverse cross-entropy
ℓ_RCE = −Σ_k p_k log q_k against the one-hot label with log 0 := A, i.e. −A·(1 − p_y)
(``sce.rce_loss``, docs/methods/local_lnl.md §21.3). Batch means of both terms.

Federated adaptation: plain FedAvg whose clients train with ℓ_APL instead of CE, as SCE
(docs/methods/local_lnl.md §21.7); no state anywhere.

Fidelity switches (``${fidelity:<paper>,<APL code>}``)
Values and sources of each key: docs/methods/local_lnl.md §23.34; what each key is: ``NCERCEParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedlnl.conf.checks import nonnegative, number
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Params, among, param, rule
from fedlnl.methods.fedavg import FedAvg
from fedlnl.methods.sce import rce_loss


def nce_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ℓ_NCE = (−log p_y) / (−Σ_k log p_k) (Ma et al.), batch mean; in [0, 1] since −log p_y is one
    of the K non-negative terms of the denominator (which is > 0 for K ≥ 2)."""
    log_p = F.log_softmax(logits, dim=1)
    return (log_p.gather(1, labels[:, None]).squeeze(1) / log_p.sum(dim=1)).mean()


def nce_rce_loss(logits: torch.Tensor, labels: torch.Tensor, alpha: float, beta: float, A: float,
                 p_min: float = 0.0) -> torch.Tensor:
    """ℓ_APL = α·ℓ_NCE + β·ℓ_RCE, batch means (``p_min``: the APL code's clamp of p inside ℓ_RCE)."""
    return alpha * nce_loss(logits, labels) + beta * rce_loss(logits, labels, A, p_min)


@dataclass(frozen=True)
class NCERCEParams(Params):
    """NCE+RCE's own numbers (conf/method/nce_rce.yaml; docs/methods/local_lnl.md §21.12, L-numbers there)."""

    alpha: float = param("α: weight of the active term ℓ_NCE", rule(nonnegative, "a weight >= 0"),
                         search=among((1.0, 10.0, 50.0), "the APL configs' α: 1 (MNIST, CIFAR-10), 10 (CIFAR-100), "
                                                         "50 (WebVision-mini) (docs/methods/local_lnl.md §21.12)"))
    beta: float = param("β: weight of the passive term ℓ_RCE", rule(nonnegative, "a weight >= 0"),
                        search=among((0.1, 1.0, 10.0), "the APL configs' β: 10 (MNIST), 1 (CIFAR-10), 0.1 (CIFAR-100, "
                                                       "WebVision-mini) (docs/methods/local_lnl.md §21.12)"))
    A: float = param("L17: log 0 := A in the reverse cross-entropy", rule(number, lambda v: v < 0, "a number < 0 (log 0 := A)"))
    p_min: float = param("L18: p clamped to [p_min, 1] inside ℓ_RCE (0: unclamped)",
                         rule(number, lambda v: 0 <= v < 1, "a probability floor in [0, 1)"))


class NCERCE(FedAvg):
    family = "label-noise learning as local training"

    Params = NCERCEParams

    def client_update(self, state, client, ctx):
        def loss_fn(model, xb, yb, step, gen):
            return nce_rce_loss(model(xb), yb, self.alpha, self.beta, self.A, self.p_min)

        return engine.train_from_global(state, client, ctx, loss_fn=loss_fn, **self.fl.training())
