"""FedNoRo — Wu, Yu, Jiang, Cheng, Yan, "FedNoRo: Towards Noise-Robust Federated Learning by Addressing
Class Imbalance and Label Noise Heterogeneity", IJCAI 2023 (arXiv 2305.05230). Official code:
https://github.com/wnn2000/FedNoRo at commit 6719ad7 (``train_FedNoRo.py``, ``utils/{FedAvg,losses,
local_training,options,utils}.py``). Facts, hyperparameters and code quirks: docs/methods/fednoro.md §18.

Sources: every statement below about "the code" was read in that commit (file:line in docs/methods/fednoro.md
§18.5). Of the paper only the abstract and introduction were available as text (no method section,
equations or experimental details), so no paper passage settles any detail below: **every default is
the code's**, and comments cite the paper by stage, not by equation number.

Two stages within ``fl.rounds`` (the code's ``--rounds`` also counts the warm-up ``--s1``);
m = max(⌊frac·N⌋, 1) clients per round, uniformly without replacement, in both (the code: every client,
the per-dataset ``frac`` below).

1. **Warm-up** (``warmup_rounds`` = T₁ rounds; docs/methods/fednoro.md §18.1): FedAvg (n_k-weighted) in which every
   client trains with the logit-adjusted loss (Menon et al., ICLR 2021)

       L_LA(x, y) = −log softmax(f(x) + τ·log π_k)_y,

   π_k the class prior of client k's *observed* labels (τ = ``la_tau`` = 1, the code's ``LogitAdjust``
   default; a class the client lacks gets log 0 = −∞: probability 0 in local training, no gradient on
   its logit, as the code; evaluation uses the raw logits).
2. **Noisy-client detection**, once, with the global model of the last warm-up round (paper stage 1;
   docs/methods/fednoro.md §18.2): every client's per-class mean loss l_k^c = mean over its samples observed as class
   c of CE(f(x; w_g), c) forms a vector l_k ∈ R^C, computed on augmented views in eval mode
   (``detect_augment``: the code's pass reads the training transform). A class a client lacks takes the
   smallest value of that class over the other clients (the code's ``nanmin``); each class column is
   min-max normalised over the clients; ``gmm_votes`` = 9 two-component GMMs (scikit-learn defaults,
   full covariance) with random_state 0..8 (``gmm_seeds: fixed``) are fitted on the N × C matrix; in
   each, the clients of the component with the larger sum of means are noisy (``argmax(means_.sum(1))``),
   and the noisy set found most often wins (ties: the first). Decisions go to
   ``ctx.report_clients(is_noisy=...)`` for every client.
3. **Noise-robust training** (the remaining ``fl.rounds − T₁`` rounds, paper stage 2; docs/methods/fednoro.md
   §18.3): clean clients keep L_LA; noisy clients minimise (1 − λ)·L_LA + λ·L_KD with
   L_KD = KL(softmax(f(x; w_g)/T) ‖ p_student), the global model received this round as the teacher
   (eval mode, same augmented batch; the student trains in train mode) and, as the code's ``LA_KD``,
   log p_student = log softmax(f(x) + τ·log π_k) with −∞ entries set to 0 (``kd_student: adjusted``).
   λ follows the code's sigmoid ramp-up (Laine & Aila 2017) λ(t) = a·exp(−5(1 − s)²),
   s = clip((t − t₀)/R, 0, 1), t the 0-based round of the run, a = ``lambda_`` = 0.8,
   t₀ = ``rampup_begin`` (the code's ``--begin``, independent of T₁) and R = ``rampup_rounds``
   (``--end − --begin`` = 39); ``lambda_rampup: false`` keeps λ = a. The server aggregates with
   **DaAgg** (docs/methods/fednoro.md §18.4): D_k = 0 for a clean client, D_k = min_{j clean} d(w_k, w_j) for a
   noisy one, d = Σ over the floating state-dict entries of ‖w_k[e] − w_j[e]‖₂ (``distance:
   sum_of_norms``, the code's ``model_dist``), D̂_k = D_k / max_j D_j, and
   w_g = Σ_k n_k·e^{−D̂_k}·w_k / Σ_k n_k·e^{−D̂_k} over every state-dict entry (BatchNorm statistics
   included, as the code).

Local training: the optimiser of the ``fl`` group (``fl.optimizer``) with the YAML's per-dataset pins.
``fidelity=reference`` pins the code's Adam (lr 3e-4, betas (0.9, 0.999), weight decay 5e-4, coupled
L2), batch 16 and 5 local epochs on every dataset; the default keeps the suite's shared local training
on the suite's datasets (a comparison holds local training equal across methods, as FedCorr's and
FedDiv's baselines were run), and the code's values on the code's own datasets (the ``ich`` /
``isic2019`` columns, e.g. a folder dataset with ``dataset.family=ich``), where ``frac`` is also 1
(every client every round, as the code). ``frac`` is not pinned on the suite's datasets in either mode:
``fl.rounds`` × ⌊frac·N⌋ is the suite's FedAvg-equivalent participation budget, which full
participation would multiply by N/m (10× on CIFAR-10); ``fl.frac=1`` gives it at that cost.

Alternatives to the code's forms (settable alone, same in both fidelities; docs/methods/fednoro.md §18.6):

Values and sources of each key: docs/methods/fednoro.md §23.18; what each key is: ``FedNoRoParams``.

Plain switches and ablations
- ``kd_temperature`` T = 0.8 (hard-coded in the code's ``train_FedNoRo``) divides the teacher's logits
  only, with no T² factor, as the code.
- ``logit_adjust`` (false: plain CE wherever L_LA appears), ``kd`` (false: noisy clients train like
  clean ones), ``daagg`` (false: n_k-weighted FedAvg in stage 2): one flag per component, for ablations.

Implementation notes and deviations (docs/methods/fednoro.md §18.7)
- The augmentation of the detection pass is the dataset's (random crop + flip where it defines one),
  not the code's ICH / ISIC transform (random affine ±10°, 2% translation, horizontal flip).
- DaAgg under partial participation: distances are taken to the clean clients *of this round*; a
  round without a clean (or without a noisy) client, or all distances 0, gives the FedAvg weights.
  The code divides by max D = 0 (nan) in the latter cases and fails on an empty clean set.
- Detection runs on the server through ``ctx.views`` (one forward pass of the global model over each
  client's samples, in eval mode); it stands for each client uploading its C per-class losses, which
  ``comm_cost`` / ``bytes_up`` do not count. The code runs the same pass centrally over the pooled
  training set.
- A class no client holds (an all-nan column) becomes 0; a constant column normalises to 0 (the code
  gives nan). With fewer than two clients nothing is flagged.
- ``rampup_rounds`` = 0 gives λ = a from ``rampup_begin`` on (the code divides by zero).
- If detection flags every client, stage 2 trains all of them with the KD loss and DaAgg falls back
  to FedAvg weights (no clean reference model).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedlnl.conf.checks import choice, flag, integer, number, positive
from fedlnl.methods.common import engine
from fedlnl.methods.common.noisyclients import (  # noqa: F401  (the shared pieces, re-exported)
    DISTANCES, GMM_SEEDS, adjustment, daagg_weights, detect_clients, detect_noisy_clients, gmm_noisy, gmm_seed_list,
    la_loss, model_distance, normalise_columns, per_class_losses, two_stage_aggregate)
from fedlnl.methods.common.noisyclients import DetectionParams
from fedlnl.methods.common.params import around, linear, param, rule
from fedlnl.methods.fedavg import FedAvg

KD_STUDENTS = ("plain", "adjusted")


# ----------------------------------------------------------------------------------- losses
def kd_loss(logits, teacher_logits, temperature: float, adj=None):
    """L_KD = KL(softmax(teacher/T) ‖ p_student), batch mean (FedNoRo stage 2, docs/methods/fednoro.md §18.3). With
    ``adj`` the student is the logit-adjusted log-softmax with −∞ entries replaced by 0 (the code's
    ``LA_KD``, docs/methods/fednoro.md §18.6 (3)): a class the client lacks then adds a constant, no gradient."""
    target = F.softmax(teacher_logits / temperature, dim=1)
    if adj is None:
        log_student = F.log_softmax(logits, dim=1)
    else:
        log_student = F.log_softmax(logits + adj, dim=1)
        log_student = torch.where(torch.isinf(log_student), torch.zeros_like(log_student), log_student)
    return F.kl_div(log_student, target, reduction="batchmean")


def distillation_loss(logits, teacher_logits, labels, adj, lam: float, temperature: float, adjusted_student: bool):
    """A noisy client's stage-2 loss (1 − λ)·L_LA + λ·L_KD (FedNoRo stage 2, docs/methods/fednoro.md §18.3): with
    ``adjusted_student`` the code's ``LA_KD``, whose NLL term on the adjusted log-softmax is L_LA for a
    label the client holds."""
    kd = kd_loss(logits, teacher_logits, temperature, adj if adjusted_student else None)
    return (1.0 - lam) * la_loss(logits, labels, adj) + lam * kd


def rampup_weight(rnd: int, begin: int, length: int, a: float) -> float:
    """λ(t) = a·exp(−5(1 − s)²), s = clip((t − begin)/length, 0, 1) (the code's ``sigmoid_rampup``,
    docs/methods/fednoro.md §18.3; ``length`` 0 = λ = a from the start)."""
    if length <= 0:
        return float(a)
    s = min(max((rnd - begin) / length, 0.0), 1.0)
    return float(a * math.exp(-5.0 * (1.0 - s) ** 2))


# ----------------------------------------------------------------------------------- the method
@dataclass(frozen=True)
class FedNoRoParams(DetectionParams):
    """FedNoRo's own numbers (conf/method/fednoro.yaml names each value's source; docs/methods/fednoro.md §18)."""

    lambda_: float = param("a: the KD weight λ after the ramp",
                           rule(number, lambda v: 0 <= v <= 1, "a loss weight λ in [0, 1]"), convert=float,
                           search=linear(0.1, 1.0, "our choice: around the code's a = 0.8, within the weight's [0, 1] "
                                                   "(the paper's method section was not available, docs/methods/fednoro.md §18)"))
    lambda_rampup: bool = param("λ rises as a·exp(−5(1 − s)²) (false: λ = a from the start)", rule(flag))
    rampup_begin: int = param("t0 of the λ ramp, an absolute round", rule(integer, 0))
    rampup_rounds: int = param("R: rounds of the λ ramp", rule(integer, 0))
    kd_temperature: float = param("T dividing the teacher's logits", rule(positive, "a temperature > 0"), convert=float,
                                  search=around(4, "our choice: ×/÷ 4 around the code's T = 0.8 (docs/methods/fednoro.md §18)"))
    logit_adjust: bool = param("ablation: L_LA (false: plain CE everywhere)", rule(flag))
    kd: bool = param("ablation: KD for noisy clients (false: L_LA as the clean ones)", rule(flag))
    kd_student: str = param("the KD student: logit-adjusted log-softmax (adjusted, code) | plain",
                            rule(choice, KD_STUDENTS))


def kd_weight(p: FedNoRoParams, rnd: int) -> float:
    """λ of round ``rnd``: the ramp starts at ``p.rampup_begin`` (the code's ``--begin``), counted from
    the start of the run like the code's rounds, whatever the warm-up length (docs/methods/fednoro.md §18.3)."""
    return rampup_weight(rnd, p.rampup_begin, p.rampup_rounds if p.lambda_rampup else 0, p.lambda_)


class FedNoRo(FedAvg):
    family = "federated label-noise methods"

    Params = FedNoRoParams

    def total_rounds(self, info, rounds):
        return self.params.check_rounds(rounds)

    # ------------------------------------------------------------------ hooks
    def init(self, model, info, ctx):
        teacher = copy.deepcopy(model).eval()  # the global model as KD teacher (stage 2)
        for p in teacher.parameters():
            p.requires_grad_(False)
        return {"model": model, "teacher": teacher, "global": engine.get_weights(model),
                "num_classes": info.num_classes, "noisy": None}

    def client_update(self, state, client, ctx):
        adj = adjustment(client.labels, state["num_classes"], self.la_tau if self.logit_adjust else 0.0)
        distil = state["noisy"] is not None and self.kd and bool(state["noisy"][client.id])
        if not distil:  # warm-up, or a clean client of stage 2: L_LA (plain CE when adj = 0)
            return engine.train_from_global(state, client, ctx, loss_fn=lambda m, xb, yb, s, g: la_loss(m(xb), yb, adj),
                                            **self.fl.training())
        teacher = state["teacher"]
        engine.set_weights(teacher, state["global"])
        lam = kd_weight(self.params, ctx.round)

        def loss_fn(model, xb, yb, step, gen):
            out = model(xb)
            with torch.no_grad():
                target = teacher(xb)
            return distillation_loss(out, target, yb, adj, lam, self.kd_temperature, self.kd_student == "adjusted")

        return engine.train_from_global(state, client, ctx, loss_fn=loss_fn, **self.fl.training())

    def aggregate(self, state, updates, ctx):
        stage2 = state["noisy"] is not None
        metrics = two_stage_aggregate(state, updates, ctx, self.warmup_rounds,
                                      lambda: detect_clients(self, state, ctx, "fednoro"), self.daagg, self.distance)
        if stage2:
            metrics = {"stage": "training", "lambda": kd_weight(self.params, ctx.round), **metrics}
        return state, metrics
