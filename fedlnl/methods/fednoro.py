"""FedNoRo — Wu, Yu, Jiang, Cheng, Yan, "FedNoRo: Towards Noise-Robust Federated Learning by Addressing
Class Imbalance and Label Noise Heterogeneity", IJCAI 2023 (arXiv 2305.05230). Official code:
https://github.com/wnn2000/FedNoRo at commit 6719ad7 (``train_FedNoRo.py``, ``utils/{FedAvg,losses,
local_training,options,utils}.py``). Facts, hyperparameters and code quirks: methods.md §18.

Sources checked: every statement below about "the code" was read in that commit. Of the paper only the
abstract and introduction were available as text (no method section, equations or experimental
details), so comments cite the paper by stage, not by equation number, and the "paper" column of the
switches is the plain form of each component as the abstract names it (methods.md §18.6): inferred,
not read.

Two stages within the FedAvg-equivalent budget ``fl.rounds`` (the code's ``--rounds`` also counts the
warm-up ``--s1``); m = max(⌊frac·N⌋, 1) clients per round, uniformly without replacement, in both.

1. **Warm-up** (``warmup_rounds`` = T₁ rounds; methods.md §18.1): FedAvg (n_k-weighted) in which every
   client trains with the logit-adjusted loss (Menon et al., ICLR 2021)

       L_LA(x, y) = −log softmax(f(x) + τ·log π_k)_y,

   π_k the class prior of client k's *observed* labels (τ = ``la_tau`` = 1, the code's ``LogitAdjust``
   default; a class the client lacks gets log 0 = −∞: probability 0 in local training, no gradient on
   its logit, as the code; evaluation uses the raw logits).
2. **Noisy-client detection**, once, with the global model of the last warm-up round (paper stage 1;
   methods.md §18.2): every client's per-class mean loss l_k^c = mean over its samples observed as class
   c of CE(f(x; w_g), c) forms a vector l_k ∈ R^C. A class a client lacks takes the smallest value of
   that class over the other clients (the code's ``nanmin``); each class column is min-max normalised
   over the clients; a 2-component GMM (scikit-learn defaults, full covariance) is fitted on the N × C
   matrix and the clients of the component with the larger sum of means are noisy (the code's
   ``argmax(means_.sum(1))``). Decisions go to ``ctx.report_clients(is_noisy=...)`` for every client.
3. **Noise-robust training** (the remaining ``fl.rounds − T₁`` rounds, paper stage 2; methods.md
   §18.3): clean clients keep L_LA; noisy clients minimise (1 − λ)·L_LA + λ·L_KD with
   L_KD = KL(softmax(f(x; w_g)/T) ‖ p_student), the global model received this round as the teacher
   (eval mode, same augmented batch; the student trains in train mode). λ follows the code's sigmoid
   ramp-up (Laine & Aila 2017) λ(t) = a·exp(−5(1 − s)²), s = clip((t − T₁)/R, 0, 1), a = ``lambda_`` =
   0.8 and R = ``rampup_rounds`` (code: ``--begin 10 --end 49``, R = 39, rounds counted from the start
   of the run); ``lambda_rampup: false`` keeps λ = a. The server aggregates with **DaAgg** (methods.md
   §18.4): D_k = 0 for a clean client, D_k = min_{j clean} d(w_k, w_j) for a noisy one,
   D̂_k = D_k / max_j D_j, and w_g = Σ_k n_k·e^{−D̂_k}·w_k / Σ_k n_k·e^{−D̂_k} over every state-dict
   entry (BatchNorm statistics included, as the code).

Fidelity switches (``${fidelity:<paper>,<reference>}``; ``fidelity=reference`` flips all). The paper
column is inferred (see above); the reference column is the code.

| switch | paper (default) | reference (``fidelity=reference``) | methods.md |
|---|---|---|---|
| ``distance`` | ``l2``: d = ‖w_k − w_j‖₂ over the whole model | ``sum_of_norms``: Σ over float state-dict entries of ‖Δ_entry‖₂ (``model_dist``) | §18.6 (1) |
| ``gmm_votes`` | 1: one GMM decides | 9: nine GMMs (different seeds) vote; the most frequent noisy set wins (ties: the first) | §18.6 (2) |
| ``kd_student`` | ``plain``: L_KD on the local model's own softmax | ``adjusted``: on log softmax(f(x) + τ·log π_k) with −∞ entries set to 0 (``LA_KD``) | §18.6 (3) |
| ``detect_augment`` | false: per-class losses on plain images | true: on augmented views (the code's pass reads the training transform), in eval mode | §18.6 (4) |

Plain switches and ablations (same value in both modes)
- ``kd_temperature`` T = 0.8 (hard-coded in the code's ``train_FedNoRo``) divides the teacher's logits
  only, with no T² factor, as the code; ``lambda_rampup: true`` / ``rampup_rounds`` are the code's
  ramp-up.
- ``logit_adjust`` (false: plain CE wherever L_LA appears), ``kd`` (false: noisy clients train like
  clean ones), ``daagg`` (false: n_k-weighted FedAvg in stage 2): one flag per component, for ablations.

Implementation notes and deviations (methods.md §18.7)
- Local training is the suite's (``fl`` group: SGD, ``fl.local_epochs``, ``fl.batch_size``, fresh
  optimiser per round), as for every method; the code's Adam (lr 3e-4, betas (0.9, 0.999), weight
  decay 5e-4, batch 16, 5 local epochs, also fresh per round) is not reproduced. The code trains every
  client every round (frac = 1); here ``fl.frac`` applies (``fl.frac=1`` gives full participation).
- DaAgg under partial participation: distances are taken to the clean clients *of this round*; a
  round without a clean (or without a noisy) client, or all distances 0, gives the FedAvg weights.
  The code divides by max D = 0 (nan) in the latter cases and fails on an empty clean set.
- Detection runs on the server through ``ctx.views`` (one forward pass of the global model over each
  client's samples, in eval mode); it stands for each client uploading its C per-class losses, which
  ``comm_cost`` / ``bytes_up`` do not count. The code runs the same pass centrally over the pooled
  training set.
- A class no client holds (an all-nan column) becomes 0; a constant column normalises to 0 (the code
  gives nan). With fewer than two clients nothing is flagged.
- GMM seeds come from ``ctx.rng`` (the code uses random_state 0..8 regardless of the run seed).
- If detection flags every client, stage 2 trains all of them with the KD loss and DaAgg falls back
  to FedAvg weights (no clean reference model).
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from fedlnl.methods.common import checks, engine
# the noisy-client tools FedELC shares (methods.md §22.3), kept importable from here
from fedlnl.methods.common.noisyclients import (  # noqa: F401
    DISTANCES, adjustment, daagg_weights, detect_noisy_clients, gmm_noisy, la_loss, model_distance,
    normalise_columns, per_class_losses, two_stage_aggregate)

KD_STUDENTS = ("plain", "adjusted")


# ----------------------------------------------------------------------------------- losses
def kd_loss(logits, teacher_logits, temperature: float, adj=None):
    """L_KD = KL(softmax(teacher/T) ‖ p_student), batch mean (FedNoRo stage 2, methods.md §18.3). With
    ``adj`` the student is the logit-adjusted log-softmax with −∞ entries replaced by 0 (the code's
    ``LA_KD``, methods.md §18.6 (3)): a class the client lacks then adds a constant, no gradient."""
    target = F.softmax(teacher_logits / temperature, dim=1)
    if adj is None:
        log_student = F.log_softmax(logits, dim=1)
    else:
        log_student = F.log_softmax(logits + adj, dim=1)
        log_student = torch.where(torch.isinf(log_student), torch.zeros_like(log_student), log_student)
    return F.kl_div(log_student, target, reduction="batchmean")


def rampup_weight(rnd: int, begin: int, length: int, a: float) -> float:
    """λ(t) = a·exp(−5(1 − s)²), s = clip((t − begin)/length, 0, 1) (the code's ``sigmoid_rampup``,
    methods.md §18.3; ``length`` 0 = λ = a from the start)."""
    if length <= 0:
        return float(a)
    s = min(max((rnd - begin) / length, 0.0), 1.0)
    return float(a * math.exp(-5.0 * (1.0 - s) ** 2))


# ----------------------------------------------------------------------------------- the method
class FedNoRo:
    def __init__(self, fl, warmup_rounds, lambda_, lambda_rampup, rampup_rounds, kd_temperature, la_tau,
                 logit_adjust, kd, daagg, distance, gmm_votes, kd_student, detect_augment):
        checks.integer("warmup_rounds", warmup_rounds, 1)
        checks.number("lambda_", lambda_, lambda v: 0 <= v <= 1, "a loss weight λ in [0, 1]")
        checks.flag("lambda_rampup", lambda_rampup)
        checks.integer("rampup_rounds", rampup_rounds, 0)
        checks.number("kd_temperature", kd_temperature, lambda v: v > 0, "a temperature > 0")
        checks.number("la_tau", la_tau, lambda v: v >= 0, "a logit-adjustment scale τ >= 0")
        for key, v in (("logit_adjust", logit_adjust), ("kd", kd), ("daagg", daagg)):
            checks.flag(key, v)
        checks.choice("distance", distance, DISTANCES)
        checks.integer("gmm_votes", gmm_votes, 1)
        checks.choice("kd_student", kd_student, KD_STUDENTS)
        checks.flag("detect_augment", detect_augment)
        self.fl = fl
        self.warmup_rounds, self.lambda_, self.lambda_rampup = warmup_rounds, float(lambda_), lambda_rampup
        self.rampup_rounds, self.kd_temperature, self.la_tau = rampup_rounds, float(kd_temperature), float(la_tau)
        self.logit_adjust, self.kd, self.daagg = logit_adjust, kd, daagg
        self.distance, self.gmm_votes, self.kd_student = distance, gmm_votes, kd_student
        self.detect_augment = detect_augment

    def total_rounds(self, info, rounds):
        checks.number("warmup_rounds", self.warmup_rounds, lambda v: v < rounds,
                      f"an integer < fl.rounds={rounds} (stage 2 needs at least one round)")
        return int(rounds)

    def _weight(self, rnd: int) -> float:
        """λ of round ``rnd`` (the code counts rounds from the start of the run)."""
        length = self.rampup_rounds if self.lambda_rampup else 0
        return rampup_weight(rnd, self.warmup_rounds, length, self.lambda_)

    # ------------------------------------------------------------------ hooks
    def init(self, model, info, ctx):
        teacher = copy.deepcopy(model).eval()  # the global model as KD teacher (stage 2)
        for p in teacher.parameters():
            p.requires_grad_(False)
        return {"model": model, "teacher": teacher, "global": engine.get_weights(model),
                "num_classes": info.num_classes, "noisy": None}

    def sample_clients(self, state, ctx):
        return engine.uniform_clients(ctx.num_clients, self.fl.frac, ctx.rng("sample"))

    def client_update(self, state, client, ctx):
        adj = adjustment(client.labels, state["num_classes"], self.la_tau if self.logit_adjust else 0.0)
        ce_term = lambda out, y: la_loss(out, y, adj)  # noqa: E731  (plain CE when adj = 0)
        distil = state["noisy"] is not None and self.kd and bool(state["noisy"][client.id])
        if not distil:  # warm-up, or a clean client of stage 2: L_LA
            return engine.train_from_global(state, client, ctx, loss_fn=lambda m, xb, yb, s, g: ce_term(m(xb), yb),
                                            **self.fl.sgd())
        teacher = state["teacher"]
        engine.set_weights(teacher, state["global"])
        lam = self._weight(ctx.round)
        student_adj = adj if self.kd_student == "adjusted" else None

        def loss_fn(model, xb, yb, step, gen):
            out = model(xb)
            with torch.no_grad():
                target = teacher(xb)
            # (1 − λ)·L_LA + λ·L_KD (FedNoRo stage 2; the code's LA_KD, methods.md §18.3)
            kd = kd_loss(out, target, self.kd_temperature, student_adj)
            return (1.0 - lam) * ce_term(out, yb) + lam * kd

        return engine.train_from_global(state, client, ctx, loss_fn=loss_fn, **self.fl.sgd())

    def aggregate(self, state, updates, ctx):
        stage2 = state["noisy"] is not None
        metrics = two_stage_aggregate(state, updates, ctx, self.warmup_rounds, lambda: self._detect(state, ctx),
                                      self.daagg, self.distance)
        if stage2:
            metrics.update(stage="training", **{"lambda": self._weight(ctx.round)})
        return state, metrics

    def eval_model(self, state):
        engine.set_weights(state["model"], state["global"])
        return state["model"]

    def _detect(self, state, ctx):
        """Noisy clients by the global model's per-class losses (methods.md §18.2)."""
        return detect_noisy_clients(state["model"], state["global"], ctx, state["num_classes"],
                                    self.fl.eval_batch_size, self.detect_augment, self.gmm_votes, key="fednoro")
