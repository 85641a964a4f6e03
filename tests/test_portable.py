"""Portable federations (issue 37 items 1-2): fedlnl-export writes a federation any framework reads,
federation=DIR runs on it with the native hash, and a changed or missing file is refused in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from conftest import CONF, REPO, compose_cfg
from fedlnl.benchmark.selection import SelectionSettings
from fedlnl.datasets import portable
from fedlnl.datasets.federation import build_federation, federation_setting, import_federation
from fedlnl.datasets.types import DataError

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
SETTING = ["dataset=digits", "fl.num_clients=6", "noise.rho_tau=[0.6,0.5]", "seed=1"]
#: what a noise kind needs beyond SETTING on digits (whose class names are neither CIFAR's)
KIND_EXTRA = {"noise=asymmetric": ["noise.map=next"], "noise=mixed": ["~noise.rho_tau"]}
PARTITIONS = sorted(p.stem for p in (CONF / "partition").glob("*.yaml"))
NOISES = sorted(p.stem for p in (CONF / "noise").glob("*.yaml") if p.stem != "cifarn")  # cifarn: CIFAR-10 only


def fed_args(cfg):
    sel = SelectionSettings.of(cfg.get("selection"))
    return (cfg.dataset, cfg.partition, cfg.noise, cfg.fl.num_clients, cfg.seed, sel.val_share, sel.client_test_size)


def round_trip(tmp_path: Path, overrides: list[str], oracle: bool = False):
    setting = [o for o in SETTING if not ("~noise.rho_tau" in overrides and o.startswith("noise.rho_tau"))]
    cfg = compose_cfg(["method=fedavg", *setting, *[o for o in overrides if not o.startswith("~")]])
    args = fed_args(cfg)
    native = build_federation(*args)
    portable.write(native, federation_setting(*args), overrides, tmp_path / "fed", oracle)
    return native, import_federation(tmp_path / "fed", *args)


@pytest.mark.parametrize("kind", [f"partition={p}" for p in PARTITIONS] + [f"noise={n}" for n in NOISES])
def test_every_partition_and_noise_kind_round_trips_with_the_native_hash(tmp_path, kind):
    native, back = round_trip(tmp_path, [kind, *KIND_EXTRA.get(kind, []), "selection.val_share=0.1"])
    assert back.hash == native.hash
    for a, b in ((native.client_indices, back.client_indices), (native.client_val, back.client_val),
                 (native.client_test, back.client_test)):
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert np.array_equal(native.labels.numpy(), back.labels.numpy())
    assert np.array_equal(native.oracle.noisy_mask.numpy(), back.oracle.noisy_mask.numpy())
    assert np.allclose(native.oracle.realized_rate, back.oracle.realized_rate, equal_nan=True)
    assert back.meta["nominal_noise_rate"] == native.meta["nominal_noise_rate"]


def test_the_files_are_plain_and_the_clean_labels_only_with_the_oracle(tmp_path):
    native, _ = round_trip(tmp_path, [])
    files = sorted(p.name for p in (tmp_path / "fed").iterdir())
    assert files == ["federation.json", "federation.npz", "manifest.json"]
    with np.load(tmp_path / "fed" / "federation.npz") as z:
        assert "clean_labels" not in z.files
        k = 2  # client k's training indices, as the user guide's loader reads them
        assert z["client_indices"][z["client_offsets"][k]:z["client_offsets"][k + 1]].tolist() == \
            native.client_indices[k].tolist()
    native, back = round_trip(tmp_path, [], oracle=True)
    manifest = json.loads((tmp_path / "fed" / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["federation.json", "federation.npz", "oracle.npz"]
    with np.load(tmp_path / "fed" / "oracle.npz") as z:
        assert np.array_equal(z["clean_labels"], native.oracle.clean_labels.numpy())
    assert np.array_equal(back.oracle.mu, native.oracle.mu)
    assert np.array_equal(back.oracle.noisy_client, native.oracle.noisy_client)


@pytest.mark.parametrize("tamper, message", [
    (lambda d: (d / "federation.npz").write_bytes((d / "federation.npz").read_bytes() + b"x"),
     "federation.npz does not match its sha256 in manifest.json"),
    (lambda d: (d / "federation.json").unlink(), "federation.json is missing"),
    (lambda d: (d / "manifest.json").unlink(), "no manifest.json there"),
])
def test_a_changed_or_missing_file_is_refused_naming_it(tmp_path, tamper, message):
    round_trip(tmp_path, [])
    tamper(tmp_path / "fed")
    cfg = compose_cfg(["method=fedavg", *SETTING])
    with pytest.raises(DataError) as err:
        import_federation(tmp_path / "fed", *fed_args(cfg))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_another_setting_is_refused_naming_the_key(tmp_path):
    round_trip(tmp_path, [])
    cfg = compose_cfg(["method=fedavg", *SETTING, "seed=2"])
    with pytest.raises(DataError, match=r"was exported for seed=1, this run has seed=2"):
        import_federation(tmp_path / "fed", *fed_args(cfg))


def cli(module: str, *args: str, cwd: Path):
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=600)


def test_export_then_run_on_it_end_to_end_with_identical_numbers(tmp_path):
    run = [*SETTING, "fl.rounds=3", "logger=none", "threads=1", "debug=tiny"]
    exp = cli("fedlnl.benchmark.export", "out=fed", *SETTING, cwd=tmp_path)
    assert exp.returncode == 0, exp.stderr[-2000:]
    assert "federation " in exp.stdout and (tmp_path / "fed" / "manifest.json").is_file()
    for name, extra in (("native", []), ("imported", ["federation=fed"])):
        proc = cli("fedlnl.benchmark.run", *run, *extra, f"hydra.run.dir={name}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("native", "imported"))
    assert a["federation_hash"] == b["federation_hash"] == json.loads(
        (tmp_path / "fed" / "manifest.json").read_text())["federation_hash"]
    assert (tmp_path / "native" / "metrics.jsonl").read_bytes() == (tmp_path / "imported" / "metrics.jsonl").read_bytes()
    (tmp_path / "fed" / "federation.npz").write_bytes(b"")
    proc = cli("fedlnl.benchmark.run", *run, "federation=fed", "hydra.run.dir=tampered", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "federation.npz does not match its sha256" in proc.stderr and not (tmp_path / "tampered").exists()


@pytest.mark.parametrize("args, message", [
    ([], "out=DIR is required"),
    (["out=x", "oracle=maybe"], "oracle=maybe is invalid: allowed true, false"),
    (["out=x", "noise.rho=1.5"], "noise.rho"),
])
def test_export_refusals_are_one_line_and_write_nothing(tmp_path, args, message):
    proc = cli("fedlnl.benchmark.export", *args, "dataset=digits", cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert not (tmp_path / "x").exists()


def test_the_console_script_is_declared():
    assert 'fedlnl-export = "fedlnl.benchmark.export:main"' in (REPO / "pyproject.toml").read_text()


# ---------------------------------------------------------------------------------------------
# the settings of every kind read back; the per-client truth of oracle.npz; what a run on an export is


def fake_cifar10n(path: Path, clean: np.ndarray) -> None:
    """A CIFAR-10N-shaped table on digits' labels: each annotation set wrong on its own images."""
    import torch

    sets = {}
    for i, key in enumerate(("aggre_label", "worse_label", "random_label1", "random_label2", "random_label3")):
        noisy = clean.copy()
        noisy[i::i + 3] = (noisy[i::i + 3] + 1 + i) % 10
        sets[key] = noisy
    torch.save({"clean_label": clean, **sets}, path)


