"""RFA — Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated Learning", IEEE TSP 2022
(arXiv 1912.13445); official code krishnap25/RFA at 40945d2 (``models/model.py::
geometric_median_update``); FNBench's adaptation (Sprinter1999/FNBench at 9cec427,
``fl_components/fed.py::RFA``) is the reference (docs/methods/robust_aggregation.md §19.3).

Algorithm (the paper's smoothed Weiszfeld iterations inside RFA): the global model is the
approximate geometric median argmin_v Σ_k α_k ‖v − w_k‖ of the client models, α_k = n_k / Σ n,
computed from v⁰ = Σ α_k w_k by β_k = α_k / max(ν, ‖v − w_k‖), v ← Σ β_k w_k / Σ β_k, at most
``max_iter`` times. The rule commutes with subtracting w_g, so it runs on the models directly.

Implementation notes
- The vector is every floating-point state-dict entry (parameters and BatchNorm statistics; the
  official TensorFlow models have no BatchNorm); integer counters are averaged as FedAvg does.
  Distances and averages are formed entry by entry: no [clients x parameters] matrix.
- Defaults from the official code: ν = 1e-5 (``eps``), stop when the objective changes by less than
  1e-6 of itself (``ftol``), and 2 Weiszfeld steps after the weighted mean (``--weiszfeld-maxiter 2``
  in every script of ``experiments/main``).
- The ``weiszfeld_steps`` value logged per evaluation is the number of steps of the last round.

Fidelity switches (paper = Pillutla et al. and their code; reference = FNBench's code)

Values and sources of each key: docs/methods/robust_aggregation.md §23.21; what each key is: ``RFAParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

from fedlnl.conf.checks import choice, flag, integer, nonnegative, positive
from fedlnl.methods.common import robust
from fedlnl.methods.common.params import Params, around, ints, param, rule
from fedlnl.methods.fedavg import FedAvg


@dataclass(frozen=True)
class RFAParams(Params):
    """RFA's own numbers (conf/method/rfa.yaml; docs/methods/robust_aggregation.md §19.3)."""

    nu: float = param("smoothing ν of the Weiszfeld weights", rule(positive, "a smoothing ν > 0"),
                      search=around(10, "our choice: ×/÷ 10 around the official code's ν = 1e-5 (docs/methods/robust_aggregation.md §19.3)"))
    max_iter: int = param("Weiszfeld steps at most", rule(integer, 0),
                          search=ints(1, 10, "our choice: from one Weiszfeld step to FNBench's 10 (official code 2; "
                                             "docs/methods/robust_aggregation.md §19.3)"))
    tol: float = param("stopping tolerance of the rule ``stop``", rule(nonnegative, "a tolerance >= 0"))
    stop: str = param("stop on the relative change of the objective | on the step length", rule(choice, robust.STOPS))
    weighted: bool = param("α_k = n_k / Σ n (false: 1/m)", rule(flag))
    per_tensor: bool = param("a separate median per state-dict tensor (false: one for the model vector)", rule(flag))


class RFA(FedAvg):
    family = "robust aggregation"

    Params = RFAParams

    def aggregate(self, state, updates, ctx):
        weights = [u.weights for u in updates]
        counts = [u.num_samples for u in updates]
        alphas = counts if self.weighted else [1.0] * len(weights)
        keys = robust.vector_keys(weights[0])
        groups = [[k] for k in keys] if self.per_tensor else [keys]
        out, steps = {}, 0
        for group in groups:
            median, done = robust.geometric_median(weights, alphas, group, nu=self.nu, max_iter=self.max_iter,
                                                   tol=self.tol, stop=self.stop)
            out.update(median)
            steps = max(steps, done)
        state["global"] = robust.with_rest(out, weights, counts)
        return state, {"weiszfeld_steps": steps}
