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
def test_method_runs_end_to_end_as_planned_and_resumes_mid_run(tmp_path, monkeypatch, method):
    """A tiny run of every method: complete; its cost as ``dry_run`` planned it (participations,
    local steps, uploaded bytes: equal where the plan is exact, within it where it is a bound); and,
    interrupted in the middle (the time-based checkpoint after every round), resumed to exactly the
    same metrics."""
    from fedlnl.benchmark import runner as runmod
    from fedlnl.benchmark.plan import compare, plan_config

    extra = [*NOISY, "checkpoint_minutes=1e-9"]  # a checkpoint after every round: resume from any round
    planned = plan_config(compose_cfg([f"method={method}", "debug=tiny", "logger=none", "device=cpu", *extra]), "cnn")
    s = run_tiny(tmp_path / "alone" / "straight", extra, method)  # apart: FedCorr's shared prefix would start "resumed" at stage 3
    assert s["status"] == "complete", s
    assert 0.0 <= s["best_acc"] <= 1.0 and s["best_acc"] >= s["final_acc"] - 1e-12
    assert s["rounds_run"] == s["total_rounds"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "alone" / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert rows and all({"round", "acc", "comm_cost"} <= set(r) for r in rows)
    assert [r["comm_cost"] for r in rows] == sorted(r["comm_cost"] for r in rows)
    assert compare(planned.as_dict(), s) == [], (planned.as_dict(), s)

    crash_at, real = max(2, s["total_rounds"] // 2 + 1), runmod.Runner.evaluate

    def crash(self, state, rnd, *a):
        if rnd + 1 == crash_at:
            raise KeyboardInterrupt
        return real(self, state, rnd, *a)

    monkeypatch.setattr(runmod.Runner, "evaluate", crash)
    with pytest.raises(KeyboardInterrupt):
        run_tiny(tmp_path / "resumed", extra, method)
    monkeypatch.setattr(runmod.Runner, "evaluate", real)
    resumed = run_tiny(tmp_path / "resumed", extra, method)
    assert (tmp_path / "resumed" / "metrics.jsonl").read_bytes() == (tmp_path / "alone" / "straight" / "metrics.jsonl").read_bytes()
    keys = ("best_acc", "final_acc", "comm_cost", "local_steps", "bytes_up", "detection", "federation_hash")
    written = [json.loads((d / "summary.json").read_text()) for d in (tmp_path / "resumed", tmp_path / "alone" / "straight")]
    assert {k: written[0][k] for k in keys} == {k: written[1][k] for k in keys}  # as written: NaN scores are null
    assert resumed["status"] == "complete"
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

    monkeypatch.setattr("fedlnl.datasets.federation.build_federation", scrambled)
    other = run_tiny(tmp_path / "b", NOISY, method)
    assert other["best_acc"] == base["best_acc"] and other["final_acc"] == base["final_acc"]
    assert other["federation_hash"] == base["federation_hash"]
