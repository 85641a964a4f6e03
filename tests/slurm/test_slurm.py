"""Sweeps through a live SLURM cluster (``make test-slurm`` starts a throw-away one, see cluster.py).

Only the command line is used: ``fedlnl-run -m ... hydra/launcher=slurm``, as on a real cluster. The
checks: a sweep through SLURM equals the same sweep run by the basic launcher (summaries, metrics rows,
report tables); a cancelled task's cell is the only one re-submitted and a finished sweep submits
nothing; a running task preempted by ``scontrol requeue`` (SIGTERM) with the default checkpoint
settings, and one requeued by submitit at its time limit (USR2), save the round at the signal and
resume on the requeued job (taking over the lock its earlier run left) to exactly the numbers of an
uninterrupted run; a failing cell is named with its log while the others complete.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

PARTITION = os.environ.get("FEDLNL_SLURM_PARTITION")
pytestmark = [pytest.mark.slurm,  # deselected by default (pyproject addopts)
              pytest.mark.skipif(not PARTITION or not os.environ.get("SLURM_CONF"),
                                 reason="no SLURM test cluster: run `make test-slurm`")]

BIN = Path(sys.executable).parent
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
# one core and 2 GB per task: the 2-core test node runs two cells at once
SLURM = ["hydra/launcher=slurm", f"hydra.launcher.partition={PARTITION}", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=2"]
GRID = ["method=fedavg,fedprox", "seed=0,1", "debug=tiny", "device=cpu"]


def fedlnl_run(*args: str) -> list[str]:
    return [str(BIN / "fedlnl-run"), "-m", *args]


def run(cmd: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    out.log = out.stdout + out.stderr  # Hydra logs to stdout, errors go to stderr
    return out


def slurm(*args: str) -> str:
    out = subprocess.run(list(args), env=ENV, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


def jobs_known() -> set[str]:
    """Every job and array task the cluster's accounting has seen."""
    return set(slurm("sacct", "-X", "-n", "-P", "-o", "JobID", "-S", "2000-01-01").split())


