"""GCE, MAE, NCE+RCE and bootstrapping as local training (docs/methods/local_lnl.md §21.9–§21.13): each loss's value
and gradient in closed form on hand-made logits, the limits the papers state (GCE → CE as q → 0,
q = 1 gives 1 − p_y; NCE in [0, 1] summing to 1 over the labels; bootstrapping with β = 1 is CE),
finite gradients at saturated logits, the switches and their checks. The end-to-end runs at tiny size
are tests/test_methods_e2e.py's (every method YAML)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import compose_cfg, build_method
from fedlnl.benchmark.validate import ConfigError
from fedlnl.methods.bootstrap import bootstrap_loss
from fedlnl.methods.common import engine
from fedlnl.methods.common.protocol import Optim
from fedlnl.methods.gce import gce_loss
from fedlnl.methods.mae import mae_loss
from fedlnl.methods.nce_rce import nce_loss, nce_rce_loss

LN_1E4 = math.log(1e-4)
Z = [[2.0, 0.0, -1.0], [0.5, 0.5, 0.0], [-1.0, 3.0, 0.5]]
Y = [0, 2, 0]  # row 3's label is not its argmax (1): the hard target differs from the label there


def _softmax(z):
    e = np.exp(np.asarray(z, dtype=np.float64) - np.max(z))
    return e / e.sum()


def _run(loss_fn, z=Z, y=Y):
    """(value, gradient w.r.t. the logits) of a batch loss on float64 logits."""
    logits = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    value = loss_fn(logits, torch.tensor(y))
    value.backward()
    return value.item(), logits.grad.numpy()


def _by_hand(per_sample):
    """Batch mean of per_sample(p, e_y, y) -> (value, ∂value/∂z) over the rows of Z, Y."""
    values, grads = zip(*(per_sample(_softmax(z), np.eye(3)[y], y) for z, y in zip(Z, Y)))
    return float(np.mean(values)), np.array(grads) / len(Z)


# ------------------------------------------------------------------------------------------ GCE
def test_gce_value_and_gradient_in_closed_form():
    q = 0.7

    def hand(p, e, y):
        # L_q = (1 − p_y^q)/q; ∂L_q/∂z = −p_y^(q−1)·∂p_y/∂z = −p_y^(q−1)·p_y(e_y − p) = p_y^q (p − e_y)
        return (1 - p[y] ** q) / q, p[y] ** q * (p - e)

    value, grad = _run(lambda z, y: gce_loss(z, y, q))
    want_value, want_grad = _by_hand(hand)
    assert value == pytest.approx(want_value, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-14)


def test_gce_limits_q_one_is_one_minus_p_y_and_q_to_zero_is_ce():
    logits, labels = torch.tensor(Z, dtype=torch.float64), torch.tensor(Y)
    p_y = logits.softmax(1)[torch.arange(3), labels]
    assert gce_loss(logits, labels, 1.0).item() == pytest.approx((1 - p_y).mean().item(), rel=1e-14)
    ce = F.cross_entropy(logits, labels).item()
    # (1 − p^q)/q = −log p − q (log p)²/2 − ...: the gap shrinks linearly in q
    gaps = [abs(gce_loss(logits, labels, q).item() - ce) for q in (1e-2, 1e-4, 1e-6)]
    assert gaps[2] < 1e-5 * ce and gaps[0] > gaps[1] > gaps[2]


# ------------------------------------------------------------------------------------------ MAE
def test_mae_is_the_l1_distance_to_the_one_hot_label_and_its_gradient():
    logits, labels = torch.tensor(Z, dtype=torch.float64), torch.tensor(Y)
    p = logits.softmax(1)
    l1 = (p - F.one_hot(labels, 3).double()).abs().sum(1).mean()
    assert mae_loss(logits, labels, 2.0).item() == pytest.approx(l1.item(), rel=1e-14)  # ‖e_y − p‖₁ = 2(1 − p_y)
    assert mae_loss(logits, labels, 1.0).item() == pytest.approx(l1.item() / 2, rel=1e-14)  # the codes' reduced MAE

    def hand(p, e, y):  # 2(1 − p_y); ∂/∂z = −2·p_y(e_y − p)
        return 2 * (1 - p[y]), 2 * p[y] * (p - e)

    value, grad = _run(lambda z, y: mae_loss(z, y, 2.0))
    want_value, want_grad = _by_hand(hand)
    assert value == pytest.approx(want_value, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------------------------ NCE+RCE
def test_nce_value_in_closed_form_and_its_range():
    value, _ = _run(nce_loss)
    want = np.mean([math.log(_softmax(z)[y]) / np.log(_softmax(z)).sum() for z, y in zip(Z, Y)])
    assert value == pytest.approx(want, rel=1e-12)
    # uniform logits: (−log 1/K) / (−K log 1/K) = 1/K
    assert nce_loss(torch.zeros(2, 4, dtype=torch.float64), torch.tensor([0, 3])).item() == pytest.approx(0.25, rel=1e-14)
    # every sample in [0, 1], and the normalisation: Σ_j NCE(x, j) = 1 for every x (Ma et al.'s construction)
    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(50, 10, generator=g, dtype=torch.float64)
    per_label = torch.stack([torch.stack([nce_loss(logits[i:i + 1], torch.tensor([j])) for j in range(10)])
                             for i in range(50)])
    assert per_label.min() >= 0 and per_label.max() <= 1
    torch.testing.assert_close(per_label.sum(1), torch.ones(50, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_nce_rce_value_and_gradient_in_closed_form():
    alpha, beta, A = 1.0, 1.0, -4.0

    def hand(p, e, y):
        logp = np.log(p)
        nce = logp[y] / logp.sum()
        # ∂ log p_y/∂z = e_y − p; ∂ Σ_k log p_k/∂z = 1 − K·p; quotient rule on log p_y / Σ log p_k
        dnce = ((e - p) * logp.sum() - logp[y] * (1 - 3 * p)) / logp.sum() ** 2
        # RCE = −A(1 − p_y); ∂/∂z = A·p_y(e_y − p)
        return alpha * nce + beta * -A * (1 - p[y]), alpha * dnce + beta * A * p[y] * (e - p)

    value, grad = _run(lambda z, y: nce_rce_loss(z, y, alpha, beta, A))
    want_value, want_grad = _by_hand(hand)
    assert value == pytest.approx(want_value, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-14)


def test_nce_rce_reference_clamps_equal_the_apl_codes_formula():
    """Reference: RCE of p clamped to [1e-7, 1] against the one-hot label clamped to [1e-4, 1]."""
    z = torch.tensor([[30.0, 0.0, -1.0], [0.5, 0.5, 0.0]], dtype=torch.float64)  # row 0: p of classes 1, 2 < 1e-7
    y = torch.tensor([0, 2])
    logp = F.log_softmax(z, 1)
    nce = (-logp.gather(1, y[:, None]).squeeze(1) / -logp.sum(1)).mean()
    p = z.softmax(1).clamp(1e-7, 1.0)
    rce = -(p * F.one_hot(y, 3).double().clamp(1e-4, 1.0).log()).sum(1).mean()
    expected = 10.0 * nce + 0.1 * rce
    assert nce_rce_loss(z, y, 10.0, 0.1, LN_1E4, 1e-7).item() == pytest.approx(expected.item(), rel=1e-12)
    assert nce_rce_loss(z, y, 10.0, 0.1, LN_1E4, 0.0).item() < expected.item()  # the clamp adds mass in row 0


# ------------------------------------------------------------------------------------------ bootstrapping
@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_bootstrap_with_beta_one_is_the_cross_entropy(mode):
    logits, labels = torch.tensor(Z, dtype=torch.float64), torch.tensor(Y)
    assert bootstrap_loss(logits, labels, 1.0, mode).item() == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-14)


def test_bootstrap_soft_value_and_gradient_in_closed_form():
    beta = 0.95

    def hand(p, e, y):
        logp = np.log(p)
        h = -(p * logp).sum()
        # −Σ(β e_y + (1 − β) p) log p = β·CE + (1 − β)·H(p); ∂H/∂z_j = −p_j (log p_j + H)
        return -(beta * e + (1 - beta) * p) @ logp, beta * (p - e) + (1 - beta) * -p * (logp + h)

    value, grad = _run(lambda z, y: bootstrap_loss(z, y, beta, "soft"))
    want_value, want_grad = _by_hand(hand)
    assert value == pytest.approx(want_value, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-14)


def test_a_detached_soft_target_would_train_as_beta_times_ce():
    """Why q keeps its gradient (docs/methods/local_lnl.md §21.13 L23): with q detached, −Σ_k q_k log q_k has the gradient
    q − q = 0, so the soft loss would train exactly as β·CE."""
    logits = torch.tensor(Z, dtype=torch.float64, requires_grad=True)
    log_q = F.log_softmax(logits, 1)
    (-(log_q.exp().detach() * log_q).sum(1).mean()).backward()
    assert logits.grad.abs().max().item() < 1e-15


def test_bootstrap_hard_value_and_gradient_in_closed_form():
    beta = 0.8

    def hand(p, e, y):
        z = np.eye(3)[np.argmax(p)]  # row 3: argmax 1, label 0
        return -(beta * e + (1 - beta) * z) @ np.log(p), beta * (p - e) + (1 - beta) * (p - z)

    value, grad = _run(lambda z, y: bootstrap_loss(z, y, beta, "hard"))
    want_value, want_grad = _by_hand(hand)
    assert value == pytest.approx(want_value, rel=1e-12)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------------------------ all four
LOSSES = {
    "gce": lambda z, y: gce_loss(z, y, 0.7),
    "mae": lambda z, y: mae_loss(z, y, 2.0),
    "nce_rce": lambda z, y: nce_rce_loss(z, y, 1.0, 1.0, -4.0),
    "nce_rce_reference": lambda z, y: nce_rce_loss(z, y, 1.0, 1.0, LN_1E4, 1e-7),
    "bootstrap_soft": lambda z, y: bootstrap_loss(z, y, 0.95, "soft"),
    "bootstrap_hard": lambda z, y: bootstrap_loss(z, y, 0.8, "hard"),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradients_are_finite_at_saturated_logits(name):
    """float32 logits whose softmax underflows to 0 for the labelled class (p_y = e^-200)."""
    logits = torch.tensor([[100.0, -100.0, 0.0], [0.0, 0.0, 0.0], [-50.0, 60.0, 60.0]], requires_grad=True)
    value = LOSSES[name](logits, torch.tensor([1, 2, 0]))
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("method, extra", [("bootstrap", ["method.beta=1.0"]), ("gce", ["method.q=1.0e-7"])])
def test_limit_settings_train_as_fedavgs_client_step(method, extra):
    """Bootstrapping with β = 1 is CE, GCE with q → 0 nearly so: the client step ends where FedAvg's does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    data = engine.TensorData.build(torch.randint(0, 255, (12, 1, 2, 2), dtype=torch.uint8), [0.5], [0.25], None, "cpu")
    idx, labels = torch.arange(12), torch.randint(0, 3, (12,))
    start = engine.get_weights(model)
    kw = dict(epochs=2, batch_size=5, optim=Optim("sgd", lr=0.1, weight_decay=0.0, momentum=0.5), augment=False)
    m = build_method(compose_cfg([f"method={method}", *extra]), extra)
    loss = {"bootstrap": lambda lz, y: bootstrap_loss(lz, y, m.beta, m.mode), "gce": lambda lz, y: gce_loss(lz, y, m.q)}[method]
    engine.local_train(model, data, idx, labels, gen=torch.Generator().manual_seed(1), **kw)
    plain = engine.get_weights(model)
    engine.set_weights(model, start)
    engine.local_train(model, data, idx, labels, gen=torch.Generator().manual_seed(1), **kw,
                       loss_fn=lambda mod, xb, yb, s, g: loss(mod(xb), yb))
    for k, v in engine.get_weights(model).items():
        torch.testing.assert_close(v, plain[k], rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------------------------- configuration
def test_switches_and_per_dataset_values():
    def node(method, *extra):
        return compose_cfg([f"method={method}", *extra]).method
    for method, key, paper, reference in [("mae", "scale", 2.0, 1.0), ("nce_rce", "A", -4.0, LN_1E4),
                                          ("nce_rce", "p_min", 0.0, 1e-7)]:
        assert node(method)[key] == paper, (method, key)
        assert node(method, "fidelity=reference")[key] == pytest.approx(reference), (method, key)
    # APL's per-dataset α, β (official configs); digits takes the MNIST configs' β = 10
    for dataset, ab in (("cifar10", (1.0, 1.0)), ("cifar100", (10.0, 0.1)), ("digits", (1.0, 10.0)),
                        ("clothing1m", (1.0, 1.0))):
        for fidelity in ("paper", "reference"):
            n = node("nce_rce", f"dataset={dataset}", f"fidelity={fidelity}")
            assert (n.alpha, n.beta) == ab, (dataset, fidelity)
    assert node("gce").q == 0.7
    assert (node("bootstrap").mode, node("bootstrap").beta) == ("soft", 0.95)
    assert node("bootstrap", "method.mode=hard").beta == 0.8  # β follows the mode ...
    assert node("bootstrap", "method.mode=hard", "method.beta=0.6").beta == 0.6  # ... unless set


@pytest.mark.parametrize("method, override, message", [
    ("gce", "method.q=0", r"method\.q=0 is invalid: allowed a number in \(0, 1\]"),
    ("gce", "method.q=1.5", r"method\.q=1\.5 is invalid"),
    ("mae", "method.scale=0", r"method\.scale=0 is invalid: allowed a number > 0"),
    ("nce_rce", "method.A=4", r"method\.A=4 is invalid: allowed a number < 0"),
    ("nce_rce", "method.beta=-1", r"method\.beta=-1 is invalid"),
    ("bootstrap", "method.mode=medium", r"method\.mode='medium' is invalid: allowed soft, hard"),
    ("bootstrap", "method.beta=1.5", r"method\.beta=1\.5 is invalid: allowed a weight in \[0, 1\]"),
])
def test_bad_values_are_refused_in_one_line(method, override, message):
    with pytest.raises(ConfigError, match=rf"^{message}"):
        build_method(compose_cfg([f"method={method}", override]), [override])
