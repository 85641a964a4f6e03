"""Paper presets (fedlnl/conf/paper/*.yaml): grids parse, reference CSVs match them, and each preset
composes at paper scale and runs its first cell under ``debug=tiny``.

Parametrized over conf/paper/*.yaml: a new preset is covered as soon as its YAML exists.
"""
from __future__ import annotations

import csv
import json
import itertools
import math
import re

import pytest
import torch
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import CONF, REPO, build_method

PRESETS = sorted(p.stem for p in (CONF / "paper").glob("*.yaml"))
REF_COLUMNS = ["method", "variant", "dataset", "model", "partition", "rho", "tau", "p", "alpha", "target",
               "metric", "mean", "std", "source"]
PAIRS = {"noise.rho_tau": "noise", "partition.p_alpha": "partition"}
#: sweep keys that choose a config group option (the value must name a YAML of that group)
GROUPS = ("method", "ablation", "column", "arch", "scale", "dataset", "model", "partition", "noise")
#: presets of figures: the paper gives no numbers, so their reference CSV has only the header
FIGURES = {name for name in PRESETS if "_fig" in name}
#: presets whose cells are another preset's (cost tables of the same runs): they run in, and report
#: from, that preset's sweep directory, so nothing runs twice
REUSES = {"fedcorr_t11": "fedcorr_t2", "fedcorr_t12": "fedcorr_t2", "fedcorr_t13": "fedcorr_t3"}


def sweep(name: str) -> dict[str, list]:
    """The preset's hydra.sweeper.params, each parsed as Hydra's basic sweeper does: key -> values."""
    params = OmegaConf.load(CONF / "paper" / f"{name}.yaml").hydra.sweeper.params
    parser = OverridesParser.create()
    out = {}
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        out[key] = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    return out


def as_arg(value) -> str:
    """An override value back in command-line form ([0.4, 0.0] -> [0.4,0.0])."""
    return "[" + ",".join(str(v) for v in value) + "]" if isinstance(value, list) else str(value)


def methods_in(name: str) -> list[str]:
    return [str(m) for m in sweep(name)["method"]]


def variant_of(option: str) -> str:
    """The `variant` label an ablation option sets ("" for the full method)."""
    return OmegaConf.load(CONF / "ablation" / f"{option}.yaml").get("variant") or ""


def first_cell(name: str) -> list[str]:
    """Overrides of the grid's first cell, with the first method of the grid that has a YAML."""
    params = sweep(name)
    existing = [m for m in methods_in(name) if (CONF / "method" / f"{m}.yaml").exists()]
    if not existing:
        pytest.skip(f"{name}: no method of its grid has a YAML yet ({methods_in(name)})")
    cell = {k: as_arg(v[0]) for k, v in params.items()}
    cell["method"] = existing[0]
    return [f"{k}={v}" for k, v in cell.items()]


