"""Pieces of the Byzantine-robust aggregators (Krum, trimmed mean, RFA, norm clipping; docs/methods/robust_aggregation.md §19)
as plain functions over client state dicts.

The model vector of a client is the concatenation of the state-dict entries in ``keys`` (by default
every floating-point entry: parameters and BatchNorm running statistics). Distances and medians are
computed entry by entry, in blocks of ``engine.client_columns`` (at most ``engine.CHUNK_ELEMENTS``
values per temporary), so an 11M-parameter ResNet-18 never needs a [clients x parameters] matrix.
Every rule here is translation-equivariant, so running it on the client weights w_k equals running
it on the updates w_k − w_g and adding w_g back. Entries left out of ``keys`` (integer counters such
as BatchNorm's ``num_batches_tracked``) are filled by ``with_rest`` from the FedAvg average.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedlnl.conf import checks
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import NOISE, Params, param, rule  # NOISE share: the configured noisy-client share

#: RFA stopping rules: relative change of the objective (official code) or step length (FNBench)
STOPS = ("objective", "step")

Weights = dict[str, torch.Tensor]


# ------------------------------------------------------------------------------ vectors
def vector_keys(weights: Weights, integers: bool = False) -> list[str]:
    """The entries forming the model vector: floating-point ones, or every entry with ``integers``
    (FNBench flattens the whole state dict, integer counters included)."""
    return [k for k, v in weights.items() if integers or v.is_floating_point()]


def with_rest(out: Weights, weights: list[Weights], counts) -> Weights:
    """``out`` completed with the entries it lacks, taken from the n_k-weighted average, in the
    state dict's order."""
    rest = [k for k in weights[0] if k not in out]
    if rest:
        out.update(engine.weighted_average([{k: w[k] for k in rest} for w in weights], counts))
    return {k: out[k] for k in weights[0]}


def sq_distances_to(weights: list[Weights], point: Weights, keys) -> torch.Tensor:
    """‖w_i − v‖² over ``keys`` for every client i (float64, [n])."""
    out = [torch.zeros((), dtype=torch.float64, device=point[keys[0]].device) for _ in weights]
    for key in keys:
        ref = point[key].double()
        for i, w in enumerate(weights):
            out[i] += (w[key].double() - ref).pow(2).sum()
    return torch.stack(out)


def pairwise_sq_distances(weights: list[Weights], keys, chunk: int = engine.CHUNK_ELEMENTS) -> torch.Tensor:
    """D_ij = ‖w_i − w_j‖² over ``keys`` (float64, [n, n]) from the Gram matrix of each block after
    subtracting the block's mean over clients (no cancellation between large, close weights)."""
    n = len(weights)
    d2 = None
    for key in keys:
        for _, block in engine.client_columns(weights, key, chunk):
            b = block.double()
            b = b - b.mean(1, keepdim=True)
            g = b.T @ b
            sq = g.diagonal()
            part = sq[:, None] + sq[None, :] - 2.0 * g
            d2 = part if d2 is None else d2 + part
    d2 = torch.zeros(n, n, dtype=torch.float64) if d2 is None else d2
    return d2.clamp_min(0.0).fill_diagonal_(0.0)


def combine(weights: list[Weights], coeffs, keys) -> Weights:
    """Σ_i c_i w_i for every entry in ``keys`` (accumulated in float64, cast back; integer entries
    rounded)."""
    c = [float(x) for x in (coeffs.tolist() if torch.is_tensor(coeffs) else coeffs)]
    out = {}
    for key in keys:
        ref = weights[0][key]
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for w, ck in zip(weights, c):
            acc.add_(w[key].double(), alpha=ck)
        out[key] = acc.to(ref.dtype) if ref.is_floating_point() else acc.round().to(ref.dtype)
    return out


# ------------------------------------------------------------------------------ Byzantine count
def check_share(key: str, value) -> None:
    checks.number(key, value, lambda v: 0 <= v < 1, f"{NOISE} (the federation's noisy-client share) or a share in [0, 1)",
                  word=NOISE)


