"""The GPU tier (``pytest -m gpu``): runs on a CUDA device, skipped as one line without one.

Every method exactly two rounds on the device (stopped after its second round as a signal would
stop it); one strict cell run twice, in two processes, compared byte for byte; a killed run resumed
exactly; host placement equal to device placement; a cell started on the CPU, complete or killed,
refused on CUDA. The policy behind it is tested on the CPU in test_gpu_policy.py.

``FEDLNL_GPU_TIER_DEVICE=cpu pytest -m gpu tests/test_gpu.py`` runs the tier's own logic on the CPU
(a check of these tests, not of a GPU: the refusal on CUDA needs a device and is skipped).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

DEVICE = os.environ.get("FEDLNL_GPU_TIER_DEVICE", "cuda")
if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from conftest import compose_cfg, method_names  # noqa: E402
from test_compile import deferred_images_equal_eager_ones, whole_step_matches_torch_sgd  # noqa: E402
from test_robustness import cli  # noqa: E402

from fedlnl.benchmark import runner as runmod  # noqa: E402

pytestmark = pytest.mark.gpu
TINY = ["debug=tiny", "logger=none", "threads=1", "noise.rho_tau=[0.6,0.5]"]


def run_cli(tmp_path, run_dir, *overrides):
    code, out, err = cli([*TINY, *overrides, f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0, err[-2000:]
    return json.loads((run_dir / "summary.json").read_text())


def rows(run_dir):
    """metrics.jsonl without its wall-clock field."""
    return [{k: v for k, v in json.loads(line).items() if k != "time_s"}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def killed_at_round(monkeypatch, stop_round: int):
    """``Runner.evaluate`` raising KeyboardInterrupt at round ``stop_round`` (0-based), after the
    checkpoints of the rounds before it: a run killed mid-schedule."""
    real = runmod.Runner.evaluate

    def crash(self, state, rnd, *a, **k):
        if rnd == stop_round:
            raise KeyboardInterrupt
        return real(self, state, rnd, *a, **k)

    monkeypatch.setattr(runmod.Runner, "evaluate", crash)
    return lambda: monkeypatch.setattr(runmod.Runner, "evaluate", real)


@pytest.mark.parametrize("method", method_names())
def test_every_method_runs_two_rounds_on_the_device(tmp_path, monkeypatch, method):
    """Two rounds of the method's own schedule (its first stage for a staged method): after the second
    round's evaluation the process sends itself SIGUSR2, so the runner finishes that round, saves a
    checkpoint and exits with 128 + SIGUSR2, as under a scheduler's stop signal."""
    real = runmod.Runner.evaluate

    def evaluate(self, state, rnd, *a, **k):
        row = real(self, state, rnd, *a, **k)
        if rnd == 1:
            os.kill(os.getpid(), signal.SIGUSR2)
        return row

    monkeypatch.setattr(runmod.Runner, "evaluate", evaluate)
    cfg = compose_cfg([*TINY, f"method={method}", f"device={DEVICE}"])
    with pytest.raises(SystemExit) as stopped:
        runmod.run(cfg, tmp_path, method)
    assert stopped.value.code == 128 + signal.SIGUSR2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["round"] for r in rows(tmp_path)] == [1, 2] and summary["rounds_run"] == 2
    assert summary["status"] in ("interrupted", "complete"), summary  # complete: a schedule of 2 rounds
    assert summary["local_steps"] > 0
    assert all(r["acc"] is not None for r in rows(tmp_path))
    assert summary["identity"]["device_kind"] == DEVICE and summary["identity"]["determinism"] == "strict"
    if DEVICE == "cuda":
        assert summary["identity"]["gpu"]
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark


def run_in_a_process(tmp_path, run_dir, *overrides):
    """``fedlnl-run`` in a process of its own: no state of this one (cuDNN, allocator, RNG) shared."""
    cmd = [sys.executable, "-c", "from fedlnl.benchmark.run import main; main()", *TINY, *overrides,
           f"hydra.run.dir={run_dir}"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return (run_dir / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("method", ["fedavg", "rofl", "arfl", "fednoro"])
def test_a_strict_cell_twice_is_byte_identical(tmp_path, method):
    runs = [run_in_a_process(tmp_path, tmp_path / name, f"method={method}", f"device={DEVICE}", "determinism=strict")
            for name in ("a", "b")]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("method", ["fedavg", "dividemix", "fedcorr"])
def test_host_placement_equals_device_placement_on_the_device(tmp_path, method):
    for where in ("device", "host"):
        run_cli(tmp_path, tmp_path / where, f"method={method}", f"device={DEVICE}", f"data_placement={where}")
    assert (tmp_path / "host" / "metrics.jsonl").read_bytes() == (tmp_path / "device" / "metrics.jsonl").read_bytes()


def test_the_compiled_step_on_the_device_is_within_float_tolerance_of_eager(tmp_path):
    """``compile=true`` on the device: CUDA graphs (``reduce-overhead``) for the whole step of FedAvg's
    plain cross-entropy SGD. Losses within 1e-3 and accuracy within 1 point of the eager run
    (tests/test_compile.py's tolerance on the CPU); batch norm, step by step, in the next test."""
    done = {flag: run_cli(tmp_path, tmp_path / flag, "method=fedavg", f"device={DEVICE}", f"compile={flag}")
            for flag in ("false", "true")}
    assert done["true"]["compile"] == ("reduce-overhead" if DEVICE == "cuda" else "default")
    for e, f in zip(rows(tmp_path / "false"), rows(tmp_path / "true"), strict=True):
        assert abs(f["loss"] - e["loss"]) <= 1e-3 * abs(e["loss"]) and abs(f["acc"] - e["acc"]) <= 0.01, (e, f)


def test_the_compiled_whole_step_with_batch_norm_on_the_device():
    whole_step_matches_torch_sgd(DEVICE)


def test_the_images_the_compiled_step_computes_on_the_device_equal_the_eager_ones():
    deferred_images_equal_eager_ones({"crop": 32, "pad": 4, "flip": True}, DEVICE)


def test_a_killed_run_resumes_exactly_on_the_device(tmp_path, monkeypatch):
    cfg = compose_cfg([*TINY, "method=fedavg", f"device={DEVICE}", "fl.rounds=4", "checkpoint_every=1"])
    runmod.run(cfg, tmp_path / "straight", "fedavg")
    restore = killed_at_round(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        runmod.run(cfg, tmp_path / "resumed", "fedavg")
    restore()
    assert [r["round"] for r in rows(tmp_path / "resumed")] == [1, 2]  # killed in round 3
    (tmp_path / "resumed" / "summary.json").unlink()  # as after SIGKILL: only the checkpoint is left
    runmod.run(cfg, tmp_path / "resumed", "fedavg")
    assert rows(tmp_path / "resumed") == rows(tmp_path / "straight")
    assert [r["round"] for r in rows(tmp_path / "straight")] == [1, 2, 3, 4]


@pytest.mark.parametrize("left", ["complete", "killed"])
def test_a_cell_started_on_the_cpu_is_not_continued_on_cuda(tmp_path, monkeypatch, left):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (the tier runs on the CPU: FEDLNL_GPU_TIER_DEVICE=cpu)")
    run_dir = tmp_path / "run"
    if left == "complete":
        run_cli(tmp_path, run_dir, "method=fedavg", "device=cpu")
    else:
        cfg = compose_cfg([*TINY, "method=fedavg", "device=cpu", "fl.rounds=4", "checkpoint_every=1"])
        restore = killed_at_round(monkeypatch, 2)
        with pytest.raises(KeyboardInterrupt):
            runmod.run(cfg, run_dir, "fedavg")
        restore()
        (run_dir / "summary.json").unlink()
        assert (run_dir / "checkpoint.pt").exists()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    extra = [] if left == "complete" else ["fl.rounds=4", "checkpoint_every=1"]
    code, out, err = cli([*TINY, "method=fedavg", "device=cuda", *extra, f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 2 and "(recorded -> now: device kind cpu -> cuda)" in err, (code, out, err)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before  # nothing written
