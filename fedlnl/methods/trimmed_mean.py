"""Trimmed mean — coordinate-wise β-trimmed mean (Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates", ICML 2018, Definition 2 / Algorithm 1
option II). No official repository; FNBench's ``trimmedMean`` (Sprinter1999/FNBench at 9cec427,
``fl_components/fed.py::trimmed_mean``) is the reference (docs/methods/robust_aggregation.md §19.2).

Algorithm (paper): for every coordinate, sort the m client values, drop the b = βm largest and the
b smallest, and average the m − 2b left (β < 1/2, β >= the Byzantine share α). Applied to the client
models of a round (the rule commutes with subtracting w_g).

Implementation notes
- b = f, the assumed number of Byzantine clients (the paper's β = α; docs/methods/robust_aggregation.md §19.5): ``f`` if
  given, else ⌊``byzantine_share`` · m⌋, ``byzantine_share: noise`` = the federation's configured
  noisy-client share. A derived b with nothing left (2b >= m) is lowered to ⌊(m − 1)/2⌋ (the
  coordinate-wise median for odd m) and the b used is logged (``trim_f``); an explicit ``f`` that
  leaves nothing is refused before training.
- Every floating-point state-dict entry is trimmed (BatchNorm statistics too), in bounded memory;
  integer counters are averaged as FedAvg does. Client sizes play no part.
- FNBench's rule is a different one: it ranks *clients* by how far their summed squared distance to
  the others lies from the median of those sums, keeps the m − 2c closest to it (c = ⌊0.3 m⌋) and
  averages them (``trim: client_score``).

Fidelity switches (paper = Yin et al.; reference = FNBench's code)

Values and sources of each key: docs/methods/robust_aggregation.md §23.20; what each key is: ``TrimmedMeanParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

from fedlnl.conf.checks import choice
from fedlnl.methods.common import engine, robust
from fedlnl.methods.common.params import param, rule
from fedlnl.methods.fedavg import FedAvg

TRIMS = ("coordinate", "client_score")


@dataclass(frozen=True)
class TrimmedMeanParams(robust.ByzantineParams):
    """The trimmed mean's own numbers (conf/method/trimmed_mean.yaml; docs/methods/robust_aggregation.md §19.2, §19.5)."""

    trim: str = param("trim per coordinate (paper) | keep the n − 2f clients scored closest to the median (FNBench)",
                      rule(choice, TRIMS))


class TrimmedMean(robust.AssumedShare, FedAvg):
    family = "robust aggregation"

    Params = TrimmedMeanParams

    def total_rounds(self, info, rounds):
        m = engine.cohort_size(self.fl.frac, info.num_clients)
        self.params.check_rounds(m, robust.trim_max, "trimming f from each end must keep one")
        return rounds

    def aggregate(self, state, updates, ctx):
        weights = [u.weights for u in updates]
        counts = [u.num_samples for u in updates]
        f = robust.round_f(self.f, state["share"], len(weights), robust.trim_max)
        if self.trim == "coordinate":
            out = robust.coordinate_trimmed_mean(weights, f, robust.vector_keys(weights[0]))
            state["global"] = robust.with_rest(out, weights, counts)
        else:
            d2 = robust.pairwise_sq_distances(weights, robust.vector_keys(weights[0], self.integer_buffers))
            kept = robust.score_trim(d2, f)
            state["global"] = engine.weighted_average([weights[i] for i in kept], [1.0] * len(kept))
            ctx.record("trim_kept", [updates[i].client for i in kept])
        return state, {"trim_f": f}
