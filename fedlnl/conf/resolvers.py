"""OmegaConf resolvers used by the YAML files; imported before Hydra composes a config."""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

from omegaconf import OmegaConf

from fedlnl.conf.keys import CELL_DIR_EXCLUDED

FIDELITIES = ("paper", "reference")


def _fidelity(paper_value, reference_value, *, _parent_, _root_):
    """``${fidelity:<paper>,<reference>}``: the value for the governing ``fidelity`` key.

    A config node with its own ``fidelity`` key (the noise model's) follows that one; everything
    else follows the top-level key. So ``fidelity=reference`` flips every method switch while the
    federation stays the same, and ``noise.fidelity=reference`` reproduces the reference noise."""
    mode = _parent_.get("fidelity") if "fidelity" in _parent_ else _root_.get("fidelity", "paper")
    if mode not in FIDELITIES:
        raise ValueError(f"fidelity: got {mode!r}, allowed: {', '.join(FIDELITIES)}")
    return paper_value if mode == "paper" else reference_value


def _item(pair, index, fallback):
    """``${item:${.rho_tau},0,0.0}``: element ``index`` of a zipped sweep pair, or ``fallback`` when
    the pair is unset. Lets ``noise.rho_tau=[0.6,0.5]`` sweep (ρ, τ) together while ``noise.rho``
    stays directly settable."""
    return fallback if pair is None else pair[int(index)]


def _per_dataset(table, *, _root_):
    """``${per_dataset:{cifar10: 0.01, cifar100: 0.01, tiny: 1}}``: a method's paper value for the
    run's dataset. Looked up by the top-level ``table_key`` (``tiny`` under ``debug=tiny``), then by
    ``dataset.family`` (``cifar10_jpeg`` is ``cifar10``), then ``default``; none of them -> null, i.e.
    the shared ``fl`` value (for a local-training key) or "not pinned"."""
    dataset = _root_.get("dataset") or {}
    for key in (_root_.get("table_key"), dataset.get("family"), "default"):
        if key is not None and key in table:
            return table[key]
    return None


def _case(value, table):
    """``${case:${partition.kind},{noniid: 30, default: 6}}``: ``table[value]`` or ``table.default``."""
    return table[value] if value in table else table.get("default")


def _tiny_federation(p, what):
    """``debug=tiny``'s federation: 6 clients, 3 a round; 30 clients, 3 a round for a partition
    with a class-presence probability ``partition.p`` < 0.5 (``noniid``: with 6 clients, Bernoulli(p = 0.3)
    class presence leaves some class without any holder w.p. 0.7^6 per class, which the partition refuses)."""
    large = p is not None and float(p) < 0.5
    return {"num_clients": 30 if large else 6, "frac": 0.1 if large else 0.5}[what]


def _shared_dir():
    """``${shared_dir:}``: ``$FEDLNL_SHARED``, else the ``shared/`` folder beside the repository
    (independent of the current directory). A missing folder is reported when the data is loaded."""
    env = os.environ.get("FEDLNL_SHARED")
    return env if env else str(Path(__file__).resolve().parents[3] / "shared")


#: longest sweep-cell directory name kept as is (file systems allow 255 bytes per name)
MAX_CELL_NAME = 160


def _cell_dir(name):
    """``${cell_dir:${hydra.job.override_dirname}}``: the cell's overrides as its directory name, or,
    past MAX_CELL_NAME bytes, a short stable name (a prefix + a hash of the whole); the overrides
    are always recorded in the cell's ``.hydra/overrides.yaml``. A ``/`` inside a value (a file
    path such as ``noise.file=...``) is written ``%2F``, so a cell is one directory, not a tree."""
    name = str(name).replace("/", "%2F")
    if len(name.encode()) <= MAX_CELL_NAME:
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=6).hexdigest()
    return f"{name.encode()[:80].decode(errors='ignore').rstrip(',')}...{digest}"


def _gpus_for(device) -> int:
    """``${gpus_for:${device}}``: the GPUs a SLURM task asks for: 0 for ``device=cpu``, else 1 (with
    ``device=auto`` the task then runs on the one GPU SLURM gives it)."""
    return 0 if str(device) == "cpu" else 1


def _cell_dir_excluded() -> list[str]:
    """``${cell_dir_excluded:}``: the overrides left out of a sweep cell's directory name
    (:data:`fedlnl.conf.keys.CELL_DIR_EXCLUDED`)."""
    return list(CELL_DIR_EXCLUDED)


def _as_node(fn):
    """``fn`` returning a list or dict as an OmegaConf container: OmegaConf wraps a resolver's plain
    list in a value node, which ``OmegaConf.resolve`` (``fedlnl-run --cfg job --resolve``) cannot
    hold ("Value 'list' is not a supported primitive type"); resolved values are the same either way."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        value = fn(*args, **kwargs)
        return OmegaConf.create(value) if isinstance(value, (list, tuple, dict)) else value
    return wrapped


def register() -> None:
    for name, fn in (("fidelity", _fidelity), ("item", _item), ("per_dataset", _per_dataset),
                     ("case", _case), ("tiny_federation", _tiny_federation), ("shared_dir", _shared_dir),
                     ("cell_dir", _cell_dir), ("cell_dir_excluded", _cell_dir_excluded), ("gpus_for", _gpus_for)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, _as_node(fn))


register()
