"""The GPU tier (``pytest -m gpu``): runs on a CUDA device, skipped as one line without one.

Every method at tiny size on the device; one strict cell twice, byte for byte; a killed run resumed
exactly; host placement equal to device placement; a cell started on the CPU refused on CUDA. The
policy behind it is tested on the CPU in test_gpu_policy.py.
"""
from __future__ import annotations

import json

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from conftest import compose_cfg, method_names  # noqa: E402
from test_robustness import cli  # noqa: E402

pytestmark = pytest.mark.gpu
TINY = ["debug=tiny", "logger=none", "threads=1", "noise.rho_tau=[0.6,0.5]"]


def run_cli(tmp_path, run_dir, *overrides):
    code, out, err = cli([*TINY, *overrides, f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0, err[-2000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("method", method_names())
def test_every_method_runs_on_the_device(tmp_path, method):
    summary = run_cli(tmp_path, tmp_path / "run", f"method={method}", "device=cuda")
    assert summary["status"] == "complete"
    assert summary["identity"]["device_kind"] == "cuda" and summary["identity"]["gpu"]
    assert summary["identity"]["determinism"] == "strict"
    assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark


@pytest.mark.parametrize("method", ["fedavg", "rofl", "arfl", "fednoro"])
def test_a_strict_cell_twice_is_byte_identical(tmp_path, method):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run_dir in runs:
        run_cli(tmp_path, run_dir, f"method={method}", "device=cuda", "determinism=strict")
    assert (runs[0] / "metrics.jsonl").read_bytes() == (runs[1] / "metrics.jsonl").read_bytes()


def test_host_placement_equals_device_placement_on_the_device(tmp_path):
    for where in ("device", "host"):
        run_cli(tmp_path, tmp_path / where, "method=fedavg", "device=cuda", f"data_placement={where}")
    assert (tmp_path / "host" / "metrics.jsonl").read_bytes() == (tmp_path / "device" / "metrics.jsonl").read_bytes()


def test_a_killed_run_resumes_exactly_on_the_device(tmp_path):
    from fedlnl.benchmark import runner as runmod

    cfg = compose_cfg([*TINY, "method=fedavg", "device=cuda", "fl.rounds=4", "checkpoint_every=1"])
    runmod.run(cfg, tmp_path / "straight", "fedavg")
    real = runmod.Runner.evaluate

    def crash(self, state, rnd, *a, **k):
        if rnd == 2:
            raise KeyboardInterrupt
        return real(self, state, rnd, *a, **k)

    runmod.Runner.evaluate = crash
    try:
        with pytest.raises(KeyboardInterrupt):
            runmod.run(cfg, tmp_path / "resumed", "fedavg")
    finally:
        runmod.Runner.evaluate = real
    runmod.run(cfg, tmp_path / "resumed", "fedavg")

    def rows(d):
        return [{k: v for k, v in json.loads(line).items() if k != "time_s"}
                for line in (d / "metrics.jsonl").read_text().splitlines()]

    assert rows(tmp_path / "resumed") == rows(tmp_path / "straight")


def test_a_cell_started_on_the_cpu_is_not_continued_on_cuda(tmp_path):
    run_dir = tmp_path / "run"
    run_cli(tmp_path, run_dir, "method=fedavg", "device=cpu")
    before = (run_dir / "summary.json").read_bytes()
    code, out, err = cli([*TINY, "method=fedavg", "device=cuda", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 2 and "(recorded -> now: device kind cpu -> cuda)" in err, (code, out, err)
    assert (run_dir / "summary.json").read_bytes() == before
