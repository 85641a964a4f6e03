"""Stopping a run cleanly when a user or a scheduler asks: SIGINT (Ctrl-C), SIGTERM (``kill``, SLURM
preemption, ``scontrol requeue``, ``scancel``, the time limit), SIGUSR1 (the usual
``--signal=USR1@<s>`` warning) and SIGUSR2 (submitit's time-limit and preemption warning,
``--signal=USR2@<signal_delay_s>``).

While a run trains, these signals only set a flag. The runner finishes the round in progress, saves
a checkpoint, writes ``summary.json`` with ``status: interrupted``, and releases the cell's lock;
then ``StopRequest.exit`` hands the signal on:

- in a process that runs cells for a local sweep (``hold``: the sweep's own process around its
  launch, and each joblib worker), outside a cell's rounds the signal is noted (``note``): the cell
  returns its interrupted summary, no further cell starts in that process, the sweep's process
  passes the signal on to its pool workers (``kill <sweep pid>`` stops them too) and, once they are
  done, names what was saved and exits with 128 + the signal (130 for Ctrl-C);
- inside a submitit job, to submitit's own handler: for its warning signal (USR2) that handler
  requeues the task with ``scontrol requeue`` (counting time-limit requeues against
  ``max_num_timeout``) and exits; for SIGTERM it only logs;
- then the process exits with 128 + the signal number (143 for SIGTERM), the status of a process
  ended by that signal, and writes no submitit result: the submitting host keeps waiting for the
  requeued task. SLURM requeues a preempted or ``scontrol requeue``-d job itself, whatever the status.

The requeued task resumes the cell from the checkpoint (``run`` takes over the lock of its earlier
run: same SLURM job id).

A second signal while the round finishes or the checkpoint is written (a second Ctrl-C) is noted
with one line and changes nothing: the round is saved whole, then the process stops as after the
first. SIGKILL abandons the round; what is on disk is then the last complete checkpoint and summary
(each written to a temporary file and renamed over the old one).
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading

log = logging.getLogger("fedlnl")

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2")
                if hasattr(signal, name))

#: the first stop signal this process received. A process that runs several cells (a local sweep's
#: own process, a joblib worker) starts no further cell after it.
received: int | None = None


def name_of(signum: int) -> str:
    return signal.Signals(signum).name


def refuse_after_signal() -> bool:
    """True (start nothing, write nothing) if this process was asked to stop and a launcher owns
    the stop (``hold``); the process exits with 128 + signal if it was asked to stop otherwise."""
    if received is None:
        return False
    if held():
        return True
    log.warning("%s was received earlier in this process: not starting another cell", name_of(received))
    end(128 + int(received))
    return True


def note(signum, frame) -> None:
    """The stop-signal handler of a process that runs cells for a local sweep, outside a cell's
    rounds (``StopRequest`` takes over while a cell trains): the signal is recorded, so that no
    further cell starts here, and passed on to this process's pool workers (each saves its round);
    the process is not ended: the launcher collects what its cells saved."""
    global received
    first = received is None
    received = signum if first else received
    children = multiprocessing.active_children()
    for child in children:
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(child.pid, signum)
    if first and multiprocessing.parent_process() is None:  # the sweep's own process: say what happens
        print(f"fedlnl-run: {name_of(signum)} received: each running cell finishes its round, saves and "
              f"stops{f' ({len(children)} workers told)' if children else ''}; no further cell starts",
              file=sys.stderr, flush=True)


def held() -> bool:
    """Whether this process's stop signals are noted by ``note`` (a local sweep owns the stop)."""
    return threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is note


@contextlib.contextmanager
def hold():
    """While active (main thread only), SIGNALS are noted (``note``), not fatal: a local sweep's
    process around its launch."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, note) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def hold_for_good() -> None:
    """A pool worker of a local sweep: its stop signals are noted from its first cell on, also
    between cells (a signal there would otherwise end the worker, and its launcher take the
    whole pool for broken)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, note)


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
                        name_of(signum))
        else:  # a second Ctrl-C: the round in progress is still saved whole
            log.warning("%s received again: already stopping; the round in progress is saved first, then the run "
                        "stops (SIGKILL abandons the round: the last checkpoint on disk stays)", name_of(signum))

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        if self.active:
            for sig, handler in self.previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            self.active = False

    def completed(self) -> None:
        """A signal arrived as the run completed: nothing to save. Inside a submitit job the task is
        done and submitit writes its result (no requeue); in a local sweep the launcher stops (no
        further cell starts); a single run stops here."""
        self.restore()
        handler = self.previous.get(self.signum)
        if handler is note or _scheduler(handler):
            log.warning("%s arrived as the run completed: nothing to save", self.name)
            return
        end(128 + int(self.signum))

    def exit(self) -> None:
        """After the cell is saved: in a local sweep return (its launcher stops and says so);
        otherwise pass the signal to the handler it replaced (a scheduler's), then exit."""
        self.restore()
        handler = self.previous.get(self.signum)
        if handler is note:
            return
        if _scheduler(handler):
            hand_on(handler, self.signum)  # submitit: requeue (its warning signal) or log (SIGTERM)
        end(128 + int(self.signum))


def _scheduler(handler) -> bool:
    """A handler some scheduler installed (submitit's), not Python's Ctrl-C default or ours."""
    return callable(handler) and handler not in (signal.default_int_handler, note)


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
