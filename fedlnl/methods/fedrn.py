"""FedRN — Kim, Shin, Jang, Song, Yun, "FedRN: Exploiting k-Reliable Neighbors Towards Robust Federated
Learning", CIKM 2022 (arXiv 2205.01310). Official code: https://github.com/ElvinKim/FedRN at commit
0b34b9a (``main_fed_LNL.py``, ``models/update.py::LocalUpdateFedRN``, ``run.sh``); FNBench's adaptation
(https://github.com/Sprinter1999/FNBench at 9cec427, ``main_fed_LNL.py`` and ``LocalUpdateFedRN``).
Facts, hyperparameters and divergences: docs/methods/fedlsr_fedrn_fedelc.md §22.2.

Sources checked: both codes were read in those commits; of the paper only the abstract and the
opening of the introduction were reachable as text (docs/methods/fedlsr_fedrn_fedelc.md §22 lists the addresses), so no
equation is cited by number and the "paper" column below is inferred (docs/methods/fedlsr_fedrn_fedelc.md §22.2).

FedAvg (n_k-weighted) in two phases within the budget ``fl.rounds`` = T:
1. **Warm-up** (rounds t < ⌊``warmup_ratio``·T⌋; both codes: 20 %; the quickstart's ``digits``: 67 %,
   docs/methods/fedlsr_fedrn_fedelc.md §22.2): plain local training. Every client that trains also uploads its *expertise*
   e_k (accuracy of its new local model on its own observed labels) and its *signature*
   s_k = f_k(z) (the local model's logits on one fixed Gaussian input z drawn once per run), C + 1
   floats counted in ``bytes_up``. The server keeps each client's latest model, e_k and s_k
   (``common.stores.ModelCache``; when: switch RN2 below).
2. **Reliable neighbours** (the remaining rounds), for a selected client k:
   - reliability of every other cached client j: min-max normalise, over k and the candidates,
     the expertise e and the similarity cos(s_k, s_j) (cos(s_k, s_k) = 1 included); score
     R_j = α·ê_j + (1 − α)·ŝ_j with α = ``w_alpha``; k's own weight is R_k = α·ê_k + (1 − α);
     the ``num_neighbors`` = K highest R_j (ties: lower client id) are k's reliable neighbours;
   - the server sends the K neighbours' cached models to k (K extra downloads, counted below);
   - k fits a 2-component GMM to the min-max normalised per-sample losses of its own previous local
     model (clean probability = posterior of the low-mean component); the samples with probability
     > ``p_threshold`` form a provisional clean set (all samples if none); each neighbour's
     classifier head is fine-tuned for one pass over that set (body frozen), then gets its own GMM;
   - ensemble: w_i = Σ_m R_m·w_i^m / Σ_m R_m over k and its neighbours; the clean set is
     {i : w_i > ``p_threshold``} (all samples if empty); k trains the received global model on the
     clean set only (plain CE), then uploads weights, e_k and s_k as in warm-up.
   The flagged (non-clean) samples are reported with ``ctx.report_samples``.

Communication: ``comm_cost`` counts participations and ``bytes_up`` uploads (weights + e_k + s_k);
neither counts downloads, of the global model or of neighbours. The neighbour models a client
receives are counted by the method: ``neighbour_models`` (this round) and ``bytes_down_extra``
(cumulative bytes of those models, state dicts as stored) in every metrics row.

Switches (the paper's method section was not available; RN1 is the code's form in both fidelities,
RN2 follows ``fidelity``):
- RN1 ``score_augment``: expertise and GMM losses on augmented views (code) or plain ones (inferred).
- RN2 ``neighbour_cache``: when an upload joins the server's cache. ``aggregation`` (``fidelity=paper``,
  inferred: the readable parts of the paper say nothing on it; in the federated protocol a round's
  clients train in parallel, so a client can only receive models uploaded in earlier rounds) or
  ``immediate`` (``fidelity=reference``: the official code trains the round's clients one after
  another and refreshes each client's ``net1``, expertise and arbitrary output as soon as it has
  trained, so a later client of the same round may pick it as neighbour). Under ``immediate`` the
  result depends on the order of the round's clients; it is the order the runner hands them over,
  the sampled cohort in ascending id (the code: ``np.random.choice``'s draw order), so a config and
  seed still give one result.

Values and sources of each key: docs/methods/fedlsr_fedrn_fedelc.md §23.30; what each key is: ``FedRNParams``.

Implementation notes and deviations (docs/methods/fedlsr_fedrn_fedelc.md §22.2)
- Candidates are the clients with a cached model. The official code also ranks clients that never
  trained, with expertise 0.5, a U(0, 1) signature and a freshly initialised network; a client
  without a cached model of its own uses the received global model as "its previous model" and
  that model's expertise and signature (the code would use an untrained network).
- A min-max normalisation over values that are all equal gives 0 (the code divides by zero). If the
  ensemble weights sum to 0 they become equal.
- GMMs (max_iter 100, tol 1e-2, reg_covar 5e-4, as the code) take their seed from ``ctx.rng``.
- The neighbours' head fine-tuning uses the suite's SGD settings (``fl.lr``, momentum, weight decay,
  batch) on the model's ``head`` (the code's ``linear`` layer), in train mode (BatchNorm statistics
  of the body follow the clean batches, as in the code); every neighbour sees the same batches.
- Local training is the suite's (``fl`` group); the official code's lr 0.01, momentum 0.5, batch 50,
  5 epochs and FNBench's momentum 0.9, weight decay 5e-4, batch 64 are not pinned.
- Memory: the server keeps one state dict per client that has trained (on the CPU).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedlnl.conf.checks import choice, flag, integer, number, positive, unit
from fedlnl.methods.common import engine, semisup
from fedlnl.methods.common.protocol import ClientUpdate, UpdatePlan, local_steps
from fedlnl.methods.common.stores import ModelCache
from fedlnl.methods.common.params import Params, ints, linear, param, rule
from fedlnl.methods.fedavg import FedAvg


NEIGHBOUR_CACHES = ("aggregation", "immediate")


# ----------------------------------------------------------------------------------- reliability
def minmax(values) -> np.ndarray:
    """(v − min)/(max − min); all-equal values give 0."""
    v = np.asarray(values, dtype=np.float64)
    span = v.max() - v.min() if v.size else 0.0
    return (v - v.min()) / span if span > 0 else np.zeros_like(v)


def reliability_scores(own_expertise: float, own_signature, expertise, signatures, alpha: float):
    """(R_k, [R_j]): min-max normalised expertise and signature similarity over k and the candidates
    (k first, with cos(s_k, s_k) = 1), R_j = α·ê_j + (1 − α)·ŝ_j, R_k = α·ê_k + (1 − α)."""
    s_k = torch.as_tensor(own_signature, dtype=torch.float64).flatten().cpu()
    sims = [1.0] + [float(F.cosine_similarity(s_k, torch.as_tensor(s, dtype=torch.float64).flatten().cpu(), dim=0))
                    for s in signatures]
    e_hat, s_hat = minmax([own_expertise, *expertise]), minmax(sims)
    return alpha * e_hat[0] + (1.0 - alpha), (alpha * e_hat[1:] + (1.0 - alpha) * s_hat[1:]).tolist()


def top_neighbours(scores: list[float], candidates: list[int], k: int) -> list[tuple[int, float]]:
    """The k highest (client, score) pairs, ties broken by candidate order (stable, as the code's sort)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # sorted() is stable
    return [(candidates[i], scores[i]) for i in order[:k]]


def ensemble_clean(probs: list[torch.Tensor], weights: list[float], threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, clean mask): w = Σ_m R_m w^m / Σ_m R_m; clean = w > threshold (every sample if none is)."""
    r = torch.as_tensor(weights, dtype=torch.float64)
    r = r / r.sum() if r.sum() > 0 else torch.full_like(r, 1.0 / len(weights))
    w = sum(float(rm) * pm.double().cpu() for rm, pm in zip(r, probs))
    clean = w > threshold
    return w, clean if clean.any() else torch.ones_like(clean)


# ----------------------------------------------------------------------------------- the method
@dataclass(frozen=True)
class FedRNParams(Params):
    """FedRN's own numbers (conf/method/fedrn.yaml names each value's source; docs/methods/fedlsr_fedrn_fedelc.md §22.2, RN-numbers)."""

    warmup_ratio: float = param("FedAvg warm-up share of the rounds", rule(unit, "a share of the rounds in [0, 1]"))
    num_neighbors: int = param("K: the most reliable neighbours whose cached models join the GMM ensemble",
                               rule(integer, 0),
                               search=ints(1, 4, "our choice: FNBench's K = 1 to twice the official K = 2 "
                                                 "(docs/methods/fedlsr_fedrn_fedelc.md §22.2)"))
    w_alpha: float = param("α: weight of expertise vs similarity in the reliability", rule(unit, "a weight α in [0, 1]"),
                           search=linear(0.0, 1.0, "our choice: the whole weight range (official argparse 0.5, "
                                                   "run.sh 0.6; docs/methods/fedlsr_fedrn_fedelc.md §22.2)"))
    p_threshold: float = param("clean iff probability > p_threshold",
                               rule(number, lambda v: 0 < v < 1, "a probability in (0, 1)"),
                               search=linear(0.3, 0.7, "our choice: around both codes' 0.5 (docs/methods/fedlsr_fedrn_fedelc.md §22.2)"))
    gmm_max_iter: int = param("GMM: EM steps at most", rule(integer, 1))
    gmm_tol: float = param("GMM: convergence tolerance", rule(positive))
    gmm_reg_covar: float = param("GMM: variance floor", rule(positive))
    score_augment: bool = param("RN1: expertise and GMM losses on augmented views (code)", rule(flag))
    neighbour_cache: str = param("RN2: a client's upload joins the server's cache at aggregation (paper) | as soon "
                                 "as it is trained, so later clients of the round may pick it (immediate, code)",
                                 rule(choice, NEIGHBOUR_CACHES))

    @functools.cached_property
    def gmm(self) -> dict:
        """The GMM's settings."""
        return {"max_iter": self.gmm_max_iter, "tol": self.gmm_tol, "reg_covar": self.gmm_reg_covar}


