"""Export the federation a ``fedlnl-run`` config builds as one ``.npz`` with its oracle, so an external
harness (``benchmarks/feddiv_official``: a method's official code) runs and is scored on exactly the same
partition and noisy labels.

A thin wrapper of ``fedlnl.benchmark.export.bundle`` (the logic lives in the package, with the run's
checks; ``fedlnl-export`` writes the same federation as a checksummed directory for other frameworks,
without the oracle unless asked). ``--images`` adds the decoded training and test images (uint8, NCHW, in the suite's sample
order: the original CIFAR-10 order for ``cifar10_jpeg``), so the external code need not re-read the
image files.

Written (one ``.npz``): ``client_offsets`` [N+1] and ``client_indices`` (client k holds
``client_indices[client_offsets[k]:client_offsets[k+1]]``, global training indices), likewise
``val_offsets``/``val_indices`` (each client's held-out validation samples, ``selection.val_share``:
not trained on; empty at 0) and ``test_offsets``/``test_indices`` (its local test set), ``labels``
(observed, noisy), ``y_test`` (= ``test_labels``), the oracle's ``clean_labels``, ``mu`` (sampled noise level per client),
``realized_rate``, ``noisy_client``, ``client_kind``, ``federation_hash``, ``config`` (the composed
config as YAML), and with ``--images`` ``x_train``/``x_test``, ``mean``/``std``. The clean labels are
for scoring the external run only, never for the method.

Usage:
  FEDLNL_SHARED=/path/to/shared python benchmarks/export_federation.py OUT.npz [--images] \\
      dataset=cifar10_jpeg model=lenet noise.rho_tau=[0.6,0.5] seed=0
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fedlnl.benchmark.export import bundle
from fedlnl.benchmark.validate import ConfigError


def export(overrides: list[str], out: Path, images: bool) -> dict:
    arrays, fed = bundle(overrides, images)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **arrays)
    return {"hash": fed.hash, "clients": fed.num_clients, "noise_rate": float(fed.oracle.noisy_mask.double().mean())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the .npz file to write")
    ap.add_argument("--images", action="store_true", help="also store the decoded images")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for fedlnl-run")
    args = ap.parse_intermixed_args(argv)
    try:
        info = export(args.overrides, args.out, args.images)
    except ConfigError as err:
        print(f"export_federation.py: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"{args.out}: federation {info['hash']}, {info['clients']} clients, "
          f"realised noise {info['noise_rate']:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
