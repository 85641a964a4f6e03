"""Every method YAML runs end to end at tiny size, on the same federation, without clean labels.

Parametrized over fedlnl/conf/method/*.yaml: a new method is covered as soon as its YAML exists.
"""
import json

import hydra
import pytest

from conftest import compose_cfg, method_names, run_tiny
from fedlnl.methods.common.protocol import FAMILIES

NOISY = ["noise.rho=0.5", "noise.tau=0.5"]


@pytest.mark.parametrize("method", method_names())
def test_method_runs_end_to_end(tmp_path, method):
    s = run_tiny(tmp_path, NOISY, method)
    assert s["status"] == "complete", s
    assert 0.0 <= s["best_acc"] <= 1.0 and s["best_acc"] >= s["final_acc"] - 1e-12
    assert s["rounds_run"] == s["total_rounds"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and all({"round", "acc", "comm_cost"} <= set(r) for r in rows)
    assert [r["comm_cost"] for r in rows] == sorted(r["comm_cost"] for r in rows)
    assert s["family"] in FAMILIES


@pytest.mark.parametrize("method", method_names())
def test_every_method_class_names_its_own_family(method):
    """A subclass must not inherit its parent's family by accident: each class declares its own."""
    cls = hydra.utils.get_class(compose_cfg([f"method={method}"]).method._target_)
    assert "family" in vars(cls) and cls.family in FAMILIES, cls


@pytest.mark.parametrize("method", method_names())
def test_method_never_uses_clean_labels(tmp_path, method, monkeypatch):
    """Scrambling the oracle's clean labels must not change what a method does."""
    import torch

    from fedlnl.datasets import federation as fedmod

    base = run_tiny(tmp_path / "a", NOISY, method)
    real_build = fedmod.build_federation

    def scrambled(*args, **kwargs):
        fed = real_build(*args, **kwargs)
        oracle = fedmod.Oracle(**{**fed.oracle.__dict__})
        oracle.clean_labels = torch.roll(fed.oracle.clean_labels, 1)
        return fedmod.Federation(**{**fed.__dict__, "oracle": oracle})

    monkeypatch.setattr("fedlnl.benchmark.run.build_federation", scrambled)
    other = run_tiny(tmp_path / "b", NOISY, method)
    assert other["best_acc"] == base["best_acc"] and other["final_acc"] == base["final_acc"]
    assert other["federation_hash"] == base["federation_hash"]
