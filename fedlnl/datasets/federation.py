"""A Federation: in-memory data, client partition, noisy labels, oracle and content hash."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from .noise import add_noise, label_space, nominal_noisy_share, nominal_rate, realized_rates
from .partition import make_partition
from .types import Federation, Oracle, Source  # noqa: F401  (Oracle, Source: re-exported for callers)


# ---------------------------------------------------------------------------------------------
# building a federation: source -> partition -> noise -> validation split, local test sets -> hash

#: in-process memos, so a sweep in one process loads each dataset / builds each federation once
_SOURCES: dict[str, Source] = {}
_FEDERATIONS: dict[str, Federation] = {}
_MAX_FEDERATIONS = 64


def build_federation(
    dataset_cfg: Mapping[str, Any],
    partition_cfg: Mapping[str, Any],
    noise_cfg: Mapping[str, Any],
    num_clients: int,
    seed: int,
    val_share: float = 0.0,
    client_test_size: int = 500,
) -> Federation:
    """The federation of (dataset, partition, noise, num_clients, seed, selection); memoised in-process.

    The partition uses ``np.random.default_rng([seed, 1])`` and the noise ``default_rng([seed, 2])``:
    two independent streams, as the reference re-seeds before each step (docs/methods/setup.md §1.5). Then each
    client holds out ``val_share`` of its (noisy) samples as its validation set (``hold_out``, stream
    ``[seed, 3]``) and gets a local test set of ``client_test_size`` images (``local_test_sets``, stream
    ``[seed, 4]``). The hash covers the validation indices when there are any (without them it is the
    hash of before they existed); the local test sets are not hashed: they are a function of the
    hashed federation, the seed and ``client_test_size``. Each call returns its own copy of ``labels``
    so a runner may relabel in place.
    """
    part, noise = _plain(partition_cfg), _plain(noise_cfg)
    part.pop("p_alpha", None)  # sweep conveniences only: p/alpha and rho/tau already hold the values
    noise.pop("rho_tau", None)
    noise.pop("fidelity", None)  # resolved into the noise switches already
    key = json.dumps([_plain(dataset_cfg), part, noise, int(num_clients), int(seed), float(val_share),
                      int(client_test_size)], sort_keys=True)
    if key not in _FEDERATIONS:
        if len(_FEDERATIONS) >= _MAX_FEDERATIONS:
            _FEDERATIONS.pop(next(iter(_FEDERATIONS)))
        _FEDERATIONS[key] = _build(load_source(dataset_cfg), part, noise, int(num_clients), int(seed),
                                   float(val_share), int(client_test_size))
    fed = _FEDERATIONS[key]
    return replace(fed, client_indices=list(fed.client_indices), labels=fed.labels.clone(),
                   client_val=list(fed.client_val), client_test=list(fed.client_test))


def import_federation(where, dataset_cfg: Mapping[str, Any], partition_cfg: Mapping[str, Any],
                      noise_cfg: Mapping[str, Any], num_clients: int, seed: int, val_share: float = 0.0,
                      client_test_size: int = 500) -> Federation:
    """The federation exported to ``where`` (``fedlnl-export``; ``fedlnl.datasets.portable``), on
    this run's dataset, after checking its checksums, its setting against this run's and its hash."""
    from . import portable

    setting = federation_setting(dataset_cfg, partition_cfg, noise_cfg, num_clients, seed, val_share,
                                 client_test_size)
    source = label_space(load_source(dataset_cfg), setting["noise"])
    fed = portable.read(Path(str(where)).expanduser(), source, setting, federation_hash)
    return replace(fed, labels=fed.labels.clone())


def federation_setting(dataset_cfg, partition_cfg, noise_cfg, num_clients: int, seed: int, val_share: float,
                       client_test_size: int) -> dict:
    """What an export records and an import compares (``portable.setting_of``): the settings
    ``build_federation`` keys its memo on, without the sweep conveniences."""
    from . import portable

    part, noise = _plain(partition_cfg), _plain(noise_cfg)
    part.pop("p_alpha", None)
    noise.pop("rho_tau", None)
    noise.pop("fidelity", None)
    return portable.setting_of(_plain(dataset_cfg), part, noise, num_clients, seed, val_share, client_test_size)


def load_source(dataset_cfg: Mapping[str, Any]) -> Source:
    """Call the dataset config's ``_target_`` loader (other keys as kwargs) once per resolved config.

    The target is located with Hydra but called directly, so a loader's own error (e.g.
    ``DatasetUnavailable``) reaches the user unwrapped.
    """
    from hydra.utils import get_method

    plain = _plain(dataset_cfg)
    key = json.dumps(plain, sort_keys=True)
    if key not in _SOURCES:
        kwargs = dict(plain)
        target = kwargs.pop("_target_")
        kwargs.pop("family", None)  # the methods' per-dataset table column, not a loader option
        source = get_method(target)(**kwargs)
        if not isinstance(source, Source):
            raise TypeError(f"dataset loader {target} returned {type(source).__name__}, not Source")
        _SOURCES[key] = source
    return _SOURCES[key]


def clear_cache() -> None:
    """Forget the memoised sources and federations."""
    _SOURCES.clear()
    _FEDERATIONS.clear()


def _build(source: Source, part: dict, noise: dict, num_clients: int, seed: int, val_share: float = 0.0,
           client_test_size: int = 500) -> Federation:
    n = len(source.y_train)
    if not 1 <= num_clients <= n:
        raise ValueError(f"num_clients must be between 1 and {n} (the training set size), got {num_clients}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    source = label_space(source, noise)  # CIFAR-100N coarse: the 20 super-classes
    y = source.y_train.numpy()
    part_rng, noise_rng = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
    clients = make_partition(y, num_clients, part_rng, num_classes=source.num_classes, **part)
    labels, oracle = add_noise(
        y, clients, source.num_classes, noise_rng, clean=source.y_train_clean, features=source.x_train,
        classes=source.classes, **noise
    )
    clients, val = hold_out(clients, val_share, np.random.default_rng([seed, 3]))
    if any(len(v) for v in val):  # the oracle's per-client rates: over the samples the clients train on
        oracle = replace(oracle, realized_rate=realized_rates(oracle.clean_labels.numpy(), labels.numpy(), clients))
    known = oracle.clean_labels >= 0  # the class mix: clean labels where known, else the observed ones
    shown = torch.where(known, oracle.clean_labels, labels).numpy()
    tests = local_test_sets(shown, clients, source.y_test.numpy(), source.num_classes, client_test_size,
                            np.random.default_rng([seed, 4]))
    for ix in (*clients, *val, *tests):
        ix.flags.writeable = False  # shared by every copy handed out
    meta = {
        "dataset": source.name,
        "num_clients": num_clients,
        "seed": seed,
        "partition": part,
        "noise": noise,
        "client_sizes": [int(len(ix)) for ix in clients],
        # the config's expected noise rate (no labels used), for methods that take it as known
        "nominal_noise_rate": nominal_rate(noise, source.num_classes, source.classes,
                                           real=source.name if source.y_train_clean is not None else None),
        # the config's share of noisy clients, for methods that assume a known Byzantine share
        "nominal_noisy_share": nominal_noisy_share(
            noise, real=source.name if source.y_train_clean is not None else None),
    }
    return Federation(source, clients, labels, oracle, federation_hash(source, clients, labels, val), meta,
                      val, tests)


def hold_out(clients: list[np.ndarray], share: float, rng: np.random.Generator):
    """(training, validation) indices per client: client k's validation set is round(share * n_k)
    (half up, at most n_k - 1: a client keeps a training sample) of its samples drawn uniformly
    without replacement, clients in order from one stream; share 0 keeps every sample for training."""
    if share <= 0:
        return clients, [np.zeros(0, dtype=np.int64) for _ in clients]
    train, val = [], []
    for ix in clients:
        m = min(math.floor(share * len(ix) + 0.5), len(ix) - 1)
        picked = np.sort(rng.choice(len(ix), size=m, replace=False))
        kept = np.ones(len(ix), dtype=bool)
        kept[picked] = False
        train.append(ix[kept])
        val.append(ix[picked])
    return train, val


def local_test_sets(labels: np.ndarray, clients: list[np.ndarray], y_test: np.ndarray, num_classes: int,
                    size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per client, ``size`` positions in the test set with the class mix of its training ``labels``:
    class counts by the largest remainder of proportion x size (ties -> the lower class), each class's
    images drawn without replacement when the test set has enough of them, else with replacement.
    Classes the test set lacks are left out of the mix (a client holding none of the others gets
    every test class equally)."""
    pools = [np.flatnonzero(y_test == j) for j in range(num_classes)]
    held = np.array([len(p) > 0 for p in pools], dtype=np.int64)
    out = []
    for ix in clients:
        counts = np.bincount(labels[ix], minlength=num_classes)[:num_classes] * held
        take = largest_remainder(counts if counts.sum() else held, size)
        out.append(np.concatenate([np.zeros(0, dtype=np.int64)] + [
            rng.choice(pools[j], size=int(t), replace=bool(t > len(pools[j]))).astype(np.int64)
            for j, t in enumerate(take) if t]))
    return out


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to ``total`` proportional to integer ``weights``: the floors of w_j total / sum w,
    one more for the largest remainders (ties -> the lower index); exact integer arithmetic."""
    w = np.asarray(weights, dtype=np.int64)
    base, rest = np.divmod(w * int(total), int(w.sum()))
    base[np.argsort(-rest, kind="stable")[:int(total) - int(base.sum())]] += 1
    return base


def federation_hash(source: Source, client_indices: list[np.ndarray], labels: torch.Tensor,
                    client_val: list[np.ndarray] = ()) -> str:
    """blake2b of the dataset identity (name, sizes, label digest), each client's indices and the labels;
    then, when any client holds validation samples, each client's validation indices (without them the
    digest is the one of before validation sets existed)."""
    h = hashlib.blake2b(digest_size=16)
    shape = tuple(source.x_train.shape)
    h.update(f"{source.name}|{shape}|{tuple(source.x_test.shape)}|{source.num_classes}".encode())
    h.update(_int64_bytes(source.y_train))
    h.update(_int64_bytes(source.y_test))
    for ix in client_indices:
        h.update(len(ix).to_bytes(8, "little"))
        h.update(_int64_bytes(ix))
    h.update(_int64_bytes(labels))
    if any(len(v) for v in client_val):
        h.update(b"validation")
        for v in client_val:
            h.update(len(v).to_bytes(8, "little"))
            h.update(_int64_bytes(v))
    return h.hexdigest()


def federation_stats(fed: Federation) -> dict[str, float | int]:
    """Realized noise of the training samples overall and per client, the config's nominal rate, number
    of noisy clients, client (training) sizes and the number of validation samples: for the run log."""
    o = fed.oracle
    sizes = fed.client_sizes
    train = np.concatenate(fed.client_indices) if any(fed.val_sizes) else slice(None)  # validation left out
    return {
        "noise_rate": float(o.noisy_mask[train].double().mean()),
        "nominal_noise_rate": fed.meta.get("nominal_noise_rate"),
        "nominal_noisy_share": fed.meta.get("nominal_noisy_share"),
        "client_noise_min": float(o.realized_rate.min()),
        "client_noise_max": float(o.realized_rate.max()),
        "num_noisy_clients": int(o.noisy_client.sum()),
        "client_size_min": int(min(sizes)),
        "client_size_max": int(max(sizes)),
        "val_samples": int(sum(fed.val_sizes)),
    }


def _plain(cfg: Mapping[str, Any] | None) -> dict:
    """A resolved plain-dict copy of a config node (DictConfig or mapping)."""
    if cfg is None:
        return {}
    node = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))
    return OmegaConf.to_container(node, resolve=True)


def _int64_bytes(a: np.ndarray | torch.Tensor) -> bytes:
    if isinstance(a, torch.Tensor):
        a = a.cpu().numpy()
    return np.ascontiguousarray(a, dtype="<i8").tobytes()
