"""FedCorr — Xu, Chen, Liu, Zhou, Wang, Li, Wang, Huang, "FedCorr: Multi-Stage Federated Learning
for Label Noise Correction", CVPR 2022. Official code: https://github.com/Xu-Jingyi/FedCorr
(docs/methods/fedcorr.md §2: stages, state, LID estimator, hyperparameters, code-vs-paper divergences Q1–Q25).

Three stages, decided from ``ctx.round`` (total rounds = T1·S + T2 + T3, see ``schedule``):

1. **Pre-processing** (T1 iterations; "fraction scheduling"). Each iteration is S sub-rounds (runner
   rounds). With fraction scheduling (γ₁ = 1/N) a sub-round trains one client, all N in a random
   order without repetition, and the "aggregate" of one model is that model: stage 1 is sequential
   (Q4). Client k starts from the current global model w_g and minimises CE on mixup (α) plus
   β·μ̂_k^(t−1)·‖w − w_g‖² (Eq. 5; μ̂ from the previous iteration, 0 at first). It then scores its own
   samples with its trained model: LID of the softmax outputs (Eq. 2, k = ``lid_k``, self excluded;
   its mean is uploaded as ``payload["lid"]``) and per-sample losses, which the client keeps in its
   memory (``state["losses"][k]``, the client's own computation reused at the end of the iteration,
   as the reference does; recomputing them with the final global model would change the method).
   At the last sub-round of an iteration the server adds the LIDs to the cumulative LID, fits a
   2-component GMM (scikit-learn defaults) → LID-noisy clients (the larger-mean component). Each
   noisy client fits a GMM on its per-sample losses → its noisy samples D_k^n and μ̂_k = |D_k^n|/n_k
   (μ̂ = 0 for LID-clean clients; recomputed each iteration, Q14, from this iteration's losses, Q16).
   With ``correction``, each noisy client relabels to the global model's prediction the top
   ⌊π·|D_k^n|⌋ samples by loss whose global confidence is ≥ θ (Eqs. 6–7).
2. **Fine-tuning** (T2 rounds): FedAvg with fraction γ = ``frac`` over S_c = {k : μ̂_k ≤ κ} (no prox);
   then (``correction``) the noisy clients relabel every sample whose global confidence is ≥ θ.
   An empty S_c stops the run with a ValueError naming ``method.kappa`` (the reference divides by 0).
3. **Usual training** (T3 rounds): FedAvg with fraction γ on all clients and the corrected labels;
   or, with ``stage3`` set to another method's config, that method for T3 rounds (paper Fig. 4):
   ``stage3.init(model with the current global weights, info, ctx)`` at the first stage-3 round, then
   its sample_clients / client_update / aggregate / eval_model. Its own ``rounds`` is ignored (T3
   counts). It sees a context whose ``round`` starts at 0 with ``total_rounds`` = T3 and whose seed is
   derived from the run seed (so its draws do not repeat FedCorr's). Labels corrected in stages 1–2
   reach it through the client views.

Local training everywhere: ``fl.local_epochs`` epochs of SGD (momentum 0.5, fresh optimiser), batch
``fl.batch_size``; server: n_k-weighted average of every state-dict entry (Q21). Relabels go through
``ctx.relabel`` (applied by the runner to every later view, permanent). Communication cost: one per
client trained, so CIFAR-10 totals 100·5 + 10·500 + 10·450 = 10,000 (docs/methods/setup.md §14).

Fidelity switches (default ``${fidelity:<paper>,<reference>}``; ``fidelity=reference`` = official code)

Values and sources of each key: docs/methods/fedcorr.md §23.1; what each key is: ``FedCorrParams``.

``stage1_replace`` only matters without fraction scheduling (one client per sub-round cannot repeat).
Then the reference runs ⌊1/γ⌋ sub-rounds of ⌊γN⌋ draws (a client may train twice in a sub-round and
another not at all in that iteration: its LID adds 0 and its loss memory is the last one it made);
the paper setting runs ⌈N/m⌉ sub-rounds over one permutation (m = ⌊γN⌋, the last possibly smaller).
Both agree whenever m divides N, as in every paper setting. The reference behaviours ``relabel_cap``,
``untrained_losses`` and ``relabel_without_finetuning`` have switches of their own:
``untrained_losses`` only matters with ``stage1_replace`` (otherwise every client trains once per
iteration); ``relabel_without_finetuning`` only when T2 = 0 (or ``fine_tuning`` off).
``kappa_cmp`` (``le`` | ``lt``) is a plain switch: Sec. 3.3 and the code use μ̂ ≤ κ (default),
Algorithm 1 line 14 writes μ < 0.1 (Q12).

Ablations (FedCorr Table 6), all true by default: ``correction`` (no relabeling in stages 1–2 when
false; noise estimation still runs), ``fraction_scheduling`` (false: stage 1 uses γ = ``frac`` and
averages each sub-round's models, anchors the prox at the sub-round's global model), ``local_prox``
(false: β = 0), ``fine_tuning`` (false: stage 2 and its relabeling skipped), ``usual_training``
(false: stage 3 skipped), ``mixup`` (false: plain CE everywhere). T2 = 0 / T3 = 0 skip the stage
the same way.

Implementation notes and decisions where paper and code are silent
- The global model of stage 1 changes after every client; the model used to relabel at the end of
  an iteration is the one after its last sub-round (as in the code).
- LID: exact Euclidean distances in probability space, float64; duplicate outputs give LID 0 (as the
  code); with ≤ k samples k' = n − 1 neighbours (the code keeps k in the numerator) — ``lnl.lid_scores``.
- GMM ``random_state`` comes from ``ctx.rng`` (the code uses the run seed for every GMM).
- Diagnostics at the end of every iteration: ``ctx.report_clients`` (LID-noisy flag and μ̂ for every
  client), ``ctx.report_samples`` over every client's samples (GMM-noisy for LID-noisy clients, none
  flagged for LID-clean clients, so recall counts the noisy samples of missed clients), and
  ``ctx.record("lid" / "lid/iter{t}", ...)`` with the per-iteration and cumulative LIDs, the LID-GMM
  parameters, the noisy set and μ̂ (FedCorr Figs. 3, 6). Stage 2 records ``"finetuning"``.
- Stage 2 picks m = min(max(⌊γN⌋, 1), |S_c|) clients uniformly without replacement (as the code).
- Stages 1–2 never call ``stage3``, so FedCorr and its variants share them (``shared_prefix``): the
  runner computes them once per federation and starts each variant's stage 3 from that state
  (``reuse_prefix``, benchmark/runner.py), with the numbers the variant computes alone.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedlnl.conf.checks import choice, fail, flag, integer, number, positive, unit
from fedlnl.methods.common import engine, lnl
from fedlnl.methods.common.params import Method, Params, linear, param, rule
from fedlnl.methods.common.protocol import (ClientUpdate, Planned, UpdatePlan, local_steps, planned_clients,
                                            planned_update)

PRE, FT, USUAL = "preprocessing", "finetuning", "usual"
STAGES = (PRE, FT, USUAL)

#: allowed values of the string switches (the first is the paper's)
CHOICES = {
    "prox_form": engine.PROX_FORMS,
    "loss_on": ("logits", "softmax"),
    "rank_model": ("global", "local"),
    "rank_pool": ("noisy", "all"),
    "stage2_relabel": ("unclean", "lid_noisy"),
    "kappa_cmp": ("le", "lt"),
    "relabel_cap": ("noisy_count", "mu_hat"),
    "untrained_losses": ("keep", "zero"),
}


# ----------------------------------------------------------------------------------- schedule
def stage1_shape(num_clients: int, frac: float, fraction_scheduling: bool, replace: bool):
    """(sub-rounds per stage-1 iteration S, clients drawn per sub-round m)."""
    if fraction_scheduling:
        return num_clients, 1  # γ₁ = 1/N: one client per sub-round, N sub-rounds
    m = engine.cohort_size(frac, num_clients)
    if replace:  # the reference: ⌊1/γ⌋ sub-rounds of ⌊γN⌋ draws
        return max(int(1.0 / frac + 1e-9), 1), m
    return math.ceil(num_clients / m), m  # one permutation cut into chunks of m


def stage_lengths(num_clients, T1, T2, T3, frac, *, fraction_scheduling=True, fine_tuning=True,
                  usual_training=True, replace=False) -> dict[str, int]:
    """Rounds of the runner spent in each stage."""
    s, _ = stage1_shape(num_clients, frac, fraction_scheduling, replace)
    return {PRE: T1 * s, FT: T2 if fine_tuning else 0, USUAL: T3 if usual_training else 0}


def schedule(num_clients, T1, T2, T3, frac, *, fraction_scheduling=True, fine_tuning=True,
             usual_training=True, replace=False, num_clean=None) -> list[tuple[str, int]]:
    """(stage, clients trained) for every round, computed without training. Stage 2 assumes
    ``num_clean`` = |S_c| clients qualify (all, if None); stage 3 is FedCorr's own FedAvg.
    The sum of the second entries is the total communication cost (docs/methods/setup.md §14)."""
    s, m = stage1_shape(num_clients, frac, fraction_scheduling, replace)
    m23 = engine.cohort_size(frac, num_clients)
    out = []
    for _ in range(T1):
        for j in range(s):
            out.append((PRE, m if replace or fraction_scheduling else min(m, num_clients - j * m)))
    if fine_tuning:
        out += [(FT, min(m23, num_clients if num_clean is None else num_clean))] * T2
    if usual_training:
        out += [(USUAL, m23)] * T3
    return out


def _derived_seed(seed: int, tag: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}/{tag}".encode(), digest_size=8).digest(), "little") >> 1


# ----------------------------------------------------------------------------------- the method
def _flag(doc: str):
    return param(doc, rule(flag))


def _switch(name: str, doc: str):
    return param(doc, rule(choice, CHOICES[name]))


@dataclass(frozen=True)
class FedCorrParams(Params):
    """FedCorr's own numbers (conf/method/fedcorr.yaml; docs/methods/fedcorr.md §2, Q-numbers there)."""

    T1: int = param("pre-processing iterations (each: every client once)", rule(integer, 1))
    T2: int = param("fine-tuning rounds", rule(integer, 0))
    T3: int = param("usual-training rounds", rule(integer, 0))
    beta: float = param("prox weight β (Eq. 5), times the client's μ̂ of the previous iteration",
                        rule(number, lambda v: v >= 0, "a weight >= 0"))
    theta: float = param("confidence threshold θ (Eq. 7)", rule(unit, "a confidence in [0, 1]"),
                         search=linear(0.3, 0.9, "FedCorr Table 7 sets θ = 0.5 (CIFAR) and 0.9 (Clothing1M): our "
                                                 "range over them, widened below"))
    pi_: float = param("relabel ratio π (Eq. 6)", rule(unit, "a share in [0, 1]"),
                       search=linear(0.3, 0.8, "FedCorr Table 7 sets π = 0.5 (CIFAR) and 0.8 (Clothing1M): our range "
                                               "over them, widened below"))
    kappa: float = param("clean-set threshold κ: fine-tuning clients have μ̂ ≤ κ", rule(unit, "a noise level in [0, 1]"))
    lid_k: int = param("neighbours of the LID estimate (Eq. 2)", rule(integer, 1))
    mixup_alpha: float = param("Beta(α, α) of mixup", rule(positive, "a Beta concentration > 0"))
    correction: bool = _flag("ablation (Table 6): relabel in stages 1-2")
    fraction_scheduling: bool = _flag("ablation: stage 1 trains one client per sub-round (γ₁ = 1/N)")
    local_prox: bool = _flag("ablation: the prox term of Eq. 5 (false: β = 0)")
    fine_tuning: bool = _flag("ablation: stage 2")
    usual_training: bool = _flag("ablation: stage 3")
    mixup: bool = _flag("ablation: mixup (false: plain CE everywhere)")
    prox_form: str = _switch("prox_form", "Q6: ‖w − w_g‖² (squared) | ‖w − w_g‖ (norm)")
    prox_skip_first: bool = _flag("Q6: no prox on the first batch of every epoch")
    mixup_all_stages: bool = _flag("Q7: mixup in all three stages (false: stage 1 only)")
    loss_on: str = _switch("loss_on", "Q9: CE of the logits | of the softmax (double softmax)")
    score_augment: bool = _flag("Q8: LID, losses and relabel predictions on augmented views")
    rank_model: str = _switch("rank_model", "Q10: rank relabel candidates by the global | local model's loss")
    rank_pool: str = _switch("rank_pool", "Q10: top share among the GMM-noisy samples | among all")
    strict_threshold: bool = _flag("Q11: confidence > θ (false: ≥ θ)")
    stage2_relabel: str = _switch("stage2_relabel", "Q13: stage-2 relabel on S∖S_c | the last LID-noisy set")
    stage1_replace: bool = _flag("Q5: stage-1 draws with replacement (without fraction scheduling)")
    kappa_cmp: str = _switch("kappa_cmp", "Q12: μ̂ ≤ κ (le, Sec. 3.3 and code) | μ̂ < κ (lt, Algorithm 1)")
    stage3: object = param("stage 3 by another method (paper Fig. 4); null = FedAvg")
    relabel_cap: str = param("Q10: ⌊π·|D_k^n|⌋ (noisy_count) | int(n_k·μ̂_k·π) (mu_hat)",
                             rule(choice, CHOICES["relabel_cap"]), default="noisy_count")
    untrained_losses: str = param("Q16: a client not drawn keeps | zeroes its losses",
                                  rule(choice, CHOICES["untrained_losses"]), default="keep")
    relabel_without_finetuning: bool = param("Q13: stage-2 relabel also after T2 = 0 rounds", rule(flag),
                                             default=False)

    def check(self) -> None:
        if self.stage3 is not None and not isinstance(self.stage3, Method):
            fail("method.stage3", self.stage3, "null or a method config (e.g. +method@method.stage3=fedprox)")


