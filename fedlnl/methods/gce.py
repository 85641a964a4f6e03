"""Generalized Cross Entropy (GCE) as local training — Zhang & Sabuncu, "Generalized Cross Entropy Loss
for Training Deep Neural Networks with Noisy Labels", NeurIPS 2018 (no authors' code found), one of
the robust losses FedNoisy ships for its FedAvg clients (https://github.com/SMILELab-FL/FedNoisy at
2b7ca7a, ``fednoisy/utils/criterion.py`` ``GeneralizedCrossEntropy``, copied from the APL code).
Facts: docs/methods/local_lnl.md §21.10.

Loss (the paper's L_q, Eq. 6 by a third-party implementation's numbering; the paper's text not read,
docs/methods/local_lnl.md §21.9): L_q(f(x), e_y) = (1 − p_y^q)/q with
q ∈ (0, 1]: q → 0 gives the cross-entropy −log p_y, q = 1 gives 1 − p_y (MAE up to its factor 2).
∂L_q/∂z = p_y^q·(p − e_y): CE's gradient with each sample weighted by p_y^q. Batch mean. The
truncated variant L_trunc (k = 0.5, pruned by alternating convex search) is left out (L21).

Federated adaptation: plain FedAvg whose clients train with L_q instead of CE (the ``fl`` settings,
fresh optimiser per round, n_k-weighted averaging), as SCE (docs/methods/local_lnl.md §21.7); no state anywhere.

Values and sources of each key: docs/methods/local_lnl.md §23.32; what each key is: ``GCEParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedlnl.conf.checks import number
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Params, linear, param, rule
from fedlnl.methods.fedavg import FedAvg


def gce_loss(logits: torch.Tensor, labels: torch.Tensor, q: float) -> torch.Tensor:
    """L_q = (1 − p_y^q)/q (Zhang & Sabuncu, Eq. 6 by a third-party numbering), batch mean."""
    log_py = F.log_softmax(logits, dim=1).gather(1, labels[:, None]).squeeze(1)
    # p_y^q = exp(q·log p_y): taken in log space, so a p_y that underflows keeps its (tiny) gradient
    # where the codes' clamp at 1e-7 would cut it (L22)
    return ((1.0 - torch.exp(q * log_py)) / q).mean()


@dataclass(frozen=True)
class GCEParams(Params):
    """GCE's own number (conf/method/gce.yaml; docs/methods/local_lnl.md §21.10)."""

    q: float = param("q: exponent of L_q = (1 − p_y^q)/q (→ 0: cross-entropy; 1: 1 − p_y)",
                     rule(number, lambda v: 0 < v <= 1, "a number in (0, 1]"),
                     search=linear(0.1, 1.0, "GCE (Zhang & Sabuncu 2018) defines q in (0, 1] and runs q = 0.7 "
                                             "(docs/methods/local_lnl.md §23.32): uniform over (0, 1] from 0.1"))


class GCE(FedAvg):
    family = "label-noise learning as local training"

    Params = GCEParams

    def client_update(self, state, client, ctx):
        def loss_fn(model, xb, yb, step, gen):
            return gce_loss(model(xb), yb, self.q)

        return engine.train_from_global(state, client, ctx, loss_fn=loss_fn, **self.fl.training())
