"""Where a run computes: the ``device`` and ``threads`` keys, and the seed the model is initialised
from. The one home of a run's placement: the runner, the preflight checks and the sweeper ask here.

- ``device``: ``auto`` takes the GPU when there is one (parallel sweep jobs on a multi-GPU node one
  GPU each, round-robin by Hydra's job number), else the CPU; ``cpu``, ``cuda``, ``cuda:N`` as given.
- ``threads``: torch's CPU threads (0 = torch's default). Above the cores this process may use it is
  refused on this machine (``check_threads``) and clamped in a task on another machine
  (``usable_threads``). It is part of the config hash (``fedlnl/conf/keys.py``).
- The model's initial weights come from the run seed in a forked RNG (``seeded_init``), not from
  global state.
"""
from __future__ import annotations

import contextlib
import logging
import os

import torch
from hydra.core.hydra_config import HydraConfig

from fedlnl.benchmark.validate import ConfigError

log = logging.getLogger("fedlnl")


def place(cfg) -> torch.device:
    """Apply the run's ``threads`` to torch and return its device (``device``)."""
    threads = int(cfg.get("threads") or 0)
    if threads > 0:
        torch.set_num_threads(usable_threads(threads))
    return resolve_device(str(cfg.device))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        count, job = torch.cuda.device_count(), multirun_job_num()
        if count > 1 and job is not None:
            # parallel sweep jobs (e.g. hydra/launcher=joblib) on a multi-GPU node: one GPU per job,
            # round-robin by Hydra's job number; set_device sends any plain "cuda" tensor there too
            device = torch.device(f"cuda:{job % count}")
            torch.cuda.set_device(device)
            return device
        return torch.device("cuda")  # one visible GPU (e.g. a SLURM task's), or a single run
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} is invalid: no CUDA device is available (use auto or cpu)")
    return torch.device(name)


def multirun_job_num() -> int | None:
    """Hydra's job number inside a multirun (``-m``), else None."""
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    return int(hc.job.num) if hc.mode is not None and hc.mode.name == "MULTIRUN" else None


def cores() -> int:
    """The CPU cores this process may run on (its affinity: a SLURM allocation, taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_threads(cfg) -> None:
    """``threads`` above the cores this process may use only slows torch down: refused here (a run
    on this machine); a task on another machine (SLURM) clamps it instead (``usable_threads``)."""
    threads, n = cfg.get("threads"), cores()
    if isinstance(threads, int) and not isinstance(threads, bool) and threads > n:
        raise ConfigError(f"threads={threads} is invalid: allowed an integer in [0, {n}] (the cores this process "
                          f"may use; 0 = torch's default)")


def usable_threads(threads: int) -> int:
    n = cores()
    if threads > n:
        log.warning("threads=%d exceeds the %d cores this process may use: using %d", threads, n, n)
        return n
    return threads


@contextlib.contextmanager
def seeded_init(seed: int):
    """Build a model inside: its initial weights come from ``seed``; torch's global RNG is restored
    afterwards (CPU generator; a model is built on the CPU and moved to the device after)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield
