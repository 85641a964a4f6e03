"""Checks on a composed config, run before any data is loaded or any file is written.

Every key a user can set outside a method's own hyperparameters (which the method's constructor
checks) is checked here: its type, range or allowed names, in the vocabulary of ``fedlnl.conf.checks``
(one line naming the key, the value and what is allowed).
"""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from fedlnl.conf import checks
from fedlnl.conf.checks import ConfigError, is_number  # noqa: F401 (ConfigError: imported from here by the benchmark)
from fedlnl.benchmark.selection import SelectionSettings
from fedlnl.datasets.options import check_options
from fedlnl.methods.common.protocol import OPTIMIZERS


_MISSING = object()
#: longest sweep name: W&B groups ("<name>/<sweep dir>") hold at most 128 characters
NAME_MAX = 60


def _get(cfg, key: str):
    value = cfg
    for part in key.split("."):
        if not isinstance(value, DictConfig) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _num(cfg, key, ok, allowed: str, optional: bool = False) -> None:
    value = _get(cfg, key)
    if value is not _MISSING:
        checks.number(key, value, ok, allowed, optional)


def _int(cfg, key, low: int) -> None:
    value = _get(cfg, key)
    if value is not _MISSING:
        checks.integer(key, value, low)


def _flag(cfg, key) -> None:
    value = _get(cfg, key)
    if value is not _MISSING:
        checks.flag(key, value)


def _choice(cfg, key, options) -> None:
    value = _get(cfg, key)
    if value is not _MISSING:
        checks.choice(key, value, options)


def _pair(cfg, key: str, names: tuple[str, str]) -> None:
    """A zipped pair ``[a, b]`` and its two keys must agree: ``noise.rho_tau=[0.6,0.5] noise.rho=0.2``
    is a contradiction, not a silent override."""
    group, name = key.split(".")
    node = cfg.get(group)
    if not isinstance(node, DictConfig):
        return
    raw = node._get_node(name) if name in node else None
    if raw is None or raw._is_none():
        return
    pair = node[name]
    if not isinstance(pair, (list, ListConfig)) or len(pair) != 2 or not all(is_number(v) for v in pair):
        checks.fail(key, OmegaConf.to_container(pair) if isinstance(pair, ListConfig) else pair,
              f"a pair [{names[0]}, {names[1]}] of numbers or null")
    for i, sub in enumerate(names):
        value = node.get(sub)
        if value != pair[i]:
            raise ConfigError(f"{group}.{sub}={value!r} contradicts {key}={list(pair)!r}: "
                              f"set either the pair or {group}.{names[0]}/{group}.{names[1]}, not both")


def check_fl(values, prefix: str) -> None:
    """The shared local-training values (``fl`` or a method's pins of them). The optimiser key the
    chosen optimiser does not read (``momentum`` of adam, ``betas`` of sgd) may be null."""
    optimizer = values.get("optimizer", _MISSING)
    if optimizer is not _MISSING:
        checks.choice(f"{prefix}optimizer", optimizer, OPTIMIZERS)
    for key, ok, allowed in (
        ("frac", lambda v: 0.0 < v <= 1.0, "a fraction in (0, 1]"),
        ("lr", lambda v: v > 0, "a learning rate > 0"),
        ("momentum", lambda v: 0.0 <= v < 1.0, "a momentum in [0, 1)"),
        ("weight_decay", lambda v: v >= 0, "a weight decay >= 0"),
    ):
        value = values.get(key, _MISSING)
        if value is not _MISSING:
            checks.number(f"{prefix}{key}", value, ok, allowed, optional=key == "momentum" and optimizer != "sgd")
    _betas(values.get("betas", _MISSING), f"{prefix}betas", optional=optimizer != "adam")
    for key in ("local_epochs", "batch_size", "eval_batch_size"):
        value = values.get(key, _MISSING)
        if value is not _MISSING:
            checks.integer(f"{prefix}{key}", value, 1)
    value = values.get("augment", _MISSING)
    if value is not _MISSING:
        checks.flag(f"{prefix}augment", value)


def _betas(value, key: str, optional: bool) -> None:
    """Adam's (β1, β2): two numbers in [0, 1); null where the optimiser is not Adam."""
    if value is _MISSING or (value is None and optional):
        return
    items = list(value) if isinstance(value, (list, tuple, ListConfig)) else None
    if items is None or len(items) != 2 or not all(is_number(v) and 0.0 <= v < 1.0 for v in items):
        shown = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
        checks.fail(key, list(shown) if isinstance(shown, tuple) else shown, "a pair [β1, β2] of numbers in [0, 1)")


