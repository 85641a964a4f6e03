"""Missing or broken data (one-line DataError naming the path) and option checks without data."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from conftest import CONF, compose_cfg
from fedlnl.datasets import DataError, check_options, sources
from fedlnl.datasets.federation import load_source


def one_line_data_error(fn, *args, **kw) -> str:
    with pytest.raises(DataError) as err:
        fn(*args, **kw)
    msg = str(err.value)
    assert "\n" not in msg and msg, msg
    return msg


def tree(root: Path, classes=("a", "b"), n=3, test_classes=None) -> None:
    for split, names in (("train", classes), ("test", test_classes or classes)):
        for c in names:
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.fromarray(np.full((6, 6, 3), 10 * i, dtype=np.uint8)).save(root / split / c / f"{i}.png")


def folder(root, tmp_path, **kw):
    return sources.folder(root=str(root), cache_dir=str(tmp_path / "cache"), workers=1, **kw)


# ---------------------------------------------------------------------------------------------
# data errors


def test_missing_root(tmp_path):
    msg = one_line_data_error(folder, tmp_path / "nowhere", tmp_path)
    assert "nowhere does not exist" in msg and "dataset.root" in msg


def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "no image folder at" in one_line_data_error(folder, tmp_path / "empty", tmp_path)


def test_no_class_folders(tmp_path):
    (tmp_path / "img" / "train").mkdir(parents=True)
    (tmp_path / "img" / "test").mkdir()
    assert "has no class sub-folders" in one_line_data_error(folder, tmp_path / "img", tmp_path)


def test_test_class_missing_from_train(tmp_path):
    tree(tmp_path / "img", test_classes=("a", "b", "zebra"))
    assert "classes missing from train/: zebra" in one_line_data_error(folder, tmp_path / "img", tmp_path)


def test_class_folders_without_images(tmp_path):
    (tmp_path / "img" / "train" / "a").mkdir(parents=True)
    (tmp_path / "img" / "test" / "a").mkdir(parents=True)
    assert "no .jpg/.jpeg/.png images under" in one_line_data_error(folder, tmp_path / "img", tmp_path)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_without_data_and_without_network(tmp_path, monkeypatch, name):
    import torchvision.datasets.utils as tvutils

    def offline(*args, **kwargs):
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>\nsecond line")

    monkeypatch.setattr(tvutils, "download_url", offline)
    msg = one_line_data_error(getattr(sources, name), root=str(tmp_path / "none"), download=True)
    assert str(tmp_path / "none") in msg and "download failed" in msg and "second line" not in msg


def test_missing_clothing1m_release(tmp_path):
    msg = one_line_data_error(sources.clothing1m, root=str(tmp_path / "c1m"), cache_dir=None)
    assert "Clothing1M not found under" in msg and "github.com/Cysu/noisy_label" in msg


def test_order_labels_that_do_not_fit(tmp_path):
    tree(tmp_path / "img")
    np.save(tmp_path / "order.npy", np.array([0, 0, 0, 0, 1, 1]))
    assert "dataset.order_labels=" in one_line_data_error(folder, tmp_path / "img", tmp_path,
                                                          order_labels=str(tmp_path / "order.npy"))


def _corrupt(root: Path) -> tuple[Path, Path]:
    """train/a/1.png truncated (half its bytes), train/b/2.png not an image at all."""
    truncated, garbage = root / "train" / "a" / "1.png", root / "train" / "b" / "2.png"
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    garbage.write_bytes(b"not an image")
    return truncated, garbage


def test_corrupt_image_names_the_file(tmp_path):
    tree(tmp_path / "img")
    truncated, _ = _corrupt(tmp_path / "img")
    msg = one_line_data_error(folder, tmp_path / "img", tmp_path)
    assert f"corrupt or truncated image {truncated} (and 1 more)" in msg and "dataset.skip_corrupt=true" in msg
    assert not list((tmp_path / "cache").glob("*.npz"))  # nothing cached from a failed decode


def test_skip_corrupt_leaves_them_out(tmp_path):
    tree(tmp_path / "img")
    _corrupt(tmp_path / "img")
    with pytest.warns(UserWarning, match="skipped 2 corrupt"):
        s = folder(tmp_path / "img", tmp_path, skip_corrupt=True)
    assert s.y_train.tolist() == [0, 0, 1, 1] and s.x_train[:, 0, 0, 0].tolist() == [0, 20, 0, 10]
    assert len(s.y_test) == 6


def test_skip_corrupt_in_clothing1m(tmp_path):
    from test_real_noise import N_TRAIN, make_clothing1m

    meta = make_clothing1m(tmp_path / "c1m")
    (tmp_path / "c1m" / meta["train"][3]).write_bytes(b"broken")
    kw = dict(root=str(tmp_path / "c1m"), cache_dir=str(tmp_path / "cache"), size=8, test_size=8, workers=1)
    assert meta["train"][3] in one_line_data_error(sources.clothing1m, **kw)
    with pytest.warns(UserWarning, match="skipped 1"):
        s = sources.clothing1m(**kw, skip_corrupt=True)
    keep = [i for i in range(N_TRAIN) if i != 3]
    assert s.y_train.tolist() == [i % 14 for i in keep] and len(s.y_train_clean) == N_TRAIN - 1
    assert s.y_train_clean[3].item() == sources.UNKNOWN_LABEL  # image 4 (no clean label) moved up
    again = sources.clothing1m(**kw, skip_corrupt=True)  # from the cache
    assert again.y_train.tolist() == s.y_train.tolist()


def test_data_error_is_a_value_error():
    assert issubclass(DataError, ValueError) and issubclass(sources.DatasetUnavailable, DataError)


# ---------------------------------------------------------------------------------------------
# check_options: every shipped combination passes, every bad value is one line naming it

PARTITIONS = sorted(p.stem for p in (CONF / "partition").glob("*.yaml"))
NOISES = sorted(p.stem for p in (CONF / "noise").glob("*.yaml"))
DATASETS = sorted(p.stem for p in (CONF / "dataset").glob("*.yaml"))


def groups(dataset="digits", partition="iid", noise="symmetric", *over):
    cfg = compose_cfg([f"dataset={dataset}", f"partition={partition}", f"noise={noise}", *over])
    return cfg.dataset, cfg.partition, cfg.noise


@pytest.mark.parametrize("partition,noise", list(itertools.product(PARTITIONS, NOISES)))
def test_shipped_partition_and_noise_pass(partition, noise):
    check_options(*groups(partition=partition, noise=noise))


@pytest.mark.parametrize("dataset", DATASETS)
def test_shipped_datasets_pass(dataset):
    over = ["dataset.root=/data/x"] if dataset == "folder" else []
    check_options(*groups(dataset, "iid", "symmetric", *over))


BAD = [
    ("partition=shards", "partition.s=0", "partition.s=0 is invalid: allowed an integer >= 1"),
    ("partition=shards", "partition.s=1.5", "partition.s=1.5 is invalid"),
    ("partition=classes", "partition.k=-1", "partition.k=-1 is invalid"),
    ("partition=classes", "partition.k=two", "partition.k='two' is invalid"),
    ("partition=dirichlet", "partition.alpha=0", "partition.alpha=0 is invalid: allowed a Dirichlet"),
    ("partition=dirichlet", "partition.min_size=-2", "partition.min_size=-2 is invalid"),
    ("partition=iid", "partition.sizes=zipf", "partition.sizes='zipf' is invalid: allowed equal, lognormal"),
    ("partition=iid", "partition.sigma=0", None),  # sizes=equal: sigma unused
    ("partition=iid", "partition.sizes=lognormal partition.sigma=0", "partition.sigma=0 is invalid: allowed a log"),
    ("partition=iid", "partition.sizes=dirichlet partition.alpha=-1", "partition.alpha=-1 is invalid"),
    ("partition=iid", "+partition.s=2", "partition.s=2 is invalid: allowed the keys of partition=iid"),
    ("partition=noniid", "partition.p=0", "partition.p=0 is invalid"),
    ("partition=noniid", "partition.kind=bogus", "partition.kind='bogus' is invalid: allowed iid, noniid, shards"),
    ("noise=asymmetric", "noise.map=cifar1000", "noise.map='cifar1000' is invalid: allowed auto, cifar10"),
    ("noise=asymmetric", "noise.map={a:-1}", "noise.map.a=-1 is invalid"),
    ("noise=asymmetric", "noise.rho=1.5", "noise.rho=1.5 is invalid: allowed a share in [0, 1]"),
    ("noise=asymmetric", "noise.count=poisson", "noise.count='poisson' is invalid: allowed exact, bernoulli"),
    ("noise=instance", "noise.std=-0.1", "noise.std=-0.1 is invalid: allowed a standard deviation >= 0"),
    ("noise=instance", "noise.tau=null", "noise.tau=None is invalid"),
    ("noise=mixed", "noise.groups=[{kind:clean,share:0.5}]", "noise.groups.share=[0.5] is invalid: allowed shares summing to 1"),
    ("noise=mixed", "noise.groups=[{kind:symmetric,share:1,level:[0.5]}]", r"noise.groups[0].level=[0.5]"),
    ("noise=mixed", "noise.rho=0.5", "noise.rho=0.5 is invalid: allowed null"),
    ("noise=mixed", "noise.exclude_true=maybe", "noise.exclude_true='maybe' is invalid: allowed true or false"),
    ("noise=cifarn", "noise.label_set=best", "noise.label_set='best' is invalid: allowed aggre, worse"),
    ("noise=cifarn", "noise.rho=0.3", "noise.rho=0.3 is invalid: allowed null"),
    ("noise=symmetric", "noise.label_range=first5", "noise.label_range='first5' is invalid"),
    ("noise=symmetric", "+noise.map=cifar10", "noise.map='cifar10' is invalid: allowed the keys of noise=symmetric"),
    ("dataset=folder", "dataset.size=abc dataset.root=/x", "dataset.size='abc' is invalid: allowed an integer >= 1"),
    ("dataset=folder", "dataset.size=[32] dataset.root=/x", "dataset.size=[32] is invalid"),
    ("dataset=folder", "dataset.size=[32,32] dataset.root=/x", None),
    ("dataset=folder", "", "dataset.root='???' is invalid: allowed a folder path"),
    ("dataset=folder", "dataset.root=/x dataset.skip_corrupt=1", "dataset.skip_corrupt=1 is invalid"),
    ("dataset=folder", "dataset.root=/x dataset.augment={crop:0}", "dataset.augment={'crop': 0"),
    ("dataset=folder", "dataset.root=/x +dataset.colour=red", "dataset.colour='red' is invalid: allowed the keys"),
    ("dataset=clothing1m", "dataset.test_size=null", "dataset.test_size=None is invalid"),
    ("dataset=clothing1m", "dataset.max_train=0", "dataset.max_train=0 is invalid: allowed an integer >= 1"),
    ("dataset=digits", "dataset.test_size=1.5", "dataset.test_size=1.5 is invalid: allowed a fraction in (0, 1)"),
    ("dataset=digits", "dataset.test_size=abc", "dataset.test_size='abc' is invalid"),
    ("dataset=cifar10", "dataset.download=yes", "dataset.download='yes' is invalid: allowed true or false"),
    ("dataset=cifar10", "dataset.std=[0.2,0,0.2]", "dataset.std=[0.2, 0, 0.2] is invalid"),
    ("dataset=synthetic", "dataset.n_train=0", "dataset.n_train=0 is invalid"),
]


@pytest.mark.parametrize("group,override,message", BAD, ids=[b[1] or b[0] for b in BAD])
def test_bad_options_are_one_line(group, override, message):
    key, name = group.split("=")
    args = {"dataset": "digits", "partition": "iid", "noise": "symmetric", key: name}
    cfg = groups(args["dataset"], args["partition"], args["noise"], *override.split())
    if message is None:
        check_options(*cfg)
        return
    with pytest.raises(ValueError) as err:
        check_options(*cfg)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(message) or message in msg, msg
    assert "is invalid" in msg


def test_check_options_takes_plain_dicts_and_loads_nothing(monkeypatch):
    def no_loading(*a, **k):
        raise AssertionError("check_options loaded data")

    import sklearn.datasets

    monkeypatch.setattr(sklearn.datasets, "load_digits", no_loading)
    d, p, n = groups()
    check_options(OmegaConf.to_container(d), dict(p), {**n, "rho": 0.5})
    with pytest.raises(ValueError, match="noise.tau=2 is invalid"):
        check_options(d, p, {**n, "tau": 2})


# ---------------------------------------------------------------------------------------------
# every new partition and noise model composes, enters the federation hash and runs at tiny size

NEW = [  # (overrides, one more override that must give another federation)
    (["partition=shards", "partition.s=2"], "partition.s=3"),
    (["partition=classes", "partition.k=3"], "partition.k=2"),
    (["partition=dirichlet", "partition.alpha=0.3", "partition.min_size=5"], "partition.alpha=0.6"),
    (["partition=iid", "partition.sizes=lognormal", "partition.sigma=0.8"], "partition.sigma=1.6"),
    (["noise=asymmetric", "noise.rho=0.5", "noise.tau=0.3", "noise.map={3: 8, 8: 3, 1: 7}"], "noise.map=next"),
    (["noise=instance", "noise.rho=0.5", "noise.tau=0.3"], "noise.std=0.3"),
    (["noise=mixed"], "noise.tau=0.8"),
]


@pytest.mark.parametrize("overrides,change", NEW, ids=lambda o: " ".join(o) if isinstance(o, list) else o)
def test_new_settings_run_tiny_and_enter_the_hash(tmp_path, overrides, change):
    from conftest import run_tiny
    from fedlnl.datasets.federation import build_federation

    s = run_tiny(tmp_path, overrides + ["fl.rounds=1"])
    assert s["status"] == "complete"
    cfg = compose_cfg(["debug=tiny", *overrides])
    check_options(cfg.dataset, cfg.partition, cfg.noise)

    def fed(c, seed):  # the run's federation: its validation split (selection) included
        return build_federation(c.dataset, c.partition, c.noise, c.fl.num_clients, seed, c.selection.val_share,
                                c.selection.client_test_size)

    base = fed(cfg, cfg.seed)
    assert s["federation_hash"] == base.hash
    assert fed(cfg, cfg.seed + 1).hash != base.hash  # seeded from the run seed
    assert fed(compose_cfg(["debug=tiny", *overrides, change]), cfg.seed).hash != base.hash


def test_a_damaged_image_cache_is_moved_aside_with_one_warning_and_rebuilt(tmp_path, caplog):
    import logging

    root = tmp_path / "img"
    tree(root)
    first = folder(root, tmp_path)
    (cache,) = (tmp_path / "cache").glob("*.npz")
    cache.write_bytes(cache.read_bytes()[:200])  # truncated, e.g. by a full disk or a killed writer
    caplog.clear()  # the first decode's INFO lines, kept when an earlier test in this worker set fedlnl to INFO
    with caplog.at_level(logging.WARNING, logger="fedlnl"):
        again = folder(root, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "fedlnl"]
    assert len(lines) == 1 and lines[0].startswith(f"the decoded-image cache {cache} is damaged (")
    assert f"moved to {cache.name}.corrupt; decoding the images again" in lines[0]
    assert (cache.parent / f"{cache.name}.corrupt").stat().st_size == 200 and cache.stat().st_size > 200
    assert np.array_equal(again.x_train.numpy(), first.x_train.numpy())
    assert np.array_equal(again.y_train.numpy(), first.y_train.numpy())


# ---------------------------------------------------------------------------------------------
# each loader's declaration is its signature: one key per keyword argument, each with a doc and a check


@pytest.mark.parametrize("loader", [sources.digits, sources.cifar10, sources.cifar100, sources.folder,
                                    sources.synthetic, sources.clothing1m], ids=lambda fn: fn.__name__)
def test_each_loader_declares_exactly_its_keyword_arguments(loader):
    import dataclasses
    import inspect

    fields = dataclasses.fields(loader.options)
    assert [f.name for f in fields if f.name] and {f.name for f in fields} == set(inspect.signature(loader).parameters)
    for f in fields:
        assert f.metadata["doc"] and f.metadata["check"] is not None, f.name


def test_an_undeclared_loader_is_checked_against_its_signature(monkeypatch):
    def mine(name: str = "mine", depth: int = 1):
        raise AssertionError("not called by the checks")

    monkeypatch.setattr(sources, "mine", mine, raising=False)
    ok = {"_target_": "fedlnl.datasets.sources.mine", "family": "mine", "depth": 2}
    check_options(ok, {"kind": "iid"}, {"kind": "symmetric", "rho": 0.0, "tau": 0.0})
    with pytest.raises(ValueError, match=r"^dataset.width=3 is invalid: allowed the keys of "
                                         r"fedlnl.datasets.sources.mine: name, depth$"):
        check_options({**ok, "width": 3}, {"kind": "iid"}, {"kind": "symmetric", "rho": 0.0, "tau": 0.0})
