"""Symmetric Cross Entropy (SL) as local training — Wang et al., "Symmetric Cross Entropy for Robust
Learning with Noisy Labels", ICCV 2019 (official code, Keras:
https://github.com/YisenWang/symmetric_cross_entropy_for_noisy_labels at ec778df), federated as FNBench
does it (https://github.com/Sprinter1999/FNBench at 9cec427: ``fl_components/update.py``
``SCELoss`` / ``LocalUpdateSymmetric``). Facts: docs/methods/local_lnl.md §21.

Loss (the paper's definition of Symmetric Learning; equation numbers not re-read, docs/methods/local_lnl.md §21): ℓ_SL = α·ℓ_CE + β·ℓ_RCE with the reverse cross-entropy
ℓ_RCE = −Σ_k p(k|x) log q(k|x) of the prediction p against the one-hot label q, where log 0 := A;
for a one-hot label this is ℓ_RCE = −A·(1 − p_y) (``sce_loss``). Batch means of both terms.

Federated adaptation (FNBench): plain FedAvg whose clients train with ℓ_SL instead of CE (``fl``
settings, fresh optimiser per round, n_k-weighted averaging); no state anywhere.

Fidelity switches (``${fidelity:<paper>,<FNBench code>}``)
Values and sources of each key: docs/methods/local_lnl.md §23.26; what each key is: ``SCEParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedlnl.conf.checks import nonnegative, number
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Params, log_range, param, rule
from fedlnl.methods.fedavg import FedAvg


def sce_loss(logits: torch.Tensor, labels: torch.Tensor, alpha: float, beta: float, A: float,
             p_min: float = 0.0) -> torch.Tensor:
    """ℓ_SL = α·ℓ_CE + β·ℓ_RCE (Wang et al.), batch means. ℓ_RCE = −Σ_k p_k log q_k with q the one-hot
    label and log 0 := A, i.e. −A·Σ_{k≠y} p_k; ``p_min`` clamps p from below first (the codes'
    1e-7; the clamp's upper bound 1 never binds)."""
    ce = F.cross_entropy(logits, labels)
    return alpha * ce + beta * rce_loss(logits, labels, A, p_min)


def rce_loss(logits: torch.Tensor, labels: torch.Tensor, A: float, p_min: float = 0.0) -> torch.Tensor:
    """ℓ_RCE = −Σ_k p_k log q_k (Wang et al.) of the softmax p against the one-hot label q with
    log 0 := A, i.e. −A·Σ_{k≠y} p_k = −A·(1 − p_y) unclamped; ``p_min`` clamps p from below first.
    Batch mean. Shared with NCE+RCE (``nce_rce.py``), whose passive term is this one."""
    p = logits.softmax(dim=1)
    if p_min > 0:
        p = p.clamp(min=p_min)
    off = 1.0 - F.one_hot(labels, logits.shape[1]).to(p.dtype)
    rce = -A * (p * off).sum(dim=1)
    return rce.mean()


@dataclass(frozen=True)
class SCEParams(Params):
    """SCE's own numbers (conf/method/sce.yaml; docs/methods/local_lnl.md §21, L-numbers there)."""

    alpha: float = param("α: weight of the cross-entropy term", rule(nonnegative, "a weight >= 0"),
                         search=log_range(0.01, 10.0, "SCE's official run configurations use α = 0.01 (MNIST) to 6.0 "
                                                      "(CIFAR-100) (docs/methods/local_lnl.md §23.26): a log range over them"))
    beta: float = param("β: weight of the reverse cross-entropy term", rule(nonnegative, "a weight >= 0"),
                        search=log_range(0.1, 2.0, "SCE's official run configurations use β = 0.1 (CIFAR-100) to 1.0 "
                                                   "(CIFAR-10, MNIST) (docs/methods/local_lnl.md §23.26): a log range over them, "
                                                   "doubled above"))
    A: float = param("L6: log 0 := A in the reverse cross-entropy", rule(number, lambda v: v < 0, "a number < 0 (log 0 := A)"))
    p_min: float = param("L7: p clamped to [p_min, 1] inside ℓ_RCE (0: unclamped)",
                         rule(number, lambda v: 0 <= v < 1, "a probability floor in [0, 1)"))


class SCE(FedAvg):
    family = "label-noise learning as local training"

    Params = SCEParams

    def client_update(self, state, client, ctx):
        def loss_fn(model, xb, yb, step, gen):
            return sce_loss(model(xb), yb, self.alpha, self.beta, self.A, self.p_min)

        return engine.train_from_global(state, client, ctx, loss_fn=loss_fn, **self.fl.training())
