"""FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017. No official repository; configured as in FedCorr (Xu et al., CVPR 2022,
https://github.com/Xu-Jingyi/FedCorr), docs/methods/fedavg.md §4.

Implementation notes
- Client: ``fl.local_epochs`` epochs of SGD (momentum 0.5, no weight decay, a fresh optimiser per
  round, as the FedCorr reference), batch ``fl.batch_size``, cross-entropy on the observed labels.
- Server: n_k-weighted average of every state-dict entry, BatchNorm statistics included (Eq. 1 of
  the paper; FedCorr code Q21). n_k is the client's full local size.
- Sampling: m = max(⌊frac·N⌋, 1) clients uniformly without replacement each round.
"""
from __future__ import annotations

from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Method


class FedAvg(Method):
    family = "FL baselines"

    def init(self, model, info, ctx):
        return {"model": model, "global": engine.get_weights(model)}

    def sample_clients(self, state, ctx):
        return engine.uniform_clients(ctx.num_clients, self.fl.frac, ctx.rng("sample"))

    def client_update(self, state, client, ctx):
        return engine.train_from_global(
            state, client, ctx, **self.fl.training())

    def aggregate(self, state, updates, ctx):
        state["global"] = engine.weighted_average(
            [u.weights for u in updates], [u.num_samples for u in updates])
        return state, {}

    def eval_model(self, state):
        engine.set_weights(state["model"], state["global"])
        return state["model"]
