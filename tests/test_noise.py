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
    # only a true label in 0..9 can be redrawn to itself: rate ~ mu (1 - 0.1 * 0.1), docs/methods/setup.md §1.4
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


# ---------------------------------------------------------------------------------------------
# asymmetric (Patrini et al. 2017), instance-dependent (Xia et al. 2020), mixed client groups

from fedlnl.datasets import labelmaps  # noqa: E402
from fedlnl.datasets.noise import group_levels, truncated_normal, truncated_normal_mean  # noqa: E402


def binomial_tol(p, n, z=4.0):
    """z standard deviations of a Binomial(n, p) share, plus half a sample for rounding."""
    return z * np.sqrt(np.maximum(p * (1 - p), 1e-12) / n) + 0.5 / n


def run_kind(kind, m=10, seed=0, features=None, classes=(), **kw):
    labels, clients = setup(m)
    observed, oracle = add_noise(labels, clients, m, np.random.default_rng(seed), kind,
                                 features=features, classes=classes, **kw)
    return labels, clients, observed.numpy(), oracle


def test_patrini_cifar10_map_and_cifar100_superclass_facts():
    c10 = {labelmaps.CIFAR10_CLASSES[a]: labelmaps.CIFAR10_CLASSES[b] for a, b in labelmaps.cifar10_map().items()}
    assert c10 == {"truck": "automobile", "bird": "airplane", "deer": "horse", "cat": "dog", "dog": "cat"}
    # the release's fine -> coarse table (as shipped in countless CIFAR-100 codes)
    assert labelmaps.CIFAR100_COARSE[:12].tolist() == [4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14]
    assert np.bincount(labelmaps.CIFAR100_COARSE).tolist() == [5] * 20
    dest = labelmaps.resolve_map("cifar100", 100)
    assert sorted(dest.tolist()) == list(range(100))  # a permutation ...
    assert (labelmaps.CIFAR100_COARSE[dest] == labelmaps.CIFAR100_COARSE).all()  # ... within super-classes
    c = 0
    for _ in range(5):  # cycles of length 5
        c = dest[c]
    assert c == 0 and dest[0] != 0
    names = labelmaps.CIFAR100_CLASSES
    assert names[dest[names.index("apple")]] == "mushroom" and names[dest[names.index("tractor")]] == "lawn_mower"
    blocks = labelmaps.resolve_map("cifar100_blocks", 100)
    assert blocks[:6].tolist() == [1, 2, 3, 4, 0, 6] and not np.array_equal(blocks, dest)


@pytest.mark.parametrize("count", ["exact", "bernoulli"])
def test_asymmetric_respects_the_map_and_the_requested_rate(count):
    labels, clients, observed, o = run_kind("asymmetric", rho=0.7, tau=0.3, count=count,
                                            classes=labelmaps.CIFAR10_CLASSES)  # map: auto -> CIFAR-10
    dest = labelmaps.resolve_map("cifar10", 10)
    mask = o.noisy_mask.numpy()
    assert mask.sum() > 1000 and np.array_equal(observed[mask], dest[labels[mask]])
    assert not mask[dest[labels] < 0].any()  # airplane, automobile, frog, horse, ship never move
    for k in np.flatnonzero(o.noisy_client):
        mapped = (dest[labels[clients[k]]] >= 0).sum()
        flipped = mask[clients[k]].sum()
        if count == "exact":
            assert flipped == int(np.floor(o.mu[k] * mapped + 0.5))
        else:
            assert abs(flipped / mapped - o.mu[k]) <= binomial_tol(o.mu[k], mapped)
    assert (o.realized_rate[~o.noisy_client] == 0).all()
    assert o.client_kind[int(np.flatnonzero(o.noisy_client)[0])] == "asymmetric"


def test_asymmetric_user_maps_by_name_or_index_and_errors():
    names = tuple("abcdefghij")
    a = run_kind("asymmetric", rho=1.0, tau=1.0, map={"c": "a", 9: 1}, classes=names)
    assert set(zip(a[0][a[3].noisy_mask.numpy()], a[2][a[3].noisy_mask.numpy()])) == {(2, 0), (9, 1)}
    mapped_share = [np.isin(a[0][ix], [2, 9]).mean() for ix in a[1]]
    np.testing.assert_allclose(a[3].realized_rate, mapped_share)  # tau = 1: every mapped sample flips
    with pytest.raises(ValueError, match="noise.map entry 'zebra' is invalid"):
        run_kind("asymmetric", rho=1.0, tau=0.5, map={"zebra": "a"}, classes=names)
    with pytest.raises(ValueError, match="noise.map=auto is invalid for this dataset"):
        run_kind("asymmetric", rho=1.0, tau=0.5, classes=names)
    with pytest.raises(ValueError, match="noise.map=cifar100 is invalid for a dataset with 10 classes"):
        run_kind("asymmetric", rho=1.0, tau=0.5, map="cifar100")


