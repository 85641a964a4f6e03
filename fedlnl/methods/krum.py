"""Krum / Multi-Krum — Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries:
Byzantine Tolerant Gradient Descent", NeurIPS 2017. No official repository; FNBench's adaptation
(Sprinter1999/FNBench at 9cec427, ``fl_components/fed.py::Krum``, ``pairwise_distance``) is the
reference (docs/methods/robust_aggregation.md §19.1).

Algorithm (the paper's rule, applied to the m client models of a round instead of gradients:
distances, and hence the choice, are the same for w_k and for the updates w_k − w_g)
- s(i) = Σ_{i→j} ‖V_i − V_j‖², i → j: V_j is one of the n − f − 2 vectors closest to V_i;
- Krum: the global model is the client model with the lowest score (paper's KR);
- Multi-Krum (the paper's variant): the plain average of the ``multi_m`` lowest-scored models.

Implementation notes
- V_i = every floating-point state-dict entry (parameters and BatchNorm statistics), flattened;
  pairwise distances in bounded memory (``common/robust.py``). The chosen model's integer counters
  come with it for Krum; Multi-Krum averages them as FedAvg does.
- f, the number of Byzantine clients the rule assumes (docs/methods/robust_aggregation.md §19.5): ``f`` if given, else
  ⌊``byzantine_share`` · n⌋ for the n clients of the round, where ``byzantine_share: noise`` is the
  federation's configured noisy-client share (ρ of the noise config; a mixed config's noisy groups;
  1 for real label noise), never a count made on labels. A derived f above the paper's bound
  n > 2f + 2 is lowered to ⌊(n − 3)/2⌋ (noisy-client shares of 40 % and more exceed every robust
  rule's breakdown point; the rule then runs at its limit) and the f used is logged per evaluation
  (``krum_f``); an explicit ``f`` beyond the bound, or fewer than 3 clients per round, is refused
  before training.
- Client sizes play no part (as in the paper); sampling and local training as FedAvg.

Fidelity switches (paper = Blanchard et al.; reference = FNBench's code)

Values and sources of each key: docs/methods/robust_aggregation.md §23.19; what each key is: ``KrumParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

from fedlnl.conf.checks import choice, integer
from fedlnl.methods.common import engine, robust
from fedlnl.methods.common.params import param, rule
from fedlnl.methods.fedavg import FedAvg

NEIGHBOURS = ("nearest", "all")


@dataclass(frozen=True)
class KrumParams(robust.ByzantineParams):
    """Krum's own numbers (conf/method/krum.yaml; docs/methods/robust_aggregation.md §19.1, §19.5)."""

    multi_m: int = param("Multi-Krum's m: the average of the m best-scored models; 1 = Krum", rule(integer, 1))
    neighbours: str = param("score = squared distances to the n − f − 2 nearest (paper) | to all others (FNBench)",
                            rule(choice, NEIGHBOURS))


class Krum(robust.AssumedShare, FedAvg):
    family = "robust aggregation"

    Params = KrumParams

    def total_rounds(self, info, rounds):
        m = engine.cohort_size(self.fl.frac, info.num_clients)
        if m < 3:
            raise ValueError(f"method=krum needs at least 3 clients per round (n > 2f + 2 with f = 0), "
                             f"got {m} (fl.frac × fl.num_clients): raise fl.frac")
        self.params.check_rounds(m, robust.krum_max_f, "Krum needs n > 2f + 2")
        if self.multi_m > m:
            raise ValueError(f"method.multi_m={self.multi_m} is invalid: allowed 1 <= multi_m <= {m} "
                             f"(the clients per round)")
        return rounds

    def aggregate(self, state, updates, ctx):
        weights = [u.weights for u in updates]
        f = robust.round_f(self.f, state["share"], len(weights), robust.krum_max_f)
        keys = robust.vector_keys(weights[0], self.integer_buffers)
        d2 = robust.pairwise_sq_distances(weights, keys)
        chosen = robust.krum_select(d2, f, min(self.multi_m, len(weights)), self.neighbours)
        if len(chosen) == 1:
            state["global"] = {k: v.clone() for k, v in weights[chosen[0]].items()}
        else:
            state["global"] = engine.weighted_average([weights[i] for i in chosen], [1.0] * len(chosen))
        ctx.record("krum_selected", [updates[i].client for i in chosen])
        return state, {"krum_f": f}
