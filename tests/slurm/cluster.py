#!/usr/bin/env python3
"""A throw-away single-node SLURM cluster for ``make test-slurm``.

    python tests/slurm/cluster.py -- COMMAND [ARG...]

As root: installs what is missing (Debian's ``munge``, ``slurmctld``, ``slurmd``, ``slurm-client``,
``slurmdbd``, ``mariadb-server``) with apt-get, writes every config into a fresh temporary directory,
starts munged, MariaDB, slurmdbd, slurmctld and slurmd from there (private sockets, ports, pid files,
state and spool directories: nothing under /etc or /var is used), waits until ``sinfo`` shows the
node idle, runs COMMAND with ``SLURM_CONF`` and ``FEDLNL_SLURM_PARTITION`` set, and then, whatever
COMMAND did, cancels the cluster's jobs, stops exactly the daemons it started (by their pid files)
and removes the directory (``FEDLNL_SLURM_KEEP=1`` keeps it). Exit status: COMMAND's.

Accounting goes through slurmdbd into MariaDB because submitit learns a task's state from ``sacct``;
with ``AccountingStorageType=accounting_storage/none`` Slurm 22.05's sacct only answers "Slurm
accounting storage is disabled", and a task that dies without writing its result (cancelled, killed)
would be waited for forever. (``jobcomp/filetxt`` is read by ``sacct -c`` only, which submitit does
not call.)

Where the cluster cannot start (not root, apt-get fails, a daemon does not come up) it prints one line,
``test-slurm: skipped: <why>``, and exits 0.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTITION = "fedlnl"
#: binary -> Debian package
BINARIES = {
    "munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "slurmdbd": "slurmdbd",
    "sinfo": "slurm-client", "sbatch": "slurm-client", "sacct": "slurm-client", "scontrol": "slurm-client",
    "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server", "mariadb": "mariadb-server",
}
SBIN = os.pathsep.join((os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"))


class Skip(Exception):
    """The cluster cannot start here; the message says why."""


def _tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"no log at {path}"
    return lines[-1].strip() if lines else f"{path.name} is empty"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait(check, seconds: float, what: str, log: Path) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise Skip(f"{what} within {seconds:.0f} s (last line of {log}: {_tail(log)})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is gone for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


class Cluster:
    def __init__(self) -> None:
        self.dir: Path | None = None
        self.env = dict(os.environ, PATH=SBIN)
        self.pidfiles: list[tuple[str, Path]] = []  # (daemon, pid file), in start order
        self.children: list[subprocess.Popen] = []  # daemons run in the foreground (reaped in stop)

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        if os.geteuid() != 0:
            raise Skip("not root: the test cluster's daemons (munged, slurmctld, slurmd) must run as root")
        self._install()
        self.dir = Path(tempfile.mkdtemp(prefix="fedlnl-slurm-"))
        self.dir.chmod(0o711)  # munged: the socket's directory must be searchable by all
        self.env["SLURM_CONF"] = str(self.dir / "slurm.conf")
        self.env["FEDLNL_SLURM_PARTITION"] = PARTITION
        self.db_port, self.dbd_port, self.ctld_port, self.slurmd_port = _free_ports(4)
        self._munge()
        self._mariadb()
        self._slurmdbd()
        self._slurm()

    def _install(self) -> None:
        missing = sorted({pkg for b, pkg in BINARIES.items() if not shutil.which(b, path=SBIN)})
        if not missing:
            return
        if not shutil.which("apt-get"):
            raise Skip(f"{', '.join(missing)} not installed and no apt-get to install them")
        print(f"test-slurm: installing {' '.join(missing)} with apt-get", flush=True)
        env = dict(self.env, DEBIAN_FRONTEND="noninteractive")
        for cmd in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]):
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if out.returncode != 0:
                last = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
                raise Skip(f"`{' '.join(cmd[:2])}` failed ({out.returncode}): {last}")

    def _daemon(self, name: str, cmd: list[str], pidfile: Path, log: Path) -> None:
        """Start a daemon that forks into the background and writes ``pidfile``."""
        self.pidfiles.append((name, pidfile))
        out = subprocess.run(cmd, env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            why = (out.stderr.strip() or _tail(log)).splitlines()[-1]
            raise Skip(f"{name} did not start ({out.returncode}): {why}")
        _wait(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, f"{name} wrote no pid file", log)

    def _munge(self) -> None:
        d = self.dir
        key = d / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self._daemon("munged", ["munged", f"--key-file={key}", f"--socket={d}/munge.socket",
                                f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                                f"--seed-file={d}/munged.seed"], d / "munged.pid", d / "munged.log")

    def _mariadb(self) -> None:
        d = self.dir
        out = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={d}/db", "--user=root",
                              "--auth-root-authentication-method=socket", "--skip-test-db"],
                             env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            why = (out.stderr.strip() or out.stdout.strip() or "no output").splitlines()[-1]
            raise Skip(f"mariadb-install-db failed: {why}")
        self.pidfiles.append(("mariadbd", d / "mariadbd.pid"))
        # mariadbd stays in the foreground: its own session, so a Ctrl-C reaches it only through stop()
        cmd = ["mariadbd", "--no-defaults", f"--datadir={d}/db", f"--socket={d}/mysql.sock", f"--port={self.db_port}",
               "--bind-address=127.0.0.1", f"--pid-file={d}/mariadbd.pid", "--user=root",
               f"--log-error={d}/mariadbd.log", "--innodb-buffer-pool-size=64M"]
        self.children.append(subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True))
        _wait(lambda: (d / "mysql.sock").exists() and (d / "mariadbd.pid").exists(), 60,
              "mariadbd did not open its socket", d / "mariadbd.log")
        sql = ("CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'fedlnl-test';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        out = subprocess.run(["mariadb", "--no-defaults", f"--socket={d}/mysql.sock", "-u", "root", "-e", sql],
                             env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            raise Skip(f"creating the accounting database user failed: {out.stderr.strip()}")

    def _slurmdbd(self) -> None:
        d = self.dir
        conf = d / "slurmdbd.conf"  # slurmdbd reads it beside $SLURM_CONF; it must be 0600
        conf.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={d}/munge.socket",
            "DbdHost=localhost", f"DbdPort={self.dbd_port}", "SlurmUser=root",
            f"PidFile={d}/slurmdbd.pid", f"LogFile={d}/slurmdbd.log",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={self.db_port}",
            "StorageUser=slurm", "StoragePass=fedlnl-test", "StorageLoc=slurm_acct_db", ""]))
        conf.chmod(0o600)
        self._write_slurm_conf()
        self._daemon("slurmdbd", ["slurmdbd"], d / "slurmdbd.pid", d / "slurmdbd.log")
        _wait(lambda: _listening(self.dbd_port), 60, "slurmdbd did not listen", d / "slurmdbd.log")

    def _write_slurm_conf(self) -> None:
        d = self.dir
        out = subprocess.run(["slurmd", "-C"], env=self.env, capture_output=True, text=True)
        node = out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout.startswith("NodeName=") else None
        if node is None:
            raise Skip(f"`slurmd -C` did not describe this node: {out.stderr.strip() or out.stdout.strip()}")
        (d / "state").mkdir()
        (d / "spool").mkdir()
        (d / "slurm.conf").write_text("\n".join([
            "ClusterName=fedlnltest", f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}", f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={d}/munge.socket", "CredType=cred/munge",
            f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
            f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
            f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd.log",
            # no cgroups in a container: plain process tracking, no CPU binding
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
            "ReturnToService=2", "JobRequeue=1",
            "KillWait=30",  # seconds between SIGTERM and SIGKILL (Slurm's default): fedlnl saves the round
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
            f"AccountingStoragePort={self.dbd_port}",
            f"AccountingStoragePass={d}/munge.socket",  # the munge socket for talking to slurmdbd
            "JobAcctGatherType=jobacct_gather/none",
            f"{node} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))

    def _slurm(self) -> None:
        d = self.dir
        self._daemon("slurmctld", ["slurmctld"], d / "slurmctld.pid", d / "slurmctld.log")
        self._daemon("slurmd", ["slurmd"], d / "slurmd.pid", d / "slurmd.log")
        _wait(lambda: self._run("sinfo", "-h", "-N", "-o", "%T").strip() == "idle", 90,
              "the node did not become idle", d / "slurmd.log")

    def _run(self, *cmd: str) -> str:
        out = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=60)
        return out.stdout if out.returncode == 0 else ""

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        if self.dir is None:
            return
        if any(name == "slurmctld" for name, _ in self.pidfiles):
            try:
                jobs = self._run("squeue", "-h", "-o", "%A").split()
                if jobs:
                    subprocess.run(["scancel", *sorted(set(jobs))], env=self.env, capture_output=True, timeout=60)
                    deadline = time.time() + 60
                    while self._run("squeue", "-h", "-o", "%A").split() and time.time() < deadline:
                        time.sleep(1)
            except subprocess.TimeoutExpired:
                pass
        for name, pidfile in reversed(self.pidfiles):
            self._stop(name, pidfile)
        self._kill_leftovers()
        for child in self.children:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        if os.environ.get("FEDLNL_SLURM_KEEP") == "1":
            print(f"test-slurm: kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    @staticmethod
    def _stop(name: str, pidfile: Path) -> None:
        try:
            pid = int(pidfile.read_text().split()[0])
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError, IndexError):
            return  # never started, or already gone
        if comm != name[:15]:  # the pid now belongs to another program
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + 20
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)

    def _kill_leftovers(self) -> None:
        """Job steps and job processes that outlived the daemons (e.g. scancel failed): every process
        whose environment names this cluster's slurm.conf was started by this cluster or its tests."""
        marker = f"SLURM_CONF={self.dir}/slurm.conf".encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1:]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster on `kill` too
    cluster = Cluster()
    try:
        try:
            cluster.start()
        except Skip as why:
            print(f"test-slurm: skipped: {why}", flush=True)
            return 0
        started = time.time()
        print(f"test-slurm: cluster up in {cluster.dir} (partition {PARTITION})", flush=True)
        rc = subprocess.call(cmd, env=cluster.env)
        print(f"test-slurm: tests took {time.time() - started:.0f} s", flush=True)
        return rc
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
