"""Checks of the dataset, partition and noise options before any data is loaded.

``check_options`` raises the one-line ``ConfigError`` (a ValueError) of ``fedlnl.conf.checks``,
``"KEY=VALUE is invalid: allowed ..."``, for the first bad option: unknown keys, kinds, shares, concentrations, integer counts, map entries, mixed
groups, image sizes and the loaders' own keys (read from the loader's signature). A partition or
noise kind's keys and checks are those it registered (``kinds``), with the helpers below. Data-dependent
conditions (enough samples per client, class names of a map, files) are checked when the federation
is built.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from fedlnl.conf import checks
from fedlnl.conf.checks import fail, integer, number  # noqa: F401 (the kinds' checks import them from here)

from . import kinds


def check_options(dataset_cfg: Mapping[str, Any], partition_cfg: Mapping[str, Any],
                  noise_cfg: Mapping[str, Any]) -> None:
    """Raise ``ValueError("KEY=VALUE is invalid: allowed ...")`` for the first invalid option."""
    check_partition(_plain(partition_cfg))
    check_noise(_plain(noise_cfg))
    check_dataset(_plain(dataset_cfg))


# ---------------------------------------------------------------------------------------------
# partition and noise: the kind's registered keys and checks (``kinds``)


def check_partition(part: dict) -> None:
    kind = _kind("partition", part, kinds.partitions())
    if kind.check is not None:
        kind.check(part)


def check_noise(noise: dict) -> None:
    kind = _kind("noise", noise, kinds.noises())
    if "fidelity" in noise:  # the noise switches' own fidelity (its YAML's ${fidelity:...} choices)
        one_of("noise.fidelity", noise["fidelity"], ("paper", "reference"))
    pair = noise.get("rho_tau")
    if pair is not None and (not isinstance(pair, list) or len(pair) != 2):
        fail("noise.rho_tau", pair, "a pair [rho, tau] or null")
    if kind.check is not None:
        kind.check(noise)


def _kind(group: str, cfg: dict, registered: dict) -> kinds.Kind:
    """The registered kind of a partition / noise node, after refusing keys it does not take."""
    kind = registered[one_of(f"{group}.kind", cfg.get("kind"), tuple(registered))]
    _known_keys(group, kind.name, cfg, kind.keys)
    return kind


# ---------------------------------------------------------------------------------------------
# dataset


def check_dataset(ds: dict) -> None:
    target = ds.get("_target_")
    if not isinstance(target, str) or not target:
        fail("dataset._target_", target, "a loader such as fedlnl.datasets.sources.folder")
    params = _loader_params(target)
    if params is not None:
        unknown = sorted(set(ds) - {"_target_", "family"} - set(params))  # family: the methods' table column
        if unknown:
            fail(f"dataset.{unknown[0]}", ds[unknown[0]], f"the keys of {target}: {', '.join(params)}")
    for key, value in ds.items():
        rule = _DATASET_RULES.get((target.rsplit(".", 1)[-1], key)) or _DATASET_RULES.get(("*", key))
        if rule is not None and not rule[0](value):
            fail(f"dataset.{key}", value, rule[1])


def _loader_params(target: str) -> tuple[str, ...] | None:
    """The keyword arguments of the loader (None when it cannot be imported: Hydra reports that)."""
    from hydra.utils import get_method

    try:
        fn = get_method(target)
    except Exception:  # noqa: BLE001  (an unknown target: left to the loader's own error)
        return None
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return None  # takes any keyword
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in params if p.kind in kinds)


_int = checks.is_int
_num = checks.is_number


def _size(v) -> bool:
    return v is None or _int(v, 1) or (isinstance(v, list) and len(v) == 2 and all(_int(x, 1) for x in v))


def _stats(v) -> bool:
    return v is None or (isinstance(v, list) and len(v) >= 1 and all(_num(x) for x in v))


def _augment(v) -> bool:
    if v is None:
        return True
    if not isinstance(v, dict) or set(v) - {"crop", "pad", "flip"}:
        return False
    return (_int(v.get("crop", 1), 1) and _int(v.get("pad", 0), 0)
            and isinstance(v.get("flip", False), bool))


def _path(v) -> bool:
    return isinstance(v, str) and bool(v.strip()) and v != "???"


_SIZE = "an integer >= 1, a pair [H, W] of integers >= 1, or null"
_DATASET_RULES = {
    ("*", "name"): (lambda v: isinstance(v, str) and bool(v), "a non-empty name"),
    ("*", "root"): (_path, "a folder path (set dataset.root=DIR)"),
    ("*", "cache_dir"): (lambda v: v is None or _path(v), "a folder path or null"),
    ("*", "download"): (lambda v: isinstance(v, bool), "true or false"),
    ("*", "mean"): (_stats, "a list of per-channel numbers or null"),
    ("*", "std"): (lambda v: _stats(v) and (v is None or all(x > 0 for x in v)),
                   "a list of per-channel numbers > 0 or null"),
    ("*", "augment"): (_augment, "null or {crop: int >= 1, pad: int >= 0, flip: true|false}"),
    ("*", "workers"): (lambda v: v is None or _int(v, 0), "an integer >= 0 or null"),
    ("*", "skip_corrupt"): (lambda v: isinstance(v, bool), "true or false"),
    ("*", "order_labels"): (lambda v: v is None or _path(v), "a .pt/.npy/.npz file or null"),
    ("*", "order_labels_key"): (lambda v: isinstance(v, str) and bool(v), "a key name"),
    ("*", "size"): (_size, _SIZE),
    ("*", "max_train"): (lambda v: v is None or _int(v, 1), "an integer >= 1 or null"),
    ("*", "max_test"): (lambda v: v is None or _int(v, 1), "an integer >= 1 or null"),
    ("*", "subsample_seed"): (lambda v: _int(v, 0), "an integer >= 0"),
    ("*", "split_seed"): (lambda v: _int(v, 0), "an integer >= 0"),
    ("*", "seed"): (lambda v: _int(v, 0), "an integer >= 0"),
    ("clothing1m", "test_size"): (lambda v: v is not None and _size(v), "an integer >= 1 or a pair [H, W]"),
    ("digits", "test_size"): (lambda v: (_num(v) and not isinstance(v, int) and 0 < v < 1) or _int(v, 1),
                              "a fraction in (0, 1) or a number of test images >= 1"),
    ("synthetic", "n_train"): (lambda v: _int(v, 1), "an integer >= 1"),
    ("synthetic", "n_test"): (lambda v: _int(v, 1), "an integer >= 1"),
    ("synthetic", "num_classes"): (lambda v: _int(v, 1), "an integer >= 1"),
    ("synthetic", "channels"): (lambda v: _int(v, 1), "an integer >= 1"),
    ("synthetic", "size"): (lambda v: _int(v, 1), "an integer >= 1"),
    ("synthetic", "noise"): (lambda v: _num(v) and v >= 0, "a pixel noise std >= 0"),
}


# ---------------------------------------------------------------------------------------------
# helpers


def one_of(key: str, value, allowed) -> str:
    return checks.choice(key, value, allowed, text=True)


def _known_keys(group: str, kind: str, cfg: dict, keys: tuple[str, ...]) -> None:
    unknown = sorted(set(cfg) - {"kind"} - set(keys))
    if unknown:
        fail(f"{group}.{unknown[0]}", cfg[unknown[0]], f"the keys of {group}={kind}: kind, {', '.join(keys)}")


def _plain(cfg) -> dict:
    if cfg is None:
        return {}
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    return OmegaConf.to_container(node, resolve=True, throw_on_missing=False)
