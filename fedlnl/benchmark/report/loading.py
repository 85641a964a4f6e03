"""Reading a sweep directory: one record per run directory (summary.json, else the Hydra config)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from fedlnl.benchmark import integrity
from fedlnl.benchmark.metrics import read_rows, summary_metrics
from fedlnl.benchmark.selection import stages_of
from fedlnl.benchmark.setting import setting_of

from fedlnl.conf import resolvers  # noqa: F401 (${fidelity:...} in Hydra configs)
from fedlnl.benchmark.report.cells import MISSING, SETTING_KEYS, canon

log = logging.getLogger(__name__)

class ReportInputError(ValueError):
    """Input the report cannot use: printed as one line, exit code 2."""


COMPLETE_KEYS = (*summary_metrics("acc"), "comm_cost")
RUN_FILES = ("summary.json", "metrics.jsonl")

def load_summaries(root: str | Path) -> pd.DataFrame:
    """One row per run directory below ``root``: flattened summary (``setting.rho``, ``config.x.y``,
    plus the setting keys bare: ``rho``), the run's ``path`` and its ``status``."""
    root = Path(root)
    records = [_run_record(d) for d in _run_dirs(root)]
    frame = pd.DataFrame([_flatten(r) for r in records], dtype=object)
    for key in ("status", "method", "path"):
        if key not in frame:
            frame[key] = pd.Series(dtype=object)
    for key in SETTING_KEYS:
        if f"setting.{key}" in frame and key not in frame:
            frame[key] = frame[f"setting.{key}"]
    return _with_variants(frame)


def _with_variants(frame: pd.DataFrame) -> pd.DataFrame:
    """``base_method`` keeps the method's name; ``method`` becomes "method (variant)" for runs of
    an ablation variant, so they form their own rows (and never pool with the plain method)."""
    frame["base_method"] = frame["method"]
    if "variant" in frame:
        frame["method"] = [row_label(m, v) for m, v in zip(frame["method"], frame["variant"])]
    return frame


def row_label(method, variant) -> str:
    variant = canon(variant)
    if variant in (None, "") or canon(method) is None:
        return method
    return f"{method} ({variant})"


def _run_dirs(root: Path) -> list[Path]:
    dirs = {p.parent for name in RUN_FILES for p in root.rglob(name)}
    return sorted(d for d in dirs if ".hydra" not in d.parts)


def _run_record(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    if not path.exists():
        return _stub_record(run_dir, MISSING)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        log.warning("skipping unreadable %s: %s", path, err)
        return _stub_record(run_dir, "unreadable")
    if not isinstance(record, dict) or "method" not in record:
        log.warning("skipping partial %s: no method", path)
        return _stub_record(run_dir, "partial")
    lacking = [k for k in COMPLETE_KEYS if record.get(k) is None]
    if record.get("status") == "complete" and lacking:
        log.warning("partial summary %s (no %s): counted as incomplete", path, ", ".join(lacking))
        record["status"] = "partial"
    record.setdefault("status", "partial")
    why = integrity.problem(run_dir, record) if record["status"] in integrity.FINISHED else None
    if why and integrity.sealed(record):  # edited after the run: never averaged
        log.warning("unverified %s: %s: counted as incomplete", path, why)
        record["status"] = "unverified"
    elif why:  # written before summaries were sealed: the figures of its own version are shown
        log.warning("%s was written before summaries were sealed and %s", path, why)
    config = record.get("config")
    if isinstance(config, dict) and {"dataset", "partition", "noise"} <= config.keys():
        record["setting"] = setting_of(config)  # today's setting keys, whichever version wrote the run
    if record["status"] == "complete":
        record.update(stages_of(run_dir, record.get("selected_round")))
    return {**record, "path": str(run_dir)}


def _stub_record(run_dir: Path, status: str) -> dict:
    """An incomplete run, placed from its Hydra config when the run directory has one."""
    record: dict = {"status": status, "path": str(run_dir)}
    try:
        record.update(_hydra_record(run_dir / ".hydra"))
    except Exception as err:  # a broken config only loses the placement, never the report
        log.warning("cannot read the Hydra config of %s: %s", run_dir, err)
    return record


def _hydra_record(hydra_dir: Path) -> dict:
    """Method, seed, setting and config of a run from the files Hydra wrote, grouped as the
    runner's summary would be."""
    if not (hydra_dir / "config.yaml").exists():
        return {}
    cfg = OmegaConf.load(hydra_dir / "config.yaml")
    choices = {}
    if (hydra_dir / "hydra.yaml").exists():
        hydra = OmegaConf.to_container(OmegaConf.load(hydra_dir / "hydra.yaml"), resolve=False)
        choices = _get(hydra, "hydra.runtime.choices") or {}
    config = _container(cfg)
    setting = setting_from_config(config)
    return {"method": choices.get("method"), "model": choices.get("model"),
            "dataset": setting.get("dataset"), "seed": config.get("seed"), "setting": setting,
            "variant": config.get("variant"), "preset": config.get("preset"), "config": config}


def setting_from_config(config: dict) -> dict:
    """The runner's ``setting`` keys read from a resolved config, for runs that stopped before
    writing a summary (the same function the runner uses; no runner import)."""
    return setting_of(config)


def _container(cfg) -> dict:
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # e.g. ${hydra:...} outside a Hydra app
        return OmegaConf.to_container(cfg, resolve=False)


def _get(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict):
            return None
        tree = tree.get(part)
    return tree


def _flatten(record: dict, prefix: str = "") -> dict:
    """Nested keys dotted; a setting's structured value (``noise.map={3: 8}``, ``noise.groups=[...]``)
    and any list holding dicts or lists stay one hashable value, compact JSON, so they label a column."""
    flat = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        nested = isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)
        if nested or (isinstance(value, dict) and name.startswith("setting.")):
            flat[name] = json.dumps(value, sort_keys=True, separators=(",", ":"))
        elif isinstance(value, dict) and not name.startswith("cost_to_target"):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = tuple(value) if isinstance(value, list) else value
    return flat


def read_metrics(path: str | Path) -> pd.DataFrame | None:
    """metrics.jsonl as a frame (unparsable lines, e.g. a half-written last line, are skipped)."""
    rows = read_rows(path)
    return pd.DataFrame(rows) if rows else None

