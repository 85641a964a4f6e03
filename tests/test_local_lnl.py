"""SELFIE, Symmetric Cross Entropy, Co-teaching and Co-teaching+ as local training (docs/methods/local_lnl.md §21):
closed forms of each distinctive piece on hand-made inputs, the shared helpers (small-loss counts,
forget-rate schedules, prediction histories, the pair of networks), their switches and checks."""
from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import build_method, compose_cfg, make, run_tiny
from fedlnl.benchmark.validate import ConfigError
from fedlnl.methods import selfie as sf
from fedlnl.methods.coteaching import Coteaching
from fedlnl.methods.coteaching_plus import CoteachingPlus
from fedlnl.methods.common import engine, history, lnl, pair, semisup
from fedlnl.methods.common.protocol import ClientUpdate, FederationInfo, Optim
from fedlnl.methods.sce import sce_loss
from fedlnl.methods.selfie import SELFIE

LN_1E4 = math.log(1e-4)


def _softmax(z):
    e = np.exp(np.asarray(z, dtype=np.float64) - np.max(z))
    return e / e.sum()


def _coteaching(**kw):
    args = dict(forget_rate=0.5, gradual_share=0.2, schedule="paper", keep_rounding="ceil", second_init="all")
    return make(Coteaching, **{**args, **kw})


def _plus(**kw):
    args = dict(forget_rate=0.5, gradual_share=0.2, schedule="paper", keep_rounding="ceil", init_round=1,
                loss_on="logits", empty_disagreement="skip", second_init="all")
    return make(CoteachingPlus, **{**args, **kw})


def _selfie(**kw):
    args = dict(noise_rate=0.4, q=15, epsilon=0.05, warmup_share=0.2, full_history=True, history_first=True,
                restarts=0)
    return make(SELFIE, **{**args, **kw})


class _Ctx:
    """The parts of a RoundContext the server-side steps read."""

    def __init__(self, rnd, total, device="cpu"):
        self.round, self.total_rounds, self.num_clients, self.device, self.data = rnd, total, 4, torch.device(device), None

    def generator(self, *keys):
        return torch.Generator().manual_seed(zlib.crc32(repr(keys).encode()))

    def rng(self, *keys):
        return np.random.default_rng(0)


# ------------------------------------------------------------------------------------------ SCE
def test_sce_value_and_gradient_in_closed_form():
    z = [[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]
    y = [0, 2]
    alpha, beta, A = 0.1, 1.0, -4.0
    logits = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    loss = sce_loss(logits, torch.tensor(y), alpha, beta, A)
    loss.backward()
    value, grad = 0.0, []
    for zi, yi in zip(z, y):
        p = _softmax(zi)
        e = np.eye(3)[yi]
        # CE = −log p_y; RCE = −Σ_k p_k log q_k with log 1 = 0 and log 0 = A: −A(1 − p_y) = 4(1 − p_y)
        value += (alpha * -math.log(p[yi]) + beta * 4.0 * (1.0 - p[yi])) / 2
        # ∂CE/∂z = p − e_y; ∂RCE/∂z = A·∂p_y/∂z = A·p_y(e_y − p)
        grad.append((alpha * (p - e) + beta * A * p[yi] * (e - p)) / 2)
    assert loss.item() == pytest.approx(value, rel=1e-12)
    np.testing.assert_allclose(logits.grad.numpy(), np.array(grad), rtol=1e-10, atol=1e-12)


def test_sce_reference_clamps_equal_the_codes_formula():
    """Reference: the one-hot label clamped to [1e-4, 1] (A = ln 1e-4) and p clamped to [1e-7, 1]."""
    z = torch.tensor([[30.0, 0.0, -1.0], [0.5, 0.5, 0.0]], dtype=torch.float64)  # p of class 1, 2 < 1e-7 in row 0
    y = torch.tensor([0, 2])
    p = z.softmax(1).clamp(1e-7, 1.0)
    q = F.one_hot(y, 3).double().clamp(1e-4, 1.0)
    rce = -(p * q.log()).sum(1).mean()
    expected = 0.1 * F.cross_entropy(z, y) + 1.0 * rce
    assert sce_loss(z, y, 0.1, 1.0, LN_1E4, 1e-7).item() == pytest.approx(expected.item(), rel=1e-12)
    assert sce_loss(z, y, 0.1, 1.0, LN_1E4, 0.0).item() < expected.item()  # the clamp adds mass in row 0


def test_sce_alpha_one_beta_zero_is_fedavgs_client_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    data = engine.TensorData.build(torch.randint(0, 255, (12, 1, 2, 2), dtype=torch.uint8), [0.5], [0.25], None, "cpu")
    idx, labels = torch.arange(12), torch.randint(0, 3, (12,))
    start = engine.get_weights(model)
    kw = dict(epochs=2, batch_size=5, optim=Optim("sgd", lr=0.1, weight_decay=0.0, momentum=0.5), augment=False)
    engine.local_train(model, data, idx, labels, gen=torch.Generator().manual_seed(1), **kw)
    plain = engine.get_weights(model)
    engine.set_weights(model, start)
    engine.local_train(model, data, idx, labels, gen=torch.Generator().manual_seed(1), **kw,
                       loss_fn=lambda m, xb, yb, s, g: sce_loss(m(xb), yb, 1.0, 0.0, -4.0))
    for k, v in engine.get_weights(model).items():
        assert torch.equal(v, plain[k]), k


# ---------------------------------------------------------------------- shared selection helpers
def test_forget_rate_schedule_values():
    paper = [lnl.forget_rate_at(t, 0.4, 5, "paper") for t in range(7)]
    assert paper == pytest.approx([0.0, 0.08, 0.16, 0.24, 0.32, 0.4, 0.4])  # min(t/T_k·τ, τ)
    code = [lnl.forget_rate_at(t, 0.4, 5, "linspace") for t in range(6)]
    assert code == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.4])  # linspace(0, τ, T_k): τ at T_k − 1
    # the methods count rounds: T_k = max(1, ⌊0.2·30⌋) = 6 on the quickstart's 30 rounds
    m, state = _coteaching(), {"tau": 0.405}
    ctx = type("Ctx", (), {"round": 3, "total_rounds": 30})()
    assert m.forget_rate_at(state, ctx) == pytest.approx(3 / 6 * 0.405)
    ctx.round = 6
    assert m.forget_rate_at(state, ctx) == pytest.approx(0.405)


