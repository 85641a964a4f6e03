"""FedDyn — Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021
(https://github.com/alpemreacar/FedDyn, ``utils_methods.py::train_FedDyn``,
``utils_general.py::train_feddyn_mdl``); configured as in FedCorr (Xu et al., CVPR 2022): α = 0.01,
lr 0.1 decayed ×0.998 per round (docs/methods/feddyn.md §9).

Algorithm (paper Algorithm 1), with θ^{t−1} the server ("cloud") model sent to the clients:
- client k minimises  L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2 ‖θ − θ^{t−1}‖²            (Eq. 1 / Alg. 1)
  and updates its gradient state ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α(θ_k^t − θ^{t−1}).
- server: h^t = h^{t−1} − α/N Σ_{k∈P_t} (θ_k^t − θ^{t−1}),  θ^t = 1/|P_t| Σ_{k∈P_t} θ_k^t − h^t/α.

State is stored in the official code's scaling, which is the same algorithm: the per-client memory
``h[k]`` = −∇L_k/α_k = Σ_rounds (θ_k − θ^{t−1}) (accumulated drift), and the server's
``h_bar`` = −h/α = mean over **all N** clients of h[k]. So the local loss is
CE + α_k⟨θ, h[k] − θ^{t−1}⟩ + α_k/2‖θ‖² (= the paper's objective up to a constant); the quadratic
part is applied through SGD's weight decay (α_k + wd), exactly as the official code, so its gradient
is added after clipping. The cloud model is θ^t = avg_P(θ_k) + h_bar.

Implementation notes
- Without clipping the decay is added to the gradient by ``FusedDecay``: one op across the
  parameter tensors, the optimiser's own per-tensor decay (grad + λ·θ) bit for bit.
- h[k] lives in the method state keyed by client id (client memory), on the CPU, created lazily
  (zero until a client first trains). Memory: one parameter copy per client that has trained
  (ResNet-18 × 100 clients ≈ 4.5 GB, as the official code's ``local_param_list``).
- Only ``parameters()`` carry the dynamic regulariser (the official models have no BatchNorm);
  BatchNorm buffers are averaged uniformly over the selected clients into both models (FedCorr's
  adaptation is unknown).
- lr_t = lr · lr_decay^t with t counted from the method's own first round: as FedCorr's stage-3
  delegate (FedCorr + FedDyn, Fig. 4) ``init`` is called at the start of stage 3 with the current
  global weights, all h[k] = 0, and the decay restarts there.
- Sampling: m = max(⌊frac·N⌋, 1) clients uniformly without replacement (FedCorr's setup; a fixed
  communication cost per round) unless ``bernoulli_sampling``.

Fidelity switches (paper = FedDyn paper / FedCorr's stated setup; reference = official FedDyn code)
- ``adaptive_alpha``: false = one α for every client (paper); true = α_k = α · mean(n)/n_k (official).
- ``momentum`` / ``weight_decay`` / ``max_grad_norm``: FedCorr's global local-training setup
  (momentum ``fl.momentum``, no weight decay, no clipping) vs the official solver (plain SGD, wd
  1e-3, gradient-norm clipping at 10). Which one FedCorr ran is unknown (docs/methods/feddyn.md §9).
- ``bernoulli_sampling``: false = fixed m; true = every client independently with probability
  ``frac`` (redrawn if nobody is selected), so the cost per round varies, as the official code.
- ``eval_cloud``: true = the runner tests the cloud model θ^t (the paper's output); false = the plain
  average of the selected clients, which is what the official code reports.
Batch size and epochs follow ``fl`` (FedCorr's setup), not the official defaults (50, 5).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedlnl.conf.checks import flag, number, positive
from fedlnl.methods.common import engine
from fedlnl.methods.common.optimizers import ClipGrad, FusedDecay
from fedlnl.methods.common.params import Method, Params, among, param, rule
from fedlnl.methods.common.protocol import ClientUpdate


@dataclass(frozen=True)
class FedDynParams(Params):
    """FedDyn's own numbers (conf/method/feddyn.yaml)."""

    lr_decay: float = param("per-round factor of the local learning rate",
                            rule(number, lambda v: 0 < v <= 1, "a per-round factor in (0, 1]"))
    alpha: float = param("α: the dynamic regulariser's weight", rule(positive, "a regularisation weight α > 0"),
                         search=among([0.001, 0.01, 0.1], "FedDyn (Acar et al., ICLR 2021), appendix: α searched in "
                                                          "{0.1, 0.01, 0.001}"))
    adaptive_alpha: bool = param("α_k = α·mean(n)/n_k as the official code (false: one α)", rule(flag))
    max_grad_norm: float | None = param("local gradient-norm clip; null = none",
                                        rule(number, lambda v: v > 0, "null or a norm > 0", optional=True))
    bernoulli_sampling: bool = param("every client joins with probability frac (false: fixed m)", rule(flag))
    eval_cloud: bool = param("the runner tests the cloud model θ^t (false: the plain average)", rule(flag))


