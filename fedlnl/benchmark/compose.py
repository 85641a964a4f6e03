"""From a composed config to the method the runner drives, and what it will actually use.

One address per value: a method's YAML holds its own hyperparameters, and may pin any shared
local-training value of the ``fl`` group per dataset (``lr: ${per_dataset:{cifar10: 0.01}}``); every
other shared value comes from ``fl``. This module applies the pins (``FLSettings``), builds the
method (and a nested ``stage3`` method) with them, and checks that what the user typed takes effect:
an ``fl.X`` override that a pin shadows, or that the method does not read, is refused with a line
naming the key that holds the value.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Mapping

from fedlnl.benchmark.validate import ConfigError
from fedlnl.methods.common.protocol import FL_FIELDS, OPTIMIZERS, FLSettings, unread_key

#: nested method configs a method takes as a built object (FedCorr's stage 3)
NESTED = ("stage3",)


def typed_keys(overrides) -> dict[str, str]:
    """``{key: value}`` of command-line overrides (Hydra's task overrides), group choices included."""
    out = {}
    for item in overrides or ():
        key, sep, value = str(item).partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def method_file(target: str) -> str:
    """``fedlnl.methods.fedprox.FedProx`` -> ``conf/method/fedprox.yaml`` (where its values live)."""
    parts = target.split(".")
    return f"conf/method/{parts[-2]}.yaml" if len(parts) >= 2 else "conf/method/"


def fl_settings(fl: Mapping, node: Mapping) -> FLSettings:
    """The shared ``fl`` values with the method node's non-null pins applied; the key the chosen
    optimiser does not read (``momentum`` of adam, ``betas`` of sgd) becomes None."""
    values = {k: fl[k] for k in FL_FIELDS}
    values.update({k: node[k] for k in FL_FIELDS if node.get(k) is not None})
    unread = unread_key(values["optimizer"])  # an unknown name is refused by the validator
    if unread is not None:
        values[unread] = None
    if values["betas"] is not None:
        values["betas"] = tuple(values["betas"])
    return FLSettings(**values)


def _resolve_class(target: str, path: str):
    module, _, name = str(target).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"{path}._target_={target!r} is invalid: no such class ({err})") from err


def build_method(node: Mapping, fl: Mapping, path: str = "method"):
    """Instantiate the method of a resolved method node with its ``FLSettings``; nested method
    nodes (``stage3``) are built first the same way, with their own pins."""
    if "_target_" not in node:
        raise ConfigError(f"{path} is invalid: a method config needs a _target_ (got keys {sorted(node)})")
    cls = _resolve_class(node["_target_"], path)
    kwargs = {}
    for key, value in node.items():
        if key == "_target_" or key in FL_FIELDS:
            continue
        if key in NESTED and isinstance(value, Mapping):
            value = build_method(value, fl, f"{path}.{key}")
        kwargs[key] = value
    params = inspect.signature(cls).parameters
    unknown = sorted(k for k in kwargs if k not in params)
    if unknown:
        own = ", ".join(k for k in params if k != "fl")
        raise ConfigError(f"{path}.{unknown[0]} is invalid: {cls.__name__} has no hyperparameter "
                          f"{unknown[0]!r} (its own: {own}; shared ones: fl.{', fl.'.join(FL_FIELDS)})")
    missing = [k for k, p in params.items() if k != "fl" and p.default is p.empty and k not in kwargs]
    if missing:
        raise ConfigError(f"{path}.{missing[0]} is missing: {method_file(node['_target_'])} must set it")
    try:
        return cls(fl=fl_settings(fl, node), **kwargs)
    except ValueError as err:  # a method's own check of its hyperparameters: one line for the user
        raise ConfigError(str(err).splitlines()[0]) from err


def method_nodes(method, node: Mapping, path: str = "method"):
    """(config path, resolved node, built method) for the method and its nested methods."""
    yield path, node, method
    for key, sub in method.nested().items():
        if isinstance(node.get(key), Mapping):
            yield from method_nodes(sub, node[key], f"{path}.{key}")


def check_typed(typed: Mapping[str, str], method, node: Mapping, family: str | None) -> None:
    """Refuse a typed ``fl.X`` that cannot take effect: shadowed by a method pin of a different
    value that the user did not also type, not read by the method at all (``fl_unused``), or not
    read by the optimiser it trains with (``momentum`` of adam, ``betas`` of sgd; also as a method
    pin ``method.X``). A typed value equal to the pin takes effect as typed, so it is accepted."""
    for path, sub, obj in method_nodes(method, node):
        check_optimizer_keys(typed, path, sub, obj, family)
    for key, value in typed.items():
        if not key.startswith("fl."):
            continue
        field = key[3:]
        for path, sub, obj in method_nodes(method, node):
            unused = obj.fl_unused
            if field in unused:
                raise ConfigError(f"{key}={value} does not apply to {type(obj).__name__}: {unused[field]}")
            pinned = sub.get(field) if field in FL_FIELDS else None
            if pinned is not None and f"{path}.{field}" not in typed and not same_value(value, pinned):
                where = f"{type(obj).__name__} on {family}, {method_file(sub['_target_'])}"
                raise ConfigError(f"{key}={value} is shadowed by {path}.{field}={pinned} ({where}): "
                                  f"set {path}.{field}=... to change it")


def same_value(typed: str, pinned) -> bool:
    """Whether a typed command-line value equals a pinned one (``0.01``, ``1e-2`` and ``.01`` all
    equal a pin of 0.01; a non-number compares as text)."""
    if isinstance(pinned, (list, tuple)):  # betas=[0.9,0.999]
        return str(typed).replace(" ", "") == str(list(pinned)).replace(" ", "")
    if isinstance(pinned, bool) or not isinstance(pinned, (int, float)):
        return str(typed).strip().lower() == str(pinned).lower()
    try:
        return float(typed) == float(pinned)
    except ValueError:
        return False


def check_optimizer_keys(typed: Mapping[str, str], path: str, node: Mapping, method, family: str | None) -> None:
    """A typed ``fl.momentum`` / ``fl.betas`` (or its pin ``<path>.momentum`` / ``<path>.betas``) that
    the method's optimiser does not read is refused, naming where the optimiser is set (a typed null
    says the same as the optimiser and passes)."""
    name = method.fl.optimizer
    field = unread_key(name)
    typed_key = next((k for k in (f"{path}.{field}", f"fl.{field}") if k in typed), None)
    if field is None or typed_key is None or typed[typed_key] == "null":
        return
    owner = path if node.get("optimizer") is not None else "fl"  # a method pin, or the shared value
    where = f"{owner}.optimizer={name}"
    if owner != "fl":
        where += f" ({type(method).__name__} on {family}, {method_file(node['_target_'])})"
    raise ConfigError(f"{typed_key}={typed[typed_key]} does not apply to {where}: {name} reads "
                      f"{OPTIMIZERS[name]}, not {field} (set {owner}.optimizer=... to change it)")


def total_rounds(method, info, rounds: int) -> int:
    """The method's own schedule length, or the runner's ``fl.rounds``."""
    return int(method.total_rounds(info, rounds))


def effective(method, node: Mapping, rounds: int, info=None) -> dict:
    """The local-training values the run uses, as recorded in summary.json (``effective``)."""
    out = dataclasses.asdict(method.fl)
    out["rounds"] = total_rounds(method, info, rounds) if info is not None else rounds
    for key, sub in method.nested().items():
        out[key] = dataclasses.asdict(sub.fl)
        length = method.nested_rounds(key, info) if info is not None else None
        if length is not None:
            out[key]["rounds"] = int(length)
    return out
