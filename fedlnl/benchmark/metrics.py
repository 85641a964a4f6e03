"""Run metrics from the evaluated rows: best / final / last-k accuracy, communication cost to a target.

Semantics follow the papers (docs/methods/setup.md §14): best accuracy is the maximum over all evaluations of
the global model on the full clean test set; total communication cost counts client participations
(FedCorr appendix B); the cost to ζ is the cumulative cost at the first evaluation reaching ζ
(FedCorr appendix C.3), or None when never reached.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


#: the accuracy curves of a run's rows: test accuracy, and balanced accuracy (mean per-class recall)
CURVES = {"acc": "acc", "balanced_acc": "balanced_acc"}
#: how many of the last evaluations ``last{LAST_K}_<curve>`` averages
LAST_K = 10


def summary_metrics(curve: str = "acc", last_k: int = LAST_K) -> tuple[str, str, str]:
    """The summary keys of a curve: best, final, mean of the last ``last_k`` (``best_acc``, ``final_acc``,
    ``last10_acc``)."""
    return f"best_{curve}", f"final_{curve}", f"last{last_k}_{curve}"


def accuracy_summary(rows: list[dict], last_k: int = LAST_K) -> dict:
    """best / final / last-k mean of every curve (``summary_metrics``) for accuracy and balanced
    accuracy; None where a curve has no finite value."""
    out = {}
    for key, name in CURVES.items():
        vals = [r[key] for r in rows if r.get(key) is not None and math.isfinite(r[key])]
        best, final, last = summary_metrics(name, last_k)
        out[best] = max(vals) if vals else None
        out[final] = vals[-1] if vals else None
        out[last] = float(np.mean(vals[-last_k:])) if vals else None
    return out


def cost_to_target(rows: list[dict], targets: list[float], key: str = "acc") -> dict[str, int | None]:
    """{str(ζ): lowest cumulative communication cost whose evaluation reached ``key`` ≥ ζ}."""
    out: dict[str, int | None] = {}
    for zeta in targets:
        hit = next((r["comm_cost"] for r in rows if r.get(key) is not None and r[key] >= zeta), None)
        out[str(float(zeta))] = hit
    return out


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl (unparsable lines, e.g. a half-written last line, are skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            log.warning("skipping a bad line of %s", path)
    return rows