def _targets(cfg) -> None:
    value = _get(cfg, "targets")
    if value is _MISSING:
        return
    items = list(value) if isinstance(value, (list, ListConfig)) else None
    if items is None or not items or not all(is_number(v) and 0 < v <= 1 for v in items):
        shown = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
        checks.fail("targets", shown, "a non-empty list of accuracies in (0, 1], e.g. [0.5,0.65,0.8]")


def _wandb_login_known() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def validate(cfg: DictConfig, num_train: int | None = None) -> None:
    """Raise ConfigError naming the key, the value and the allowed range."""
    for key in ("seed", "threads", "checkpoint_every"):
        _int(cfg, key, 0)
    _num(cfg, "seed", lambda v: v <= 2**63 - 1, "an integer in [0, 2**63 - 1]")
    _num(cfg, "checkpoint_minutes", lambda v: v >= 0, "minutes >= 0 (0 = no time-based checkpoints)")
    _flag(cfg, "skip_complete")
    _flag(cfg, "reuse_prefix")
    _flag(cfg, "compile")
    _targets(cfg)
    for key, value in (("fidelity", cfg.get("fidelity")), ("noise.fidelity", cfg.noise.get("fidelity", "paper"))):
        checks.choice(key, value, ("paper", "reference"))
    device = cfg.get("device", "auto")
    if not isinstance(device, str) or not (device in ("auto", "cpu", "cuda", "mps")
                                           or (device.startswith("cuda:") and device[5:].isdigit())):
        checks.fail("device", device, "auto, cpu, cuda, cuda:N, mps")
    _choice(cfg, "determinism", ("strict", "fast"))
    _choice(cfg, "data_placement", ("auto", "device", "host"))
    for key in ("name", "variant", "preset", "table_key"):
        value = _get(cfg, key)
        if value is not _MISSING and value is not None and not isinstance(value, str):
            checks.fail(key, value, "a name (text)")
    tuned = _get(cfg, "tuned")
    if tuned is not _MISSING and tuned is not None and not isinstance(tuned, str):
        checks.fail("tuned", tuned, "null or the path of an experiment=tune result (a file or a directory)")
    where = _get(cfg, "federation")
    if where is not _MISSING and where is not None and not isinstance(where, str):
        checks.fail("federation", where, "null or the directory of a fedlnl-export")
    _int(cfg, "tune.trials", 1)
    _int(cfg, "tune.seed", 0)
    name = _get(cfg, "name")
    if isinstance(name, str) and (not name or "/" in name or name in (".", "..") or len(name) > NAME_MAX):
        checks.fail("name", name if len(name) <= 40 else name[:37] + "...",
              f"a sweep name without '/' of at most {NAME_MAX} characters (got {len(name)})")

    # logger
    _choice(cfg, "logger.kind", ("wandb", "none"))
    if _get(cfg, "logger.kind") == "wandb":
        _choice(cfg, "logger.mode", ("offline", "online", "disabled"))
        if _get(cfg, "logger.mode") == "online" and not _wandb_login_known():
            raise ConfigError("logger.mode=online needs a W&B login: run `wandb login` or set WANDB_API_KEY "
                              "(or use logger.mode=offline and `wandb sync` later)")

    # noise and partition
    _pair(cfg, "noise.rho_tau", ("rho", "tau"))
    _pair(cfg, "partition.p_alpha", ("p", "alpha"))
    try:  # each partition / noise kind's own keys and checks (its registration), and the dataset's
        check_options(cfg.dataset, cfg.partition, cfg.noise)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err).strip().splitlines()[0]) from err

    # fl: federation size, runner-owned values, local training
    _int(cfg, "fl.num_clients", 1)
    _int(cfg, "fl.rounds", 1)
    _int(cfg, "fl.eval_every", 1)
    check_fl(cfg.fl, "fl.")
    SelectionSettings.of(cfg.get("selection"))  # each key's declared check (benchmark/selection.py)
    if num_train is not None:
        _num(cfg, "fl.num_clients", lambda v: v <= num_train,
             f"an integer in [1, {num_train}] (the number of training samples)")
