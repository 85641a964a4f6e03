"""``make bench-gpu``: every method on the CUDA device, for LeNet-5 and ResNet-18: images/s, host
syncs per optimiser step and peak device memory.

Each (method, model) is one tiny run through the real runner (``debug=tiny`` schedules, the synthetic
3x32x32 dataset, strict determinism) in a scratch directory:
  images/s        optimiser steps x batch size / wall time of the run (evaluation included)
  syncs/step      host synchronisations counted by ``torch.cuda.set_sync_debug_mode("warn")`` (one
                  warning per synchronising call) over the whole run, divided by its optimiser steps
  peak MB         ``torch.cuda.max_memory_allocated`` over the run
The first run of a process pays CUDA's start-up: a warm-up run is made and not printed. Without a
CUDA device it prints one line saying so and exits 0.
Usage: python benchmarks/bench_gpu.py [--models lenet resnet18] [--methods fedavg fedprox ...]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

CONF = Path(__file__).resolve().parents[1] / "fedlnl" / "conf"


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="fedlnl.conf", version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)


def measure(method: str, model: str, batch_size: int) -> dict:
    from fedlnl.benchmark.runner import run

    cfg = compose([f"method={method}", "debug=tiny", "dataset=synthetic", f"model={model}", "device=cuda",
                   "logger=none", "threads=1", "noise.rho_tau=[0.6,0.5]", f"fl.batch_size={batch_size}"])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        t = time.perf_counter()
        try:
            summary = run(cfg, Path(tmp) / "run", method)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    steps = max(int(summary.get("local_steps") or 0), 1)
    return {"status": summary.get("status"), "images_s": steps * batch_size / wall, "syncs_step": syncs / steps,
            "peak_mb": torch.cuda.max_memory_allocated() / 2**20, "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["lenet", "resnet18"])
    ap.add_argument("--methods", nargs="+", default=sorted(p.stem for p in (CONF / "method").glob("*.yaml")))
    ap.add_argument("--batch-size", type=int, default=10)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench-gpu: no CUDA device on this machine: nothing measured")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch_size}, determinism strict")
    measure("fedavg", args.models[0], args.batch_size)  # warm-up: CUDA context, cuDNN, allocator
    print(f"{'method':<22}{'model':<10}{'images/s':>10}{'syncs/step':>12}{'peak MB':>10}{'steps':>8}")
    for model in args.models:
        for method in args.methods:
            try:
                r = measure(method, model, args.batch_size)
            except Exception as err:  # noqa: BLE001  (one method's failure is a row, not the end)
                print(f"{method:<22}{model:<10}  failed: {type(err).__name__}: {str(err).splitlines()[0][:80]}")
                continue
            print(f"{method:<22}{model:<10}{r['images_s']:>10.0f}{r['syncs_step']:>12.2f}{r['peak_mb']:>10.0f}"
                  f"{r['steps']:>8}" + ("" if r["status"] == "complete" else f"  ({r['status']})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
