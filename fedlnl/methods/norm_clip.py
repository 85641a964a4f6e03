"""Norm clipping — norm thresholding of client updates (Sun, Kairouz, Suresh, McMahan, "Can You Really
Backdoor Federated Learning?", arXiv 1911.07963, 2019: "norm thresholding of updates"). No
official repository. FNBench's ``clipping`` (Sprinter1999/FNBench at 9cec427,
``fl_components/update.py::LocalUpdateClipping``) is a different rule, the reference here
(docs/methods/robust_aggregation.md §19.4).

Algorithm (paper): the server clips each client update Δ_k = w_k − w_g to norm at most M,
Δ_k / max(1, ‖Δ_k‖₂ / M), and averages the clipped updates: w_g ← w_g + Σ_k p_k Δ_k / max(1, ‖Δ_k‖/M)
with p_k = n_k / Σ n (FedAvg's weights).

Implementation notes
- Δ_k covers every floating-point state-dict entry (parameters and BatchNorm statistics: w_g + cΔ_k
  with c <= 1 keeps a running variance positive); integer counters are averaged as FedAvg does.
- M (``max_norm``): a number, or ``median`` = the median of the round's ‖Δ_k‖ (the mean of the two
  middle values for an even count). ``median`` is our choice: the paper's M is an absolute norm
  tuned to its EMNIST model, which does not carry over to other models and learning rates; the
  median clips the larger half of the updates whatever their scale, and bounds the noisy clients'
  pull while they are fewer than half. M and the share of clipped updates are logged per
  evaluation (``clip_M``, ``clipped``).
- FNBench's ``clipping`` clips nothing on the server: every local SGD step rescales the gradient to
  total norm <= ``max_grad_norm`` = 5 (``clip_grad_norm_`` before ``optimizer.step()``; the
  ``--max_grad_norm`` default), and the server averages as FedAvg (``clip: gradient``). FNBench
  runs that client under CUDA autocast (mixed precision); here it runs in float32.

Fidelity switches (paper = Sun et al.; reference = FNBench's code)

Values and sources of each key: docs/methods/robust_aggregation.md §23.22; what each key is: ``NormClipParams``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedlnl.conf.checks import choice, number, positive
from fedlnl.methods.common import engine, optimizers, robust
from fedlnl.methods.common.params import Params, param, rule
from fedlnl.methods.fedavg import FedAvg

CLIPS = ("update", "gradient")
MEDIAN = "median"


@dataclass(frozen=True)
class NormClipParams(Params):
    """Norm clipping's own numbers (conf/method/norm_clip.yaml; docs/methods/robust_aggregation.md §19.4)."""

    clip: str = param("server clips each update to norm M (update) | each local gradient to max_grad_norm",
                      rule(choice, CLIPS))
    max_norm: float | str = param("M: a norm bound, or median (the median of the round's update norms)",
                                  rule(number, lambda v: v > 0, f"{MEDIAN} or a norm bound M > 0", word=MEDIAN))
    max_grad_norm: float = param("the local gradient-norm bound of clip=gradient",
                                 rule(positive, "a gradient-norm bound > 0"))


class NormClip(FedAvg):
    family = "robust aggregation"

    Params = NormClipParams

    def client_update(self, state, client, ctx):
        opt_fn = optimizers.ClipGrad(self.max_grad_norm) if self.clip == "gradient" else None
        return engine.train_from_global(state, client, ctx, opt_fn=opt_fn, **self.fl.training())

    def aggregate(self, state, updates, ctx):
        if self.clip == "gradient":
            return super().aggregate(state, updates, ctx)
        weights = [u.weights for u in updates]
        counts = [u.num_samples for u in updates]
        keys = robust.vector_keys(weights[0])
        norms = robust.sq_distances_to(weights, state["global"], keys).sqrt().cpu()
        bound = float(engine.median_lastdim(norms)) if self.max_norm == MEDIAN else float(self.max_norm)
        scale = 1.0 / torch.clamp(norms / bound, min=1.0) if bound > 0 else torch.zeros_like(norms)
        p = torch.as_tensor(counts, dtype=torch.float64)
        coeffs = p / p.sum() * scale
        # w_g + Σ p_k c_k (w_k − w_g) = Σ p_k c_k w_k + (1 − Σ p_k c_k) w_g
        out = robust.combine(weights + [state["global"]], [*coeffs.tolist(), 1.0 - float(coeffs.sum())], keys)
        state["global"] = robust.with_rest(out, weights, counts)
        return state, {"clip_M": bound, "clipped": float((scale < 1.0).double().mean())}
