"""PoC — Power-of-Choice client selection: Cho et al., "Client Selection in Federated Learning:
Convergence Analysis and Power-of-Choice Selection Strategies", AISTATS 2022 (no repository by the
authors; the supplementary code mirrored in ``peng-ju/Power-of-Choice``); configured as in FedCorr
(Xu et al., CVPR 2022): candidate pool d = 30, lr 0.01 (docs/methods/poc.md §10). This is ``pow-d``.

Implementation notes
- Selection each round (server side, in ``sample_clients``):
  1. a candidate set A of d clients drawn **without replacement with probability ∝ p_k = n_k/n**
     (``numpy.Generator.choice(p=...)``: successive draws, renormalised);
  2. the current global model's mean cross-entropy on each candidate's **full local data**
     (observed labels, eval mode, no augmentation; ``engine.predict`` on ``ctx.views(k)``);
  3. the m = max(⌊frac·N⌋, 1) candidates with the largest loss train (ties: lower client id).
  If d exceeds N the pool is every (non-empty) client; d < m is rejected before training.
- Clients train as FedAvg; the server takes the **simple average** (1/m) of the selected models,
  since sampling is already ∝ p_k (paper); ``weighted: true`` uses n_k-weights instead (FedCorr's
  choice is unknown).
- Communication: only the m trained clients count as participations (FedCorr's cost presumably
  counts those only, docs/methods/poc.md §10, docs/methods/setup.md §14). In a deployment each candidate would also download the
  global model and upload one loss scalar; those d evaluations are not training participations and
  are not added to ``comm_cost`` or ``bytes_up``, but their cumulative number is logged as
  ``poc_loss_evals`` so a user can charge them if wanted.
- As FedCorr's stage-3 delegate (FedCorr + PoC, Fig. 4) ``init`` takes the current global weights
  (and, with ``fixed_candidates``, draws the pool then); the losses use the labels as corrected by
  FedCorr's stages 1–2, because ``ctx.views`` carries the current observed labels.

Fidelity switch
- ``fixed_candidates``: false = a fresh candidate pool every round (paper); true = one pool drawn
  once and reused every round, the effect of the supplementary code's ``np.random.seed(args.seed)``
  inside ``sel_client`` (the ranking by loss still changes every round).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedlnl.conf.checks import flag, integer
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Params, around, param, rule
from fedlnl.methods.common.protocol import Planned
from fedlnl.methods.fedavg import FedAvg


def candidate_pool(sizes, d: int, rng: np.random.Generator) -> list[int]:
    """d distinct clients drawn successively with probability ∝ n_k (without replacement); d is
    capped at the number of non-empty clients."""
    sizes = np.asarray(sizes, dtype=np.float64)
    d = min(d, int(np.count_nonzero(sizes)))
    return sorted(rng.choice(sizes.size, size=d, replace=False, p=sizes / sizes.sum()).tolist())


def highest_loss(candidates: list[int], losses: list[float], m: int) -> list[int]:
    """The m candidates with the largest loss (ties broken by the lower client id), sorted."""
    order = sorted(range(len(candidates)), key=lambda i: (-losses[i], candidates[i]))
    return sorted(candidates[i] for i in order[:m])


@dataclass(frozen=True)
class PoCParams(Params):
    """Power-of-choice's own numbers (conf/method/poc.yaml)."""

    d: int = param("candidate pool size d (>= the clients per round)", rule(integer, 1),
                   search=around(2, "our choice: ×/÷ 2 around FedCorr's d (30; digits 10, the quickstart's m = 5 to "
                                    "N = 20); pow-d reports several d per m, no range", integer=True))
    weighted: bool = param("n_k-weighted average (false: 1/m, sampling is already ∝ n_k)", rule(flag))
    fixed_candidates: bool = param("one candidate pool for the whole run (false: a fresh pool every round)", rule(flag))


class PoC(FedAvg):
    family = "FL baselines"

    Params = PoCParams

    def check_pool(self, num_clients: int) -> None:
        m = engine.cohort_size(self.fl.frac, num_clients)
        if min(self.d, num_clients) < m:
            raise ValueError(f"method.d={self.d} is invalid: allowed d >= m = {m} clients per round")

    def total_rounds(self, info, rounds):
        self.check_pool(info.num_clients)  # before training (the runner reports it as a config error)
        return rounds

    def init(self, model, info, ctx):
        self.check_pool(info.num_clients)  # also as a stage-3 delegate, whose total_rounds is not asked
        pool = None
        if self.fixed_candidates:  # drawn once, reused every round
            pool = candidate_pool(info.client_sizes, self.d, ctx.rng("poc_pool"))
        return {"model": model, "global": engine.get_weights(model), "pool": pool, "evals": 0}

    def sample_clients(self, state, ctx):
        pool = state["pool"] or candidate_pool(ctx.client_sizes, self.d, ctx.rng("poc_pool"))
        model = state["model"]
        engine.set_weights(model, state["global"])
        losses = [self.global_loss(model, ctx.views(k)) for k in pool]
        state["evals"] += len(pool)
        return highest_loss(pool, losses, engine.cohort_size(self.fl.frac, ctx.num_clients))

    def plan_clients(self, ctx):
        """(dry_run) m of the candidates ``sample_clients`` draws; which m, their losses decide."""
        drawn_at = dataclasses.replace(ctx, round=0) if self.fixed_candidates else ctx  # init's pool: round 0
        pool = candidate_pool(ctx.client_sizes, self.d, drawn_at.rng("poc_pool"))
        return Planned(None, min(engine.cohort_size(self.fl.frac, ctx.num_clients), len(pool)), among=pool)

    @staticmethod
    def global_loss(model, view) -> float:
        logits = engine.predict(model, view.data, view.indices)
        return float(engine.per_sample_loss(logits, view.labels).mean())

    def aggregate(self, state, updates, ctx):
        counts = [u.num_samples if self.weighted else 1.0 for u in updates]
        state["global"] = engine.weighted_average([u.weights for u in updates], counts)
        return state, {"poc_loss_evals": float(state["evals"])}
