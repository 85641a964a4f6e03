"""Shared pieces of the label-optimisation / semi-supervised methods: JointOpt and DivideMix, each as
local training in FL and as a centralized reference. Plain functions, no method state of their own.

JointOpt (Tanaka et al., CVPR 2018, §3):
- ``jointopt_terms``: the three loss terms L_c (soft-label cross-entropy), L_p (KL from the prior
  to the batch-mean prediction) and L_e (mean entropy of the predictions).
- ``label_memory`` / ``push_predictions``: a client's soft labels and the ring buffer of its last
  ``window`` epochs of predictions; the soft label becomes their mean once ``begin`` epochs are in.

DivideMix (Li et al., ICLR 2020, §3.2-3.3):
- ``clean_probability``: co-divide, a 2-component GMM on min-max normalised per-sample losses; the
  clean probability w is the posterior of the low-mean component.
- ``sharpen`` / ``refine_labels`` / ``co_guess``: MixMatch targets with label co-refinement and
  co-guessing; ``mixmatch_loss``: L_X + λ_u·L_U + L_reg; ``linear_rampup``.
- ``dividemix_epoch``: one pass over the labeled set of one network, co-guessing with its peer.
- ``Ensemble``: the two-network test model.

Shared: ``engine.epoch_loop`` (one pass over samples with a persistent optimiser and a position-aware loss),
``noise_group`` (FedCorr's low/high noise groups for per-group hyperparameters), ``fresh_copy`` (an
independently initialised twin network), ``report_flags`` (the cumulative noisy-sample decisions).
"""
from __future__ import annotations

import copy
import functools
import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlnl.conf import checks
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import LR, Params, among, linear, param, rule


# ------------------------------------------------------------------------------------ config
def noise_group(rho: float, tau: float, high_from: float) -> str:
    """FedCorr's two noise groups for per-group hyperparameters (docs/methods/jointopt.md §11, docs/methods/dividemix.md §12): "high" for
    (0.6,0.5), (0.8,0), (0.8,0.5), "low" for (0,0), (0.4,0), (0.4,0.5), (0.6,0). The rule that gives
    exactly these groups and extends to any (ρ, τ): the mean noise level E[μ] = ρ(1+τ)/2 of a client
    (FedCorr Eq. 4) is ≥ ``high_from`` (0.4)."""
    for key, v in (("noise_rho", rho), ("noise_tau", tau), ("high_noise_from", high_from)):
        checks.unit(f"method.{key}", v)
    return "high" if rho * (1.0 + tau) / 2.0 >= high_from - 1e-9 else "low"


def _share(doc: str):
    return param(doc, rule(checks.unit))


@dataclass(frozen=True)
class TwoStageParams(Params):
    """The schedule of a centralized method run as local training after a FedAvg warm-up (JointOpt,
    DivideMix; docs/methods/jointopt.md §11, docs/methods/dividemix.md §12): stage 1 FedAvg, stage 2 the method with its own optimiser."""

    warmup_rounds: int = param("stage 1: FedAvg warm-up rounds", rule(checks.integer, 0))
    train_rounds: int = param("stage 2: rounds of the method as local training", rule(checks.integer, 1))
    train_local_epochs: int = param("stage 2: local epochs per participation", rule(checks.integer, 1))
    train_lr: float = param("stage 2: SGD learning rate", rule(checks.positive),
                            search=LR)
    train_momentum: float = param("stage 2: SGD momentum", rule(checks.nonnegative))
    train_weight_decay: float = param("stage 2: SGD weight decay", rule(checks.nonnegative))


