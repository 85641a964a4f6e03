"""Closed-form checks of the robust aggregators (docs/methods/robust_aggregation.md §19): Krum / Multi-Krum, trimmed mean (the
paper's coordinate-wise rule and FNBench's client-score rule), RFA's smoothed Weiszfeld geometric
median, norm clipping, the Byzantine count taken from the configured noisy-client share, and the
one-line refusals of impossible settings."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from conftest import compose_cfg, make, run_tiny
from fedlnl.datasets.noise import nominal_noisy_share
from fedlnl.methods.common.protocol import Optim
from fedlnl.methods.common import engine, optimizers, robust
from fedlnl.methods.common.protocol import ClientUpdate, FederationInfo, RoundContext
from fedlnl.methods.krum import Krum
from fedlnl.methods.norm_clip import NormClip
from fedlnl.methods.rfa import RFA
from fedlnl.methods.trimmed_mean import TrimmedMean
from test_robustness import TINY, assert_refused, cli

CPU = torch.device("cpu")

#: five models in R^2 (one outlier); with f = 1 each score sums the 2 nearest squared distances
POINTS = [(0.0, 0.0), (1.0, 0.0), (0.0, 2.0), (2.0, 2.0), (10.0, 0.0)]
#: squared distances by hand: row i = ‖V_i − V_j‖² for j = 0..4
D2 = [[0, 1, 4, 8, 100], [1, 0, 5, 5, 81], [4, 5, 0, 4, 104], [8, 5, 4, 0, 68], [100, 81, 104, 68, 0]]


class Vec(nn.Module):
    """A 'model' whose state dict is one parameter vector ``w`` (and optionally a second ``b``)."""

    def __init__(self, d: int = 2, extra: int = 0):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d))
        if extra:
            self.b = nn.Parameter(torch.zeros(extra))


def states(points, key="w"):
    return [{key: torch.tensor(p, dtype=torch.float32)} for p in points]


def updates(weights, sizes=None):
    sizes = sizes or [10] * len(weights)
    return [ClientUpdate(k, w, n) for k, (w, n) in enumerate(zip(weights, sizes))]


def ctx(n, records=None):
    rec = (lambda k, v: records.__setitem__(k, v)) if records is not None else (lambda k, v: None)
    return RoundContext(round=0, total_rounds=1, seed=0, device=CPU, num_clients=n,
                        client_sizes=(10,) * n, record=rec)


def info(n, share=None):
    return FederationInfo(n, 2, (10,) * n, (1, 1, 1), 0, noisy_client_share=share)


def init(method, model, n, share=None):
    return method.init(model, info(n, share), ctx(n))


# ------------------------------------------------------------------ distances
def test_pairwise_squared_distances_by_hand():
    d2 = robust.pairwise_sq_distances(states(POINTS), ["w"])
    assert torch.allclose(d2, torch.tensor(D2, dtype=torch.float64), rtol=1e-12, atol=0)
    assert (d2.diagonal() == 0).all() and torch.equal(d2, d2.T)


def test_pairwise_distances_in_blocks_match_brute_force_without_cancellation():
    """Several entries, blocks of 3 coordinates, and weights of size 1e3 that differ by 1e-3: the
    centred Gram form keeps the small distances that a plain ‖a‖² + ‖b‖² − 2ab in float32 loses."""
    g = torch.Generator().manual_seed(0)
    ws = [{"a": 1000 + 1e-3 * torch.randn(7, generator=g), "b": torch.randn(2, 3, generator=g)} for _ in range(4)]
    flat = [torch.cat([w["a"].double(), w["b"].double().flatten()]) for w in ws]
    brute = torch.tensor([[float(((x - y) ** 2).sum()) for y in flat] for x in flat], dtype=torch.float64)
    d2 = robust.pairwise_sq_distances(ws, ["a", "b"], chunk=3 * 4)
    assert torch.allclose(d2, brute, rtol=1e-9, atol=1e-12)
    assert torch.allclose(robust.sq_distances_to(ws, ws[0], ["a", "b"]), brute[:, 0], rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ Krum
def test_krum_scores_sum_the_n_minus_f_minus_2_nearest():
    d2 = torch.tensor(D2, dtype=torch.float64)
    # f = 1: n - f - 2 = 2 nearest: V0 1+4, V1 1+5, V2 4+4, V3 4+5, V4 68+81
    assert robust.krum_scores(d2, 1).tolist() == [5, 6, 8, 9, 149]
    # FNBench: the sum over every other model: V3 wins there, V0 under the paper's rule
    assert robust.krum_scores(d2, 1, "all").tolist() == [113, 92, 117, 85, 353]
    assert robust.krum_select(d2, 1) == [0]
    assert robust.krum_select(d2, 1, neighbours="all") == [3]
    assert robust.krum_select(d2, 1, m=2) == [0, 1]


@pytest.mark.parametrize("multi_m, neighbours, expected", [
    (1, "nearest", [0.0, 0.0]), (2, "nearest", [0.5, 0.0]), (1, "all", [2.0, 2.0])])
def test_krum_method_returns_the_selected_model_or_the_multi_krum_average(multi_m, neighbours, expected):
    m = make(Krum, byzantine_share="noise", f=None, multi_m=multi_m, neighbours=neighbours, integer_buffers=False)
    state = init(m, Vec(), 5, share=0.2)  # f = floor(0.2 x 5) = 1
    records = {}
    state, metrics = m.aggregate(state, updates(states(POINTS)), ctx(5, records))
    assert state["global"]["w"].tolist() == expected and metrics == {"krum_f": 1}
    assert len(records["krum_selected"]) == multi_m


def test_byzantine_f_from_the_noisy_share_is_floored_and_clamped_to_the_krum_bound():
    assert robust.byzantine_count(0.3, 10) == 3 and robust.byzantine_count(0.29, 100) == 29
    assert [robust.krum_max_f(n) for n in (3, 4, 5, 10, 11)] == [0, 0, 1, 3, 4]  # n > 2f + 2
    assert [robust.trim_max(n) for n in (1, 2, 3, 10)] == [0, 0, 1, 4]
    m = make(Krum, byzantine_share="noise", f=None, multi_m=1, neighbours="nearest", integer_buffers=False)
    state = init(m, Vec(), 10, share=0.6)
    assert robust.round_f(None, state["share"], 10, robust.krum_max_f) == 3  # 6 asked, 10 > 2f + 2 allows 3
    assert robust.round_f(None, state["share"], 10, robust.trim_max) == 4
    assert robust.round_f(2, None, 10, robust.krum_max_f) == 2
    with pytest.raises(ValueError, match="noisy-client share"):
        init(m, Vec(), 10, share=None)


def test_nominal_noisy_share_reads_the_noise_config_only():
    assert nominal_noisy_share({"kind": "symmetric", "rho": 0.6, "tau": 0.5}) == 0.6
    assert nominal_noisy_share({"kind": "pairflip", "rho": 0.0}) == 0.0
    groups = [{"kind": "clean", "share": 0.5}, {"kind": "symmetric", "share": 0.3}, {"kind": "pairflip", "share": 0.2}]
    assert nominal_noisy_share({"kind": "mixed", "groups": groups}) == pytest.approx(0.5)
    assert nominal_noisy_share({"kind": "cifarn", "label_set": "aggre"}) == 1.0
    assert nominal_noisy_share({"kind": "symmetric", "rho": 0.0}, real="clothing1m") == 1.0


def test_the_runner_hands_the_configured_share_to_the_trimmed_mean(tmp_path):
    """noise.rho = 0.5 with 3 clients a round: f = floor(1.5) = 1 value trimmed from each end."""
    s = run_tiny(tmp_path, ["noise.rho=0.5", "noise.tau=0.5"], "trimmed_mean")
    assert s["status"] == "complete" and s["federation"]["nominal_noisy_share"] == 0.5
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["trim_f"] for r in rows] == [1, 1, 1]


# ------------------------------------------------------------------ trimmed mean
def test_coordinate_trimmed_mean_by_hand():
    ws = states([(1.0, -50.0), (2.0, 0.0), (3.0, 1.0), (4.0, 2.0), (100.0, 3.0)])
    assert robust.coordinate_trimmed_mean(ws, 1, ["w"])["w"].tolist() == [3.0, 1.0]  # (2+3+4)/3, (0+1+2)/3
    assert robust.coordinate_trimmed_mean(ws, 2, ["w"])["w"].tolist() == [3.0, 1.0]  # the median
    assert torch.allclose(robust.coordinate_trimmed_mean(ws, 0, ["w"])["w"], torch.tensor([22.0, -8.8]))  # the mean
    with pytest.raises(ValueError, match="leaves no value"):
        robust.coordinate_trimmed_mean(ws, 3, ["w"])


def test_fnbench_client_score_trim_by_hand():
    """Score sums [113, 92, 117, 85, 353], lower median 113, |s − 113| = [0, 21, 4, 28, 240]:
    with c = 1 the 3 closest are V0, V2, V1, averaged."""
    assert robust.score_trim(torch.tensor(D2, dtype=torch.float64), 1) == [0, 2, 1]
    m = make(TrimmedMean, byzantine_share=0.3, f=None, trim="client_score", integer_buffers=True)
    state, metrics = m.aggregate(init(m, Vec(), 5), updates(states(POINTS)), ctx(5))
    assert torch.allclose(state["global"]["w"], torch.tensor([1 / 3, 2 / 3])) and metrics == {"trim_f": 1}


def test_trimmed_mean_method_keeps_integer_counters_as_fedavg():
    ws = [{"w": torch.tensor([float(v)]), "n": torch.tensor(v)} for v in (1, 2, 30)]
    m = make(TrimmedMean, byzantine_share=0.0, f=1, trim="coordinate", integer_buffers=False)
    state, _ = m.aggregate({"global": ws[0], "share": None}, updates(ws, sizes=[1, 1, 2]), ctx(3))
    assert state["global"]["w"].item() == 2.0 and state["global"]["n"].item() == 16  # (1 + 2 + 60) / 4 rounded
    assert list(state["global"]) == ["w", "n"]


# ------------------------------------------------------------------ geometric median (RFA)
def objective(point, pts, alphas):
    return sum(a * float(np.linalg.norm(np.asarray(point) - np.asarray(p))) for a, p in zip(alphas, pts))


def test_weiszfeld_converges_to_the_fermat_point_of_a_right_triangle():
    """Geometric median of (0,0), (1,0), (0,1): (t, t) with 6t² − 6t + 1 = 0, t = (3 − √3)/6 (where the
    three unit vectors sum to zero); the objective never increases from one Weiszfeld step to the next."""
    pts = [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)]
    t = (3 - math.sqrt(3)) / 6
    ws = [{"w": torch.tensor(p, dtype=torch.float64)} for p in pts]
    values = []
    for k in range(0, 60):
        v, done = robust.geometric_median(ws, [1, 1, 1], ["w"], nu=1e-12, max_iter=k, tol=0.0)
        values.append(objective(v["w"].tolist(), pts, [1, 1, 1]))
        assert done == k
    assert all(b <= a + 1e-15 for a, b in zip(values, values[1:]))
    assert values[0] > values[-1]
    assert torch.allclose(v["w"], torch.tensor([t, t], dtype=torch.float64), atol=1e-9)


def test_weighted_median_sits_on_a_point_holding_half_the_weight():
    """α_A >= Σ of the others: the weighted geometric median is A itself (Weber's optimality test);
    the smoothing ν bounds how close Weiszfeld gets."""
    pts = [(0.0, 0.0), (4.0, 0.0), (0.0, 3.0)]
    ws = [{"w": torch.tensor(p, dtype=torch.float64)} for p in pts]
    v, _ = robust.geometric_median(ws, [3, 1, 1], ["w"], nu=1e-9, max_iter=200, tol=0.0)
    assert float(v["w"].norm()) < 1e-6
    # the objective-based stop of the official code ends early once the change is < tol · g(v)
    _, done = robust.geometric_median(ws, [3, 1, 1], ["w"], nu=1e-9, max_iter=200, tol=1e-6)
    assert 1 <= done < 200


def test_rfa_switches_whole_vector_versus_per_tensor_median():
    """The triangle split over two tensors (x in ``w``, y in ``b``): per tensor, each 1-D geometric
    median is the scalar median (0, 0); one median of the whole vector is the Fermat point."""
    ws = [{"w": torch.tensor([x]), "b": torch.tensor([y])} for x, y in [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)]]
    t = (3 - math.sqrt(3)) / 6
    whole = make(RFA, nu=1e-9, max_iter=200, tol=0.0, stop="objective", weighted=True, per_tensor=False)
    state, _ = whole.aggregate({"global": ws[0]}, updates(ws), ctx(3))
    assert abs(state["global"]["w"].item() - t) < 1e-5 and abs(state["global"]["b"].item() - t) < 1e-5
    split = make(RFA, nu=1e-9, max_iter=200, tol=0.0, stop="step", weighted=False, per_tensor=True)
    state, metrics = split.aggregate({"global": ws[0]}, updates(ws), ctx(3))
    assert abs(state["global"]["w"].item()) < 1e-5 and abs(state["global"]["b"].item()) < 1e-5
    assert metrics["weiszfeld_steps"] >= 1


def test_rfa_step_rule_keeps_the_previous_iterate():
    """FNBench stops when ‖v_new − v‖ < tol and keeps v: with a huge tol the start (the mean) is kept."""
    ws = states(POINTS)
    v, done = robust.geometric_median(ws, [1] * 5, ["w"], nu=1e-5, max_iter=10, tol=1e9, stop="step")
    assert done == 1 and torch.allclose(v["w"], torch.tensor([2.6, 0.8]))


# ------------------------------------------------------------------ norm clipping
def test_update_norm_clipping_by_hand():
    """Δ1 = (3, 4) (norm 5) and Δ2 = (0.3, 0.4) (norm 0.5) from w_g = (1, 1), equal sizes. M = 1:
    Δ1 → (0.6, 0.8), Δ2 kept; M = median = 2.75: Δ1 → 0.55 Δ1 = (1.65, 2.2)."""
    g = {"w": torch.tensor([1.0, 1.0])}
    ws = states([(4.0, 5.0), (1.3, 1.4)])
    fixed = make(NormClip, clip="update", max_norm=1.0, max_grad_norm=5.0)
    state, metrics = fixed.aggregate({"global": dict(g)}, updates(ws), ctx(2))
    assert torch.allclose(state["global"]["w"], torch.tensor([1.45, 1.6])) and metrics["clipped"] == 0.5
    med = make(NormClip, clip="update", max_norm="median", max_grad_norm=5.0)
    state, metrics = med.aggregate({"global": dict(g)}, updates(ws), ctx(2))
    assert torch.allclose(state["global"]["w"], torch.tensor([1 + 0.975, 1 + 1.3]))
    assert metrics["clip_M"] == pytest.approx(2.75)


def test_gradient_clipping_optimizer_by_hand():
    """loss = ⟨w, (3, 4)⟩ has gradient (3, 4), norm 5; clipped to norm 1 and one SGD step of lr 1."""
    model = Vec()
    opt = optimizers.ClipGrad(1.0)(model, Optim("sgd", lr=1.0, weight_decay=0.0, momentum=0.0))
    engine.train_steps(model, opt, torch.Generator(), lambda: iter([model.w @ torch.tensor([3.0, 4.0])]))
    assert torch.allclose(model.w.detach(), torch.tensor([-0.6, -0.8]))


# ------------------------------------------------------------------ configs and refusals
SWITCHES = [  # (method, key, paper, reference)
    ("krum", "neighbours", "nearest", "all"), ("krum", "byzantine_share", "noise", 0.3),
    ("krum", "integer_buffers", False, True), ("trimmed_mean", "trim", "coordinate", "client_score"),
    ("trimmed_mean", "byzantine_share", "noise", 0.3), ("rfa", "per_tensor", False, True),
    ("rfa", "weighted", True, False), ("rfa", "max_iter", 2, 10), ("rfa", "stop", "objective", "step"),
    ("rfa", "tol", 1e-6, 1e-5), ("norm_clip", "clip", "update", "gradient"),
]


@pytest.mark.parametrize("method, key, paper, reference", SWITCHES)
def test_switch_values_follow_fidelity(method, key, paper, reference):
    assert compose_cfg([f"method={method}"]).method[key] == paper
    assert compose_cfg([f"method={method}", "fidelity=reference"]).method[key] == reference


@pytest.mark.parametrize("overrides, message", [
    (["method=krum", "method.f=1"], "method.f=1 is invalid: Krum needs n > 2f + 2 with n = 3"),
    (["method=krum", "fl.frac=0.3"], "krum needs at least 3 clients per round"),
    (["method=krum", "method.multi_m=4"], "method.multi_m=4"),
    (["method=krum", "method.byzantine_share=1.5"], "method.byzantine_share=1.5"),
    (["method=trimmed_mean", "method.f=2"], "method.f=2 is invalid"),
    (["method=trimmed_mean", "method.trim=x"], "method.trim='x'"),
    (["method=rfa", "method.nu=0"], "method.nu=0"),
    (["method=norm_clip", "method.max_norm=abc"], "method.max_norm='abc'"),
])
def test_impossible_robust_settings_are_one_line_refusals(tmp_path, overrides, message):
    assert_refused(cli([*overrides, *TINY], tmp_path), message, tmp_path)


def test_arfl_finite_models_flags_exactly_the_models_with_a_nan_or_inf_entry():
    """The fused check (one max-|x| norm per model) against the per-tensor isfinite it replaces."""
    from fedlnl.methods.arfl import finite_models

    ok = {"w": torch.ones(3, 3), "b": torch.zeros(2), "n": torch.tensor(3)}
    nan = {**ok, "b": torch.tensor([0.0, float("nan")])}
    inf = {**ok, "w": torch.full((3, 3), -float("inf"))}
    big = {**ok, "w": torch.full((3, 3), 3e38), "b": torch.zeros(2, dtype=torch.float64)}
    models = [ok, nan, inf, big]
    expected = [all(torch.isfinite(t).all() for t in m.values() if t.is_floating_point()) for m in models]
    assert finite_models(models) == expected == [True, False, False, True]
