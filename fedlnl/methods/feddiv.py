"""FedDiv — Li, Li, Cheng, Liao, Yu, "FedDiv: Collaborative Noise Filtering for Federated Learning
with Noisy Labels", AAAI 2024 (arXiv 2312.12263). Official code: https://github.com/lijichang/FLNL-FedDiv
(folder ``code release/``, commit 918624c). Facts: docs/methods/feddiv.md §3 (code), §3.5 (hyperparameters), §3.6
(divergences), docs/methods/paper_tables.md §16 (Tables 1–5).

Algorithm (runner rounds; N clients, m = max(⌊ω·N⌋, 1) per training round)
- Warm-up, 𝒯_wu iterations = 𝒯_wu·N rounds: every iteration visits the clients in a fresh random
  order, one client per round; it trains the current global model (mixup + η·prior regulariser) and
  its model *becomes* the global model (sequential, as FedCorr stage 1; "aggregation" is a copy).
- Training, 𝒯 rounds of m clients. Client k:
  1. per-sample losses of the global model θ on D_k; the **global noise filter** (2-component 1-D
     GMM) gives the posterior of its low-mean ("clean") component; clean iff posterior ≥ 0.5
     (Eq. 7). δ̂_k = share not clean; k is a noisy client iff δ̂_k > 0.1 (Eq. 11 / text).
  2. noisy clients only: GMM-noisy samples with global confidence max p(x; θ) ≥ ζ get the pseudo
     label argmax p(x; θ) (Eq. 8); the other noisy samples are dropped. Clean clients train on
     everything with their labels.
  3. Predictive Consistency Sampler (PCS): keep a clean or relabelled sample iff the global
     prediction equals the de-biased local prediction argmax[f(x; θ̂_k) − ξ·log p̂_k], where p̂_k is
     the client's running mean prediction, p̂_k ← m·p̂_k + (1−m)·mean softmax f(x; θ̂_k) (Eq. 12),
     uniform 1/C at first and kept per client across rounds.
  4. local training: mixup (α = 1) + η·KL(u ‖ q̄), q̄ the batch mean of softmax(f(x̃)) and u uniform
     (L_mix of Eq. 13 plus the class-prior regulariser; η = 1 non-IID, 0 IID).
  5. local filter: a 2-component GMM fitted on the trained local model's losses, warm-started from
     the global filter; its (means, variances, weights) are uploaded (``ClientUpdate.payload``).
- Server: FedAvg of the models (weights n_k = |D_k|); federated filter (Eq. 5) = γ-weighted
  average, γ_k = n_k/Σn, of the cached filters of **every client seen so far** in the training
  phase (a cached filter never expires): μ = Σγμ_k, σ² = Σγσ_k², π = Σγπ_k.
- The initial global filter is the reference construction, seeded (docs/methods/feddiv.md §3.4, D2): an M-step
  from random responsibilities on 1000 points of two 1-D Gaussian blobs, standardised and min-max
  scaled; its components are almost identical, so the first training round's split is arbitrary.
  It lives on [0, 1]: the reference feeds it min-max-scaled losses (D5, the default). With raw
  losses (``normalize_losses: false``) a client applies it mapped onto its own loss range
  (``on_loss_scale``: μ → lo + μ(hi − lo), σ² → σ²(hi − lo)²), which gives exactly the posteriors
  the [0, 1] filter gives the scaled losses; a raw-loss [0, 1] filter would make the first round's
  split depend on the seed (some seeds flag nearly every sample). Once a filter has been aggregated
  from local fits it is on the raw scale already.

Stage lengths and communication cost
- ``fl.rounds`` is the FedAvg-equivalent budget (handed to ``total_rounds``). Unless ``training_rounds`` sets 𝒯,
  𝒯 = rounds − ⌈𝒯_wu/ω⌉, the paper's accounting of 𝒯_wu iterations as 𝒯_wu/ω rounds, so FedDiv and
  FedAvg spend the same number of client participations whenever ω·N is an integer (CIFAR-10:
  5 + 950 ↔ 1000, CIFAR-100: 10 + 900 ↔ 1000, Clothing1M: 2 + 100 ↔ 200; Table 7).
- ``aggregate`` reports ``stage`` = ``warmup`` | ``training``.

Table 5 variants are flags (all off = FedDiv). Fidelity switches: ``${fidelity:<paper>,<reference>}``,
``fidelity=reference`` flips all, each can be set alone as ``method.<switch>=...``. Where the paper is
silent (D5, ``augment_passes``, D14, D15) both fidelities use the code's behaviour and the other one is
an option. Each key's paper and reference values, with their sources: docs/methods/feddiv.md §23.6 (the table
of conf/method/feddiv.yaml) and §3.6 (D-numbers); what each key is: the field docs of ``FedDivParams``.
docs/feddiv_official.md has the evidence (a raw-loss filter fitted on local losses and applied to the
global model's larger losses flags nearly every sample). ``align_components`` is not a listed
divergence: Eq. 5 presumes component j of every client is the same component; the reference averages
by index, which equals sorting whenever no local EM swapped the components.

Other implementation notes and deviations
- Relabels in the paper mode are client-local and last one round; they are *scored* each round
  through ``ctx.relabel(idx, labels, apply=False)`` (counted and compared with the clean labels by the
  runner, not applied), so ``relabels``/``relabel_acc`` count relabel events over rounds. With
  ``persistent_relabels`` they are applied and each changed label counts once.
- Filtering always uses the *global* model's pre-training losses and the local filter is fitted on the
  *local* post-training losses (both paper text and code, D7). The post-training losses use the
  client's current labels (with this round's persistent relabels applied, as the code does).
- p̂_k is updated where de-biased predictions are made: once per participation after training
  (``cached``, every client, as the code) or once per local epoch while PCS is active (``per_epoch``).
- L_mix is a batch mean in both modes (Eq. 13 writes a sum, i.e. only a learning-rate scale).
- A client that trains on nothing sends the global weights; its aggregation weight stays n_k = |D_k|
  (as the code, D15); its reported train loss is then the global model's mean CE on its data.
- A constant loss vector (min-max range 0) normalises to zeros instead of the code's NaN.
- The initial filter and the local GMM fits take their seeds from ``ctx.rng`` (D2, D19 fixed).
- Mixup is used in both stages (the code's ``--mixup``); docs/methods/feddiv.md §3.1. The regulariser applies in
  the warm-up too (the code's ``--reg`` acts in every ``update_weights`` call).
- ζ = 0.75 as the main text and the sensitivity figure (the supplement also names 0.70).
- The "Local filter" variant is read as "no federated filter": a client's filter only ever sees its
  own losses; the paper does not say how it starts, so the first one is a fresh EM fit (k-means
  initialisation) on the client's current losses.
- Not applicable here: D16 (label noise lives in ``noise=``), D17 (model), D18 (sklearn subclass),
  D20 (paper typos).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedlnl.conf.checks import choice, fail, flag, integer, nonnegative, number, positive, unit
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Method, Params, linear, param, rule
from fedlnl.methods.common.protocol import ClientUpdate, UpdatePlan, local_steps

PCS_MODES = ("per_epoch", "cached")
VARIANCE_WEIGHTS = ("gamma", "gamma_squared")


# ------------------------------------------------------------------------------- noise filter
# A filter is {"means": (2,), "variances": (2,), "weights": (2,)} float64 arrays (1-D, 2 components).
def make_filter(means, variances, weights) -> dict[str, np.ndarray]:
    return {"means": np.asarray(means, np.float64).reshape(2),
            "variances": np.asarray(variances, np.float64).reshape(2),
            "weights": np.asarray(weights, np.float64).reshape(2)}


def gmm_posterior(x: np.ndarray, f: dict) -> np.ndarray:
    """Posterior responsibilities [n, 2] of a 1-D GMM, computed in the log domain."""
    x = np.asarray(x, np.float64).reshape(-1, 1)
    var = f["variances"][None, :]
    log_pdf = -0.5 * (np.log(2 * np.pi * var) + (x - f["means"][None, :]) ** 2 / var)
    log_joint = np.log(np.clip(f["weights"], 1e-300, None))[None, :] + log_pdf
    log_joint -= log_joint.max(axis=1, keepdims=True)
    post = np.exp(log_joint)
    return post / post.sum(axis=1, keepdims=True)


def clean_posterior(x: np.ndarray, f: dict) -> np.ndarray:
    """Posterior of the low-mean component: the probability that a sample's label is clean."""
    return gmm_posterior(x, f)[:, int(np.argmin(f["means"]))]


def aggregate_filters(filters: list[dict], sizes, variance_weights: str) -> dict:
    """Federated noise filter, Eq. 5: γ_k = n_k / Σn; μ = Σγμ_k, π = Σγπ_k and σ² = Σγσ_k²
    (``gamma``, the paper) or Σγ²σ_k² (``gamma_squared``, the reference code, D4)."""
    g = np.asarray(sizes, np.float64)
    g = g / g.sum()
    gv = g if variance_weights == "gamma" else g ** 2
    stack = lambda key: np.stack([f[key] for f in filters])  # noqa: E731  [K, 2]
    return make_filter(g @ stack("means"), gv @ stack("variances"), g @ stack("weights"))


def sort_components(f: dict) -> dict:
    """The same filter with its components ordered by mean (clean first)."""
    o = np.argsort(f["means"], kind="stable")
    return make_filter(f["means"][o], f["variances"][o], f["weights"][o])


def initial_filter(rng: np.random.Generator, reg_covar: float, n: int = 1000) -> dict:
    """The reference's initial filter (docs/methods/feddiv.md §3.4), seeded: one M-step from random
    responsibilities on two 1-D Gaussian blobs, standardised then min-max scaled."""
    from sklearn.datasets import make_blobs

    x, _ = make_blobs(n_samples=n, n_features=1, centers=2, shuffle=False,
                      random_state=int(rng.integers(2**31 - 1)))
    x = (x[:, 0] - x.mean()) / x.std()
    x = (x - x.min()) / (x.max() - x.min())
    resp = rng.uniform(size=(n, 2))
    resp /= resp.sum(axis=1, keepdims=True)
    nk = resp.sum(axis=0) + 10 * np.finfo(np.float64).eps
    means = resp.T @ x / nk
    variances = (resp * (x[:, None] - means[None, :]) ** 2).sum(axis=0) / nk + reg_covar
    return make_filter(means, variances, nk / n)