@dataclass(frozen=True)
class DivideMixParams(Params):
    """The DivideMix numbers the federated and the centralized DivideMix share (their YAML files;
    docs/methods/dividemix.md §12)."""

    T: float = param("sharpening temperature", rule(checks.positive))
    alpha: float = param("α of mixup's Beta(α, α)", rule(checks.positive),
                         search=among([0.5, 1.0, 2.0, 4.0], "DivideMix (Li et al., ICLR 2020) §4: α = 4 on CIFAR, "
                                                            "0.5 on Clothing1M; our grid between them"))
    p_threshold: float = param("labeled iff the clean probability w > p_threshold",
                               rule(checks.number, lambda v: 0 < v < 1, "a probability in (0, 1)"),
                               search=linear(0.3, 0.7, "our choice: around DivideMix's clean-probability threshold τ "
                                                       "= 0.5 (Li et al., ICLR 2020 §4)"))
    rampup_epochs: float = param("λ_u ramps up linearly over this many DivideMix epochs", rule(checks.nonnegative))
    lambda_u_low: float = param("λ_u of the low-noise group", rule(checks.nonnegative),
                                search=among([0.0, 25.0, 50.0, 150.0], "DivideMix (Li et al., ICLR 2020) §4: λ_u ∈ "
                                                                       "{0, 25, 50, 150} by noise level"))
    lambda_u_high: float = param("λ_u of the high-noise group", rule(checks.nonnegative),
                                 search=among([0.0, 25.0, 50.0, 150.0], "DivideMix (Li et al., ICLR 2020) §4: λ_u ∈ "
                                                                        "{0, 25, 50, 150} by noise level"))
    high_noise_from: float = _share("the group is high when ρ(1+τ)/2 >= it (noise_group)")
    noise_rho: float = _share("ρ of the run's noise config (interpolated)")
    noise_tau: float = _share("τ of the run's noise config (interpolated)")
    gmm_max_iter: int = param("co-divide GMM: EM steps at most", rule(checks.integer, 1))
    gmm_tol: float = param("co-divide GMM: convergence tolerance", rule(checks.positive))
    gmm_reg_covar: float = param("co-divide GMM: variance floor", rule(checks.positive))
    ensemble: str = param("test model: average of the two softmaxes (paper) | sum of the logits (code)",
                          rule(checks.choice, ("softmax", "logits")))
    second_init: str = param("network 2: all = independent initialisation, head = new classifier only",
                             rule(checks.choice, ("all", "head")))

    @functools.cached_property
    def high(self) -> bool:
        """Whether the run's noise is in the high group (λ_u_high applies)."""
        return noise_group(self.noise_rho, self.noise_tau, self.high_noise_from) == "high"

    @functools.cached_property
    def lambda_u(self) -> float:
        """λ_u of the run's noise group."""
        return self.lambda_u_high if self.high else self.lambda_u_low

    def unread(self) -> frozenset[str]:
        """The other noise group's λ_u."""
        return frozenset({"lambda_u_low"} if self.high else {"lambda_u_high"})

    @functools.cached_property
    def gmm(self) -> dict:
        """The co-divide GMM's settings."""
        return {"max_iter": self.gmm_max_iter, "tol": self.gmm_tol, "reg_covar": self.gmm_reg_covar}


# ------------------------------------------------------------------------------------ loops


def mean_or_nan(losses: list[float]) -> float:
    if any(not math.isfinite(x) for x in losses):
        return float("nan")
    return float(np.mean(losses)) if losses else 0.0