def test_truncated_normal_sampler_matches_its_closed_form_mean():
    r = np.random.default_rng(0)
    for mean in (0.0, 0.3, 0.95, 1.0):
        q = truncated_normal(mean, 0.1, 200_000, r)
        assert q.min() >= 0 and q.max() <= 1
        assert abs(q.mean() - truncated_normal_mean(mean, 0.1)) < 0.002
    assert truncated_normal_mean(0.0, 0.1) == pytest.approx(0.1 * np.sqrt(2 / np.pi))  # half-normal


def images(n, d=48, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, 3, 4, d // 12), dtype=np.uint8))


def test_instance_rates_close_to_the_truncated_normal_mean():
    labels, clients = setup()
    x = images(len(labels))
    _, _, observed, o = run_kind("instance", rho=0.6, tau=0.2, std=0.1, features=x)
    mask = o.noisy_mask.numpy()
    assert (observed[mask] != labels[mask]).all()  # a flip never lands on the true class
    noisy = o.noisy_client
    assert noisy.sum() > 10 and (o.realized_rate[~noisy] == 0).all()
    for k in np.flatnonzero(noisy):
        expected = truncated_normal_mean(o.mu[k], 0.1)  # E[q_i]: a flip is Bernoulli(E q) per sample
        assert abs(o.realized_rate[k] - expected) <= binomial_tol(expected, PER_CLIENT)
    again = run_kind("instance", rho=0.6, tau=0.2, std=0.1, features=x)[2]
    other = run_kind("instance", seed=1, rho=0.6, tau=0.2, std=0.1, features=x)[2]
    assert np.array_equal(again, observed) and not np.array_equal(other, observed)


def test_instance_flip_target_follows_the_image():
    """Identical images of one class share p_i, so their flips go to the class their projection
    favours (CIFAR-sized projections make softmax(x W) nearly one-hot); different images of that
    class spread over several classes."""
    labels, clients = setup()
    x = images(len(labels), d=768).clone()
    same = np.flatnonzero(labels == 0)[:2000]
    x[same] = x[same[0]].clone()
    _, _, observed, o = run_kind("instance", rho=1.0, tau=0.5, std=0.0, features=x)
    mask = o.noisy_mask.numpy()
    twins = observed[same][mask[same]]
    top_share = np.bincount(twins, minlength=10).max() / len(twins)
    assert len(twins) > 500 and top_share > 0.95
    others = np.flatnonzero(labels == 0)[2000:]
    assert len(np.unique(observed[others][mask[others]])) >= 4
    for k in range(N_CLIENTS):  # std = 0: q_i = mu_k exactly
        assert abs(o.realized_rate[k] - o.mu[k]) <= binomial_tol(o.mu[k], PER_CLIENT)


def test_mixed_groups_sizes_kinds_and_levels():
    groups = [{"kind": "symmetric", "share": 0.4, "level": [0.3, 0.3]},
              {"kind": "pairflip", "share": 0.3}, {"kind": "clean", "share": 0.3}]
    labels, clients, observed, o = run_kind("mixed", rho=None, tau=0.5, groups=groups, exclude_true=True)
    kinds = np.array(o.client_kind)
    assert [int((kinds == k).sum()) for k in ("symmetric", "pairflip", "clean")] == [16, 12, 12]
    assert np.array_equal(o.noisy_client, kinds != "clean")
    assert (o.mu[kinds == "symmetric"] == 0.3).all()
    assert ((o.mu[kinds == "pairflip"] >= 0.5) & (o.mu[kinds == "pairflip"] <= 1.0)).all()
    for k in range(N_CLIENTS):
        ix = clients[k]
        wrong = observed[ix] != labels[ix]
        # exact count, and every chosen label really wrong (exclude_true / pair-flip): rate = round(mu n)/n
        assert o.realized_rate[k] == np.floor(o.mu[k] * PER_CLIENT + 0.5) / PER_CLIENT
        if kinds[k] == "pairflip":
            assert np.array_equal(observed[ix][wrong], (labels[ix][wrong] + 1) % 10)
    kinds2 = group_levels(groups, N_CLIENTS, 0.5, np.random.default_rng(1))[0]
    assert sorted(kinds2) == sorted(kinds) and not np.array_equal(kinds2, kinds)  # seeded membership


@pytest.mark.parametrize("groups,match", [
    ([{"kind": "symmetric", "share": 0.5}], "share=\\[0.5\\] is invalid: allowed shares summing to 1"),
    ([{"kind": "gaussian", "share": 1.0}], r"noise.groups\[0\].kind='gaussian' is invalid"),
    ([{"kind": "clean", "share": 1.5}], r"noise.groups\[0\].share=1.5 is invalid"),
    ([{"kind": "symmetric", "share": 1.0, "level": [0.6, 0.2]}], r"noise.groups\[0\].level=\[0.6, 0.2\] is invalid"),
    (None, "noise.groups=None is invalid"),
])
def test_mixed_bad_groups(groups, match):
    with pytest.raises(ValueError, match=match):
        run_kind("mixed", rho=None, tau=0.5, groups=groups)
