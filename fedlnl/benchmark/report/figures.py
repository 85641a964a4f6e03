"""The report's figures: accuracy vs communication cost per column, per-run diagnostics."""
from __future__ import annotations

import functools
import json
import logging
import math
import multiprocessing
import os
import re
import signal
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from fedlnl.benchmark.report import plots
from fedlnl.benchmark.report.clients import client_points
from fedlnl.benchmark.report.cells import (OTHER_FAMILY, canon, complete_runs, fmt, row_values, sort_key,
                                           family_key, row_families, with_columns)
from fedlnl.benchmark.report.loading import read_metrics

log = logging.getLogger(__name__)

FIGURE_MODES = ("none", "summary", "all")
#: acc_vs_cost.png draws up to this many curves in one panel per column; more: one row of panels
#: per method family (when the runs record families), each with at most MAX_LINES curves
MAX_CURVES = 8
MAX_LINES = 7
#: drawn dashed in every panel of the grouped figure, as the common reference
BASELINE = "fedavg"

def curves(frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = (), curve: str = "acc") -> dict:
    """{column label: {row value: (comm cost grid, mean accuracy in % over seeds)}} from the
    metrics.jsonl of complete runs, columns and rows in table order; ``curve``: the metrics.jsonl
    column (``acc``, or ``balanced_acc``: mean per-class recall)."""
    runs, columns, _ = with_columns(frame, rows, by)
    runs = complete_runs(runs)
    out: dict = {}
    for column in columns:
        for row in row_values(runs, rows):
            cell = runs[(runs["column"] == column) & (runs[rows].map(canon) == row)]
            series = [s for s in (_run_curve(p, curve) for p in cell["path"]) if s is not None]
            if series:
                out.setdefault(column, {})[row] = mean_curve(series)
    return out


def _run_curve(run_dir: str, curve: str = "acc") -> tuple[np.ndarray, np.ndarray] | None:
    path = Path(run_dir) / "metrics.jsonl"
    metrics = read_metrics(path) if path.exists() else None
    if metrics is None or not {curve, "comm_cost"} <= set(metrics.columns):
        return None
    metrics = metrics.dropna(subset=[curve, "comm_cost"])
    if metrics.empty:
        return None
    last = metrics.groupby("comm_cost", sort=True)[curve].last()  # several evaluations per cost
    return last.index.to_numpy(float), 100.0 * last.to_numpy(float)


