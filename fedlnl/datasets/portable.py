"""A federation as plain files any framework reads (``fedlnl-export``), and read back (``federation=DIR``).

Written to a directory (format ``FORMAT``):

- ``federation.npz`` (int64 arrays): ``client_offsets`` [N+1] and ``client_indices`` (client k trains
  on the global training indices ``client_indices[client_offsets[k]:client_offsets[k+1]]``), likewise
  ``val_offsets``/``val_indices`` (each client's held-out noisy validation samples,
  ``selection.val_share``) and ``test_offsets``/``test_indices`` (each client's local test set:
  positions in the test set, ``selection.client_test_size``), ``labels`` (the observed, noisy
  training labels, indexed by global training index) and ``test_labels``;
- ``federation.json``: the format version, the federation hash, the dataset's name and sizes, the
  setting that built it (partition, noise, number of clients, seed, selection; ``setting``), the
  overrides it was exported with, the nominal noise rate and share;
- ``oracle.npz`` only with ``oracle=true``: ``clean_labels``, ``mu``, ``noisy_client``,
  ``realized_rate``, ``client_kind`` (each client's noise kind: ``mixed``'s group, CIFAR-10N's annotator)
  — ground truth for scoring an external run, never for a method;
- ``manifest.json``: the format version, the federation hash and the sha256 of every other file.

Reading checks every checksum of the manifest, that the run's setting equals the exported one (paths
aside), and that the federation hash recomputed from the files and the run's dataset equals the
recorded one (the dataset's identity is part of it), before anything trains.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .types import DataError, Federation, Oracle, Source

FORMAT = 1
MANIFEST, ARRAYS, META, ORACLE = "manifest.json", "federation.npz", "federation.json", "oracle.npz"
#: keys that name a place on one machine (data roots, label files; ``order_labels``: the file whose labels
#: restore a folder dataset's original order, e.g. cifar10_jpeg's CIFAR-10N table under the shared
#: directory): not part of a federation's identity (the federation hash checks the data they lead to)
PATH_KEYS = frozenset({"root", "file", "path", "cache_dir", "order_labels"})


def setting_of(dataset: Mapping, partition: Mapping, noise: Mapping, num_clients: int, seed: int,
               val_share: float, client_test_size: int) -> dict:
    """What builds a federation besides the data files: compared on import, paths left out."""
    def plain(node):
        if isinstance(node, Mapping):
            return {k: plain(v) for k, v in node.items() if k not in PATH_KEYS}
        if isinstance(node, (list, tuple)):
            return [plain(v) for v in node]
        return node

    return plain({"dataset": dict(dataset), "partition": dict(partition), "noise": dict(noise),
                  "fl.num_clients": int(num_clients), "seed": int(seed), "selection.val_share": float(val_share),
                  "selection.client_test_size": int(client_test_size)})


def _ragged(parts) -> tuple[np.ndarray, np.ndarray]:
    sizes = [len(p) for p in parts]
    flat = np.concatenate([np.zeros(0, np.int64), *[np.asarray(p, np.int64) for p in parts]])
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64), flat


def _split(offsets: np.ndarray, flat: np.ndarray) -> list[np.ndarray]:
    return [flat[a:b].copy() for a, b in zip(offsets[:-1], offsets[1:])]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def arrays_of(fed: Federation) -> dict[str, np.ndarray]:
    """The arrays of ``federation.npz`` (no clean label, no per-client truth)."""
    arrays = {}
    for name, parts in (("client", fed.client_indices), ("val", fed.client_val), ("test", fed.client_test)):
        arrays[f"{name}_offsets"], arrays[f"{name}_indices"] = _ragged(parts or [[] for _ in fed.client_indices])
    arrays["labels"] = fed.labels.numpy().astype(np.int64)
    arrays["test_labels"] = fed.source.y_test.numpy().astype(np.int64)
    return arrays


def oracle_arrays(o: Oracle) -> dict[str, np.ndarray]:
    """The arrays of ``oracle.npz``: the federation's ground truth."""
    return {"clean_labels": o.clean_labels.numpy().astype(np.int64), "mu": np.asarray(o.mu, np.float64),
            "noisy_client": np.asarray(o.noisy_client, bool), "realized_rate": np.asarray(o.realized_rate, np.float64),
            "client_kind": np.asarray(list(o.client_kind), dtype=str)}


