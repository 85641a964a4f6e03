"""Dataset sources, their YAMLs, the folder loader and its cache, and the Federation builder."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from conftest import compose_cfg
from fedlnl.datasets import federation as fedmod
from fedlnl.datasets import sources
from fedlnl.datasets.federation import Source, build_federation, federation_stats, load_source

CONF = Path(sources.__file__).parents[1] / "conf"
DATASET_YAMLS = sorted((CONF / "dataset").glob("*.yaml"))


def _shared_data() -> Path:
    env = os.environ.get("FEDLNL_SHARED")
    return (Path(env) if env else Path(__file__).parents[2] / "shared") / "data"


def compose(dataset="digits", partition="iid", noise="symmetric", fidelity="paper", **overrides):
    """The composed run config for these groups (``a__b=v`` overrides ``a.b``), resolved."""
    args = [f"dataset={dataset}", f"partition={partition}", f"noise={noise}", f"fidelity={fidelity}"]
    args += [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()]
    cfg = compose_cfg(args)
    OmegaConf.resolve(cfg)
    return cfg


def build(cfg, num_clients=10, seed=0):
    return build_federation(cfg.dataset, cfg.partition, cfg.noise, num_clients, seed)


# ---------------------------------------------------------------------------------------------
# YAMLs and in-memory sources


@pytest.mark.parametrize("path", DATASET_YAMLS, ids=lambda p: p.stem)
def test_dataset_yaml_has_comment_name_and_target(path):
    assert path.read_text().startswith("# @package _global_\n#")
    cfg = OmegaConf.load(path).dataset
    assert cfg.name == path.stem
    assert cfg._target_.startswith("fedlnl.datasets.sources.")


@pytest.mark.parametrize("group", ["partition", "noise"])
def test_group_yamls_start_with_a_comment(group):
    for path in (CONF / group).glob("*.yaml"):
        assert path.read_text().startswith("#"), path


def test_digits_split_and_pixels():
    s = load_source(compose().dataset)
    assert s.x_train.shape == (1437, 1, 8, 8) and s.x_test.shape == (360, 1, 8, 8)
    assert s.x_train.dtype == torch.uint8 and s.y_train.dtype == torch.int64
    assert int(s.x_train.max()) == 255 and s.num_classes == 10 and s.augment is None
    test_counts = np.bincount(s.y_test.numpy(), minlength=10)
    assert test_counts.min() >= 35 and test_counts.max() <= 37  # stratified 20%
    assert len(s.mean) == 1 and 0 < s.mean[0] < 1 and 0 < s.std[0] < 1


def test_digits_keep_original_order():
    from sklearn.datasets import load_digits

    target = load_digits().target
    s = sources.digits()
    # the train labels are a subsequence of the original label sequence in order
    pos = 0
    for y in s.y_train.tolist():
        while target[pos] != y:
            pos += 1
        pos += 1
    assert torch.equal(sources.digits().x_train, s.x_train)  # split independent of any run seed


def test_synthetic_is_seeded_and_balanced():
    a = sources.synthetic(n_train=200, n_test=50, seed=3)
    b = sources.synthetic(n_train=200, n_test=50, seed=3)
    c = sources.synthetic(n_train=200, n_test=50, seed=4)
    assert a.x_train.shape == (200, 3, 32, 32) and a.x_test.shape == (50, 3, 32, 32)
    assert torch.equal(a.x_train, b.x_train) and not torch.equal(a.x_train, c.x_train)
    assert np.bincount(a.y_train.numpy()).tolist() == [20] * 10
    small = sources.synthetic(n_train=30, n_test=10, channels=1, size=8, num_classes=3)
    assert small.x_train.shape == (30, 1, 8, 8) and small.num_classes == 3


def test_channel_stats_match_direct_computation():
    x = torch.randint(0, 256, (50, 3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    mean, std = sources.channel_stats(x)
    xf = x.double() / 255
    assert np.allclose(mean, xf.mean(dim=(0, 2, 3)).numpy())
    assert np.allclose(std, xf.std(dim=(0, 2, 3), unbiased=False).numpy())


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_missing_cifar_raises_dataset_unavailable(tmp_path, name):
    cfg = compose(dataset=name, dataset__root=str(tmp_path / "none"), dataset__download=False)
    with pytest.raises(sources.DatasetUnavailable) as err:
        load_source(cfg.dataset)
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "none") in msg and "dataset.download=true" in msg


def test_cifar_yaml_normalisation_matches_methods_md():
    assert tuple(compose(dataset="cifar10").dataset["mean"]) == sources.IMAGENET_MEAN
    assert tuple(compose(dataset="cifar100").dataset["std"]) == sources.CIFAR100_STD
    jpeg = compose(dataset="cifar10_jpeg").dataset
    assert tuple(jpeg["mean"]) == sources.IMAGENET_MEAN and dict(jpeg["augment"]) == sources.CIFAR_AUGMENT


# ---------------------------------------------------------------------------------------------
# folder loader


def _tree(root: Path, counts: dict, stems=lambda i: str(i), size=(6, 5)) -> None:
    """train/test trees of PNGs whose pixels encode (class, index): R = 40*class, G = index."""
    for split in ("train", "test"):
        for c, (cls, n) in enumerate(sorted(counts.items())):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(n if split == "train" else 2):
                px = np.zeros((*size, 3), dtype=np.uint8)
                px[..., 0], px[..., 1] = 40 * c, i
                Image.fromarray(px).save(d / f"{stems(i)}.png")


def test_folder_classes_order_and_cache(tmp_path, monkeypatch):
    _tree(tmp_path / "img", {"cat": 12, "ant": 3, "bee": 1})
    kw = dict(root=str(tmp_path / "img"), cache_dir=str(tmp_path / "cache"), workers=1)
    s = sources.folder(**kw)
    assert s.classes == ("ant", "bee", "cat") and s.num_classes == 3
    assert s.y_train.tolist() == [0] * 3 + [1] + [2] * 12 and len(s.y_test) == 6
    assert s.x_train.shape == (16, 3, 6, 5)
    # numeric stems sort numerically: 0, 1, 2, ..., 10, 11 (not 0, 1, 10, 11, 2)
    assert s.x_train[4:, 1, 0, 0].tolist() == list(range(12))
    assert s.x_train[:, 0, 0, 0].tolist() == [0] * 3 + [40] + [80] * 12
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1

    def no_decoding(*args):
        raise AssertionError("decoded again instead of using the cache")

    monkeypatch.setattr(sources, "_decode_all", no_decoding)
    again = sources.folder(**kw)
    assert torch.equal(again.x_train, s.x_train) and torch.equal(again.y_test, s.y_test)


def test_folder_cache_invalidated_when_files_change(tmp_path):
    _tree(tmp_path / "img", {"a": 2, "b": 2})
    kw = dict(root=str(tmp_path / "img"), cache_dir=str(tmp_path / "cache"), workers=1)
    sources.folder(**kw)
    Image.fromarray(np.zeros((6, 5, 3), dtype=np.uint8)).save(tmp_path / "img" / "train" / "a" / "2.png")
    assert len(sources.folder(**kw).y_train) == 5
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2


def test_folder_lexicographic_stems_and_pool(tmp_path):
    _tree(tmp_path / "img", {"a": 3, "b": 2}, stems=lambda i: f"img_{'cba'[i]}")
    s = sources.folder(root=str(tmp_path / "img"), cache_dir=str(tmp_path / "cache"), workers=2)
    assert s.x_train[:3, 1, 0, 0].tolist() == [2, 1, 0]  # img_a, img_b, img_c


def test_folder_resizes_only_when_sizes_differ(tmp_path):
    _tree(tmp_path / "img", {"a": 3, "b": 2})
    Image.fromarray(np.zeros((9, 9, 3), dtype=np.uint8)).save(tmp_path / "img" / "train" / "b" / "1.png")
    kw = dict(root=str(tmp_path / "img"), cache_dir=str(tmp_path / "cache"), workers=1)
    with pytest.warns(UserWarning, match="differ in size"):
        s = sources.folder(**kw)
    assert s.x_train.shape == (5, 3, 6, 5)
    assert sources.folder(**kw, size=4).x_train.shape == (5, 3, 4, 4)


def test_original_order_mapping():
    y_orig = np.array([2, 0, 2, 1, 0, 2])
    y_sorted = np.sort(y_orig)
    perm = sources.original_order(y_sorted, y_orig)
    assert perm.tolist() == [3, 0, 4, 2, 1, 5]  # image i = r-th of class y_i
    assert np.array_equal(y_sorted[perm], y_orig)
    with pytest.raises(ValueError, match="per-class"):
        sources.original_order(y_sorted, np.array([0, 0, 0, 1, 2, 2]))


def test_folder_order_labels_restore_original_order(tmp_path):
    _tree(tmp_path / "img", {"a": 2, "b": 3})
    np.save(tmp_path / "order.npy", np.array([1, 0, 1, 1, 0]))
    kw = dict(root=str(tmp_path / "img"), cache_dir=str(tmp_path / "cache"), workers=1)
    s = sources.folder(**kw, order_labels=str(tmp_path / "order.npy"))
    assert s.y_train.tolist() == [1, 0, 1, 1, 0]
    assert s.x_train[:, 1, 0, 0].tolist() == [0, 0, 1, 2, 1]  # (class b #0, a #0, b #1, b #2, a #1)
    with pytest.warns(UserWarning, match="class-sorted"):
        missing = sources.folder(**kw, order_labels=str(tmp_path / "absent.pt"))
    assert missing.y_train.tolist() == [0, 0, 1, 1, 1]


def test_folder_without_tree_raises(tmp_path):
    with pytest.raises(sources.DatasetUnavailable, match="dataset.root"):
        sources.folder(root=str(tmp_path), cache_dir=str(tmp_path / "cache"))


# ---------------------------------------------------------------------------------------------
# federation


def test_federation_hash_stable_and_seed_dependent():
    cfg = compose(partition="noniid", noise__rho=0.5, noise__tau=0.3)
    a = build(cfg, seed=1)
    fedmod.clear_cache()
    b = build(cfg, seed=1)
    c = build(cfg, seed=2)
    assert a.hash == b.hash and a.hash != c.hash
    assert torch.equal(a.labels, b.labels)
    assert all(np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices))
    assert sorted(np.concatenate(a.client_indices).tolist()) == list(range(1437))
    assert a.meta["partition"] == {"kind": "noniid", "p": 0.7, "alpha": 10}
    assert a.meta["noise"]["count"] == "exact" and sum(a.meta["client_sizes"]) == 1437


def test_federation_streams_and_memo_copies():
    cfg = compose(noise__rho=1.0, noise__tau=0.5)
    fed = build(cfg, num_clients=7, seed=5)
    from fedlnl.datasets.noise import add_noise
    from fedlnl.datasets.partition import iid

    y = fed.source.y_train.numpy()
    clients = iid(len(y), 7, np.random.default_rng([5, 1]))
    labels, _ = add_noise(y, clients, 10, np.random.default_rng([5, 2]),
                            **{k: v for k, v in cfg.noise.items() if k not in ("rho_tau", "fidelity")})
    assert torch.equal(fed.labels, labels)
    fed.labels[:] = 0  # a runner relabelling in place must not touch the memo
    assert torch.equal(build(cfg, num_clients=7, seed=5).labels, labels)


def test_federation_reference_fidelity_and_stats():
    cfg = compose(noise__fidelity="reference", noise__rho=0.6, noise__tau=0.2)
    assert compose(fidelity="reference").noise.count == "exact"  # a method's fidelity keeps the federation
    fed = build(cfg, num_clients=8, seed=0)
    assert fed.meta["noise"] == {
        "kind": "symmetric", "rho": 0.6, "tau": 0.2, "count": "bernoulli", "label_range": "first10",
        "exclude_true": False,
    }
    stats = federation_stats(fed)
    assert stats["num_noisy_clients"] == int(fed.oracle.noisy_client.sum())
    assert stats["client_noise_min"] <= stats["noise_rate"] <= stats["client_noise_max"]
    assert stats["client_size_min"] == 179 and stats["client_size_max"] == 180


def test_federation_pairflip_and_num_clients_bounds():
    cfg = compose(noise="pairflip", noise__rho=1.0, noise__tau=1.0)
    fed = build(cfg, num_clients=3)
    assert torch.equal(fed.labels, (fed.source.y_train + 1) % 10)
    for bad in (0, 1438):
        with pytest.raises(ValueError, match="num_clients"):
            build(cfg, num_clients=bad)


def test_federation_hash_depends_on_dataset():
    a = build(compose(dataset="synthetic", dataset__n_train=300, dataset__n_test=50))
    b = build(compose(dataset="synthetic", dataset__n_train=300, dataset__n_test=50, dataset__seed=1))
    assert isinstance(a.source, Source) and a.hash != b.hash


# ---------------------------------------------------------------------------------------------
# the shared CIFAR-10 JPEG copy (decoded once per session; cached on disk afterwards)


@pytest.fixture(scope="session")
def cifar10_jpeg():
    data = _shared_data()
    labels = data / "cifar-n" / "CIFAR-10_human.pt"
    if not (data / "cifar10-jpeg" / "train").is_dir() or not labels.exists():
        pytest.skip(f"shared CIFAR-10 JPEG copy not found under {data}")
    cfg = compose(dataset="cifar10_jpeg")
    cfg.dataset.root = str(data / "cifar10-jpeg")
    cfg.dataset.order_labels = str(data / "cifar-n" / "CIFAR-10_human.pt")
    return load_source(cfg.dataset), data


def test_cifar10_jpeg_sizes_order_and_cifar10n_alignment(cifar10_jpeg):
    s, data = cifar10_jpeg
    assert s.x_train.shape == (50_000, 3, 32, 32) and s.x_test.shape == (10_000, 3, 32, 32)
    assert s.classes[:3] == ("airplane", "automobile", "bird") and s.num_classes == 10
    assert s.y_train[:8].tolist() == [6, 9, 9, 4, 1, 1, 2, 7]  # frog truck truck deer auto auto bird horse
    clean = torch.load(data / "cifar-n" / "CIFAR-10_human.pt", weights_only=False)["clean_label"]
    assert np.array_equal(s.y_train.numpy(), np.asarray(clean))
    assert np.bincount(s.y_test.numpy()).tolist() == [1000] * 10
    # image 2 is the second truck of the original order: train/truck/0001.jpg
    with Image.open(data / "cifar10-jpeg" / "train" / "truck" / "0001.jpg") as im:
        assert np.array_equal(s.x_train[2].permute(1, 2, 0).numpy(), np.asarray(im.convert("RGB")))
