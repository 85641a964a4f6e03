"""Annotator-level CIFAR-10N (issue 37 item 3): each client holds one of the three annotators' labels."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import SHARED, run_tiny
from fedlnl.benchmark.rundir import config_hash
from fedlnl.datasets.options import check_noise
from fedlnl.datasets import noise as noise_mod
from fedlnl.datasets.noise import ANNOTATORS, PUBLISHED_RATES, assign_annotators

FILE = SHARED / "data" / "cifar-n" / "CIFAR-10_human.pt"
needs_cifarn = pytest.mark.skipif(not FILE.is_file(), reason=f"CIFAR-10N labels not found at {FILE}")


def test_balanced_assignment_counts_differ_by_at_most_one_and_follow_the_seed():
    for n in (1, 2, 3, 10, 100):
        who = assign_annotators(n, None, np.random.default_rng(0))
        counts = np.bincount(who, minlength=3)
        assert counts.sum() == n and counts.max() - counts.min() <= 1
    a, b = (assign_annotators(30, None, np.random.default_rng(s)) for s in (0, 0))
    assert np.array_equal(a, b) and not np.array_equal(a, assign_annotators(30, None, np.random.default_rng(1)))


def test_weights_draw_each_annotator_at_its_share_and_a_zero_weight_never():
    who = assign_annotators(30000, [1, 0, 3], np.random.default_rng(0))
    share = np.bincount(who, minlength=3) / len(who)
    assert share[1] == 0 and abs(share[0] - 0.25) < 0.01 and abs(share[2] - 0.75) < 0.01


def test_the_nominal_rate_is_the_assignments_mean_of_the_published_rates():
    rates = [PUBLISHED_RATES[a] for a in ANNOTATORS]
    assert noise_mod._cifarn_rate({"label_set": "annotators"}) == pytest.approx(sum(rates) / 3)
    assert noise_mod._cifarn_rate({"label_set": "annotators", "annotator_weights": [0, 0, 2]}) == \
        pytest.approx(rates[2])


@pytest.mark.parametrize("weights, label_set, message", [
    ([1, 1], "annotators", "3 weights >= 0 with a positive sum"),
    ([0, 0, 0], "annotators", "3 weights >= 0 with a positive sum"),
    ([1, -1, 1], "annotators", "3 weights >= 0 with a positive sum"),
    ([1, 1, 1], "worse", "null unless noise.label_set=annotators"),
])
def test_bad_weights_are_one_line(weights, label_set, message):
    with pytest.raises(Exception) as err:
        check_noise({"kind": "cifarn", "label_set": label_set, "file": "x", "annotator_weights": weights})
    assert message in str(err.value) and "noise.annotator_weights" in str(err.value)


def test_a_null_weight_keeps_the_config_hash_of_before_the_key():
    cfg = {"noise": {"kind": "cifarn", "label_set": "aggre"}, "seed": 0}
    with_key = {"noise": {**cfg["noise"], "annotator_weights": None}, "seed": 0}
    weighted = {"noise": {**cfg["noise"], "annotator_weights": [1, 1, 2]}, "seed": 0}
    assert config_hash(with_key) == config_hash(cfg) != config_hash(weighted)


@needs_cifarn
def test_each_client_holds_its_annotators_labels_and_the_oracle_its_rate():
    import torch

    table = torch.load(FILE, map_location="cpu", weights_only=False)
    clean = np.asarray(table["clean_label"], dtype=np.int64)
    sets = [np.asarray(table[f"random_label{i}"], dtype=np.int64) for i in (1, 2, 3)]
    clients = np.array_split(np.random.default_rng(5).permutation(len(clean)), 12)
    clients = [np.sort(c) for c in clients]
    noise = {"kind": "cifarn", "label_set": "annotators", "file": str(FILE), "annotator_weights": None}
    labels, oracle = noise_mod.cifarn(clean, clients, noise, rng=np.random.default_rng(0))
    who = assign_annotators(12, None, np.random.default_rng(0))
    assert list(oracle.client_kind) == [ANNOTATORS[a] for a in who]
    for k, ix in enumerate(clients):
        assert np.array_equal(labels.numpy()[ix], sets[who[k]][ix])
        assert oracle.realized_rate[k] == pytest.approx(np.mean(sets[who[k]][ix] != clean[ix]))
    # clients differ in rate as the annotators do (17.2 / 18.1 / 17.6 % published)
    by = {a: np.mean([r for r, w in zip(oracle.realized_rate, who) if w == a]) for a in range(3)}
    assert all(abs(by[a] - PUBLISHED_RATES[ANNOTATORS[a]]) < 0.01 for a in range(3)), by
    assert np.array_equal(oracle.noisy_client, oracle.realized_rate > 0)


@needs_cifarn
def test_the_annotator_federation_runs_end_to_end(tmp_path):
    if not (SHARED / "data" / "cifar10-jpeg").exists():
        pytest.skip("CIFAR-10 images not found")
    summary = run_tiny(tmp_path, ["dataset=cifar10_jpeg", "noise=cifarn", "noise.label_set=annotators", "fl.rounds=1",
                                    "fl.num_clients=100", "fl.frac=0.03", "selection.client_test_size=50"])
    fed = summary["federation"]
    assert summary["status"] == "complete" and 0.1 < fed["noise_rate"] < 0.25, fed
    assert fed["client_noise_max"] > fed["client_noise_min"]
