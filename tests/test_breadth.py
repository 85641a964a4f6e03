"""Breadth (issue 11): every new partition and noise model composes into a ``fedlnl-run -m`` sweep,
is planned by ``dry_run=true`` and runs at tiny size; each cell's federation, rebuilt independently
from its summary's config, is checked against closed-form or statistical expectations (every index
exactly once, class counts, realised noise rates, transition pairs). Bad values of the new options
are one ``fedlnl-run: error:`` line, including those only the data can refute. Checks on the shared
CIFAR-10 copy skip cleanly without FEDLNL_SHARED data.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO, SHARED, compose_cfg
from test_robustness import TINY, assert_refused, cli
from fedlnl.benchmark.report import load_summaries, with_columns
from fedlnl.datasets import labelmaps
from fedlnl.datasets.federation import build_federation, clear_cache, load_source
from fedlnl.datasets.noise import truncated_normal_mean
from fedlnl.datasets.partition import quantity_sizes


def binomial_tol(p, n, z=4.0):
    """z standard deviations of a Binomial(n, p) share, plus half a sample for rounding."""
    return z * np.sqrt(np.maximum(p * (1 - p), 1e-12) / n) + 0.5 / n


def round_half_up(x):
    return np.floor(np.asarray(x) + 0.5).astype(np.int64)


def fake_cifar10n(path: Path) -> dict:
    """A CIFAR-10N file (published layout) on digits' training labels: aggre flips every 4th label
    to the next class, worse every label by +3."""
    clean = load_source(compose_cfg(["debug=tiny"]).dataset).y_train.numpy()
    aggre = clean.copy()
    aggre[::4] = (aggre[::4] + 1) % 10
    table = {"clean_label": clean, "aggre_label": aggre, "worse_label": (clean + 3) % 10,
             "random_label1": clean, "random_label2": clean, "random_label3": clean}
    torch.save(table, path)
    return table


# ---------------------------------------------------------------------------------------------
# closed-form / statistical checks of one cell's federation, per option


def check_shards(fed, part, noise, ctx):
    """McMahan et al.: the label-sorted order cut into N s pieces; each client holds exactly s whole pieces."""
    y, n, s = fed.oracle.clean_labels.numpy(), len(fed.labels), part["s"]
    piece = np.empty(n, dtype=np.int64)
    for j, block in enumerate(np.array_split(np.argsort(y, kind="stable"), fed.num_clients * s)):
        piece[block] = j
    sizes = np.bincount(piece)
    for ix in fed.client_indices:
        held = np.unique(piece[ix])
        assert len(held) == s and sizes[held].sum() == len(ix)


def check_classes(fed, part, noise, ctx):
    counts = ctx["class_counts"]
    assert ((counts > 0).sum(axis=1) == part["k"]).all()  # exactly k classes per client
    for j in range(counts.shape[1]):
        held = counts[:, j][counts[:, j] > 0]
        assert len(held) >= 1 and held.max() - held.min() <= 1  # a class split evenly over its holders


def check_dirichlet(fed, part, noise, ctx):
    assert min(fed.client_sizes) >= part["min_size"]


def check_iid_sizes(fed, part, noise, ctx):
    """Replays the partition stream (permutation, then weights): sizes and members exactly."""
    n, seed = len(fed.labels), ctx["seed"]
    rng = np.random.default_rng([seed, 1])
    perm = rng.permutation(n)
    sizes = quantity_sizes(n, fed.num_clients, part["sizes"], part["sigma"], part["alpha"], rng)
    assert list(fed.client_sizes) == sizes.tolist() and sizes.min() >= 1
    assert max(sizes) > min(sizes) + 1  # skewed, unlike sizes=equal
    for ix, expected in zip(fed.client_indices, np.split(perm, np.cumsum(sizes)[:-1])):
        assert np.array_equal(ix, np.sort(expected))


def check_asymmetric(fed, part, noise, ctx):
    """rho = 1: every client noisy, round(mu_k n_mapped) samples of the mapped classes moved to their
    destination (count=exact), nothing else; the realised pairs are exactly the map's."""
    o, y, obs = fed.oracle, fed.oracle.clean_labels.numpy(), fed.labels.numpy()
    dest = labelmaps.resolve_map(noise["map"], fed.num_classes, fed.source.classes)
    assert o.noisy_client.all() and (o.mu >= noise["tau"]).all()
    mask = obs != y
    assert np.array_equal(obs[mask], dest[y[mask]])
    for k, ix in enumerate(fed.client_indices):
        mapped = int((dest[y[ix]] >= 0).sum())
        assert mask[ix].sum() == round_half_up(o.mu[k] * mapped)
    pairs = {(int(a), int(b)) for a, b in zip(y[mask], obs[mask])}
    assert pairs == {(a, int(dest[a])) for a in np.flatnonzero(dest >= 0)}
    confusion = ctx["confusion"]
    off = confusion - np.diag(np.diag(confusion))
    assert {tuple(map(int, p)) for p in zip(*np.nonzero(off))} == pairs


