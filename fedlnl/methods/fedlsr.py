"""FedLSR — Jiang, Sun, Wang, Liu, "Towards Federated Learning against Noisy Labels via Local
Self-Regularization", CIKM 2022 (arXiv 2208.12807). Official code: https://github.com/Sprinter1999/FedLSR
at commit 7e3b875 (``FedLSR.ipynb``, ``Client.train``); the authors' adaptation in FNBench
(https://github.com/Sprinter1999/FNBench at 9cec427, ``fl_components/update.py::LocalUpdateFedLSR``).
Facts, hyperparameters and divergences: docs/methods/fedlsr_fedrn_fedelc.md §22.1.

Sources checked: both codes were read in those commits, and the authors' CIKM slides (in the
repository, ``paper/``), whose equations are images cut from the paper: p. 8 (mixed prediction
p = λ·p1 + (1 − λ)·p2; p_s = Sharpen(p, T)_i = p_i^{1/T} / Σ_j p_j^{1/T}; "use p_s to compute
classification loss"; Figure 4's caption compares CE(p_s, y) with CE(p1, y), CE(p2, y), CE(p, y), the
cross-entropy of probability vectors), p. 9 (q_{1,i}, q_{2,i} = exp(o_i/T_d) / Σ_j exp(o_j/T_d);
Loss_reg = JS(q1, q2) = ½(KL(q1 ‖ U) + KL(q2 ‖ U)), U the two views' mean, which the author's reply in
issue #3 identifies with the code's JS function) and p. 10 (Loss = Loss_cls + γ·Loss_reg + λ_e·L_e).
The paper's text itself could not be read (docs/methods/fedlsr_fedrn_fedelc.md §22 lists the addresses). The author's own
statements (https://github.com/Sprinter1999/FedLSR/issues/1 and /issues/2, and the README from
2022-10 to 2024-03): the entropy term L_e is discussed in the paper's discussion section (FedLSR+);
1/T_d = 3 is an empirical value the paper does not state.

FedAvg (n_k-weighted) whose clients train with a local self-regularisation. Per mini-batch (x, y),
with x̃ a mildly augmented second view of x (``common.views.mild_view``: flip + colour distortion on
colour data, a ±30° rotation on grayscale digits, as the code's per-dataset choice):

    p   = ω·softmax(f(x)) + (1 − ω)·softmax(f(x̃)),  ω ~ Beta(1, 1) per batch   (slides p. 8, λ there)
    p_s = p^{1/T} / Σ_c p_c^{1/T},  T = ``sharpen_T`` = 0.5                    (slides p. 8)
    q   = clamp(softmax(f(·)/T_d), 1e-6, 1),  1/T_d = ``inv_T_d`` = 3          (slides p. 9)
    L   = L_cls(p_s, y) + γ_t·JS(q(x), q(x̃)) + γ_e·L_e                       (slides p. 10)

L_cls is the cross-entropy of the sharpened mixture (implicit regularisation), JS the Jensen-Shannon
divergence between the two views' tempered outputs (explicit regularisation, self-distillation), L_e
an entropy term weighted by γ_e (λ_e on the slides; ``gamma_e=0`` drops it, FedLSR without the "+").
γ_t = γ·t/t_w for rounds t < t_w = ``warmup_ratio``·T (T the run's rounds), then γ (the code's
warm-up, counted in global rounds from the start of the run).

Switches ``${fidelity:<paper>,<reference>}`` (docs/methods/fedlsr_fedrn_fedelc.md §22.1): ``cls_form`` (LSR1) and
``js_reduction`` (LSR3) follow the slides under ``fidelity=paper`` and the official notebook under
``fidelity=reference``; ``entropy_form``, ``view_per_sample`` and ``view_space`` (LSR2, LSR4, LSR5) are
the code's in both (the slides do not show them; the inferred forms are settable).

Values and sources of each key: docs/methods/fedlsr_fedrn_fedelc.md §23.29; what each key is: ``FedLSRParams``.

Implementation notes and deviations (docs/methods/fedlsr_fedrn_fedelc.md §22.1)
- Local training is the suite's (``fl`` group: SGD, epochs, batch, lr, momentum, weight decay; a fresh
  optimiser per round); the paper's lr 0.15, momentum 0.9, weight decay 1e-4, batch 64 (slides) and
  FNBench's lr 0.01 / weight decay 5e-4 are not pinned. Mixed precision (``autocast``) is not used.
- The first view x is the runner's training batch (crop + flip where the dataset defines it), as the
  codes' loaders apply the dataset's training transform before the extra view.
- γ_e: the official notebook's λ_e = 0.6 (FNBench's ``gamma_e`` default is 0.3); which of FedLSR
  (γ_e = 0) and FedLSR+ produced the paper's tables is not known.
- q is clamped to [1e-6, 1] in both fidelities (the codes' guard "for training stability"; the slides'
  q has none): it keeps the logarithms of the JS finite and changes only the entries below 1e-6
  (q's sum by at most C·1e-6).
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
    """p_s = Sharpen(ω·softmax(f(x)) + (1 − ω)·softmax(f(x̃)), T) (docs/methods/fedlsr_fedrn_fedelc.md §22.1)."""
    p = omega * logits1.softmax(1) + (1.0 - omega) * logits2.softmax(1)
    pt = p.pow(1.0 / T)
    return pt / pt.sum(1, keepdim=True)


def cls_loss(p_s: torch.Tensor, labels: torch.Tensor, form: str) -> torch.Tensor:
    """L_cls: CE(p_s, y) = −mean log p_s[y] (``log``; slides p. 8, Figure 4's caption), or the code's
    ``CrossEntropyLoss`` with p_s as logits, −mean log softmax(p_s)[y] (``softmax``)."""
    if form == "log":
        return F.nll_loss(p_s.clamp_min(1e-12).log(), labels)
    return F.cross_entropy(p_s, labels)


def tempered(logits: torch.Tensor, inv_T_d: float) -> torch.Tensor:
    """q = clamp(softmax(logits / T_d), 1e-6, 1) (the codes' clamp, "for training stability").
    T_d = 1/3 is the codes' value; the paper gives none (the author calls it empirical)."""
    return (logits * inv_T_d).softmax(1).clamp(1e-6, 1.0)


def js_divergence(q1: torch.Tensor, q2: torch.Tensor, reduction: str) -> torch.Tensor:
    """JS(q1, q2) = ½[KL(q1 ‖ m) + KL(q2 ‖ m)], m = (q1 + q2)/2 (slides p. 9, U there), each KL
    summed over the classes and averaged over the batch (``batchmean``), or averaged over all B·C
    entries (``mean``: the code's ``KLDivLoss(reduction='mean')``, the per-sample JS ÷ C)."""
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
    """L = L_cls(p_s, y) + γ_t·JS(q(x), q(x̃)) + γ_e·L_e (slides p. 10; docs/methods/fedlsr_fedrn_fedelc.md §22.1)."""
    q1, q2 = tempered(logits1, inv_T_d), tempered(logits2, inv_T_d)
    loss = cls_loss(sharpened_mixture(logits1, logits2, omega, T), labels, cls_form)
    return loss + gamma_t * js_divergence(q1, q2, js_reduction) + gamma_e * entropy_term(q1, q2, entropy_form)


# ----------------------------------------------------------------------------------- the method
@dataclass(frozen=True)
class FedLSRParams(Params):
    """FedLSR's own numbers (conf/method/fedlsr.yaml names each value's source; docs/methods/fedlsr_fedrn_fedelc.md §22.1, LSR-numbers)."""

    gamma: float = param("γ: weight of the JS self-distillation", rule(nonnegative, "a loss weight >= 0"),
                         search=linear(0.0, 1.0, "our choice: around the code's γ = 0.4 (the paper's method section "
                                                 "was not readable, docs/methods/fedlsr_fedrn_fedelc.md §22.1)"))
    gamma_e: float = param("γ_e: weight of L_e (> 0: FedLSR+, 0: the paper's FedLSR)",
                           rule(nonnegative, "a loss weight >= 0"),
                           search=linear(0.0, 1.2, "our choice: 0 (FedLSR) to twice the code's 0.6 (FedLSR+), "
                                                   "docs/methods/fedlsr_fedrn_fedelc.md §22.1"))
    inv_T_d: float = param("1/T_d: the logits are multiplied by it before the softmax",
                           rule(positive, "an inverse temperature 1/T_d > 0"),
                           search=log_range(1.0, 9.0, "our choice: ×/÷ 3 around the code's 1/T_d = 3 (an empirical "
                                                      "value, docs/methods/fedlsr_fedrn_fedelc.md §22.1)"))
    sharpen_T: float = param("T of the sharpening p^(1/T)", rule(positive, "a sharpening temperature > 0"))
    warmup_ratio: float = param("t_w = warmup_ratio·rounds: γ ramps up linearly before",
                                rule(unit, "a share of the rounds in [0, 1]"))
    view: str = param("the second view's transform", rule(choice, views.KINDS))
    cls_form: str = param("LSR1: L_cls = −log p_s[y] (log, paper) | CE(p_s as logits) (softmax, code)", rule(choice, CLS_FORMS))
    entropy_form: str = param("LSR2: L_e = H(softmax(q(x))) (code) | ½[H(q(x)) + H(q(x̃))] (views)",
                              rule(choice, ENTROPY_FORMS))
    js_reduction: str = param("LSR3: JS as Σ_c, batch mean (batchmean, paper) | the mean over B·C entries (mean, code)",
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
