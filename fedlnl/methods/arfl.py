"""ARFL — Fu et al., "Attack-Resistant Federated Learning with Residual-based Reweighting",
arXiv 1912.11464 (https://github.com/fushuhao6/Attack-Resistant-Federated-Learning,
``FedAvg/averaging.py::IRLS_aggregation_split_restricted``); configured as in FedCorr (Xu et al.,
CVPR 2022): λ = 2, δ = 0.1, lr 0.01 on CIFAR / 0.003 on Clothing1M (docs/methods/arfl.md §7).

Implementation notes
- Client: FedCorr's local update (as FedAvg: full local data, cross-entropy, SGD with momentum
  ``fl.momentum``). The ARFL repository's own client (first 70% of each client's indices, at most 31
  batches per epoch) is not reproduced: FedCorr states its own client settings for ARFL and whether
  it reused that client code is unknown (docs/methods/arfl.md §7).
- Server, per state-dict tensor with >= 1 dimension (BatchNorm statistics included) and per
  coordinate, with y_1..y_n the n client values:
  1. repeated-median line over (rank, value) of the sorted values: β₁ = med_i med_{j≠i}
     (y_(i) − y_(j))/(i − j), β₀ = med(y) − β₁(n−1)/2 (Siegel 1982);
  2. residual r_i = y_i − (β₀ + β₁ rank_i);
  3. robust scale τ = 1.4826 (1 + 5/(n−1)) · med(|r| without its smallest value) + 1e-7, e = r/τ;
  4. leverage h_i of the design [1, rank] (closed form 1/n + (rank_i − r̄)²/Σ(rank − r̄)², equal to
     the reference's hat-matrix diagonal), IRLS weight w_i = min(1, K√(1−h_i)/|e_i|) with
     K = λ√(2/n) (Huber-type; e_i = 0 gives 1);
  5. confidence w_i · std_i(w) (unbiased std over clients), summed over all coordinates → s_k;
  6. clipping: a coordinate whose w_i < δ is replaced by the line's value at its rank.
  Then s ← (s / max s)², and the global model is Σ_k s_k/Σs · (clipped model k). Client sizes
  play no part; models with NaN/Inf entries are dropped; 0-dim entries (``num_batches_tracked``)
  skip the IRLS step and are averaged with the same client weights (rounded).
- Vectorised with torch over blocks of coordinates (``engine.client_columns``), so memory stays
  bounded for 11M-parameter models; the clipped values are kept as sparse corrections, so no
  second full copy of the client models is made. Median of an even count = mean of the two middle
  values (``engine.median_lastdim``, the reference's ``median_opt``).

Decisions where the reference is silent or degenerate (documented deviations)
- Ties: equal client values share their mean rank (midranks). The reference ranks ties in sort
  order (arbitrary on GPU), so two identical client models could receive different weights; with
  midranks identical clients always get identical weights. Without ties both coincide.
- If every confidence is 0 (e.g. all client models identical: every w is 1 and its std 0; the
  reference divides 0 by 0 here) or fewer than 3 clients remain (the scale's 1/(n−1) and the
  leverage degenerate), the clients are averaged uniformly.
- The per-client weights s_k/Σs are returned in the round metrics as ``arfl_w_min`` /
  ``arfl_w_max`` and recorded under ``ctx.record("arfl_weights", ...)`` for diagnostics.
- As FedCorr's stage-3 delegate (FedCorr + ARFL) ``init`` takes the current global weights; the
  method is stateless.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedlnl.conf.checks import positive, unit
from fedlnl.methods.common import engine
from fedlnl.methods.common.params import Params, around, linear, param, rule
from fedlnl.methods.fedavg import FedAvg

#: the reference's constant in the scale of residuals: 1.4826 (1 + 5/(n−1)) · MAD-like statistic
_MAD_CONSISTENCY = 1.4826


def repeated_median_line(y_sorted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(β₀, β₁) of Siegel's repeated-median line through (i, y_(i)), i = 0..n−1, per row of the
    sorted values [C, n]: β₁ = med_i med_{j≠i} (y_i − y_j)/(i − j), β₀ = med(y) − β₁ (n−1)/2."""
    n = y_sorted.shape[1]
    x = torch.arange(n, dtype=y_sorted.dtype, device=y_sorted.device)
    dx = x[:, None] - x[None, :]  # [n, n], zero on the diagonal
    off = ~torch.eye(n, dtype=torch.bool, device=y_sorted.device)
    dy = y_sorted[:, :, None] - y_sorted[:, None, :]  # [C, n, n]
    slopes = (dy[:, off] / dx[off]).view(-1, n, n - 1)  # j ≠ i only
    beta1 = engine.median_lastdim(engine.median_lastdim(slopes))
    beta0 = engine.median_lastdim(y_sorted) - beta1 * (n - 1) / 2.0
    return beta0, beta1