def check_instance(fed, part, noise, ctx):
    """Xia et al.: a sample flips w.p. E[q_i] = mean of N(mu_k, std^2) truncated to [0, 1] (std = 0: mu_k)."""
    o = fed.oracle
    noisy = np.flatnonzero(o.noisy_client)
    assert len(noisy) >= 1 and (o.realized_rate[~o.noisy_client] == 0).all()
    expected = np.array([truncated_normal_mean(o.mu[k], noise["std"]) for k in noisy])
    sizes = np.array(fed.client_sizes)[noisy]
    assert (np.abs(o.realized_rate[noisy] - expected) <= binomial_tol(expected, sizes)).all()
    flips, mean = (o.realized_rate[noisy] * sizes).sum(), (expected * sizes).sum()  # pooled
    assert abs(flips - mean) <= 4 * np.sqrt((expected * (1 - expected) * sizes).sum()) + 1


def check_mixed(fed, part, noise, ctx):
    """Default groups symmetric 0.4 / pairflip 0.3 / clean 0.3 of 6 clients: largest remainder gives
    2 / 2 / 2; noisy levels in [tau, 1]; pair-flip exact, symmetric about (1 - 1/M) round(mu n)."""
    o, y, obs = fed.oracle, fed.oracle.clean_labels.numpy(), fed.labels.numpy()
    kinds = np.array(o.client_kind)
    assert [int((kinds == k).sum()) for k in ("symmetric", "pairflip", "clean")] == [2, 2, 2]
    assert ctx["diag_kind"] == list(kinds)  # the run's diagnostics.json carries the kinds
    assert np.array_equal(o.noisy_client, kinds != "clean") and (o.mu[kinds == "clean"] == 0).all()
    assert ((o.mu[kinds != "clean"] >= noise["tau"]) & (o.mu[kinds != "clean"] <= 1)).all()
    for k, ix in enumerate(fed.client_indices):
        wrong = obs[ix] != y[ix]
        chosen = round_half_up(o.mu[k] * len(ix))
        if kinds[k] == "pairflip":
            assert wrong.sum() == chosen and np.array_equal(obs[ix][wrong], (y[ix][wrong] + 1) % 10)
        elif kinds[k] == "symmetric":  # a redrawn label is the true one w.p. 1/M
            assert wrong.sum() <= chosen and abs(wrong.sum() - 0.9 * chosen) <= 4 * np.sqrt(0.09 * chosen) + 1
        else:
            assert not wrong.any()


def check_cifarn(fed, part, noise, ctx):
    table = ctx["table"]
    key = {"aggre": "aggre_label", "worse": "worse_label"}[noise["label_set"]]
    assert np.array_equal(fed.labels.numpy(), table[key])
    o, clean = fed.oracle, table["clean_label"]
    rates = [np.mean(table[key][ix] != clean[ix]) for ix in fed.client_indices]
    np.testing.assert_allclose(o.realized_rate, rates)
    np.testing.assert_array_equal(o.mu, o.realized_rate)  # real noise: mu = the realised rate
    np.testing.assert_array_equal(o.noisy_client, o.realized_rate > 0)
    if noise["label_set"] == "worse":
        assert (o.realized_rate == 1).all()


