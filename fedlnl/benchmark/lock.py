"""``<cell>/.lock``: one process trains a cell at a time, and a lock whose holder is gone is taken over.

The lock file holds the holder's host, pid, SLURM job id (with its restart count) and config hash,
and its modification time is a heartbeat that a background thread renews every ``HEARTBEAT_S``.
A lock is taken over, with one log line, when its holder is provably gone:

- same host and its pid no longer exists;
- same SLURM job id as this process: SLURM runs a job once at a time, so the holder is an earlier
  run of this job that was requeued (preempted, ``scontrol requeue``, time limit) or killed;
- no heartbeat for ``LEASE_S`` (a holder on another machine that died without releasing it).

Otherwise the cell is being trained elsewhere and is left to that process.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import stat
import threading
import time
from pathlib import Path

log = logging.getLogger("fedlnl")

HEARTBEAT_S = 60.0  # the holder renews the lock's mtime this often
LEASE_S = 600.0  # a lock without a heartbeat for this long is stale (clocks of two hosts may differ a little)


class LockError(OSError):
    """The lock path cannot be a lock (a directory, a special file): the message says what to do."""


def slurm_job() -> str | None:
    """This process's SLURM job id (an array task has its own), None outside SLURM."""
    return os.environ.get("SLURM_JOB_ID") or None


class CellLock:
    def __init__(self, run_dir: Path, config_hash: str | None = None, lease_s: float = LEASE_S,
                 heartbeat_s: float = HEARTBEAT_S):
        self.path = Path(run_dir) / ".lock"
        self.config_hash, self.lease_s, self.heartbeat_s = config_hash, lease_s, heartbeat_s
        self.held = False
        self._token = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # ------------------------------------------------------------------ reading
    def check_path(self) -> None:
        """Raise LockError when ``.lock`` exists and is not a regular file."""
        try:
            mode = os.lstat(self.path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise LockError(f"{self.path} is {kind}, not a lock file: remove it (rm -r '{self.path}') and run again")

    def owner(self) -> dict | None:
        """The holder's record, or None (no lock, or a lock being written this instant)."""
        try:
            text = self.path.read_text()
        except OSError:
            return None
        try:
            record = json.loads(text)
            return record if isinstance(record, dict) else None
        except ValueError:  # the two-field format "host pid"
            parts = text.split()
            if len(parts) == 2 and parts[1].isdigit():
                return {"host": parts[0], "pid": int(parts[1])}
            return None

    def age(self) -> float | None:
        """Seconds since the holder's last heartbeat, None without a lock."""
        try:
            return time.time() - self.path.stat().st_mtime
        except OSError:
            return None

    def stale(self) -> str | None:
        """Why the current lock's holder is provably gone, or None (alive, or cannot tell yet)."""
        owner, age = self.owner(), self.age()
        if age is None:
            return None
        if age > self.lease_s:
            return f"no heartbeat for {age / 60:.0f} min (lease {self.lease_s / 60:.0f} min)"
        if owner is None:  # unreadable: being written this instant, or garbage once it is a minute old
            return "it is unreadable and a minute old" if age > 60 else None
        job = slurm_job()
        if job is not None and owner.get("slurm_job") == job:
            return f"it was taken by an earlier run of SLURM job {job} (requeued or killed)"
        if owner.get("host") == socket.gethostname() and not _pid_alive(int(owner.get("pid", -1))):
            return f"its holder (pid {owner.get('pid')} on this host) has exited"
        return None

    def describe(self) -> str:
        owner = self.owner() or {}
        where = f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}"
        if owner.get("slurm_job"):
            where += f", SLURM job {owner['slurm_job']}"
        age = self.age()
        return where + (f", heartbeat {age:.0f} s ago" if age is not None else "")

    # ------------------------------------------------------------------ holding
    def acquire(self) -> bool:
        self.check_path()
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                self.check_path()
                reason = self.stale()
                if reason is None:
                    return False
                log.warning("taking over %s: %s", self.path, reason)
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self._record()) + "\n")
            self.held = True
            self._start_heartbeat()
            return True
        return False

    def _record(self) -> dict:
        return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": slurm_job(),
                "slurm_restart": os.environ.get("SLURM_RESTART_COUNT"), "config_hash": self.config_hash,
                "token": self._token, "started": time.time()}

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="fedlnl-lock-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if (self.owner() or {}).get("token") != self._token:
                log.warning("lost %s to another process (%s)", self.path, self.describe())
                return
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        if (self.owner() or {}).get("token") == self._token:
            self.path.unlink(missing_ok=True)
        self.held = False


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
