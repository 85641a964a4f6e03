"""Equal-budget tuning (``experiment=tune``) and the application of its results (``tuned=``).

What is searched is declared once, beside the parameters: a method's own fields carry a ``search``
space (``fedlnl.methods.common.params.param(..., search=...)``, at most three per method), and every
method's learning rate is searched over ``params.LR`` at the key the method actually reads
(``search_space``). The objective is the federation's noisy-validation accuracy at the selected
round (``OBJECTIVE``, written by the runner when ``selection.val_share`` > 0), never a test figure.
The sweeper (``fedlnl.benchmark.tune``) writes ``optimization_results.yaml`` per method; ``tuned=``
applies its best values to a run or a sweep as if they were typed (``apply``).

Optuna is imported only where a study runs (``Dim.suggest``): applying tuned values needs none.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from fedlnl.benchmark import compose
from fedlnl.benchmark.validate import ConfigError
from fedlnl.methods.common.params import LR, Space

#: the summary key a tune maximises: noisy-validation accuracy at the selected round (issue 33 item 1)
OBJECTIVE = "selected_val_acc"
#: the file a study writes into its directory (Hydra's Optuna sweeper's name, with our keys beside)
RESULTS = "optimization_results.yaml"
#: own (non-lr) keys a method may search at most
MAX_OWN = 3


def objective(summary: Mapping) -> float:
    """A trial's value: the noisy-validation accuracy at the selected round; 0.0 for a run that
    diverged (its hyperparameters made it diverge: the worst value, so the sampler avoids them).
    Any other state is an error (the sweep stops; re-running it resumes from the complete trials)."""
    status = summary.get("status")
    if status == "diverged":
        return 0.0
    value = summary.get(OBJECTIVE)
    if status != "complete":
        raise RuntimeError(f"a tuning trial ended with status {status!r}, not complete or diverged")
    if value is None:
        raise RuntimeError(f"a tuning trial's summary has no {OBJECTIVE} (it needs selection.val_share > 0)")
    return float(value) if math.isfinite(float(value)) else 0.0


def validation_share(cfg) -> float:
    """``selection.val_share`` of a config (0 when the key is absent)."""
    value = OmegaConf.select(cfg, "selection.val_share", default=0.0)
    return float(value or 0.0)


def check_validation(cfg) -> None:
    """A tune needs a validation set to maximise: refused in one line before any trial."""
    share = validation_share(cfg)
    if not share > 0:
        raise ConfigError(f"selection.val_share={share:g}: experiment=tune maximises the noisy-validation accuracy "
                          f"({OBJECTIVE}) and this config holds no validation set; set selection.val_share=0.1 "
                          "(never the test set)")


# ------------------------------------------------------------------------------------ the space
@dataclass(frozen=True)
class Dim:
    """One searched value: the override ``key`` that sets it, its ``space``, and the ``default``
    the run would use (the centre of an ``around`` range)."""

    key: str
    space: Space
    default: object

    @property
    def bounds(self) -> tuple:
        return self.space.bounds(self.default)

    def describe(self) -> str:
        s = self.space
        if s.choices is not None:
            return "one of " + ", ".join(map(str, s.choices))
        low, high = self.bounds
        return f"{'log-' if s.log else ''}uniform {'integer ' if s.integer else ''}[{low:g}, {high:g}]"

    def suggest(self, trial):
        """The trial's value (Optuna's public suggest API)."""
        s = self.space
        if s.choices is not None:
            return trial.suggest_categorical(self.key, list(s.choices))
        low, high = self.bounds
        if s.integer:
            return trial.suggest_int(self.key, int(low), int(high), log=s.log)
        return trial.suggest_float(self.key, float(low), float(high), log=s.log)


def search_space(method, resolved_method: Mapping) -> list[Dim]:
    """The searched values of a built method (with its nested stage-3 method): the learning rate at
    the key each method node reads (``fl.lr``; ``<path>.lr`` where its YAML pins lr for the dataset;
    its own ``lr`` fields where ``fl.lr`` is in its ``fl_unused``), then each node's own fields with
    a ``search`` space that this configuration reads."""
    dims: dict[str, Dim] = {}
    for path, node, obj in compose.method_nodes(method, resolved_method):
        unused = obj.fl_unused
        if "lr" not in unused:
            key = f"{path}.lr" if node.get("lr") is not None else "fl.lr"
            dims.setdefault(key, Dim(key, LR, obj.fl.lr))
        unread = obj.params.unread()
        for f in dataclasses.fields(obj.params):
            space = f.metadata.get("search")
            if space is not None and f.name not in unread:
                dims[f"{path}.{f.name}"] = Dim(f"{path}.{f.name}", space, getattr(obj.params, f.name))
    own = [d.key for d in dims.values() if not d.space.lr]
    if len(own) > MAX_OWN:
        raise TypeError(f"{type(method).__name__} searches {len(own)} own keys ({', '.join(own)}); at most {MAX_OWN}")
    return list(dims.values())


def space_table(space_of: Callable[[str], list[Dim]], methods: Iterable[str]) -> list[str]:
    """The user guide's tables of the searched values (docs/user-guide.md, "Tuning with an equal
    budget"): one row per method with its ranges at the tuning cell, then one row per declaration
    with the methods that search it and its source."""
    rows, sources, methods = ["| method | searched (ranges at the tuning cell) |", "|---|---|"], {}, list(methods)
    for name in methods:
        dims = space_of(name)
        rows.append(f"| `{name}` | {'; '.join(f'`{d.key}` {d.describe()}' for d in dims)} |")
        for d in dims:
            field = "lr" if d.space.lr else d.key.rpartition(".")[2]
            sources.setdefault((field, d.space.source), []).append(name)
    rows += ["", "| key | methods | source of the range |", "|---|---|---|"]
    for (field, source), names in sorted(sources.items()):
        shown = "every method" if set(names) == set(methods) else ", ".join(f"`{n}`" for n in dict.fromkeys(names))
        rows.append(f"| `{field}` | {shown} | {source} |")
    return rows


def override_value(value) -> str:
    """A value as a command-line override writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value) if isinstance(value, float) else str(value)


