"""Nothing lost, even by Ctrl-C (issue 34): SIGINT is a stop signal like SIGTERM, a second one while
saving changes nothing, a local joblib sweep stops cleanly whichever of its processes is signalled,
a cell locked by another process gets nothing written, and a killed run's directory is refused to
another config with its checkpoint kept.

Signals go to real subprocesses; each test waits for a round line or a file, never a fixed time."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import compose_cfg

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
TINY = ["method=fedavg", "debug=tiny", "logger=none", "device=cpu", "threads=1"]


def fedlnl_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "fedlnl.benchmark.run", *args]


def start(cmd: list[str], cwd: Path, group: bool = False) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=group)


def rounds_logged(run_dir: Path) -> int:
    try:
        return len((run_dir / "timing.jsonl").read_text().splitlines())
    except OSError:
        return 0


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the process exited before {what}:\n{proc.communicate()[0][-3000:]}")
        assert time.time() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.05)


def wait_group_gone(pgid: int, timeout: float = 120) -> None:
    """Every process of the sweep's process group has ended (no worker left training)."""
    deadline = time.time() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.time() < deadline, "a process of the stopped sweep is still running"
        time.sleep(0.1)


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def straight(run_dir: Path, rounds: int, seed: int = 0) -> Path:
    """The same config run uninterrupted in this process: the metrics a resume must end with."""
    from fedlnl.benchmark.runner import run

    run(compose_cfg([*TINY, f"fl.rounds={rounds}", f"seed={seed}"]), run_dir, "fedavg")
    return run_dir


def errors(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "error:" in ln]


# ------------------------------------------------------------------------------- one run
def test_ctrl_c_saves_the_round_exits_130_and_the_rerun_resumes_byte_identical(tmp_path):
    """Default checkpoint settings (none due yet): Ctrl-C finishes the round, saves checkpoint.pt,
    marks the run interrupted and exits with 130, no traceback; the same command resumes."""
    run_dir = tmp_path / "run"
    cmd = fedlnl_run(*TINY, "fl.rounds=20", f"hydra.run.dir={run_dir}")
    proc = start(cmd, tmp_path)
    wait_for(lambda: rounds_logged(run_dir) >= 3, proc, "3 rounds")
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    summary = summary_of(run_dir)
    done = summary["rounds_run"]
    assert summary["status"] == "interrupted" and 3 <= done < 20, summary
    assert summary["error"] == f"stopped by SIGINT after round {done} of 20; resumes from checkpoint.pt when run again"
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["round"] + 1 == done
    assert not (run_dir / ".lock").exists() and "SIGINT received: finishing the current round" in out

    again = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming after round {done} of 20" in again.stdout + again.stderr
    ref = straight(tmp_path / "straight", 20)
    assert (run_dir / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()
    assert summary_of(run_dir)["status"] == "complete" and not (run_dir / "checkpoint.pt").exists()


def test_a_second_ctrl_c_while_the_checkpoint_is_written_changes_nothing(tmp_path, monkeypatch, caplog):
    """The defined behaviour: a second stop signal while the round finishes or while checkpoint.pt
    is written is one warning line; the checkpoint is written whole, the run exits 130 as after one,
    and the resume ends with the uninterrupted run's metrics."""
    import logging

    from fedlnl.benchmark import runner as runmod

    cfg = compose_cfg([*TINY, "fl.rounds=6"])
    evaluate, save = runmod.Runner.evaluate, runmod.Runner.save_checkpoint

    def ctrl_c_in_round_3(self, state, rnd, *a):
        row = evaluate(self, state, rnd, *a)
        if rnd == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return row

    def ctrl_c_while_saving(self, *a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return save(self, *a, **k)

    monkeypatch.setattr(runmod.Runner, "evaluate", ctrl_c_in_round_3)
    monkeypatch.setattr(runmod.Runner, "save_checkpoint", ctrl_c_while_saving)
    run_dir = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="fedlnl"), pytest.raises(SystemExit) as exit_:
        runmod.run(cfg, run_dir, "fedavg")
    assert exit_.value.code == 130
    assert caplog.text.count("SIGINT received: finishing the current round") == 1
    assert caplog.text.count("SIGINT received again: already stopping") == 1
    assert summary_of(run_dir)["status"] == "interrupted" and summary_of(run_dir)["rounds_run"] == 3
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["round"] + 1 == 3
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint.pt", "diagnostics.json", "metrics.jsonl",
                                                         "summary.json", "timing.jsonl"]  # no temporary file

    monkeypatch.undo()
    from fedlnl.benchmark import stop

    monkeypatch.setattr(stop, "received", None)  # a new process would start unmarked
    assert runmod.run(cfg, run_dir, "fedavg")["status"] == "complete"
    ref = straight(tmp_path / "straight", 6)
    assert (run_dir / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()


# ------------------------------------------------------------------------------- joblib sweeps
def joblib_sweep(sweep: Path, rounds: int, seeds: str) -> tuple[list[str], dict[int, Path]]:
    cmd = fedlnl_run("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}", *TINY,
                     f"fl.rounds={rounds}", f"seed={seeds}")
    cells = {int(s): sweep / f"debug=tiny,fl.rounds={rounds},method=fedavg,seed={s}" for s in seeds.split(",")}
    return cmd, cells


def both_train(cells: dict[int, Path]):
    # both workers train (seeds 0 and 1 logged 2 rounds): a worker still loading its data is not the case tested
    return lambda: rounds_logged(cells[0]) >= 2 and rounds_logged(cells[1]) >= 2


def stop_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("fedlnl-run: stopped by")]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


