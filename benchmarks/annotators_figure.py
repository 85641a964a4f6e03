"""The figure of docs/breadth.md for ``noise=cifarn noise.label_set=annotators``: each client's realised
noise rate, coloured by the CIFAR-10N annotator it was given, for a balanced and a weighted assignment.

Builds the federations with fedlnl's own code (no training) and prints the per-annotator figures.
Usage: FEDLNL_SHARED=../shared python benchmarks/annotators_figure.py [--out docs/figures/annotators.png]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_module

from fedlnl.datasets.federation import build_federation
from fedlnl.datasets.noise import ANNOTATORS

CASES = (("balanced", []), ("annotator_weights=[1,1,2]", ["noise.annotator_weights=[1,1,2]"]))


def federation(extra: list[str], clients: int, seed: int):
    with initialize_config_module(config_module="fedlnl.conf", version_base=None):
        cfg = compose(config_name="config", overrides=["dataset=cifar10_jpeg", "noise=cifarn",
                                                       "noise.label_set=annotators", f"fl.num_clients={clients}",
                                                       f"seed={seed}", *extra])
    return build_federation(cfg.dataset, cfg.partition, cfg.noise, cfg.fl.num_clients, cfg.seed, 0.0)


def main(argv: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/figures/annotators.png"))
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    fig, axes = plt.subplots(1, len(CASES), figsize=(5 * len(CASES), 3.2), sharey=True)
    colours = dict(zip(ANNOTATORS, ("tab:blue", "tab:orange", "tab:green")))
    for ax, (title, extra) in zip(axes, CASES):
        fed = federation(extra, args.clients, args.seed)
        kinds, rates = np.array(fed.oracle.client_kind), 100 * fed.oracle.realized_rate
        for name in ANNOTATORS:
            k = np.flatnonzero(kinds == name)
            ax.scatter(k, rates[k], s=10, color=colours[name], label=f"{name} ({len(k)} clients)")
            if len(k):
                print(f"{title}: {name}: {len(k)} clients, realised rate mean {rates[k].mean():.2f} %, "
                      f"min {rates[k].min():.2f}, max {rates[k].max():.2f}")
        ax.set_title(f"{title} (federation {fed.hash[:8]})", fontsize=9)
        ax.set_xlabel("client")
        ax.legend(fontsize=7, loc="upper right")
    axes[0].set_ylabel("realised noise rate (%)")
    fig.suptitle(f"CIFAR-10N, one annotator per client: {args.clients} IID clients, seed {args.seed}", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
