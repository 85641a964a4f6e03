"""Checks of the dataset, partition and noise options before any data is loaded.

``check_options`` raises the one-line ``ConfigError`` (a ValueError) of ``fedlnl.conf.checks``,
``"KEY=VALUE is invalid: allowed ..."``, for the first bad option: unknown keys, kinds, shares, concentrations, integer counts, map entries, mixed
groups, image sizes and the loaders' own keys (read from the loader's signature). Data-dependent
conditions (enough samples per client, class names of a map, files) are checked when the federation
is built.
"""
from __future__ import annotations

import inspect
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from fedlnl.conf import checks
from fedlnl.conf.checks import fail as _fail
from fedlnl.conf.checks import is_number as _num
from . import noise as noisemod
from . import partition as partmod
from .labelmaps import NAMED_MAPS

#: keys each partition kind takes (besides ``kind``); p_alpha is noniid's sweep pair
PARTITION_KEYS = {
    "iid": ("sizes", "sigma", "alpha"),
    "noniid": ("p", "alpha", "p_alpha"),
    "shards": ("s",),
    "classes": ("k",),
    "dirichlet": ("alpha", "min_size"),
}
#: keys each noise kind takes (besides ``kind``; fidelity and rho_tau are sweep/switch conveniences)
_SYNTHETIC = ("rho", "tau", "rho_tau", "fidelity", "count")
NOISE_KEYS = {
    "symmetric": _SYNTHETIC + ("label_range", "exclude_true"),
    "pairflip": _SYNTHETIC,
    "asymmetric": _SYNTHETIC + ("map",),
    "instance": ("rho", "tau", "rho_tau", "fidelity", "std"),
    "mixed": ("rho", "tau", "fidelity", "groups", "count", "label_range", "exclude_true", "map", "std"),
    "cifarn": ("label_set", "file", "rho", "tau"),
}
assert set(NOISE_KEYS) == set(noisemod.KINDS + noisemod.HUMAN_KINDS)
assert set(PARTITION_KEYS) == set(partmod.KINDS)


def check_options(dataset_cfg: Mapping[str, Any], partition_cfg: Mapping[str, Any],
                  noise_cfg: Mapping[str, Any]) -> None:
    """Raise ``ValueError("KEY=VALUE is invalid: allowed ...")`` for the first invalid option."""
    check_partition(_plain(partition_cfg))
    check_noise(_plain(noise_cfg))
    check_dataset(_plain(dataset_cfg))


# ---------------------------------------------------------------------------------------------
# partition


def check_partition(part: dict) -> None:
    kind = _one_of("partition.kind", part.get("kind"), partmod.KINDS)
    _known_keys("partition", kind, part, PARTITION_KEYS[kind])
    if kind == "iid":
        sizes = _one_of("partition.sizes", part.get("sizes", "equal"), partmod.SIZES)
        if sizes == "lognormal":
            _number("partition.sigma", part.get("sigma"), lambda v: v > 0, "a log-normal sigma > 0")
        if sizes == "dirichlet":
            _number("partition.alpha", part.get("alpha"), lambda v: v > 0, "a Dirichlet concentration > 0")
    elif kind == "noniid":
        pair = part.get("p_alpha")
        if pair is not None and (not isinstance(pair, list) or len(pair) != 2):
            _fail("partition.p_alpha", pair, "a pair [p, alpha] or null")
        _number("partition.p", part.get("p"), lambda v: 0 < v <= 1, "a probability in (0, 1]")
        _number("partition.alpha", part.get("alpha"), lambda v: v > 0, "a Dirichlet concentration > 0")
    elif kind == "shards":
        _integer("partition.s", part.get("s"), 1)
    elif kind == "classes":
        _integer("partition.k", part.get("k"), 1)
    elif kind == "dirichlet":
        _number("partition.alpha", part.get("alpha"), lambda v: v > 0, "a Dirichlet concentration > 0")
        _integer("partition.min_size", part.get("min_size", 10), 0)


# ---------------------------------------------------------------------------------------------
# noise