def midranks(y: torch.Tensor, order: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Rank of each value in its row (0-based); tied values share their mean rank. ``order`` is
    ``y.sort(dim=1)`` if already computed."""
    s, idx = order if order is not None else y.sort(dim=1)
    n = s.shape[1]
    pos = torch.arange(n, device=s.device).expand_as(s)
    first = torch.ones_like(s, dtype=torch.bool)
    first[:, 1:] = s[:, 1:] != s[:, :-1]  # a tie group starts here
    last = torch.ones_like(first)
    last[:, :-1] = s[:, :-1] != s[:, 1:]  # a tie group ends here
    start = torch.where(first, pos, 0).cummax(dim=1).values
    end = torch.where(last, pos, n - 1).flip(1).cummin(dim=1).values.flip(1)
    return torch.empty_like(s).scatter_(1, idx, (start + end).to(s.dtype) / 2.0)


def irls_block(y: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """IRLS weights w [C, n] and the fitted line at each client's rank [C, n] for values y [C, n]."""
    n = y.shape[1]
    order = y.sort(dim=1)
    beta0, beta1 = repeated_median_line(order.values)
    rank = midranks(y, order)
    line = beta0[:, None] + beta1[:, None] * rank
    r = y - line
    m = engine.median_lastdim(r.abs().sort(dim=1).values[:, 1:])  # without the smallest |r|
    tau = _MAD_CONSISTENCY * (1.0 + 5.0 / (n - 1)) * m + 1e-7
    e = r / tau[:, None]
    centred = rank - rank.mean(dim=1, keepdim=True)
    ss = (centred ** 2).sum(dim=1, keepdim=True)
    h = 1.0 / n + torch.where(ss > 0, centred ** 2 / ss.clamp_min(1e-30), torch.zeros_like(ss))
    K = lam * math.sqrt(2.0 / n)
    w = (K * (1.0 - h).clamp_min(0.0).sqrt() / e.abs()).clamp(max=1.0)
    w = torch.where(e == 0, torch.ones_like(w), w)  # the reference's 0/0 → NaN → 1
    return w, line


def finite_models(weights: list[dict[str, torch.Tensor]]) -> list[bool]:
    """Whether each model's floating entries are all finite, with one fused max-|x| norm per model
    (NaN or inf exactly where an entry is) and one host read for all of them."""
    norms = [torch.stack(torch._foreach_norm(
        [t for t in w.values() if t.is_floating_point() and t.numel()], float("inf"))).isfinite().all()
        for w in weights]
    return torch.stack(norms).tolist()


def add_corrections(flat: torch.Tensor, coords: torch.Tensor, clients: torch.Tensor, values: torch.Tensor,
                    n: int) -> None:
    """flat[coords[i]] += values[i], coordinates repeated across clients: one client at a time, in
    client order, so each op writes distinct coordinates (no atomic scatter on a GPU) and every
    coordinate receives its additions in the order ``index_add_`` gives them on the CPU (equal bits)."""
    for j in range(n):
        pick = clients == j
        idx = coords[pick]
        flat[idx] = flat[idx] + values[pick]


def irls_aggregate(weights: list[dict[str, torch.Tensor]], lam: float, delta: float):
    """ARFL's residual-based reweighting (``IRLS_aggregation_split_restricted``).

    Returns (global state dict, per-client weights summing to 1, aligned with ``weights``; a dropped
    non-finite model gets 0)."""
    valid = [i for i, ok in enumerate(finite_models(weights)) if ok]
    if not valid:
        raise ValueError("ARFL: every client model has NaN/Inf entries")
    ws = [weights[i] for i in valid]
    n = len(ws)
    device = next(iter(ws[0].values())).device
    scores = torch.zeros(n, dtype=torch.float64, device=device)
    corrections = []  # (key, flat coordinate, client, line − y) where w < δ
    if n >= 3:
        for key, ref in ws[0].items():
            if ref.dim() == 0 or not ref.is_floating_point():
                continue
            # blocks of CHUNK_ELEMENTS / n² coordinates: the pairwise slopes are [coords, n, n]
            for start, y in engine.client_columns(ws, key, engine.CHUNK_ELEMENTS // n):
                w, line = irls_block(y, lam)
                conf = w * w.std(dim=1, keepdim=True)
                scores += conf.sum(dim=0, dtype=torch.float64)
                rows, cols = (w < delta).nonzero(as_tuple=True)
                if rows.numel():
                    corrections.append((key, rows + start, cols, (line - y)[rows, cols]))
    top = scores.max()
    if n < 3 or not torch.isfinite(top) or top <= 0:
        coef = torch.full((n,), 1.0 / n, dtype=torch.float64, device=device)
    else:
        s = (scores / top) ** 2
        coef = s / s.sum()
    out = engine.weighted_average(ws, coef.cpu().numpy())
    for key, coords, clients, diff in corrections:
        add_corrections(out[key].view(-1), coords, clients, (coef[clients] * diff.double()).to(out[key].dtype), n)
    full = torch.zeros(len(weights), dtype=torch.float64)
    full[valid] = coef.cpu()
    return out, full


@dataclass(frozen=True)
class ARFLParams(Params):
    """ARFL's own numbers (conf/method/arfl.yaml)."""

    lam: float = param("λ: Huber constant K = λ·sqrt(2/n) of the IRLS weight", rule(positive, "a Huber constant λ > 0"),
                       search=around(4, "our choice: ×/÷ 4 around FedCorr's λ = 2 (the ARFL paper text was not "
                                        "available, docs/methods/index.md §0)"))
    delta: float = param("δ: coordinates whose IRLS weight is below δ are clipped to the repeated-median line",
                         rule(unit, "a clipping threshold in [0, 1]"),
                         search=linear(0.01, 0.5, "our choice: around FedCorr's δ = 0.1, up to half the IRLS weight "
                                                  "range (the ARFL paper text was not available, docs/methods/index.md §0)"))


class ARFL(FedAvg):
    family = "robust aggregation"

    Params = ARFLParams

    def aggregate(self, state, updates, ctx):
        state["global"], coef = irls_aggregate([u.weights for u in updates], self.lam, self.delta)
        ctx.record("arfl_weights", {str(u.client): float(c) for u, c in zip(updates, coef)})
        return state, {"arfl_w_min": float(coef.min()), "arfl_w_max": float(coef.max())}
