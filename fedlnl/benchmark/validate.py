"""Checks on a composed config, run before any data is loaded or any file is written.

Every key a user can set outside a method's own hyperparameters (which the method's ``Params`` check)
is declared once, with its type, check and doc: the run keys and the ``fl`` group in
``benchmark/runkeys.py`` and ``FLSettings``, ``selection`` in ``SelectionSettings``, each dataset
loader's options beside the loader and each partition / noise kind's options beside the kind. This
module walks the config over those declarations (``fedlnl.conf.checks.check_node``): each error is
one line naming the key, the value and what is allowed.
"""
from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

from fedlnl.benchmark.runkeys import NAME_MAX, Federation, Logger, RunKeys, Tune  # noqa: F401 (NAME_MAX: read from here)
from fedlnl.benchmark.selection import SelectionSettings
from fedlnl.conf.checks import ConfigError, check_node  # noqa: F401 (ConfigError: imported from here by the benchmark)
from fedlnl.datasets.options import check_options
from fedlnl.methods.common.protocol import FLSettings

#: (config path, declaration) of every declared node but the data nodes, in the order they are checked
NODES = (("", RunKeys), ("logger", Logger), ("fl", Federation), ("fl", FLSettings),
         ("selection", SelectionSettings), ("tune", Tune))


def declared_values(node: DictConfig, decl) -> dict:
    """The values of the keys ``decl`` declares that ``node`` holds, resolved and plain."""
    names = [f for f in decl.__dataclass_fields__ if f in node]
    return {k: OmegaConf.to_container(node[k], resolve=True) if isinstance(node[k], (DictConfig, ListConfig))
            else node[k] for k in names}


def check_fl(values, prefix: str) -> None:
    """The shared local-training values (``fl`` or a method's pins of them, after the pins)."""
    check_node(FLSettings, dict(values), prefix)


def validate(cfg: DictConfig, num_train: int | None = None) -> None:
    """Raise ConfigError naming the key, the value and the allowed range."""
    for path, decl in NODES:
        node = cfg if not path else cfg.get(path)
        if isinstance(node, DictConfig):
            check_node(decl, declared_values(node, decl), f"{path}." if path else "")
    try:  # the partition and noise kinds' declared options, and the dataset loader's
        check_options(cfg.dataset, cfg.partition, cfg.noise)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err).strip().splitlines()[0]) from err
    if num_train is not None:
        Federation.relations(declared_values(cfg.fl, Federation), "fl.", num_train)
