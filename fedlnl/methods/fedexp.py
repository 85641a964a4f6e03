"""FedExP — Jhunjhunwala, Wang, Joshi, "FedExP: Speeding Up Federated Averaging via Extrapolation",
ICLR 2023 (arXiv 2301.09604); official code Divyansh03/FedExP at 34b05a2 (``main.py``,
``util_general.py::LocalUpdate``); FNBench's adaptation (Sprinter1999/FNBench at 9cec427,
``fl_components/fed.py::FedExp``) is the reference (docs/methods/fedexp_fedsam.md §20.1).

Algorithm: clients train as in FedAvg and send Δ_k = w_k − w^t; the server takes the extrapolated
step w^{t+1} = w^t + η_g Δ̄ with Δ̄ = Σ_k p_k Δ_k and the adaptive server step size
    η_g = max(1, Σ_k p_k ‖Δ_k‖² / (2 (‖Δ̄‖² + ε)))
(the paper's rule with uniform p_k = 1/M: max(1, Σ‖Δ_k‖² / (2M(‖Δ̄‖² + ε)))). p_k = n_k / Σ n,
as both codes weight. η_g of the last round is logged per evaluation (``eta_g``).

Implementation notes
- ``entries: parameters`` (paper / official code): Δ_k, the norms and the extrapolation cover the
  model parameters (the official code's ``parameters_to_vector``; its models use GroupNorm);
  BatchNorm running statistics and counters are averaged as FedAvg does (extrapolating a running
  variance could make it negative).
- ``eval_average`` (official code: ``w_vec_avg``): the model evaluated after round t is the average of
  the last two global models, (w^{t+1} + w^t)/2, over the parameters (the buffers of w^{t+1}); after
  the first round, w^1 itself. The training trajectory is unchanged by it.
- ε = 1e-3 (the official code's CIFAR-10/100 value; FNBench's). The official code writes the denominator as
  ‖Δ̄‖² + M·ε and decays ε by 0.998² per round together with its local learning rate (×0.998);
  here the local learning rate is the suite's constant ``fl.lr`` (every method trains alike), so ε
  stays constant; ``eps`` = M·1e-3 reproduces the code's first-round denominator. The official
  local training (20 steps of batch 50, lr 0.01, weight decay 1e-4, gradient clipping at 10) is
  likewise replaced by the shared ``fl`` settings.

Fidelity switches (paper = the paper and its official code; reference = FNBench's code)

Values and sources of each key: docs/methods/fedexp_fedsam.md §23.23; what each key is: ``FedExPParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedlnl.conf.checks import choice, flag, positive
from fedlnl.methods.common import engine, robust
from fedlnl.methods.common.params import Params, around, param, rule
from fedlnl.methods.fedavg import FedAvg

ANCHORS = ("round", "initial")
ENTRIES = ("parameters", "all")


def server_step(sq_norms: torch.Tensor, p: torch.Tensor, sq_norm_mean: float, eps: float) -> float:
    """η_g = max(1, Σ_k p_k ‖Δ_k‖² / (2 (‖Δ̄‖² + ε))) (FedExP's server step size)."""
    return max(1.0, float((p * sq_norms).sum()) / (2.0 * (float(sq_norm_mean) + eps)))


def extrapolate(ref: torch.Tensor, avg: torch.Tensor, eta: float) -> torch.Tensor:
    """ref + η (avg − ref), in float64, cast back (integer entries rounded)."""
    out = ref.double() + eta * (avg.double() - ref.double())
    return out.to(ref.dtype) if ref.is_floating_point() else out.round().to(ref.dtype)


@dataclass(frozen=True)
class FedExPParams(Params):
    """FedExP's own numbers (conf/method/fedexp.yaml; docs/methods/fedexp_fedsam.md §20.1)."""

    eps: float = param("ε of the server step size's denominator", rule(positive, "a denominator constant ε > 0"),
                       search=around(10, "our choice: ×/÷ 10 around the official code's ε = 1e-3 (docs/methods/fedexp_fedsam.md §20.1)"))
    anchor: str = param("Δ_k = w_k − w^t (round) | w_k − w^0 every round (initial)", rule(choice, ANCHORS))
    entries: str = param("norms and extrapolation over parameters | every state-dict entry (all)",
                         rule(choice, ENTRIES))
    eval_average: bool = param("evaluate (w^{t+1} + w^t)/2 (false: the last global model)", rule(flag))


class FedExP(FedAvg):
    family = "FL baselines"

    Params = FedExPParams

    def init(self, model, info, ctx):
        state = super().init(model, info, ctx)
        state["params"] = [name for name, _ in model.named_parameters()]
        state["initial"] = engine.get_weights(model) if self.anchor == "initial" else None
        state["prev"], state["steps"] = None, 0
        return state

    def aggregate(self, state, updates, ctx):
        weights = [u.weights for u in updates]
        counts = [u.num_samples for u in updates]
        ref = state["global"] if self.anchor == "round" else state["initial"]
        keys = state["params"] if self.entries == "parameters" else list(weights[0])
        avg = engine.weighted_average(weights, counts)
        p = torch.as_tensor(counts, dtype=torch.float64)
        p = p / p.sum()
        sq = robust.sq_distances_to(weights, ref, keys).cpu()
        eta = server_step(sq, p, float(robust.sq_distances_to([avg], ref, keys)[0]), self.eps)
        new = dict(avg)
        for key in keys:
            new[key] = extrapolate(ref[key], avg[key], eta)
        state["prev"] = state["global"] if state["steps"] > 0 else None
        state["global"], state["steps"] = new, state["steps"] + 1
        return state, {"eta_g": eta}

    def eval_model(self, state):
        if not (self.eval_average and state["prev"] is not None):
            return super().eval_model(state)
        shown = dict(state["global"])
        for key in state["params"]:
            shown[key] = (state["global"][key] + state["prev"][key]) / 2
        engine.set_weights(state["model"], shown)
        return state["model"]
