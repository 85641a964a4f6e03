"""Per-client accuracy (issue 33): what noise costs the clients themselves, not only the global
model. Each summary.json records, at its reported round (``reported_round``: the round selected on
noisy validation, or the best-test round without a validation set), ``client_acc_mean``,
``client_acc_worst10`` (the mean of the worst 10 % of clients), ``client_gap`` (mean accuracy of the
clean clients minus the noisy ones; the oracle's split, used only in reporting) and ``clients``
({acc, noise_rate, noisy}: one value per client)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fedlnl.benchmark.report.cells import canon, complete_runs, row_values, sort_key, with_columns
from fedlnl.benchmark.report.metric import SELECTED
from fedlnl.benchmark.report.tables import score_table

#: (summary key, label, scale, digits) of clients.{md,csv}: accuracies and the gap in %
CLIENT_SCORES = (("client_acc_mean", "client_acc_mean", 100, 2), ("client_acc_worst10", "client_acc_worst10", 100, 2),
                 ("client_gap", "client_gap", 100, 2))
#: the per-client lists of a summary's ``clients`` (flattened by the loader)
CLIENT_LISTS = ("clients.acc", "clients.noise_rate", "clients.noisy")


def has_client_scores(frame: pd.DataFrame) -> bool:
    """Whether a complete run records any per-client score."""
    done = complete_runs(frame)
    return any(key in done and done[key].map(canon).notna().any() for key, *_ in CLIENT_SCORES)


def clients_table(frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = ()) -> pd.DataFrame:
    """Long form: per cell and score (``CLIENT_SCORES``), mean ± std (ddof=0) over the complete
    seeds that record it; empty when no summary does."""
    if not has_client_scores(frame):
        return pd.DataFrame()
    return score_table(frame, rows, by, CLIENT_SCORES)


def reported_round(frame: pd.DataFrame) -> str:
    """Which round the per-client numbers are taken at, for the runs that record them."""
    done = complete_runs(frame)
    done = done[done["client_acc_mean"].map(canon).notna()] if "client_acc_mean" in done else done.iloc[:0]
    selected = int(done[SELECTED].map(canon).notna().sum()) if SELECTED in done else 0
    on_val = "the round of best noisy-validation accuracy (the selected round)"
    on_test = "the round of best test accuracy (no validation set)"
    if selected == len(done):
        return on_val
    if selected == 0:
        return on_test
    return f"{on_val} for the {selected} run(s) with a validation set, {on_test} for the other {len(done) - selected}"


def clients_caption(frame: pd.DataFrame) -> str:
    return ("Per-client test accuracy in %, mean ± std (ddof=0) over seeds: client_acc_mean = the mean over "
            "clients, client_acc_worst10 = the mean of the worst 10 % of clients, client_gap = the mean of the "
            "clean clients minus the mean of the noisy ones (points; the noisy/clean split is the oracle's, used "
            "only here; empty where a setting has no noisy client). A client's accuracy is on its local test set "
            "(the test set sampled to its training class proportions), at the run's reported_round: "
            f"{reported_round(frame)}.")


def client_points(frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = ()) -> list[tuple]:
    """[(row, {column: (noise rate, accuracy in %, noisy) per client})] in table order, from the
    lowest-seed complete run of every cell whose summary has ``clients``."""
    if not set(CLIENT_LISTS) <= set(frame.columns):
        return []
    runs, columns, _ = with_columns(frame, rows, by)
    runs = complete_runs(runs)
    runs = runs[runs["clients.acc"].map(lambda v: isinstance(v, (list, tuple)) and len(v) > 0)]
    runs = runs.assign(_seed=[sort_key(s) for s in runs.get("seed", [None] * len(runs))]).sort_values("_seed")
    out = []
    for row in row_values(runs, rows):
        panel = {}
        for column in columns:
            cell = runs[(runs[rows].map(canon) == row) & (runs["column"] == column)]
            if len(cell):
                run = cell.iloc[0]
                acc = np.array([np.nan if v is None else v for v in run["clients.acc"]], float)
                rate = np.array([np.nan if v is None else v for v in run["clients.noise_rate"]], float)
                noisy = np.array([bool(v) for v in run["clients.noisy"]], bool)
                if len(acc) == len(rate) == len(noisy):
                    panel[column] = (rate, 100.0 * acc, noisy)
        if panel:
            out.append((row, panel))
    return out