def rows_of(cell: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock field."""
    rows = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time_s"} for r in rows]


def numbers(cell: Path) -> dict:
    s = json.loads((cell / "summary.json").read_text())
    return {k: s[k] for k in ("status", "best_acc", "final_acc", "config_hash")}


def cells(sweep: Path) -> dict[str, Path]:
    return {p.parent.name: p.parent for p in sweep.glob("*/summary.json")}


def complete(sweep: Path) -> dict[str, int]:
    """Complete cells and their summary's mtime."""
    return {name: (cell / "summary.json").stat().st_mtime_ns for name, cell in cells(sweep).items()
            if numbers(cell)["status"] == "complete"}


def submitted(sweep: Path, task: int | None = None, timeout: float = 120) -> str:
    """The SLURM id of a sweep's task once submitit has submitted it: ``<array>_<task>``, or ``<job>``
    for a one-cell sweep (``task=None``: submitit submits a single cell as a plain job)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = sorted(p.name for p in (sweep / ".submitit").glob("*") if p.is_dir()
                       and (p.name.endswith(f"_{task}") if task is not None else p.name.isdigit())
                       and (p / f"{p.name}_submitted.pkl").exists())
        if found:
            return found[-1]
        time.sleep(0.2)
    raise AssertionError(f"nothing submitted below {sweep}/.submitit")


def same_results(a: Path, b: Path) -> None:
    """Cells of two sweeps: same names, same numbers, same metrics rows (wall clock aside)."""
    assert sorted(cells(a)) == sorted(cells(b))
    for name in cells(a):
        assert numbers(a / name) == numbers(b / name), name
        assert rows_of(a / name) == rows_of(b / name), name


def report_tables(sweep: Path) -> dict[str, str]:
    out = subprocess.run([str(BIN / "fedlnl-report"), str(sweep), "--figures", "none"], env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return {p.name: p.read_text() for p in sorted((sweep / "report").iterdir())
            if p.suffix in (".csv", ".md", ".tex") and p.stem != "compute"}  # compute: each run's own times


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    """The 4-cell sweep run by the basic launcher (one cell after another, no SLURM)."""
    root = tmp_path_factory.mktemp("basic")
    name = f"sweep-{uuid.uuid4().hex[:6]}"
    out = run(fedlnl_run(*GRID, f"name={name}", "threads=1", f"hydra.sweep.dir={root / 'sweep'}"), root)
    assert out.returncode == 0, out.log[-3000:]
    assert len(complete(root / "sweep")) == 4
    return root / "sweep", name


# ------------------------------------------------------------------------------------------- sweeps
def test_sweep_matches_basic_launcher_and_resubmits_only_missing_cells(tmp_path, basic):
    basic_sweep, name = basic
    sweep = tmp_path / "sweep"
    cmd = fedlnl_run(*GRID, f"name={name}", f"hydra.sweep.dir={sweep}", *SLURM)

    # submit, and cancel the last task right away (on 2 cores it is still pending)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        cancelled = submitted(sweep, 3)
        slurm("scancel", cancelled)
        log, _ = proc.communicate(timeout=900)
    finally:
        proc.kill()
    assert proc.returncode != 0, log[-3000:]
    done = complete(sweep)
    assert len(done) == 3, log[-3000:]
    missing = next(c for c in cells(basic_sweep) if c not in done)
    line = next((ln for ln in log.splitlines() if f"cell {missing} did not finish" in ln), None)
    assert line is not None, log[-3000:]
    assert f"(SLURM job {cancelled}" in line and f"log: {sweep}/.submitit/{cancelled}/" in line

    # re-submitting submits the missing cell only; the complete ones are untouched
    before = jobs_known()
    again = run(cmd, tmp_path)
    assert again.returncode == 0, again.log[-3000:]
    assert "1 of 4 cells to submit (3 complete, skipped)" in again.log
    new = jobs_known() - before
    assert len(new) == 1, new  # one job (a one-cell sweep is submitted as a plain job)
    assert {c: complete(sweep)[c] for c in done} == done

    # the SLURM sweep's results and report are the basic launcher's
    same_results(sweep, basic_sweep)
    assert report_tables(sweep) == report_tables(basic_sweep)

    # a finished sweep submits nothing
    before = jobs_known()
    submitit_dirs = set((sweep / ".submitit").iterdir())
    final = run(cmd, tmp_path)
    assert final.returncode == 0, final.log[-3000:]
    assert "0 of 4 cells to submit (4 complete, skipped)" in final.log
    assert jobs_known() == before and set((sweep / ".submitit").iterdir()) == submitit_dirs


def test_failed_cell_is_named_with_its_log_and_the_others_complete(tmp_path):
    sweep = tmp_path / "sweep"
    bad = sweep / "debug=tiny,method=fedavg,seed=1"
    (bad / "metrics.jsonl").mkdir(parents=True)  # injected fault: the cell cannot write its metrics
    out = run(fedlnl_run("method=fedavg", "seed=0,1", "debug=tiny", "device=cpu",
                         f"name=fail-{uuid.uuid4().hex[:6]}", f"hydra.sweep.dir={sweep}", *SLURM), tmp_path)
    assert out.returncode != 0
    assert list(complete(sweep)) == ["debug=tiny,method=fedavg,seed=0"], out.log[-3000:]
    line = next((ln for ln in out.log.splitlines() if f"cell {bad.name} failed in SLURM job" in ln), None)
    assert line is not None and "IsADirectoryError" in line, out.log[-3000:]
    log = Path(line.rsplit("log: ", 1)[1].strip())
    assert log.is_file() and log.is_relative_to(sweep / ".submitit")
    text = log.read_text()
    assert "Traceback" in text and "IsADirectoryError" in text and "metrics.jsonl" in text


# ------------------------------------------------------------------------------------------- requeue
def round_seconds(sweep: Path) -> float:
    """Median wall time of one tiny round on this machine, from the basic sweep's metrics."""
    gaps = []
    for cell in cells(sweep).values():
        t = [json.loads(line)["time_s"] for line in (cell / "timing.jsonl").read_text().splitlines()]
        gaps += [b - a for a, b in zip(t[1:], t[2:])]  # the first round carries warm-up
    return statistics.median(gaps)


#: seconds a requeued job waits here before it is started (``release_requeued``)
REQUEUE_WAIT_S = 5
_held_since: dict[str, float] = {}


def release_requeued(job: str) -> None:
    """Slurm holds a requeued job for 120 s (reason BeginTime), the life of the job credential it
    revoked at the requeue; start it after ``REQUEUE_WAIT_S`` instead. Not at once: slurmd refuses a
    credential made in the second of the revocation ("Killing non-startable batch JobId=8: Job
    credential revoked", the job FAILED), which a release within that second made happen in CI
    (2026-11-27; the intermittent failures of this test before). Only the wait is shortened: the job
    restarts exactly as it would after the hold."""
    for line in slurm("squeue", "-h", "-j", job, "-o", "%i %T %r").splitlines():
        jid, state, reason = line.split(maxsplit=2)
        if state != "PENDING" or reason.strip() != "BeginTime":
            _held_since.pop(jid, None)
        elif time.time() - _held_since.setdefault(jid, time.time()) >= REQUEUE_WAIT_S:
            subprocess.run(["scontrol", "update", f"JobId={jid}", "StartTime=now"], env=ENV,
                           capture_output=True, timeout=60)
            _held_since.pop(jid, None)


def cluster_record(job: str, lines: int = 30) -> str:
    """What the cluster recorded of ``job`` (every run's state, sacct -D) and the controller log's last
    lines, for an assertion message: a task's own log does not say why Slurm ended it."""
    states = subprocess.run(["sacct", "-n", "-P", "-D", "-X", "-j", job, "-o", "JobID,State,ExitCode,Start,End"],
                            env=ENV, capture_output=True, text=True, timeout=60).stdout.strip()
    log = Path(os.environ["SLURM_CONF"]).with_name("slurmctld.log")
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else f"no {log}"
    return f"sacct -D of job {job}:\n{states}\nslurmctld.log:\n{tail}"


def task_logs(sweep: Path) -> str:
    """Every submitit log of a sweep (one per task and run), whole."""
    return "\n".join(f"{p}:\n{p.read_text(errors='replace')}" for p in sorted((sweep / ".submitit").glob("*/*.out")))


def fail(message: str, *logs: str) -> None:
    """Fail with ``message`` after printing ``logs`` whole: pytest shortens a long assertion message
    (it cut the launcher's last lines from a failure of the requeue test), and these logs are the
    only record of why a launcher or a SLURM task ended."""
    print("\n".join(logs), flush=True)
    pytest.fail(message)


def final_states(job: str, timeout: float = 120) -> list[str]:
    """Every state the job's runs ended in (sacct -D), once the last one has ended: the result file
    that ends the launcher's wait is written just before the task exits."""
    deadline = time.time() + timeout
    while True:
        states = slurm("sacct", "-n", "-P", "-D", "-X", "-j", job, "-o", "State").split()
        if (states and states[-1] not in ("PENDING", "RUNNING", "COMPLETING")) or time.time() > deadline:
            return states
        time.sleep(1)


def submitit_events(task_log: str, event: str) -> int:
    """How many times submitit logged ``event`` (each line appears in two formats: count timestamps)."""
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
    return len({m for line in task_log.splitlines() if event in line for m in re.findall(stamp, line)})


def resumes(cell: Path) -> list[int]:
    """The checkpoint rounds the cell's run resumed after, from its Hydra log (appended by each run)."""
    text = "".join(p.read_text() for p in cell.glob("*.log"))
    return [int(r) for r in re.findall(r"resuming after round (\d+) of", text)]


def test_requeued_and_timed_out_cells_resume_to_the_uninterrupted_numbers(tmp_path, basic):
    """Two copies of one cell through SLURM, beside the same cell run straight through by the basic
    launcher. One runs with the default checkpoint settings (no round-count checkpoints, the next
    time-based one minutes away) and is preempted by hand (``scontrol requeue``: SIGTERM) in the
    middle: it saves the round at the signal, writes ``status: interrupted`` and releases its lock;
    before the requeued job starts, the test leaves a lock in the cell as a killed run on another node
    would (same SLURM job id, fresh heartbeat), which the requeued job takes over. The other runs
    under a 1-minute limit that submitit requeues at every time-limit signal (USR2). ~90 s of rounds
    on this machine make the limit hit at least once. Both end with the uninterrupted numbers."""
    rounds = max(30, min(2000, math.ceil(90 / round_seconds(basic[0]))))
    cell = ["method=fedavg", "seed=0", "debug=tiny", "device=cpu", f"fl.rounds={rounds}",
            f"name=requeue-{uuid.uuid4().hex[:6]}"]
    name = f"debug=tiny,fl.rounds={rounds},method=fedavg,seed=0"  # the cell's directory
    # Slurm checks limits every 30 s and sends the --signal=USR2@1 when at most 1 + 30 s are left: 29 to
    # 59 s into each run, after the task's startup, and SIGKILL 30 s later (measured on Slurm 22.05).
    limit = ["hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=1",
             "hydra.launcher.max_num_timeout=30", "checkpoint_every=3"]
    commands = {"straight": ["threads=1"], "requeued": SLURM, "timed-out": [*SLURM, *limit]}
    outs = {key: tmp_path / f"{key}.log" for key in commands}  # files, not pipes: nothing can block
    procs = {key: subprocess.Popen(fedlnl_run(*cell, f"hydra.sweep.dir={tmp_path / key}", *extra), cwd=tmp_path,
                                   env=ENV, stdout=outs[key].open("w"), stderr=subprocess.STDOUT)
             for key, extra in commands.items()}
    held = tmp_path / "requeued" / name
    try:
        jobs = {key: submitted(tmp_path / key) for key in ("requeued", "timed-out")}
        deadline = time.time() + 300
        while len(timing_rows(held)) < 5:  # preempt a running cell, several rounds in
            assert procs["requeued"].poll() is None and time.time() < deadline, "the cell did not start"
            time.sleep(0.2)
        slurm("scontrol", "requeue", jobs["requeued"])
        deadline = time.time() + 120
        while not (status(held) == "interrupted" and not (held / ".lock").exists()):
            assert time.time() < deadline, f"no interrupted summary: {status(held)}"
            time.sleep(0.2)
        stopped_at = json.loads((held / "summary.json").read_text())["rounds_run"]
        # as if the run had been killed on another node after taking the lock: the requeued job takes it over
        (held / ".lock").write_text(json.dumps({"host": "another-node", "pid": 4242, "slurm_job": jobs["requeued"]}))
        deadline = time.time() + 1200
        while any(p.poll() is None for p in procs.values()):
            assert time.time() < deadline, "the cells did not finish"
            for job in jobs.values():
                release_requeued(job)
            time.sleep(1)
    finally:
        for p in procs.values():
            p.kill()
    for key, p in procs.items():
        if p.returncode != 0:
            logs = [f"--- launcher output of {key}:\n{outs[key].read_text()}"]
            if key in jobs:
                logs += [f"--- task logs of {key}:\n{task_logs(tmp_path / key)}", cluster_record(jobs[key])]
            fail(f"{key}: fedlnl-run exited with {p.returncode} (its whole output above)", *logs)

    reference = tmp_path / "straight" / name
    lines = []
    for key, job in jobs.items():
        run_dir = tmp_path / key / name
        states = final_states(job)
        task_log = (tmp_path / key / ".submitit" / job / f"{job}_0_log.out").read_text()  # stderr included
        timeouts = submitit_events(task_log, "this job is timed-out")
        assert states.count("REQUEUED") >= 1 and states[-1] == "COMPLETED", (key, states)
        assert submitit_events(task_log, "Requeued job") == timeouts, task_log[-3000:]  # requeued each time
        resumed = resumes(run_dir)
        if key == "requeued":  # requeued once, by hand, resuming from the round at the signal
            assert timeouts == 0 and states.count("REQUEUED") == 1 and resumed == [stopped_at], (states, resumed)
            assert "SIGTERM received: finishing the current round" in task_log, task_log[-3000:]
            assert f"it was taken by an earlier run of SLURM job {job} (requeued or killed)" in task_log
        else:  # requeued by submitit at each time-limit signal, resuming from the round at the signal
            assert timeouts >= 1 and states.count("REQUEUED") == timeouts, (states, task_log[-3000:])
            # a signal during a task's start-up (before training) requeues it with nothing to save
            saved = task_log.count("SIGUSR2 received: finishing the current round")
            assert 1 <= saved <= timeouts and len(resumed) == saved, (saved, resumed, timeouts)
            assert resumed == sorted(resumed), resumed
        assert all(0 < r < rounds for r in resumed)
        # ... and ending with exactly the uninterrupted run's numbers
        assert numbers(run_dir) == numbers(reference) and numbers(run_dir)["status"] == "complete"
        assert rows_of(run_dir) == rows_of(reference) and len(rows_of(run_dir)) == rounds
        assert not (run_dir / "checkpoint.pt").exists() and not (run_dir / ".lock").exists()
        got = numbers(run_dir)
        lines.append(f"{key}: {len(states) - 1} requeues ({timeouts} at the time limit), resumed after rounds "
                     f"{resumed}; best/final acc {got['best_acc']:.4f}/{got['final_acc']:.4f}")
    print(f"\n{rounds} rounds; uninterrupted best/final acc {numbers(reference)['best_acc']:.4f}/"
          f"{numbers(reference)['final_acc']:.4f}; " + "; ".join(lines) + f"; all {rounds} metrics rows equal")


def timing_rows(cell: Path) -> list[str]:
    try:
        return (cell / "timing.jsonl").read_text().splitlines()
    except OSError:
        return []


def status(cell: Path) -> str | None:
    try:
        return json.loads((cell / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        return None