def reference_rows(name: str) -> list[dict]:
    with open(REPO / "fedlnl" / "benchmark" / "reference" / f"{name}.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == REF_COLUMNS, f"{name}.csv header: {reader.fieldnames}"
        return list(reader)


def compose(overrides: list[str], hydra: bool = False):
    """The composed config (with ``hydra.runtime.choices`` if asked); skips when a dataset YAML the
    preset needs (e.g. dataset/clothing1m.yaml, added by another change) does not exist yet."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="fedlnl.conf", version_base=None):
            return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=hydra)
    except MissingConfigException as err:
        if "dataset" in str(err):
            pytest.skip(f"{overrides[0]}: {str(err).splitlines()[0]}")
        raise


# ------------------------------------------------------------------------------- the grid
@pytest.mark.parametrize("name", PRESETS)
def test_grid_parses_and_names_existing_configs(name):
    text = (CONF / "paper" / f"{name}.yaml").read_text()
    cfg = OmegaConf.load(CONF / "paper" / f"{name}.yaml")
    assert text.startswith("# @package _global_")
    assert cfg.preset == cfg.name == REUSES.get(name, name)
    assert f"fedlnl-run -m paper={name}" in text and "Cost:" in text
    params = sweep(name)
    assert {"seed", "method"} <= set(params), "every preset sweeps seeds and methods"
    # the header's run count is the grid's size
    runs = int(re.search(r"# Runs: .*= (\d+)", text).group(1))
    assert runs == math.prod(len(v) for v in params.values())
    for key, pair_of in PAIRS.items():
        for value in params.get(key, []):
            assert isinstance(value, list) and len(value) == 2, f"{key}: {value} is not a ({pair_of}) pair"
            assert all(isinstance(v, (int, float)) for v in value), f"{key}: {value}"
    missing = [m for m in methods_in(name) if not (CONF / "method" / f"{m}.yaml").exists()]
    assert not missing, f"{name} sweeps methods without a YAML: {missing}"
    for key in set(params) & set(GROUPS):
        for option in params[key]:
            assert (CONF / key / f"{option}.yaml").exists(), f"{key}={option}: no {key}/{option}.yaml"


@pytest.mark.parametrize("name", PRESETS)
def test_reference_csv_matches_the_grid(name):
    rows = reference_rows(name)
    if name not in FIGURES:
        assert rows, f"fedlnl/benchmark/reference/{name}.csv has no rows"
    params = sweep(name)
    methods = set(methods_in(name))
    variants = {variant_of(a) for a in params.get("ablation", ["none"])}
    noise = {tuple(v) for v in params.get("noise.rho_tau", [])}
    p_alpha = {tuple(v) for v in params.get("partition.p_alpha", [])}
    for r in rows:
        where = f"{name}.csv row {r}"
        assert r["method"] in methods, f"{where}: method not in the grid {sorted(methods)}"
        assert r["variant"] in variants, f"{where}: variant not in the grid {sorted(variants)}"
        assert r["metric"] in ("best_acc", "cost_to_target"), where
        assert r["partition"] in ("iid", "noniid"), where
        assert (r["p"] == r["alpha"] == "") == (r["partition"] == "iid"), where
        assert (r["target"] != "") == (r["metric"] == "cost_to_target"), where
        assert r["source"] and r["dataset"] and r["model"], where
        if r["metric"] == "best_acc":
            assert 0 < float(r["mean"]) <= 100 and (r["std"] == "" or float(r["std"]) >= 0), where
        elif r["mean"]:  # an empty cost = "-" in the paper: never reached
            assert float(r["mean"]) > 0 and r["std"] == "", where
        if noise:
            assert (float(r["rho"]), float(r["tau"])) in noise, f"{where}: (rho, tau) not swept"
        if p_alpha:
            assert (float(r["p"]), float(r["alpha"])) in p_alpha, f"{where}: (p, alpha) not swept"


@pytest.mark.parametrize("name", PRESETS)
def test_reference_settings_exist_at_paper_scale(name):
    """Each reference row's dataset/model/partition/noise is what some composed cell of the grid runs."""
    params = sweep(name)
    group_keys = [k for k in ("column", "scale", "arch") if k in params]
    cells = []
    base = first_cell(name)
    for combo in itertools.product(*(params[k] for k in group_keys)):
        overrides = [o for o in base if o.split("=")[0] not in group_keys]
        overrides += [f"{k}={v}" for k, v in zip(group_keys, combo)]
        cells.append(compose([f"paper={name}", *overrides], hydra=True))
    settings = set()
    for cfg in cells:
        model = cfg.hydra.runtime.choices.model
        kind = cfg.partition.kind
        for rt in params.get("noise.rho_tau", [[cfg.noise.rho, cfg.noise.tau]]):
            for pa in params.get("partition.p_alpha", [[cfg.partition.get("p"), cfg.partition.get("alpha")]]):
                pa = ("", "") if kind == "iid" else (f"{float(pa[0]):g}", f"{float(pa[1]):g}")
                settings.add((cfg.dataset.name, model, kind, f"{float(rt[0]):g}", f"{float(rt[1]):g}", *pa))
    for r in reference_rows(name):
        key = (r["dataset"], r["model"], r["partition"], r["rho"], r["tau"], r["p"], r["alpha"])
        assert key in settings, f"{name}.csv row {key} is no cell of the grid: {sorted(settings)}"


# ------------------------------------------------------------------------------- composition
SCALE = {"cifar10": (100, 0.1, 10), "cifar100": (50, 0.1, 10), "clothing1m": (500, 0.02, 16)}


@pytest.mark.parametrize("name", PRESETS)
def test_first_cell_composes_at_paper_scale(name):
    cfg = compose([f"paper={name}", *first_cell(name)])
    OmegaConf.resolve(cfg)
    assert cfg.preset == cfg.name == REUSES.get(name, name)
    clients, frac, batch = SCALE[cfg.dataset.name]
    assert (cfg.fl.num_clients, cfg.fl.frac, cfg.fl.batch_size) == (clients, frac, batch)
    assert cfg.fl.local_epochs == 5 and cfg.fl.momentum == 0.5 and cfg.checkpoint_every > 0


def test_method_dataset_values_reach_the_presets():
    """Per-dataset paper values of a method's YAML apply inside presets (FedProx lr 0.01 on CIFAR, etc.)."""
    def lr(*overrides):
        return build_method(compose(list(overrides))).fl.lr
    assert lr("paper=fedcorr_t2", "method=fedprox") == 0.01
    assert lr("paper=fedcorr_t2", "method=fedavg") == 0.03
    assert lr("paper=fedcorr_t3", "method=fedavg") == 0.01
    assert lr("paper=fedcorr_t10", "method=fedcorr", "arch=lenet") == 0.003
    if (CONF / "dataset" / "clothing1m.yaml").exists():
        assert lr("paper=fedcorr_t5", "method=fedavg") == 0.003
        assert lr("paper=fedcorr_t5", "method=fedcorr") == 0.001
        # ImageNet weights for ResNet-50 on Clothing1M, none for the tiny stand-in model
        assert compose(["paper=fedcorr_t5"]).model.pretrained is True
        assert "pretrained" not in compose(["paper=fedcorr_t5", "debug=tiny"]).model
    assert lr("paper=fedcorr_t2", "method=fedprox", "dataset=cifar10_jpeg") == 0.01  # a family, no copies


def _options(group: str) -> list[tuple[str, str]]:
    """(preset, option) for every option of `group` some preset sweeps."""
    return sorted({(n, str(o)) for n in PRESETS for o in sweep(n).get(group, [])})


@pytest.mark.parametrize("name, option", _options("ablation"))
def test_ablation_rows_are_valid_method_settings(name, option):
    """An ablation option only sets switches its method has (instantiating checks the values)."""
    for method in methods_in(name):
        if not (CONF / "method" / f"{method}.yaml").exists():
            pytest.skip(f"method/{method}.yaml does not exist yet")
        cfg = compose([f"paper={name}", f"method={method}", f"ablation={option}", "debug=tiny"])
        flags = OmegaConf.load(CONF / "ablation" / f"{option}.yaml").get("method", {})
        base = OmegaConf.load(CONF / "method" / f"{method}.yaml")
        assert set(flags) <= set(base), f"ablation/{option}.yaml sets unknown method.{set(flags) - set(base)}"
        assert all(cfg.method[k] == v for k, v in flags.items())
        assert (cfg.variant or "") == variant_of(option)
        build_method(cfg)


@pytest.mark.parametrize("name, option", _options("arch"))
def test_arch_rows_build_their_model(name, option):
    cfg = compose([f"paper={name}", f"arch={option}"], hydra=True)
    assert cfg.hydra.runtime.choices.model == option
    with torch.device("meta"):  # shapes only: VGG-11's 100M-parameter head is slow to initialise
        model = instantiate(cfg.model, num_classes=10, input_shape=(3, 32, 32))
    assert sum(p.numel() for p in model.parameters()) > 0


# ------------------------------------------------------------------------------- tiny runs
_TINY: dict[str, dict] = {}  # config hash -> summary: presets sharing a tiny cell run it once


@pytest.mark.parametrize("name", PRESETS)
def test_first_cell_runs_under_debug_tiny(tmp_path, name):
    from fedlnl.benchmark.runner import run
    from fedlnl.benchmark.rundir import config_hash

    overrides = first_cell(name)
    cfg = compose([f"paper={name}", *overrides, "debug=tiny", "logger=none", "device=cpu"])
    assert cfg.dataset.name == "digits" and cfg.preset == REUSES.get(name, name)
    method = next(o.split("=")[1] for o in overrides if o.startswith("method="))
    key = config_hash(OmegaConf.to_container(cfg, resolve=True))
    summary = _TINY.get(key) or run(cfg, tmp_path, method)
    _TINY[key] = summary
    assert summary["status"] == "complete", summary.get("status")
    assert summary["rounds_run"] == summary["total_rounds"] >= 1
    assert summary["variant"] == cfg.variant


# ------------------------------------------------------------------------------- ablations at tiny size
def _ablation_runs(tmp_path, preset: str, extra: list[str]) -> dict[str, str]:
    from fedlnl.benchmark.runner import run

    out = {}
    for option in [str(o) for o in sweep(preset)["ablation"]]:
        method = methods_in(preset)[0]
        cfg = compose([f"paper={preset}", f"method={method}", f"ablation={option}", *extra, "seed=0",
                       "debug=tiny", "logger=none", "device=cpu"])
        s = run(cfg, tmp_path / option, method)
        assert s["status"] == "complete", option
        out[option] = (tmp_path / option / "metrics.jsonl").read_text()
    return out


@pytest.mark.slow  # CI runs it (make test-slow); the default suite stays short
@pytest.mark.parametrize("preset, extra", [("fedcorr_t6", ["noise.rho_tau=[0.6,0.5]"]),
                                           ("feddiv_t5", ["column=cifar100_noniid"])])
def test_every_ablation_row_differs_from_the_full_method_at_tiny_size(tmp_path, preset, extra):
    """debug=tiny is large enough that switching a component off changes the run (issue 13)."""
    rows = _ablation_runs(tmp_path, preset, extra)
    same = [o for o, text in rows.items() if o != "none" and text == rows["none"]]
    assert not same, f"{preset}: rows identical to the full method: {same}"
    best = max(json.loads(line)["acc"] for line in rows["none"].splitlines())
    assert best > 0.2, f"{preset}: the full method stays near chance ({best:.3f})"
