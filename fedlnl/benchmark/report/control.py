"""The clean-data control: a label-noise method that cannot keep up with FedAvg *without* noise
measures our settings, not the method (issue 32).

For every row with a clean cell (ρ = τ = 0), "degrades clean data" when

(a) its clean accuracy (the table's main metric, mean over seeds) trails FedAvg's in the same
    column by more than the papers' own (0,0) gap + ``MARGIN`` points: ours − FedAvg < paper −
    paper FedAvg − MARGIN, the papers' gap from the reference numbers (their best test accuracy)
    when both have one at (0,0), else 0; no FedAvg in the column: (a) does not apply;
(b) its mean last-10 accuracy is more than ``MARGIN`` points below its mean best accuracy.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedlnl.benchmark.report.cells import canon, each_cell, fmt, with_columns
from fedlnl.benchmark.report.metric import BEST, LAST, Metric
from fedlnl.benchmark.report.reference import cell_identity, paper_value
from fedlnl.benchmark.report.tables import CLEAN_MARK, seed_values

#: points a method may trail FedAvg beyond the papers' own gap, and last-10 may fall below best
MARGIN = 3.0
#: the row every method is compared with
BASELINE = "fedavg"


@dataclass
class Check:
    """The control of one clean cell: the means (in %) it was decided on and the reasons it failed."""
    row: object
    column: str
    mean: float
    best: float = np.nan
    last: float = np.nan
    baseline: float = np.nan
    paper_gap: float = 0.0
    reasons: list[str] = field(default_factory=list)

    @property
    def gap(self) -> float:
        return self.mean - self.baseline


def clean_columns(runs: pd.DataFrame, columns: list[str]) -> list[str]:
    """The columns whose runs all have ρ = τ = 0."""
    def clean(part: pd.DataFrame) -> bool:
        values = [canon(v) for key in ("rho", "tau") for v in part.get(key, [None] * len(part))]
        return bool(values) and all(isinstance(v, (int, float)) and v == 0 for v in values)
    return [c for c in columns if clean(runs[runs["column"] == c])]


def _mean(cell: pd.DataFrame, key: str) -> float:
    values = list(seed_values(cell, key).values())
    return float(np.mean(values)) if values else np.nan


def _paper_gap(runs, rows, row, column, reference, metric: Metric) -> float:
    if reference is None:
        return 0.0
    ours = paper_value(reference, cell_identity(runs, rows, row, column), metric.paper)["paper_mean"]
    theirs = paper_value(reference, cell_identity(runs, rows, BASELINE, column), metric.paper)["paper_mean"]
    return 0.0 if canon(ours) is None or canon(theirs) is None else float(ours) - float(theirs)


def clean_control(frame: pd.DataFrame, rows: str, by: Sequence[str], metric: Metric,
                  reference: pd.DataFrame | None = None) -> list[Check]:
    """One :class:`Check` per row and clean column with a complete run, in table order."""
    runs, columns, keys = with_columns(frame, rows, by)
    clean = clean_columns(runs, columns)
    if not clean:
        return []
    checks = []
    for row, column, _, cell in each_cell(runs, rows, clean, keys):
        mean = _mean(cell, metric.main)
        if np.isnan(mean):
            continue
        check = Check(row, column, mean, _mean(cell, BEST), _mean(cell, LAST))
        base = runs[(runs[rows].map(canon) == BASELINE) & (runs["column"] == column)]
        check.baseline = _mean(base, metric.main)
        if not np.isnan(check.baseline) and canon(row) != BASELINE:
            check.paper_gap = _paper_gap(runs, rows, row, column, reference, metric)
            if check.gap < check.paper_gap - MARGIN:
                check.reasons.append(f"{metric.main} {check.mean:.2f} trails {BASELINE}'s {check.baseline:.2f} by "
                                     f"{-check.gap:.2f} points, more than the papers' gap ({check.paper_gap:+.2f}) "
                                     f"+ {MARGIN:g}")
        if check.last < check.best - MARGIN:
            check.reasons.append(f"{LAST} {check.last:.2f} is {check.best - check.last:.2f} points below "
                                 f"{BEST} {check.best:.2f} (more than {MARGIN:g})")
        checks.append(check)
    return checks


def failed(checks: list[Check]) -> set[tuple]:
    """{(row, column)} of the clean cells that fail the control (the table marks them)."""
    return {(canon(c.row), c.column) for c in checks if c.reasons}


def control_lines(checks: list[Check]) -> list[str]:
    """One line per failing clean cell: row / column: the reasons."""
    return [f"- {fmt(c.row)} / {c.column}: " + "; ".join(c.reasons) for c in checks if c.reasons]


def control_caption(checks: list[Check], metric: Metric) -> str:
    """The caption's sentence on the control (nothing without a clean cell)."""
    if not checks:
        return ""
    rule = (f"trails {BASELINE} by more than the papers' own (0,0) gap + {MARGIN:g} points in {metric.main}, or its "
            f"{LAST} is more than {MARGIN:g} points below its {BEST}")
    bad = sorted({fmt(c.row) for c in checks if c.reasons})
    if not bad:
        return f" Clean-data control (ρ = τ = 0): no method degrades clean data (none {rule})."
    return f" {CLEAN_MARK} = degrades clean data (ρ = τ = 0): {rule} (notes: {len(bad)} method(s))."
