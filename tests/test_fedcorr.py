"""FedCorr: stage schedule and communication cost, relabel wiring, switches, ablations end to end."""
import json

import numpy as np
import pytest
import torch

from conftest import build_method, compose_cfg, run_tiny
from fedlnl.methods import fedcorr
from fedlnl.methods.fedcorr import FT, PRE, USUAL, schedule

NOISY = ["noise.rho=0.5", "noise.tau=0.5"]


def make(*overrides):
    return build_method(compose_cfg(["method=fedcorr", *overrides]))


# ----------------------------------------------------------------------------- schedule
@pytest.mark.parametrize("n, t1, t2, t3, frac, cost", [
    (100, 5, 500, 450, 0.1, 10_000),   # CIFAR-10: 100·5 + 10·500 + 10·450
    (50, 10, 450, 450, 0.1, 5_000),    # CIFAR-100: 50·10 + 5·450 + 5·450
    (500, 2, 50, 50, 0.02, 2_000),     # Clothing1M: 500·2 + 10·50 + 10·50
])
def test_paper_schedules_and_total_cost(n, t1, t2, t3, frac, cost):
    plan = schedule(n, t1, t2, t3, frac)
    assert sum(c for _, c in plan) == cost
    assert [s for s, _ in plan] == [PRE] * (n * t1) + [FT] * t2 + [USUAL] * t3
    assert all(c == 1 for s, c in plan if s == PRE)


def test_schedule_ablations_and_small_clean_set():
    # w/o fraction scheduling: each iteration = 10 sub-rounds of 10 clients (same cost per iteration)
    plan = schedule(100, 5, 500, 450, 0.1, fraction_scheduling=False)
    assert len(plan) == 50 + 500 + 450 and plan[0] == (PRE, 10)
    assert sum(c for _, c in plan) == 10_000
    assert len(schedule(100, 5, 500, 450, 0.1, fine_tuning=False)) == 500 + 450
    assert len(schedule(100, 5, 500, 450, 0.1, usual_training=False)) == 500 + 500
    # only 4 clients qualify for fine-tuning: 4 per stage-2 round
    assert sum(c for s, c in schedule(100, 5, 500, 450, 0.1, num_clean=4) if s == FT) == 2000
    # a permutation cut into chunks of m = 3 over 10 clients: 3, 3, 3, 1
    assert [c for _, c in schedule(10, 1, 0, 0, 0.3, fraction_scheduling=False)] == [3, 3, 3, 1]
    # the reference: ⌊1/γ⌋ = 3 sub-rounds of 3 draws
    assert [c for _, c in schedule(10, 1, 0, 0, 0.3, fraction_scheduling=False, replace=True)] == [3, 3, 3]


def test_total_rounds_of_the_configured_method():
    from fedlnl.methods.common.protocol import FederationInfo

    info = lambda n: FederationInfo(n, 10, (10,) * n, (1, 8, 8), 0)  # noqa: E731
    assert make("dataset=cifar10").total_rounds(info(100)) == 500 + 500 + 450
    assert make("dataset=cifar100").total_rounds(info(50)) == 500 + 450 + 450
    m = make("dataset=cifar100")
    assert (m.fl.lr, m.T1) == (0.01, 10)
    assert make().total_rounds(info(20)) == 20 * 2 + 11 + 11  # digits: the quickstart budget
    assert make("dataset=cifar10", "method.fine_tuning=false", "method.usual_training=false").total_rounds(info(100)) == 500


def _plan(m, n, rng):
    return fedcorr.stage1_plan(n, m.fl.frac, m.params, rng)


def test_stage1_plans_cover_clients():
    rng = np.random.default_rng(0)
    seq = _plan(make(), 7, rng)
    assert [len(s) for s in seq] == [1] * 7 and sorted(sum(seq, [])) == list(range(7))
    chunks = _plan(make("method.fraction_scheduling=false", "fl.frac=0.3"), 10, rng)
    assert [len(s) for s in chunks] == [3, 3, 3, 1] and sorted(sum(chunks, [])) == list(range(10))
    ref = _plan(make("method.fraction_scheduling=false", "fl.frac=0.3", "fidelity=reference"), 10, rng)
    assert [len(s) for s in ref] == [3, 3, 3]
    for i, a in enumerate(ref):  # a client may repeat within a sub-round, never across sub-rounds
        for b in ref[i + 1:]:
            assert not set(a) & set(b)