def check_noise(noise: dict) -> None:
    kind = _one_of("noise.kind", noise.get("kind"), noisemod.KINDS + noisemod.HUMAN_KINDS)
    _known_keys("noise", kind, noise, NOISE_KEYS[kind])
    if "fidelity" in noise:
        _one_of("noise.fidelity", noise["fidelity"], ("paper", "reference"))
    pair = noise.get("rho_tau")
    if pair is not None and (not isinstance(pair, list) or len(pair) != 2):
        _fail("noise.rho_tau", pair, "a pair [rho, tau] or null")
    if kind in noisemod.HUMAN_KINDS:
        _one_of("noise.label_set", noise.get("label_set"), tuple(noisemod.CIFARN_SETS))
        for key in ("rho", "tau"):
            if noise.get(key) not in (None, 0, 0.0):
                _fail(f"noise.{key}", noise[key], "null (real noise: no synthetic level)")
        if not isinstance(noise.get("file"), str) or not noise["file"]:
            _fail("noise.file", noise.get("file"), "a path to the CIFAR-N .pt file or its folder")
        return
    share = lambda v: 0 <= v <= 1  # noqa: E731
    if kind == "mixed":
        if noise.get("rho") is not None:
            _fail("noise.rho", noise["rho"], "null (noise=mixed: the groups' shares say which clients are noisy)")
        if noise.get("tau") is not None:
            _number("noise.tau", noise["tau"], share, "a noise level in [0, 1] or null")
        noisemod.check_groups(noise.get("groups"))
    else:
        _number("noise.rho", noise.get("rho"), share, "a share in [0, 1]")
        _number("noise.tau", noise.get("tau"), share, "a noise level in [0, 1]")
    if "count" in noise:
        _one_of("noise.count", noise["count"], noisemod.COUNTS)
    if "label_range" in noise:
        _one_of("noise.label_range", noise["label_range"], noisemod.LABEL_RANGES)
    if "exclude_true" in noise:
        checks.flag("noise.exclude_true", noise["exclude_true"])
    if "std" in noise:
        _number("noise.std", noise["std"], lambda v: v >= 0, "a standard deviation >= 0")
    if "map" in noise:
        check_map(noise["map"])


def check_map(spec) -> None:
    """A named map, or a non-empty mapping of class indices (>= 0) or class names."""
    if isinstance(spec, str):
        _one_of("noise.map", spec, NAMED_MAPS)
        return
    if not isinstance(spec, dict) or not spec:
        _fail("noise.map", spec, f"{', '.join(NAMED_MAPS)} or a mapping {{source class: destination class}}")
    for a, b in spec.items():
        for c in (a, b):
            ok = checks.is_int(c, 0) or (isinstance(c, str) and c.strip())
            if not ok:
                _fail(f"noise.map.{a}", b, "class indices >= 0 or class names on both sides")


# ---------------------------------------------------------------------------------------------
# dataset


def check_dataset(ds: dict) -> None:
    target = ds.get("_target_")
    if not isinstance(target, str) or not target:
        _fail("dataset._target_", target, "a loader such as fedlnl.datasets.sources.folder")
    params = _loader_params(target)
    if params is not None:
        unknown = sorted(set(ds) - {"_target_", "family"} - set(params))  # family: the methods' table column
        if unknown:
            _fail(f"dataset.{unknown[0]}", ds[unknown[0]], f"the keys of {target}: {', '.join(params)}")
    for key, value in ds.items():
        rule = _DATASET_RULES.get((target.rsplit(".", 1)[-1], key)) or _DATASET_RULES.get(("*", key))
        if rule is not None and not rule[0](value):
            _fail(f"dataset.{key}", value, rule[1])


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


def _one_of(key: str, value, allowed) -> str:
    return checks.choice(key, value, allowed, text=True)


_number = checks.number
_integer = checks.integer


def _known_keys(group: str, kind: str, cfg: dict, keys: tuple[str, ...]) -> None:
    unknown = sorted(set(cfg) - {"kind"} - set(keys))
    if unknown:
        _fail(f"{group}.{unknown[0]}", cfg[unknown[0]], f"the keys of {group}={kind}: kind, {', '.join(keys)}")


def _plain(cfg) -> dict:
    if cfg is None:
        return {}
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    return OmegaConf.to_container(node, resolve=True, throw_on_missing=False)
