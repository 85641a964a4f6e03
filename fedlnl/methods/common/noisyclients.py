"""Noisy-client tools shared by the two-stage methods of FedNoRo's family (FedNoRo, docs/methods/fednoro.md §18;
FedELC, §22.3): a logit-adjusted loss on the client's observed class prior, per-class losses of the
global model on every client, a client-level GMM split, and distance-aware aggregation (DaAgg).

- ``adjustment`` / ``la_loss``: logit-adjusted cross-entropy (Menon et al., ICLR 2021; §18.1).
- ``per_class_losses`` / ``normalise_columns`` / ``gmm_noisy``: the detection of noisy clients
  (§18.2); ``detect_noisy_clients`` runs it with the global model over every client's view.
- ``model_distance`` / ``daagg_weights``: DaAgg (§18.4).
"""
from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedlnl.conf import checks
from fedlnl.methods.common import engine, scatter
from fedlnl.methods.common.params import Params, param, rule

DISTANCES = ("l2", "sum_of_norms")
GMM_SEEDS = ("fixed", "run")


@dataclass(frozen=True)
class DetectionParams(Params):
    """The two-stage numbers FedNoRo and FedELC share (their YAML files name each value's source)."""

    warmup_rounds: int = param("T1: stage-1 rounds (logit-adjusted warm-up), then noisy-client detection",
                               rule(checks.integer, 1))
    la_tau: float = param("τ of the logit adjustment f(x) + τ·log π_k",
                          rule(checks.number, lambda v: v >= 0, "a logit-adjustment scale τ >= 0"), convert=float)
    daagg: bool = param("ablation: distance-aware aggregation in stage 2 (false: n_k-weighted FedAvg)",
                        rule(checks.flag))
    distance: str = param("DaAgg distance: Σ of per-entry norms (sum_of_norms, code) | l2", rule(checks.choice, DISTANCES))
    gmm_votes: int = param("GMM fits that vote on the noisy clients", rule(checks.integer, 1))
    gmm_seeds: str = param("GMM seeds 0..votes−1 (fixed, code) | from the run's seeded stream (run)",
                           rule(checks.choice, GMM_SEEDS))
    detect_augment: bool = param("per-class losses of the detection on augmented views", rule(checks.flag))

    def check_rounds(self, rounds: int) -> int:
        """Stage 2 needs at least one round: T1 < fl.rounds; returns fl.rounds."""
        checks.number("method.warmup_rounds", self.warmup_rounds, lambda v: v < rounds,
                      f"an integer < fl.rounds={rounds} (stage 2 needs at least one round)")
        return int(rounds)


# ----------------------------------------------------------------------------------- losses
def adjustment(labels: torch.Tensor, num_classes: int, tau: float) -> torch.Tensor:
    """τ·log π_k of a client's observed labels (−∞ for a class it lacks; zeros for τ = 0)."""
    counts = torch.bincount(labels, minlength=num_classes).float()
    if tau == 0:
        return torch.zeros_like(counts)
    return tau * torch.log(counts / counts.sum())


def la_loss(logits, labels, adj):
    """Logit-adjusted cross-entropy (Menon et al. 2021; FedNoRo stage 1, docs/methods/fednoro.md §18.1):
    CE(f(x) + τ·log π, y), ``adj`` = τ·log π (the code's ``LogitAdjust``)."""
    return F.cross_entropy(logits + adj, labels)



# ----------------------------------------------------------------------------------- detection
def per_class_losses(losses: torch.Tensor, labels: torch.Tensor, num_classes: int) -> np.ndarray:
    """l_k^c: mean loss of the samples observed as class c (nan where the client has none)."""
    sums = scatter.group_sum(losses.double(), labels, num_classes)  # deterministic on every device
    counts = torch.bincount(labels, minlength=num_classes).double()
    out = (sums / counts.clamp_min(1)).cpu().numpy()
    out[counts.cpu().numpy() == 0] = np.nan
    return out


def normalise_columns(metrics: np.ndarray) -> np.ndarray:
    """Missing entries → the column's minimum over the other clients (the code's ``nanmin``), then
    min-max per class over the clients (docs/methods/fednoro.md §18.2); an all-missing or constant column becomes 0."""
    m = np.array(metrics, dtype=np.float64)
    for j in range(m.shape[1]):
        col = m[:, j]
        present = ~np.isnan(col)
        if not present.any():
            m[:, j] = 0.0
            continue
        col[~present] = col[present].min()
        span = col.max() - col.min()
        m[:, j] = (col - col.min()) / span if span > 0 else 0.0
    return m


def gmm_noisy(matrix: np.ndarray, seeds: list[int]) -> tuple[np.ndarray, dict]:
    """2-component GMM on the clients' loss vectors; noisy = the component with the larger sum of
    means (docs/methods/fednoro.md §18.2). With several seeds each fit votes and the most frequent noisy set wins
    (ties: the first seed's order, as the code). Returns (noisy mask, diagnostics)."""
    from sklearn.mixture import GaussianMixture

    n = matrix.shape[0]
    if n < 2:
        return np.zeros(n, dtype=bool), {"votes": []}
    sets = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # identical rows: k-means finds fewer clusters; harmless
        for seed in seeds:
            gmm = GaussianMixture(n_components=2, random_state=int(seed)).fit(matrix)
            noisy_comp = int(np.argmax(gmm.means_.sum(axis=1)))
            sets.append(frozenset(np.flatnonzero(gmm.predict(matrix) == noisy_comp).tolist()))
    counts = Counter(sets)
    best = max(sets, key=lambda s: (counts[s], -sets.index(s)))
    mask = np.zeros(n, dtype=bool)
    mask[sorted(best)] = True
    return mask, {"votes": [sorted(s) for s in sets]}


