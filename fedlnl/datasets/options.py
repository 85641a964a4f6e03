"""Checks of the dataset, partition and noise options before any data is loaded.

``check_options`` raises the one-line ``ConfigError`` (a ValueError) of ``fedlnl.conf.checks``,
``"KEY=VALUE is invalid: allowed ..."``, for the first bad option. Each node is checked against its
declaration (``checks.check_node``): a partition or noise kind's options (``Kind.options``, declared
beside the kind) and the dataset loader's options (``loader_options``, named by ``@options`` on the
loader). Data-dependent conditions (enough samples per client, class names of a map, files) are
checked when the federation is built.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Mapping

from omegaconf import DictConfig, ListConfig, OmegaConf

from fedlnl.conf import checks
from fedlnl.conf.checks import check_node, fail, integer, number  # noqa: F401 (the kinds' checks import them from here)

from . import kinds
from .loader_options import DatasetNode


def check_options(dataset_cfg: Mapping[str, Any], partition_cfg: Mapping[str, Any],
                  noise_cfg: Mapping[str, Any]) -> None:
    """Raise ``ValueError("KEY=VALUE is invalid: allowed ...")`` for the first invalid option. A key
    whose interpolation fails (``noise.rho`` of a malformed ``noise.rho_tau``) is left out while the
    others are checked, so the error names the value typed; then its resolution error is raised."""
    for check, cfg in ((check_partition, partition_cfg), (check_noise, noise_cfg), (check_dataset, dataset_cfg)):
        values, error = _resolved(cfg)
        check(values, partial=error is not None)
        if error is not None:
            raise error


# ---------------------------------------------------------------------------------------------
# partition and noise: the kind's declared options (``kinds``)


def check_partition(part: dict, partial: bool = False) -> None:
    _check_kind("partition", part, kinds.partitions(), partial)


def check_noise(noise: dict, partial: bool = False) -> None:
    _check_kind("noise", noise, kinds.noises(), partial)


def _check_kind(group: str, cfg: dict, registered: dict, partial: bool) -> None:
    """The registered kind of a partition / noise node, then its declared options (``Kind.options``)."""
    kind = registered[one_of(f"{group}.kind", cfg.get("kind"), tuple(registered))]
    check_node(kind.options, cfg, f"{group}.", closed=f"{group}={kind.name}", partial=partial)


def pair(names: tuple[str, str]):
    """The rule of a zipped pair key ``[a, b]`` (``p_alpha``, ``rho_tau``): two numbers, or null."""
    def check(key: str, value) -> None:
        if value is not None and (not isinstance(value, list) or len(value) != 2
                                  or not all(checks.is_number(v) for v in value)):
            fail(key, value, f"a pair [{names[0]}, {names[1]}] of numbers or null")
    return checks.rule(check)


def check_pair(node: Mapping, prefix: str, key: str, names: tuple[str, str]) -> None:
    """A zipped pair ``[a, b]`` (checked by its rule, ``pair``) and its two keys must agree:
    ``noise.rho_tau=[0.6,0.5] noise.rho=0.2`` is a contradiction, not a silent override (a kind's
    ``relations``)."""
    pair = node.get(key)
    if pair is None:
        return
    for i, sub in enumerate(names):
        if node.get(sub) != pair[i]:
            raise checks.ConfigError(f"{prefix}{sub}={node.get(sub)!r} contradicts {prefix}{key}={pair!r}: "
                                     f"set either the pair or {prefix}{names[0]}/{prefix}{names[1]}, not both")


# ---------------------------------------------------------------------------------------------
# dataset


def check_dataset(ds: dict, partial: bool = False) -> None:
    """The loader's declared options (``loader_options``); a loader without a declaration (one of
    your own): the keys of its signature."""
    target = ds.get("_target_")
    if not isinstance(target, str) or not target:
        fail("dataset._target_", target, "a loader such as fedlnl.datasets.sources.folder")
    loader = _loader(target)
    if loader is None:
        return
    node = {k: v for k, v in ds.items() if k not in ("_target_", *_fields(DatasetNode))}
    check_node(DatasetNode, ds, "dataset.", partial=partial)
    declared = getattr(loader, "options", None)
    if declared is not None:
        check_node(declared, node, "dataset.", closed=target, partial=partial)
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


def _resolved(cfg) -> tuple[dict, Exception | None]:
    """The node's values, resolved key by key (a missing ``???`` kept as is), and the first error of
    a key that cannot be resolved (that key left out)."""
    if cfg is None:
        return {}, None
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    values, error = {}, None
    for key in node:
        try:
            value = "???" if OmegaConf.is_missing(node, key) else node[key]
            values[key] = (OmegaConf.to_container(value, resolve=True, throw_on_missing=False)
                           if isinstance(value, (DictConfig, ListConfig)) else value)
        except Exception as err:  # noqa: BLE001  (any resolver's error: raised after the other checks)
            error = error or err
    return values, error
