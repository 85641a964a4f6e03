"""Cells reported at a round before the method's last training stage (issue 32).

A multi-stage method names its stage in every metrics row (``stage``: FedDiv's and FedRN's warm-up,
which trains as FedAvg, then their own training; centralised JointOpt's first step, then its
retraining; FedCorr's three stages). When the round a metric chooses (``selected_acc``: best noisy
validation; ``best_acc``: best test accuracy) lies in an earlier stage, the figure is that stage's
model, not what the method ends with, and the values read only in later stages never reached it
(nor a tuning objective built on it). The report names such cells in its notes; the loader records
the stages (``selection.stages_of``).
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from fedlnl.benchmark.report.cells import canon, complete_runs, each_cell, fmt, with_columns
from fedlnl.benchmark.report.metric import BEST, SELECTED, Metric

#: the round-choosing metrics and the record key of their round's stage
ROUND_STAGE = {SELECTED: "stage_selected", BEST: "stage_best"}
LAST_STAGE = "stage_last"


def early_lines(frame: pd.DataFrame, rows: str, by: Sequence[str], metric: Metric) -> list[str]:
    """One line per cell with a complete run whose ``metric.main`` round lies before its last stage."""
    key = ROUND_STAGE.get(metric.main)
    if key is None or key not in frame or LAST_STAGE not in frame:
        return []
    runs, columns, keys = with_columns(frame, rows, by)
    lines = []
    for row, column, _, cell in each_cell(runs, rows, columns, keys):
        done = complete_runs(cell)
        done = done[done[LAST_STAGE].map(lambda v: canon(v) is not None)]
        early = done[done[key] != done[LAST_STAGE]]
        if len(early):
            named = ", ".join(f"'{s}'" for s in dict.fromkeys(early[key].map(str)))
            last = ", ".join(f"'{s}'" for s in dict.fromkeys(early[LAST_STAGE].map(str)))
            lines.append(f"- {fmt(row)} / {column}: {len(early)} of {len(done)} run(s) at a round of its {named} "
                         f"stage, before its last ({last})")
    return lines