class FedDyn(Method):
    family = "FL baselines"

    Params = FedDynParams

    def init(self, model, info, ctx):
        weights = engine.get_weights(model)
        names = [n for n, _ in model.named_parameters()]
        return {
            "model": model, "cloud": weights, "avg": {k: v.clone() for k, v in weights.items()},
            "param_names": names, "h": {}, "start": ctx.round,
            "h_bar": {n: torch.zeros_like(weights[n]) for n in names},
            "sizes": np.asarray(info.client_sizes, dtype=np.float64),
        }

    def sample_clients(self, state, ctx):
        if not self.bernoulli_sampling:
            return engine.uniform_clients(ctx.num_clients, self.fl.frac, ctx.rng("sample"))
        for attempt in range(1000):  # the official code redraws until someone is active
            active = np.flatnonzero(ctx.rng("sample", attempt).uniform(size=ctx.num_clients) <= self.fl.frac)
            if active.size:
                return active.tolist()
        raise RuntimeError("FedDyn: no client drawn in 1000 Bernoulli attempts")

    def alpha_k(self, state, k: int) -> float:
        if not self.adaptive_alpha:
            return self.alpha
        sizes = state["sizes"]
        return self.alpha * float(sizes.mean() / sizes[k])  # official: α / (n_k / mean n)

    def lr_at(self, state, ctx) -> float:
        return self.fl.lr * self.lr_decay ** (ctx.round - state["start"])

    def client_update(self, state, client, ctx):
        model, names = state["model"], state["param_names"]
        engine.set_weights(model, state["cloud"])
        dev = ctx.device
        h_k = state["h"].get(client.id)
        # linear coefficient of the local objective: h_k − θ^{t−1} (official scaling)
        lin = [(h_k[n].to(dev) if h_k is not None else 0.0) - state["cloud"][n] for n in names]
        a_k = self.alpha_k(state, client.id)
        loss = self.local_solve(model, client, lin, a_k, self.lr_at(state, ctx),
                                ctx.generator("train", client.id))
        new = engine.get_weights(model)
        drift = {n: (new[n] - state["cloud"][n]).cpu() for n in names}
        if h_k is None:
            state["h"][client.id] = drift
        else:
            for n in names:  # h_k += θ_k^t − θ^{t−1}: the gradient-state update (Alg. 1)
                h_k[n].add_(drift[n].to(h_k[n].device))  # (a resumed checkpoint may map h to the device)
        return ClientUpdate(client.id, new, client.size, train_loss=loss)

    def local_solve(self, model, client, lin, a_k, lr, gen) -> float:
        """Local training (``fl.optimizer``, SGD by default) on
        CE + α_k⟨θ, lin⟩ with weight decay α_k + wd (the official solver's form, optionally clipping
        the gradient norm before the decay is applied)."""
        model.train()
        decay = a_k + self.fl.weight_decay
        run = client.data.compiled
        opt = (FusedDecay(decay)(model, self.fl.optim(lr=lr, weight_decay=0.0), run=run) if self.max_grad_norm is None
               else ClipGrad(self.max_grad_norm)(model, self.fl.optim(lr=lr, weight_decay=decay), run=run))
        params = list(model.parameters())
        idx = client.indices

        def losses():  # the batch losses, read once per update (engine.train_steps)
            engine.device_generator(gen, idx.device, fresh=True)
            for _ in range(self.fl.local_epochs):
                for pos, xb in engine.epoch_batches(client.data, idx, self.fl.batch_size, gen, augment=self.fl.augment,
                                                    memory_format=torch.contiguous_format):
                    loss = F.cross_entropy(model(xb), client.labels[pos])
                    yield loss + a_k * engine.linear_term(params, lin)

        values = engine.train_steps(model, opt, gen, losses)
        if values and not math.isfinite(values[-1]):
            return float("nan")
        total = 0.0
        for v in values:
            total += v
        return total / max(len(values), 1)

    def aggregate(self, state, updates, ctx):
        names = state["param_names"]
        avg = engine.weighted_average([u.weights for u in updates], [1.0] * len(updates))
        for n in names:  # h_bar += 1/N Σ_{k∈P} (θ_k − θ^{t−1}), i.e. h^t of Alg. 1 scaled by −1/α
            drift = sum(u.weights[n] - state["cloud"][n] for u in updates)
            state["h_bar"][n].add_(drift / ctx.num_clients)
        cloud = dict(avg)
        for n in names:  # θ^t = avg + h_bar  (= avg − h^t/α)
            cloud[n] = avg[n] + state["h_bar"][n]
        state["avg"], state["cloud"] = avg, cloud
        return state, {"lr": self.lr_at(state, ctx)}

    def eval_model(self, state):
        engine.set_weights(state["model"], state["cloud"] if self.eval_cloud else state["avg"])
        return state["model"]