class FedRN(FedAvg):
    family = "federated label-noise methods"

    Params = FedRNParams

    def warmup_rounds(self, ctx) -> int:
        return int(self.warmup_ratio * ctx.total_rounds)

    def init(self, model, info, ctx):
        state = super().init(model, info, ctx)
        probe = torch.randn(1, *info.input_shape, generator=ctx.generator("fedrn_probe"))
        return {**state, "cache": ModelCache(), "probe": probe.to(ctx.device), "flags": {},
                "bytes_down_extra": 0}

    def plan_update(self, ctx, k, info, model):
        """(dry_run) warm-up: FedAvg's update. Then one head pass per neighbour (at most
        ``num_neighbors``) over the provisional clean samples and the local training on the clean
        ones: at most that many passes over all samples (an upper bound). Every update uploads the
        expertise and the probe's C logits."""
        n = info.client_sizes[k]
        steps = local_steps(n, self.fl.local_epochs, self.fl.batch_size)
        payload = engine.payload_bytes({"expertise": 0.0, "signature": torch.zeros(info.num_classes)})
        if ctx.round < self.warmup_rounds(ctx):
            return UpdatePlan(steps, payload=payload)
        return UpdatePlan(steps + local_steps(n, self.num_neighbors, self.fl.batch_size), payload=payload,
                          exact=False)

    # ------------------------------------------------------------------ client
    def client_update(self, state, client, ctx):
        if ctx.round < self.warmup_rounds(ctx):
            update = engine.train_from_global(state, client, ctx, **self.fl.training())
        else:
            update = self._reliable_update(state, client, ctx)
        expertise, signature = self._profile(state, state["model"], client, ctx)
        update.payload = {"expertise": expertise, "signature": signature}
        if self.neighbour_cache == "immediate":  # RN2: the code updates the client object before the next one trains
            self._remember(state, update)
        return update

    @staticmethod
    def _remember(state, update) -> None:
        """Cache ``update``'s model (a CPU copy), expertise and signature under its client."""
        state["cache"].put(update.client, {n: t.to("cpu") for n, t in update.weights.items()},
                           expertise=float(update.payload["expertise"]), signature=update.payload["signature"].cpu())

    def _profile(self, state, model, client, ctx) -> tuple[float, torch.Tensor]:
        """(e_k, s_k): accuracy on the client's observed labels and logits on the probe, eval mode."""
        gen = ctx.generator("fedrn_expertise", client.id) if self.score_augment else None
        logits = engine.predict(model, client.data, client.indices, self.fl.eval_batch_size,
                                augment=self.score_augment, gen=gen)
        was = model.training
        model.eval()
        with torch.no_grad():
            signature = model(state["probe"])[0].detach().float()
        model.train(was)
        return float((logits.argmax(1) == client.labels).float().mean()), signature

    def _clean_probability(self, model, client, ctx, key) -> torch.Tensor:
        """Co-divide on the losses of ``model`` (eval mode) for the client's observed labels."""
        gen = ctx.generator("fedrn_losses", client.id, key) if self.score_augment else None
        logits = engine.predict(model, client.data, client.indices, self.fl.eval_batch_size,
                                augment=self.score_augment, gen=gen)
        seed = int(ctx.rng("fedrn_gmm", client.id, key).integers(2**31 - 1))
        return semisup.clean_probability(engine.per_sample_loss(logits, client.labels), seed, **self.gmm)

    def _reliable_update(self, state, client, ctx):
        model, cache, k = state["model"], state["cache"], client.id
        engine.set_weights(model, cache.weights(k) if k in cache else state["global"])  # previous local model
        own_e, own_s = ((cache.record(k, "expertise"), cache.record(k, "signature")) if k in cache
                        else self._profile(state, model, client, ctx))
        candidates = [j for j in cache.clients() if j != k]
        own_r, scores = reliability_scores(own_e, own_s, [cache.record(j, "expertise") for j in candidates],
                                           [cache.record(j, "signature") for j in candidates], self.w_alpha)
        neighbours = top_neighbours(scores, candidates, self.num_neighbors)
        probs = [self._clean_probability(model, client, ctx, "own")]
        provisional = probs[0] > self.p_threshold
        provisional = provisional if provisional.any() else torch.ones_like(provisional)
        for j, _ in neighbours:
            engine.set_weights(model, cache.weights(j))
            self._finetune_head(model, client, provisional, ctx)
            probs.append(self._clean_probability(model, client, ctx, j))
        _, clean = ensemble_clean(probs, [own_r] + [r for _, r in neighbours], self.p_threshold)
        clean = clean.to(client.indices.device)
        state["flags"][k] = {"idx": client.indices.clone(), "flagged": ~clean}
        engine.set_weights(model, state["global"])
        loss = engine.local_train(model, client.data, client.indices[clean], client.labels[clean], **self.fl.training(),
                                  gen=ctx.generator("train", k))
        sent = sum(cache.bytes_of(j) for j, _ in neighbours)
        return ClientUpdate(k, engine.get_weights(model), client.size, train_loss=loss,
                                   metrics={"neighbour_models": len(neighbours), "neighbour_bytes": sent,
                                            "clean_share": float(clean.float().mean())})

    def _finetune_head(self, model, client, mask, ctx) -> None:
        """One pass over the provisional clean samples updating ``model.head`` only (train mode)."""
        body = [p for p in model.parameters() if not any(p is h for h in model.head.parameters())]
        for p in body:
            p.requires_grad_(False)
        opt = engine.optimizer(model.head, self.fl.optim(), run=client.data.compiled)
        labels = client.labels[mask]
        try:  # the same generator for every neighbour: the same batches, as the code's one loader
            engine.epoch_loop(model, opt, client.data, client.indices[mask], batch_size=self.fl.batch_size,
                              gen=ctx.generator("fedrn_finetune", client.id), augment=self.fl.augment,
                              loss_fn=lambda m, xb, pos: F.cross_entropy(m(xb), labels[pos]))
        finally:
            for p in body:
                p.requires_grad_(True)

    # ------------------------------------------------------------------ server
    def aggregate(self, state, updates, ctx):
        state, metrics = super().aggregate(state, updates, ctx)
        if self.neighbour_cache == "aggregation":  # the server keeps every uploaded model with e_k and s_k
            for u in updates:
                self._remember(state, u)
        sent = sum(u.metrics.get("neighbour_bytes", 0) for u in updates)
        state["bytes_down_extra"] += sent
        if ctx.round >= self.warmup_rounds(ctx):
            semisup.report_flags(ctx, state["flags"].values())
        return state, {**metrics, "stage": "warmup" if ctx.round < self.warmup_rounds(ctx) else "neighbours",
                       "neighbour_models": float(sum(u.metrics.get("neighbour_models", 0) for u in updates)),
                       "clean_share": float(np.mean([u.metrics.get("clean_share", 1.0) for u in updates])),
                       "bytes_down_extra": float(state["bytes_down_extra"])}