def test_keep_counts_round_as_the_paper_or_the_codes():
    assert (lnl.keep_count(10, 0.405, "ceil"), lnl.keep_count(10, 0.405, "floor")) == (6, 5)
    assert (lnl.keep_count(10, 0.3, "ceil"), lnl.keep_count(10, 0.3, "floor")) == (7, 7)  # 0.7·10 is not 7.000…1
    assert (lnl.keep_count(1, 0.2, "ceil"), lnl.keep_count(1, 0.2, "floor")) == (1, 0)
    assert lnl.keep_count(4, 0.0, "ceil") == 4


def test_rate_values_and_their_checks():
    info = FederationInfo(4, 10, (5,) * 4, (1, 8, 8), 0, 0.405)
    assert lnl.rate_value("forget_rate", "noise", info) == 0.405
    assert lnl.rate_value("forget_rate", 0.25, info) == 0.25
    with pytest.raises(ValueError, match=r"method\.forget_rate=noise needs the federation's noise rate"):
        lnl.rate_value("forget_rate", "noise", FederationInfo(4, 10, (5,) * 4, (1, 8, 8), 0))
    for bad in (1.0, -0.1, "nois", True):
        with pytest.raises(ValueError, match=r"allowed a share in \[0, 1\) or noise"):
            lnl.check_rate("forget_rate", bad)


# ------------------------------------------------------------------------------------ Co-teaching
def _logits_with_losses(losses):
    """Two-class logits [0, −x] whose cross-entropy against label 0 is exactly ``losses``:
    CE = log(1 + e^{−x}), so x = −log(e^ℓ − 1)."""
    x = -torch.log(torch.expm1(torch.tensor(losses, dtype=torch.float64)))
    return torch.stack([torch.zeros_like(x), -x], 1).requires_grad_(True)


