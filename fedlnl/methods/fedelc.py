"""FedELC — Jiang, Sun, Li, Xue, Li, Wu, Xu, Wang, Liu, "Tackling Noisy Clients in Federated Learning
with End-to-end Label Correction", CIKM 2024 (arXiv 2408.04301). Official code:
https://github.com/Sprinter1999/FedELC at commit b5a8563 (``main_fed_LNL.py``,
``fl_models/update.py::LocalUpdateFedELC``, ``fl_models/fed.py::DaAgg``, ``utils/options.py``); the same
code in FNBench (https://github.com/Sprinter1999/FNBench at 9cec427). Facts, hyperparameters and
divergences: docs/methods/fedlsr_fedrn_fedelc.md §22.3.

Sources checked: both codes were read in those commits; of the paper only the abstract and
third-party summaries were reachable as text (docs/methods/fedlsr_fedrn_fedelc.md §22 lists the addresses): two stages; GMM
on class-wise losses; a learnable label distribution y^d updated by back-propagation; local
objective L = L_c + α·L_comp + β·L_e; distance-aware aggregation. So no equation is cited by number
and the paper column of the switches is inferred, as for FedNoRo, whose stage 1 FedELC shares
(docs/methods/fednoro.md §18).

Two stages within the budget ``fl.rounds``; m = max(⌊frac·N⌋, 1) clients per round.

1. **Stage 1** (``warmup_rounds`` = T₁ rounds): FedAvg in which every client trains with the
   logit-adjusted loss CE(f(x) + τ·log π_k, y) (π_k its observed class prior, τ = ``la_tau``).
   After round T₁ the global model's per-class losses on every client's observed labels are min-max
   normalised per class and a 2-component GMM flags the component with the larger sum of means as the
   noisy clients (``common.noisyclients.detect_noisy_clients``, FedNoRo's rule, docs/methods/fednoro.md §18.2).
2. **Stage 2**: clean clients keep the logit-adjusted loss. A noisy client k keeps, for each of its
   samples i, a learnable label vector ỹ_i ∈ R^C (``common.stores.SampleStore``, by global index,
   kept across rounds; first ỹ_i = K·onehot(y_i), K = ``K``) with y^d_i = softmax(ỹ_i), and trains
   the received global model on

       L = L_c / C + α·L_o + β·L_e / C,
       L_c = KL(p_i ‖ y^d_i),  L_o = −log y^d_{i, y_i},  L_e = −Σ_c p_ic log p_ic,  p_i = softmax(f(x_i))

   (batch means; the code's PENCIL-style scaling by the number of classes C). Within each local epoch
   every batch step also yields ∂L/∂ỹ_i for its samples; after the epoch ỹ ← ỹ − λ·∂L/∂ỹ
   (λ = ``lambda_``). After the local epochs the label vectors are merged with the trained model's
   prediction: ỹ_i ← K·(softmax(ỹ_i) + softmax(f(x_i)))/2. The samples whose merged label disagrees
   with the observed one are reported noisy (``ctx.report_samples``); the observed labels themselves
   are never replaced (L_o always reads them), as in the code.
   The server aggregates with DaAgg (docs/methods/fednoro.md §18.4): weights n_k·e^{−D̂_k}, D_k the distance of a
   noisy client's model to the nearest clean model of the round (0 for clean clients).

Switches (the paper's text was not available, so every default is the code's form, as FedNoRo's;
the inferred paper forms are settable):

Values and sources of each key: docs/methods/fedlsr_fedrn_fedelc.md §23.31; what each key is: ``FedELCParams``.

Plain options: ``daagg`` (false: n_k-weighted FedAvg in stage 2), ``merge_prediction`` (false: ỹ is
not merged with the prediction after the local epochs), for ablations.

Implementation notes and deviations (docs/methods/fedlsr_fedrn_fedelc.md §22.3)
- Local training is the suite's (``fl`` group: SGD, epochs, batch, a fresh optimiser per round whose
  momentum lives across the local epochs); the code's lr 0.01, momentum 0.9, weight decay 5e-4,
  batch 64 are not pinned. λ acts on the gradient of a batch *mean*, so the step a sample's label
  takes scales with 1/batch size (as in the code).
- The last short batch of an epoch is trained on and its labels updated (the code's loader drops it).
- The merge pass reads plain images in eval mode (the code's reads augmented images in train mode).
- Detection and DaAgg run as in FedNoRo's implementation (docs/methods/fednoro.md §18.7): detection through
  ``ctx.views`` on the server, DaAgg against the clean clients of the round, FedAvg weights when a
  round has no clean or no noisy client.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedlnl.conf.checks import flag, nonnegative, positive
from fedlnl.methods.common import engine, semisup
from fedlnl.methods.common.noisyclients import (DetectionParams, adjustment, detect_clients, la_loss,
                                                 two_stage_aggregate)
from fedlnl.methods.common.params import around, log_range, param, rule
from fedlnl.methods.common.protocol import ClientUpdate
from fedlnl.methods.common.stores import SampleStore
from fedlnl.methods.fedavg import FedAvg


# ----------------------------------------------------------------------------------- label correction
def elc_loss(logits, ytilde, labels, alpha: float, beta: float) -> torch.Tensor:
    """L = L_c/C + α·L_o + β·L_e/C with L_c = KL(p ‖ softmax(ỹ)), L_o = −log softmax(ỹ)_y,
    L_e = H(p), p = softmax(logits), batch means (docs/methods/fedlsr_fedrn_fedelc.md §22.3)."""
    C = logits.shape[1]
    logp = F.log_softmax(logits, dim=1)
    p = logp.exp()
    log_yd = F.log_softmax(ytilde, dim=1)
    l_c = (p * (logp - log_yd)).sum(1).mean()
    l_o = -log_yd.gather(1, labels.view(-1, 1)).mean()
    l_e = -(p * logp).sum(1).mean()
    return l_c / C + alpha * l_o + beta * l_e / C


def initial_labels(labels: torch.Tensor, num_classes: int, K: float) -> torch.Tensor:
    """ỹ = K·onehot(y) (the code's ``label_update``, K = ``K_pencil`` = 10)."""
    return K * F.one_hot(labels, num_classes).float()


def merge_labels(ytilde: torch.Tensor, logits: torch.Tensor, K: float) -> torch.Tensor:
    """ỹ ← K·(softmax(ỹ) + softmax(f(x)))/2 after the local epochs (the code's merge)."""
    return K * 0.5 * (ytilde.softmax(1) + logits.softmax(1))


# ----------------------------------------------------------------------------------- the method
@dataclass(frozen=True)
class FedELCParams(DetectionParams):
    """FedELC's own numbers (conf/method/fedelc.yaml names each value's source; docs/methods/fedlsr_fedrn_fedelc.md §22.3)."""

    K: float = param("initial label vector K·onehot(y)", rule(positive, "a label scale K > 0"), convert=float)
    lambda_: float = param("λ: the label learning rate", rule(nonnegative, "a label learning rate λ >= 0"),
                           convert=float,
                           search=around(10, "our choice: ×/÷ 10 around the code's λ = 1000 (the paper's method "
                                             "section was not readable, docs/methods/fedlsr_fedrn_fedelc.md §22)"))
    alpha: float = param("α: weight of the compatibility term L_o", rule(nonnegative, "a loss weight >= 0"),
                         convert=float,
                         search=log_range(0.1, 2.0, "our choice: around the code's α = 0.5 and its comment's 1.0 "
                                                    "(docs/methods/fedlsr_fedrn_fedelc.md §22.3)"))
    beta: float = param("β: weight of the entropy term", rule(nonnegative, "a loss weight >= 0"), convert=float,
                        search=log_range(0.05, 1.0, "our choice: around the code's β = 0.2 and its comment's 0.5 "
                                                    "(docs/methods/fedlsr_fedrn_fedelc.md §22.3)"))
    merge_prediction: bool = param("ablation: merge the label vectors with the model's prediction after training",
                                   rule(flag))


class FedELC(FedAvg):
    family = "federated label-noise methods"

    Params = FedELCParams

    def total_rounds(self, info, rounds):
        return self.params.check_rounds(rounds)

    def init(self, model, info, ctx):
        state = super().init(model, info, ctx)
        return {**state, "num_classes": info.num_classes, "noisy": None, "labels": SampleStore(info.num_classes),
                "flags": {}}

    # ------------------------------------------------------------------ client
    def client_update(self, state, client, ctx):
        noisy = state["noisy"] is not None and bool(state["noisy"][client.id])
        if noisy:
            return self._correct(state, client, ctx)
        adj = adjustment(client.labels, state["num_classes"], self.la_tau)
        return engine.train_from_global(state, client, ctx, loss_fn=lambda m, xb, yb, s, g: la_loss(m(xb), yb, adj),
                                        **self.fl.training())

    def _correct(self, state, client, ctx):
        """Stage 2 on a noisy client: the model and the label vectors learn together."""
        model, C, store = state["model"], state["num_classes"], state["labels"]
        engine.set_weights(model, state["global"])
        lookup = torch.zeros(int(client.indices.max()) + 1, dtype=torch.long, device=client.indices.device)
        lookup[client.indices] = client.labels
        ytilde = store.get(client.indices, lambda missing: initial_labels(lookup[missing], C, self.K))
        ytilde.requires_grad_(True)
        opt = engine.optimizer(model, self.fl.optim(), run=client.data.compiled)
        gen, labels, losses = ctx.generator("train", client.id), client.labels, []
        for _ in range(self.fl.local_epochs):
            ytilde.grad = None

            def loss_fn(m, xb, pos):
                return elc_loss(m(xb), ytilde[pos], labels[pos], self.alpha, self.beta)

            batch = engine.epoch_loop(model, opt, client.data, client.indices, batch_size=self.fl.batch_size,
                                      gen=gen, augment=self.fl.augment, loss_fn=loss_fn)
            losses += batch
            if batch and not math.isfinite(batch[-1]):
                break
            with torch.no_grad():  # ỹ ← ỹ − λ·∂L/∂ỹ once per local epoch
                ytilde -= self.lambda_ * ytilde.grad
        ytilde = ytilde.detach()
        if self.merge_prediction:
            ytilde = merge_labels(ytilde, engine.predict(model, client.data, client.indices, self.fl.eval_batch_size),
                                  self.K)
        store.set(client.indices, ytilde)
        state["flags"][client.id] = {"idx": client.indices.clone(), "flagged": ytilde.argmax(1) != labels}
        return ClientUpdate(client.id, engine.get_weights(model), client.size, train_loss=semisup.mean_or_nan(losses))

    # ------------------------------------------------------------------ server
    def aggregate(self, state, updates, ctx):
        stage2 = state["noisy"] is not None
        metrics = two_stage_aggregate(state, updates, ctx, self.warmup_rounds,
                                      lambda: detect_clients(self, state, ctx, "fedelc"), self.daagg, self.distance)
        if stage2:
            metrics["stage"] = "correction"
            semisup.report_flags(ctx, state["flags"].values())
        return state, metrics