def write(fed: Federation, setting: dict, overrides: list[str], out: Path, oracle: bool = False) -> dict:
    """Write ``fed`` into ``out`` (created; files replaced); returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / ARRAYS, **arrays_of(fed))
    src = fed.source
    meta = {"format": FORMAT, "federation_hash": fed.hash, "dataset": src.name, "num_classes": src.num_classes,
            "num_train": int(len(src.y_train)), "num_test": int(len(src.y_test)), "setting": setting,
            "overrides": list(overrides), "nominal_noise_rate": fed.meta.get("nominal_noise_rate"),
            "nominal_noisy_share": fed.meta.get("nominal_noisy_share")}
    (out / META).write_text(json.dumps(meta, indent=1, sort_keys=True, default=str) + "\n")
    files = [ARRAYS, META]
    if oracle:
        np.savez(out / ORACLE, **oracle_arrays(fed.oracle))
        files.append(ORACLE)
    elif (out / ORACLE).exists():
        (out / ORACLE).unlink()  # a re-export without the oracle leaves none behind
    manifest = {"format": FORMAT, "federation_hash": fed.hash, "files": {f: sha256(out / f) for f in files}}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def verify(where: Path) -> dict:
    """The manifest of an export after checking every file it lists; DataError (one line) otherwise."""
    if not (where / MANIFEST).is_file():
        raise DataError(f"federation={where} is invalid: no {MANIFEST} there (write one with fedlnl-export out=DIR)")
    try:
        manifest = json.loads((where / MANIFEST).read_text())
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"federation={where} is invalid: {MANIFEST} is not readable ({err})") from err
    if manifest.get("format") != FORMAT:
        raise DataError(f"federation={where} has format {manifest.get('format')!r}; this fedlnl reads format {FORMAT}")
    for name in (ARRAYS, META):
        if name not in files:
            raise DataError(f"federation={where} is invalid: {MANIFEST} lists no {name}")
    for name, digest in sorted(files.items()):
        path = where / name
        if not path.is_file():
            raise DataError(f"federation={where} is invalid: {name} is missing")
        if sha256(path) != digest:
            raise DataError(f"federation={where} is invalid: {name} does not match its sha256 in {MANIFEST} "
                            "(changed since the export)")
    return manifest


def read(where: Path, source: Source, setting: dict, hash_fn) -> Federation:
    """The exported federation in ``where`` on the run's ``source`` (already in the noise's label
    space), after ``verify`` and the checks of the module notes. ``hash_fn(source, clients, labels,
    val)`` is the federation hash (``federation.federation_hash``)."""
    manifest = verify(where)
    meta = json.loads((where / META).read_text())
    # compared as JSON holds them: a mapping with class-index keys (noise.map={0: 1}) reads back with text keys
    differ = _first_difference(meta.get("setting"), json.loads(json.dumps(setting, sort_keys=True, default=str)))
    if differ is not None:
        key, was, now = differ
        raise DataError(f"federation={where} was exported for {key}={was}, this run has {key}={now}: run with the "
                        f"export's settings ({META} 'overrides': {' '.join(meta.get('overrides') or []) or 'none'})")
    with np.load(where / ARRAYS) as z:
        arrays = {k: z[k] for k in z.files}
    clients = _split(arrays["client_offsets"], arrays["client_indices"])
    val = _split(arrays["val_offsets"], arrays["val_indices"])
    tests = _split(arrays["test_offsets"], arrays["test_indices"])
    labels = torch.from_numpy(arrays["labels"].astype(np.int64))
    recomputed = hash_fn(source, clients, labels, val)
    if recomputed != manifest["federation_hash"] or meta.get("federation_hash") != manifest["federation_hash"]:
        raise DataError(f"federation={where} does not fit this run's data: federation hash {recomputed} here, "
                        f"{manifest['federation_hash']} exported (another copy or order of {source.name}?)")
    for ix in (*clients, *val, *tests):
        ix.flags.writeable = False
    fed_meta = {"dataset": source.name, "num_clients": len(clients), "seed": setting["seed"],
                "partition": setting["partition"], "noise": setting["noise"],
                "client_sizes": [int(len(ix)) for ix in clients], "imported_from": str(where),
                "nominal_noise_rate": meta.get("nominal_noise_rate"),
                "nominal_noisy_share": meta.get("nominal_noisy_share")}
    return Federation(source, clients, labels, _oracle(where, manifest, source, labels, clients), recomputed,
                      fed_meta, val, tests)


def _oracle(where: Path, manifest: dict, source: Source, labels: torch.Tensor, clients) -> Oracle:
    """The exported oracle when there is one; else the run's own from its dataset's clean labels
    (mu = each client's realised rate, noisy = a rate > 0: the exported draw of mu is not known)."""
    from .noise import realized_rates
    from .types import UNKNOWN_LABEL

    clean = source.y_train_clean if source.y_train_clean is not None else source.y_train
    clean_np, observed = clean.numpy().astype(np.int64), labels.numpy()
    rate = realized_rates(clean_np, observed, clients)
    mask = torch.from_numpy((observed != clean_np) & (clean_np != UNKNOWN_LABEL))
    if ORACLE in manifest["files"]:
        with np.load(where / ORACLE) as z:
            kinds = tuple(str(k) for k in z["client_kind"]) if "client_kind" in z.files else ()
            return Oracle(torch.from_numpy(z["clean_labels"]), z["mu"], z["noisy_client"], mask, rate, kinds)
    return Oracle(torch.from_numpy(clean_np), rate.copy(), rate > 0, mask, rate)


def _first_difference(was: Any, now: Any, prefix: str = "") -> tuple[str, Any, Any] | None:
    if isinstance(was, Mapping) and isinstance(now, Mapping):
        for key in sorted(set(was) | set(now), key=str):
            found = _first_difference(was.get(key), now.get(key), f"{prefix}{key}.")
            if found is not None:
                return found
        return None
    if isinstance(was, list) and isinstance(now, (list, tuple)) and len(was) == len(now):
        now = list(now)
    return None if was == now else (prefix.rstrip("."), was, now)
