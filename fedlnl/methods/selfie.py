"""SELFIE as local training — Song, Kim & Lee, "SELFIE: Refurbishing Unclean Samples for Robust Deep
Learning", ICML 2019 (official code, TensorFlow: https://github.com/kaist-dmlab/SELFIE at b99f8cf,
``SELFIE/method/self_correcter.py``, ``SELFIE/algorithm/selfie.py``), federated as FNBench does it
(https://github.com/Sprinter1999/FNBench at 9cec427: ``fl_components/update.py::LocalUpdateSELFIE``,
``fl_components/correctors.py::SelfieCorrector``). Facts: docs/methods/local_lnl.md §21.

Algorithm, per mini-batch (B samples) of a client after the warm-up:
- a forward pass (train mode, no gradient) gives each sample's cross-entropy and predicted class;
- clean set C = the ⌈(1 − τ)·B⌉ smallest-loss samples, τ = ``noise_rate`` (``lnl.small_loss``);
- each sample's last q predicted classes H_x(q) give P(y|x; q) = (1/q)·#{ŷ ∈ H_x(q): ŷ = y} and the
  normalised predictive uncertainty F(x; q) = −Σ_y P log P / log M over M classes (``uncertainty``);
  a sample with F ≤ ε is refurbishable and its label becomes argmax_y P(y|x; q) (``refurbish``); a label once
  refurbished is kept and reused (both codes) until refurbished again;
- the step is taken on R ∪ C with refurbished labels on R and the given labels on C \\ R, mean CE
  over that set, from a second forward pass (as both codes);
- the pass's predictions enter the history (``history.push``).
Warm-up (the first ⌊``warmup_share``·rounds⌋ rounds): plain CE on every sample (refurbished labels
where they exist, which only happens after a restart), recording predictions.

Federated adaptation (FNBench): client k keeps the history and the refurbished labels of its own
samples across rounds (one table keyed by global sample index, ``common/history.py``; nothing of it
is uploaded); the server is FedAvg (n_k-weighted). Warm-up and restarts count global rounds
(FNBench: warm-up = int(0.2·rounds); the paper's γ = 25 of 100 epochs has no FL reading).

Fidelity switches and options
Values and sources of each key: docs/methods/local_lnl.md §23.25; what each key is: ``SELFIEParams``.

``noise_rate: noise`` reads ``FederationInfo.noise_rate`` (the rate the noise config implies; never
measured on labels; docs/methods/rofl.md R3); a number is accepted in either mode. With restarts, every run
starts from a fresh initialisation of the global model, the histories are cleared, refurbished
labels are kept (and used in the next warm-up, as the official code), and a client's τ becomes
min(τ, 1 − share of its samples refurbished), as the official code's ``compute_new_noise_ratio``
(per client here, since the refurbished labels never leave the client).

Decisions reported to the runner (scored against the oracle the method never sees): every newly
refurbished label through ``ctx.relabel(..., apply=False)`` (``relabels`` / ``relabel_acc`` count
refurbishment events; the observed labels are not changed), and the samples whose refurbished label
differs from the given one as noisy (``ctx.report_samples``). Logged per round: ``stage``
(warmup | selfie), ``refurbished`` (share of the seen samples with a refurbished label).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedlnl.conf.checks import flag, integer, number
from fedlnl.methods.common import engine, history, lnl, semisup
from fedlnl.methods.common.params import Method, Params, linear, log_range, param, rate, rule
from fedlnl.methods.common.protocol import ClientUpdate


def uncertainty(counts: torch.Tensor, q: int) -> torch.Tensor:
    """F(x; q) = −(1/log M) Σ_y P(y|x; q) log P(y|x; q), P = counts / q: 0 for a history of one class, 1
    for a uniform one (0·log 0 = 0)."""
    p = counts / q
    plogp = torch.where(p > 0, p * p.clamp_min(1e-30).log(), torch.zeros_like(p))
    return -plogp.sum(dim=1) / math.log(counts.shape[1])


def refurbish(counts: torch.Tensor, q: int, epsilon: float, eligible: torch.Tensor):
    """(refurbishable mask, refurbished labels): F(x; q) ≤ ε among ``eligible`` samples, label =
    argmax_y P(y|x; q) (the lowest class among ties, as the official code's ``np.argmax``)."""
    return (uncertainty(counts, q) <= epsilon) & eligible, counts.argmax(dim=1)


def selection(losses: torch.Tensor, keep: int, refurbished: torch.Tensor) -> torch.Tensor:
    """Positions trained on: the ``keep`` smallest-loss samples (C) ∪ the samples with a refurbished
    label (R), in position order."""
    mask = refurbished.clone()
    mask[lnl.small_loss(losses, keep)] = True
    return mask.nonzero().flatten()


@dataclass(frozen=True)
class SELFIEParams(Params):
    """SELFIE's own numbers (conf/method/selfie.yaml; docs/methods/local_lnl.md §21, L-numbers there)."""

    noise_rate: float | str = rate("τ of the clean (small-loss) share ⌈(1 − τ)·batch⌉, or noise (the nominal rate)")
    q: int = param("history length: the last q predictions per sample", rule(integer, 1))
    epsilon: float = param("uncertainty threshold ε of a refurbishable sample",
                           rule(number, lambda v: 0 <= v <= 1, "a normalised uncertainty in [0, 1]"),
                           search=log_range(0.01, 0.2, "our choice: around the official README's ε = 0.05 (from its "
                                                       "grid search, whose range is not given; docs/methods/local_lnl.md §21.4)"))
    warmup_share: float = param("warm-up rounds = ⌊warmup_share·rounds⌋",
                                rule(number, lambda v: 0 <= v <= 1, "a share of the rounds in [0, 1]"),
                                search=linear(0.1, 0.5, "our choice: around FNBench's 0.2 (the paper's 25 of 100 "
                                                        "epochs = 0.25)"))
    full_history: bool = param("L10: refurbish only with q predictions (false: empty slots count as class 0)",
                               rule(flag))
    history_first: bool = param("L11: the batch's own prediction enters its history before the decision",
                                rule(flag))
    restarts: int = param("L12: restarts from scratch keeping refurbished labels, each a full budget",
                          rule(integer, 0))


def restart_schedule(p: SELFIEParams, rnd: int, total_rounds: int) -> tuple[int, bool]:
    """(run index, warm-up?) of round ``rnd``: a run is ``total_rounds / (restarts + 1)`` rounds, the
    first ``warmup_share`` of each a warm-up."""
    per_run = max(1, total_rounds // (p.restarts + 1))
    return rnd // per_run, rnd % per_run < int(p.warmup_share * per_run)


class SELFIE(Method):
    family = "label-noise learning as local training"

    Params = SELFIEParams

    def total_rounds(self, info, rounds):
        return (self.restarts + 1) * rounds

    def init(self, model, info, ctx):
        n = int(ctx.data.x.shape[0]) if ctx.data is not None else sum(info.client_sizes)
        device = ctx.device
        return {"model": model, "global": engine.get_weights(model), "num_classes": info.num_classes,
                "history": history.new(n, self.q, device),
                "corrected": torch.full((n,), -1, dtype=torch.long, device=device),  # −1 = never refurbished
                "given": torch.full((n,), -1, dtype=torch.long, device=device),  # observed labels of seen samples
                "tau0": lnl.rate_value("noise_rate", self.noise_rate, info), "tau": {}, "run": 0}

    def sample_clients(self, state, ctx):
        run, _ = restart_schedule(self.params, ctx.round, ctx.total_rounds)
        if run > state["run"]:  # the server starts a new run (official: re-initialise, clear histories)
            fresh = semisup.fresh_copy(state["model"], engine.child_seed(ctx.generator("restart", run)), "all")
            state["global"], state["run"] = engine.get_weights(fresh), run
            history.clear(state["history"])
        return self.plan_clients(ctx)

    def plan_clients(self, ctx):
        """Who trains (also for dry_run plans): ``sample_clients`` without its restart of the server model."""
        return engine.uniform_clients(ctx.num_clients, self.fl.frac, ctx.rng("sample"))

    def client_tau(self, state, client) -> float:
        """τ of this client in the current run: min over runs of (1 − share refurbished), from τ."""
        run, tau = state["tau"].get(client.id, (0, state["tau0"]))
        if run < state["run"]:
            tau = min(tau, 1.0 - float((state["corrected"][client.indices] >= 0).float().mean()))
            state["tau"][client.id] = (state["run"], tau)
        return tau

    def batch_targets(self, state, ids, y, logits, tau: float):
        """One SELFIE step's bookkeeping on a batch of global indices ``ids`` with given labels ``y`` and
        selection-pass ``logits``: update the history and the refurbished labels, and return (positions
        trained on: C ∪ R, their targets: refurbished label on R, given label elsewhere)."""
        h, corrected = state["history"], state["corrected"]
        losses, predicted = F.cross_entropy(logits, y, reduction="none"), logits.argmax(dim=1)
        if self.history_first:
            history.push(h, ids, predicted)
        counts = history.class_counts(h, ids, state["num_classes"], empty_as=None if self.full_history else 0)
        eligible = history.full(h, ids) if self.full_history else torch.ones_like(y, dtype=torch.bool)
        ok, label = refurbish(counts, self.q, self.epsilon, eligible)
        corrected[ids] = torch.where(ok, label, corrected[ids])
        refurbished = corrected[ids] >= 0
        sel = selection(losses, lnl.keep_count(y.numel(), tau, "ceil"), refurbished)
        if not self.history_first:
            history.push(h, ids, predicted)
        return sel, torch.where(refurbished, corrected[ids], y)

    def client_update(self, state, client, ctx):
        model = state["model"]
        engine.set_weights(model, state["global"])
        h, corrected = state["history"], state["corrected"]
        _, warm = restart_schedule(self.params, ctx.round, ctx.total_rounds)
        tau = self.client_tau(state, client)
        before = corrected[client.indices].clone()
        state["given"][client.indices] = client.labels

        def warmup_loss(model, xb, yb, step, gen):
            y, ids = yb[:, 0], yb[:, 1]
            y = torch.where(corrected[ids] >= 0, corrected[ids], y)
            logits = model(xb)
            history.push(h, ids, logits.detach().argmax(dim=1))
            return F.cross_entropy(logits, y)

        def selfie_loss(model, xb, yb, step, gen):
            y, ids = yb[:, 0], yb[:, 1]
            with torch.no_grad():  # the selection pass (train mode, as both codes)
                logits = model(xb)
            sel, target = self.batch_targets(state, ids, y, logits, tau)
            if sel.numel() == 0:  # only with τ = 1 and nothing refurbished: no sample to learn from
                return model(xb).sum() * 0.0
            return F.cross_entropy(model(xb[sel]), target[sel])

        loss = engine.local_train(model, client.data, client.indices,
                                  torch.stack([client.labels, client.indices], dim=1), **self.fl.training(),
                                  gen=ctx.generator("train", client.id),
                                  loss_fn=warmup_loss if warm else selfie_loss)
        after = corrected[client.indices]
        new = after != before
        if bool(new.any()):
            ctx.relabel(client.indices[new], after[new], apply=False)
        return ClientUpdate(client.id, engine.get_weights(model), client.size, train_loss=loss)

    def aggregate(self, state, updates, ctx):
        state["global"] = engine.weighted_average([u.weights for u in updates], [u.num_samples for u in updates])
        seen = (state["given"] >= 0).nonzero().flatten()
        corrected = state["corrected"][seen]
        ctx.report_samples(seen, (corrected >= 0) & (corrected != state["given"][seen]))
        _, warm = restart_schedule(self.params, ctx.round, ctx.total_rounds)
        share = float((corrected >= 0).float().mean()) if seen.numel() else 0.0
        return state, {"stage": "warmup" if warm else "selfie", "refurbished": share}

    def eval_model(self, state):
        engine.set_weights(state["model"], state["global"])
        return state["model"]
