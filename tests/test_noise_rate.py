"""The federation's nominal noise rate (``FederationInfo.noise_rate``) and RoFL's forget rate, which
the paper sets to the noise rate (docs/methods/rofl.md R3; issue 13): closed forms per noise model, the
realized rates they predict, the paper / reference values, and the preflight refusal without a rate."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import build_method, compose_cfg, make, run_tiny
from fedlnl.benchmark.validate import ConfigError
from fedlnl.datasets.noise import PUBLISHED_RATES, add_noise, nominal_rate, truncated_normal_mean
from fedlnl.methods.common.protocol import FederationInfo
from fedlnl.methods.rofl import RoFL

SYM = {"kind": "symmetric", "count": "exact", "label_range": "all", "exclude_true": False}


@pytest.mark.parametrize("rho, tau, m", [(0.0, 0.0, 10), (0.6, 0.5, 10), (0.4, 0.0, 100), (1.0, 1.0, 10)])
def test_symmetric_nominal_rate_in_closed_form(rho, tau, m):
    # E[mu_k] = rho (tau + (1 - tau) / 2) (FedCorr Eq. 4); a uniform redraw keeps the class w.p. 1/M
    expected = rho * (1 + tau) / 2 * (1 - 1 / m)
    assert nominal_rate({**SYM, "rho": rho, "tau": tau}, m) == pytest.approx(expected, abs=1e-12)
    assert nominal_rate({**SYM, "rho": rho, "tau": tau, "exclude_true": True}, m) == pytest.approx(rho * (1 + tau) / 2)
    # first10: a label drawn from classes 0..9 equals the true one w.p. (10 / M)(1 / 10): the same 1/M
    assert nominal_rate({**SYM, "rho": rho, "tau": tau, "label_range": "first10"}, m) == pytest.approx(expected)


def test_nominal_rate_matches_the_realized_rate_of_a_large_federation():
    """The closed forms are expectations: a federation of many clients with balanced classes lands
    on them (the test uses the clean labels to measure; the rate itself never sees a label)."""
    m, n_clients, per = 10, 2000, 50
    labels = np.tile(np.arange(m), n_clients * per // m)
    clients = list(np.arange(n_clients * per).reshape(n_clients, per))
    groups = [{"kind": "symmetric", "share": 0.4}, {"kind": "pairflip", "share": 0.3}, {"kind": "clean", "share": 0.3}]
    for noise in ({**SYM, "rho": 0.6, "tau": 0.5},
                  {"kind": "pairflip", "rho": 0.8, "tau": 0.0, "count": "exact"},
                  {"kind": "asymmetric", "rho": 0.6, "tau": 0.5, "count": "exact", "map": {0: 1, 3: 5, 5: 3}},
                  {**SYM, "kind": "mixed", "tau": 0.5, "groups": groups}):
        _, oracle = add_noise(labels, clients, m, np.random.default_rng(0), **noise)
        realized = float(oracle.noisy_mask.double().mean())
        assert realized == pytest.approx(nominal_rate(noise, m), abs=0.02), noise["kind"]


def test_instance_and_asymmetric_and_mixed_closed_forms():
    # asymmetric: only the mapped classes' samples move (3 of 10 here)
    asym = {"kind": "asymmetric", "rho": 0.6, "tau": 0.5, "map": {0: 1, 3: 5, 5: 3}}
    assert nominal_rate(asym, 10) == pytest.approx(0.6 * 0.75 * 3 / 10)
    # instance with std 0: q = mu, every flip leaves the class
    assert nominal_rate({"kind": "instance", "rho": 0.5, "tau": 0.2, "std": 0.0}, 10) == pytest.approx(0.5 * 0.6)
    # with a spread, the truncated normal's mean at mu = tau = 1 (only that level)
    assert nominal_rate({"kind": "instance", "rho": 1.0, "tau": 1.0, "std": 0.1}, 10) == pytest.approx(
        truncated_normal_mean(1.0, 0.1))
    mixed = {"kind": "mixed", "tau": 0.5, "label_range": "all", "exclude_true": False, "map": "next",
             "groups": [{"kind": "symmetric", "share": 0.5, "level": [0.4, 0.4]}, {"kind": "clean", "share": 0.5}]}
    assert nominal_rate(mixed, 10) == pytest.approx(0.5 * 0.4 * 0.9)


def test_real_noise_uses_the_published_rate():
    assert nominal_rate({"kind": "cifarn", "label_set": "worse"}, 10) == PUBLISHED_RATES["worse"] == 0.4021
    assert nominal_rate({"kind": "cifarn", "label_set": "coarse"}, 20) is None
    assert nominal_rate({**SYM, "rho": 0.0, "tau": 0.0}, 14, real="clothing1m") == 0.3846


def _forget_rate(overrides, noise_rate):
    method = build_method(compose_cfg(["method=rofl", *overrides]))
    info = FederationInfo(4, 10, (5,) * 4, (1, 8, 8), 0, noise_rate)
    return method.forget_rate, method.final_forget_rate(info)


def test_paper_forget_rate_is_the_noise_rate_reference_keeps_0_2():
    assert _forget_rate(["noise.rho_tau=[0.6,0.5]"], 0.405) == ("noise", 0.405)
    assert _forget_rate(["noise.rho_tau=[0.6,0.5]", "fidelity=reference"], 0.405) == (0.2, 0.2)
    assert _forget_rate(["method.forget_rate=0.3"], 0.405) == (0.3, 0.3)  # a number still works
    m = make(RoFL, T_pl=4, forget_rate="noise", num_gradual=3, lambda_cen=1.0, lambda_e=0.8,
             detach_cen=False, weighted_avg=True, pl_augment=False)
    assert [m.forget_rate_at(t, 0.3) for t in range(4)] == pytest.approx([0.0, 0.15, 0.3, 0.3])
    with pytest.raises(ValueError, match="method.forget_rate=noise needs the federation's noise rate"):
        m.final_forget_rate(FederationInfo(4, 10, (5,) * 4, (1, 8, 8), 0))


def test_preflight_refuses_noise_without_a_published_rate():
    cfg = compose_cfg(["method=rofl", "dataset=cifar100", "noise=cifarn", "noise.label_set=coarse"])
    with pytest.raises(ConfigError, match=r"^method\.forget_rate=noise needs the noise rate, but "
                                          r"noise\.label_set=coarse has no published noise rate"):
        build_method(cfg)
    build_method(compose_cfg(["method=rofl", "dataset=cifar100", "noise=cifarn", "noise.label_set=coarse",
                              "method.forget_rate=0.25"]))  # a number: accepted
    build_method(compose_cfg(["method=rofl", "dataset=cifar100", "noise=cifarn", "noise.label_set=fine"]))


def test_the_runner_hands_rofl_the_nominal_rate(tmp_path):
    s = run_tiny(tmp_path, ["noise.rho=0.5", "noise.tau=0.5"], "rofl")
    assert s["status"] == "complete"
    nominal = 0.5 * 0.75 * 0.9  # digits: 10 classes, symmetric over all of them
    assert s["federation"]["nominal_noise_rate"] == pytest.approx(nominal)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rates = [r["rofl_forget_rate"] for r in rows if "rofl_forget_rate" in r]
    assert rates[-1] == pytest.approx(nominal)  # num_gradual = 2 under debug=tiny: reached by round 2
