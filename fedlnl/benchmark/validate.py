"""Checks on a composed config, run before any data is loaded or any file is written."""
from __future__ import annotations

import math

from omegaconf import DictConfig


class ConfigError(ValueError):
    """A config value outside its allowed range; the message is one line for the user."""


def _check(cfg: DictConfig, key: str, ok, allowed: str) -> None:
    value = cfg
    for part in key.split("."):
        value = value.get(part) if isinstance(value, DictConfig) else None
    if value is None:
        return  # absent keys belong to groups that do not use them
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value)
    if bad:
        raise ConfigError(f"{key}={value!r} is invalid: allowed {allowed}")


def _is_int(v) -> bool:
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


def validate(cfg: DictConfig, num_train: int | None = None) -> None:
    """Raise ConfigError naming the key, the value and the allowed range."""
    for key, what in (("noise.rho_tau", "[rho, tau]"), ("partition.p_alpha", "[p, alpha]")):
        group, name = key.split(".")
        pair = cfg[group].get(name) if group in cfg else None
        if pair is not None and (not hasattr(pair, "__len__") or len(pair) != 2):
            raise ConfigError(f"{key}={pair!r} is invalid: allowed a pair {what} or null")
    unit = lambda v: 0.0 <= v <= 1.0  # noqa: E731
    _check(cfg, "noise.rho", unit, "a share in [0, 1]")
    _check(cfg, "noise.tau", unit, "a noise level in [0, 1]")
    if cfg.partition.get("kind") == "noniid":
        _check(cfg, "partition.p", lambda v: 0.0 < v <= 1.0, "a probability in (0, 1]")
        _check(cfg, "partition.alpha", lambda v: v > 0 and math.isfinite(v), "a Dirichlet concentration > 0")
    _check(cfg, "fl.frac", lambda v: 0.0 < v <= 1.0, "a fraction in (0, 1]")
    for key in ("fl.rounds", "fl.local_epochs", "fl.batch_size", "fl.eval_every"):
        _check(cfg, key, lambda v: _is_int(v) and v >= 1, "an integer >= 1")
    _check(cfg, "fl.lr", lambda v: v > 0 and math.isfinite(v), "a learning rate > 0")
    _check(cfg, "fl.num_clients", lambda v: _is_int(v) and v >= 1, "an integer >= 1")
    if num_train is not None:
        _check(cfg, "fl.num_clients", lambda v: v <= num_train,
               f"an integer in [1, {num_train}] (the number of training samples)")
    for key in ("lr", "rounds", "local_epochs", "batch_size", "frac"):
        rule = {"lr": (lambda v: v > 0, "> 0"), "frac": (lambda v: 0 < v <= 1, "in (0, 1]")}.get(
            key, (lambda v: _is_int(v) and v >= 1, "an integer >= 1"))
        _check(cfg, f"method.{key}", rule[0], rule[1])
    for key, value in (("fidelity", cfg.get("fidelity")), ("noise.fidelity", cfg.noise.get("fidelity", "paper"))):
        if value not in ("paper", "reference"):
            raise ConfigError(f"{key}={value!r} is invalid: allowed paper, reference")
    device = str(cfg.get("device", "auto"))
    if not (device in ("auto", "cpu") or device.startswith("cuda")):
        raise ConfigError(f"device={device!r} is invalid: allowed auto, cpu, cuda, cuda:N")
