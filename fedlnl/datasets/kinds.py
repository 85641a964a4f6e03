"""The registry of partition and noise kinds: each kind is registered by a decorator on the function
that implements it (``@partition_kind`` in partition.py, ``@noise_kind`` in noise.py), and the
declaration carries everything the rest of the suite reads about the kind:

- ``options``: the declaration of its config keys, a frozen dataclass subclassing ``KindOptions``
  whose fields are built with ``fedlnl.conf.checks.key`` (type, check, one-line doc; ``required=True``
  where the kind needs the key) and whose ``relations(node, prefix)`` checks what relates keys; the
  option checks refuse any other key, and the docs' key tables list them;
- ``setting``: the keys that name its setting in a run's ``setting`` (``summary.json``; the report
  groups runs by them), and ``setting_of(node)`` when they are not plain copies of config keys;
- ``label``: its report column label, ``label(setting, fmt)`` (``fmt`` formats one value); a noise
  kind on Eq. 4's levels is labelled by its (rho, tau) instead.

A new kind is therefore one decorated function (with its options class) plus its YAML
(``conf/partition/<kind>.yaml`` or ``conf/noise/<kind>.yaml`` with ``kind: <kind>``). A kind defined
in a package of its own registers when its module is imported: the package names that module in the
``fedlnl.kinds`` entry-point group (``ENTRY_POINTS``), which every process (runner, report, sweep
workers) loads on the first lookup. The built-in kinds come first, then the others in registration
order: the order of the ``allowed ...`` lists in errors.

Pure Python on purpose: the report reads labels and setting keys from here without torch.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, fields
from importlib.metadata import entry_points
from typing import Any, Callable, Mapping

from fedlnl.conf.checks import key

#: the modules that define the built-in kinds, imported on the first lookup
BUILTIN_MODULES = ("fedlnl.datasets.partition", "fedlnl.datasets.noise")
#: the entry-point group through which an installed package registers its own kinds: each entry
#: names a module whose decorated functions register on import (docs/adding-a-kind.md)
ENTRY_POINTS = "fedlnl.kinds"


@dataclass(frozen=True)
class Kind:
    """One partition or noise kind (module notes). ``fn`` is the registered function.

    Partition kinds: ``fn(labels, num_clients, rng, **options)`` (plus ``num_classes=`` when it
    declares that parameter) returns one sorted int64 index array per client.

    Noise kinds come in three forms, told apart by what the declaration carries:

    - on FedCorr Eq. 4's per-client levels (``rho``, ``tau``; the default): ``fn(flip, indices, mu)``
      returns (chosen indices, their new labels) for one noisy client at level ``mu`` (``flip``: the
      labels, rng and switches, ``noise._Flipper``); ``group``: usable as a group's kind of a kind
      with ``groups``; ``share(lo, hi, noise, num_classes, classes)``: the expected share of a noisy
      client's labels that really change for mu ~ U(lo, hi) (the nominal noise rate; None: unknown);
    - with ``groups(noise)`` (``mixed``): the config's client groups, a list of {kind, share, level};
      ``fn(noise, num_clients, rng)`` returns (kind per client, mu per client), and each noisy client
      is then corrupted by its kind on Eq. 4's levels;
    - with ``real(noise)`` (real noise, ``cifarn``): ``fn(labels, client_indices, noise, clean)``
      replaces the labels as a whole and returns (observed labels, oracle); ``real(noise)`` is its
      published share of wrong labels (None: unknown); every client counts as noisy.

    ``space(source, noise)`` (any noise kind): the label space the kind's labels live in (CIFAR-100N's
    coarse set: the 20 super-classes); default: the source's.
    """

    name: str
    fn: Callable
    options: type = None  # KindOptions (the declaration of its keys); set by the decorators
    setting: tuple[str, ...] = ()
    setting_of: Callable[[Mapping], dict] | None = None
    label: Callable[[Mapping, Callable[[Any], str]], str] | None = None
    group: bool = False
    share: Callable | None = None
    groups: Callable[[Mapping], list] | None = None
    real: Callable[[Mapping], float | None] | None = None
    space: Callable | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        """Its config keys besides ``kind``."""
        return tuple(f.name for f in fields(self.options) if f.name != "kind")

    @property
    def levels(self) -> bool:
        """A noise kind on Eq. 4's levels (``fn`` corrupts one noisy client)."""
        return self.groups is None and self.real is None

    def settings(self, node: Mapping) -> dict:
        """The setting keys of this kind from a (resolved) config node."""
        if self.setting_of is not None:
            return self.setting_of(node)
        return {k: node.get(k) for k in self.setting}

    def label_of(self, setting: Mapping, fmt: Callable[[Any], str]) -> str:
        return self.label(setting, fmt) if self.label is not None else self.name


_PARTITIONS: dict[str, Kind] = {}
_NOISES: dict[str, Kind] = {}
_loaded = False
_outside_loaded = False


@dataclass(frozen=True)
class KindOptions:
    """Base of a kind's options: ``kind`` (its name, checked against the registry first)."""

    kind: str = key("the kind's name")


def _register(table: dict[str, Kind], what: str, name: str, **spec) -> Callable:
    def decorator(fn: Callable) -> Callable:
        _builtins()  # the built-in kinds first, so they lead every list of allowed kinds
        if name in table and table[name].fn is not fn:
            raise ValueError(f"{what} kind {name!r} is registered twice ({table[name].fn.__module__} and "
                             f"{fn.__module__})")
        table[name] = Kind(name=name, fn=fn, **{"options": KindOptions, **spec})
        return fn
    return decorator


def partition_kind(name: str, **spec) -> Callable:
    """Decorator: register ``fn`` as partition kind ``name`` (fields: see :class:`Kind`)."""
    return _register(_PARTITIONS, "partition", name, **spec)


def noise_kind(name: str, **spec) -> Callable:
    """Decorator: register ``fn`` as noise kind ``name`` (fields: see :class:`Kind`)."""
    return _register(_NOISES, "noise", name, **spec)


def unregister(group: str, name: str) -> None:
    """Forget a kind (``group``: partition or noise); for tests that register a kind of their own."""
    {"partition": _PARTITIONS, "noise": _NOISES}[group].pop(name, None)


def _builtins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)


def _load() -> None:
    """The built-in kinds, then the modules installed packages name in the ``fedlnl.kinds`` group
    (after the built-in modules have finished importing, which outside modules may import from)."""
    global _outside_loaded
    _builtins()
    if not _outside_loaded:
        _outside_loaded = True
        for entry in entry_points(group=ENTRY_POINTS):
            try:
                entry.load()
            except Exception as err:  # noqa: BLE001  (an outside module may raise anything on import)
                reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
                raise ValueError(f"{ENTRY_POINTS} entry point {entry.name} = {entry.value} failed to import: "
                                 f"{type(err).__name__}: {reason}") from err


def partitions() -> dict[str, Kind]:
    """Every registered partition kind, in registration order."""
    _load()
    return dict(_PARTITIONS)


def noises() -> dict[str, Kind]:
    """Every registered noise kind, in registration order."""
    _load()
    return dict(_NOISES)


def partition(name) -> Kind | None:
    return partitions().get(name) if isinstance(name, str) else None


def noise(name) -> Kind | None:
    return noises().get(name) if isinstance(name, str) else None


def setting_keys(group: str) -> tuple[str, ...]:
    """Every setting key a kind of ``group`` (partition or noise) can write, in registration order."""
    kinds = partitions() if group == "partition" else noises()
    return tuple(dict.fromkeys(k for kind in kinds.values() for k in kind.setting))
