"""Closed-form checks of the optimisation baselines (docs/methods/fedexp_fedsam.md §20): FedExP's server step size and
extrapolation (with its evaluation average and FNBench's variants), and FedSAM's sharpness-aware
step on a quadratic whose SAM gradient is known."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from conftest import compose_cfg, make
from fedlnl.methods.common.protocol import Optim
from fedlnl.methods.common import engine, optimizers
from fedlnl.methods.common.protocol import ClientUpdate, FederationInfo, RoundContext
from fedlnl.methods.fedavg import FedAvg
from fedlnl.methods.fedexp import FedExP, server_step
from fedlnl.methods.fedsam import FedSAM
from test_baselines import Tiny, tiny_federation

CPU = torch.device("cpu")


class VecBN(nn.Module):
    """A parameter vector ``w`` (3 values) and a float buffer ``r`` standing for BN statistics."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))
        self.register_buffer("r", torch.ones(3))


def ctx():
    return RoundContext(round=0, total_rounds=1, seed=0, device=CPU, num_clients=3, client_sizes=(10,) * 3)


def fedexp(**kw):
    values = dict(eps=1e-3, anchor="round", entries="parameters", eval_average=True)
    values.update(kw)
    m = make(FedExP, **values)
    return m, m.init(VecBN(), FederationInfo(3, 2, (10,) * 3, (1, 1, 1), 0), ctx())


def round_of(state, deltas, buffers=(1.0, 1.0, 1.0), sizes=(10, 10, 10), base=None):
    base = state["global"]["w"] if base is None else base
    return [ClientUpdate(k, {"w": base + torch.tensor(d), "r": torch.full((3,), b)}, n)
            for k, (d, b, n) in enumerate(zip(deltas, buffers, sizes))]


# ------------------------------------------------------------------ FedExP
def test_fedexp_step_size_on_orthogonal_updates():
    """Δ_k = 3 e_k: Δ̄ = (1, 1, 1), ‖Δ̄‖² = 3, mean ‖Δ_k‖² = 9: η_g = 9 / (2 (3 + ε)) ≈ 1.4998, and
    w¹ = w⁰ + η_g Δ̄; the buffer is averaged, not extrapolated."""
    m, state = fedexp()
    ups = round_of(state, [(3.0, 0, 0), (0, 3.0, 0), (0, 0, 3.0)], buffers=(1.0, 2.0, 6.0))
    state, metrics = m.aggregate(state, ups, ctx())
    eta = 9 / (2 * (3 + 1e-3))
    assert metrics["eta_g"] == pytest.approx(eta, rel=1e-12)
    assert torch.allclose(state["global"]["w"], torch.full((3,), eta))
    assert torch.allclose(state["global"]["r"], torch.full((3,), 3.0))


def test_fedexp_step_size_weights_clients_by_size_and_never_goes_below_one():
    sq, p = torch.tensor([4.0, 1.0], dtype=torch.float64), torch.tensor([0.25, 0.75], dtype=torch.float64)
    assert server_step(sq, p, 0.1, 1e-3) == pytest.approx((0.25 * 4 + 0.75 * 1) / (2 * 0.101))
    assert server_step(sq, p, 10.0, 1e-3) == 1.0
    # identical updates: Σ p ‖Δ‖² = ‖Δ̄‖², so η_g = max(1, 1/2 · ‖Δ‖² / (‖Δ‖² + ε)) = 1: FedAvg
    m, state = fedexp()
    state, metrics = m.aggregate(state, round_of(state, [(1.0, 2.0, 3.0)] * 3), ctx())
    assert metrics["eta_g"] == 1.0 and torch.allclose(state["global"]["w"], torch.tensor([1.0, 2.0, 3.0]))


def test_fedexp_evaluates_the_average_of_the_last_two_global_models():
    m, state = fedexp()
    state, _ = m.aggregate(state, round_of(state, [(3.0, 0, 0), (0, 3.0, 0), (0, 0, 3.0)]), ctx())
    w1 = state["global"]["w"].clone()
    assert torch.equal(m.eval_model(state).w.detach(), w1)  # after the first round: w¹ itself
    state, _ = m.aggregate(state, round_of(state, [(1.0, 0, 0)] * 3), ctx())
    w2 = state["global"]["w"]
    assert torch.allclose(w2, w1 + torch.tensor([1.0, 0, 0]))
    assert torch.allclose(m.eval_model(state).w.detach(), (w1 + w2) / 2)
    m_ref, state_ref = fedexp(eval_average=False)
    state_ref["global"], state_ref["prev"] = state["global"], state["prev"]
    assert torch.equal(m_ref.eval_model(state_ref).w.detach(), w2)


