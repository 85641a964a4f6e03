"""Launcher settings that need no cluster: the GPU each parallel (joblib) job takes, with a fake device
count, and the SLURM launcher's configuration and skip rule. The SLURM path itself runs against a
live cluster in tests/slurm (``make test-slurm``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict

from conftest import REPO
from fedlnl.benchmark import device


def hydra_cfg(*overrides: str):
    """The composed config with its ``hydra`` node, as a launcher sees it."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="fedlnl.conf", version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: pretend n CUDA devices; returns the list ``torch.cuda.set_device`` calls land in."""
    chosen: list = []

    def fake(count: int) -> list:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
        return chosen

    yield fake
    HydraConfig.instance().cfg = None


def as_job(num: int | None) -> None:
    """Hydra's state inside job ``num`` of a multirun (None: a single run), as a launcher sets it."""
    cfg = hydra_cfg()
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN if num is not None else RunMode.RUN
        cfg.hydra.job.num = num if num is not None else 0
    HydraConfig.instance().set_config(cfg)


def auto_device(num: int | None) -> str:
    as_job(num)
    return str(device.resolve_device("auto"))


@pytest.mark.parametrize("count", [2, 3, 4, 8])
def test_as_many_jobs_as_gpus_never_share_one(gpus, count):
    chosen = gpus(count)
    devices = [auto_device(k) for k in range(count)]
    assert sorted(devices) == sorted(f"cuda:{i}" for i in range(count))  # one job per GPU, none idle
    assert [str(d) for d in chosen] == devices  # and each job's plain "cuda" tensors go there too


def test_more_jobs_than_gpus_go_round_robin(gpus):
    gpus(3)
    assert [auto_device(k) for k in range(8)] == [f"cuda:{k % 3}" for k in range(8)]


@pytest.mark.parametrize("count, num", [(1, 0), (1, 5), (4, None), (0, 2)])
def test_one_gpu_a_single_run_or_none(gpus, count, num):
    chosen = gpus(count)
    assert auto_device(num) == ("cpu" if count == 0 else "cuda")  # e.g. a SLURM task's one GPU
    assert chosen == []
    assert str(device.resolve_device("cpu")) == "cpu"


# ------------------------------------------------------------------------------------------- SLURM
def launcher_cfg(*overrides: str):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    return hydra_cfg("hydra/launcher=slurm", *overrides).hydra.launcher


@pytest.mark.parametrize("device, gpus_per_node", [("cpu", 0), ("auto", 1), ("cuda", 1), ("cuda:0", 1)])
def test_slurm_gpus_follow_device(device, gpus_per_node):
    launcher = launcher_cfg(f"device={device}")
    assert launcher._target_ == "hydra_plugins.fedlnl_launchers.slurm_launcher.SlurmLauncher"
    assert launcher.gpus_per_node == gpus_per_node
    assert launcher_cfg(f"device={device}", "hydra.launcher.gpus_per_node=2").gpus_per_node == 2


def test_slurm_threads_follow_cpus_per_task():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra_plugins.fedlnl_launchers.slurm_launcher import SlurmLauncher

    assert SlurmLauncher(cpus_per_task=3)._with_threads(["seed=0"]) == ["seed=0", "threads=3"]
    assert SlurmLauncher(cpus_per_task=3)._with_threads(["seed=0", "threads=1"]) == ["seed=0", "threads=1"]
    assert SlurmLauncher(cpus_per_task=None)._with_threads(["seed=0"]) == ["seed=0"]
    assert launcher_cfg().cpus_per_task == 4


