"""Real label noise: Clothing1M (release layout, tiny generated fixture), CIFAR-10N human labels,
and pair-flip noise with per-client (rho, tau) levels end to end."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import compose_cfg, run_tiny
from fedlnl.datasets import kinds
from fedlnl.datasets import DataError, sources
from fedlnl.datasets.federation import build_federation, clear_cache, load_source

M = 14  # Clothing1M classes
N_TRAIN, N_TEST = 56, 14


def _jpeg(path: Path, value: int, size=(20, 18)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    px = np.full((*size, 3), value, dtype=np.uint8)
    Image.fromarray(px).save(path, quality=95)


def make_clothing1m(root: Path, annotations: str = "") -> dict:
    """The release layout: images/<a>/<bc>/<id>.jpg, noisy/clean kv files and the two key lists.
    Train image i has noisy label i % 14; every third one also has a clean label, which differs
    from the noisy one for every sixth image (clean = (noisy + 1) % 14)."""
    ann = root / annotations
    ann.mkdir(parents=True, exist_ok=True)
    train = [f"images/{i % 2}/{i % 3:02d}/{1000 + i}.jpg" for i in range(N_TRAIN)]
    test = [f"images/9/99/{2000 + j}.jpg" for j in range(N_TEST)]
    noisy = {k: i % M for i, k in enumerate(train)}
    clean = {k: (i % M + (i % 6 == 0)) % M for i, k in enumerate(train) if i % 3 == 0}
    clean.update({k: j % M for j, k in enumerate(test)})
    for i, k in enumerate(train):
        _jpeg(root / k, 10 + 4 * i)
    for j, k in enumerate(test):
        _jpeg(root / k, 200 + j, size=(30, 30))
    (ann / "noisy_label_kv.txt").write_text("".join(f"{k} {v}\n" for k, v in noisy.items()))
    (ann / "clean_label_kv.txt").write_text("".join(f"{k} {v}\n" for k, v in clean.items()))
    (ann / "noisy_train_key_list.txt").write_text("\n".join(train) + "\n")
    (ann / "clean_test_key_list.txt").write_text("\n".join(test) + "\n")
    return {"train": train, "test": test, "noisy": noisy, "clean": clean}


@pytest.fixture
def clothing(tmp_path: Path):
    meta = make_clothing1m(tmp_path / "c1m")
    kw = dict(root=str(tmp_path / "c1m"), cache_dir=str(tmp_path / "cache"), size=16, test_size=12,
              workers=1)
    return meta, kw


# ---------------------------------------------------------------------------------------------
# Clothing1M


def test_clothing1m_loader_shapes_labels_and_unknown_clean(clothing):
    meta, kw = clothing
    s = sources.clothing1m(**kw)
    assert s.x_train.shape == (N_TRAIN, 3, 16, 16) and s.x_test.shape == (N_TEST, 3, 12, 12)
    assert s.num_classes == 14 and s.classes[0] == "T-Shirt" and s.classes[-1] == "Underwear"
    assert s.y_train.tolist() == [i % M for i in range(N_TRAIN)]  # the noisy labels, list order
    assert s.y_test.tolist() == [j % M for j in range(N_TEST)]
    clean = s.y_train_clean.tolist()
    assert clean[0] == 1 and clean[3] == 3 and clean[1] == clean[2] == sources.UNKNOWN_LABEL
    assert sum(c >= 0 for c in clean) == len(range(0, N_TRAIN, 3))
    assert int(s.x_train[5, 0, 8, 8]) == pytest.approx(30, abs=3)  # image 5 (JPEG: +-few levels)
    assert s.mean == sources.IMAGENET_MEAN and s.augment == {"crop": 224, "pad": 0, "flip": True}


def test_clothing1m_subsample_cache_and_annotations_dir(tmp_path, monkeypatch):
    meta = make_clothing1m(tmp_path / "c1m", annotations="annotations")
    kw = dict(root=str(tmp_path / "c1m"), cache_dir=str(tmp_path / "cache"), size=8, test_size=8,
              workers=1, max_train=10, subsample_seed=3)
    s = sources.clothing1m(**kw)
    assert s.x_train.shape == (10, 3, 8, 8) and len(s.y_test) == N_TEST
    # list order kept: noisy labels of the kept keys are increasing positions of i % 14
    kept = np.sort(np.random.default_rng(3).choice(N_TRAIN, 10, replace=False))
    assert s.y_train.tolist() == [meta["noisy"][meta["train"][i]] for i in kept]

    def no_decoding(*args):
        raise AssertionError("decoded again instead of using the cache")

    monkeypatch.setattr(sources, "_decode_all", no_decoding)
    again = sources.clothing1m(**kw)
    assert torch.equal(again.x_train, s.x_train) and torch.equal(again.y_train_clean, s.y_train_clean)
    assert len(list((tmp_path / "cache").glob("clothing1m-*.npz"))) == 1
    monkeypatch.undo()
    uncached = sources.clothing1m(**{**kw, "cache_dir": None})
    assert torch.equal(uncached.x_train, s.x_train) and len(list((tmp_path / "cache").iterdir())) == 1


def test_clothing1m_missing_is_one_line(tmp_path):
    with pytest.raises(sources.DatasetUnavailable) as err:
        sources.clothing1m(root=str(tmp_path / "none"), cache_dir=str(tmp_path / "cache"))
    msg = str(err.value)
    assert "\n" not in msg and "dataset.root" in msg and "noisy_label_kv.txt" in msg
    make_clothing1m(tmp_path / "c1m")
    (tmp_path / "c1m" / "images" / "0" / "00" / "1000.jpg").unlink()
    with pytest.raises(sources.DatasetUnavailable, match="1000.jpg is missing"):
        sources.clothing1m(root=str(tmp_path / "c1m"), cache_dir=str(tmp_path / "cache"), workers=1)


def test_clothing1m_yaml_and_oracle_skip_unknown_clean_labels(clothing):
    meta, kw = clothing
    cfg = compose_cfg(["dataset=clothing1m", "partition=noniid", *(f"dataset.{k}={v}" for k, v in kw.items())])
    assert cfg.model._target_.endswith("ResNet50") and dict(cfg.dataset.augment)["crop"] == 224
    fed = build_federation(cfg.dataset, cfg.partition, cfg.noise, 4, 0)
    o = fed.oracle
    assert torch.equal(fed.labels, fed.source.y_train)  # real noise: no synthetic noise on top
    known = (fed.source.y_train_clean >= 0).numpy()
    # wrong = known and clean != noisy: images 0, 6, 12, ... (every sixth)
    assert o.noisy_mask.nonzero().flatten().tolist() == list(range(0, N_TRAIN, 6))
    for k, ix in enumerate(fed.client_indices):
        n_known = int(known[ix].sum())
        expected = o.noisy_mask.numpy()[ix].sum() / n_known if n_known else np.nan
        np.testing.assert_allclose(o.realized_rate[k], expected)
    with pytest.raises(ValueError, match="noise.rho=0"):
        build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "rho": 0.5}, 4, 0)


def test_clothing1m_run_end_to_end(clothing, tmp_path):
    """A tiny run on the fixture (small CNN, crop 12 of 16): scores and diagnostics skip the
    samples without a clean label instead of failing on the -1."""
    _, kw = clothing
    over = [f"dataset.{k}={v}" for k, v in kw.items()] + [
        "dataset=clothing1m", "model=cnn", "dataset.augment.crop=12", "fl.num_clients=4",
        "partition=noniid", "fl.batch_size=8", "fl.eval_batch_size=64",
        "selection.val_share=0"]  # the counts below are over every training image: none held out
    s = run_tiny(tmp_path / "run", over)
    assert s["status"] == "complete" and s["federation"]["num_noisy_clients"] >= 1
    diag = json.loads((tmp_path / "run" / "diagnostics.json").read_text())
    before = np.array(diag["confusion_before"])
    assert before.shape == (14, 14) and before.sum() == len(range(0, N_TRAIN, 3))  # known only
    assert np.trace(before) == before.sum() - len(range(0, N_TRAIN, 6))
    assert np.array(diag["class_counts"]).sum() == N_TRAIN


# ---------------------------------------------------------------------------------------------
# CIFAR-10N on a fake annotation file (fast) and on the shared copy (skipped when absent)


def fake_cifar10n(path: Path, clean: np.ndarray, flip_every: int = 4) -> np.ndarray:
    aggre = clean.copy()
    aggre[::flip_every] = (aggre[::flip_every] + 1) % 10
    table = {"clean_label": clean, "aggre_label": aggre, "worse_label": (clean + 3) % 10,
             "random_label1": clean, "random_label2": clean, "random_label3": clean}
    torch.save(table, path)
    return aggre


def test_cifar10n_fake_file(tmp_path):
    cfg = compose_cfg(["dataset=synthetic", "dataset.n_train=200", "dataset.n_test=20", "noise=cifarn",
                       f"noise.file={tmp_path / 'c10n.pt'}"])
    clean = load_source(cfg.dataset).y_train.numpy()
    aggre = fake_cifar10n(tmp_path / "c10n.pt", clean)
    fed = build_federation(cfg.dataset, cfg.partition, cfg.noise, 5, 0)
    assert np.array_equal(fed.labels.numpy(), aggre)
    assert torch.equal(fed.oracle.clean_labels, torch.from_numpy(clean))
    expected = [np.mean(aggre[ix] != clean[ix]) for ix in fed.client_indices]
    np.testing.assert_allclose(fed.oracle.realized_rate, expected)
    np.testing.assert_array_equal(fed.oracle.mu, fed.oracle.realized_rate)
    np.testing.assert_array_equal(fed.oracle.noisy_client, fed.oracle.realized_rate > 0)
    worse = build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "label_set": "worse"}, 5, 0)
    assert float(worse.oracle.noisy_mask.double().mean()) == 1.0


def test_cifar10n_errors(tmp_path):
    cfg = compose_cfg(["dataset=synthetic", "dataset.n_train=200", "dataset.n_test=20", "noise=cifarn",
                       f"noise.file={tmp_path / 'c10n.pt'}"])
    with pytest.raises(DataError, match="noise.file"):
        build_federation(cfg.dataset, cfg.partition, cfg.noise, 5, 0)
    clean = load_source(cfg.dataset).y_train.numpy()
    fake_cifar10n(tmp_path / "c10n.pt", np.roll(clean, 1))  # another order
    with pytest.raises(ValueError, match="does not match the training labels"):
        build_federation(cfg.dataset, cfg.partition, cfg.noise, 5, 0)
    fake_cifar10n(tmp_path / "c10n.pt", clean)
    with pytest.raises(ValueError, match="noise.label_set='best'"):
        build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "label_set": "best"}, 5, 0)
    with pytest.raises(ValueError, match="rho/noise.tau do not apply"):
        build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "rho": 0.4}, 5, 0)


def test_cifar10n_on_the_shared_jpeg_copy(shared_data):
    cfg = compose_cfg(["dataset=cifar10_jpeg", "noise=cifarn", "partition=noniid"])
    cfg.dataset.root = str(shared_data / "cifar10-jpeg")
    cfg.dataset.order_labels = str(shared_data / "cifar-n" / "CIFAR-10_human.pt")
    cfg.noise.file = str(shared_data / "cifar-n" / "CIFAR-10_human.pt")
    rates = {}
    for label_set in ("aggre", "worse"):
        fed = build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "label_set": label_set}, 100, 0)
        rates[label_set] = float(fed.oracle.noisy_mask.double().mean())
        sizes = np.array(fed.client_sizes)
        assert np.average(fed.oracle.realized_rate, weights=sizes) == pytest.approx(rates[label_set])
    # the released file: aggre 9.01% (the CIFAR-10N paper states 9.03%), worse 40.21%
    assert rates == {"aggre": pytest.approx(0.0901), "worse": pytest.approx(0.40208)}
    cfg.dataset.order_labels = None  # class-sorted order: must be refused, not silently misaligned
    with pytest.raises(ValueError, match="does not match the training labels"):
        build_federation(cfg.dataset, cfg.partition, cfg.noise, 100, 0)
    clear_cache()


# ---------------------------------------------------------------------------------------------
# pair-flip with per-client (rho, tau)


def test_pairflip_per_client_levels_end_to_end(tmp_path):
    # selection.val_share=0: the exact counts are over a client's whole partition (a validation split
    # would hold out a random part of its flips)
    s = run_tiny(tmp_path, ["noise=pairflip", "noise.rho_tau=[0.5,0.6]", "fl.rounds=1", "seed=1",
                            "selection.val_share=0"])
    assert s["status"] == "complete" and s["setting"]["noise"] == "pairflip"
    assert (s["setting"]["rho"], s["setting"]["tau"]) == (0.5, 0.6)
    diag = json.loads((tmp_path / "diagnostics.json").read_text())["clients"]
    mu, rate, noisy = map(np.array, (diag["mu"], diag["true_rate"], diag["noisy_client"]))
    sizes = np.array(diag["size"])
    assert noisy.sum() == s["federation"]["num_noisy_clients"] >= 1
    assert np.all(mu[~noisy] == 0) and np.all(rate[~noisy] == 0)
    assert np.all((mu[noisy] >= 0.6) & (mu[noisy] <= 1.0))
    # exact count (paper): round(mu_k n_k) flips, each really wrong (c -> c + 1)
    np.testing.assert_allclose(rate[noisy], np.floor(mu[noisy] * sizes[noisy] + 0.5) / sizes[noisy])
    confusion = np.array(json.loads((tmp_path / "diagnostics.json").read_text())["confusion_before"])
    off = confusion - np.diag(np.diag(confusion))
    assert off.sum() == np.trace(np.roll(off, -1, axis=1))  # every error is c -> (c + 1) mod 10
    assert tuple(kinds.noises())[:2] == ("symmetric", "pairflip")


# ---------------------------------------------------------------------------------------------
# CIFAR-100N on a generated file in the published layout (CIFAR-100_human.pt: a dict of numpy arrays)

from fedlnl.datasets.labelmaps import CIFAR100_COARSE  # noqa: E402


def fake_cifar100n(path: Path, clean: np.ndarray) -> dict:
    """clean_label / noisy_label (every 3rd fine label + 1) / clean_coarse_label / noisy_coarse_label
    (every 5th coarse label + 1), as in the release."""
    noisy = clean.copy()
    noisy[::3] = (noisy[::3] + 1) % 100
    coarse = CIFAR100_COARSE[clean]
    noisy_coarse = coarse.copy()
    noisy_coarse[::5] = (noisy_coarse[::5] + 1) % 20
    table = {"clean_label": clean, "noisy_label": noisy, "clean_coarse_label": coarse,
             "noisy_coarse_label": noisy_coarse}
    torch.save(table, path / "CIFAR-100_human.pt")
    return table


@pytest.fixture
def c100(tmp_path):
    cfg = compose_cfg(["dataset=synthetic", "dataset.n_train=600", "dataset.n_test=200",
                       "dataset.num_classes=100", "noise=cifarn", f"noise.file={tmp_path}"])
    source = load_source(cfg.dataset)
    return cfg, source, fake_cifar100n(tmp_path, source.y_train.numpy())


def test_cifar100n_fine_labels(c100):
    cfg, source, table = c100
    fed = build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "label_set": "fine"}, 6, 0)
    assert np.array_equal(fed.labels.numpy(), table["noisy_label"]) and fed.num_classes == 100
    assert float(fed.oracle.noisy_mask.double().mean()) == pytest.approx(200 / 600)
    expected = [np.mean(table["noisy_label"][ix] != table["clean_label"][ix]) for ix in fed.client_indices]
    np.testing.assert_allclose(fed.oracle.realized_rate, expected)


def test_cifar100n_coarse_labels_make_a_20_class_dataset(c100):
    cfg, source, table = c100
    fed = build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "label_set": "coarse"}, 6, 0)
    assert fed.num_classes == 20 and fed.source.classes[0] == "aquatic_mammals"
    assert np.array_equal(fed.labels.numpy(), table["noisy_coarse_label"])
    assert np.array_equal(fed.oracle.clean_labels.numpy(), table["clean_coarse_label"])
    assert np.array_equal(fed.source.y_test.numpy(), CIFAR100_COARSE[source.y_test.numpy()])
    assert float(fed.oracle.noisy_mask.double().mean()) == pytest.approx(120 / 600)
    fine = build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "label_set": "fine"}, 6, 0)
    assert fine.hash != fed.hash


def test_cifar100n_errors(c100, tmp_path):
    cfg, source, table = c100
    noise = {**cfg.noise, "label_set": "fine", "file": str(tmp_path / "absent")}
    with pytest.raises(DataError) as err:
        build_federation(cfg.dataset, cfg.partition, noise, 6, 0)
    msg = str(err.value)
    assert "\n" not in msg and "absent/CIFAR-100_human.pt" in msg and "UCSC-REAL/cifar-10-100n" in msg
    torch.save({**table, "clean_label": np.roll(table["clean_label"], 1)}, tmp_path / "CIFAR-100_human.pt")
    with pytest.raises(DataError, match="clean_label of .* does not match the training labels"):
        build_federation(cfg.dataset, cfg.partition, {**cfg.noise, "label_set": "fine"}, 6, 0)
    ten = compose_cfg(["dataset=synthetic", "dataset.n_train=200", "dataset.n_test=20", "noise=cifarn",
                       "noise.label_set=coarse", f"noise.file={tmp_path}"])
    with pytest.raises(ValueError, match="noise.label_set=coarse is invalid for synthetic"):
        build_federation(ten.dataset, ten.partition, ten.noise, 4, 0)


def test_cifar10n_file_may_be_the_folder(tmp_path):
    cfg = compose_cfg(["dataset=synthetic", "dataset.n_train=200", "dataset.n_test=20", "noise=cifarn",
                       f"noise.file={tmp_path}"])
    aggre = fake_cifar10n(tmp_path / "CIFAR-10_human.pt", load_source(cfg.dataset).y_train.numpy())
    assert np.array_equal(build_federation(cfg.dataset, cfg.partition, cfg.noise, 5, 0).labels.numpy(), aggre)
