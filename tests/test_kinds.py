"""A new partition kind and a new noise kind are each one registered function (with its options) plus one YAML: they
compose, are validated, run at tiny size and get labels in a report table, with no other file edited."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_cfg
from dataclasses import dataclass

from fedlnl.conf.checks import key, number, rule
from fedlnl.datasets import kinds
from fedlnl.datasets.noise import LevelOptions, pick_noisy


@dataclass(frozen=True)
class HalvesOptions(kinds.KindOptions):
    first: float = key("share of the training set held by client 0",
                       rule(number, lambda v: 0 < v < 1, "a share in (0, 1)"), required=True)


def halves(labels, num_clients, rng, first):
    """A toy partition: client 0 holds a ``first`` share of a random permutation, the others split the rest."""
    perm = rng.permutation(len(labels))
    cut = int(first * len(labels))
    rest = np.array_split(perm[cut:], num_clients - 1)
    return [np.sort(p).astype(np.int64) for p in [perm[:cut], *rest]]


def to_zero(flip, ix, mu):
    """A toy noise kind on Eq. 4's levels: a mu share of the noisy client's samples get label 0."""
    chosen = pick_noisy(ix, mu, "exact", flip.rng)
    return chosen, np.zeros(len(chosen), dtype=np.int64)


def kind_yamls(conf, partition: str, options: str, noise: str):
    """A config folder with ``partition/<partition>.yaml`` (its ``options``) and ``noise/<noise>.yaml``
    (rho and tau from a ``rho_tau`` pair, as the built-in kinds on Eq. 4's levels)."""
    (conf / "partition").mkdir(parents=True)
    (conf / "noise").mkdir()
    (conf / "partition" / f"{partition}.yaml").write_text(f"kind: {partition}\n{options}\n")
    (conf / "noise" / f"{noise}.yaml").write_text(
        f"kind: {noise}\nrho_tau: null\nrho: ${{item:${{.rho_tau}},0,0.0}}\ntau: ${{item:${{.rho_tau}},1,0.0}}\n")
    return conf


@pytest.fixture
def toy_kinds(tmp_path):
    """The two functions registered, the two YAMLs in a config folder of their own."""
    kinds.partition_kind("halves", options=HalvesOptions, setting=("first",),
                         label=lambda s, fmt: f"halves ({fmt(s.get('first'))})")(halves)
    kinds.noise_kind("to_zero", options=LevelOptions,
                     share=lambda lo, hi, noise, m, classes: (lo + hi) / 2 * (1 - 1 / m))(to_zero)
    yield kind_yamls(tmp_path / "conf", "halves", "first: 0.5", "to_zero")
    kinds.unregister("partition", "halves")
    kinds.unregister("noise", "to_zero")


def _cfg(conf, *overrides):
    return compose_cfg([f"hydra.searchpath=[file://{conf}]", "method=fedavg", "debug=tiny", "logger=none",
                        "device=cpu", *overrides])


def test_a_new_kind_is_listed_and_checked_like_the_built_in_ones(toy_kinds):
    from fedlnl.benchmark.validate import ConfigError, validate

    cfg = _cfg(toy_kinds, "partition=halves", "noise=to_zero", "noise.rho_tau=[1.0,0.5]")
    assert (cfg.partition.kind, cfg.partition.first, cfg.noise.kind, cfg.noise.rho) == ("halves", 0.5, "to_zero", 1.0)
    validate(cfg)
    for override, message in [
        ("partition.first=1.5", "partition.first=1.5 is invalid: allowed a share in (0, 1)"),
        ("+partition.s=2", "partition.s=2 is invalid: allowed the keys of partition=halves: kind, first"),
        ("noise.rho=2.0", "noise.rho=2.0 is invalid: allowed a share in [0, 1]"),
        ("partition.kind=bogus", "allowed iid, noniid, shards, classes, dirichlet, halves"),
        ("noise.kind=bogus", "allowed symmetric, pairflip, asymmetric, instance, mixed, cifarn, to_zero"),
    ]:
        with pytest.raises(ConfigError) as err:
            validate(_cfg(toy_kinds, "partition=halves", "noise=to_zero", override))
        assert message in str(err.value) and "\n" not in str(err.value), override
    assert "to_zero" in kinds.noises() and "to_zero" not in ("clean", *[
        k for k, spec in kinds.noises().items() if spec.group])  # not a mixed group's kind unless it says so


def test_a_new_kind_runs_and_gets_its_labels_in_the_report(toy_kinds, tmp_path):
    from fedlnl.benchmark.report import main as report_main
    from fedlnl.benchmark.runner import run

    sweep = tmp_path / "sweep"
    settings = {"toy": ["partition=halves", "noise=to_zero", "noise.rho_tau=[1.0,0.5]"],
                "builtin": ["partition=iid", "noise=symmetric", "noise.rho_tau=[1.0,0.5]"]}
    for name, overrides in settings.items():
        summary = run(_cfg(toy_kinds, "fl.rounds=1", *overrides), sweep / name, "fedavg")
        assert summary["status"] == "complete"
    toy = summary_of(sweep / "toy")
    assert toy["setting"]["partition"] == "halves" and toy["setting"]["first"] == 0.5
    assert toy["setting"]["noise"] == "to_zero" and toy["federation"]["num_noisy_clients"] == 6
    fed = toy["federation"]
    assert fed["client_size_max"] >= 4 * fed["client_size_min"]  # client 0: half; 5 others share the rest
    assert fed["nominal_noise_rate"] == pytest.approx((1.0 + 0.5) / 2 * (1 - 1 / 10))  # its share, rho = 1
    assert report_main([str(sweep)]) == 0
    table = (sweep / "report" / "accuracy.md").read_text()
    assert "halves (0.5)" in table and "noise=to_zero" in table
    assert "IID" in table and "noise=symmetric" in table


def summary_of(run_dir):
    import json

    return json.loads((run_dir / "summary.json").read_text())


def test_a_noise_kind_without_a_share_has_no_nominal_rate_and_says_why():
    from fedlnl.datasets.noise import nominal_rate, nominal_rate_problem

    kinds.noise_kind("to_zero_unrated", options=LevelOptions)(to_zero)
    try:
        noise = {"kind": "to_zero_unrated", "rho": 0.5, "tau": 0.2}
        assert nominal_rate(noise, 10) is None
        assert nominal_rate_problem(noise) == ("noise kind to_zero_unrated declares no share of labels it "
                                               "changes (its registered share)")
        assert nominal_rate_problem({**noise, "kind": "pairflip"}) is None
    finally:
        kinds.unregister("noise", "to_zero_unrated")


OUTSIDE_MODULE = '''"""A researcher's own kinds, in a package of their own: registered on import."""
from dataclasses import dataclass

import numpy as np

from fedlnl.conf.checks import key
from fedlnl.datasets.kinds import KindOptions, noise_kind, partition_kind
from fedlnl.datasets.noise import LevelOptions, pick_noisy


@dataclass(frozen=True)
class BlocksOptions(KindOptions):
    shift: int = key("clients the blocks are rotated by")


@partition_kind("blocks", options=BlocksOptions, setting=("shift",), label=lambda s, fmt: f"blocks+{fmt(s.get('shift'))}")
def blocks(labels, num_clients, rng, shift):
    """Contiguous index blocks, rotated by ``shift`` clients (no randomness)."""
    parts = np.array_split(np.arange(len(labels)), num_clients)
    return [np.sort(parts[(k + shift) % num_clients]).astype(np.int64) for k in range(num_clients)]


@noise_kind("to_last", options=LevelOptions,
            share=lambda lo, hi, noise, m, classes: (lo + hi) / 2 * (1 - 1 / m))
def to_last(flip, ix, mu):
    chosen = pick_noisy(ix, mu, "exact", flip.rng)
    return chosen, np.full(len(chosen), flip.m - 1, dtype=np.int64)
'''


def test_an_outside_package_registers_its_kinds_through_the_entry_point_group(tmp_path):
    """A package installed beside fedlnl (here: a dist-info on PYTHONPATH) names its module in the
    ``fedlnl.kinds`` group; a fresh process finds its kinds, checks, runs and labels them."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    site = tmp_path / "site"
    (site / "outside_kinds").mkdir(parents=True)
    (site / "outside_kinds" / "__init__.py").write_text(OUTSIDE_MODULE)
    info = site / "outside_kinds-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-kinds\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{kinds.ENTRY_POINTS}]\noutside = outside_kinds\n")
    conf = kind_yamls(site / "conf", "blocks", "shift: 1", "to_last")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}

    def run(name, *overrides):
        return subprocess.run(
            [sys.executable, "-m", "fedlnl.benchmark.run", "method=fedavg", "debug=tiny", "logger=none",
             "device=cpu", "threads=1", "fl.rounds=1", f"hydra.searchpath=[file://{conf}]",
             "partition=blocks", "noise=to_last", "noise.rho_tau=[1.0,0.5]", f"hydra.run.dir={tmp_path / name}",
             *overrides], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)

    bad = run("bad", "partition.shift=2", "+partition.first=0.5")
    assert bad.returncode == 2 and "partition.first=0.5 is invalid: allowed the keys of partition=blocks: kind, shift" \
        in bad.stderr and not (tmp_path / "bad").exists()
    proc = run("good")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "good" / "summary.json").read_text())
    assert summary["status"] == "complete"
    assert (summary["setting"]["partition"], summary["setting"]["shift"], summary["setting"]["noise"]) == \
        ("blocks", 1, "to_last")
    fed = summary["federation"]
    assert fed["num_noisy_clients"] == 6 and fed["nominal_noise_rate"] == pytest.approx(0.75 * 0.9)
    assert "blocks" not in kinds.partitions()  # this process never imported the outside package