@dataclass(frozen=True)
class ByzantineParams(Params):
    """The assumed Byzantine count Krum and the trimmed mean share (their YAML files; docs/methods/robust_aggregation.md §19)."""

    byzantine_share: float | str = param("assumed Byzantine share: f = ⌊share × clients in the round⌋, or noise "
                                         "(the federation's configured noisy-client share)", check_share)
    f: int | None = param("an explicit f per round instead of byzantine_share; null = from the share",
                          rule(checks.integer, 0, optional=True))
    integer_buffers: bool = param("distances include integer entries (num_batches_tracked), as FNBench",
                                  rule(checks.flag))

    def check_rounds(self, m: int, max_f, what: str) -> None:
        """An explicit f must leave the rule its clients: f <= max_f(m) with m clients per round."""
        if self.f is not None and self.f > max_f(m):
            raise checks.ConfigError(f"method.f={self.f} is invalid: {what} with n = {m} clients per round "
                                     f"(fl.frac × fl.num_clients): allowed f <= {max_f(m)}")


class AssumedShare:
    """Mixin before ``FedAvg`` (Krum, trimmed mean): the server state keeps the assumed Byzantine
    share, resolved once from ``byzantine_share`` / ``f`` and the federation."""

    def init(self, model, info, ctx):
        state = super().init(model, info, ctx)
        state["share"] = assumed_share(self.byzantine_share, self.f, info)
        return state


def resolve_share(value, info) -> float:
    """The assumed Byzantine share: a number as given, or with ``noise`` the federation's configured
    noisy-client share (``FederationInfo.noisy_client_share``, from the noise config alone)."""
    if value != NOISE:
        return float(value)
    share = getattr(info, "noisy_client_share", None)
    if share is None:
        raise ValueError(f"method.byzantine_share={NOISE} needs the federation's noisy-client share "
                         f"(got None): set method.byzantine_share=<a share in [0, 1)> or method.f=<a count>")
    return float(share)


def assumed_share(value, f, info) -> float | None:
    """The share a method's f is derived from (None when an explicit ``f`` is given)."""
    return None if f is not None else resolve_share(value, info)


def round_f(f, share, n: int, f_max) -> int:
    """The f of a round of n clients: the explicit ``f`` or ⌊share · n⌋, lowered to ``f_max(n)``, the
    largest value the rule admits."""
    return min(f if f is not None else byzantine_count(share, n), f_max(n))


def byzantine_count(share: float, n: int) -> int:
    """f = ⌊share · n⌋ of the n clients of a round (FNBench: ``int(len(w_locals) * compromised_rate)``);
    1e-9 absorbs binary rounding (0.3 · 10 = 3.0000000000000004; 0.29 · 100 = 28.999999999999996,
    where FNBench's ``int`` gives 28 and this 29)."""
    return int(math.floor(share * n + 1e-9))