def clean_clients(mu_hat: np.ndarray, p: FedCorrParams) -> np.ndarray:
    """S_c membership: μ̂_k ≤ κ (Sec. 3.3, code) or < κ (Algorithm 1), by ``p.kappa_cmp``."""
    return mu_hat <= p.kappa if p.kappa_cmp == "le" else mu_hat < p.kappa


def stage1_plan(n: int, frac: float, p: FedCorrParams, rng: np.random.Generator) -> list[list[int]]:
    """The client lists of one stage-1 iteration's sub-rounds: a permutation cut into chunks (fraction
    scheduling: one client each), or, with ``p.stage1_replace``, draws with replacement."""
    s_count, m = stage1_shape(n, frac, p.fraction_scheduling, p.stage1_replace)
    if not p.stage1_replace or m == 1:
        order = rng.permutation(n).tolist()
        return [order[j * m:(j + 1) * m] for j in range(s_count)]
    plan, left = [], np.arange(n)
    for _ in range(s_count):  # Q5: with replacement within a sub-round, none drawn twice across
        draw = rng.choice(left, size=m, replace=True)
        plan.append(draw.tolist())
        left = np.setdiff1d(left, draw)
    return plan


def stage1_relabel_mask(p: FedCorrParams, logits: torch.Tensor, labels: torch.Tensor, noisy_mask: torch.Tensor,
                        local_losses: torch.Tensor | None, mu_hat: float) -> torch.Tensor:
    """Eqs. 6–7 for one LID-noisy client: the samples relabelled to the global model's argmax, the top
    ⌊π·|D_k^n|⌋ by loss (global or local model, among the GMM-noisy ``noisy_mask`` or all) whose
    confidence reaches θ. ``logits``: the global model's on the client's samples; ``local_losses``:
    the client's own per-sample losses (read when ``p.rank_model`` is local)."""
    # Eq. 6 cap ⌊π·|D_k^n|⌋, or the code's int(n_k·μ̂_k·π): equal up to float rounding
    count = (int(p.pi_ * int(noisy_mask.sum()))) if p.relabel_cap == "noisy_count" \
        else int(len(labels) * mu_hat * p.pi_)
    scores = lnl.sample_losses(logits, labels, p.loss_on) if p.rank_model == "global" else local_losses
    pool = noisy_mask if p.rank_pool == "noisy" else None
    return lnl.relabel_mask(logits.softmax(dim=1), p.theta, p.strict_threshold, scores, count, pool)


