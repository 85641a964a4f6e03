"""Per-client label noise (FedCorr Eq. 4) and its switches."""
import numpy as np
import pytest
import torch

from fedlnl.datasets.noise import add_noise, client_noise_levels
from fedlnl.datasets.partition import iid

N_CLIENTS, PER_CLIENT = 40, 1000


def setup(m=10, n_clients=N_CLIENTS):
    labels = np.arange(n_clients * PER_CLIENT) % m
    clients = iid(len(labels), n_clients, np.random.default_rng(0))
    return labels, clients


def run(m=10, seed=0, **kw):
    labels, clients = setup(m)
    params = dict(kind="symmetric", rho=0.5, tau=0.3) | kw
    observed, oracle = add_noise(labels, clients, m, np.random.default_rng(seed), **params)
    return labels, clients, observed.numpy(), oracle


def test_levels_follow_eq4():
    gamma, mu = client_noise_levels(20_000, rho=0.4, tau=0.5, rng=np.random.default_rng(0))
    assert abs(gamma.mean() - 0.4) < 0.02
    assert np.all(mu[~gamma] == 0)
    assert mu[gamma].min() >= 0.5 and mu[gamma].max() <= 1.0
    assert abs(mu[gamma].mean() - 0.75) < 0.01  # tau + (1 - tau) E[u]


def test_realized_rate_all_classes_is_nine_tenths_of_mu():
    _, _, _, o = run(count="exact", label_range="all")
    noisy = o.noisy_client
    assert noisy.sum() > 5
    # a redrawn label equals the true one w.p. 1/M: rate ~ (1 - 1/M) mu_k (sd <= 0.01 here)
    assert np.abs(o.realized_rate[noisy] - 0.9 * o.mu[noisy]).max() < 0.04


def test_realized_rate_with_exclude_true_is_mu():
    _, _, _, o = run(count="exact", exclude_true=True)
    noisy = o.noisy_client
    assert np.abs(o.realized_rate[noisy] - o.mu[noisy]).max() <= 0.5 / PER_CLIENT + 1e-12


def test_bernoulli_count_matches_in_expectation():
    _, _, _, o = run(count="bernoulli", exclude_true=True)
    noisy = o.noisy_client
    assert np.abs(o.realized_rate[noisy] - o.mu[noisy]).max() < 0.06  # Binomial(1000, mu)
    assert not np.allclose(o.realized_rate[noisy] * PER_CLIENT, np.floor(o.mu[noisy] * PER_CLIENT + 0.5))


def test_exact_count_is_exact():
    labels, clients, observed, o = run(kind="pairflip", count="exact")
    for k in np.flatnonzero(o.noisy_client):
        changed = (observed[clients[k]] != labels[clients[k]]).sum()
        assert changed == int(np.floor(o.mu[k] * PER_CLIENT + 0.5))


def test_clean_clients_untouched_and_oracle_consistent():
    labels, clients, observed, o = run()
    for k in np.flatnonzero(~o.noisy_client):
        assert np.array_equal(observed[clients[k]], labels[clients[k]])
    assert np.array_equal(o.noisy_mask.numpy(), observed != labels)
    assert np.array_equal(o.clean_labels.numpy(), labels)


def test_rho_zero_changes_nothing():
    labels, _, observed, o = run(rho=0.0, tau=0.5)
    assert np.array_equal(observed, labels)
    assert not o.noisy_client.any() and np.all(o.mu == 0) and np.all(o.realized_rate == 0)


def test_same_seed_same_labels_different_seed_different():
    a, b, c = run(seed=1)[2], run(seed=1)[2], run(seed=2)[2]
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_first10_keeps_noisy_labels_in_first_ten_classes():
    labels, _, observed, o = run(m=100, count="bernoulli", label_range="first10")
    mask = o.noisy_mask.numpy()
    assert mask.sum() > 1000
    assert observed[mask].max() <= 9
    noisy = o.noisy_client
    # only a true label in 0..9 can be redrawn to itself: rate ~ mu (1 - 0.1 * 0.1), methods.md §1.4
    assert abs(o.realized_rate[noisy].sum() / o.mu[noisy].sum() - 0.99) < 0.02


def test_all_range_uses_every_class():
    _, _, observed, o = run(m=100, label_range="all")
    assert len(np.unique(observed[o.noisy_mask.numpy()])) == 100


def test_exclude_true_with_first10_never_keeps_the_label():
    labels, clients, observed, o = run(m=100, label_range="first10", exclude_true=True)
    assert np.abs(o.realized_rate - o.mu).max() <= 0.5 / PER_CLIENT + 1e-12
    assert observed[o.noisy_mask.numpy()].max() <= 9


def test_pairflip_maps_to_next_class():
    labels, _, observed, o = run(kind="pairflip", tau=0.6)
    mask = o.noisy_mask.numpy()
    assert np.array_equal(observed[mask], (labels[mask] + 1) % 10)
    assert np.abs(o.realized_rate - o.mu).max() <= 0.5 / PER_CLIENT + 1e-12


def test_tau_one_makes_noisy_clients_fully_noisy():
    _, _, _, o = run(tau=1.0, exclude_true=True)
    assert np.all(o.mu[o.noisy_client] == 1.0)
    assert np.all(o.realized_rate[o.noisy_client] == 1.0)


def test_real_noise_passes_labels_through():
    labels, clients = setup()
    noisy = labels.copy()
    noisy[:500] = (noisy[:500] + 3) % 10
    observed, o = add_noise(noisy, clients, 10, np.random.default_rng(0), "symmetric", 0.0, 0.0, clean=labels)
    assert torch.equal(observed, torch.from_numpy(noisy))
    assert o.noisy_mask.sum() == 500
    assert o.noisy_client.sum() == sum(np.any(np.isin(c, np.arange(500))) for c in clients)
    with pytest.raises(ValueError, match="noise.rho=0"):
        add_noise(noisy, clients, 10, np.random.default_rng(0), "symmetric", 0.2, 0.0, clean=labels)


@pytest.mark.parametrize(
    "bad",
    [dict(kind="asym"), dict(count="poisson"), dict(label_range="first5"), dict(rho=1.5), dict(tau=-0.1)],
)
def test_bad_switches_raise(bad):
    with pytest.raises(ValueError, match="noise"):
        run(**bad)
