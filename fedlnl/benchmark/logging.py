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


class JsonlSink:
    def __init__(self, path: Path):
        self.file = open(path, "w")

    def log(self, row: dict) -> None:
        self.file.write(json.dumps(_clean(row)) + "\n")
        self.file.flush()

    def summary(self, summary: dict) -> None:
        pass

    def close(self) -> None:
        self.file.close()


class WandbSink:
    """One W&B run per Hydra job; finished in ``close`` before the next job starts."""

    def __init__(self, cfg: dict, run_dir: Path, name: str, group: str, tags: list[str],
                 mode: str, project: str, entity: str | None):
        import wandb  # local import: wandb is loaded only when this sink is used

        self.wandb = wandb
        self.run = wandb.init(
            project=project, entity=entity, group=group, name=name, tags=tags, config=cfg,
            dir=str(run_dir), mode=mode, reinit="finish_previous",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, row: dict) -> None:
        row = {k: v for k, v in _clean(row).items() if isinstance(v, (int, float)) and v is not None}
        self.run.log(row, step=int(row["round"]))

    def summary(self, summary: dict) -> None:
        for key, value in _clean(summary).items():
            if isinstance(value, (int, float, str)) or value is None:
                self.run.summary[key] = value
        for zeta, cost in (summary.get("cost_to_target") or {}).items():
            self.run.summary[f"cost_to_{zeta}"] = cost

    def close(self) -> None:
        self.run.finish()


class Sinks:
    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, row: dict) -> None:
        for s in self.sinks:
            s.log(row)

    def summary(self, summary: dict) -> None:
        for s in self.sinks:
            s.summary(summary)

    def close(self) -> None:
        for s in self.sinks:
            s.close()