def test_slurm_launcher_submits_nothing_for_a_finished_sweep(tmp_path):
    """The launcher's skip check (on the submitting host) agrees with the runner's config hash: a sweep
    finished by the basic launcher, submitted again to SLURM, needs no cluster at all."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "fedlnl.benchmark.run", "-m", "method=fedavg", "seed=0,1", "debug=tiny",
           "device=cpu", "threads=1", "fl.rounds=1", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "PATH": "/nonexistent"}  # no sbatch: submitting anything would fail
    first = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run([*cmd, "hydra/launcher=slurm", "hydra.launcher.partition=none"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 of 2 cells to submit (2 complete, skipped)" in again.stdout + again.stderr
    assert not (sweep / ".submitit").exists()
    statuses = [json.loads(p.read_text())["status"] for p in sweep.glob("*/summary.json")]
    assert statuses == ["complete", "complete"]


class _Task:
    """A submitted task as the SLURM launcher's wait sees it: ``sacct`` gives it a final state from the
    first look on (``done``), its result file is written or not."""

    class watcher:  # the wait calls update() once per poll; the fake's state needs no refresh
        @staticmethod
        def update():
            pass

    def __init__(self, job_id: str, result):
        self.job_id = job_id
        self.paths = type("Paths", (), {"result_pickle": result})()

    def done(self) -> bool:
        return True


@pytest.mark.parametrize("looks", [["7"], ["7", "7"], ["7", "7", "7"]])
def test_slurm_launcher_waits_for_a_task_the_accounting_ends_while_the_queue_lists_it(tmp_path, monkeypatch, looks):
    """A requeued task waits in the queue while sacct may still give its ended run's final state: the
    launcher waits until squeue no longer lists it, one look per poll, and no longer; a task that wrote
    its result is over at once."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra_plugins.fedlnl_launchers import slurm_launcher as sl

    queue = [*looks, ""]  # squeue's answers: the task listed at len(looks) looks, then gone
    asked = []

    def squeue(cmd, **kwargs):
        asked.append(cmd[0])
        return subprocess.CompletedProcess(cmd, 0, stdout=queue.pop(0) + "\n", stderr="")

    monkeypatch.setattr(sl, "POLL_S", 0)
    monkeypatch.setattr(sl.time, "sleep", lambda s: None)
    monkeypatch.setattr(sl.subprocess, "run", squeue)
    assert sl._wait([_Task("7", tmp_path / "7_result.pkl")]) == set()
    assert asked == ["squeue"] * (len(looks) + 1)  # over at the first look without it, not before
    (tmp_path / "8_result.pkl").write_bytes(b"")
    assert sl._wait([_Task("8", tmp_path / "8_result.pkl")]) == set() and len(asked) == len(looks) + 1


def test_a_locked_cell_is_passed_over_before_hydra_writes_and_a_slurm_task_does_so_too(tmp_path, monkeypatch):
    """``guarded_run_job``: a cell whose lock a live process holds gets a JobReturn saying so and
    nothing written (Hydra's run_job is never called); a SLURM task runs its cell through it."""
    import signal
    import socket

    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra.core.utils import JobReturn, JobStatus

    from fedlnl.benchmark import sweeper
    from hydra_plugins.fedlnl_launchers.slurm_launcher import SlurmLauncher

    cfg = hydra_cfg("seed=1", f"hydra.sweep.dir={tmp_path}")
    with open_dict(cfg):
        cfg.hydra.job.override_dirname = "seed=1"
    cell = tmp_path / "seed=1"
    cell.mkdir()
    (cell / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}) + "\n")
    ret = sweeper.guarded_run_job(hydra_context=None, task_function=None, config=cfg, job_dir_key="hydra.sweep.dir",
                                  job_subdir_key="hydra.sweep.subdir")
    assert ret.status == JobStatus.COMPLETED and ret.return_value.startswith(f"{sweeper.NOT_RUN}: locked: pid {os.getpid()}")
    assert [p.name for p in cell.iterdir()] == [".lock"]

    from hydra_plugins.fedlnl_launchers import slurm_launcher

    seen, task = [], slurm_launcher._SUBMITIT_GLOBALS  # what the plugin's __call__ reads run_job from
    monkeypatch.setitem(task, "run_job", task["run_job"])  # restored after the test
    monkeypatch.setattr(SlurmLauncher.__mro__[1], "__call__",
                        lambda self, *a: seen.append(task["run_job"]) or JobReturn(status=JobStatus.COMPLETED))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        SlurmLauncher(cpus_per_task=None)(["seed=1"], "hydra.sweep.dir", 0, "job_id_for_0", {})
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert seen == [sweeper.guarded_run_job]
