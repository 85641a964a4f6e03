"""Where a run computes: the ``device``, ``determinism`` and ``threads`` keys, the run's identity,
and the seed the model is initialised from. The one home of a run's placement and device policy:
the runner, the preflight checks and the sweeper ask here.

- ``device``: ``auto`` takes the GPU when there is one (parallel sweep jobs on a multi-GPU node one
  GPU each, round-robin by Hydra's job number), else the CPU; ``cpu``, ``cuda``, ``cuda:N`` (made the
  current CUDA device; N below the visible device count) and ``mps`` (Apple GPUs, where torch has it).
- ``determinism`` (``apply_determinism``): ``strict`` (default) makes an accelerator run
  reproducible: on CUDA cuDNN deterministic with benchmarking off, TF32 off for matmuls and
  convolutions, ``torch.use_deterministic_algorithms(True)`` and cuBLAS's fixed workspace
  (``CUBLAS_WORKSPACE_CONFIG``, set before CUDA initialises); on MPS deterministic algorithms.
  ``fast`` allows cuDNN benchmarking and TF32: numbers may differ run to run. A CPU run is
  deterministic either way and keeps torch's defaults (its numbers do not depend on the mode).
- ``identity``: what a run's numbers depend on beyond its config (device kind, GPU model,
  determinism mode, torch version), recorded in summary.json and the checkpoint; a resume and
  ``skip_complete`` refuse a cell recorded with another device kind or determinism mode
  (``check_identity``), and the report never pools device kinds.
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


#: the values of ``determinism``
DETERMINISM = ("strict", "fast")
#: cuBLAS's reproducible workspace (the CUDA docs' "results reproducibility"); read when a cuBLAS
#: handle gets its workspace, so it is set before CUDA initialises
CUBLAS_WORKSPACE = ":4096:8"
#: the identity fields a resume and ``skip_complete`` compare
COMPARED = ("device_kind", "determinism")


#: torch's thread count when this process imported fedlnl: what ``threads=0`` runs with, also after a
#: cell with another count ran in the same process (a joblib worker runs many cells)
DEFAULT_THREADS = torch.get_num_threads()


def place(cfg) -> torch.device:
    """Apply the run's ``threads`` and ``determinism`` to torch and return its device (``device``)."""
    threads = int(cfg.get("threads") or 0)
    wanted = usable_threads(threads) if threads > 0 else DEFAULT_THREADS
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    mode = str(cfg.get("determinism", "strict"))
    if mode == "strict":  # before resolve_device: set_device initialises CUDA
        set_cublas_workspace()
    dev = resolve_device(str(cfg.device))
    apply_determinism(dev, mode)
    return dev


def run_identity(cfg) -> dict:
    """The identity a run of ``cfg`` would have on this machine (its device resolved, nothing applied)."""
    mode = str(cfg.get("determinism", "strict"))
    if mode == "strict":
        set_cublas_workspace()
    return identity(resolve_device(str(cfg.device)), mode)


def set_cublas_workspace() -> None:
    """``CUBLAS_WORKSPACE_CONFIG`` for reproducible cuBLAS, unless the user set it; warns when CUDA
    is already initialised in this process (handles made before keep their workspace)."""
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") in (CUBLAS_WORKSPACE, ":16:8"):
        return
    if torch.cuda.is_initialized():
        log.warning("CUBLAS_WORKSPACE_CONFIG set after CUDA initialised in this process: set it to %s "
                    "before starting for reproducible cuBLAS", CUBLAS_WORKSPACE)
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE


def apply_determinism(dev: torch.device, mode: str) -> None:
    """Set torch's global algorithm flags for ``mode`` on ``dev`` (every flag, each time: cells of a
    sweep run in one process may differ). CPU runs keep torch's defaults: they are deterministic
    already, and deterministic algorithms could change CPU kernels (their numbers must not move)."""
    if mode not in DETERMINISM:
        raise ConfigError(f"determinism={mode!r} is invalid: allowed {', '.join(DETERMINISM)}")
    strict = mode == "strict" and dev.type != "cpu"
    if torch.are_deterministic_algorithms_enabled() != strict:
        # only on a change: the call imports torch._inductor (~1 s a process, every CPU run paid it for
        # a flag already off); the flag it also sets (inductor's) follows the last such call
        torch.use_deterministic_algorithms(strict)
    torch.backends.cudnn.deterministic = strict
    torch.backends.cudnn.benchmark = mode == "fast" and dev.type == "cuda"
    tf32 = mode == "fast" and dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32 if dev.type == "cuda" else True  # torch's default off CUDA


def identity(dev: torch.device, mode: str) -> dict:
    """The run's identity beyond its config: device kind (cpu / cuda / mps), GPU model (None on the
    CPU), determinism mode, torch version."""
    gpu = None
    if dev.type == "cuda":
        gpu = torch.cuda.get_device_name(dev)
    elif dev.type == "mps":
        gpu = "Apple MPS"
    return {"device_kind": dev.type, "gpu": gpu, "determinism": mode, "torch": torch.__version__}


def identity_mismatch(recorded: dict | None, current: dict) -> str | None:
    """``device kind cpu -> cuda`` for the compared fields that differ, None when they agree (a
    record without them, written before they were recorded, is not compared)."""
    if not isinstance(recorded, dict):
        return None
    diff = [f"{k.replace('_', ' ')} {recorded[k]} -> {current[k]}" for k in COMPARED
            if recorded.get(k) is not None and recorded[k] != current[k]]
    return ", ".join(diff) or None


def resolve_device(name: str) -> torch.device:
    if name == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError("device='mps' is invalid: no MPS (Apple GPU) device is available (use auto or cpu)")
        return torch.device("mps")
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
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise ConfigError(f"device={name!r} is invalid: {count} CUDA device(s) visible, allowed cuda:0 to "
                              f"cuda:{count - 1} (or cuda, auto)")
        torch.cuda.set_device(device)  # plain "cuda" tensors (and cuBLAS handles) go there too
    return device


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