def fresh_copy(model: nn.Module, seed: int, scope: str) -> nn.Module:
    """A twin of ``model`` with newly initialised parameters: ``scope="all"`` re-initialises every
    layer (two independently initialised networks, as DivideMix does from scratch), ``"head"`` only
    the classifier head (keeps a pre-trained backbone, as DivideMix's Clothing1M networks). The
    draws come from ``seed`` inside ``fork_rng`` on the CPU, so the global RNG state is left as it
    was and the result does not depend on the device."""
    if scope not in ("all", "head"):
        raise ValueError(f"method.second_init={scope!r} is invalid: allowed all, head")
    device = next(model.parameters()).device
    twin = copy.deepcopy(model).to("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        for m in (twin.modules() if scope == "all" else twin.head.modules()):
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
    return twin.to(device)


def report_flags(ctx, memories) -> None:
    """Report every client's latest noisy-sample decision at once, so the runner scores the whole
    federation seen so far rather than the last client only."""
    mems = [m for m in memories if m.get("flagged") is not None]
    if mems:
        ctx.report_samples(torch.cat([m["idx"] for m in mems]), torch.cat([m["flagged"] for m in mems]))


# ------------------------------------------------------------------------------------ JointOpt
def jointopt_terms(logits: torch.Tensor, soft: torch.Tensor, prior: torch.Tensor):
    """(L_c, L_p, L_e, s) of JointOpt §3 on one batch, s = softmax(logits):

    L_c = −1/B Σ_i Σ_j y_ij log s_ij        soft-label cross-entropy (the paper writes KL(y‖s),
                                            which differs by the labels' entropy, a constant in θ)
    L_p = Σ_j p_j log(p_j / s̄_j)            KL(p ‖ s̄), s̄ = batch mean of s (the reference code
                                            uses −Σ p_j log s̄_j, the same up to the constant H(p))
    L_e = −1/B Σ_i Σ_j s_ij log s_ij        mean entropy of the predictions
    """
    logp = F.log_softmax(logits, dim=1)
    s = logp.exp()
    l_c = -(soft * logp).sum(1).mean()
    s_bar = s.mean(0)
    l_p = (prior * (prior.log() - s_bar.clamp_min(1e-12).log())).sum()
    l_e = -(s * logp).sum(1).mean()
    return l_c, l_p, l_e, s


def label_memory(idx: torch.Tensor, labels: torch.Tensor, num_classes: int, window: int) -> dict:
    """A client's JointOpt memory: soft labels (initially one-hot of the observed labels), the last
    ``window`` epochs of predictions, the epoch count, and its observed labels (to flag changes)."""
    n = labels.numel()
    return {
        "idx": idx.clone(), "observed": labels.clone(),
        "soft": F.one_hot(labels, num_classes).float(),
        "history": torch.zeros(window, n, num_classes, device=labels.device),
        "count": 0, "flagged": None,
    }


def push_predictions(mem: dict, probs: torch.Tensor, begin: int) -> bool:
    """Store one epoch of predictions; once ``begin`` epochs are stored, soft label = mean of the
    stored ones, i.e. of the last ``window`` epochs (JointOpt: the mean network output over the past
    10 epochs). Returns whether the labels were updated."""
    window = mem["history"].shape[0]
    mem["history"][mem["count"] % window] = probs
    mem["count"] += 1
    if mem["count"] < begin:
        return False
    mem["soft"] = mem["history"][: min(mem["count"], window)].mean(0)
    return True


def hard_labels(mem: dict) -> torch.Tensor:
    """JointOpt's hard labels: argmax of the soft labels."""
    return mem["soft"].argmax(1)


def jointopt_epoch(model, opt, data, mem, *, alpha, beta, batch_size, gen, augment, record: bool):
    """One JointOpt epoch over the client's samples with loss L_c + α L_p + β L_e (§3); with
    ``record`` the predictions s of the training forward passes are kept (as the reference code
    does) and returned as one [n, M] array, else None."""
    idx, soft = mem["idx"], mem["soft"]
    prior = torch.full((soft.shape[1],), 1.0 / soft.shape[1], device=soft.device)
    probs = torch.zeros_like(soft) if record else None

    def loss_fn(model, xb, pos):
        l_c, l_p, l_e, s = jointopt_terms(model(xb), soft[pos], prior)
        if record:
            probs[pos] = s.detach()
        return l_c + alpha * l_p + beta * l_e

    losses = engine.epoch_loop(model, opt, data, idx, batch_size=batch_size, gen=gen, augment=augment, loss_fn=loss_fn)
    return losses, probs


# ------------------------------------------------------------------------------------ DivideMix
def clean_probability(losses: torch.Tensor, random_state: int, max_iter: int, tol: float,
                      reg_covar: float) -> torch.Tensor:
    """Co-divide (DivideMix §3.2): min-max normalise the per-sample losses, fit a 2-component GMM
    and return w_i = posterior of the low-mean component (the clean probability). Degenerate input
    (fewer than 2 samples, or all losses equal) gives w = 1 for every sample."""
    from sklearn.mixture import GaussianMixture

    x = losses.detach().double().cpu()
    span = float(x.max() - x.min()) if x.numel() else 0.0
    if x.numel() < 2 or span <= 1e-12:
        return torch.ones(x.numel(), device=losses.device)
    x = ((x - x.min()) / span).numpy().reshape(-1, 1)
    gmm = GaussianMixture(n_components=2, max_iter=max_iter, tol=tol, reg_covar=reg_covar,
                          random_state=int(random_state))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_iter=10 often stops before tol: expected
        gmm.fit(x)
        post = gmm.predict_proba(x)[:, int(np.argmin(gmm.means_.ravel()))]
    return torch.as_tensor(post, dtype=torch.float32, device=losses.device)


@torch.no_grad()
def sample_losses(model, data, idx, labels) -> torch.Tensor:
    """Per-sample CE of ``model`` (eval mode, un-augmented), the input of co-divide."""
    return engine.per_sample_loss(engine.predict(model, data, idx), labels)


def sharpen(p: torch.Tensor, T: float) -> torch.Tensor:
    """Sharpen(p, T)_c = p_c^{1/T} / Σ_c' p_c'^{1/T} (MixMatch; DivideMix §3.3)."""
    pt = p.pow(1.0 / T)
    return pt / pt.sum(1, keepdim=True)


def refine_labels(y: torch.Tensor, w: torch.Tensor, p: torch.Tensor, T: float) -> torch.Tensor:
    """Label co-refinement (DivideMix §3.3): ȳ = w·y + (1 − w)·p with the other network's clean
    probability w and this network's prediction p averaged over augmentations, then sharpened."""
    w = w.view(-1, 1)
    return sharpen(w * y + (1.0 - w) * p, T)


def co_guess(probs: list[torch.Tensor], T: float) -> torch.Tensor:
    """Label co-guessing (DivideMix §3.3): mean of both networks' predictions over the augmented
    views of an unlabeled sample, sharpened."""
    return sharpen(torch.stack(probs).mean(0), T)


def linear_rampup(current: float, length: float) -> float:
    """clip(current / length, 0, 1): the weight of L_U after ``current`` DivideMix epochs."""
    return 1.0 if length <= 0 else float(np.clip(current / length, 0.0, 1.0))


def mixmatch_loss(logits, targets, n_x: int, lambda_u: float, prior: torch.Tensor):
    """L = L_X + λ_u·L_U + L_reg (DivideMix §3.3) on a mixed batch whose first ``n_x`` rows are
    labeled: L_X = soft-label CE, L_U = mean squared error of the probabilities averaged over samples
    and classes (MixMatch's 1/(L|U'|) Σ‖q − p‖², as the code), L_reg = KL(π ‖ mean prediction) with
    the uniform prior π. Returns (L, L_X, L_U, L_reg)."""
    l_x = -(F.log_softmax(logits[:n_x], 1) * targets[:n_x]).sum(1).mean()
    l_u = ((logits[n_x:].softmax(1) - targets[n_x:]) ** 2).mean() if logits.shape[0] > n_x else logits.sum() * 0.0
    p_bar = logits.softmax(1).mean(0)
    l_reg = (prior * (prior.log() - p_bar.clamp_min(1e-12).log())).sum()
    return l_x + lambda_u * l_u + l_reg, l_x, l_u, l_reg


def _beta_max(alpha: float, gen: torch.Generator) -> float:
    """λ ~ Beta(α, α), λ' = max(λ, 1 − λ) (DivideMix §3.3: the mixed input stays closer to the first)."""
    lam = float(np.random.default_rng(engine.child_seed(gen)).beta(alpha, alpha))
    return max(lam, 1.0 - lam)


def dividemix_epoch(net, peer, opt, data, idx, labels, w, *, p_threshold, T, alpha, lambda_u, epochs_done,
                    rampup_epochs, batch_size, num_classes, gen, augment) -> list[float]:
    """One DivideMix epoch of ``net`` (Alg. 1): labeled set = samples with the *peer's* clean
    probability w > p_threshold, the rest unlabeled; one pass over the labeled set in mini-batches,
    each paired with an unlabeled mini-batch (restarted when exhausted). Two augmented views per
    sample; ``net`` in train mode also for the target forwards (as the code), ``peer`` in eval mode.
    λ_u is ramped up over ``rampup_epochs`` counting ``epochs_done`` earlier DivideMix epochs."""
    lab = (w > p_threshold).nonzero().squeeze(1)
    unl = (w <= p_threshold).nonzero().squeeze(1)
    if lab.numel() == 0:
        return []
    net.train()
    peer.eval()
    prior = torch.full((num_classes,), 1.0 / num_classes, device=labels.device)
    fmt = engine.memory_format(net, labels.device)

    def unlabeled_pass():  # (indices, raw images) of each unlabeled mini-batch, the next one's copy in flight
        usels = [idx[unl[upos]] for upos in engine.batches(unl.numel(), batch_size, gen, device=unl.device)]
        return zip(usels, data.stream_uint8(usels))

    def losses():  # one MixMatch loss per labeled mini-batch, stepped by engine.train_steps
        engine.device_generator(gen, lab.device, fresh=True)  # the draws stay on the device
        lab_batches = list(engine.batches(lab.numel(), batch_size, gen, device=lab.device))
        rows = [idx[lab[pos]] for pos in lab_batches]
        unl_iter = iter(())
        for b, (pos, row, raw) in enumerate(zip(lab_batches, rows, data.stream_uint8(rows))):
            sel = lab[pos]
            x1 = data.images(row, augment=augment, gen=gen, memory_format=fmt, raw=raw)
            x2 = data.images(row, augment=augment, gen=gen, memory_format=fmt, raw=raw)
            y = F.one_hot(labels[sel], num_classes).float()
            views = [x1, x2]
            with torch.no_grad():
                targets = [refine_labels(y, w[sel], (net(x1).softmax(1) + net(x2).softmax(1)) / 2, T)] * 2
                if unl.numel():
                    upos = next(unl_iter, None)
                    if upos is None:  # the unlabeled set exhausted: a new pass, its shuffle drawn now
                        unl_iter = unlabeled_pass()
                        upos = next(unl_iter)
                    usel, uraw = upos
                    u1 = data.images(usel, augment=augment, gen=gen, memory_format=fmt, raw=uraw)
                    u2 = data.images(usel, augment=augment, gen=gen, memory_format=fmt, raw=uraw)
                    q = co_guess([m(u).softmax(1) for m in (net, peer) for u in (u1, u2)], T)
                    views += [u1, u2]
                    targets += [q, q]
            inputs, targets = torch.cat(views), torch.cat(targets)
            lam = _beta_max(alpha, gen)
            perm = torch.randperm(inputs.shape[0], generator=engine.device_generator(gen, inputs.device),
                                  device=inputs.device)
            mixed_x = lam * inputs + (1.0 - lam) * inputs[perm]
            mixed_t = lam * targets + (1.0 - lam) * targets[perm]
            ramp = linear_rampup(epochs_done + b / len(lab_batches), rampup_epochs)
            yield mixmatch_loss(net(mixed_x), mixed_t, 2 * sel.numel(), lambda_u * ramp, prior)[0]

    return engine.train_steps(net, opt, gen, losses)


class Ensemble(nn.Module):
    """The DivideMix test model: both networks on the same input. ``mode="softmax"`` returns
    log((softmax(f1) + softmax(f2)) / 2), the log of the averaged predictions (so the runner's
    cross-entropy is the ensemble's NLL); ``"logits"`` returns f1 + f2 (the reference code)."""

    def __init__(self, net1: nn.Module, net2: nn.Module, mode: str):
        super().__init__()
        if mode not in ("softmax", "logits"):
            raise ValueError(f"method.ensemble={mode!r} is invalid: allowed softmax, logits")
        self.net1, self.net2, self.mode = net1, net2, mode
        # both networks share an architecture: its memory format (engine.memory_format) is theirs
        self.channels_last_on = getattr(net1, "channels_last_on", ())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.net1(x), self.net2(x)
        if self.mode == "logits":
            return a + b
        both = torch.stack([F.log_softmax(a, 1), F.log_softmax(b, 1)])
        return torch.logsumexp(both, 0) - math.log(2.0)
