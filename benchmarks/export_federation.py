"""Export the federation a ``fedlnl-run`` config builds, so external code (e.g. a method's official
repository) can be run on exactly the same partition and noisy labels.

The federation is built with fedlnl's own code (``build_federation``, the call ``Runner.prepare``
makes), from the config composed from the given Hydra overrides; ``--images`` adds the decoded
training and test images (uint8, NCHW, in the suite's sample order: the original CIFAR-10 order for
``cifar10_jpeg``), so the external code need not re-read the image files.

Written (one ``.npz``): ``client_offsets`` [N+1] and ``client_indices`` (client k holds
``client_indices[client_offsets[k]:client_offsets[k+1]]``, global training indices), likewise
``val_offsets`` and ``val_indices`` (each client's held-out validation samples, ``selection.val_share``:
not trained on; empty at 0), ``labels``
(observed, noisy), ``clean_labels``, ``mu`` (sampled noise level per client), ``realized_rate``,
``noisy_client``, ``y_test``, ``federation_hash``, ``config`` (the composed config as YAML), and with
``--images`` ``x_train``/``x_test``, ``mean``/``std``. The clean labels are the oracle's: for scoring
the external run only, never for the method.

Usage:
  FEDLNL_SHARED=/path/to/shared python benchmarks/export_federation.py OUT.npz [--images] \\
      dataset=cifar10_jpeg model=lenet noise.rho_tau=[0.6,0.5] seed=0
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from fedlnl.benchmark.selection import SelectionSettings
from fedlnl.datasets.federation import build_federation


def export(overrides: list[str], out: Path, images: bool) -> dict:
    with initialize_config_module(config_module="fedlnl.conf", version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    sel = SelectionSettings.of(cfg.get("selection"))
    fed = build_federation(cfg.dataset, cfg.partition, cfg.noise, cfg.fl.num_clients, cfg.seed, sel.val_share,
                           sel.client_test_size)
    sizes = np.array([len(ix) for ix in fed.client_indices], dtype=np.int64)
    arrays = {
        "client_offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        "client_indices": np.concatenate(fed.client_indices).astype(np.int64),
        "val_offsets": np.concatenate([[0], np.cumsum(fed.val_sizes)]).astype(np.int64),
        "val_indices": np.concatenate([np.zeros(0, np.int64), *fed.client_val]).astype(np.int64),
        "labels": fed.labels.numpy().astype(np.int64),
        "clean_labels": fed.oracle.clean_labels.numpy().astype(np.int64),
        "mu": np.asarray(fed.oracle.mu, np.float64),
        "realized_rate": np.asarray(fed.oracle.realized_rate, np.float64),
        "noisy_client": np.asarray(fed.oracle.noisy_client, bool),
        "y_test": fed.source.y_test.numpy().astype(np.int64),
        "federation_hash": np.array(fed.hash),
        "config": np.array(OmegaConf.to_yaml(cfg, resolve=True)),
    }
    if images:
        arrays.update(x_train=fed.source.x_train.numpy(), x_test=fed.source.x_test.numpy(),
                      mean=np.asarray(fed.source.mean), std=np.asarray(fed.source.std))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **arrays)
    return {"hash": fed.hash, "clients": len(sizes), "noise_rate": float(fed.oracle.noisy_mask.double().mean())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the .npz file to write")
    ap.add_argument("--images", action="store_true", help="also store the decoded images")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for fedlnl-run")
    args = ap.parse_intermixed_args(argv)
    info = export(args.overrides, args.out, args.images)
    print(f"{args.out}: federation {info['hash']}, {info['clients']} clients, "
          f"realised noise {info['noise_rate']:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