def finetune_targets(p: FedCorrParams, mu_hat: np.ndarray, noisy: np.ndarray) -> list[int]:
    """The clients relabelled after fine-tuning (Q13): outside S_c (unclean, paper) or the last
    LID-noisy set (noisy, code)."""
    chosen = ~clean_clients(mu_hat, p) if p.stage2_relabel == "unclean" else noisy
    return np.flatnonzero(chosen).tolist()


class FedCorr(Method):
    family = "federated label-noise methods"
    Params = FedCorrParams

    #: the shared `fl` keys FedCorr does not read (a typed override of one is refused)
    fl_unused = {"rounds": "its schedule is method.T1 iterations + method.T2 + method.T3 rounds"}

    # ------------------------------------------------------------------ stages
    def _lengths(self, num_clients: int) -> dict[str, int]:
        return stage_lengths(num_clients, self.T1, self.T2, self.T3, self.fl.frac,
                             fraction_scheduling=self.fraction_scheduling, fine_tuning=self.fine_tuning,
                             usual_training=self.usual_training, replace=self.stage1_replace)

    def total_rounds(self, info, rounds=None):
        return sum(self._lengths(info.num_clients).values())

    def shared_prefix(self, info, method_cfg: dict):
        """Stages 1-2 do not depend on ``stage3`` (it is first called at stage 3's first round), so
        FedCorr and its stage-3 variants (paper Fig. 4) of one federation share them: the runner
        starts stage 3 from the state the first of them saved (``reuse_prefix``). T3 stays in the key
        (the context's ``total_rounds`` counts it)."""
        sched = self._schedule(info.num_clients, info.seed)
        return (sched["start3"], {**method_cfg, "stage3": None}) if sched["start3"] and sched["lengths"][USUAL] else None

    def stage3_rounds(self, info) -> int:
        """Rounds the stage-3 method runs (T3, or 0 without usual training)."""
        return self._lengths(info.num_clients)[USUAL]

    def nested(self) -> dict:
        return {} if self.stage3 is None else {"stage3": self.stage3}

    def nested_rounds(self, key: str, info) -> int | None:
        return self.stage3_rounds(info) if key == "stage3" else None

    @staticmethod
    def _where(state, rnd: int) -> tuple[str, int]:
        """(stage, round within the stage) of a runner round."""
        for stage in STAGES:
            n = state["lengths"][stage]
            if rnd < n:
                return stage, rnd
            rnd -= n
        raise IndexError("round beyond FedCorr's last stage")

    def _delegating(self, stage: str) -> bool:
        return stage == USUAL and self.stage3 is not None

    def _ctx3(self, state, ctx):
        """The delegate's context: rounds counted from the start of stage 3, its own seed."""
        return dataclasses.replace(ctx, round=ctx.round - state["start3"],
                                   total_rounds=state["lengths"][USUAL], seed=state["seed3"])

    # ------------------------------------------------------------------ hooks
    def _schedule(self, n: int, seed: int) -> dict:
        """The state entries the schedule alone fixes (stage lengths, stage-1 shape, stage 3's
        start and seed), shared by ``init`` and the plan hooks."""
        lengths = self._lengths(n)
        return {"lengths": lengths, "shape1": stage1_shape(n, self.fl.frac, self.fraction_scheduling, self.stage1_replace),
                "start3": lengths[PRE] + lengths[FT], "seed3": _derived_seed(seed, "fedcorr/stage3")}

    def init(self, model, info, ctx):
        n = info.num_clients
        return {
            "model": model, "global": engine.get_weights(model), "info": info, **self._schedule(n, info.seed),
            "lid_cum": np.zeros(n), "lid_iter": np.zeros(n), "mu_hat": np.zeros(n),
            "noisy": np.zeros(n, dtype=bool), "losses": {}, "plan": [], "occ": {},
            "clean_pool": [], "stage3": None,
        }

    def sample_clients(self, state, ctx):
        stage, r = self._where(state, ctx.round)
        n = ctx.num_clients
        state["occ"] = {}
        if stage == PRE:
            s = r % state["shape1"][0]
            if s == 0:  # a new iteration: its whole client order is drawn now
                state["plan"] = self._stage1_order(ctx, s)
                state["lid_iter"] = np.zeros(n)
                state["trained"] = set()
            return state["plan"][s]
        if stage == FT:
            if r == 0:
                state["clean_pool"] = self._clean_pool(state, ctx)
            pool = state["clean_pool"]
            m = min(engine.cohort_size(self.fl.frac, n), len(pool))
            return sorted(ctx.rng("sample").choice(pool, size=m, replace=False).tolist())
        if self.stage3 is not None:
            if r == 0:
                engine.set_weights(state["model"], state["global"])
                state["stage3"] = self.stage3.init(state["model"], state["info"], self._ctx3(state, ctx))
            return self.stage3.sample_clients(state["stage3"], self._ctx3(state, ctx))
        return self._usual_clients(ctx)

    def _usual_clients(self, ctx) -> list[int]:
        return engine.uniform_clients(ctx.num_clients, self.fl.frac, ctx.rng("sample"))

    def _stage1_order(self, ctx, s: int) -> list[list[int]]:
        """The sub-round client lists of the stage-1 iteration whose sub-round ``s`` is ``ctx.round``,
        drawn at the iteration's first sub-round."""
        first = dataclasses.replace(ctx, round=ctx.round - s)
        return stage1_plan(ctx.num_clients, self.fl.frac, self.params, first.rng("fedcorr", "stage1_order"))

    def _clean_pool(self, state, ctx) -> list[int]:
        pool = np.flatnonzero(clean_clients(state["mu_hat"], self.params)).tolist()
        if not pool:
            op = "<=" if self.kappa_cmp == "le" else "<"
            raise ValueError(
                f"method.kappa={self.kappa}: no client has an estimated noise level mu_hat {op} kappa "
                f"after pre-processing (min mu_hat = {state['mu_hat'].min():.3f}), so fine-tuning has no "
                "clients; raise method.kappa or set method.fine_tuning=false")
        ctx.record("finetuning", {"clean_pool": pool, "mu_hat": state["mu_hat"].tolist()})
        return pool

    def client_update(self, state, client, ctx):
        stage, _ = self._where(state, ctx.round)
        if self._delegating(stage):
            return self.stage3.client_update(state["stage3"], client, self._ctx3(state, ctx))
        k = client.id
        occ = state["occ"].get(k, 0)  # a client drawn twice in one sub-round (Q5) trains twice
        state["occ"][k] = occ + 1
        prox_mu = self.beta * float(state["mu_hat"][k]) if stage == PRE and self.local_prox else 0.0
        use_mixup = self.mixup and (stage == PRE or self.mixup_all_stages)
        model = state["model"]
        loss = self._local_train(model, state["global"], client, ctx.generator("fedcorr_train", k, occ),
                                 use_mixup, prox_mu)
        update = ClientUpdate(k, engine.get_weights(model), client.size, train_loss=loss)
        if stage == PRE:
            # The client scores its own samples with its trained model: LID upload (Eq. 2) and
            # per-sample losses it keeps for the end-of-iteration GMM (client memory).
            logits = engine.predict(model, client.data, client.indices, self.fl.eval_batch_size,
                                    augment=self.score_augment, gen=ctx.generator("fedcorr_score", k, occ))
            lid = float(lnl.lid_scores(logits.softmax(dim=1), self.lid_k).mean())
            state["losses"][k] = lnl.sample_losses(logits, client.labels, self.loss_on)
            state.setdefault("trained", set()).add(k)
            update.payload = {"lid": lid}
        return update

    def _local_train(self, model, global_w, client, gen, use_mixup: bool, prox_mu: float) -> float:
        engine.set_weights(model, global_w)
        anchor = engine.param_anchor(model) if prox_mu > 0 else None

        def loss_fn(model, xb, yb, step, gen):
            if use_mixup:  # CE on mixup (Zhang et al. 2018), the first term of Eq. 5
                xm, ya, yb2, lam = engine.mixup(xb, yb, self.mixup_alpha, gen)
                loss = engine.mixup_ce(model(xm), ya, yb2, lam)
            else:
                loss = F.cross_entropy(model(xb), yb)
            if anchor is not None and not (self.prox_skip_first and step == 0):
                # β·μ̂_k·‖w − w_g‖² (Eq. 5), or the code's ‖w − w_g‖ (Q6)
                loss = loss + engine.prox_penalty(model, anchor, self.prox_form, mu=prox_mu)
            return loss

        return engine.local_train(
            model, client.data, client.indices, client.labels, gen=gen, loss_fn=loss_fn, **self.fl.training())

    # ------------------------------------------------------------------ plans (dry_run)
    def plan_clients(self, ctx):
        """``sample_clients`` without training: stage 1's orders and stage 3's draws are the run's;
        stage 2 draws m of the clients S_c that stage 1 estimates clean, so m is an upper bound."""
        sched = self._schedule(ctx.num_clients, ctx.seed)
        stage, r = self._where(sched, ctx.round)
        if stage == PRE:
            s = r % sched["shape1"][0]
            return self._stage1_order(ctx, s)[s]
        if stage == FT:
            return Planned(None, engine.cohort_size(self.fl.frac, ctx.num_clients), exact=False)
        if self.stage3 is not None:
            return planned_clients(self.stage3, self._ctx3(sched, ctx))
        return self._usual_clients(ctx)

    def plan_update(self, ctx, k, info, model):
        """Every stage trains ``fl.local_epochs`` passes (``_local_train``); stage 1 uploads the LID."""
        sched = self._schedule(ctx.num_clients, ctx.seed)
        stage, _ = self._where(sched, ctx.round)
        if self._delegating(stage):
            return planned_update(self.stage3, self._ctx3(sched, ctx), k, info, model)
        steps = local_steps(info.client_sizes[k], self.fl.local_epochs, self.fl.batch_size)
        return UpdatePlan(steps, payload=engine.payload_bytes({"lid": 0.0}) if stage == PRE else 0)

    def aggregate(self, state, updates, ctx):
        stage, r = self._where(state, ctx.round)
        if self._delegating(stage):
            state["stage3"], metrics = self.stage3.aggregate(state["stage3"], updates, self._ctx3(state, ctx))
            return state, {**metrics, "stage": USUAL}
        state["global"] = engine.weighted_average([u.weights for u in updates],
                                                  [u.num_samples for u in updates])
        metrics: dict = {"stage": stage}
        if stage == PRE:
            for u in updates:
                state["lid_iter"][u.client] = u.payload["lid"]
            s_count, _ = state["shape1"]
            t, s = divmod(r, s_count)
            if s == s_count - 1:
                metrics.update(self._end_iteration(state, t, ctx))
        elif stage == FT and r == state["lengths"][FT] - 1 and self.correction:
            metrics["stage2_relabeled"] = self._finetune_relabel(state, ctx)
        return state, metrics

    def eval_model(self, state):
        if state["stage3"] is not None:
            return self.stage3.eval_model(state["stage3"])
        engine.set_weights(state["model"], state["global"])
        return state["model"]

    # ------------------------------------------------------------------ server steps
    def _gmm_seed(self, ctx, *keys) -> int:
        return int(ctx.rng("fedcorr_gmm", *keys).integers(2**31 - 1))

    def _end_iteration(self, state, t: int, ctx) -> dict:
        """Cumulative-LID client split, per-client loss GMMs → μ̂, diagnostics, stage-1 relabel."""
        n = ctx.num_clients
        state["lid_cum"] = state["lid_cum"] + state["lid_iter"]
        split = lnl.gmm_split(state["lid_cum"], self._gmm_seed(ctx, "lid"))
        noisy = split.high  # clean = the smaller-mean component
        mu_hat, flags = np.zeros(n), {}
        for k in np.flatnonzero(noisy).tolist():
            losses = state["losses"].get(k)
            if losses is None:  # never trained yet (possible only with stage1_replace)
                continue
            if self.untrained_losses == "zero" and k not in state.get("trained", ()):
                # the reference's loss memory is re-zeroed every iteration (Q16): a client not
                # drawn in this iteration (stage1_replace) is fitted on zeros
                losses = torch.zeros_like(losses)
            g = lnl.gmm_split(losses.cpu().numpy(), self._gmm_seed(ctx, "loss", k))
            mu_hat[k] = g.share_high  # μ̂_k = |D_k^n| / n_k
            flags[k] = torch.as_tensor(g.high, device=losses.device)
        state["mu_hat"], state["noisy"] = mu_hat, noisy
        self._report(state, t, split, flags, ctx)
        relabeled = self._stage1_relabel(state, flags, ctx) if self.correction else 0
        out = {}
        if (self.correction and self.relabel_without_finetuning and state["lengths"][FT] == 0
                and t == self.T1 - 1):
            # the reference relabels after its fine-tuning loop even when that loop ran 0 rounds
            out["stage2_relabeled"] = self._finetune_relabel(state, ctx)
        return {**out, "iteration": t + 1, "lid_noisy_clients": int(noisy.sum()),
                "mu_hat_mean": float(mu_hat.mean()), "stage1_relabeled": relabeled}

    def _report(self, state, t, split, flags, ctx) -> None:
        n = ctx.num_clients
        noisy, mu_hat = state["noisy"], state["mu_hat"]
        ctx.report_clients(is_noisy={k: bool(noisy[k]) for k in range(n)},
                           mu_hat={k: float(mu_hat[k]) for k in range(n)})
        idx, flagged = [], []
        for k in range(n):
            view = ctx.views(k)
            idx.append(view.indices)
            flagged.append(flags.get(k, torch.zeros(view.size, dtype=torch.bool)).to(view.indices.device))
        ctx.report_samples(torch.cat(idx), torch.cat(flagged))
        rec = {"iteration": t + 1, "lid": state["lid_iter"].tolist(), "cumulative_lid": state["lid_cum"].tolist(),
               "gmm": split.params(), "noisy": noisy.tolist(), "mu_hat": mu_hat.tolist()}
        ctx.record("lid", rec)
        ctx.record(f"lid/iter{t + 1}", rec)

    def _global_predict(self, state, view, ctx, key: str) -> torch.Tensor:
        model = state["model"]
        engine.set_weights(model, state["global"])
        return engine.predict(model, view.data, view.indices, self.fl.eval_batch_size,
                              augment=self.score_augment, gen=ctx.generator(key, view.id))

    def _stage1_relabel(self, state, flags, ctx) -> int:
        """Eqs. 6–7 for every LID-noisy client: top ⌊π·|D_k^n|⌋ by loss, confidence ≥ θ → argmax."""
        total = 0
        for k, noisy_mask in flags.items():
            view = ctx.views(k)
            logits = self._global_predict(state, view, ctx, "fedcorr_relabel1")
            mask = stage1_relabel_mask(self.params, logits, view.labels, noisy_mask, state["losses"].get(k),
                                       float(state["mu_hat"][k]))
            total += self._relabel(view, mask, logits.softmax(dim=1), ctx)
        return total

    def _finetune_relabel(self, state, ctx) -> int:
        """After fine-tuning: every confident sample of the noisy clients → global prediction."""
        total = 0
        for k in finetune_targets(self.params, state["mu_hat"], state["noisy"]):
            view = ctx.views(k)
            probs = self._global_predict(state, view, ctx, "fedcorr_relabel2").softmax(dim=1)
            total += self._relabel(view, lnl.relabel_mask(probs, self.theta, self.strict_threshold), probs, ctx)
        return total

    @staticmethod
    def _relabel(view, mask: torch.Tensor, probs: torch.Tensor, ctx) -> int:
        new = probs.argmax(dim=1)
        changed = mask & (new != view.labels)
        if changed.any():
            ctx.relabel(view.indices[changed], new[changed])
        return int(changed.sum())