# (id, sweep overrides, cells, check)
SWEEPS = [
    ("label-skew", ["partition=shards,classes,dirichlet", "noise.rho_tau=[0.5,0.3]"], 3, None),
    ("quantity-skew", ["partition=iid", "partition.sizes=lognormal,dirichlet", "partition.alpha=0.5"], 2,
     check_iid_sizes),
    ("asymmetric", ["noise=asymmetric", "noise.rho_tau=[1.0,0.3]", "noise.map=next,{3:8,8:3,1:7}"], 2,
     check_asymmetric),
    ("instance", ["noise=instance", "noise.rho_tau=[1.0,0.2]", "noise.std=0.0,0.2"], 2, check_instance),
    ("mixed", ["noise=mixed", "noise.tau=0.3,0.8"], 2, check_mixed),
    ("cifarn", ["noise=cifarn", "noise.file=FAKE", "noise.label_set=aggre,worse"], 2, check_cifarn),
]
PARTITION_CHECKS = {"shards": check_shards, "classes": check_classes, "dirichlet": check_dirichlet}


def breadth_tables(sweep: Path) -> str:
    """benchmarks/breadth_tables.py's markdown for every run of the sweep."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("breadth_tables", REPO / "benchmarks" / "breadth_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = []
    for path in sorted(sweep.rglob("summary.json")):
        diag = json.loads((path.parent / "diagnostics.json").read_text())
        out.append(mod.run_tables(json.loads(path.read_text()), diag, 3, 5))
    return "".join(out)


def plan(args, sweep, tmp_path):
    code, out, err = cli([*args, "dry_run=true"], tmp_path)
    assert code == 0, err[-2000:]
    return out


@pytest.mark.parametrize("overrides,cells,check", [s[1:] for s in SWEEPS], ids=[s[0] for s in SWEEPS])
def test_new_options_sweep_plan_run_and_closed_form(tmp_path, overrides, cells, check):
    table = fake_cifar10n(tmp_path / "c10n.pt") if "noise=cifarn" in overrides else None
    overrides = [o.replace("FAKE", str(tmp_path / "c10n.pt")) for o in overrides]
    sweep = tmp_path / "sweep"
    # selection.val_share=0: the closed forms are over each client's whole partition (a validation split
    # would hold out a random part of it)
    args = ["-m", *overrides, *TINY, "fl.rounds=1", "selection.val_share=0", f"hydra.sweep.dir={sweep}"]
    out = plan(args, sweep, tmp_path)
    assert f"{cells} cells, 0 complete, {cells} to run" in out
    assert not sweep.exists() or not any(sweep.iterdir())  # a plan writes nothing
    code, _, err = cli(args, tmp_path)
    assert code == 0, err[-2000:]
    assert f"{cells} cells, {cells} complete, 0 to run" in plan(args, sweep, tmp_path)

    summaries = sorted(sweep.glob("*/summary.json"))  # one directory per cell, path values included
    assert len(summaries) == cells
    if table is not None:  # noise.file=/... is in the name with its slashes escaped
        assert all("noise.file=%2F" in p.parent.name for p in summaries)
    clear_cache()  # rebuild every federation independently of the sweep's in-process memo
    kinds = set()
    for path in summaries:
        s = json.loads(path.read_text())
        diag = json.loads((path.parent / "diagnostics.json").read_text())
        assert s["status"] == "complete"
        cfg = s["config"]
        fed = build_federation(cfg["dataset"], cfg["partition"], cfg["noise"], cfg["fl"]["num_clients"], cfg["seed"])
        assert fed.hash == s["federation_hash"]
        n = len(fed.labels)
        assert np.array_equal(np.sort(np.concatenate(fed.client_indices)), np.arange(n))  # every index once
        y = fed.oracle.clean_labels.numpy()
        counts = np.array(diag["class_counts"])
        assert np.array_equal(counts, [np.bincount(y[ix], minlength=fed.num_classes) for ix in fed.client_indices])
        assert np.array_equal(counts.sum(axis=0), np.bincount(y, minlength=fed.num_classes))  # class totals kept
        np.testing.assert_allclose(diag["clients"]["true_rate"], fed.oracle.realized_rate)
        np.testing.assert_allclose(diag["clients"]["mu"], fed.oracle.mu)
        ctx = {"class_counts": counts, "confusion": np.array(diag["confusion_before"]), "seed": cfg["seed"],
               "diag_kind": diag["clients"].get("kind"), "table": table}
        part_check = check or PARTITION_CHECKS[cfg["partition"]["kind"]]
        part_check(fed, cfg["partition"], cfg["noise"], ctx)
        kinds.add(json.dumps([cfg["partition"], cfg["noise"]], sort_keys=True))
    assert len(kinds) == cells  # the swept values really differ between cells
    clear_cache()

    tables = breadth_tables(sweep)  # docs/breadth.md's generator: exact kinds have no gap to the closed form
    if check in (check_asymmetric, check_mixed):
        exact_rows = 1 if check is check_asymmetric else 2  # mixed: the pairflip and clean groups
        assert tables.count("| 0.0000 | exact |") == cells * exact_rows, tables

    columns = with_columns(load_summaries(sweep), "method")[1]  # the report's column labels
    assert len(columns) == cells and "none" not in " ".join(columns), columns
    if "partition=shards,classes,dirichlet" in overrides:
        assert set(columns) == {"(0.5,0.3) shards s=2", "(0.5,0.3) classes k=2", "(0.5,0.3) dirichlet (α=0.5) min_size=10"}


# ---------------------------------------------------------------------------------------------
# bad values of the new options: one line through the real command line, nothing written

BAD_CLI = [
    (["partition=shards", "partition.shards_per_client=0"], "partition.shards_per_client=0 is invalid"),
    (["partition=shards", "+partition.shards_per_client=0"], "allowed the keys of partition=shards: kind, s"),
    (["partition=shards", "partition.s=0"], "partition.s=0 is invalid: allowed an integer >= 1"),
    (["partition=shards", "partition.s=1000"], "partition.s=1000 is invalid: num_clients * s = 6000 shards"),
    (["partition=classes", "partition.k=11"], "partition.k=11 is invalid: allowed an integer in [1, 10]"),
    (["partition=classes", "partition.k=1"], "partition.k=1 is invalid: 6 clients x 1 classes cannot hold all"),
    (["partition=dirichlet", "partition.alpha=0"], "partition.alpha=0 is invalid"),
    (["partition=dirichlet", "partition.min_size=1000"], "partition.min_size=1000 is invalid"),
    (["partition=dirichlet", "partition.alpha=0.0001", "partition.min_size=200"], "partition.alpha=0.0001 is invalid here"),
    (["partition=iid", "partition.sizes=zipf"], "partition.sizes='zipf' is invalid"),
    (["partition=iid", "partition.sizes=lognormal", "partition.sigma=-1"], "partition.sigma=-1 is invalid"),
    (["noise=asymmetric", "noise.rho=0.5"], "noise.map=auto is invalid for this dataset"),  # digits: no CIFAR names
    (["noise=asymmetric", "noise.rho=0"], "noise.map=auto is invalid for this dataset"),  # even with no noisy client
    (["noise=mixed", "noise.groups=[{kind:asymmetric,share:1}]"], "noise.map=auto is invalid for this dataset"),
    (["noise=asymmetric", "noise.rho=0.5", "noise.map={zebra:1}"], "noise.map entry 'zebra' is invalid"),
    (["noise=asymmetric", "noise.rho=0.5", "noise.map={3:12}"], "noise.map entry 12 is invalid: allowed class indices 0..9"),
    (["noise=asymmetric", "noise.rho=0.5", "noise.map=cifar100"], "noise.map=cifar100 is invalid for a dataset with 10"),
    (["noise=asymmetric", "noise.map=cifar1000"], "noise.map='cifar1000' is invalid"),
    (["noise=asymmetric", "noise.rho=0.5", "noise.map={3:3}"], "it flips no class"),
    (["noise=instance", "noise.std=-1"], "noise.std=-1 is invalid"),
    (["noise=instance", "noise.rho=2"], "noise.rho=2 is invalid"),
    (["noise=mixed", "noise.groups=[{kind:clean,share:0.5}]"], "shares summing to 1"),
    (["noise=mixed", "noise.groups=[{kind:gaussian,share:1}]"], "noise.groups[0].kind='gaussian' is invalid"),
    (["noise=mixed", "noise.rho=0.5"], "noise.rho=0.5 is invalid: allowed null"),
    (["noise=cifarn", "noise.label_set=best"], "noise.label_set='best' is invalid"),
    (["noise=cifarn", "noise.file=/nonexistent/fedlnl/c10n.pt"], "CIFAR-N file not found: /nonexistent/fedlnl/c10n.pt"),
    (["noise=cifarn", "noise.label_set=coarse", "noise.file=/nonexistent/fedlnl"], "noise.label_set=coarse is invalid"),
]


@pytest.mark.parametrize("overrides,message", BAD_CLI, ids=[" ".join(o) for o, _ in BAD_CLI])
def test_bad_values_of_new_options_are_one_line(tmp_path, overrides, message):
    assert_refused(cli([*overrides, *TINY], tmp_path), message, tmp_path)


def test_a_cifarn_file_of_another_dataset_is_one_line(tmp_path):
    table = fake_cifar10n(tmp_path / "c10n.pt")
    torch.save({**table, "clean_label": np.roll(table["clean_label"], 1)}, tmp_path / "c10n.pt")
    code, out, err = cli(["noise=cifarn", f"noise.file={tmp_path / 'c10n.pt'}", *TINY], tmp_path)
    errors = [ln for ln in (out + err).splitlines() if "error:" in ln]
    assert code == 2 and len(errors) == 1 and "does not match the training labels" in errors[0], out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c10n.pt"]


# ---------------------------------------------------------------------------------------------
# on the shared CIFAR-10 JPEG copy: the real class names and sizes (skipped without the data)


@pytest.fixture(scope="module")
def cifar10_cfg():
    data = SHARED / "data"
    if not (data / "cifar10-jpeg" / "train").is_dir() or not (data / "cifar-n" / "CIFAR-10_human.pt").is_file():
        pytest.skip(f"shared CIFAR-10 JPEG copy not found under {data} (set FEDLNL_SHARED)")
    cfg = compose_cfg(["dataset=cifar10_jpeg", "partition=iid"])
    cfg.dataset.root = str(data / "cifar10-jpeg")
    cfg.dataset.order_labels = str(data / "cifar-n" / "CIFAR-10_human.pt")
    yield cfg
    clear_cache()


def test_patrini_map_auto_on_real_cifar10_names(cifar10_cfg):
    """map=auto picks the CIFAR-10 map from the folder's class names; 100 clients of 500, rho = 0.6."""
    noise = dict(compose_cfg(["noise=asymmetric", "noise.rho_tau=[0.6,0.5]"]).noise)
    fed = build_federation(cifar10_cfg.dataset, cifar10_cfg.partition, noise, 100, 0)
    o, y, obs = fed.oracle, fed.oracle.clean_labels.numpy(), fed.labels.numpy()
    names = fed.source.classes
    mask = obs != y
    pairs = {(names[a], names[b]) for a, b in zip(y[mask], obs[mask])}
    assert pairs == {("truck", "automobile"), ("bird", "airplane"), ("deer", "horse"), ("cat", "dog"), ("dog", "cat")}
    dest = labelmaps.resolve_map("cifar10", 10)
    for k, ix in enumerate(fed.client_indices):  # count=exact: round(mu_k m_k) of the m_k mapped samples
        assert mask[ix].sum() == round_half_up(o.mu[k] * (dest[y[ix]] >= 0).sum())
    noisy = o.noisy_client
    assert abs(noisy.mean() - 0.6) <= 4 * np.sqrt(0.24 / 100)  # gamma_k ~ Bernoulli(rho)
    assert (o.mu[noisy] >= 0.5).all() and (o.realized_rate[~noisy] == 0).all()
    # 5 of 10 classes mapped (50%), IID clients of 500: realised ≈ mu_k / 2 on average
    assert abs(o.realized_rate[noisy].sum() / o.mu[noisy].sum() - 0.5) < 0.02


def test_instance_and_mixed_on_real_cifar10(cifar10_cfg):
    noise = dict(compose_cfg(["noise=instance", "noise.rho_tau=[0.6,0.2]"]).noise)
    fed = build_federation(cifar10_cfg.dataset, cifar10_cfg.partition, noise, 100, 0)
    o = fed.oracle
    noisy = np.flatnonzero(o.noisy_client)
    expected = np.array([truncated_normal_mean(o.mu[k], 0.1) for k in noisy])
    assert (np.abs(o.realized_rate[noisy] - expected) <= binomial_tol(expected, 500)).all()
    obs, y = fed.labels.numpy(), o.clean_labels.numpy()
    targets = np.bincount(obs[obs != y], minlength=10)
    assert (targets > 0).sum() == 10  # flips go to images' own classes, not one fixed class

    mixed = dict(compose_cfg(["noise=mixed"]).noise)
    fed = build_federation(cifar10_cfg.dataset, cifar10_cfg.partition, mixed, 100, 0)
    kinds = np.array(fed.oracle.client_kind)
    assert [int((kinds == k).sum()) for k in ("symmetric", "pairflip", "clean")] == [40, 30, 30]
    assert (fed.oracle.realized_rate[kinds == "clean"] == 0).all()