@pytest.mark.parametrize("label_set", ["random2", "annotators"])
def test_cifarn_and_its_annotator_federation_round_trip_with_their_oracle(tmp_path, label_set):
    from fedlnl.datasets.federation import load_source

    table = tmp_path / "c10n.pt"
    fake_cifar10n(table, load_source(compose_cfg(["dataset=digits"]).dataset).y_train.numpy())
    native, back = round_trip(tmp_path, ["noise=cifarn", f"noise.label_set={label_set}", f"noise.file={table}",
                                         "~noise.rho_tau"], oracle=True)
    assert back.hash == native.hash and native.oracle.noisy_mask.any()
    assert np.array_equal(native.labels.numpy(), back.labels.numpy())
    assert back.oracle.client_kind == native.oracle.client_kind  # annotators: each client's annotator
    if label_set == "annotators":
        assert set(back.oracle.client_kind) == {"random1", "random2", "random3"}
    assert np.array_equal(back.oracle.mu, native.oracle.mu)


def test_a_map_by_class_index_reads_back(tmp_path):
    """JSON turns the map's integer keys into text: the import compares the settings as JSON holds them."""
    native, back = round_trip(tmp_path, ["noise=asymmetric", "noise.map={0:1,3:5}"])
    assert back.hash == native.hash and native.oracle.noisy_mask.any()


