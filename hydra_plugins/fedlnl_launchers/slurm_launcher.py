"""``hydra/launcher=slurm``: hydra-submitit-launcher's SLURM launcher, plus what a sweep on a shared
cluster needs.

- Complete cells are not submitted: before submitting, each cell's directory and config hash are
  computed as the task will compute them, and a cell whose ``summary.json`` is final for that hash
  (the runner's own skip rule, ``run.completed``; not with ``skip_complete=false``) is left out.
  Re-submitting a finished sweep submits nothing; after a cancelled or failed task it submits only
  the missing cells. Where the check cannot
  decide (a config that does not resolve on the submitting host), the cell is submitted and the task
  skips or runs it as usual.
- ``threads`` follows ``hydra.launcher.cpus_per_task``: a cell without a ``threads=`` override gets
  ``threads=<cpus_per_task>`` (torch would otherwise start one thread per core of the node, not per
  core of the allocation). ``threads`` is left out of the cell's directory name, not of its config
  hash (``fedlnl/conf/keys.py``).
- The launcher waits for every task, then names each cell that failed or never finished (cancelled,
  node failure, timed out too often) with its SLURM job id, its state and its log, and fails the sweep.
  The plugin itself raises at the first failed task while the others are still running.
- In the task, a cell that raises has its traceback logged, so it is in the task's log
  (``<sweep dir>/.submitit/<job id>/<job id>_0_log.out``, stderr included by ``slurm.yaml``) and in
  the cell's own Hydra log.

A task requeued by SLURM (``scontrol requeue``, preemption) or by submitit after its time-limit signal
(USR2, ``signal_delay_s`` before the limit) runs the same cell again. The run saves the round at the
signal (``fedlnl.benchmark.stop``: checkpoint, ``status: interrupted``, lock released, then submitit's
own handler requeues the task), and the requeued task resumes from ``checkpoint.pt``, taking over a
lock its earlier run left (same SLURM job id). After the sweep, a cell that another process is still
training (a live lock) is named by the sweeper.
"""
from __future__ import annotations

import copy
import getpass
import logging
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
from omegaconf import OmegaConf, open_dict

from fedlnl.benchmark.rundir import completed, config_hash

log = logging.getLogger("fedlnl")

POLL_S = 15  # seconds between two looks at the queue (squeue) and the accounting (sacct)
#: the namespace the plugin's task code reads ``run_job`` from (its module, as its function sees it)
_SUBMITIT_GLOBALS = SubmititSlurmLauncher.__call__.__globals__


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


class SlurmLauncher(SubmititSlurmLauncher):
    # ------------------------------------------------------------------ in the task
    def __call__(self, sweep_overrides: list[str], *args: Any) -> JobReturn:
        from fedlnl.benchmark.sweeper import guarded_run_job

        # a cell another live process holds gets nothing written into its directory (no .hydra/, no log)
        _SUBMITIT_GLOBALS["run_job"] = guarded_run_job
        ret = super().__call__(sweep_overrides, *args)
        if ret.status == JobStatus.FAILED:
            log.error("cell failed: %s", " ".join(sweep_overrides), exc_info=ret._return_value)
        # the cell is over: a time-limit or preemption signal from now on has nothing to save, and must
        # not kill the task while it exits after submitit wrote its result (SLURM would call it FAILED)
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        return ret

    def cell_overrides(self, overrides: list[str]) -> list[str]:
        """A cell's overrides as its task will run them (``threads`` from ``cpus_per_task``): the
        sweeper validates these."""
        return self._with_threads(list(overrides))

    # ------------------------------------------------------------------ on the submitting host
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        cells = [self._with_threads(list(o)) for o in job_overrides]
        saved = HydraConfig.instance().cfg
        try:
            dirs, finals = zip(*(self._cell(o) for o in cells))
        finally:
            HydraConfig.instance().cfg = saved
        todo = [i for i, s in enumerate(finals) if s is None]
        log.info("SLURM sweep %s: %d of %d cells to submit (%d complete, skipped)",
                 self.config.hydra.sweep.dir, len(todo), len(cells), len(cells) - len(todo))
        returns = {i: _done(cells[i], s) for i, s in enumerate(finals) if s is not None}
        if todo:
            returns.update(self._submit(cells, dirs, todo, initial_job_idx))
        return [returns[i] for i in range(len(cells))]

    def _with_threads(self, overrides: list[str]) -> list[str]:
        cpus = self.params.get("cpus_per_task")
        if cpus and not any(_key(o) == "threads" for o in overrides):
            overrides.append(f"threads={int(cpus)}")
        return overrides

    def _cell(self, overrides: list[str]) -> tuple[Path | None, dict | None]:
        """The cell's directory and its final summary (None: to be run), as the task will see them."""
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            HydraConfig.instance().set_config(cfg)  # so ${hydra:...} resolves as in the task
            run_dir = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
            task = copy.deepcopy(cfg)
            with open_dict(task):
                del task["hydra"]
            if not task.get("skip_complete", True):  # skip_complete=false: every cell runs again
                return run_dir, None
            return run_dir, completed(run_dir, config_hash(OmegaConf.to_container(task, resolve=True)))
        except Exception as err:  # noqa: BLE001  (the task reports it; here it only means "submit")
            log.warning("cannot check %s before submitting (%s); submitting it", " ".join(overrides), err)
            return None, None

    def _executor(self):
        import submitit

        params = dict(self.params)
        folder, max_timeouts = params.pop("submitit_folder"), params.pop("max_num_timeout")
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=max_timeouts)
        queue_keys = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in queue_keys else f"slurm_{k}": v for k, v in params.items()})
        return executor

    def _submit(self, cells, dirs, todo: list[int], initial_job_idx: int) -> dict[int, JobReturn]:
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        state = Singleton.get_state()
        nums = [initial_job_idx + i for i in todo]
        jobs = self._executor().map_array(self, [cells[i] for i in todo], ["hydra.sweep.dir"] * len(todo),
                                          nums, [f"job_id_for_{n}" for n in nums], [state] * len(todo))
        log.info("submitted SLURM array job %s (%d tasks)", jobs[0].job_id.split("_")[0], len(jobs))
        vanished = _wait(jobs)
        returns, failed = {}, []
        for i, job in zip(todo, jobs):
            name = dirs[i].name if dirs[i] is not None else " ".join(cells[i])
            ret, what = _outcome(job, cells[i], job.job_id in vanished)
            if what is not None:
                logfile = job.paths.stdout if self.params.get("stderr_to_stdout") else job.paths.stderr
                msg = f"cell {name} {what.splitlines()[0][:300]}; log: {logfile}"
                log.error(msg)
                ret.status, ret._return_value = JobStatus.FAILED, RuntimeError(msg)
                failed.append(name)
            returns[i] = ret
        if failed:
            log.error("%d of %d submitted cells failed: %s. Fix the cause and submit the same command "
                      "again: complete cells are skipped.", len(failed), len(todo), ", ".join(failed))
        return returns