@pytest.mark.slow  # CI runs it (make test-slow); the default suite stays short
def test_ctrl_c_to_a_joblib_sweep_saves_each_running_cell_and_exits_130(tmp_path):
    """Ctrl-C in a terminal reaches the whole process group: each worker's cell saves its round, the
    queued cell never starts (Hydra writes nothing for it), the sweep exits 130 with one line saying
    how to resume, no process is left, and the same command resumes to the uninterrupted numbers."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cmd, cells = joblib_sweep(tmp_path / "sweep", 30, "0,1,2")
    proc = start(cmd, tmp_path, group=True)
    wait_for(both_train(cells), proc, "both workers' second round")
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 130, out[-3000:]
    assert stop_line(out) == ("fedlnl-run: stopped by SIGINT: 2 cell(s) saved their round (status interrupted), "
                              "1 not started, 0 complete of 3; run the same command again to resume (complete "
                              "cells are skipped)")
    assert "Traceback" not in out and "TerminatedWorkerError" not in out
    for seed in (0, 1):
        assert summary_of(cells[seed])["status"] == "interrupted" and (cells[seed] / "checkpoint.pt").is_file()
    assert not cells[2].exists()
    wait_group_gone(proc.pid)

    again = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    for seed in (0, 1):
        ref = straight(tmp_path / f"straight{seed}", 30, seed)
        assert (cells[seed] / "metrics.jsonl").read_bytes() == (ref / "metrics.jsonl").read_bytes()
    assert all(summary_of(c)["status"] == "complete" for c in cells.values())


@pytest.mark.slow  # CI runs it (make test-slow); the default suite stays short
def test_kill_of_a_joblib_sweep_stops_its_workers_instead_of_orphaning_them(tmp_path):
    """``kill <sweep pid>`` reaches the launcher alone: it passes the signal on to its workers, each
    saves its cell, and the sweep exits 143 once they are done: no worker goes on training."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cmd, cells = joblib_sweep(tmp_path / "sweep", 300, "0,1,2")
    proc = start(cmd, tmp_path, group=True)
    wait_for(both_train(cells), proc, "both workers' second round")
    os.kill(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 143, out[-3000:]
    assert stop_line(out).startswith("fedlnl-run: stopped by SIGTERM: 2 cell(s) saved their round")
    assert "fedlnl-run: SIGTERM received: each running cell finishes its round, saves and stops (2 workers told)" in out
    for seed in (0, 1):
        summary = summary_of(cells[seed])
        assert summary["status"] == "interrupted" and summary["rounds_run"] < 300, summary
    wait_group_gone(proc.pid)


@pytest.mark.slow  # CI runs it (make test-slow); the default suite stays short
def test_sigterm_to_one_joblib_worker_stops_its_cell_and_lets_the_other_finish(tmp_path):
    """A SIGTERM to one worker (its pid is in the cell's .lock) stops that cell, saved; the other
    worker's cell completes; the sweep ends with one line and 143, not TerminatedWorkerError."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cmd, cells = joblib_sweep(tmp_path / "sweep", 30, "0,1")
    proc = start(cmd, tmp_path, group=True)
    wait_for(both_train(cells), proc, "both workers' second round")
    os.kill(json.loads((cells[0] / ".lock").read_text())["pid"], signal.SIGTERM)
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 143, out[-3000:]
    assert "TerminatedWorkerError" not in out and "Traceback" not in out
    assert summary_of(cells[0])["status"] == "interrupted" and summary_of(cells[1])["status"] == "complete"
    assert stop_line(out).startswith("fedlnl-run: stopped by SIGTERM: 1 cell(s) saved their round (status "
                                     "interrupted), 0 not started, 1 complete of 2")
    wait_group_gone(proc.pid)


@pytest.mark.slow  # CI runs it (make test-slow); the default suite stays short
def test_kill_of_a_tune_saves_its_trials_and_the_rerun_ends_as_a_tune_never_stopped(tmp_path):
    """``experiment=tune`` runs its trials through the same joblib pool: ``kill <tune pid>`` makes each
    running trial save its round, the tune exits 143 with one line and writes no results (it was
    killed outright, its workers left training); the same command resumes, and the study ends with
    the values, the chosen trial and the runs of a tune never stopped."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    pytest.importorskip("optuna")

    def tune(root: Path) -> list[str]:
        return fedlnl_run("-m", "experiment=tune", "tune.trials=2", "fl.rounds=60", f"tune.root={root}", *TINY)

    study = tmp_path / "r" / "quickstart-tiny" / "fedavg"
    trials = lambda: sorted(p.parent for p in study.glob("*/timing.jsonl"))  # noqa: E731
    proc = start(tune(tmp_path / "r"), tmp_path, group=True)
    wait_for(lambda: len(trials()) == 2 and all(rounds_logged(t) >= 2 for t in trials()), proc,
             "both trials' second round")
    os.kill(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 143, out[-3000:]
    assert stop_line(out) == ("fedlnl-run: stopped by SIGTERM: tune fedavg: 2 trial(s) saved their round (status "
                              "interrupted), 0 of 2 trials complete; run the same command again to resume (complete "
                              "trials are read, not trained again)")
    assert "Traceback" not in out
    assert [summary_of(t)["status"] for t in trials()] == ["interrupted"] * 2
    assert not (study / "optimization_results.yaml").exists()
    wait_group_gone(proc.pid)

    for root in ("r", "ref"):  # the resume, then the same tune never stopped
        done = subprocess.run(tune(tmp_path / root), cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    ref = tmp_path / "ref" / "quickstart-tiny" / "fedavg"
    results = [(d / "optimization_results.yaml").read_text().replace(f"tune.root={tmp_path / r}", "")
               for d, r in ((study, "r"), (ref, "ref"))]
    assert results[0] == results[1]
    for t in trials():
        assert (t / "metrics.jsonl").read_bytes() == (ref / t.name / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_cell_locked_by_a_live_process_gets_nothing_written(tmp_path, launcher):
    """Hydra writes a cell's .hydra/ and log before the task runs: a cell another live process holds
    is passed over before that, so its holder's files stay byte for byte."""
    if launcher == "joblib":
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    held = sweep / "debug=tiny,fl.rounds=2,method=fedavg,seed=1"
    (held / ".hydra").mkdir(parents=True)
    (held / ".hydra" / "config.yaml").write_text("the holder's config\n")
    (held / "run.log").write_text("the holder's log\n")
    (held / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}) + "\n")  # alive
    before = {p.relative_to(held): p.read_bytes() for p in held.rglob("*") if p.is_file()}
    parallel = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    proc = subprocess.run(fedlnl_run("-m", *parallel, *TINY, "fl.rounds=2", "seed=0,1", f"hydra.sweep.dir={sweep}"),
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.relative_to(held): p.read_bytes() for p in held.rglob("*") if p.is_file()} == before
    assert f"[fedlnl] skipping {held}: another process (pid {os.getpid()}" in proc.stderr
    assert summary_of(sweep / "debug=tiny,fl.rounds=2,method=fedavg,seed=0")["status"] == "complete"


# ------------------------------------------------------------------------------- killed runs
@pytest.mark.parametrize("checkpoints", ["checkpoint_every=2", "checkpoint_minutes=0"])
def test_a_killed_run_is_refused_to_another_config_and_its_checkpoint_kept(tmp_path, checkpoints):
    """kill -9 leaves no summary: its checkpoint (or, before the first one, its rows and the lock it
    left) still names its config, so another config is refused with one line, nothing is touched,
    and the same config resumes from the checkpoint."""
    run_dir = tmp_path / "run"
    cmd = fedlnl_run(*TINY, "fl.rounds=40", checkpoints, f"hydra.run.dir={run_dir}")
    proc = start(cmd, tmp_path)
    wait_for(lambda: rounds_logged(run_dir) >= 5 and ((run_dir / "checkpoint.pt").is_file()
                                                       or checkpoints.startswith("checkpoint_minutes")),
             proc, "5 rounds")
    proc.kill()
    proc.communicate(timeout=60)
    assert not (run_dir / "summary.json").exists()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}

    other = subprocess.run(fedlnl_run(*TINY, "fl.rounds=40", checkpoints, "fl.lr=0.1", f"hydra.run.dir={run_dir}"),
                           cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "Traceback" not in other.stdout + other.stderr
    found = errors(other.stdout + other.stderr)
    assert len(found) == 1 and found[0].startswith(f"fedlnl-run: error: {run_dir} holds a killed run"), found
    if checkpoints == "checkpoint_every=2":
        assert "(no summary; its checkpoint.pt after round " in found[0] and "(fl.lr: 0.05 -> 0.1)" in found[0]
    else:
        assert "(no summary or checkpoint; its metrics.jsonl and .lock) of another config (config hash " in found[0]
    assert found[0].endswith("set hydra.run.dir= to another directory, or move that run away")
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before

    if checkpoints == "checkpoint_every=2":
        saved = torch.load(run_dir / "checkpoint.pt", weights_only=False)["round"] + 1
        again = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0 and f"resuming after round {saved} of 40" in again.stdout + again.stderr