# ----------------------------------------------------------------------------- relabel choices
# global model: p(class 0 = the observed label) per sample; most of the rest on class 1
P0 = torch.tensor([0.05, 0.02, 0.08, 0.01, 0.001, 0.001, 0.3, 0.3])
GLOBAL_LOGITS = torch.stack([P0, 0.97 - P0, torch.full_like(P0, 0.03)], 1).log()
LOCAL_LOSS = torch.tensor([0.1, 0.4, 0.3, 0.2, 0.0, 0.0, 5.0, 4.0])
GMM_NOISY = torch.tensor([True, True, True, True, False, False, False, False])


def _relabelled(m, mu_hat=0.5):
    """Positions stage 1 relabels on the toy client (labels all 0) and their new labels."""
    mask = fedcorr.stage1_relabel_mask(m.params, GLOBAL_LOGITS, torch.zeros(8, dtype=torch.long), GMM_NOISY,
                                       LOCAL_LOSS, mu_hat)
    return mask.nonzero().flatten().tolist(), GLOBAL_LOGITS.argmax(1)[mask].tolist()


@pytest.mark.parametrize("rank_model, rank_pool, expected", [
    ("global", "noisy", [1, 3]),   # paper: top ⌊π·4⌋ = 2 of D^n by the global model's loss
    ("global", "all", [4, 5]),
    ("local", "noisy", [1, 2]),
    ("local", "all", [6, 7]),      # reference: top 2 over all samples by the local loss
])
def test_stage1_relabel_ranking_model_and_pool(rank_model, rank_pool, expected):
    m = make(f"method.rank_model={rank_model}", f"method.rank_pool={rank_pool}", "method.loss_on=logits")
    assert _relabelled(m) == (expected, [1, 1])


def test_stage1_relabel_share_and_threshold():
    probs = GLOBAL_LOGITS.softmax(1)
    assert _relabelled(make("method.pi_=1.0"))[0] == [0, 1, 2, 3]  # all 4 GMM-noisy samples are candidates
    # θ equal to sample 2's confidence: ≥ keeps it and the more confident ones; > drops it
    theta = float(probs[2].max())
    for strict, kept in ((False, [0, 1, 2, 3]), (True, [0, 1, 3])):
        m = make("method.pi_=1.0", f"method.theta={theta}", f"method.strict_threshold={str(strict).lower()}")
        assert _relabelled(m)[0] == kept


def test_stage1_relabel_cap_of_the_code_counts_mu_hat():
    """relabel_cap=mu_hat: int(n_k·μ̂_k·π) candidates (the code) instead of ⌊π·|D_k^n|⌋."""
    m = make("method.pi_=1.0", "method.relabel_cap=mu_hat", "method.rank_pool=all", "method.rank_model=local")
    assert _relabelled(m, mu_hat=0.25)[0] == [6, 7]  # int(8 · 0.25 · 1) = 2: the two largest local losses


@pytest.mark.parametrize("fidelity, clients", [("paper", [2]), ("reference", [1, 2])])
def test_stage2_relabel_targets(fidelity, clients):
    m = make(f"fidelity={fidelity}")
    assert fedcorr.finetune_targets(m.params, np.array([0.0, 0.05, 0.3]), np.array([False, True, True])) == clients


def test_kappa_comparison():
    mu = np.array([0.0, 0.1, 0.2])
    assert fedcorr.clean_clients(mu, make().params).tolist() == [True, True, False]
    assert fedcorr.clean_clients(mu, make("method.kappa_cmp=lt").params).tolist() == [True, False, False]


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("override, key", [
    ("method.rank_model=median", "method.rank_model"),
    ("method.loss_on=probs", "method.loss_on"),
    ("method.prox_form=cubic", "method.prox_form"),
    ("method.theta=1.5", "method.theta"),
    ("method.T1=0", "method.T1"),
    ("method.correction=maybe", "method.correction"),
])
def test_invalid_settings_name_the_key(override, key):
    with pytest.raises(Exception, match=key.replace(".", r"\.")):
        make(override)