def _wait(jobs) -> set[str]:
    """Wait until every task is over; return the ids of those that vanished.

    submitit knows a task is over from its result file or from ``sacct``; a task cancelled while it
    was pending has neither, and submitit would wait for it forever. Such a task is also gone from
    ``squeue``: one missing from both at two looks in a row is over. A final state in ``sacct`` counts
    only once ``squeue`` no longer lists the task: a requeued task waits in the queue while the
    accounting may still show its ended run (``_over``)."""
    queue = ["squeue", "-h", "-r", "-o", "%i", "-u", getpass.getuser()]
    vanished: set[str] = set()
    missing: set[str] = set()  # not in the queue at the previous look
    queued: set[str] | None = None  # in the queue at the last look that got an answer
    look = time.time()
    while True:
        left = [j for j in jobs if j.job_id not in vanished and not _over(j, queued)]
        if not left:
            return vanished
        time.sleep(1)
        if time.time() - look < POLL_S:
            continue
        look = time.time()
        type(left[0]).watcher.update()  # one sacct call for all tasks
        try:
            out = subprocess.run(queue, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode != 0:
            continue  # the controller did not answer: decide nothing
        queued = set(out.stdout.split())
        now = {j.job_id for j in left if j.job_id not in queued and not j.done()}
        vanished |= now & missing
        missing = now


def _over(job, queued: set[str] | None) -> bool:
    """The task wrote its result, or the accounting gives it a final state and the queue does not
    list it (any more). With ``sacct`` alone, a local CI run gave up on a task 29 s after submitit had
    requeued it at its time limit: "state FAILED", although ``scontrol requeue`` had succeeded."""
    if not job.done():  # result file, else sacct (the state of the last ``watcher.update``)
        return False
    return job.paths.result_pickle.exists() or (queued is not None and job.job_id not in queued)


def _outcome(job, overrides: list[str], vanished: bool) -> tuple[JobReturn, str | None]:
    """The task's JobReturn, and what went wrong (None: the cell ran)."""
    from submitit.core.utils import UncompletedJobError

    if vanished:
        return (JobReturn(overrides=overrides, status=JobStatus.FAILED),
                f"did not finish (SLURM job {job.job_id} left the queue with no result and no "
                "accounting record: cancelled before it started?)")
    try:
        ret = job.results()[0]
    except UncompletedJobError:  # no result: cancelled, killed, node failure, exit before Python
        return (JobReturn(overrides=overrides, status=JobStatus.FAILED),
                f"did not finish (SLURM job {job.job_id}, state {job.state})")
    if ret.status == JobStatus.COMPLETED:
        return ret, None
    err = ret._return_value
    return ret, f"failed in SLURM job {job.job_id} ({type(err).__name__}: {err})"


def _done(overrides: list[str], summary: dict) -> JobReturn:
    ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
    ret.return_value = summary.get("best_acc")
    return ret