def gmm_seed_list(votes: int, form: str, rng: np.random.Generator) -> list[int]:
    """The random_state of each GMM fit: 0, 1, …, votes − 1 whatever the run seed (``fixed``, the
    code's ``GaussianMixture(random_state=i)`` for i in range(9)), or drawn from the run's seeded
    stream (``run``)."""
    if form == "fixed":
        return list(range(votes))
    return rng.integers(2**31 - 1, size=votes).tolist()


def detect_clients(method, state, ctx, key: str) -> np.ndarray:
    """:func:`detect_noisy_clients` for a two-stage method (its ``DetectionParams`` and ``fl``) on its
    state's model, global weights and number of classes (FedNoRo stage 1, docs/methods/fednoro.md §18.2)."""
    return detect_noisy_clients(state["model"], state["global"], ctx, state["num_classes"], method.fl.eval_batch_size,
                                method.detect_augment, method.gmm_votes, method.gmm_seeds, key=key)


def detect_noisy_clients(model, weights, ctx, num_classes: int, batch_size: int, augment: bool, votes: int,
                         seeds: str, key: str) -> np.ndarray:
    """Load ``weights`` (the global model) into ``model``; its per-class losses (eval mode) on every
    client's observed labels → missing classes filled and columns min-max normalised → a 2-component
    GMM, ``votes`` fits with the seeds ``gmm_seed_list`` gives (``fixed`` 0..votes − 1, or ``run``:
    from ``ctx.rng(key + "_gmm")``; docs/methods/fednoro.md §18.2). The pass reads
    augmented views when ``augment`` (generators ``ctx.generator(key + "_detect", k)``). It runs on
    the server through ``ctx.views``, standing for each client uploading its C per-class losses (not
    counted in ``bytes_up``). The decisions go to ``ctx.report_clients`` and the matrices to
    ``ctx.record("detection", ...)``; returns the noisy mask over all clients."""
    engine.set_weights(model, weights)
    rows = []
    for k in range(ctx.num_clients):
        view = ctx.views(k)
        gen = ctx.generator(key + "_detect", k) if augment else None
        logits = engine.predict(model, view.data, view.indices, batch_size, augment=augment, gen=gen)
        rows.append(per_class_losses(engine.per_sample_loss(logits, view.labels), view.labels, num_classes))
    raw = np.stack(rows)
    matrix = normalise_columns(raw)
    noisy, info = gmm_noisy(matrix, gmm_seed_list(votes, seeds, ctx.rng(key + "_gmm")))
    ctx.report_clients(is_noisy={k: bool(noisy[k]) for k in range(ctx.num_clients)})
    ctx.record("detection", {"round": ctx.round + 1, "per_class_loss": np.where(np.isnan(raw), None, raw).tolist(),
                             "normalised": matrix.tolist(), "noisy": np.flatnonzero(noisy).tolist(), **info})
    return noisy


# ----------------------------------------------------------------------------------- DaAgg
def model_distance(a: dict, b: dict, form: str) -> float:
    """d(w_a, w_b) over the floating state-dict entries: ‖w_a − w_b‖₂ of the whole model (``l2``),
    or Σ_entries ‖Δ_entry‖₂ (``sum_of_norms``, the code's ``model_dist``; docs/methods/fednoro.md §18.6 (1))."""
    norms = torch.stack([(a[k].double() - b[k].double()).norm() for k in a if a[k].is_floating_point()])
    return float(norms.norm() if form == "l2" else norms.sum())


def daagg_weights(weights: list[dict], sizes, noisy, form: str) -> np.ndarray:
    """DaAgg (FedNoRo stage 2, docs/methods/fednoro.md §18.4): n_k·e^{−D̂_k} normalised, D_k = min over the clean
    models of d(w_k, w_j) for noisy k, 0 for clean k, D̂ = D / max D. FedAvg weights when there is no
    clean or no noisy model, or every distance is 0 (docs/methods/fednoro.md §18.6 (6))."""
    sizes = np.asarray(sizes, dtype=np.float64)
    noisy = np.asarray(noisy, dtype=bool)
    clean = np.flatnonzero(~noisy)
    D = np.zeros(len(weights))
    if len(clean):
        for k in np.flatnonzero(noisy):
            D[k] = min(model_distance(weights[k], weights[j], form) for j in clean)
    if D.max() > 0:
        D = D / D.max()
    w = sizes * np.exp(-D)
    return w / w.sum()


def two_stage_aggregate(state: dict, updates, ctx, warmup_rounds: int, detect, daagg: bool, form: str) -> dict:
    """The server step of a detect-then-correct method on ``state["global"]`` / ``state["noisy"]``:
    before detection, n_k-weighted FedAvg, and ``state["noisy"] = detect()`` after round
    ``warmup_rounds`` − 1; afterwards DaAgg over the round's updates (``daagg=False``: FedAvg).
    Returns the round's metrics (stage, the number of noisy clients detected / in the round)."""
    weights, sizes = [u.weights for u in updates], [u.num_samples for u in updates]
    if state["noisy"] is None:
        state["global"] = engine.weighted_average(weights, sizes)
        metrics = {"stage": "warmup"}
        if ctx.round == warmup_rounds - 1:
            state["noisy"] = detect()
            metrics["noisy_clients"] = float(state["noisy"].sum())
        return metrics
    flags = state["noisy"][[u.client for u in updates]]
    coef = daagg_weights(weights, sizes, flags, form) if daagg else np.asarray(sizes, dtype=np.float64)
    state["global"] = engine.weighted_average(weights, coef)
    return {"noisy_in_round": float(flags.sum())}
