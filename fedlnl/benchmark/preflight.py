"""Everything checked before a run trains, in the order it can be checked.

1. ``check_argv``: the command line itself (option names of config groups, override syntax, keys
   that exist), before Hydra starts, so a typo is one line and exit 2, not Hydra's error page.
2. ``check_cell``: one composed cell without data: ``validate`` (every runner/federation key), the
   method built from its YAML with its ``FLSettings`` (its own hyperparameter checks), and typed
   ``fl.*`` overrides that could not take effect. The sweeper runs it for every cell of a sweep.
3. ``build_cell``: what needs the loaded dataset, built by the same code the run uses: the number
   of samples, the federation (partition sizes, class coverage, noise inputs), the model (its
   constructor's checks, offline weights, one forward pass at the dataset's image size) and the
   method's schedule on the federation. A single run makes every check before Hydra creates its
   directory; a sweep makes them for every cell before the first one trains.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedlnl.benchmark import compose
from fedlnl.benchmark.device import seeded_init
from fedlnl.benchmark.runkeys import SEED_MAX, SEED_RANGE  # noqa: F401 (SEED_RANGE: read from here by the sweeper)
from fedlnl.benchmark.selection import SelectionSettings
from fedlnl.benchmark.validate import ConfigError, check_fl, validate
from fedlnl.datasets import DataError, DatasetUnavailable
from fedlnl.methods.common.protocol import FederationInfo

CONF = Path(__file__).resolve().parents[1] / "conf"
log = logging.getLogger("fedlnl")

#: errors of the data layer that carry a sentence for the user (missing files, bad folders, ...), and
#: ValueError: partition/noise settings the data cannot satisfy
DATA_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, DatasetUnavailable, DataError, ValueError)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def valid_seed(text: str) -> bool:
    return text.isdigit() and int(text) <= SEED_MAX


# ------------------------------------------------------------------------------------ one cell
def check_cell(cfg, typed: dict[str, str]):
    """Validate a composed config and build its method; returns the method. Raises ConfigError."""
    try:
        validate(cfg)
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(f"{missing[0]} is missing: set {missing[0]}=... (required by this config)")
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:  # a value no interpolation can use
        key = getattr(err, "full_key", None)
        raise ConfigError(f"{key or 'config'}: {first_line(err)}") from err
    method = compose.build_method(resolved["method"], resolved["fl"])
    for path, _node, obj in compose.method_nodes(method, resolved["method"]):
        check_fl(dataclasses.asdict(obj.fl), f"{path}.")  # the values after the method's pins
    compose.check_typed(typed, method, resolved["method"], resolved["dataset"].get("family"))
    check_noise_rate(method, resolved)
    return method


def check_noise_rate(method, resolved: dict) -> None:
    """A hyperparameter set to ``noise`` (the federation's nominal noise rate) needs a noise config
    whose rate is known (real label sets without a published rate are not)."""
    from fedlnl.datasets.noise import nominal_rate_problem

    for path, _node, obj in compose.method_nodes(method, resolved["method"]):
        key = obj.noise_rate_key
        problem = nominal_rate_problem(resolved["noise"]) if key else None
        if problem:
            raise ConfigError(f"{path}.{key}=noise needs the noise rate, but {problem}: "
                              f"set {path}.{key}=<a share in [0, 1)>")


def check_data(cfg, num_train: int) -> None:
    validate(cfg, num_train=num_train)


class DataUnavailable(ConfigError):
    """The dataset cannot be loaded on this machine (missing, not downloadable from here). A run
    refuses; a plan lists the cell without figures; a SLURM sweep leaves the check to its tasks
    (the data may live on the compute nodes only)."""


@dataclass
class Cell:
    """A cell built up to the point where training starts: everything the data-dependent checks
    need, and what the runner and the planner use."""

    fed: object  # datasets.Federation
    info: FederationInfo
    model: torch.nn.Module
    total: int  # the method's schedule length on this federation

    def evaluations(self, cfg) -> tuple[int, int]:
        """(evaluation cadence, clients that send validation counts at each evaluation): the plan's
        ``eval_every`` and ``reporters``."""
        return int(cfg.fl.eval_every), sum(1 for n in self.fed.val_sizes if n)


def build_cell(cfg, method, model_label: str, device="cpu", models: dict | None = None) -> Cell:
    """Load the data, build the federation and the model, and size the schedule, raising
    ConfigError with one line for anything the data or the model cannot satisfy. ``models``
    memoises models by config and data shape (a sweep's checks; a run builds its own)."""
    from fedlnl.datasets.federation import build_federation, import_federation, load_source

    where = None if models is None else "source:" + json.dumps(OmegaConf.to_container(cfg.dataset, resolve=True),
                                                             sort_keys=True, default=str)
    if where in (models or {}):  # a sweep: a dataset that failed to load fails once, not per cell
        raise models[where]
    try:
        source = load_source(cfg.dataset)
    except DATA_ERRORS as err:  # missing or broken data: the loader's own sentence
        if models is not None:
            models[where] = DataUnavailable(first_line(err))
            raise models[where] from err
        raise DataUnavailable(first_line(err)) from err
    check_data(cfg, num_train=int(source.y_train.shape[0]))
    try:
        sel = SelectionSettings.of(cfg.get("selection"))
        args = (cfg.dataset, cfg.partition, cfg.noise, cfg.fl.num_clients, cfg.seed, sel.val_share,
                sel.client_test_size)
        where = cfg.get("federation")  # an exported federation (fedlnl-export), checked before use
        fed = import_federation(where, *args) if where else build_federation(*args)
    except DATA_ERRORS as err:  # partition/noise settings the data cannot satisfy
        raise ConfigError(first_line(err)) from err
    src = fed.source
    info = FederationInfo(fed.num_clients, fed.num_classes, fed.client_sizes, tuple(src.x_train.shape[1:]),
                          int(cfg.seed), fed.meta.get("nominal_noise_rate"), fed.meta.get("nominal_noisy_share"))
    if models is None:
        model = build_model(cfg, info, model_label, device)
    else:
        key = json.dumps([OmegaConf.to_container(cfg.model, resolve=True), info.input_shape, info.num_classes],
                         sort_keys=True, default=str)
        if key not in models:
            try:
                models[key] = build_model(cfg, info, model_label, device)
            except ConfigError as err:
                models[key] = err
        if isinstance(models[key], ConfigError):
            raise models[key]
        model = models[key]
    try:
        total = compose.total_rounds(method, info, int(cfg.fl.rounds))
    except ValueError as err:  # a hyperparameter check that needs the federation (e.g. PoC's d >= m)
        raise ConfigError(first_line(err)) from err
    return Cell(fed, info, model, total)


def build_model(cfg, info: FederationInfo, model_label: str, device="cpu") -> torch.nn.Module:
    """The run's model, initialised from the run seed (not global state), checked by one forward
    pass; a constructor that refuses the data (LeNet on 8x8, pretrained weights offline) is one line."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    dataset = str(cfg.dataset.name)
    shape = "x".join(map(str, info.input_shape))
    with seeded_init(int(cfg.seed)):
        try:
            model = instantiate(cfg.model, num_classes=info.num_classes, input_shape=info.input_shape)
        except (InstantiationException, ValueError, RuntimeError, OSError) as err:
            cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ else err
            raise ConfigError(f"model={model_label} cannot be built for dataset={dataset} ({shape} images, "
                              f"{info.num_classes} classes): {first_line(cause)[:400]}") from err
    model = model.to(device)
    check_model(model, info.input_shape, model_label, dataset)
    return model


def check_model(model: torch.nn.Module, input_shape, model_name: str, dataset: str) -> None:
    """One forward pass of two blank images: a model that cannot take the dataset's image size
    (VGG-11 or ResNet-50 on 8x8 digits) is refused before training, not mid-way."""
    try:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            p = next(model.parameters(), None)
            model(torch.zeros(2, *input_shape, device=p.device if p is not None else "cpu"))
        model.train(was_training)
    except (RuntimeError, ValueError) as err:
        shape = "x".join(map(str, input_shape))
        raise ConfigError(f"model={model_name} cannot take dataset={dataset} images of {shape}: "
                          f"{first_line(err)[:160]} (pick another model=)") from err


# ------------------------------------------------------------------------------ the command line
#: config groups a user selects by name on the command line (Hydra's `group=option`)
GROUPS = ("method", "dataset", "model", "partition", "noise", "logger", "fl", "paper", "experiment",
          "debug", "scale", "arch", "ablation", "column", "hydra/launcher", "hydra/sweeper")
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-name", "-cn", "--config-path", "-cp",
                     "--config-dir", "-cd", "--info", "-i", "--experimental-rerun"}


def options(group: str, searchpath: tuple[Path, ...] = ()) -> list[str]:
    """The options of a config group: its YAMLs in fedlnl's config folder and in the folders of
    ``hydra.searchpath`` (an outside package's kinds, methods, ...)."""
    folders = [CONF / group, *(Path(root) / group for root in searchpath)]
    found = sorted({p.stem for folder in folders if folder.is_dir() for p in folder.glob("*.yaml")})
    if group == "hydra/launcher":
        found = sorted(set(found) | {"basic", "joblib", "submitit_local", "submitit_slurm"})
    if group == "hydra/sweeper":
        found = sorted(set(found) | {"basic"})
    return found


def config_overrides(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _FLAGS_WITH_VALUE:
            skip = True
            continue
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            continue
        out.append(arg)
    return out


def check_argv(argv: list[str]) -> str | None:
    """The first problem of the command line's overrides as one line, or None."""
    if any(a in ("--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc") for a in argv):
        return None
    modes = [a for a in argv if a in ("-m", "--multirun", "--cfg", "-c", "--info", "-i")]
    if len({"-m" if a == "--multirun" else "--cfg" if a == "-c" else "--info" if a == "-i" else a for a in modes}) > 1:
        return (f"{' and '.join(dict.fromkeys(modes))} cannot be combined: print one cell's config with "
                "`fedlnl-run --cfg job <overrides>` (without -m), or list a sweep's cells with `-m ... dry_run=true`")
    items = config_overrides(argv)
    if not items:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    try:
        parsed = OverridesParser.create().parse_overrides(items)
    except Exception as err:  # hydra's OverrideParseException
        return f"cannot parse the overrides: {first_line(err)}"
    problem = _argv_keys(parsed)
    if problem:
        return problem
    searchpath = [ov for ov in parsed if ov.key_or_group == "hydra.searchpath" and not ov.is_delete()]
    roots = _search_roots(searchpath[0].value()) if searchpath else ()
    first_values = []
    for ov in parsed:
        key = ov.key_or_group.split("@", 1)[0]
        if ov.value_type == ValueType.GLOB_CHOICE_SWEEP:  # glob(*): the group's names (Hydra's own loader expands it)
            values = ov.value().filter(sorted(options(key, roots))) if key in GROUPS else []
        elif ov.is_sweep_override():
            values = [str(v) for v in ov.sweep_string_iterator()]
        else:
            values = [ov.get_value_element_as_str()] if not ov.is_delete() else []
        if ov.is_sweep_override() and not ov.is_discrete_sweep():
            values = []  # ranges / intervals: left to Hydra
        group = "method" if key.startswith("method@") or ov.key_or_group.startswith("method@") else key
        if group in GROUPS and values and not (ov.is_sweep_override() and ov.value_type is None):
            known = options(group, roots)
            for v in values:
                if v not in known and v != "null" and not v.startswith("glob("):
                    return f"{key}={v} is invalid: allowed {', '.join(known)}"
        raw = ov.input_line
        if ov.is_sweep_override() and values:
            raw = f"{ov.get_key_element()}={values[0]}"
        elif ov.is_sweep_override():
            continue
        first_values.append(raw)
    return _compose_problem(first_values + [ov.input_line for ov in searchpath])


def check_tune(argv: list[str]) -> str | None:
    """``experiment=tune`` is a sweep of trials through Hydra's Optuna sweeper: it needs ``-m`` and
    the ``tune`` extra installed."""
    import importlib.util

    if not any(a in ("-m", "--multirun") for a in argv) and not any(
            a in ("--cfg", "-c", "--info", "-i", "--help", "-h") for a in argv):
        return "experiment=tune runs a study of trials: add -m (fedlnl-run -m experiment=tune method=<name>)"
    if any(importlib.util.find_spec(m) is None for m in ("optuna", "hydra_plugins.hydra_optuna_sweeper")):
        return "experiment=tune needs Hydra's Optuna sweeper: pip install -e '.[tune]' (hydra-optuna-sweeper)"
    return None


def _search_roots(entries) -> tuple[Path, ...]:
    """The folders of ``hydra.searchpath`` entries ``file://DIR`` and ``pkg://PACKAGE[/SUB]``."""
    import importlib.util

    roots = []
    for entry in entries if isinstance(entries, (list, tuple)) else []:
        scheme, _, where = str(entry).partition("://")
        if scheme == "file":
            roots.append(Path(where))
        elif scheme == "pkg":
            package, _, sub = where.replace("/", ".").partition(".")
            spec = importlib.util.find_spec(package)
            for base in (spec.submodule_search_locations or []) if spec else []:
                roots.append(Path(base, *sub.split(".")) if sub else Path(base))
    return tuple(roots)


#: groups whose added keys (``+group.key=...``) are checked, with their allowed keys, downstream
_CHECKED_NEW_KEYS = ("dataset", "partition", "noise", "method", "model", "hydra")


def _argv_keys(parsed) -> str | None:
    """Deleted keys, keys given twice, and new keys nothing would read, as one line."""
    seen: dict[str, str] = {}
    for ov in parsed:
        # a package is part of the key: `method=fedcorr +method@method.stage3=fedprox` sets two nodes
        key, raw = ov.key_or_group + (f"@{ov.package}" if ov.package else ""), ov.input_line
        root = key.split("@", 1)[0].split(".", 1)[0].split("/", 1)[0]
        if ov.is_delete() and root != "hydra":
            return (f"{raw} is invalid: deleting a key is not supported; set it instead "
                    f"({key}=<value>, see `fedlnl-run --cfg job` for its current value)")
        if key in seen:
            return f"{key} is given twice ({seen[key]} and {raw}): keep one"
        seen[key] = raw
        if ov.is_add() and "." not in key.split("@", 1)[0] and "@" not in key and key not in GROUPS:
            return (f"{raw} is invalid: {key} is not a key of the config and nothing would read it "
                    f"(see `fedlnl-run --cfg job` for the keys)")
        if ov.is_add() and "." in key and root not in _CHECKED_NEW_KEYS:
            return (f"{raw} is invalid: {key} is not a key of the config and nothing would read it "
                    f"(see `fedlnl-run --cfg job` for the keys)")
    return None


def _compose_problem(overrides: list[str]) -> str | None:
    """Compose the first cell with Hydra's compose API: unknown keys and type errors as one line."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return None
    try:
        with initialize_config_dir(str(CONF), version_base=None):
            cfg = hydra_compose("config", overrides=[o for o in overrides
                                                     if not o.startswith("hydra") or o.startswith("hydra.searchpath=")])
    except Exception as err:
        text = " ".join(str(err).split())
        found = re.search(r"Could not (?:override|append to) '([^']+)'", text) or re.search(r"full_key: (\S+)", text)
        if found:
            key = found.group(1)
            bad = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") == key), key)
            return (f"{bad} is invalid: {key} is not a key of the config "
                    f"(see `fedlnl-run --cfg job` for the keys; a new key needs +{key}=...)")
        return first_line(err)[:300]
    del cfg
    return None
