"""Shared prefixes: FedCorr's stage-3 variants start stage 3 from the state the first run of the same
stages 1-2 saved (``reuse_prefix``), with exactly the numbers they compute alone, and never from the
state of another config, code version or device identity."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from conftest import compose_cfg, crash_after, numbers, rows_of

# θ = 0.1: the weak tiny model relabels in stages 1-2, so the corrected labels are part of the state
NOISY = ["noise.rho=0.6", "noise.tau=0.5", "method.theta=0.1"]


def tiny(method: str, *extra):
    return compose_cfg([f"method={method}", "debug=tiny", "logger=none", "device=cpu", *NOISY, *extra])


def diagnostics(run_dir) -> dict:
    return json.loads((run_dir / "diagnostics.json").read_text())


@pytest.fixture
def evaluated(monkeypatch):
    """The rounds this process evaluates (every round at debug=tiny): a run that starts from a
    prefix evaluates only the rounds after it."""
    from fedlnl.benchmark import runner as runmod

    seen: list[int] = []
    real = runmod.Runner.evaluate

    def spy(self, state, rnd, losses, agg):
        seen.append(rnd + 1)
        return real(self, state, rnd, losses, agg)

    monkeypatch.setattr(runmod.Runner, "evaluate", spy)
    return seen


def prefixes(sweep) -> list:
    return sorted(p.name for p in (sweep / ".prefixes").iterdir()) if (sweep / ".prefixes").is_dir() else []


@pytest.mark.parametrize("variant", ["fedcorr_median", "fedcorr_fedprox", "fedcorr_feddyn", "fedcorr_poc"])
def test_a_stage3_variant_from_the_shared_prefix_has_the_numbers_it_computes_alone(tmp_path, caplog, evaluated,
                                                                                   variant):
    from fedlnl.benchmark.runner import run

    sweep = tmp_path / "sweep"
    first = run(tiny("fedcorr"), sweep / "fedcorr", "fedcorr")
    start3 = first["total_rounds"] - 2  # debug=tiny: T3 = 2
    assert first["prefix"] is None and len(prefixes(sweep)) == 1
    saved = torch.load(sweep / ".prefixes" / prefixes(sweep)[0], weights_only=False)
    assert saved["round"] + 1 == start3 and saved["saved_by"] == "fedcorr"
    assert saved["scorer"][0] > 0  # labels were corrected before stage 3

    evaluated.clear()
    with caplog.at_level(logging.INFO, logger="fedlnl"):
        forked = run(tiny(variant), sweep / variant, variant)
    assert f"starting after round {start3} of {first['total_rounds']} from the shared prefix" in caplog.text
    assert evaluated == list(range(start3 + 1, first["total_rounds"] + 1))  # stages 1-2 not trained again
    assert forked["prefix"]["saved_by"] == "fedcorr" and forked["prefix"]["rounds"] == start3
    assert forked["wall_time_s"] >= forked["prefix"]["elapsed_s"]  # the method's cost, prefix included
    assert forked["cpu_time_s"] >= forked["prefix"]["cpu_time_s"] > 0

    alone = run(tiny(variant, "reuse_prefix=false"), tmp_path / "alone" / variant, variant)
    assert alone["prefix"] is None and prefixes(tmp_path / "alone") == []  # false: neither saved nor loaded
    assert rows_of(sweep / variant) == rows_of(tmp_path / "alone" / variant)
    assert numbers(forked, ("local_steps",)) == numbers(alone, ("local_steps",))
    assert diagnostics(sweep / variant) == diagnostics(tmp_path / "alone" / variant)
    # the variant's stages 1-2 are FedCorr's; its stage 3 is its own
    assert rows_of(sweep / variant)[:start3] == rows_of(sweep / "fedcorr")[:start3]
    assert rows_of(sweep / variant)[start3:] != rows_of(sweep / "fedcorr")[start3:]
    assert len(prefixes(sweep)) == 1  # the variant found it: nothing new saved


@pytest.mark.parametrize("other", [
    ["seed=1"],                        # another federation
    ["method.kappa=0.3"],              # another stage-1/2 value
    ["method.T3=3"],                   # another stage-3 length (the context's total_rounds counts it)
    ["determinism=fast"],              # another device identity
    ["threads=2"],                     # another thread count (part of the config hash)
], ids=lambda o: o[0])
def test_a_prefix_of_another_config_or_identity_is_never_loaded(tmp_path, caplog, other):
    from fedlnl.benchmark.runner import run

    run(tiny("fedcorr"), tmp_path / "fedcorr", "fedcorr")
    with caplog.at_level(logging.INFO, logger="fedlnl"):
        s = run(tiny("fedcorr_median", *other), tmp_path / "median", "fedcorr_median")
    assert s["prefix"] is None and "shared prefix" not in caplog.text
    assert len(prefixes(tmp_path)) == 2  # it computed its own and saved it under its own key


def test_a_prefix_of_another_code_version_is_never_loaded(tmp_path, monkeypatch):
    from fedlnl.benchmark import rundir, runner as runmod

    runmod.run(tiny("fedcorr"), tmp_path / "fedcorr", "fedcorr")
    monkeypatch.setattr(rundir, "code_hash", lambda: "another version")
    s = runmod.run(tiny("fedcorr_median"), tmp_path / "median", "fedcorr_median")
    assert s["prefix"] is None and len(prefixes(tmp_path)) == 2


def test_a_prefix_of_another_federation_content_is_never_loaded(tmp_path, monkeypatch):
    """Same config, other data (e.g. a label file replaced under the same dataset name): the
    federation's content hash differs, so the prefix is not the run's."""
    from fedlnl.benchmark import runner as runmod

    runmod.run(tiny("fedcorr"), tmp_path / "fedcorr", "fedcorr")
    real = runmod.Runner._prefix

    def other_data(self):
        self.fed.hash = "other content"
        return real(self)

    monkeypatch.setattr(runmod.Runner, "_prefix", other_data)
    s = runmod.run(tiny("fedcorr_median"), tmp_path / "median", "fedcorr_median")
    assert s["prefix"] is None and len(prefixes(tmp_path)) == 2


def test_an_unreadable_prefix_is_computed_and_replaced(tmp_path, caplog):
    from fedlnl.benchmark.runner import run

    run(tiny("fedcorr"), tmp_path / "fedcorr", "fedcorr")
    path = tmp_path / ".prefixes" / prefixes(tmp_path)[0]
    path.write_bytes(b"truncated")
    with caplog.at_level(logging.INFO, logger="fedlnl"):
        s = run(tiny("fedcorr_median"), tmp_path / "median", "fedcorr_median")
    assert s["prefix"] is None and "is unreadable" in caplog.text
    assert torch.load(path, weights_only=False)["saved_by"] == "median"  # replaced by a whole one
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    again = run(tiny("fedcorr_median"), tmp_path / "median2", "fedcorr_median")
    assert again["prefix"]["saved_by"] == "median" and rows_of(tmp_path / "median2") == rows_of(tmp_path / "median")


def test_a_run_resumes_from_its_own_checkpoint_before_a_prefix(tmp_path, monkeypatch, caplog):
    """A variant interrupted in stage 1 resumes from its checkpoint (round 4), not from the prefix."""
    from fedlnl.benchmark import runner as runmod

    cfg = tiny("fedcorr_median", "checkpoint_every=2")
    restore = crash_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        runmod.run(cfg, tmp_path / "median", "fedcorr_median")
    restore()
    runmod.run(tiny("fedcorr"), tmp_path / "fedcorr", "fedcorr")  # the prefix now exists
    with caplog.at_level(logging.INFO, logger="fedlnl"):
        s = runmod.run(cfg, tmp_path / "median", "fedcorr_median")
    assert s["status"] == "complete", (s, caplog.text[-3000:])
    assert "resuming after round 4 of" in caplog.text and "shared prefix" not in caplog.text, caplog.text[-3000:]
    assert s["prefix"] is None


def test_methods_without_a_shared_prefix_save_none(tmp_path):
    from fedlnl.benchmark.runner import run

    run(compose_cfg(["method=fedavg", "debug=tiny", "logger=none", "device=cpu", "fl.rounds=3"]), tmp_path / "fedavg", "fedavg")
    run(tiny("fedcorr", "method.usual_training=false"), tmp_path / "no_stage3", "fedcorr")  # nothing after stage 2
    assert prefixes(tmp_path) == []
