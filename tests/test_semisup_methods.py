"""JointOpt and DivideMix (local training in FL and centralized references): closed-form checks of
their pieces, client memory across rounds, and the centralized protocol (all samples, no cost)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from conftest import build_method, compose_cfg, make, run_tiny
from fedlnl.methods.common import engine, semisup
from fedlnl.methods.dividemix import DivideMix
from fedlnl.methods.jointopt import JointOpt
from fedlnl.methods.common.protocol import ClientView, RoundContext

NOISY = ["noise.rho=0.5", "noise.tau=0.5"]
SMALL = [*NOISY, "model.channels=[8,16]"]  # runner-level checks of the protocol, not of accuracy


# ------------------------------------------------------------------------------ DivideMix pieces
def test_co_divide_marks_high_loss_mode_unlabeled():
    g = np.random.default_rng(0)
    noisy = np.r_[np.zeros(80, bool), np.ones(20, bool)]
    losses = np.where(noisy, 2.0 + 0.1 * g.standard_normal(100), 0.1 + 0.02 * g.standard_normal(100))
    losses = torch.tensor(g.permutation(np.c_[losses, noisy]), dtype=torch.float32)
    w = semisup.clean_probability(losses[:, 0], 0, max_iter=10, tol=1e-2, reg_covar=5e-4)
    planted = losses[:, 1].bool()
    assert torch.equal(w <= 0.5, planted)  # unlabeled set = the high-loss mode
    assert w[~planted].min() > 0.99 and w[planted].max() < 0.01
    # min-max normalisation: an affine change of the losses gives the same division
    w2 = semisup.clean_probability(3 * losses[:, 0] + 7, 0, max_iter=10, tol=1e-2, reg_covar=5e-4)
    assert torch.allclose(w, w2, atol=1e-4)
    assert torch.equal(semisup.clean_probability(torch.full((5,), 0.3), 0, 10, 1e-2, 5e-4), torch.ones(5))


def test_sharpen_refine_and_co_guess():
    assert torch.allclose(semisup.sharpen(torch.tensor([[0.6, 0.4]]), 0.5), torch.tensor([[0.36, 0.16]]) / 0.52)
    p = torch.tensor([[0.2, 0.3, 0.5]])
    assert torch.allclose(semisup.sharpen(p, 1.0), p)
    # ȳ = 0.5·[1,0,0] + 0.5·[0,.5,.5] = [.5,.25,.25] → squared and renormalised: [2/3, 1/6, 1/6]
    refined = semisup.refine_labels(torch.tensor([[1.0, 0, 0]]), torch.tensor([0.5]), torch.tensor([[0.0, 0.5, 0.5]]), 0.5)
    assert torch.allclose(refined, torch.tensor([[2 / 3, 1 / 6, 1 / 6]]))
    # w = 1 keeps the given label; w = 0 keeps the (sharpened) prediction
    y, q = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.7, 0.3]])
    assert torch.allclose(semisup.refine_labels(y, torch.tensor([1.0]), q, 0.5), y)
    assert torch.allclose(semisup.refine_labels(y, torch.tensor([0.0]), q, 0.5), semisup.sharpen(q, 0.5))
    # co-guess: mean of 2 networks x 2 views = [.55, .45] → [.3025, .2025] / .505
    views = [torch.tensor([[a, 1 - a]]) for a in (0.8, 0.6, 0.5, 0.3)]
    assert torch.allclose(semisup.co_guess(views, 0.5), torch.tensor([[0.3025, 0.2025]]) / 0.505)


def test_mixmatch_loss_and_rampup():
    logits = torch.zeros(4, 2)  # uniform predictions: L_X = ln 2 whatever the targets, L_reg = 0
    targets = torch.tensor([[0.3, 0.7], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    loss, l_x, l_u, l_reg = semisup.mixmatch_loss(logits, targets, 2, 10.0, torch.full((2,), 0.5))
    assert math.isclose(float(l_x), math.log(2), rel_tol=1e-6)
    assert math.isclose(float(l_u), 0.25, rel_tol=1e-6) and abs(float(l_reg)) < 1e-7
    assert math.isclose(float(loss), math.log(2) + 2.5, rel_tol=1e-6)
    # L_reg = KL(π ‖ p̄) when the mean prediction is not uniform
    lg = torch.tensor([[math.log(3.0), 0.0]])
    reg = semisup.mixmatch_loss(lg, torch.tensor([[1.0, 0.0]]), 1, 0.0, torch.full((2,), 0.5))[3]
    assert math.isclose(float(reg), 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25), rel_tol=1e-5)
    assert semisup.linear_rampup(8, 16) == 0.5 and semisup.linear_rampup(20, 16) == 1.0 and semisup.linear_rampup(-1, 16) == 0.0


def test_ensemble_averages_softmax():
    torch.manual_seed(0)
    a, b = nn.Linear(3, 4), nn.Linear(3, 4)
    x = torch.randn(5, 3)
    out = semisup.Ensemble(a, b, "softmax")(x)
    mean = (a(x).softmax(1) + b(x).softmax(1)) / 2
    assert torch.allclose(out.exp(), mean, atol=1e-6)
    y = torch.tensor([0, 1, 2, 3, 0])
    assert torch.allclose(F.cross_entropy(out, y), -mean[torch.arange(5), y].log().mean(), atol=1e-6)
    assert torch.allclose(semisup.Ensemble(a, b, "logits")(x), a(x) + b(x))
    # confident disagreement stays finite (no log 0)
    with torch.no_grad():
        a.weight.mul_(1e4)
    assert torch.isfinite(F.cross_entropy(semisup.Ensemble(a, b, "softmax")(x), y))
    with pytest.raises(ValueError, match="method.ensemble"):
        semisup.Ensemble(a, b, "mean")


def test_fresh_copy_is_independent_and_leaves_global_rng():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    net.head = net[2]
    before = torch.get_rng_state()
    twin, again = semisup.fresh_copy(net, 7, "all"), semisup.fresh_copy(net, 7, "all")
    assert torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(twin[0].weight, net[0].weight) and torch.equal(twin[0].weight, again[0].weight)
    head_only = semisup.fresh_copy(net, 7, "head")
    assert torch.equal(head_only[0].weight, net[0].weight) and not torch.equal(head_only[2].weight, net[2].weight)


@pytest.mark.parametrize("rho,tau,group", [(0.0, 0.0, "low"), (0.4, 0.0, "low"), (0.4, 0.5, "low"),
                                           (0.6, 0.0, "low"), (0.6, 0.5, "high"), (0.8, 0.0, "high"),
                                           (0.8, 0.5, "high")])
def test_noise_groups_match_fedcorr(rho, tau, group):
    assert semisup.noise_group(rho, tau, 0.4) == group


# ------------------------------------------------------------------------------ JointOpt pieces
def test_jointopt_loss_terms_closed_form():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])  # s = [.5,.5], [.75,.25]
    soft = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    l_c, l_p, l_e, s = semisup.jointopt_terms(logits, soft, torch.tensor([0.5, 0.5]))
    assert math.isclose(float(l_c), (math.log(2) + math.log(4)) / 2, rel_tol=1e-6)
    # KL(p ‖ s̄), s̄ = [.625, .375]
    assert math.isclose(float(l_p), 0.5 * math.log(0.5 / 0.625) + 0.5 * math.log(0.5 / 0.375), rel_tol=1e-5)
    h = lambda *q: -sum(v * math.log(v) for v in q)  # noqa: E731
    assert math.isclose(float(l_e), (h(0.5, 0.5) + h(0.75, 0.25)) / 2, rel_tol=1e-6)
    assert torch.allclose(s, torch.tensor([[0.5, 0.5], [0.75, 0.25]]))


def test_jointopt_soft_label_is_mean_of_recent_predictions():
    labels = torch.tensor([0, 2])
    mem = semisup.label_memory(torch.tensor([10, 11]), labels, 3, window=2)
    assert torch.equal(mem["soft"], torch.tensor([[1.0, 0, 0], [0, 0, 1.0]]))
    p1 = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.1, 0.8]])
    p2 = torch.tensor([[0.2, 0.7, 0.1], [0.3, 0.3, 0.4]])
    p3 = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.1, 0.4]])
    assert not semisup.push_predictions(mem, p1, begin=2)  # before `begin`: labels untouched
    assert torch.equal(mem["soft"][0], torch.tensor([1.0, 0, 0]))
    assert semisup.push_predictions(mem, p2, begin=2)
    assert torch.allclose(mem["soft"], torch.tensor([[0.4, 0.5, 0.1], [0.2, 0.2, 0.6]]))
    assert semisup.push_predictions(mem, p3, begin=2)  # window 2: p1 dropped
    assert torch.allclose(mem["soft"], torch.tensor([[0.1, 0.85, 0.05], [0.4, 0.2, 0.4]]))
    assert torch.equal(semisup.hard_labels(mem), torch.tensor([1, 0]))


# ------------------------------------------------------------------------------ client memory
def _toy(n=24, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 1, 8, 8), generator=g, dtype=torch.uint8)
    data = engine.TensorData.build(x, [0.5], [0.25], None, "cpu")
    idx = torch.arange(n)
    view = ClientView(3, idx, torch.randint(0, classes, (n,), generator=g), data)
    calls = {"relabel": [], "samples": []}

    def ctx(rnd):
        return RoundContext(round=rnd, total_rounds=9, seed=0, device=torch.device("cpu"), num_clients=5,
                            client_sizes=(n,) * 5, data=data,
                            relabel=lambda i, y: calls["relabel"].append((i.clone(), y.clone())),
                            report_samples=lambda i, f: calls["samples"].append((i.clone(), f.clone())))

    from fedlnl.methods.common.protocol import FederationInfo
    from fedlnl.models.cnn import CNN
    model = CNN(classes, (1, 8, 8), [4, 8], 2)
    return model, FederationInfo(5, classes, (n,) * 5, (1, 8, 8), 0), view, ctx, calls


def _kwargs(name, **over):
    cfg = compose_cfg([f"method={name}"])
    kw = {k: v for k, v in OmegaConf.to_container(cfg.method, resolve=True).items() if k != "_target_"}
    kw.update({"warmup_rounds": 0, "train_rounds": 2, "train_local_epochs": 2, "batch_size": 8, **over})
    return kw


def test_jointopt_client_memory_persists_across_rounds():
    model, info, view, ctx, calls = _toy()
    method = make(JointOpt, **_kwargs("jointopt", window=3, begin=2))
    state = method.init(model, info, ctx(0))
    for rnd in (0, 1):
        up = method.client_update(state, view, ctx(rnd))
        state, metrics = method.aggregate(state, [up], ctx(rnd))
        assert metrics["stage"] == "training" and math.isfinite(up.train_loss)
    mem = state["clients"][view.id]
    assert mem["count"] == 4  # 2 rounds x 2 local epochs, one memory keyed by the client id
    # soft labels = mean of the last 3 recorded epochs (slots 1, 2, 3 % 3 = 0)
    assert torch.allclose(mem["soft"], mem["history"].mean(0))
    assert torch.allclose(mem["soft"].sum(1), torch.ones(view.size))
    idx, hard = calls["relabel"][-1]
    assert torch.equal(idx, view.indices) and torch.equal(hard, mem["soft"].argmax(1))
    sidx, flagged = calls["samples"][-1]
    assert torch.equal(flagged, hard != view.labels)


def test_dividemix_client_memory_and_reports():
    model, info, view, ctx, calls = _toy()
    method = make(DivideMix, **_kwargs("dividemix", train_local_epochs=1, lambda_u_low=25.0))
    state = method.init(model, info, ctx(0))
    assert not torch.equal(state["model"].head.weight, state["model2"].head.weight)
    for rnd in (0, 1):
        up = method.client_update(state, view, ctx(rnd))
        assert set(up.payload) == {"weights2"} and math.isfinite(up.train_loss)
        state, _ = method.aggregate(state, [up], ctx(rnd))
    assert state["clients"][view.id]["epochs"] == 2
    sidx, flagged = calls["samples"][-1]
    assert torch.equal(sidx, view.indices) and flagged.dtype == torch.bool
    out = method.eval_model(state)(view.data.images(view.indices))
    assert torch.allclose(out.exp().sum(1), torch.ones(view.size), atol=1e-5)


def test_bad_hyperparameters_name_the_key():
    with pytest.raises(ValueError, match=r"method\.begin=0"):
        make(JointOpt, **_kwargs("jointopt", begin=0))
    with pytest.raises(ValueError, match=r"method\.p_threshold=1\.5"):
        make(DivideMix, **_kwargs("dividemix", p_threshold=1.5))


# ------------------------------------------------------------------------------ runner level
def test_central_variants_see_all_samples_without_cost(tmp_path, monkeypatch):
    from fedlnl.methods.dividemix_central import DivideMixCentral
    from fedlnl.methods.jointopt_central import JointOptCentral

    seen = []
    for cls in (JointOptCentral, DivideMixCentral):
        orig = cls.client_update

        def spy(self, state, client, ctx, _orig=orig):
            seen.append((type(self).__name__, client.size, int(client.indices.unique().numel()), sum(ctx.client_sizes)))
            return _orig(self, state, client, ctx)

        monkeypatch.setattr(cls, "client_update", spy)
    fed = run_tiny(tmp_path / "fl", SMALL, "jointopt")
    cen = {m: run_tiny(tmp_path / m, SMALL, m) for m in ("jointopt_central", "dividemix_central")}
    for m, s in cen.items():
        # no upload but the 6 clients' validation counts at each evaluation (16 bytes a client)
        evaluations = len((tmp_path / m / "metrics.jsonl").read_text().splitlines())
        assert s["status"] == "complete" and s["comm_cost"] == 0 and s["bytes_up"] == evaluations * 6 * 16
        assert s["federation_hash"] == fed["federation_hash"]
    assert fed["comm_cost"] > 0
    assert {name for name, *_ in seen} == {"JointOptCentral", "DivideMixCentral"}
    assert all(size == unique == total for _, size, unique, total in seen)


def test_reference_fidelity_runs_end_to_end(tmp_path):
    s = run_tiny(tmp_path, [*SMALL, "fidelity=reference"], "dividemix")
    assert s["status"] == "complete" and s["config"]["method"]["ensemble"] == "logits"
    assert s["rounds_run"] == s["total_rounds"]


@pytest.mark.parametrize(("cell", "lr", "first"), [("[0.0,0.0]", None, 0.1), ("[0.6,0.5]", None, 0.2),
                                                   ("[0.0,0.0]", 0.01, 0.01), ("[0.6,0.5]", 0.01, 0.02)])
def test_central_jointopt_runs_table_8s_lr_per_group_from_one_key(cell, lr, first):
    """FedCorr Table 8: lr 0.1 (low noise) and 0.2 (high noise); one key (method.lr, a pin of fl.lr) sets
    both, so that a tuned value reaches every cell (issue 32)."""
    typed = [f"method.lr={lr}"] if lr is not None else []
    method = build_method(compose_cfg(["method=jointopt_central", f"noise.rho_tau={cell}", *typed]), typed)
    assert method.params.first_lr(method.fl.lr) == pytest.approx(first)
