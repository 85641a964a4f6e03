"""Bootstrapping as local training — Reed, Lee, Anguelov, Szegedy, Erhan & Rabinovich, "Training Deep
Neural Networks on Noisy Labels with Bootstrapping", ICLR 2015 workshop (arXiv 1412.6596; no authors'
code found). Facts: docs/methods/local_lnl.md §21.13.

Loss: the target mixes the given one-hot label t with the model's own prediction q = softmax(z):
- soft: ℓ = −Σ_k (β t_k + (1 − β) q_k) log q_k = β·CE + (1 − β)·H(q), the entropy of the
  prediction: the paper's reading, softmax regression with minimum-entropy regularisation, so q keeps
  its gradient in the target term (L23);
- hard: ℓ = −Σ_k (β t_k + (1 − β) z_k) log q_k with z the one-hot argmax of q: β·CE(y) + (1 − β)·CE(argmax q)
  (z carries no gradient).
β = 1 is the cross-entropy in both modes. Batch means.

Federated adaptation: plain FedAvg whose clients train with the bootstrapped loss instead of CE, as
SCE (docs/methods/local_lnl.md §21.7); q is the client model's prediction at the step; no state anywhere.

Values and sources of each key: docs/methods/local_lnl.md §23.35; what each key is: ``BootstrapParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedlnl.conf.checks import choice, unit
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Params, linear, param, rule
from fedlnl.methods.fedavg import FedAvg

MODES = ("soft", "hard")


def bootstrap_loss(logits: torch.Tensor, labels: torch.Tensor, beta: float, mode: str) -> torch.Tensor:
    """Reed et al.'s soft or hard bootstrapping loss, batch mean."""
    log_q = F.log_softmax(logits, dim=1)
    ce = -log_q.gather(1, labels[:, None]).squeeze(1)
    if mode == "soft":
        # −Σ_k q_k log q_k with q not detached: detaching it would make this term's gradient
        # p − p = 0 (L23), leaving β·CE
        own = -(log_q.exp() * log_q).sum(dim=1)
    else:
        own = -log_q.gather(1, log_q.argmax(dim=1, keepdim=True)).squeeze(1)
    return (beta * ce + (1.0 - beta) * own).mean()


@dataclass(frozen=True)
class BootstrapParams(Params):
    """Bootstrapping's own numbers (conf/method/bootstrap.yaml; docs/methods/local_lnl.md §21.13)."""

    mode: str = param("soft: the target mixes in the prediction q; hard: its one-hot argmax",
                      rule(choice, MODES, text=True))
    beta: float = param("β: weight of the given label in the target (1: cross-entropy)",
                        rule(unit, "a weight in [0, 1]"),
                        search=linear(0.6, 1.0, "Reed et al. (2015) run β = 0.95 (soft) and 0.8 (hard) "
                                                "(docs/methods/local_lnl.md §23.35): uniform from below the hard value to CE (β = 1)"))


class Bootstrap(FedAvg):
    family = "label-noise learning as local training"

    Params = BootstrapParams

    def client_update(self, state, client, ctx):
        def loss_fn(model, xb, yb, step, gen):
            return bootstrap_loss(model(xb), yb, self.beta, self.mode)

        return engine.train_from_global(state, client, ctx, loss_fn=loss_fn, **self.fl.training())