def mean_curve(series: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds on the union of their cost grids (linear interpolation), restricted to the
    cost range every seed covers."""
    low, high = max(x[0] for x, _ in series), min(x[-1] for x, _ in series)
    grid = np.unique(np.concatenate([x for x, _ in series]))
    grid = grid[(grid >= low) & (grid <= high)]
    return grid, np.mean([np.interp(grid, x, y) for x, y in series], axis=0)


def figure_runs(frame: pd.DataFrame, rows: str, by: Sequence[str], mode: str) -> list[tuple[Path, str, str]]:
    """(run dir, folder name, title) of the runs to draw: ``all`` complete runs, or for
    ``summary`` the lowest-seed complete run of every (row, column) cell."""
    if mode == "none":
        return []
    runs, columns, _ = with_columns(frame, rows, by)
    runs = complete_runs(runs)
    runs = runs.assign(_seed=[sort_key(s) for s in runs.get("seed", [None] * len(runs))])
    runs = runs.sort_values(["_seed", "path"], kind="stable")
    if mode == "summary":
        runs = runs.drop_duplicates(subset=[rows, "column"], keep="first")
    out = []
    for column in columns:
        for _, run in runs[runs["column"] == column].iterrows():
            seed = fmt(run.get("seed"))
            name = "_".join(_slug(part) for part in (fmt(run[rows]), column, f"seed{seed}"))
            out.append((Path(run["path"]), name, f"{fmt(run[rows])}, {column}, seed {seed}"))
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^\w.=+-]+", "_", text).strip("_")


def run_figures(run_dir: Path, out: Path, title: str, curve: str = "acc") -> list[Path]:
    """Every figure the files of one run allow (see the module docstring), into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    made = []
    metrics_path, diag_path = run_dir / "metrics.jsonl", run_dir / "diagnostics.json"
    metrics = read_metrics(metrics_path) if metrics_path.exists() else None
    diag = {}
    if diag_path.exists():
        try:
            diag = json.loads(diag_path.read_text())
        except ValueError as err:
            log.warning("skipping unreadable %s: %s", diag_path, err)
    draw_curve = functools.partial(_draw_curve, curve=curve, selected_round=_selected_round(run_dir))
    for name, draw in (("curve", draw_curve), ("lid_gmm", _draw_lid), ("lid_iterations", _draw_lid_iterations),
                       ("noise_estimation", _draw_noise), ("noise_realised", _draw_noise_realised),
                       ("partition", _draw_partition),
                       ("confusion", _draw_confusion)):
        try:
            path = draw(metrics, diag, out / f"{name}.png", title)
        except Exception as err:  # a malformed diagnostic loses its figure, never the report
            log.warning("%s: no %s.png (%s: %s)", run_dir, name, type(err).__name__, err)
            continue
        if path is not None:
            made.append(path)
    return made


def _selected_round(run_dir: Path):
    """The round the run's summary selected on noisy validation (None without one)."""
    try:
        return canon(json.loads((run_dir / "summary.json").read_text()).get("selected_round"))
    except (OSError, ValueError, AttributeError):
        return None


def _draw_curve(metrics, diag, path, title, curve: str = "acc", selected_round=None):
    if metrics is None or not {curve, "comm_cost"} <= set(metrics.columns):
        return None
    metrics = metrics.dropna(subset=[curve, "comm_cost"]).reset_index(drop=True)
    if metrics.empty:
        return None
    stages = metrics["stage"].tolist() if "stage" in metrics else None
    what = "balanced test accuracy" if curve == "balanced_acc" else "test accuracy"
    selected = None
    if selected_round is not None and curve == "acc" and "round" in metrics:
        hits = metrics.index[metrics["round"] == selected_round]
        selected = int(hits[-1]) if len(hits) else None
    return plots.plot_run_curve(metrics["comm_cost"].to_numpy(float), 100.0 * metrics[curve].to_numpy(float),
                                stages, path, f"{title}: {what} vs communication cost",
                                ylabel=f"{what} (%)", selected=selected)


def _draw_lid(metrics, diag, path, title):
    lid = (diag.get("records") or {}).get("lid")
    if isinstance(lid, list):  # a history of snapshots: the latest
        lid = lid[-1] if lid else None
    if not lid or lid.get("cumulative_lid") is None:
        return None
    clients = diag.get("clients") or {}
    values = [np.nan if v is None else v for v in lid["cumulative_lid"]]
    return plots.plot_lid_gmm(values, lid.get("gmm"), lid.get("noisy"), clients.get("noisy_client"),
                              _nan_list(clients.get("true_rate")), path,
                              f"{title}: cumulative LID scores", iteration=lid.get("iteration"))


def _draw_lid_iterations(metrics, diag, path, title):
    """Panels per iteration from the ``lid/iter<t>`` records (when there are at least two)."""
    records = diag.get("records") or {}
    found = sorted((int(m.group(1)), rec) for key, rec in records.items()
                   if (m := re.fullmatch(r"lid/iter(\d+)", key)) and isinstance(rec, dict))
    if len(found) < 2:
        return None
    clients = diag.get("clients") or {}
    return plots.plot_lid_iterations([rec for _, rec in found], clients.get("noisy_client"), path,
                                     f"{title}: cumulative LID scores per iteration")


def _draw_noise(metrics, diag, path, title):
    clients = diag.get("clients") or {}
    mu_hat = clients.get("mu_hat") or []
    if not any(v is not None for v in mu_hat):
        return None
    return plots.plot_noise_estimation(_nan_list(clients["true_rate"]), mu_hat, clients.get("flagged"), path,
                                       f"{title}: estimated vs true noise level")


def _draw_noise_realised(metrics, diag, path, title):
    clients = diag.get("clients") or {}
    if clients.get("mu") is None or clients.get("true_rate") is None:
        return None
    return plots.plot_noise_realised(_nan_list(clients["mu"]), _nan_list(clients["true_rate"]),
                                     clients.get("noisy_client"), path, f"{title}: requested vs realised noise")


def _draw_partition(metrics, diag, path, title):
    if not diag.get("class_counts"):
        return None
    return plots.plot_partition(diag["class_counts"], path, f"{title}: samples per class and client")


def _draw_confusion(metrics, diag, path, title):
    if not diag.get("confusion_before") or not diag.get("confusion_after"):
        return None
    return plots.plot_confusion(diag["confusion_before"], diag["confusion_after"], path,
                                f"{title}: clean vs observed labels")


def _nan_list(values) -> list[float] | None:
    return None if values is None else [np.nan if v is None else float(v) for v in values]


def split_references(lines: dict) -> tuple[dict, dict]:
    """(curves, references): rows named ``*_central`` or whose communication cost is always 0
    (centralized training) leave the curves and become {column: {row: final mean accuracy}}."""
    kept, refs = {}, {}
    for column, rows in lines.items():
        for row, (cost, acc) in rows.items():
            if str(row).endswith("_central") or not np.any(np.asarray(cost) != 0):
                refs.setdefault(column, {})[row] = float(np.asarray(acc)[-1])
            else:
                kept.setdefault(column, {})[row] = (cost, acc)
    return kept, refs


def line_groups(names: list, families: dict | None, baseline: str | None = BASELINE) -> list[tuple[str, list]] | None:
    """The rows of panels of acc_vs_cost.png: None (one panel per column) for at most MAX_CURVES
    curves or without families; else [(family, curve names)] in table order, ``baseline`` left out
    (it is drawn in every panel), a family of more than MAX_LINES curves cut into near-equal
    consecutive parts titled "family (1/2)", "family (2/2)"."""
    if families is None or len(names) <= MAX_CURVES:
        return None
    position = {row: i for i, row in enumerate(families)}  # the tables' order
    members: dict = {}
    for name in sorted(names, key=lambda n: position.get(n, len(position))):
        if name != baseline:
            members.setdefault(families.get(name, OTHER_FAMILY), []).append(name)
    groups = []
    for family, found in sorted(members.items(), key=lambda item: family_key(item[0])):
        size = math.ceil(len(found) / math.ceil(len(found) / MAX_LINES))
        parts = [found[i:i + size] for i in range(0, len(found), size)]
        groups += [(family if len(parts) == 1 else f"{family} ({k}/{len(parts)})", part)
                   for k, part in enumerate(parts, 1)]
    return groups


def write_figures(frame: pd.DataFrame, out: Path, rows: str, by: Sequence[str], mode: str,
                   curve: str = "acc") -> None:
    lines = curves(frame, rows, by, curve)
    if lines:
        kept, refs = split_references(lines)
        what = "balanced test accuracy" if curve == "balanced_acc" else "test accuracy"
        names = list(dict.fromkeys(n for part in kept.values() for n in part))
        groups = line_groups(names, row_families(frame, rows))
        plots.plot_acc_vs_cost(kept, out / "acc_vs_cost.png", refs, ylabel=f"{what} (%)", groups=groups,
                               baseline=BASELINE if groups else None)
    else:
        log.warning("no %s in the metrics.jsonl of a complete run: no acc_vs_cost.png", curve)
    points = client_points(frame, rows, by)
    if points:
        plots.plot_clients(points, out / "clients.png", "Test accuracy per client vs its realised noise rate "
                           "(lowest complete seed of each cell, at its reported round)", row_families(frame, rows))
    jobs = [(run_dir, out / "runs" / name, title, curve) for run_dir, name, title in figure_runs(frame, rows, by, mode)]
    draw_runs(jobs)


#: runs per process below which the run figures are drawn in this process: a drawing process costs
#: ~2 s of imports, one run's figures ~0.5-1 s (matplotlib's constrained layout and PNG encoding)
RUNS_PER_PROCESS = 8


def processes(num_runs: int) -> int:
    """How many processes draw ``num_runs`` runs' figures: one per CPU this process may use, at
    most one per ``RUNS_PER_PROCESS`` runs (1: in this process)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, num_runs // RUNS_PER_PROCESS))


def draw_runs(jobs: list[tuple[Path, Path, str, str]]) -> None:
    """``run_figures`` for every (run dir, out, title, curve): the report's largest part (a few
    figures per run, each drawn and encoded by itself), spread over the CPUs. Each figure is the
    same file whichever process draws it; the drawing processes' warnings are logged here."""
    workers = processes(len(jobs))
    if workers == 1:
        for job in jobs:
            run_figures(*job)
        return
    # spawn: a fresh interpreter (never a fork of this process and its threads); the workers ignore
    # Ctrl-C, which stops this process: the runs not started are cancelled, the running ones finish
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN))
    try:
        for warnings in pool.map(_run_figures_quietly, jobs):
            for level, message in warnings:
                log.log(level, "%s", message)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_figures_quietly(job: tuple[Path, Path, str, str]) -> list[tuple[int, str]]:
    """``run_figures`` in a drawing process; returns its log records (level, message) for the report's log."""
    records: list[tuple[int, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append((record.levelno, record.getMessage()))

    keep = Keep(logging.WARNING)
    log.addHandler(keep)
    log.propagate = False
    try:
        run_figures(*job)
    finally:
        log.removeHandler(keep)
        log.propagate = True
    return records