def test_paths_of_this_machine_are_not_part_of_the_setting(monkeypatch):
    """An export made where the shared data live elsewhere (another FEDLNL_SHARED) is the same setting:
    cifar10_jpeg's root and order_labels are paths, the federation hash checks the data behind them."""
    settings = []
    for shared in ("/one/shared", "/another/place"):
        monkeypatch.setenv("FEDLNL_SHARED", shared)
        cfg = compose_cfg(["dataset=cifar10_jpeg", "noise=cifarn", "noise.label_set=annotators"])
        settings.append(federation_setting(*fed_args(cfg)))
    assert settings[0] == settings[1]
    assert "order_labels" not in settings[0]["dataset"] and settings[0]["dataset"]["order_labels_key"] == "clean_label"


def test_without_the_oracle_a_client_drawn_noisy_without_a_wrong_label_counts_as_clean(tmp_path):
    """Only class 0 is mapped and each client holds 2 classes: clients drawn noisy (rho = 1) without
    class 0 keep every label. Without oracle.npz the run's truth is the realised noise (such a client
    is clean), so detection scores may differ from the native run's: federation is a result key."""
    from fedlnl.benchmark.rundir import config_hash

    over = ["partition=classes", "partition.k=2", "noise=asymmetric", "noise.map={0:1}", "noise.rho=1.0",
            "noise.tau=0.5", "~noise.rho_tau"]
    native, back = round_trip(tmp_path, over)
    silent = native.oracle.noisy_client & (native.oracle.realized_rate == 0)
    assert native.oracle.noisy_client.all() and silent.any()  # the case exists in this federation
    np.testing.assert_array_equal(back.oracle.noisy_client, native.oracle.realized_rate > 0)
    np.testing.assert_array_equal(back.oracle.mu, native.oracle.realized_rate)
    _, exact = round_trip(tmp_path / "with", over, oracle=True)
    np.testing.assert_array_equal(exact.oracle.noisy_client, native.oracle.noisy_client)
    cfg = compose_cfg(["method=fedavg", *SETTING])
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert config_hash(plain) != config_hash({**plain, "federation": "fed"})
    assert config_hash(plain) == config_hash({**plain, "federation": None})


def test_export_federation_script_writes_the_packages_bundle(tmp_path):
    """benchmarks/export_federation.py calls fedlnl.benchmark.export.bundle (no logic of its own)."""
    from fedlnl.benchmark import export

    arrays, fed = export.bundle([*SETTING, "debug=tiny"])
    assert str(arrays["federation_hash"]) == fed.hash
    assert np.array_equal(arrays["clean_labels"], fed.oracle.clean_labels.numpy())
    assert np.array_equal(arrays["y_test"], arrays["test_labels"])
    assert "bundle(" in (REPO / "benchmarks" / "export_federation.py").read_text()


def test_the_user_guides_pytorch_loader_reads_an_export(tmp_path, monkeypatch):
    """The plain-PyTorch example of docs/user-guide.md, run as printed, gives client 0's samples."""
    import torch

    text = (REPO / "docs" / "user-guide.md").read_text()
    start = text.index("```python\n", text.index("## Portable federations")) + len("```python\n")
    code = text[start:text.index("```", start)]
    native, _ = round_trip(tmp_path, [])
    (tmp_path / "fed").rename(tmp_path / "fed_digits")
    monkeypatch.chdir(tmp_path)
    scope = {"train_images": native.source.x_train}
    exec(compile(code, "user-guide.md", "exec"), scope)  # noqa: S102  (the documented snippet itself)
    ix = torch.as_tensor(native.client_indices[0].copy())
    assert torch.equal(scope["y_k"], native.labels[ix]) and torch.equal(scope["x_k"], native.source.x_train[ix])
