"""A run directory: which config it holds, whether it is final, and whether a new run may use it.

A directory is identified with a config by the hash of the resolved config without the keys that do
not change the numbers (``fedlnl.conf.keys.NON_RESULT_KEYS``). A directory that holds a run of another
config, in any state (complete, diverged, interrupted, failed, or killed: recognised by its checkpoint,
or by its rows and the lock it left), or a live run, is refused (one line naming what differs), so a
typo in ``hydra.run.dir`` never overwrites another run's summary, metrics, checkpoint or ``.hydra/``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

from fedlnl.benchmark import integrity
from fedlnl.benchmark.lock import CellLock, LockError
from fedlnl.conf.keys import INERT_NESTED, LEGACY_NESTED, LEGACY_VALUES, NON_RESULT_KEYS
from fedlnl.benchmark.validate import ConfigError

#: statuses of a run whose directory belongs to its config: final ones, and interrupted (resumable)
KEPT = ("complete", "diverged", "interrupted")


def config_hash(cfg: dict) -> str:
    kept = {k: v for k, v in cfg.items() if k not in NON_RESULT_KEYS}
    for node, key in sorted({*LEGACY_NESTED, *INERT_NESTED}):  # before the nodes meet LEGACY_VALUES
        sub = kept.get(node)
        if isinstance(sub, dict) and key in sub and idle(node, key, sub):
            kept[node] = {k: v for k, v in sub.items() if k != key}
    kept = {k: v for k, v in kept.items() if not (k in LEGACY_VALUES and is_legacy(v, LEGACY_VALUES[k]))}
    return hashlib.blake2b(json.dumps(kept, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def idle(node: str, key: str, sub: dict) -> bool:
    """Whether ``node.key`` cannot have made the numbers differ from a run made before it existed: its
    legacy value (``LEGACY_NESTED``), or inert beside another key's value (``INERT_NESTED``)."""
    if (node, key) in LEGACY_NESTED and sub[key] == LEGACY_NESTED[node, key]:
        return True
    other = INERT_NESTED.get((node, key))
    return other is not None and sub.get(other[0]) == other[1]


def is_legacy(value, legacy) -> bool:
    """``value`` is the legacy value: a mapping with the same keys, each legacy; a boolean by identity
    (``0`` is not ``false``); a number by value (``0`` is ``0.0``); None by identity."""
    if legacy is None:
        return value is None
    if isinstance(legacy, dict):
        return (isinstance(value, dict) and value.keys() == legacy.keys()
                and all(is_legacy(value[k], legacy[k]) for k in legacy))
    if isinstance(legacy, bool) or isinstance(value, bool):
        return value is legacy
    return type(value) in (int, float) and value == legacy


