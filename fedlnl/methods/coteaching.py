"""Co-teaching as local training — Han et al., "Co-teaching: Robust Training of Deep Neural Networks
with Extremely Noisy Labels", NeurIPS 2018 (official code https://github.com/bhanML/Co-teaching at
7c7fbe2), federated as FNBench does it (Jiang et al., https://github.com/Sprinter1999/FNBench at 9cec427:
``fl_components/update.py::LocalUpdateCoteaching``, ``main_fed_LNL.py``). Facts: docs/methods/local_lnl.md §21.

Algorithm (paper Alg. 1), on every selected client: two networks f and g see each mini-batch D̄; each
ranks it by its own cross-entropy and keeps its R(T)·|D̄| smallest-loss samples (D̄_f, D̄_g); f is
updated on D̄_g and g on D̄_f (``pair.exchange``). The forget rate 1 − R(T) = min(T/T_k·τ, τ) rises
to τ over T_k steps.

Federated adaptation (FNBench)
- Two global networks, each the n_k-weighted average of its client copies; each participation
  uploads both (network 2 as ``payload["weights2"]``, counted in ``bytes_up``). Network 2 starts from
  an independent initialisation (``second_init: all``; ``head`` keeps a pre-trained backbone). The
  test model is network 1 (FNBench's "global model 1").
- T counts global rounds: the forget rate of round t is applied to every batch of every client in
  that round, and T_k = max(1, ⌊``gradual_share``·rounds⌋) (FNBench: num_gradual = warmup_epochs =
  int(0.2·epochs)). The paper's T_k = 10 epochs of a 200-epoch centralised run has no FL reading;
  FNBench's is the one that ran.
- Local training: ``fl`` settings (epochs, batch, lr, momentum, weight decay), a fresh optimiser per
  round, the per-batch loss of each network the mean CE over its selected samples.
- No client state: nothing persists on a client between rounds.

Fidelity switches (``${fidelity:<paper>,<FNBench code>}``)
Values and sources of each key: docs/methods/local_lnl.md §23.27; what each key is: ``pair.ForgettingParams``.

``forget_rate: noise`` reads ``FederationInfo.noise_rate`` (the rate the noise config implies, e.g.
ρ(1+τ)/2·(1 − 1/M) for symmetric noise, or a real label set's published rate; never measured on
labels), one value for every client as the paper's single τ; a config without a known rate is
refused before training (docs/methods/rofl.md R3). A number is accepted in either mode.
"""
from __future__ import annotations

from fedlnl.methods.common import lnl, pair
from fedlnl.methods.common.protocol import UpdatePlan, local_steps
from fedlnl.methods.fedavg import FedAvg


class Coteaching(FedAvg):
    family = "label-noise learning as local training"

    Params = pair.ForgettingParams

    def init(self, model, info, ctx):
        return pair.init_forgetting(model, info, ctx, self.second_init, self.forget_rate)

    def forget_rate_at(self, state, ctx) -> float:
        return lnl.gradual_forget_rate(ctx.round, ctx.total_rounds, state["tau"], self.gradual_share, self.schedule)

    def batch_losses(self, logits1, logits2, labels, forget: float):
        """The two networks' losses on one batch at forget rate ``forget`` (the cross-update, Alg. 1)."""
        return pair.coteaching_losses(logits1, logits2, labels,
                                      lnl.keep_count(labels.numel(), forget, self.keep_rounding))

    def plan_update(self, ctx, k, info, model):
        """(dry_run) one step a batch updates both networks; both are uploaded."""
        return UpdatePlan(local_steps(info.client_sizes[k], self.fl.local_epochs, self.fl.batch_size), models=2)

    def client_update(self, state, client, ctx):
        forget = self.forget_rate_at(state, ctx)

        def rule(logits1, logits2, labels, pos):
            return self.batch_losses(logits1, logits2, labels, forget)

        return pair.client_update(state, client, ctx, self.fl.training(), rule)

    def aggregate(self, state, updates, ctx):
        pair.aggregate(state, updates)
        return state, {"forget_rate": self.forget_rate_at(state, ctx)}
