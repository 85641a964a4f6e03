"""Shared label-noise tools: LID estimation, two-component GMM splits, confidence relabel rules.

Plain functions used by the label-noise methods (FedCorr first; FedDiv and others may append).
Each function is general (no method-specific state) and documented with the equation it implements.

- ``lid_scores``: the maximum-likelihood estimator of local intrinsic dimensionality
  (Amsaleg et al. 2015; FedCorr Eq. 2) of every point of a set w.r.t. its k nearest neighbours.
- ``gmm_split``: a 2-component 1-D Gaussian mixture (scikit-learn, default settings) splitting scores
  into a low and a high mode; the high-mean mode is the "noisy" one in FedCorr's uses.
- ``confident`` / ``top_k_mask`` / ``relabel_mask``: which samples a confidence-based correction
  relabels (FedCorr Eqs. 6-7), with the ``>`` vs ``≥`` and candidate-pool choices as arguments.
- ``check_rate`` / ``rate_value``: a rate hyperparameter given as a number or as ``noise`` (the
  federation's nominal noise rate); ``forget_rate_at`` / ``keep_count`` / ``small_loss`` /
  ``mean_ce``: the small-loss selection of Co-teaching-style methods (docs/methods/local_lnl.md §21).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedlnl.methods.common.params import NOISE, check_rate  # noqa: F401 (rate values, re-exported)


# --------------------------------------------------------------------------------------- LID
def lid_scores(points: torch.Tensor, k: int, eps: float = 1e-6) -> torch.Tensor:
    """LID of every row of ``points`` [n, d] within the set itself (self excluded), FedCorr Eq. 2:

        LID(x) = − k / Σ_{i=1..k} log( r_i(x) / r_k(x) )

    with r_i the Euclidean distance to the i-th nearest other point. ``eps`` is added to r_k (as in
    the FedCorr reference code) so an all-zero neighbourhood gives log 0 = −inf and LID 0 instead of
    nan; a zero among the neighbours (an exact duplicate) likewise gives LID 0. With fewer than k
    other points, k' = n − 1 neighbours are used in both the sum and the numerator (the reference
    keeps k = 20 in the numerator; only clients with ≤ k samples differ). Returns float64 [n].
    """
    n = int(points.shape[0])
    k_eff = min(int(k), n - 1)
    if k_eff < 1:
        return torch.zeros(n, dtype=torch.float64, device=points.device)
    x = points.detach().double()
    # exact pairwise distances: the matmul form loses the zeros between identical points
    d = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
    d.fill_diagonal_(float("inf"))  # exclude self
    r = d.topk(k_eff, dim=1, largest=False).values  # ascending, r[:, -1] = r_k
    s = torch.log(r / (r[:, -1:] + eps)).sum(dim=1)
    lid = -k_eff / s
    return torch.nan_to_num(lid, nan=0.0, posinf=0.0, neginf=0.0)


# --------------------------------------------------------------------------------------- GMM
@dataclass
class GMMSplit:
    """A 2-component 1-D mixture fitted to scores; components ordered by mean (low first)."""

    high: np.ndarray  # bool [n]: assigned (argmax posterior) to the high-mean component
    means: list[float]  # [low, high]
    variances: list[float]
    weights: list[float]

    @property
    def share_high(self) -> float:
        """Share of the scores in the high-mean component (FedCorr's μ̂_k on per-sample losses)."""
        return float(self.high.mean()) if self.high.size else 0.0

    def params(self) -> dict:
        return {"means": self.means, "variances": self.variances, "weights": self.weights}


def gmm_split(values, random_state: int) -> GMMSplit:
    """Fit ``GaussianMixture(n_components=2, random_state=...)`` (scikit-learn defaults: full
    covariance, k-means init, max_iter 100, tol 1e-3, reg_covar 1e-6, one init) to 1-D ``values``
    and assign each value by ``predict`` (argmax posterior). The high-mean component is returned as
    ``high``. The split is always into two groups, even for unimodal data (no one-cluster test, as
    in FedCorr). Fewer than two values cannot be fitted: then nothing is high and the parameters are
    nan."""
    from sklearn.mixture import GaussianMixture

    v = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    if v.shape[0] < 2:
        nan = [float("nan")] * 2
        return GMMSplit(np.zeros(v.shape[0], bool), nan, nan, nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # identical values: k-means finds one cluster; harmless
        gmm = GaussianMixture(n_components=2, random_state=int(random_state)).fit(v)
        assigned = gmm.predict(v)
    order = np.argsort(gmm.means_[:, 0])
    return GMMSplit(
        high=assigned == order[1],
        means=[float(gmm.means_[i, 0]) for i in order],
        variances=[float(gmm.covariances_.reshape(2, -1)[i, 0]) for i in order],
        weights=[float(gmm.weights_[i]) for i in order],
    )


# ------------------------------------------------------------------------------ relabel rules
def confident(probs: torch.Tensor, theta: float, strict: bool) -> torch.Tensor:
    """max_j p_j ≥ θ (FedCorr Eq. 7), or > θ when ``strict`` (the FedCorr reference code)."""
    top = probs.max(dim=1).values
    return top > theta if strict else top >= theta


def top_k_mask(scores: torch.Tensor, count: int, pool: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean mask of the ``count`` highest ``scores`` (restricted to ``pool`` if given; ties
    broken by position, stable). ``count`` is clipped to the pool size."""
    n = scores.numel()
    mask = torch.zeros(n, dtype=torch.bool, device=scores.device)
    cand = torch.arange(n, device=scores.device) if pool is None else pool.nonzero().flatten()
    count = max(0, min(int(count), cand.numel()))
    if count:
        order = torch.sort(scores[cand], descending=True, stable=True).indices[:count]
        mask[cand[order]] = True
    return mask


def relabel_mask(
    probs: torch.Tensor, theta: float, strict: bool, scores: torch.Tensor | None = None,
    count: int | None = None, pool: torch.Tensor | None = None,
) -> torch.Tensor:
    """Samples a confidence-based correction relabels to argmax ``probs``: the ``count`` highest
    ``scores`` (e.g. per-sample losses; among ``pool`` if given; FedCorr Eq. 6), intersected with the
    confident ones (Eq. 7). Without ``scores``/``count``, every confident sample (in ``pool``)."""
    mask = confident(probs, theta, strict)
    if count is not None:
        if scores is None:
            raise ValueError("relabel_mask: a count needs scores to rank by")
        mask &= top_k_mask(scores, count, pool)
    elif pool is not None:
        mask &= pool
    return mask


def sample_losses(logits: torch.Tensor, labels: torch.Tensor, on: str) -> torch.Tensor:
    """Per-sample cross-entropy of ``labels`` under ``logits`` (``on="logits"``), or of the softmax
    probabilities treated as logits (``on="softmax"``: the FedCorr reference's double softmax,
    ℓ = log Σ_j exp(p_j) − p_y, a compressed range)."""
    if on == "logits":
        return F.cross_entropy(logits, labels, reduction="none")
    if on == "softmax":
        return F.cross_entropy(logits.softmax(dim=1), labels, reduction="none")
    raise ValueError(f"sample_losses: on must be 'logits' or 'softmax', got {on!r}")


# ------------------------------------------------------------------- small-loss selection
#: how a kept share (1 − forget rate) of a batch of n becomes a count: ``ceil`` = the smallest set of at least
#: R·n samples (Co-teaching Alg. 1: argmin over D' with |D'| ≥ R(T)|D̄|), ``floor`` = int(R·n) as the reference codes compute it
ROUNDINGS = ("ceil", "floor")

#: forget-rate schedules: ``paper`` = min(t/T_k·τ, τ) (Co-teaching's R(T) = 1 − min(T/T_k·τ, τ)),
#: ``linspace`` = linspace(0, τ, T_k)[t] for t < T_k (the reference codes' rate_schedule)
SCHEDULES = ("paper", "linspace")


def rate_value(key: str, value, info) -> float:
    """The number a rate hyperparameter stands for: itself, or with ``noise`` the noise rate the
    configuration implies (``FederationInfo.noise_rate``; never measured on labels, docs/methods/rofl.md R3)."""
    if value != NOISE:
        return float(value)
    rate = getattr(info, "noise_rate", None)
    if rate is None or not 0.0 <= rate <= 1.0:
        raise ValueError(f"method.{key}=noise needs the federation's noise rate (got {rate!r}): "
                         f"set method.{key}=<a share in [0, 1)>")
    return float(rate)


def gradual_forget_rate(rnd: int, total_rounds: int, tau: float, gradual_share: float, schedule: str) -> float:
    """The forget rate of round ``rnd`` when it rises to τ over ``gradual_share`` of the run's rounds
    (T_k of Co-teaching, E_k of Co-teaching+: max(1, ⌊share·rounds⌋))."""
    return forget_rate_at(rnd, tau, max(1, int(gradual_share * total_rounds)), schedule)


def forget_rate_at(t: int, tau: float, T_k: int, schedule: str) -> float:
    """The forget rate of step t (0-based) rising to τ over T_k steps. ``paper``: min(t/T_k·τ, τ), i.e.
    Co-teaching's remember rate R(T) = 1 − min(T/T_k·τ, τ) (Alg. 1, applied from the second epoch
    on); ``linspace``: linspace(0, τ, T_k)[t] (reaches τ one step earlier, at t = T_k − 1)."""
    if schedule == "paper":
        return min(t / T_k * tau, tau)
    if schedule == "linspace":
        return float(np.linspace(0.0, tau, T_k)[t]) if t < T_k else float(tau)
    raise ValueError(f"forget-rate schedule must be one of {SCHEDULES}, got {schedule!r}")


def keep_count(n: int, forget: float, rounding: str) -> int:
    """How many of n samples a small-loss selection keeps at forget rate r: ⌈(1 − r)·n⌉ or ⌊(1 − r)·n⌋
    (``ROUNDINGS``); a float rounding error (0.7·10 = 7.000000000000001) is not counted as a sample."""
    share = round((1.0 - forget) * n, 9)
    if rounding == "ceil":
        return min(n, math.ceil(share))
    if rounding == "floor":
        return min(n, math.floor(share))
    raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")


def small_loss(losses: torch.Tensor, count: int) -> torch.Tensor:
    """Positions of the ``count`` smallest losses, smallest first (ties by position: stable)."""
    return torch.sort(losses.detach(), stable=True).indices[:max(0, int(count))]


def mean_ce(logits: torch.Tensor, labels: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the selected positions; 0 (with a zero gradient) for an empty
    selection, where the reference codes' sum / count is 0 / 0."""
    if sel.numel() == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits[sel], labels[sel])
