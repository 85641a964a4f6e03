"""Stopping a run cleanly when a scheduler asks: SIGTERM (SLURM preemption, ``scontrol requeue``,
``scancel``, the time limit), SIGUSR1 (the usual ``--signal=USR1@<s>`` warning) and SIGUSR2
(submitit's time-limit and preemption warning, ``--signal=USR2@<signal_delay_s>``).

While a run trains, these signals only set a flag. The runner finishes the round in progress, saves
a checkpoint, writes ``summary.json`` with ``status: interrupted``, and releases the cell's lock;
then ``StopRequest.exit`` hands the signal on:

- inside a submitit job, to submitit's own handler: for its warning signal (USR2) that handler
  requeues the task with ``scontrol requeue`` (counting time-limit requeues against
  ``max_num_timeout``) and exits; for SIGTERM it only logs;
- then the process exits with 128 + the signal number (143 for SIGTERM), the status of a process
  ended by that signal, and writes no submitit result: the submitting host keeps waiting for the
  requeued task. SLURM requeues a preempted or ``scontrol requeue``-d job itself, whatever the status.

The requeued task resumes the cell from the checkpoint (``run`` takes over the lock of its earlier
run: same SLURM job id).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading

log = logging.getLogger("fedlnl")

SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2") if hasattr(signal, name))

#: the first stop signal this process received during a run. A process that runs several cells (a
#: joblib worker of a local sweep) starts no further cell after it: its launcher was stopped too,
#: and the worker would otherwise go on with the cells already queued to it.
received: int | None = None


def refuse_after_signal() -> None:
    """Exit with 128 + signal, before anything is written, if this process was asked to stop."""
    if received is not None:
        log.warning("%s was received earlier in this process: not starting another cell",
                    signal.Signals(received).name)
        end(128 + int(received))


def end(code: int) -> None:
    """Exit with ``code``. A pool worker (a joblib sweep's loky process) ends at once: a SystemExit
    there is caught as the cell's result, and the worker would wait for, or take, more cells while
    its launcher, stopped by the same signal, is gone."""
    if multiprocessing.parent_process() is not None:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


class StopRequest:
    """Context manager: while active, SIGNALS set ``signum`` instead of ending the process."""

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict[int, object] = {}
        self.active = False

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # Python delivers signals there only
            self.previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
            self.active = True
        return self

    def _handle(self, signum, frame) -> None:
        global received
        received = signum if received is None else received
        if self.signum is None:
            self.signum = signum
            log.warning("%s received: finishing the current round, then saving a checkpoint and stopping",
                        signal.Signals(signum).name)

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        if self.active:
            for sig, handler in self.previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            self.active = False

    def completed(self) -> None:
        """A signal arrived as the run completed: nothing to save. Inside a submitit job the task is
        done and submitit writes its result (no requeue); elsewhere stop here (a sweep's next cell
        does not start)."""
        self.restore()
        if callable(self.previous.get(self.signum)):
            log.warning("%s arrived as the run completed: nothing to save", self.name)
            return
        end(128 + int(self.signum))

    def exit(self) -> None:
        """After the cell is saved: pass the signal to the handler it replaced, then exit."""
        self.restore()
        handler = self.previous.get(self.signum)
        if callable(handler):
            hand_on(handler, self.signum)  # submitit: requeue (its warning signal) or log (SIGTERM)
        end(128 + int(self.signum))


def hand_on(handler, signum: int) -> None:
    """Call the scheduler's handler with SIGTERM ignored. Submitit's handler for its warning signal
    runs ``scontrol requeue <this job>``, and SLURM carries the requeue out by sending SIGTERM to every
    process of the job, that scontrol child included: killed before it exits, it made submitit's
    ``check_call`` raise, and the task report a failure although the job was requeued (seen in CI). A
    child inherits the ignored disposition through exec; this process exits right after. If scontrol
    resets it and dies of the signal anyway, the requeue was carried out: say so and exit as usual."""
    term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        handler(signum, None)
    except subprocess.CalledProcessError as error:
        command = [str(part) for part in error.cmd[:2]] if isinstance(error.cmd, (list, tuple)) else []
        if not (command == ["scontrol", "requeue"] and error.returncode == -signal.SIGTERM):
            raise
        log.warning("scontrol requeue was ended by the SIGTERM of the requeue it asked for: the job is requeued")
    finally:
        signal.signal(signal.SIGTERM, term)