def test_fnbench_fedexp_measures_updates_from_the_initial_model_and_extrapolates_every_entry():
    """anchor=initial: round 2's Δ_k = w_k − w⁰ (w⁰ = 0, r⁰ = 1), not w_k − w¹; entries=all: the buffer
    is extrapolated too. Expected η_g from the formula on those vectors (numpy)."""
    m, state = fedexp(anchor="initial", entries="all", eval_average=False)
    state, _ = m.aggregate(state, round_of(state, [(3.0, 0, 0), (0, 3.0, 0), (0, 0, 3.0)]), ctx())
    w1 = state["global"]["w"].clone()
    deltas = [(1.0, 0, 0), (0, 2.0, 0), (0, 0, 0.5)]
    state, metrics = m.aggregate(state, round_of(state, deltas, buffers=(1.5, 2.0, 1.0)), ctx())
    clients = [np.concatenate([w1.numpy() + np.array(d), np.full(3, b)]) for d, b in zip(deltas, (1.5, 2.0, 1.0))]
    w0 = np.concatenate([np.zeros(3), np.ones(3)])
    dk = [c - w0 for c in clients]
    mean = np.mean(dk, axis=0)
    eta = max(1.0, np.mean([d @ d for d in dk]) / (2 * (mean @ mean + 1e-3)))
    assert metrics["eta_g"] == pytest.approx(eta, rel=1e-6)
    expected = w0 + eta * mean
    assert np.allclose(state["global"]["w"].numpy(), expected[:3], rtol=1e-6)
    assert np.allclose(state["global"]["r"].numpy(), expected[3:], rtol=1e-6)


@pytest.mark.parametrize("key, paper, reference", [
    ("anchor", "round", "initial"), ("entries", "parameters", "all"), ("eval_average", True, False)])
def test_fedexp_switch_values_follow_fidelity(key, paper, reference):
    assert compose_cfg(["method=fedexp"]).method[key] == paper
    assert compose_cfg(["method=fedexp", "fidelity=reference"]).method[key] == reference


# ------------------------------------------------------------------ FedSAM
class Quadratic(nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float64))


A = torch.diag(torch.tensor([1.0, 4.0], dtype=torch.float64))


def quad_loss(model, xb, yb, step, gen):
    return 0.5 * model.w @ A @ model.w  # L(w) = ½ wᵀAw, ∇L(w) = Aw


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_sam_step_on_a_quadratic(weight_decay):
    """w = (1, 1): ∇L(w) = (1, 4), ε̂ = ρ (1, 4)/√17, SAM gradient A(w + ε̂); weight decay acts at w:
    w' = w − η (A(w + ε̂) + λ w)."""
    rho, lr = 0.5, 0.1
    model = Quadratic([1.0, 1.0])
    sam = optimizers.SAM(rho)
    opt = sam(model, Optim("sgd", lr=lr, weight_decay=weight_decay, momentum=0.0))
    engine.train_steps(model, opt, torch.Generator(), lambda: iter([sam.loss(quad_loss)(model, None, None, 0, None)]))
    w = np.array([1.0, 1.0])
    g = np.array([1.0, 4.0])
    eps = rho * g / np.sqrt(17.0)
    expected = w - lr * (np.diag([1.0, 4.0]) @ (w + eps) + weight_decay * w)
    assert np.allclose(model.w.detach().numpy(), expected, rtol=0, atol=1e-12)
    assert sam.eps is None  # the step went back to w first


def test_sam_perturbation_has_norm_rho_over_all_parameters():
    g = [torch.tensor([3.0, 0.0]), None, torch.tensor([[4.0]])]
    eps = optimizers.sam_perturbation(g, 0.05)
    total = torch.sqrt(eps[0].pow(2).sum() + eps[2].pow(2).sum())
    assert eps[1] is None and float(total) == pytest.approx(0.05)
    assert torch.allclose(eps[0], torch.tensor([0.03, 0.0])) and torch.allclose(eps[2], torch.tensor([[0.04]]))


def test_sam_restores_the_weights_when_the_perturbed_loss_is_not_finite():
    """The replayed step stops before stepping on a non-finite loss: w + ε̂ is undone by ``restore``."""
    model = Quadratic([1.0, 1.0])
    sam = optimizers.SAM(0.5)
    opt = sam(model, Optim("sgd", lr=0.1, weight_decay=0.0, momentum=0.0))

    def bad(model, xb, yb, step, gen):
        return quad_loss(model, xb, yb, step, gen) * (float("inf") if sam.eps is not None else 1.0)

    values = engine.train_steps(model, opt, torch.Generator(), lambda: iter([sam.loss(bad)(model, None, None, 0, None)]))
    assert not np.isfinite(values[-1]) and sam.eps is not None
    sam.restore()
    assert torch.equal(model.w.detach(), torch.tensor([1.0, 1.0], dtype=torch.float64))


def test_fedsam_with_rho_zero_trains_exactly_as_fedavg():
    info, view, ctx_of = tiny_federation([[0, 1, 1, 0], [1, 1, 0, 0]], pixels=[1, 2, 3, 4, 5, 6, 7, 8])
    out = []
    for method in (make(FedAvg, lr=0.5), make(FedSAM, rho=0.0, lr=0.5)):
        state = method.init(Tiny(weight=(0.5, -0.5)), info, ctx_of(0))
        out.append(method.client_update(state, view(0), ctx_of(0)).weights)
    assert all(torch.equal(out[0][k], out[1][k]) for k in out[0])
    state = make(FedSAM, rho=0.5, lr=0.5).init(Tiny(weight=(0.5, -0.5)), info, ctx_of(0))
    moved = make(FedSAM, rho=0.5, lr=0.5).client_update(state, view(0), ctx_of(0)).weights
    assert not torch.equal(moved["head.weight"], out[0]["head.weight"])


def test_fedsam_rho_per_dataset():
    assert compose_cfg(["method=fedsam"]).method.rho == 0.05
    assert compose_cfg(["method=fedsam", "dataset=cifar10"]).method.rho == 0.1