def test_fidelity_flips_every_switch():
    paper, ref = make(), make("fidelity=reference")
    for key, p, r in (("prox_form", "squared", "norm"), ("prox_skip_first", False, True),
                      ("mixup_all_stages", False, True), ("loss_on", "logits", "softmax"),
                      ("score_augment", False, True), ("rank_model", "global", "local"),
                      ("rank_pool", "noisy", "all"), ("strict_threshold", False, True),
                      ("stage2_relabel", "unclean", "lid_noisy"), ("stage1_replace", False, True)):
        assert (getattr(paper, key), getattr(ref, key)) == (p, r), key
    assert make("fidelity=reference", "method.loss_on=logits").loss_on == "logits"  # one switch alone


# ----------------------------------------------------------------------------- end to end (tiny)
def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_tiny_run_follows_the_schedule_and_reports_diagnostics(tmp_path):
    s = run_tiny(tmp_path, NOISY, "fedcorr")
    assert s["status"] == "complete" and s["total_rounds"] == 6 * 2 + 2 + 2  # debug=tiny: T1, T2, T3 = 2, 2, 2
    rows = _rows(tmp_path)
    diag = json.loads((tmp_path / "diagnostics.json").read_text())
    pool = diag["records"]["finetuning"]["clean_pool"]
    plan = schedule(6, 2, 2, 2, 0.5, num_clean=len(pool))
    assert [r["stage"] for r in rows] == [st for st, _ in plan]
    assert [r["comm_cost"] for r in rows] == np.cumsum([c for _, c in plan]).tolist()
    lid = diag["records"]["lid"]
    assert lid["iteration"] == 2 and len(lid["cumulative_lid"]) == 6 and len(lid["gmm"]["means"]) == 2
    assert diag["records"]["lid/iter2"] == lid
    assert {"client_f1", "mu_mae", "sample_f1"} <= set(s["detection"])
    assert all(v is not None for v in diag["clients"]["mu_hat"])


ABLATIONS = [
    ["method.correction=false"], ["method.fraction_scheduling=false"], ["method.local_prox=false"],
    ["method.fine_tuning=false"], ["method.usual_training=false"], ["method.mixup=false"],
    ["fidelity=reference"], ["fidelity=reference", "method.fraction_scheduling=false"],
]


@pytest.mark.parametrize("overrides", ABLATIONS, ids=lambda o: ",".join(o))
def test_ablations_and_reference_run(tmp_path, overrides):
    s = run_tiny(tmp_path, NOISY + overrides, "fedcorr")
    assert s["status"] == "complete" and s["rounds_run"] == s["total_rounds"]
    stages = {r["stage"] for r in _rows(tmp_path)}
    assert (FT in stages) == ("method.fine_tuning=false" not in overrides)
    assert (USUAL in stages) == ("method.usual_training=false" not in overrides)
    if "method.correction=false" in overrides:
        assert s["detection"].get("relabels", 0) == 0


def test_stage3_delegates_to_fedprox(tmp_path, monkeypatch):
    from fedlnl.methods.fedprox import FedProx

    calls = {"init": 0, "client_update": 0, "aggregate": 0}
    for hook in calls:
        real = getattr(FedProx, hook)

        def spy(self, *a, _real=real, _hook=hook, **kw):
            calls[_hook] += 1
            return _real(self, *a, **kw)

        monkeypatch.setattr(FedProx, hook, spy)
    s = run_tiny(tmp_path, NOISY + ["+method@method.stage3=fedprox"], "fedcorr")
    assert s["status"] == "complete" and s["total_rounds"] == 16
    assert calls == {"init": 1, "client_update": 2 * 3, "aggregate": 2}
    assert [r["stage"] for r in _rows(tmp_path)][-2:] == [USUAL, USUAL]


def test_empty_clean_set_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"method\.kappa"):
        run_tiny(tmp_path, NOISY + ["method.kappa=0.0", "method.kappa_cmp=lt"], "fedcorr")


def test_schedule_function_is_pure():
    assert fedcorr.stage1_shape(100, 0.1, True, False) == (100, 1)
    assert fedcorr.stage1_shape(100, 0.1, False, False) == (10, 10)
