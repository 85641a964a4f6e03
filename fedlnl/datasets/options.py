"""Checks of the dataset, partition and noise options before any data is loaded.

``check_options`` raises the one-line ``ConfigError`` (a ValueError) of ``fedlnl.conf.checks``,
``"KEY=VALUE is invalid: allowed ..."``, for the first bad option: unknown keys, kinds, shares, concentrations, integer counts, map entries, mixed
groups, image sizes and the loaders' own keys (each loader's declaration, ``loader_options``). A partition or
noise kind's keys and checks are those it registered (``kinds``), with the helpers below. Data-dependent
conditions (enough samples per client, class names of a map, files) are checked when the federation
is built.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from fedlnl.conf import checks
from fedlnl.conf.checks import check_node, fail, integer, number  # noqa: F401 (the kinds' checks import them from here)

from .loader_options import DatasetNode

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
    """The loader's declared options (``loader_options``); a loader without a declaration (one of
    your own): the keys of its signature."""
    target = ds.get("_target_")
    if not isinstance(target, str) or not target:
        fail("dataset._target_", target, "a loader such as fedlnl.datasets.sources.folder")
    loader = _loader(target)
    if loader is None:
        return
    node = {k: v for k, v in ds.items() if k not in ("_target_", *_fields(DatasetNode))}
    check_node(DatasetNode, ds, "dataset.")
    declared = getattr(loader, "options", None)
    if declared is not None:
        check_node(declared, node, "dataset.", closed=target)
        return
    params = _signature_keys(loader)
    unknown = sorted(set(node) - set(params or node))
    if unknown:
        fail(f"dataset.{unknown[0]}", ds[unknown[0]], f"the keys of {target}: {', '.join(params)}")


def _loader(target: str):
    """The loader function (None when it cannot be imported: Hydra reports that)."""
    from hydra.utils import get_method

    try:
        return get_method(target)
    except Exception:  # noqa: BLE001  (an unknown target: left to the loader's own error)
        return None


def _signature_keys(fn) -> tuple[str, ...] | None:
    """The keyword arguments of an undeclared loader (None: it takes any keyword)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in params if p.kind in kinds)


def _fields(decl) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(decl))


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