def fit_filter(x: np.ndarray, init: dict | None, max_iter: int, tol: float, reg_covar: float,
               seed: int) -> dict:
    """EM for a 2-component 1-D GMM (scikit-learn), warm-started from ``init`` (Algorithm 2), or
    from scikit-learn's k-means initialisation when ``init`` is None."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    x = np.asarray(x, np.float64).reshape(-1, 1)
    if x.shape[0] < 2:  # EM needs at least one sample per component
        return init if init is not None else make_filter([0.0, 1.0], [1.0, 1.0], [0.5, 0.5])
    kw = {}
    if init is not None:
        w = np.clip(init["weights"], 1e-12, None)
        kw = dict(weights_init=w / w.sum(), means_init=init["means"][:, None],
                  precisions_init=(1.0 / init["variances"])[:, None, None], init_params="random")
    gm = GaussianMixture(2, covariance_type="full", max_iter=int(max_iter), tol=float(tol),
                         reg_covar=float(reg_covar), random_state=int(seed), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gm.fit(x)
    return make_filter(gm.means_[:, 0], gm.covariances_[:, 0, 0], gm.weights_)


def on_loss_scale(f: dict, x: np.ndarray) -> dict:
    """The initial filter, built on [0, 1]-scaled losses (§3.4), in the units of the raw losses
    ``x``: μ → lo + μ (hi − lo), σ² → σ² (hi − lo)². A GMM's posteriors are invariant under an affine
    map of data and parameters, so raw losses get the split the [0, 1] construction gives min-max
    scaled ones (without it, raw losses far outside [0, 1] land in one component by seed)."""
    lo, hi = float(x.min()), float(x.max())
    span = hi - lo if hi > lo else 1.0
    return make_filter(lo + f["means"] * span, f["variances"] * span**2, f["weights"])


def minmax(x: np.ndarray) -> np.ndarray:
    """Min-max scaling to [0, 1] (the reference's per-client normalisation, D5); zeros if constant."""
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def filter_input(loss: torch.Tensor, normalize: bool) -> np.ndarray:
    """The per-sample losses the client filter is fitted on and applied to, as float64: min-max
    scaled per client (``normalize``, D5) or raw."""
    x = loss.detach().double().cpu().numpy()
    return minmax(x) if normalize else x


def passes(values, threshold: float, strict: bool):
    """``values > threshold`` (reference code) or ``values ≥ threshold`` (Eqs. 7, 8)."""
    return values > threshold if strict else values >= threshold


# ------------------------------------------------------------------------------- PCS and p̂
def debias(logits: torch.Tensor, phat: torch.Tensor, xi: float) -> torch.Tensor:
    """De-biased probabilities softmax(f(x) − ξ·log p̂_k) (counterfactual de-biasing of PCS)."""
    return torch.softmax(logits - xi * torch.log(phat)[None, :], dim=1)


def update_phat(phat: torch.Tensor, probs: torch.Tensor, m: float,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """p̂_k ← m·p̂_k + (1−m)·mean of ``probs`` (Eq. 12); over ``mask`` only if given (D12), and
    unchanged when the mask selects nothing."""
    if mask is not None:
        if not bool(mask.any()):
            return phat
        probs = probs[mask]
    return m * phat + (1.0 - m) * probs.mean(dim=0)


def pcs_keep(global_pred: torch.Tensor, debiased_local_pred: torch.Tensor) -> torch.Tensor:
    """Predictive consistency: the global prediction equals the de-biased local prediction."""
    return global_pred == debiased_local_pred


def relabel_candidates(noisy: torch.Tensor, conf: torch.Tensor, zeta: float, strict: bool):
    """GMM-noisy samples whose global confidence passes ζ (Eq. 8)."""
    return noisy & passes(conf, zeta, strict)


# ------------------------------------------------------------------------------- losses
def sample_loss(logits: torch.Tensor, labels: torch.Tensor, on_softmax: bool) -> torch.Tensor:
    """Per-sample CE on logits, or on softmax probabilities as the reference code (D6)."""
    return engine.per_sample_loss(logits.softmax(1) if on_softmax else logits, labels)


def prior_kl(logits: torch.Tensor) -> torch.Tensor:
    """The class-prior regulariser KL(u ‖ q̄) = Σ_c u_c log(u_c / q̄_c): q̄ the batch mean of
    softmax(logits), u the uniform prior (as the reference's ``regularization_penalty``)."""
    c = logits.shape[1]
    log_qbar = torch.logsumexp(F.log_softmax(logits, dim=1), dim=0) - math.log(logits.shape[0])
    return (-math.log(c) - log_qbar).mean()


# ------------------------------------------------------------------------------- the method
def _flag(doc: str):
    return param(doc, rule(flag))


def _share(doc: str):
    return param(doc, rule(unit), convert=float)


def _nonneg(doc: str):
    return param(doc, rule(nonnegative), convert=float)


@dataclass(frozen=True)
class FedDivParams(Params):
    """FedDiv's own numbers (conf/method/feddiv.yaml names each value's source; docs/methods/feddiv.md §3.5-3.7,
    D-numbers there)."""

    training_rounds: int | None = param("𝒯 = 𝒯_ft + 𝒯_ut training rounds; null = fl.rounds minus the warm-up",
                                        rule(integer, 1, optional=True))
    warmup_iterations: int = param("𝒯_wu warm-up iterations, each visits every client once",
                                   rule(integer, 0), convert=int)
    mixup_alpha: float = param("α of mixup's Beta(α, α)", rule(positive, "a Beta concentration > 0"), convert=float)
    eta: float = _nonneg("η of the class-prior regulariser L_reg (Eq. 15)")
    posterior_threshold: float = param("clean iff the clean-component posterior ≥ it (Eq. 7)", rule(unit),
                                       search=linear(0.3, 0.7, "our choice: around Eq. 7's 0.5"))
    noisy_client_threshold: float = param("noisy client iff δ̂_k > it (text before Eq. 8)", rule(unit),
                                          search=linear(0.05, 0.3, "our choice: around the 0.1 of the text before "
                                                                   "Eq. 8"))
    zeta: float = param("ζ: global confidence a relabel needs (Eq. 8)", rule(unit), convert=float,
                        search=linear(0.5, 0.95, "FedDiv: ζ = 0.75 (Implementation, sensitivity figure), 0.70 "
                                                 "(supplement); our range around them"))
    xi: float = _nonneg("ξ of the de-biased local prediction (Eq. 9)")
    m: float = param("m: momentum of the running mean prediction p̂_k (Eq. 12)",
                     rule(number, lambda v: 0.0 <= v < 1.0, "a momentum in [0, 1)"), convert=float)
    reg_covar: float = param("GMM variance floor", rule(positive), convert=float)
    degraded: bool = _flag("Table 5 variant: aggregate only this round's local filters")
    local_filter: bool = _flag("Table 5 variant: each client filters with its own filter")
    relabel: bool = _flag("Table 5 variant: false = w/o relabelling")
    pcs: bool = _flag("Table 5 variant: false = w/o PCS")
    regularizer: bool = _flag("Table 5 variant: false = w/o reg (η = 0)")
    variance_weights: str = param("D4: σ² = Σγσ_k² (gamma) | Σγ²σ_k² (gamma_squared)",
                                  rule(choice, VARIANCE_WEIGHTS))
    em_max_iter: int = param("D3: EM steps of the filter fits at most", rule(integer, 1), convert=int)
    em_tol: float = _nonneg("D3: EM convergence tolerance")
    normalize_losses: bool = _flag("D5: per-client min-max of the losses to [0, 1]")
    loss_on_softmax: bool = _flag("D6: cross-entropy of the softmax (false: of the logits)")
    augment_passes: bool = _flag("D6: loss and prediction passes on augmented views")
    strict_thresholds: bool = _flag("D8: posterior > 0.5, confidence > ζ (false: ≥)")
    pcs_mode: str = param("D9: PCS every local epoch (per_epoch) | once per round vs cached labels (cached)",
                          rule(choice, PCS_MODES))
    curriculum: bool = _flag("D10: PCS and relabels only from the first curriculum_participations on")
    curriculum_participations: int = param("D10: the first participations the curriculum spares",
                                           rule(integer, 0), convert=int)
    curriculum_min_noise: float = param("D10: relabelled samples used only if δ̂ > it", rule(unit))
    persistent_relabels: bool = _flag("D11: relabels replace the client's data for later rounds")
    phat_conf_mask: float | None = param("D12: p̂ over samples with de-biased confidence > it; null = all",
                                         rule(number, lambda v: 0.0 <= v < 1.0, "null or a confidence in [0, 1)",
                                              optional=True))
    eta_twice: bool = _flag("D13: η·(η·KL) as the code (false: η·KL, Eq. 15)")
    unmixed_forward: bool = _flag("D14: an extra un-mixed forward pass (moves BN statistics)")
    skip_small_subsets: bool = _flag("D15: ≤ batch_size selected samples -> send the global model")
    align_components: bool = _flag("component 1 is the smaller-mean one (false: averaged by index)")


class FedDiv(Method):
    family = "federated label-noise methods"
    Params = FedDivParams

    def __init__(self, fl, *args, **values):
        super().__init__(fl, *args, **values)
        # with 𝒯 given, fl.rounds (the FedAvg-equivalent budget) is not read
        self.fl_unused = {} if self.training_rounds is None else {
            "rounds": f"its schedule is method.warmup_iterations x N + method.training_rounds={self.training_rounds}"}
        # η·KL, or η·(η·KL) as the reference applies the coefficient twice (D13); 0 = "w/o reg"
        self.eta_eff = (self.eta ** 2 if self.eta_twice else self.eta) if self.regularizer else 0.0
        self.strict = self.strict_thresholds

    # ---------------------------------------------------------------- stages
    def _warmup_rounds(self, n: int) -> int:
        return self.warmup_iterations * n

    def training_length(self, rounds: int) -> int:
        """𝒯: given, or the budget ``rounds`` (fl.rounds) left after the warm-up counted as 𝒯_wu/ω
        rounds (the paper's accounting, so FedDiv and FedAvg spend the same communication)."""
        if self.training_rounds is not None:
            return int(self.training_rounds)
        T = int(rounds) - math.ceil(self.warmup_iterations / self.fl.frac - 1e-9)
        if T < 1:
            fail("method.training_rounds", None,
                 f"an integer >= 1 (null derives fl.rounds - T_wu/frac = {T}; raise fl.rounds or set it)")
        return T

    def total_rounds(self, info, rounds):
        self.T = self.training_length(rounds)
        return self._warmup_rounds(info.num_clients) + self.T

    def _in_warmup(self, ctx) -> bool:
        return ctx.round < self._warmup_rounds(ctx.num_clients)

    # ---------------------------------------------------------------- hooks
    def init(self, model, info, ctx):
        return {
            "model": model, "global": engine.get_weights(model), "num_classes": info.num_classes,
            "filter": initial_filter(ctx.rng("initial_filter"), self.reg_covar),
            "cache": {},  # server: latest local filter per client ever seen (Eq. 5)
            "clients": {},  # client side: p̂_k, participation count, cached de-biased labels, own filter
            "pending": {},  # this round's noise decisions, reported in aggregate
            "perm": None, "perm_iter": -1,
        }

    def sample_clients(self, state, ctx):
        n = ctx.num_clients
        if self._in_warmup(ctx):
            it, pos = divmod(ctx.round, n)
            if state["perm_iter"] != it:  # a fresh random order of all clients per warm-up iteration
                state["perm"], state["perm_iter"] = self._warmup_order(ctx, it), it
            return [int(state["perm"][pos])]
        return engine.uniform_clients(n, self.fl.frac, ctx.rng("sample"))

    def _warmup_order(self, ctx, it: int) -> np.ndarray:
        """The client order of warm-up iteration ``it``, drawn at its first round."""
        first = dataclasses.replace(ctx, round=it * ctx.num_clients)
        return first.rng("warmup", it).permutation(ctx.num_clients)

    # ---------------------------------------------------------------- plans (dry_run)
    def plan_clients(self, ctx):
        """``sample_clients`` without its cached order."""
        if self._in_warmup(ctx):
            it, pos = divmod(ctx.round, ctx.num_clients)
            return [int(self._warmup_order(ctx, it)[pos])]
        return engine.uniform_clients(ctx.num_clients, self.fl.frac, ctx.rng("sample"))

    def plan_update(self, ctx, k, info, model):
        """``fl.local_epochs`` passes; in the training phase over the samples the filter keeps
        (known only then: an upper bound), uploading the filter's GMM unless filters stay local."""
        steps = local_steps(info.client_sizes[k], self.fl.local_epochs, self.fl.batch_size)
        if self._in_warmup(ctx):
            return UpdatePlan(steps)
        payload = 0 if self.local_filter else engine.payload_bytes({"filter": make_filter([0, 0], [1, 1], [1, 1])})
        return UpdatePlan(steps, payload=payload, exact=False)

    def client_update(self, state, client, ctx):
        if self._in_warmup(ctx):
            return self._warmup_client(state, client, ctx)
        return self._training_client(state, client, ctx)

    def aggregate(self, state, updates, ctx):
        state["global"] = engine.weighted_average(
            [u.weights for u in updates], [u.num_samples for u in updates])
        if self._in_warmup(ctx):  # one client: the global model becomes its model
            return state, {"stage": "warmup"}
        if not self.local_filter:
            for u in updates:
                state["cache"][u.client] = make_filter(**u.payload["filter"])
            keys = [u.client for u in updates] if self.degraded else sorted(state["cache"])
            state["filter"] = aggregate_filters([state["cache"][k] for k in keys],
                                                [ctx.client_sizes[k] for k in keys], self.variance_weights)
            f = state["filter"]
            ctx.record("filter", {"round": ctx.round + 1, "clients": len(keys), **{
                key: v.tolist() for key, v in f.items()}})
        return state, self._report(state, ctx)

    def eval_model(self, state):
        engine.set_weights(state["model"], state["global"])
        return state["model"]

    # ---------------------------------------------------------------- warm-up
    def _warmup_client(self, state, view, ctx):
        model = state["model"]
        engine.set_weights(model, state["global"])
        pos = torch.arange(view.size, device=view.indices.device)
        # D15's skip is a training-phase rule (main.py:254): the warm-up trains every client on all its data
        loss = self.local_train(model, view, view.labels, lambda epoch: pos, ctx.generator("train", view.id),
                                 skip_small=False)
        return ClientUpdate(view.id, engine.get_weights(model), view.size, train_loss=loss)

    # ---------------------------------------------------------------- training phase
    def _training_client(self, state, view, ctx):
        k, idx, y = view.id, view.indices, view.labels
        c = state["num_classes"]
        cs = state["clients"].setdefault(k, {"phat": torch.full((c,), 1.0 / c, device=idx.device), "count": 0})
        model = state["model"]
        engine.set_weights(model, state["global"])
        # 1. filter the global model's losses (Eq. 7); δ̂_k and the noisy-client test (Eq. 11)
        logits_g = self._predict(model, view, ctx.generator("prepass", k))
        conf, yhat = logits_g.softmax(1).max(1)
        filt, clean, delta = self._split(state, cs, sample_loss(logits_g, y, self.loss_on_softmax), ctx, k)
        noisy_client = delta > self.noisy_client_threshold
        # 2-3. relabels (Eq. 8), the base training set and PCS
        base, use_pcs, relabeled = self._plan(cs, clean, conf, yhat, delta, noisy_client)
        self._announce_relabels(ctx, idx, yhat, relabeled, base)
        train_y = y.clone()
        train_y[relabeled] = yhat[relabeled]
        # 4. local training on the selected samples
        select, sizes = self._selector(model, view, cs, base, use_pcs, yhat, ctx), []

        def counted(epoch):
            pos = select(epoch)
            sizes.append(int(pos.numel()))
            return pos
        loss = self.local_train(model, view, train_y, counted, ctx.generator("train", k))
        if loss is None:  # nothing selected: the client sends the global model back (D15)
            loss = float(F.cross_entropy(logits_g, y))
        # 5. post-training pass: cached de-biased labels and p̂, then the local filter (Alg. 2)
        local = self._after_training(model, view, cs, filt, train_y if self.persistent_relabels else y, ctx)
        cs["count"] += 1
        share = float(np.mean(sizes)) / view.size if sizes else 0.0  # mean share trained on per epoch
        state["pending"][k] = {"delta": delta, "noisy": noisy_client, "idx": idx, "flagged": ~clean,
                               "share": share}
        payload = {}
        if self.local_filter:
            cs["filter"] = local
        else:
            payload = {"filter": {key: v.copy() for key, v in local.items()}}
        return ClientUpdate(k, engine.get_weights(model), view.size, payload=payload,
                            metrics={"delta_hat": delta, "train_share": share}, train_loss=loss)

    def _split(self, state, cs, loss, ctx, k):
        """(filter used, clean mask, δ̂_k): clean iff the clean-component posterior passes 0.5."""
        x = filter_input(loss, self.normalize_losses)
        filt = self._client_filter(state, cs, x, ctx, k)
        clean = passes(clean_posterior(x, filt), self.posterior_threshold, self.strict)
        return filt, torch.as_tensor(clean, device=loss.device), 1.0 - float(clean.mean())

    def _plan(self, cs, clean, conf, yhat, delta, noisy_client):
        """(base training mask, whether PCS filters it, relabelled mask). Clean clients train on
        everything; noisy ones on clean ∪ relabel candidates, PCS on top (curriculum: D10)."""
        none = torch.zeros_like(clean)
        if not noisy_client:
            return torch.ones_like(clean), False, none
        cand = relabel_candidates(~clean, conf, self.zeta, self.strict) if self.relabel else none
        if self.curriculum and cs["count"] < self.curriculum_participations:
            base, use_pcs = clean, False  # the first participations: GMM-clean samples only
        else:
            with_relabels = not (self.curriculum and delta <= self.curriculum_min_noise)
            base, use_pcs = clean | (cand if with_relabels else none), self.pcs
        if "cached" not in cs:  # D9: the cached de-biased labels start as the global prediction
            cs["cached"] = yhat.clone()
        if self.persistent_relabels and self.pcs and self.pcs_mode == "cached":
            cand = cand & pcs_keep(yhat, cs["cached"])  # D11: the PCS-consistent ones are written
        return base, use_pcs, cand

    def _announce_relabels(self, ctx, idx, yhat, relabeled, base):
        """Persistent relabels are applied by the runner (D11, even those unused this round); per-round
        ones (paper) are only scored, those that enter this round's training set."""
        if self.persistent_relabels:
            if bool(relabeled.any()):
                ctx.relabel(idx[relabeled], yhat[relabeled])
        elif bool((used := relabeled & base).any()):
            ctx.relabel(idx[used], yhat[used], apply=False)

    def _after_training(self, model, view, cs, filt, labels, ctx) -> dict:
        """Post-training pass of the local model: with cached PCS, its de-biased labels and the p̂
        update (Eq. 12; D12 mask); then the local filter, warm-started from ``filt`` (Alg. 2)."""
        logits = self._predict(model, view, ctx.generator("postpass", view.id))
        if self.pcs_mode == "cached":
            deb = debias(logits, cs["phat"], self.xi)
            cs["cached"] = deb.argmax(1)
            cs["phat"] = update_phat(cs["phat"], logits.softmax(1), self.m, self._phat_mask(deb))
        x = filter_input(sample_loss(logits, labels, self.loss_on_softmax), self.normalize_losses)
        local = fit_filter(x, filt, self.em_max_iter, self.em_tol, self.reg_covar,
                           int(ctx.rng("gmm", view.id).integers(2**31 - 1)))
        return sort_components(local) if self.align_components else local

    def _phat_mask(self, deb):
        return deb.max(1).values > self.phat_conf_mask if self.phat_conf_mask is not None else None

    def _client_filter(self, state, cs, x, ctx, k) -> dict:
        """The filter a client applies: the global one, or (``local_filter``) its own, fitted from
        scratch on its first participation."""
        if not self.local_filter:
            if not state["cache"] and not self.normalize_losses:  # still the initial filter
                return on_loss_scale(state["filter"], x)
            return state["filter"]
        if "filter" not in cs:
            f = fit_filter(x, None, self.em_max_iter, self.em_tol, self.reg_covar,
                           int(ctx.rng("gmm_init", k).integers(2**31 - 1)))
            cs["filter"] = sort_components(f) if self.align_components else f
        return cs["filter"]

    def _selector(self, model, view, cs, base, use_pcs, yhat, ctx):
        """epoch -> positions to train on. Cached PCS keeps samples whose global prediction equals
        the cached de-biased label; PCS per epoch de-biases the predictions of the model being
        trained and updates p̂_k with them (Alg. 1 l. 15–16, Eq. 12)."""
        if not use_pcs or self.pcs_mode == "cached":
            fixed = (base & pcs_keep(yhat, cs["cached"]) if use_pcs else base).nonzero().squeeze(1)
            return lambda epoch: fixed

        def per_epoch(epoch):
            logits = self._predict(model, view, ctx.generator("pcs", view.id, epoch))
            deb = debias(logits, cs["phat"], self.xi)
            cs["phat"] = update_phat(cs["phat"], logits.softmax(1), self.m, self._phat_mask(deb))
            return (base & pcs_keep(yhat, deb.argmax(1))).nonzero().squeeze(1)
        return per_epoch

    # ---------------------------------------------------------------- shared pieces
    def _predict(self, model, view, gen):
        return engine.predict(model, view.data, view.indices, self.fl.eval_batch_size,
                              augment=self.augment_passes, gen=gen)

    def _batch_loss(self, model, xb, yb, gen):
        """L_mix (mixup CE, Eq. 13) + η·KL(u ‖ q̄) on the mixed batch."""
        if self.unmixed_forward:  # D14: the reference's unused forward still moves BN statistics
            with torch.no_grad():
                model(xb)
        xm, ya, yb2, lam = engine.mixup(xb, yb, self.mixup_alpha, gen)
        logits = model(xm)
        loss = engine.mixup_ce(logits, ya, yb2, lam)
        if self.eta_eff > 0:
            loss = loss + self.eta_eff * prior_kl(logits)
        return loss

    def local_train(self, model, view, labels, select, gen, skip_small=True):
        """A client's local training (the warm-up's and each round's): SGD over ``local_epochs`` with
        one optimiser (momentum kept across epochs, as ``engine.local_train``) on the positions
        ``select(epoch)`` returns, with ``labels`` (the client's, after relabelling); mean batch loss,
        nan if diverged, None if no step was taken."""
        model.train()
        opt = engine.optimizer(model, self.fl.optim(), run=view.data.compiled)
        total, count = 0.0, 0
        for epoch in range(self.fl.local_epochs):
            pos = select(epoch)
            if pos.numel() == 0 or (skip_small and self.skip_small_subsets and pos.numel() <= self.fl.batch_size):
                continue
            sub_y = labels[pos]
            losses = engine.epoch_loop(
                model, opt, view.data, view.indices[pos], batch_size=self.fl.batch_size, gen=gen,
                augment=self.fl.augment, loss_fn=lambda m, xb, b: self._batch_loss(m, xb, sub_y[b], gen))
            if losses and not math.isfinite(losses[-1]):
                return float("nan")
            total, count = total + sum(losses), count + len(losses)
        return total / count if count else None

    def _report(self, state, ctx) -> dict:
        """Noise decisions of this round's clients to the runner, and the round's metrics."""
        pend, state["pending"] = state["pending"], {}
        ks = sorted(pend)
        ctx.report_clients(is_noisy={k: pend[k]["noisy"] for k in ks}, mu_hat={k: pend[k]["delta"] for k in ks})
        ctx.report_samples(torch.cat([pend[k]["idx"] for k in ks]), torch.cat([pend[k]["flagged"] for k in ks]))
        f = state["filter"] if not self.local_filter else None
        out = {"stage": "training", "mean_delta_hat": float(np.mean([pend[k]["delta"] for k in ks])),
               "noisy_clients": float(sum(pend[k]["noisy"] for k in ks)),
               "train_share": float(np.mean([pend[k]["share"] for k in ks]))}
        if f is not None:
            lo = int(np.argmin(f["means"]))
            out.update(filter_mu_clean=float(f["means"][lo]), filter_mu_noisy=float(f["means"][1 - lo]))
        return out