def test_coteaching_exchange_on_a_loss_table():
    loss1 = [0.1, 2.0, 0.5, 3.0, 0.2]
    loss2 = [1.0, 0.1, 0.3, 0.2, 4.0]
    for_1, for_2 = pair.exchange(torch.tensor(loss1), torch.tensor(loss2), 3)
    assert sorted(for_1.tolist()) == [1, 2, 3]  # network 1 learns from network 2's three smallest losses
    assert sorted(for_2.tolist()) == [0, 2, 4]  # and network 2 from network 1's
    z1, z2 = _logits_with_losses(loss1), _logits_with_losses(loss2)
    labels = torch.zeros(5, dtype=torch.long)
    # forget rate 0.5 on 5 samples: paper ⌈2.5⌉ = 3 kept, the codes ⌊2.5⌋ = 2
    l1, l2 = _coteaching().batch_losses(z1, z2, labels, 0.5)
    assert l1.item() == pytest.approx((2.0 + 0.5 + 3.0) / 3)  # network 1's own losses on network 2's picks
    assert l2.item() == pytest.approx((1.0 + 0.3 + 4.0) / 3)
    l1.backward()
    assert (z1.grad.abs().sum(1) > 0).tolist() == [False, True, True, True, False]
    assert z2.grad is None  # the selection is an index: no gradient reaches the peer
    l1, l2 = _coteaching(keep_rounding="floor").batch_losses(z1, z2, labels, 0.5)
    assert (l1.item(), l2.item()) == pytest.approx(((2.0 + 3.0) / 2, (1.0 + 4.0) / 2))  # on {1, 3} and {0, 4}


def test_coteaching_plus_disagreement_filter_then_exchange():
    # predictions: network 1 -> [0, 1, 0, 1, 0], network 2 -> [0, 0, 0, 0, 1]: disagreement at 1, 3, 4
    z1 = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 3.0], [0.5, 0.0]], requires_grad=True)
    z2 = torch.tensor([[1.0, 0.0], [0.2, 0.0], [3.0, 0.0], [2.0, 0.0], [0.0, 1.0]], requires_grad=True)
    labels = torch.zeros(5, dtype=torch.long)
    assert pair.disagreement(z1, z2).tolist() == [1, 3, 4]
    ce1 = F.cross_entropy(z1, labels, reduction="none").detach()
    ce2 = F.cross_entropy(z2, labels, reduction="none").detach()
    # within {1, 3, 4} at forget 0.5: ⌈1.5⌉ = 2 kept; network 2's smallest there: 3 (0.127), 1 (0.598)
    m = _plus()
    l1, l2 = m.batch_losses(z1, z2, labels, 0.5, plus=True)
    assert l1.item() == pytest.approx(float(ce1[[1, 3]].mean()))
    assert l2.item() == pytest.approx(float(ce2[[4, 1]].mean()))  # network 1's smallest: 4 (0.474), 1 (1.313)
    # before init_round: plain Co-teaching on the whole batch (⌈2.5⌉ = 3 kept)
    l1, _ = m.batch_losses(z1, z2, labels, 0.5, plus=False)
    assert l1.item() == pytest.approx(float(ce1[torch.argsort(ce2)[:3]].mean()))
    # reference: cross-entropy of the softmax (a double softmax) inside the disagreement set
    l1, _ = _plus(loss_on="softmax").batch_losses(z1, z2, labels, 0.5, plus=True)
    s1, s2 = z1.softmax(1), z2.softmax(1)
    d1 = F.cross_entropy(s1, labels, reduction="none").detach()
    d2 = F.cross_entropy(s2, labels, reduction="none").detach()
    pick = torch.tensor([1, 3, 4])[torch.argsort(d2[[1, 3, 4]])[:2]]
    assert l1.item() == pytest.approx(float(d1[pick].mean()))


def test_coteaching_plus_without_disagreement_skips_or_takes_the_whole_batch():
    z = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    labels = torch.tensor([0, 0, 1])
    seen = {"disagree": 0, "samples": 0}
    assert _plus().batch_losses(z, z + 0.1, labels, 0.5, plus=True, seen=seen) is None  # paper: no update
    assert seen == {"disagree": 0, "samples": 3}
    l1, l2 = _plus(loss_on="softmax", empty_disagreement="full_batch").batch_losses(z, z, labels, 0.5, plus=True)
    expected = F.cross_entropy(z.softmax(1), labels).item()
    assert l1.item() == pytest.approx(expected) and l2.item() == pytest.approx(expected)
    # the codes' floor may keep nothing of a one-sample disagreement: a zero loss, zero gradient
    z1 = torch.tensor([[2.0, 0.0], [0.0, 1.0]], requires_grad=True)
    l1, _ = _plus(keep_rounding="floor").batch_losses(z1, torch.tensor([[2.0, 0.0], [1.0, 0.0]]),
                                                      torch.tensor([0, 0]), 0.5, plus=True)
    l1.backward()
    assert l1.item() == 0.0 and torch.count_nonzero(z1.grad) == 0