# ------------------------------------------------------------------------------------ tuned=
#: tunings shipped with the package (fedlnl/tuned/<name>/<method>/optimization_results.yaml): a bare
#: name in ``tuned=`` that is no path here names one (experiment=quickstart uses ``tuned=quickstart``)
TUNED_ROOT = Path(__file__).resolve().parent.parent / "tuned"
COMMITTED = sorted(p.name for p in TUNED_ROOT.iterdir() if p.is_dir()) if TUNED_ROOT.is_dir() else []


def committed(name: str) -> Path | None:
    """The directory of the committed tuning ``name`` (a bare name, no path separator), else None."""
    return TUNED_ROOT / name if name in COMMITTED else None


def results_file(where: str, method: str) -> tuple[Path, str]:
    """(the results file of ``method``, its path relative to ``where``) for ``tuned=<where>``: a
    results file, a study directory of one method, or a directory holding one per method."""
    root = Path(str(where)).expanduser()
    if not root.exists() and committed(str(where)) is not None:
        root = committed(str(where))
    if not root.exists():
        raise ConfigError(f"tuned={where} is invalid: no such file or directory (give an {RESULTS}, the "
                          f"directory of an experiment=tune run, or a committed tuning: {', '.join(COMMITTED)})")
    if root.is_file():
        return root, root.name
    for candidate in (root / RESULTS, root / method / RESULTS):
        if candidate.is_file():
            return candidate, str(candidate.relative_to(root))
    found = sorted(p.parent.name for p in root.glob(f"*/{RESULTS}"))
    raise ConfigError(f"tuned={where} holds no tuned values for method {method} "
                      f"({'tuned methods there: ' + ', '.join(found) if found else f'no {RESULTS} found'})")


def read_results(path: Path, where: str, method: str) -> dict:
    """The results of ``method`` in ``path``, refused when they are another method's."""
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as err:  # noqa: BLE001  (a file that is no YAML)
        raise ConfigError(f"tuned={where} is invalid: {path} is not readable YAML ({err})") from err
    if not isinstance(data, dict) or not isinstance(data.get("best_params"), dict) or "method" not in data:
        raise ConfigError(f"tuned={where} is invalid: {path} is not the result of an experiment=tune run "
                          "(it needs best_params and method)")
    if data["method"] != method:
        raise ConfigError(f"tuned={where} is invalid: {path} holds the tuned values of method {data['method']}, "
                          f"not of this run's method {method}")
    return data


def apply(cfg, method: str, typed: Mapping[str, str]) -> tuple[dict | None, dict[str, str]]:
    """Apply ``tuned=`` to a composed config (in place, before it is validated): set each best
    value at its key, as if typed. Returns (the summary's ``tuned`` record, the applied values as
    typed overrides for ``compose.check_typed``); (None, {}) without ``tuned``. A key also typed on
    the command line is refused (which value would hold is not for us to guess)."""
    where = cfg.get("tuned")
    if where is None:
        return None, {}
    path, source = results_file(str(where), method)
    data = read_results(path, str(where), method)
    values = data["best_params"]
    both = sorted(k for k in values if k in typed)
    if both:
        raise ConfigError(f"{both[0]}={typed[both[0]]} and tuned={where} both set {both[0]}: drop one")
    with open_dict(cfg):
        for key, value in values.items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    record = {"values": dict(values), "trials": data.get("trials"), "objective": data.get("objective"),
              "source": source, "best_value": data.get("best_value"), "tuned_on": data.get("setting")}
    return record, {k: override_value(v) for k, v in values.items()}
