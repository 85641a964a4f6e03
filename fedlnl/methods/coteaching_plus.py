"""Co-teaching+ as local training — Yu et al., "How does Disagreement Help Generalization against Label
Corruption?", ICML 2019 (official code https://github.com/xingruiyu/coteaching_plus at a68ed61),
federated as FNBench does it (https://github.com/Sprinter1999/FNBench at 9cec427:
``fl_components/update.py::LocalUpdateCoteaching`` with ``is_coteaching_plus``). Facts: docs/methods/local_lnl.md §21.

Algorithm (paper Alg. 1), on every selected client, per mini-batch D̄ of two networks: keep the
prediction-disagreement samples D̄' = {i : argmax f₁(x_i) ≠ argmax f₂(x_i)} (``pair.disagreement``); within D̄' each network keeps its λ(e)·|D̄'| smallest-loss samples and its peer is updated
on them (Co-teaching's exchange, ``pair.exchange``); λ(e) = 1 − min(e/E_k·τ, τ).
Before ``init_round`` the rule is plain Co-teaching on the whole batch (the codes' ``init_epoch``).

Federated adaptation (FNBench) — as ``coteaching.py``: two global networks, each n_k-weighted
averaged; both uploaded; test model network 1; the schedule counts global rounds with
E_k = max(1, ⌊``gradual_share``·rounds⌋); the disagreement phase starts at round ``init_round``
(FNBench hard-codes 10 rounds; the official code uses 20 / 5 / 0 epochs on CIFAR-10 / CIFAR-100 /
MNIST, docs/methods/local_lnl.md §21); fresh optimiser per round; no client state. The round's share of
disagreeing samples is logged as ``disagree_share``.

Fidelity switches (``${fidelity:<paper>,<FNBench code>}``)
Values and sources of each key: docs/methods/local_lnl.md §23.28; what each key is: ``CoteachingPlusParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedlnl.conf.checks import choice, integer
from fedlnl.methods.common import lnl, pair
from fedlnl.methods.common.params import around, param, rule
from fedlnl.methods.common.protocol import UpdatePlan, local_steps
from fedlnl.methods.fedavg import FedAvg

LOSS_ON = ("logits", "softmax")
EMPTY = ("skip", "full_batch")


@dataclass(frozen=True)
class CoteachingPlusParams(pair.ForgettingParams):
    """Co-teaching+'s numbers: Co-teaching's and the disagreement phase's (conf/method/coteaching_plus.yaml)."""

    init_round: int = param("first round of the disagreement phase", rule(integer, 0),
                            search=around(2, "our choice: ×/÷ 2 around FNBench's 10 (the official per-dataset epochs "
                                             "0-100 are centralised; docs/methods/local_lnl.md §21.6)", integer=True))
    loss_on: str = param("L4: the disagreement phase's CE on the logits | on their softmax", rule(choice, LOSS_ON))
    empty_disagreement: str = param("L5: a batch without disagreement: no step (skip) | the whole batch",
                                    rule(choice, EMPTY))


class CoteachingPlus(FedAvg):
    family = "label-noise learning as local training"

    Params = CoteachingPlusParams

    def init(self, model, info, ctx):
        return pair.init_forgetting(model, info, ctx, self.second_init, self.forget_rate)

    def forget_rate_at(self, state, ctx) -> float:
        return lnl.gradual_forget_rate(ctx.round, ctx.total_rounds, state["tau"], self.gradual_share, self.schedule)

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        """What the disagreement phase's cross-entropy is taken of (L4)."""
        return logits.softmax(dim=1) if self.loss_on == "softmax" else logits

    def batch_losses(self, logits1, logits2, labels, forget: float, plus: bool, seen: dict | None = None):
        """The two networks' losses on one batch, or None for no step: Co-teaching on the whole batch
        before the disagreement phase (``plus`` false), then the exchange within the disagreement set.
        ``seen`` counts disagreeing and all samples of the phase."""
        if not plus:
            return pair.coteaching_losses(logits1, logits2, labels,
                                          lnl.keep_count(labels.numel(), forget, self.keep_rounding))
        d = pair.disagreement(logits1, logits2)
        if seen is not None:
            seen["disagree"] += d.numel()
            seen["samples"] += labels.numel()
        out1, out2 = self._scores(logits1), self._scores(logits2)
        if d.numel() > 0:
            return pair.coteaching_losses(out1[d], out2[d], labels[d],
                                          lnl.keep_count(d.numel(), forget, self.keep_rounding))
        if self.empty_disagreement == "skip":
            return None
        return F.cross_entropy(out1, labels), F.cross_entropy(out2, labels)

    def plan_update(self, ctx, k, info, model):
        """(dry_run) one step a batch for both networks, both uploaded; in the disagreement phase a
        batch without disagreement takes no step with ``empty_disagreement=skip`` (an upper bound)."""
        exact = ctx.round < self.init_round or self.empty_disagreement == "full_batch"
        return UpdatePlan(local_steps(info.client_sizes[k], self.fl.local_epochs, self.fl.batch_size), models=2,
                          exact=exact)

    def client_update(self, state, client, ctx):
        forget, plus = self.forget_rate_at(state, ctx), ctx.round >= self.init_round
        seen = {"disagree": 0, "samples": 0}

        def rule(logits1, logits2, labels, pos):
            return self.batch_losses(logits1, logits2, labels, forget, plus, seen)

        update = pair.client_update(state, client, ctx, self.fl.training(), rule)
        update.metrics = dict(seen)
        return update

    def aggregate(self, state, updates, ctx):
        pair.aggregate(state, updates)
        seen = sum(u.metrics["samples"] for u in updates)
        out = {"forget_rate": self.forget_rate_at(state, ctx)}
        if seen:
            out["disagree_share"] = sum(u.metrics["disagree"] for u in updates) / seen
        return state, out