def test_coteaching_at_forget_rate_zero_trains_network_1_as_fedavg():
    """With τ = 0 every sample is kept: network 1 follows FedAvg's client step (same batches and
    draws), up to the order of summation in the batch mean."""
    torch.manual_seed(0)
    net1 = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    net2 = semisup.fresh_copy(net1, 5, "all")
    data = engine.TensorData.build(torch.randint(0, 255, (12, 1, 2, 2), dtype=torch.uint8), [0.5], [0.25], None, "cpu")
    idx, labels = torch.arange(12), torch.randint(0, 3, (12,))
    start = engine.get_weights(net1)
    kw = dict(epochs=2, batch_size=5, optim=Optim("sgd", lr=0.1, weight_decay=0.0, momentum=0.5), augment=False)
    m = _coteaching()
    pair.train((net1, net2), data, idx, labels, gen=torch.Generator().manual_seed(1), **kw,
               rule=lambda a, b, y, pos: m.batch_losses(a, b, y, 0.0))
    paired = engine.get_weights(net1)
    engine.set_weights(net1, start)
    engine.local_train(net1, data, idx, labels, gen=torch.Generator().manual_seed(1), **kw)
    for k, v in engine.get_weights(net1).items():
        torch.testing.assert_close(paired[k], v, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ SELFIE
def _history_of(rows, q=15):
    """A history whose sample i received the predictions ``rows[i]`` in order."""
    h = history.new(len(rows), q)
    for step in range(max(len(r) for r in rows)):
        ids = torch.tensor([i for i, r in enumerate(rows) if step < len(r)])
        history.push(h, ids, torch.tensor([r[step] for r in rows if step < len(r)]))
    return h


def _entropy(shares):
    return -sum(p * math.log(p) for p in shares if p > 0) / math.log(10)


def test_selfie_refurbishes_a_consistent_history_with_its_majority_label():
    rows = [[3] * 15, [3] * 14 + [5], [3] * 10, [0] * 3, [1, 2] * 8 + [7]]
    h = _history_of(rows)
    ids = torch.arange(len(rows))
    counts = history.class_counts(h, ids, 10)
    assert counts[4].tolist() == [0, 7, 7, 0, 0, 0, 0, 1, 0, 0]  # a ring: the last 15 of 17 predictions
    f = sf.uncertainty(counts, 15)
    assert f[0].item() == pytest.approx(0.0)
    assert f[1].item() == pytest.approx(_entropy([14 / 15, 1 / 15]))  # 0.106 > ε = 0.05
    full = history.full(h, ids)
    assert full.tolist() == [True, True, False, False, True]
    ok, label = sf.refurbish(counts, 15, 0.05, full)
    assert ok.tolist() == [True, False, False, False, False] and label[0].item() == 3
    ok, label = sf.refurbish(counts, 15, 0.11, full)  # a looser ε accepts one dissenting prediction
    assert ok.tolist() == [True, True, False, False, False] and label[1].item() == 3
    # the codes' zero-initialised histories: empty slots read as class-0 predictions
    padded = history.class_counts(h, ids, 10, empty_as=0)
    assert sf.uncertainty(padded, 15)[2].item() == pytest.approx(_entropy([10 / 15, 5 / 15]))
    ok, label = sf.refurbish(padded, 15, 0.05, torch.ones(5, dtype=torch.bool))
    assert ok.tolist() == [True, False, False, True, False] and label[3].item() == 0  # 3 predictions suffice


def test_selfie_selection_is_small_loss_union_refurbished():
    losses = torch.tensor([0.9, 0.1, 0.5, 0.3, 2.0])
    refurbished = torch.tensor([False, False, False, False, True])
    # τ = 0.4: ⌈0.6·5⌉ = 3 smallest losses {1, 3, 2} ∪ the refurbished {4}
    assert sf.selection(losses, lnl.keep_count(5, 0.4, "ceil"), refurbished).tolist() == [1, 2, 3, 4]
    # a batch step: sample 4 has 15 consistent predictions of class 7 and becomes refurbishable
    m = _selfie()
    state = {"history": _history_of([[], [], [], [], [7] * 15]), "num_classes": 10,
             "corrected": torch.full((5,), -1, dtype=torch.long)}
    state["corrected"][0] = 2  # refurbished in an earlier round: kept and trained on with its label
    y = torch.tensor([1, 1, 1, 1, 1])
    logits = torch.zeros(5, 10)
    logits[torch.arange(5), y] = -torch.log(torch.expm1(losses))  # CE of label 1 increases with ``losses``
    logits[4, 7] = 30.0  # sample 4 is predicted as 7: a large loss
    sel, target = m.batch_targets(state, torch.arange(5), y, logits, 0.4)
    assert sel.tolist() == [0, 1, 2, 3, 4]
    assert target.tolist() == [2, 1, 1, 1, 7]
    assert state["corrected"].tolist() == [2, -1, -1, -1, 7]
    assert state["history"]["count"].tolist() == [1, 1, 1, 1, 16]  # history_first: pushed before deciding


def test_selfie_history_after_the_step_waits_one_batch():
    """The official code appends a batch's predictions after its step: a 15th prediction counts
    only from the next batch on."""
    state = {"history": _history_of([[7] * 14]), "num_classes": 10, "corrected": torch.tensor([-1])}
    logits = torch.zeros(1, 10)
    logits[0, 7] = 5.0
    _selfie(history_first=False).batch_targets(state, torch.tensor([0]), torch.tensor([1]), logits, 0.0)
    assert state["corrected"].tolist() == [-1] and state["history"]["count"].tolist() == [15]
    _selfie(history_first=False).batch_targets(state, torch.tensor([0]), torch.tensor([1]), logits, 0.0)
    assert state["corrected"].tolist() == [7]


def test_selfie_refurbishes_and_reports_without_changing_labels(tmp_path):
    s = run_tiny(tmp_path, ["noise.rho=0.5", "noise.tau=0.5"], "selfie")
    assert s["status"] == "complete"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["refurbished"] > 0 and s["detection"]["relabels"] > 0  # q = 2 under debug=tiny
    assert 0.0 <= s["detection"]["relabel_acc"] <= 1.0
    # refurbished labels live in the client's state: the observed labels stay as the federation made them
    assert s["detection"]["noise_after_correction"] == pytest.approx(s["federation"]["noise_rate"])


def test_selfie_restart_reinitialises_clears_histories_and_lowers_tau():
    m = _selfie(restarts=1, warmup_share=0.5)
    assert m.total_rounds(None, 30) == 60
    assert [sf.restart_schedule(m.params, r, 60) for r in (0, 14, 15, 29, 30, 44, 45)] == [
        (0, True), (0, True), (0, False), (0, False), (1, True), (1, True), (1, False)]
    torch.manual_seed(0)
    info = FederationInfo(4, 10, (5,) * 4, (4,), 0, None)
    state = m.init(nn.Sequential(nn.Flatten(), nn.Linear(4, 10)), info, _Ctx(0, 60))
    assert state["history"]["preds"].shape == (20, 15) and state["tau0"] == 0.4
    history.push(state["history"], torch.arange(20), torch.zeros(20, dtype=torch.long))
    state["corrected"][:4] = 3  # client 0 (samples 0..4): 4 of 5 refurbished in run 0
    client = type("View", (), {"id": 0, "indices": torch.arange(5)})()
    assert m.client_tau(state, client) == 0.4
    before = engine.get_weights(state["model"])
    m.sample_clients(state, _Ctx(29, 60))
    assert state["run"] == 0 and torch.equal(state["global"]["1.weight"], before["1.weight"])
    m.sample_clients(state, _Ctx(30, 60))  # the first round of run 1
    assert state["run"] == 1 and not torch.equal(state["global"]["1.weight"], before["1.weight"])
    assert int(state["history"]["count"].sum()) == 0 and state["corrected"][:4].tolist() == [3] * 4
    assert m.client_tau(state, client) == pytest.approx(0.2)  # min(0.4, 1 − 4/5)


def test_selfie_restarts_multiply_the_budget(tmp_path):
    s = run_tiny(tmp_path, ["noise.rho=0.5", "noise.tau=0.5", "method.restarts=1"], "selfie")
    assert s["status"] == "complete" and s["total_rounds"] == 6 and s["comm_cost"] == 18


# -------------------------------------------------------------------------------- configuration
def test_switches_follow_fidelity():
    def node(method, *extra):
        return compose_cfg([f"method={method}", *extra]).method
    for method, key, paper, reference in [
            ("coteaching", "forget_rate", "noise", 0.2), ("coteaching", "schedule", "paper", "linspace"),
            ("coteaching", "keep_rounding", "ceil", "floor"), ("coteaching_plus", "loss_on", "logits", "softmax"),
            ("coteaching_plus", "empty_disagreement", "skip", "full_batch"), ("selfie", "noise_rate", "noise", 0.2),
            ("selfie", "full_history", True, False), ("sce", "A", -4.0, LN_1E4), ("sce", "p_min", 0.0, 1e-7)]:
        assert node(method)[key] == paper, (method, key)
        assert node(method, "fidelity=reference")[key] == pytest.approx(reference), (method, key)
    # SCE's α, β: the paper's per-dataset values; FNBench 0.1 / 1.0 everywhere
    for dataset, ab in (("cifar10", (0.1, 1.0)), ("cifar100", (6.0, 0.1)), ("digits", (0.01, 1.0))):
        n = node("sce", f"dataset={dataset}")
        assert (n.alpha, n.beta) == ab
        n = node("sce", f"dataset={dataset}", "fidelity=reference")
        assert (n.alpha, n.beta) == (0.1, 1.0)


@pytest.mark.parametrize("method, key", [("coteaching", "forget_rate"), ("coteaching_plus", "forget_rate"),
                                         ("selfie", "noise_rate")])
def test_noise_rate_comes_from_the_federation(method, key):
    m = build_method(compose_cfg([f"method={method}", "noise.rho_tau=[0.6,0.5]"]))
    assert m.noise_rate_key == key
    ctx = _Ctx(0, 30)
    info = FederationInfo(4, 10, (5,) * 4, (64,), 0, 0.405)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    tau = "tau0" if method == "selfie" else "tau"
    assert m.init(model, info, ctx)[tau] == 0.405
    fixed = build_method(compose_cfg([f"method={method}", f"method.{key}=0.3"]))
    assert fixed.noise_rate_key is None and fixed.init(model, info, ctx)[tau] == 0.3
    with pytest.raises(ConfigError, match=rf"^method\.{key}=noise needs the noise rate, but noise\.label_set=coarse"):
        build_method(compose_cfg([f"method={method}", "dataset=cifar100", "noise=cifarn", "noise.label_set=coarse"]))


@pytest.mark.parametrize("method, override, message", [
    ("selfie", "method.q=0", r"method\.q=0 is invalid: allowed an integer >= 1"),
    ("selfie", "method.epsilon=1.5", r"method\.epsilon=1\.5 is invalid"),
    ("selfie", "method.restarts=-1", r"method\.restarts=-1 is invalid"),
    ("sce", "method.A=1", r"method\.A=1 is invalid: allowed a number < 0"),
    ("sce", "method.alpha=-1", r"method\.alpha=-1 is invalid"),
    ("coteaching", "method.forget_rate=1.0", r"method\.forget_rate=1\.0 is invalid: allowed a share in \[0, 1\)"),
    ("coteaching", "method.schedule=cosine", r"method\.schedule='cosine' is invalid: allowed paper, linspace"),
    ("coteaching_plus", "method.init_round=-1", r"method\.init_round=-1 is invalid"),
    ("coteaching_plus", "method.loss_on=probs", r"method\.loss_on='probs' is invalid: allowed logits, softmax"),
])
def test_bad_values_are_refused_in_one_line(method, override, message):
    with pytest.raises(ConfigError, match=rf"^{message}"):
        build_method(compose_cfg([f"method={method}", override]), [override])


def test_pair_uploads_both_networks_and_averages_each(tmp_path):
    s_pair = run_tiny(tmp_path / "pair", ["noise.rho=0.5", "noise.tau=0.5"], "coteaching")
    s_one = run_tiny(tmp_path / "one", ["noise.rho=0.5", "noise.tau=0.5"], "fedavg")
    assert s_pair["comm_cost"] == s_one["comm_cost"]
    reports = 3 * 6 * 16  # 3 evaluations x 6 clients' validation counts: the same in both runs
    assert s_pair["bytes_up"] - reports == 2 * (s_one["bytes_up"] - reports)  # network 2 travels in the payload
    state = {"global": None, "global2": None}
    w = [{"w": torch.tensor([1.0])}, {"w": torch.tensor([4.0])}]
    ups = [ClientUpdate(0, w[0], 1, payload={"weights2": w[1]}),
           ClientUpdate(1, w[1], 3, payload={"weights2": w[0]})]
    pair.aggregate(state, ups)
    assert state["global"]["w"].item() == pytest.approx(3.25) and state["global2"]["w"].item() == pytest.approx(1.75)
