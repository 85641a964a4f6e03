"""FedLSR — Jiang, Sun, Wang, Liu, "Towards Federated Learning against Noisy Labels via Local
Self-Regularization", CIKM 2022 (arXiv 2208.12807). Official code: https://github.com/Sprinter1999/FedLSR
at commit 7e3b875 (``FedLSR.ipynb``, ``Client.train``); the authors' adaptation in FNBench
(https://github.com/Sprinter1999/FNBench at 9cec427, ``fl_components/update.py::LocalUpdateFedLSR``).
Facts, hyperparameters and divergences: methods.md §22.1.

Sources checked: both codes were read in those commits, and the authors' CIKM slides (in the
repository, ``paper/``). The paper's method section could not be read (only the opening of its LaTeX
source and the abstract were reachable; methods.md §22 lists the addresses), so no equation is cited
by number; the "paper" column of the switches below is the plain reading of the slides' description
(methods.md §22.1): inferred, not read. The author's own statements
(https://github.com/Sprinter1999/FedLSR/issues/1 and /issues/2, and the README from 2022-10 to
2024-03): the paper's method, FedLSR, is L_cls + γ_t·JS; the entropy term L_e makes FedLSR+, given in
the paper's discussion section; 1/T_d = 3 is an empirical value the paper does not state.

FedAvg (n_k-weighted) whose clients train with a local self-regularisation. Per mini-batch (x, y),
with x̃ a mildly augmented second view of x (``common.views.mild_view``: flip + colour distortion on
colour data, a ±30° rotation on grayscale digits, as the code's per-dataset choice):

    p   = ω·softmax(f(x)) + (1 − ω)·softmax(f(x̃)),  ω ~ Beta(1, 1) per batch   (mixed prediction)
    p_s = p^{1/T} / Σ_c p_c^{1/T},  T = ``sharpen_T`` = 0.5                    (sharpening)
    q   = clamp(softmax(f(·)/T_d), 1e-6, 1),  1/T_d = ``inv_T_d`` = 3          (tempered outputs)
    L   = L_cls(p_s, y) + γ_t·JS(q(x), q(x̃)) + γ_e·L_e

L_cls is the cross-entropy of the sharpened mixture (implicit regularisation), JS the Jensen-Shannon
divergence between the two views' tempered outputs (explicit regularisation, self-distillation), L_e
an entropy term: with γ_e > 0 (the default, as both codes) this is FedLSR+, with ``gamma_e=0`` the
paper's FedLSR (per the author, above). γ_t = γ·t/t_w for rounds t < t_w = ``warmup_ratio``·T (T the
run's rounds), then γ (the code's warm-up, counted in global rounds from the start of the run).

Switches (the paper's text was not available, so every default is the code's form; the inferred
paper forms are settable, ``method.<switch>=...``):

Values and sources of each key: docs/methods.md §23.29; what each key is: ``FedLSRParams``.

Implementation notes and deviations (methods.md §22.1)
- Local training is the suite's (``fl`` group: SGD, epochs, batch, lr, momentum, weight decay; a fresh
  optimiser per round); the paper's lr 0.15, momentum 0.9, weight decay 1e-4, batch 64 (slides) and
  FNBench's lr 0.01 / weight decay 5e-4 are not pinned. Mixed precision (``autocast``) is not used.
- The first view x is the runner's training batch (crop + flip where the dataset defines it), as the
  codes' loaders apply the dataset's training transform before the extra view.
- γ_e: the official notebook's λ_e = 0.6 (FNBench's ``gamma_e`` default is 0.3); which of FedLSR
  (γ_e = 0) and FedLSR+ produced the paper's tables is not known.
- The colour jitter's four operations run in a fixed order (torchvision permutes them per call).
- ω is drawn from the batch's generator (the codes use numpy's global generator).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedlnl.conf.checks import choice, flag, nonnegative, positive, unit
from fedlnl.methods.common import engine, views
from fedlnl.methods.common.params import Params, linear, log_range, param, rule
from fedlnl.methods.fedavg import FedAvg

CLS_FORMS = ("log", "softmax")
ENTROPY_FORMS = ("views", "code")
JS_REDUCTIONS = ("batchmean", "mean")


# ----------------------------------------------------------------------------------- the loss
def sharpened_mixture(logits1, logits2, omega: float, T: float) -> torch.Tensor:
    """p_s = Sharpen(ω·softmax(f(x)) + (1 − ω)·softmax(f(x̃)), T) (methods.md §22.1)."""
    p = omega * logits1.softmax(1) + (1.0 - omega) * logits2.softmax(1)
    pt = p.pow(1.0 / T)
    return pt / pt.sum(1, keepdim=True)


def cls_loss(p_s: torch.Tensor, labels: torch.Tensor, form: str) -> torch.Tensor:
    """L_cls: −mean log p_s[y] (``log``), or the code's CE with p_s as logits (``softmax``)."""
    if form == "log":
        return F.nll_loss(p_s.clamp_min(1e-12).log(), labels)
    return F.cross_entropy(p_s, labels)


def tempered(logits: torch.Tensor, inv_T_d: float) -> torch.Tensor:
    """q = clamp(softmax(logits / T_d), 1e-6, 1) (the codes' clamp, "for training stability").
    T_d = 1/3 is the codes' value; the paper gives none (the author calls it empirical)."""
    return (logits * inv_T_d).softmax(1).clamp(1e-6, 1.0)


