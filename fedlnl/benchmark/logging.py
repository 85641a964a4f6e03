"""Metric sinks: a JSONL file per run (always) and Weights & Biases (optional).

This is the only module that imports wandb, and only when a W&B sink is built.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path


def _clean(value):
    """JSON-safe: NaN/inf become null, numpy/torch scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:  # numpy arrays, tensors
        return _clean(value.tolist())
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to a temporary file and rename it over ``path``: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(_clean(obj), f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


#: row keys measured by the wall clock: kept out of metrics.jsonl (which is byte-identical between
#: two runs of the same config) and written to timing.jsonl instead
CLOCK_KEYS = ("time_s",)


class JsonlSink:
    """metrics.jsonl (the numbers) and timing.jsonl (the wall clock of the same rows)."""

    def __init__(self, path: Path):
        self.file = open(path, "w")
        self.timing = open(Path(path).with_name("timing.jsonl"), "w")

    def log(self, row: dict) -> None:
        row = _clean(row)
        self.file.write(json.dumps({k: v for k, v in row.items() if k not in CLOCK_KEYS}) + "\n")
        self.timing.write(json.dumps({"round": row.get("round"), **{k: row[k] for k in CLOCK_KEYS if k in row}}) + "\n")
        self.file.flush()
        self.timing.flush()

    def summary(self, summary: dict) -> None:
        pass

    def close(self, status: str = "complete") -> None:
        self.file.close()
        self.timing.close()


class WandbSink:
    """One W&B run per run directory; finished in ``close`` before the next job starts. ``run_id``
    is stable for the run directory, so a run resumed from its checkpoint continues the same W&B
    run (``resume="allow"``) instead of leaving a stub and starting a second one."""

    def __init__(self, cfg: dict, run_dir: Path, name: str, group: str, tags: list[str],
                 mode: str, project: str, entity: str | None, run_id: str):
        import wandb  # local import: wandb is loaded only when this sink is used

        self.wandb = wandb
        self.run = wandb.init(
            project=project, entity=entity, group=group, name=name, tags=tags, config=cfg,
            dir=str(run_dir), mode=mode, reinit="finish_previous", id=run_id, resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, row: dict) -> None:
        row = _clean(row)
        per_class = {f"class_acc/{c}": v for c, v in enumerate(row.get("class_acc") or []) if v is not None}
        row = {k: v for k, v in row.items() if isinstance(v, (int, float)) and v is not None}
        self.run.log({**row, **per_class}, step=int(row["round"]))

    def summary(self, summary: dict) -> None:
        for key, value in _clean(summary).items():
            if isinstance(value, (int, float, str)) or value is None:
                self.run.summary[key] = value
        for zeta, cost in (summary.get("cost_to_target") or {}).items():
            self.run.summary[f"cost_to_{zeta}"] = cost
        for zeta, cost in (summary.get("cost_to_target_balanced") or {}).items():
            self.run.summary[f"cost_to_{zeta}_balanced"] = cost

    def close(self, status: str = "complete") -> None:
        self.run.finish(exit_code=0 if status in ("complete", "diverged") else 1)  # failed -> marked failed


class Sinks:
    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, row: dict) -> None:
        for s in self.sinks:
            s.log(row)

    def summary(self, summary: dict) -> None:
        for s in self.sinks:
            s.summary(summary)

    def close(self, status: str = "complete") -> None:
        for s in self.sinks:
            s.close(status)
