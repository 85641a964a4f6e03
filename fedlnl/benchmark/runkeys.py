"""The run keys: the one declaration of every key of a composed config outside a method's own
``Params`` and the data nodes. Each is a field built with ``key(doc, rule)`` (``fedlnl.conf.checks``):
its type (the annotation), its check (whose error text is what the docs' key table calls allowed)
and one line of doc; ``relations`` checks what relates several keys. ``validate.py`` walks these
declarations; ``docs/configuration.md``'s key tables are generated from them (``keytables.py``).

The ``fl`` group is ``Federation`` (the runner's keys) plus ``FLSettings`` (the local-training keys
every method shares and may pin, ``methods/common/protocol.py``); ``selection`` is
``SelectionSettings`` (``selection.py``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fedlnl.conf.checks import ConfigError, choice, fail, flag, integer, is_int, is_number, key, number, rule

#: longest sweep name: W&B groups ("<name>/<sweep dir>") hold at most 128 characters
NAME_MAX = 60
#: seeds numpy, torch and the seeded generators all take
SEED_MAX = 2**63 - 1
SEED_RANGE = "an integer in [0, 2**63 - 1]"


def _seed(key: str, value) -> None:
    if not is_int(value, 0) or value > SEED_MAX:
        fail(key, value, SEED_RANGE)


def _device(key: str, value) -> None:
    if not isinstance(value, str) or not (value in ("auto", "cpu", "cuda", "mps")
                                          or (value.startswith("cuda:") and value[5:].isdigit())):
        fail(key, value, "auto, cpu, cuda, cuda:N, mps")


def _text(key: str, value, allowed: str = "a name (text)") -> None:
    if value is not None and not isinstance(value, str):
        fail(key, value, allowed)


def _name(key: str, value) -> None:
    _text(key, value)
    if isinstance(value, str) and (not value or "/" in value or value in (".", "..") or len(value) > NAME_MAX):
        fail(key, value if len(value) <= 40 else value[:37] + "...",
             f"a sweep name without '/' of at most {NAME_MAX} characters (got {len(value)})")


def _targets(key: str, value) -> None:
    if not isinstance(value, list) or not value or not all(is_number(v) and 0 < v <= 1 for v in value):
        fail(key, value, "a non-empty list of accuracies in (0, 1], e.g. [0.5,0.65,0.8]")


@dataclass(frozen=True)
class RunKeys:
    """The top-level keys of a run (``conf/config.yaml``)."""

    seed: int = key("the run's seed: federation, noise, initialisation, sampling", rule(_seed))
    device: str = key("where to train", rule(_device))
    determinism: str = key("strict: reproducible on a GPU; fast: cuDNN benchmarking and TF32 allowed",
                           rule(choice, ("strict", "fast")))
    data_placement: str = key("where the training images live (auto: host when they would crowd the GPU)",
                              rule(choice, ("auto", "device", "host")))
    threads: int = key("torch CPU threads of the run (0 = torch's default)", rule(integer, 0))
    compile: bool = key("compile the local step once per run (torch.compile); in the config hash", rule(flag))
    table_key: str | None = key("column of the methods' per-dataset tables before dataset.family (null: by dataset)",
                                rule(_text))
    fidelity: str = key("paper: what the papers' text says; reference: what the official code does",
                        rule(choice, ("paper", "reference")))
    name: str = key("sweep/group name: W&B group, report title, results/sweeps/<name>", rule(_name))
    preset: str | None = key("set by paper presets: the report's reference table", rule(_text))
    variant: str | None = key("a label for an ablation/variant row, shown after the method", rule(_text))
    targets: list[float] = key("accuracy targets ζ for the cost-to-target metric", rule(_targets))
    checkpoint_every: int = key("rounds between checkpoints (0 = none by round count)", rule(integer, 0))
    checkpoint_minutes: float = key("wall-clock minutes between checkpoints (0 = none by time)", rule(
        number, lambda v: v >= 0, "minutes >= 0 (0 = no time-based checkpoints)"))
    skip_complete: bool = key("multirun: skip a cell whose summary.json is complete for this config", rule(flag))
    reuse_prefix: bool = key("start after first rounds another run of the same config saved (same numbers)",
                             rule(flag))
    tuned: str | None = key("the best values of an experiment=tune run, applied as if typed", rule(
        _text, allowed="null or the path of an experiment=tune result (a file or a directory)"))
    federation: str | None = key("an exported federation (fedlnl-export out=DIR) to run on instead of building one",
                                 rule(_text, allowed="null or the directory of a fedlnl-export"))
    dry_run: bool = key("print the plan (rounds, participations, steps, bytes) and run nothing", rule(flag))


@dataclass(frozen=True)
class Federation:
    """The ``fl`` group's keys the runner owns (beside the shared local-training ``FLSettings``)."""

    num_clients: int = key("N: clients of the federation (at most the number of training samples)",
                           rule(integer, 1))
    rounds: int = key("T: communication rounds", rule(integer, 1))
    eval_every: int = key("evaluate the global model every N rounds (and always at the last)", rule(integer, 1))

    @staticmethod
    def relations(node, prefix: str, num_train: int | None = None) -> None:
        """At most one client per training sample (known once the data is loaded)."""
        if num_train is not None and "num_clients" in node:
            number(prefix + "num_clients", node["num_clients"], lambda v: v <= num_train,
                   f"an integer in [1, {num_train}] (the number of training samples)")


def _wandb_login_known() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


@dataclass(frozen=True)
class Logger:
    """The ``logger`` group (``conf/logger/``)."""

    kind: str = key("wandb: log to Weights & Biases; none: metrics.jsonl only", rule(choice, ("wandb", "none")))
    mode: str = key("W&B mode (kind wandb)", rule(choice, ("offline", "online", "disabled")))
    project: str | None = key("W&B project (kind wandb)", rule(_text))
    entity: str | None = key("W&B entity (kind wandb; null: the login's default)", rule(_text))

    @staticmethod
    def relations(node, prefix: str) -> None:
        """W&B online needs a login."""
        if node.get("kind") == "wandb" and node.get("mode") == "online" and not _wandb_login_known():
            raise ConfigError("logger.mode=online needs a W&B login: run `wandb login` or set WANDB_API_KEY "
                              "(or use logger.mode=offline and `wandb sync` later)")


@dataclass(frozen=True)
class Tune:
    """The ``tune`` node of ``experiment=tune`` (``conf/tuning/optuna.yaml``)."""

    trials: int = key("trials per method: the equal budget", rule(integer, 1))
    seed: int = key("the TPE sampler's seed (the same for every method)", rule(integer, 0))
    root: str = key("folder of the tune results", rule(_text, allowed="a folder path (text)"))
    dir: str = key("the study's folder (default: <root>/<name>)", rule(_text, allowed="a folder path (text)"))
