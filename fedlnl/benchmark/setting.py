"""The keys a report groups runs by (dataset, noise and partition settings), from a resolved config.

One function for the runner (which writes it into summary.json) and the report (which reads it from
a run that stopped before its summary): torch-free, so the report never imports the runner. Which
options name a partition's or noise model's setting is the kind's own declaration (its
``setting`` in ``fedlnl.datasets.kinds``): (p, alpha) of the partition and (rho, tau) of the noise
have columns of their own, every other key is an extra.
"""
from __future__ import annotations

from fedlnl.datasets import kinds

#: the partition's setting keys that have a column of their own
PAIR = ("p", "alpha")


def extras() -> dict[str, tuple[str, ...]]:
    """Every kind-specific key a setting can hold, per group (e.g. partition: s, k, sizes, ...)."""
    return {"partition": tuple(k for k in kinds.setting_keys("partition") if k not in PAIR),
            "noise": kinds.setting_keys("noise")}


def setting_of(config: dict) -> dict:
    noise, part = config.get("noise") or {}, config.get("partition") or {}
    dataset, fl = config.get("dataset") or {}, config.get("fl") or {}
    part_keys, noise_keys = _kind_settings(kinds.partition(part.get("kind")), part), \
        _kind_settings(kinds.noise(noise.get("kind")), noise)
    extras = {k: v for k, v in {**part_keys, **noise_keys}.items() if v is not None and k not in PAIR}
    return {
        **extras,
        "dataset": dataset.get("name"), "family": dataset.get("family"), "noise": noise.get("kind"),
        "rho": noise.get("rho"), "tau": noise.get("tau"), "partition": part.get("kind"),
        "p": part_keys.get("p"), "alpha": part_keys.get("alpha"),
        "num_clients": fl.get("num_clients"), "fidelity": config.get("fidelity"),
        "noise_fidelity": noise.get("fidelity"),
    }


def _kind_settings(kind, node: dict) -> dict:
    """Only the options the kind reads (an IID run with equal sizes has none); none for a kind this
    process does not know (a run of a kind registered elsewhere)."""
    return {} if kind is None else kind.settings(node)