def js_divergence(q1: torch.Tensor, q2: torch.Tensor, reduction: str) -> torch.Tensor:
    """JS(q1, q2) = ½[KL(q1 ‖ m) + KL(q2 ‖ m)], m = (q1 + q2)/2, summed over classes and averaged
    over the batch (``batchmean``) or averaged over all B·C entries (``mean``, the code's KLDivLoss)."""
    m = 0.5 * (q1 + q2)
    terms = 0.5 * (q1 * (q1.log() - m.log()) + q2 * (q2.log() - m.log()))
    return terms.sum(1).mean() if reduction == "batchmean" else terms.mean()


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of H(p) = −Σ_c p_c log p_c."""
    return -(p * p.clamp_min(1e-12).log()).sum(1).mean()


def entropy_term(q1: torch.Tensor, q2: torch.Tensor, form: str) -> torch.Tensor:
    """L_e: ½[H(q1) + H(q2)] (``views``) or the code's H(softmax(q1)) (``code``); the FedLSR+ term
    (the paper's discussion section, per the author), weighted by γ_e."""
    if form == "views":
        return 0.5 * (entropy(q1) + entropy(q2))
    return entropy(q1.softmax(1))


def warmup_weight(t: int, gamma: float, t_w: float) -> float:
    """γ_t = γ·t/t_w for t < t_w, then γ (the codes' ``betaa``)."""
    return gamma * t / t_w if t < t_w else gamma


def lsr_loss(logits1, logits2, labels, omega: float, gamma_t: float, gamma_e: float, *, T: float,
             inv_T_d: float, cls_form: str, entropy_form: str, js_reduction: str) -> torch.Tensor:
    """L = L_cls(p_s, y) + γ_t·JS(q(x), q(x̃)) + γ_e·L_e (methods.md §22.1)."""
    q1, q2 = tempered(logits1, inv_T_d), tempered(logits2, inv_T_d)
    loss = cls_loss(sharpened_mixture(logits1, logits2, omega, T), labels, cls_form)
    return loss + gamma_t * js_divergence(q1, q2, js_reduction) + gamma_e * entropy_term(q1, q2, entropy_form)


# ----------------------------------------------------------------------------------- the method
@dataclass(frozen=True)
class FedLSRParams(Params):
    """FedLSR's own numbers (conf/method/fedlsr.yaml names each value's source; docs/methods.md §22.1, LSR-numbers)."""

    gamma: float = param("γ: weight of the JS self-distillation", rule(nonnegative, "a loss weight >= 0"),
                         search=linear(0.0, 1.0, "our choice: around the code's γ = 0.4 (the paper's method section "
                                                 "was not readable, methods.md §22.1)"))
    gamma_e: float = param("γ_e: weight of L_e (> 0: FedLSR+, 0: the paper's FedLSR)",
                           rule(nonnegative, "a loss weight >= 0"),
                           search=linear(0.0, 1.2, "our choice: 0 (FedLSR) to twice the code's 0.6 (FedLSR+), "
                                                   "methods.md §22.1"))
    inv_T_d: float = param("1/T_d: the logits are multiplied by it before the softmax",
                           rule(positive, "an inverse temperature 1/T_d > 0"),
                           search=log_range(1.0, 9.0, "our choice: ×/÷ 3 around the code's 1/T_d = 3 (an empirical "
                                                      "value, methods.md §22.1)"))
    sharpen_T: float = param("T of the sharpening p^(1/T)", rule(positive, "a sharpening temperature > 0"))
    warmup_ratio: float = param("t_w = warmup_ratio·rounds: γ ramps up linearly before",
                                rule(unit, "a share of the rounds in [0, 1]"))
    view: str = param("the second view's transform", rule(choice, views.KINDS))
    cls_form: str = param("LSR1: L_cls = CE(p_s as logits) (softmax, code) | −log p_s[y] (log)", rule(choice, CLS_FORMS))
    entropy_form: str = param("LSR2: L_e = H(softmax(q(x))) (code) | ½[H(q(x)) + H(q(x̃))] (views)",
                              rule(choice, ENTROPY_FORMS))
    js_reduction: str = param("LSR3: JS as the mean over B·C entries (mean, code) | Σ_c, batch mean (batchmean)",
                              rule(choice, JS_REDUCTIONS))
    view_per_sample: bool = param("LSR4: one second-view draw per image (false: per batch, code)", rule(flag))
    view_space: str = param("LSR5: colour jitter on the normalised tensor (code) | on pixels", rule(choice, views.SPACES))


class FedLSR(FedAvg):
    family = "federated label-noise methods"

    Params = FedLSRParams

    def gamma_at(self, ctx) -> float:
        return warmup_weight(ctx.round, self.gamma, self.warmup_ratio * ctx.total_rounds)

    def client_update(self, state, client, ctx):
        gamma_t, data = self.gamma_at(ctx), client.data

        def loss_fn(model, xb, yb, step, gen):
            x2 = views.mild_view(xb, data.mean, data.std, gen, kind=self.view, per_sample=self.view_per_sample,
                                 space=self.view_space)
            omega = engine.host_draw(torch.rand(1, generator=gen))  # ω ~ Beta(1, 1) = U(0, 1)
            # two forward passes, as the codes (BatchNorm sees each view's own batch statistics)
            return lsr_loss(model(xb), model(x2), yb, omega, gamma_t, self.gamma_e,
                            T=self.sharpen_T, inv_T_d=self.inv_T_d, cls_form=self.cls_form,
                            entropy_form=self.entropy_form, js_reduction=self.js_reduction)

        return engine.train_from_global(state, client, ctx, loss_fn=loss_fn, **self.fl.training())

    def aggregate(self, state, updates, ctx):
        state, metrics = super().aggregate(state, updates, ctx)
        return state, {**metrics, "gamma_t": self.gamma_at(ctx)}