# ------------------------------------------------------------------------------ Krum
def krum_max_f(n: int) -> int:
    """The largest f with n > 2f + 2 (Blanchard et al. 2017, Proposition 1's condition)."""
    return max((n - 3) // 2, 0)


def krum_scores(d2: torch.Tensor, f: int, neighbours: str = "nearest") -> torch.Tensor:
    """s(i) = Σ_{i→j} ‖V_i − V_j‖² over the n − f − 2 vectors closest to V_i (Blanchard et al. 2017:
    i → j), or over every other vector with ``neighbours="all"`` (FNBench's ``Krum``:
    ``distance.sum(dim=0)``). ``d2`` = pairwise squared distances."""
    n = d2.shape[0]
    if neighbours == "all":
        return d2.sum(1)
    k = min(max(n - f - 2, 0), n - 1)
    off = d2.clone().fill_diagonal_(math.inf)
    return off.sort(dim=1).values[:, :k].sum(1)


def krum_select(d2: torch.Tensor, f: int, m: int = 1, neighbours: str = "nearest") -> list[int]:
    """The m clients with the lowest Krum scores (Krum: m = 1; Multi-Krum, Blanchard et al.: their
    average is the aggregate); ties go to the lower index."""
    scores = krum_scores(d2, f, neighbours).cpu()
    return torch.argsort(scores, stable=True)[:m].tolist()


# ------------------------------------------------------------------------------ trimmed mean
def trim_max(n: int) -> int:
    """The largest per-side trim count that keeps at least one value: b <= (n − 1) / 2 (β < 1/2)."""
    return max((n - 1) // 2, 0)


def coordinate_trimmed_mean(weights: list[Weights], b: int, keys) -> Weights:
    """Coordinate-wise β-trimmed mean (Yin et al., ICML 2018, Definition 2): per coordinate, drop the
    b largest and the b smallest of the n client values and average the n − 2b left."""
    n = len(weights)
    if not 0 <= b <= trim_max(n):
        raise ValueError(f"trimmed mean: b={b} leaves no value of n={n} (allowed 0 <= b <= {trim_max(n)})")
    out = {}
    for key in keys:
        ref = weights[0][key]
        parts = [block.sort(dim=1).values[:, b:n - b].mean(1) for _, block in engine.client_columns(weights, key)]
        value = torch.cat(parts).view_as(ref)
        out[key] = value.to(ref.dtype) if ref.is_floating_point() else value.round().to(ref.dtype)
    return out


def score_trim(d2: torch.Tensor, c: int) -> list[int]:
    """FNBench's ``trimmed_mean`` selection: client scores s_i = Σ_j D_ij, the clients ordered by
    |s_i − median(s)| (the lower middle value for even n, as ``torch.median``), the first n − 2c kept
    (ties to the lower index); their plain average is the aggregate."""
    n = d2.shape[0]
    s = d2.sum(1).cpu()
    med = s.sort().values[(n - 1) // 2]
    return torch.argsort((s - med).abs(), stable=True)[:n - 2 * c].tolist()


# ------------------------------------------------------------------------------ geometric median
def geometric_median(weights: list[Weights], alphas, keys, *, nu: float, max_iter: int, tol: float,
                     stop: str = "objective") -> tuple[Weights, int]:
    """Smoothed Weiszfeld iterations for argmin_v Σ_i α_i ‖v − w_i‖ (RFA, Pillutla et al., IEEE TSP
    2022; official ``geometric_median_update``): from v⁰ = Σ α_i w_i (the official code's start), repeat
    β_i = α_i / max(ν, ‖v − w_i‖),  v ← Σ β_i w_i / Σ β_i
    at most ``max_iter`` times. ``stop="objective"`` (official code): stop once the objective
    g(v) = Σ α_i ‖v − w_i‖ changes by less than ``tol``·g(v); ``stop="step"`` (FNBench's ``RFA``): stop
    when ‖v_new − v‖ < ``tol``, keeping v. Returns (v over ``keys``, iterations run)."""
    a = torch.as_tensor([float(x) for x in alphas], dtype=torch.float64)
    a = a / a.sum()
    v = combine(weights, a, keys)
    dist = sq_distances_to(weights, v, keys).sqrt()
    a = a.to(dist.device)
    obj = float((a * dist).sum())
    done = 0
    for _ in range(max_iter):
        beta = a / dist.clamp_min(nu)
        new = combine(weights, beta / beta.sum(), keys)
        done += 1
        if stop == "step":
            if float(sq_distances_to([new], v, keys)[0].sqrt()) < tol:
                break
            v = new
            dist = sq_distances_to(weights, v, keys).sqrt()
            continue
        v = new
        dist = sq_distances_to(weights, v, keys).sqrt()
        prev, obj = obj, float((a * dist).sum())
        if abs(prev - obj) < tol * obj:
            break
    return v, done