@functools.cache
def code_hash() -> str:
    """A hash of the fedlnl package's Python sources: state saved by one version of the code is
    never loaded as another's (the shared prefixes of ``runner.Runner``)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.blake2b(digest_size=8)
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


#: beside the run directories (in their parent: a sweep's directory, or results/runs), the states
#: at the end of a shared prefix (``shared_prefix``), one file per key
PREFIX_DIR = ".prefixes"


def shared_prefix(method, info, resolved: dict, federation_hash: str, identity: dict,
                  run_dir: Path) -> tuple[int, str, Path] | None:
    """(rounds, key, file) of a run's shared prefix, or None.

    A method whose first rounds do not depend on some of its keys declares it with
    ``shared_prefix(info, method_cfg) -> (rounds, method_cfg with those keys neutralised)``:
    FedCorr's stages 1-2 are the same whatever method runs stage 3. Runs whose key is equal (the
    config hash with that method config, the federation's content hash (the data files may change
    under one config), the code's hash, the device identity) compute identical first ``rounds``
    rounds, so the first of them to get there saves its state and the others start from it
    (``reuse_prefix``; FedCorr and its stage-3 variants in one sweep). The runner saves and loads
    the file; a sweep's plan counts those rounds once (``sweeper.print_plan``)."""
    point = method.shared_prefix(info, resolved["method"])
    if point is None:
        return None
    rounds, method_cfg = point
    key = hashlib.blake2b(json.dumps({"config": config_hash({**resolved, "method": method_cfg}), "rounds": rounds,
                                      "federation": federation_hash, "code": code_hash(), "identity": identity},
                                     sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    return rounds, key, Path(run_dir).parent / PREFIX_DIR / f"{key}.pt"


def read_summary(run_dir: Path) -> dict | None:
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def completed(run_dir: Path, cfg_hash: str) -> dict | None:
    """The summary in ``run_dir`` if it is final for this config (a sweep cell to skip): complete, or
    diverged (deterministic: a re-run would diverge again), and borne out by its metrics.jsonl
    (``integrity.problem``: a hand-edited summary is not believed). A failed/interrupted run is re-run."""
    summary = read_summary(run_dir)
    if summary is None:
        return None
    final = summary.get("status") in ("complete", "diverged")
    if not (final and summary.get("config_hash") == cfg_hash):
        return None
    return summary if integrity.problem(run_dir, summary) is None else None


def article(word: str) -> str:
    """``a complete``, ``an interrupted``."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def recorded_run(run_dir: Path) -> tuple[str, str, dict | None] | None:
    """(what, config hash, resolved config or None) of the run ``run_dir`` holds, whatever became of
    it: its summary (any status: complete, diverged, interrupted, failed); else its checkpoint (a
    run killed without a summary); else the lock a killed run left beside its metrics.jsonl."""
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    if summary is not None and summary.get("config_hash") is not None:
        what = f"{article(str(summary.get('status') or 'unfinished'))} run"
        return what, summary["config_hash"], summary.get("config")
    ck = run_dir / "checkpoint.pt"
    if ck.is_file():
        import torch

        try:  # mmap: only the small header is read, not the tensors
            saved = torch.load(ck, map_location="cpu", weights_only=False, mmap=True)
        except Exception:  # noqa: BLE001  (an unreadable checkpoint is moved aside when the run loads it)
            saved = None
        if isinstance(saved, dict) and saved.get("config_hash") is not None:
            return (f"a killed run (no summary; its checkpoint.pt after round {int(saved.get('round', -1)) + 1})",
                    saved["config_hash"], saved.get("config"))
    owner = CellLock(run_dir).owner() if (run_dir / "metrics.jsonl").is_file() else None
    if owner and owner.get("config_hash"):
        return "a killed run (no summary or checkpoint; its metrics.jsonl and .lock)", owner["config_hash"], None


def check_run_dir(run_dir: Path, cfg_hash: str, resolved: dict, key: str = "hydra.run.dir") -> None:
    """Raise ConfigError when ``run_dir`` cannot take this run: its ``.lock`` is not a file, or it
    holds a run of another config in any state (complete, diverged, interrupted, failed, or killed:
    its checkpoint or its rows), or a live one. ``key`` is the setting that chose the directory."""
    run_dir = Path(run_dir)
    lock = CellLock(run_dir)
    try:
        lock.check_path()
    except LockError as err:
        raise ConfigError(str(err)) from err
    found = recorded_run(run_dir)
    if found is not None and found[1] != cfg_hash:
        what, other, config = found
        diff = config_diff(config, resolved) if isinstance(config, dict) else f"config hash {other} -> {cfg_hash}"
        raise ConfigError(f"{run_dir} holds {what} of another config ({diff}): set {key}= to another "
                          f"directory, or move that run away")
    owner = lock.owner()
    if owner and owner.get("config_hash") not in (None, cfg_hash) and lock.stale() is None:
        raise ConfigError(f"{run_dir} is being trained with another config ({lock.describe()}): set {key}= to "
                          f"another directory")


def recorded_identity(run_dir: Path, cfg_hash: str) -> tuple[str, dict] | None:
    """(what recorded it, the identity) of this config's run in ``run_dir``: a kept summary's, else
    a checkpoint's (a killed run leaves no summary); None when neither records one. A summary
    written before identities were recorded names its device (``device``), not its mode."""
    summary = read_summary(run_dir)
    if summary is not None and summary.get("config_hash") == cfg_hash and summary.get("status") in KEPT:
        ident = summary.get("identity")
        if not isinstance(ident, dict) and isinstance(summary.get("device"), str):
            ident = {"device_kind": summary["device"].split(":")[0]}
        if isinstance(ident, dict):
            return f"{article(summary['status'])} run", ident
    ck = Path(run_dir) / "checkpoint.pt"
    if ck.is_file():
        import torch

        try:  # mmap: only the small header is read, not the tensors
            saved = torch.load(ck, map_location="cpu", weights_only=False, mmap=True)
        except Exception:  # noqa: BLE001  (an unreadable checkpoint is moved aside when the run loads it)
            return None
        if isinstance(saved, dict) and saved.get("config_hash") == cfg_hash and isinstance(saved.get("identity"), dict):
            return "a checkpoint", saved["identity"]
    return None


def check_identity(run_dir: Path, cfg_hash: str, current: dict) -> None:
    """Raise ConfigError when ``run_dir`` holds this config's run (kept summary or checkpoint) made on
    another device kind or determinism mode: its numbers would mix two computations."""
    from fedlnl.benchmark.device import identity_mismatch

    found = recorded_identity(run_dir, cfg_hash)
    diff = identity_mismatch(found[1], current) if found else None
    if diff:
        raise ConfigError(f"{run_dir} holds {found[0]} of this config made elsewhere (recorded -> now: {diff}): a cell is "
                          f"never continued on another device kind or determinism mode; start a separate cell "
                          f"(another name=, hydra.sweep.dir= or hydra.run.dir=) or use the recorded device/determinism")


def config_diff(old: dict, new: dict, limit: int = 3) -> str:
    """``fl.lr: 0.01 -> 0.05, seed: 0 -> 1`` for the result keys that differ (at most ``limit``)."""
    a, b = _flat({k: v for k, v in old.items() if k not in NON_RESULT_KEYS}), \
        _flat({k: v for k, v in new.items() if k not in NON_RESULT_KEYS})
    keys = sorted(k for k in set(a) | set(b) if a.get(k, "<unset>") != b.get(k, "<unset>"))
    shown = [f"{k}: {_short(a.get(k, '<unset>'))} -> {_short(b.get(k, '<unset>'))}" for k in keys[:limit]]
    more = f", {len(keys) - limit} more" if len(keys) > limit else ""
    return (", ".join(shown) + more) if shown else "the same keys, an older hash"


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _short(v) -> str:
    text = json.dumps(v, default=str) if not isinstance(v, str) else v
    return text if len(text) <= 40 else text[:37] + "..."


#: free space a run directory's file system must have to start: its metrics, summary and a
#: checkpoint written beside the last (a full disk mid-run is one line too, ``runner``)
MIN_FREE = 1 << 20


def check_names(path: Path, key: str) -> None:
    """Raise ConfigError when ``path`` cannot be a path on this machine: a name longer than its file
    system allows (``OSError: [Errno 36]`` otherwise, from the first call that touches it), the
    whole longer than the system's path limit, or a component that is a dangling symbolic link."""
    path = Path(path).absolute()
    anchor = next((p for p in path.parents if _exists(p)), Path(path.anchor))
    limit = _pathconf(anchor, "PC_NAME_MAX", 255)
    for part in path.parts[1:]:
        if len(part.encode()) > limit:
            raise ConfigError(f"{key}={_short(str(path))} cannot be created: its name {_short(part)!r} is "
                              f"{len(part.encode())} bytes, more than the {limit} its file system allows")
    total = _pathconf(anchor, "PC_PATH_MAX", 4096)
    if len(str(path).encode()) >= total:
        raise ConfigError(f"{key}={_short(str(path))} cannot be created: the path is {len(str(path).encode())} bytes, "
                          f"more than the {total - 1} this system allows")
    for p in [path, *path.parents]:
        if p.is_symlink() and not p.exists():
            raise ConfigError(f"{key}={path} cannot be created: {p} is a symbolic link to {os.readlink(p)}, which "
                              f"does not exist (create it, or set {key}= to another directory)")


def check_writable(path: Path, key: str, free: int = MIN_FREE) -> None:
    """Raise ConfigError when ``path`` cannot be created or written: a name the file system refuses
    (``check_names``), a component that is a file, a first existing directory this process cannot
    write (permissions, a read-only mount), or a file system with less than ``free`` bytes free."""
    check_names(path, key)
    path = Path(path).absolute()
    for p in [path, *path.parents]:
        if not p.exists():
            continue
        if not p.is_dir():
            raise ConfigError(f"{key}={path} cannot be created: {p} is a file, not a directory")
        if not os.access(p, os.W_OK | os.X_OK) or _read_only(p):
            why = "a read-only file system" if _read_only(p) else "no write permission"
            raise ConfigError(f"{key}={path} cannot be written: {p} is not writable ({why})")
        left = shutil.disk_usage(p).free
        if left < free:
            raise ConfigError(f"{key}={path} cannot be written: its file system has {left / 1024:,.0f} KB free "
                              f"(a run needs at least {free / 2**20:,.0f} MB for its metrics, summary and checkpoints)")
        return


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:  # a name too long, a loop of links
        return False


def _pathconf(p: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(p, name))
    except (OSError, ValueError, AttributeError):
        return default


def _read_only(p: Path) -> bool:
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False
