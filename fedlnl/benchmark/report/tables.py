"""Accuracy and communication tables (long form, Markdown, LaTeX)."""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fedlnl.benchmark.report.cells import (MISSING, NOT_RUN, OTHER_FAMILY, canon, each_cell, complete_runs, fmt,
                                           pivot, sort_key, tuples, with_columns)
from fedlnl.benchmark.report import stats
from fedlnl.benchmark.report.reference import cell_identity, paper_value, reference_row

log = logging.getLogger(__name__)

def accuracy_table(
    frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = (), metric: str = "best_acc",
    reference: pd.DataFrame | None = None, test: stats.Test | None = None, paper_metric: str | None = None,
) -> pd.DataFrame:
    """Long form: one line per (row, column) cell with mean, std (ddof=0) in %, the 95% bootstrap
    CI of the mean (ci_low, ci_high), n complete runs that hold ``metric`` and n_incomplete
    (failed, diverged, partial or missing runs); with ``reference``, also the paper's mean and std
    of ``paper_metric`` (default: ``metric``; paper_mean, paper_std, paper_source) and diff = mean −
    paper_mean. With ``test``: the paired test of every row against its column's best (see
    :func:`stats.against_best`): is_best, p, p_holm, n_pairs, tested, tie (not significantly worse)."""
    runs, columns, keys = with_columns(frame, rows, by)
    lines = []
    for row, column, key_values, cell in each_cell(runs, rows, columns, keys):
        per_seed = seed_values(cell, metric)
        values = np.array(list(per_seed.values()), float)
        line = {rows: row, "column": column, **key_values, "metric": metric,
                "mean": values.mean() if len(values) else np.nan,
                "std": values.std(ddof=0) if len(values) else np.nan,
                **dict(zip(("ci_low", "ci_high"), stats.bootstrap_ci(values))),
                "n": len(values), "n_incomplete": int((~cell["status"].isin(["complete", NOT_RUN])).sum())}
        if reference is not None:
            line.update(paper_value(reference, cell_identity(runs, rows, row, column), paper_metric or metric))
            line["diff"] = line["mean"] - line["paper_mean"]
        lines.append(line)
    paper = ["paper_mean", "paper_std", "diff", "paper_source"] if reference is not None else []
    table = pd.DataFrame(lines, columns=[rows, "column", *keys, "metric", "mean", "std", "ci_low", "ci_high",
                                         "n", "n_incomplete", *paper])
    return with_tests(table, column_values(frame, rows, by, metric), rows, test) if test else table


def seed_values(cell: pd.DataFrame, metric: str) -> dict:
    """{seed: metric in %} of the complete runs of a cell that hold the metric (a summary written
    before the runner recorded it lacks it). Several complete runs of one seed: their mean."""
    done = complete_runs(cell)
    _warn_duplicate_seeds(done, cell)
    out: dict = {}
    seeds = done["seed"] if "seed" in done else pd.Series(range(len(done)), index=done.index)
    for seed, value in zip(seeds, done.get(metric, pd.Series([None] * len(done), index=done.index))):
        if canon(value) is not None:
            out.setdefault(canon(seed), []).append(100.0 * float(value))
    return {s: float(np.mean(v)) for s, v in out.items()}


def column_values(frame: pd.DataFrame, rows: str, by: Sequence[str], metric: str) -> dict:
    """{column: {row: {seed: metric in %}}} over the complete runs of the table."""
    runs, columns, keys = with_columns(frame, rows, by)
    out: dict = {c: {} for c in columns}
    for row, column, _, cell in each_cell(runs, rows, columns, keys):
        values = seed_values(cell, metric)
        if values:
            out[column][row] = values
    return out


def with_tests(table: pd.DataFrame, values: dict, rows: str, test: stats.Test) -> pd.DataFrame:
    """The columns of :func:`stats.against_best` joined to the long table (NaN/False where a cell
    has no value)."""
    found = {(row, column): res for column, col in values.items()
             for row, res in stats.against_best(col, test).items()}
    fields = ("best", "p", "p_holm", "n_pairs", "tested", "tie")
    default = {"best": False, "p": np.nan, "p_holm": np.nan, "n_pairs": 0, "tested": False, "tie": False}
    cols = {f: [found.get((r, c), default)[f] for r, c in tuples(table, rows, "column")] for f in fields}
    return table.assign(is_best=cols["best"], p=cols["p"], p_holm=cols["p_holm"], n_pairs=cols["n_pairs"],
                        tested=cols["tested"], tie=cols["tie"])


def _warn_duplicate_seeds(done: pd.DataFrame, cell: pd.DataFrame) -> None:
    if "seed" in done and done["seed"].duplicated().any():
        first = done.iloc[0]
        log.warning("%s: several complete runs share a seed; their mean is the seed's value",
                    first.get("path", "a cell"))


#: appended to a cell not significantly worse than its column's best (the best itself is bold)
TIE_MARK = "†"
#: appended to a clean cell that fails the clean-data control (``control``)
CLEAN_MARK = "‡"


def accuracy_cell(mean: float, std: float, n: int, n_incomplete: int, ci_low: float = np.nan,
                  ci_high: float = np.nan, paper_mean: float = np.nan, paper_std: float = np.nan,
                  mark: bool = False, degrades_clean: bool = False) -> str:
    extra = f", {n_incomplete} incomplete" if n_incomplete else ""
    if n == 0:
        text = MISSING + (f" ({n_incomplete} incomplete)" if n_incomplete else "")
    else:
        ci = f" [{ci_low:.2f}, {ci_high:.2f}]" if canon(ci_low) is not None else ""
        text = f"{mean:.2f} ± {std:.2f}{ci} (n={n}{extra})" + (f" {TIE_MARK}" if mark else "")
        text += f" {CLEAN_MARK}" if degrades_clean else ""
    if canon(paper_mean) is None:
        return text
    text += f"; paper {paper_mean:.2f}" + (f" ± {paper_std:.2f}" if canon(paper_std) is not None else "")
    return text + (f", Δ {mean - paper_mean:+.2f}" if n else "")


def accuracy_grid(table: pd.DataFrame, rows: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cell texts, bold mask) with rows x columns; bold = best printed mean of each column; a
    cell that is not bold but not significantly worse than the best (``tie``) gets the mark, a
    clean cell that fails the clean-data control (``degrades_clean``) its own."""
    shown = table["mean"].round(2)
    full = table["n"] == table["n"].groupby(table["column"], sort=False).transform("max")  # as stats.against_best
    best = shown.where(full).groupby(table["column"], sort=False).transform("max")
    bold = (shown == best) & full & (table["n"] > 0)
    tie = table["tie"].fillna(False).astype(bool) if "tie" in table else pd.Series(False, index=table.index)
    table = table.assign(bold=bold, mark=tie & ~bold)
    fields = ["mean", "std", "n", "n_incomplete", "ci_low", "ci_high"]
    fields += ["paper_mean", "paper_std"] if "paper_mean" in table else []
    fields += ["degrades_clean"] if "degrades_clean" in table else []
    texts = []
    for values, mark in zip(tuples(table, *fields), table["mark"]):
        named = dict(zip(fields, values))
        named["degrades_clean"] = bool(named.get("degrades_clean", False))
        texts.append(accuracy_cell(**named, mark=bool(mark)))
    table = table.assign(text=texts)
    return pivot(table, rows, "text"), pivot(table, rows, "bold")


def stats_caption(table: pd.DataFrame, test: stats.Test) -> str:
    """What the bold, the mark and the brackets mean, with the test, the n and α actually used."""
    ci = "[lo, hi] = 95% percentile-bootstrap CI of the mean over seeds (2000 resamples; none for n=1)"
    if "tested" not in table or table.empty:
        return ci + "."
    compared = table[~table["is_best"].astype(bool) & (table["n"] > 0)]
    tested = compared[compared["tested"].astype(bool)]
    bold = "Bold = best mean of the column (over its rows with the most seeds)"
    if tested.empty:
        return (f"{ci}. {bold}; no {TIE_MARK} marks: {stats.NOT_ENOUGH} ({test.label}; "
                f"every comparison with a column's best has fewer than {test.min_n} paired seeds).")
    lo, hi = int(tested["n_pairs"].min()), int(tested["n_pairs"].max())
    n = f"n = {lo}" if lo == hi else f"n = {lo}–{hi}"
    text = (f"{ci}. {bold}; {TIE_MARK} = not significantly worse than it: {test.label}, "
            f"{n} paired seeds (the seeds both completed), Holm-corrected over the column's comparisons, "
            f"α = {test.alpha:g}.")
    untested = sorted(set(compared.loc[~compared["tested"].astype(bool), "column"]), key=str)
    if untested:
        text += (f" Not tested ({stats.NOT_ENOUGH}: fewer than {test.min_n} paired seeds) in "
                 + ", ".join(untested) + ".")
    return text


# ---------------------------------------------------------------- communication


def comm_table(
    frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = (), ratio_to=None,
    reference: pd.DataFrame | None = None, cost_key: str = "cost_to_target",
) -> pd.DataFrame:
    """Long form: per cell the mean total cost (``quantity`` total) and the mean cost to each
    target (``quantity`` cost_to_target, ``target`` as in the summaries), over complete seeds;
    ``ratio`` to the ``ratio_to`` row of the same column when given. With ``reference``: the
    paper's cost to each target (``paper``: the number, "-" = never reached, "" = not in the
    reference), paper_mean, paper_ratio and diff = mean − paper_mean."""
    runs, columns, keys = with_columns(frame, rows, by)
    targets = _targets(complete_runs(runs))
    lines = []
    for row, column, key_values, cell in each_cell(runs, rows, columns, keys):
        done = complete_runs(cell)
        base = {rows: row, "column": column, **key_values, "curve": COST_CURVES[cost_key], "n": len(done)}
        total = _mean_reached(done.get("comm_cost", []))
        lines.append({**base, "quantity": "total", "target": "", **total})
        ident = cell_identity(runs, rows, row, column) if reference is not None else None
        for target in targets:
            reached = [c.get(target) if isinstance(c, dict) else None
                       for c in done.get(cost_key, [])]
            line = {**base, "quantity": "cost_to_target", "target": target,
                    **_mean_reached(pd.Series(reached, dtype=object))}
            if reference is not None and isinstance(_as_float(target), float):
                line.update(_paper_cost(reference, ident, _as_float(target)))
            lines.append(line)
    paper = ["paper", "paper_mean"] if reference is not None else []
    table = pd.DataFrame(lines, columns=[rows, "column", *keys, "curve", "quantity", "target", "mean",
                                         "n_reached", "n", *paper])
    table = _with_ratio(table, rows, ratio_to)
    if reference is not None:
        table["paper"] = table["paper"].astype(object).fillna("")
        table["diff"] = table["mean"].astype(float) - table["paper_mean"].astype(float)
        table["paper_ratio"] = _ratio(table, rows, ratio_to, "paper_mean")
    return table


def _paper_cost(reference: pd.DataFrame, ident: dict, target: float) -> dict:
    hit = reference_row(reference, ident, "cost_to_target", target)
    if hit is None:
        return {"paper": "", "paper_mean": np.nan}
    mean = hit["mean"]
    return {"paper": "-" if math.isnan(mean) else _fmt_cost(mean), "paper_mean": mean}


#: the summaries' cost dicts and the accuracy curve each is measured on
COST_CURVES = {"cost_to_target": "acc", "cost_to_target_balanced": "balanced_acc"}


def _targets(done: pd.DataFrame, cost_key: str = "cost_to_target") -> list[str]:
    found = {t for c in done.get(cost_key, []) if isinstance(c, dict) for t in c}
    return sorted(found, key=lambda t: sort_key(_as_float(t)))


def _as_float(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def _mean_reached(costs: pd.Series) -> dict:
    reached = [float(c) for c in costs if canon(c) is not None]
    return {"mean": float(np.mean(reached)) if reached else np.nan, "n_reached": len(reached)}


def _with_ratio(table: pd.DataFrame, rows: str, ratio_to) -> pd.DataFrame:
    table = table.assign(ratio=np.nan)
    if ratio_to is None:
        return table
    if not (table[rows] == ratio_to).any():
        log.warning("--ratio-to %s: no such %s; no ratios", ratio_to, rows)
        return table
    table["ratio"] = _ratio(table, rows, ratio_to, "mean")
    return table


def _ratio(table: pd.DataFrame, rows: str, ratio_to, value: str) -> np.ndarray:
    """``value`` divided by the ``ratio_to`` row's ``value`` of the same column and quantity."""
    if ratio_to is None or not (table[rows] == ratio_to).any():
        return np.full(len(table), np.nan)
    ref = table[table[rows] == ratio_to].set_index(["column", "quantity", "target"])[value]
    index = pd.MultiIndex.from_frame(table[["column", "quantity", "target"]])
    return table[value].to_numpy(float) / ref.reindex(index).to_numpy(float)


def _fmt_cost(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def comm_cell(mean: float, n_reached: int, n: int, ratio: float, is_reference: bool, paper: str = "",
              paper_ratio: float = np.nan) -> str:
    if n == 0:
        text = MISSING
    elif n_reached == 0:
        text = "-"
    else:
        text = _fmt_cost(mean)
        if not is_reference and not math.isnan(ratio):
            text += f" ({ratio:.1f})"
        text += f" [{n_reached}/{n}]" if n_reached < n else ""
    if not paper:
        return text
    text += f"; paper {paper}"
    if paper != "-" and not is_reference and not math.isnan(paper_ratio):
        text += f" ({paper_ratio:.1f})"
    if paper != "-" and n and n_reached:
        text += f", Δ {mean - float(paper):+.0f}"
    return text


def comm_sections(table: pd.DataFrame, rows: str, ratio_to=None) -> tuple[list[tuple[str, pd.DataFrame]], str]:
    """([(title, cell texts rows x columns)]: the total cost, then one per accuracy target; note)."""
    if "paper" not in table:
        table = table.assign(paper="", paper_ratio=np.nan)
    table = table.assign(text=[
        comm_cell(m, k, n, r, row == ratio_to, pp, pr)
        for m, k, n, r, row, pp, pr in tuples(table, "mean", "n_reached", "n", "ratio", rows, "paper",
                                                 "paper_ratio")
    ])
    ratio = f" (ratio to {ratio_to} in brackets)" if ratio_to is not None else ""
    curve = "balanced test accuracy" if (table.get("curve", pd.Series(dtype=object)) == "balanced_acc").any() \
        else "test accuracy"
    sections, unreached = [], []
    for (quantity, target), part in table.groupby(["quantity", "target"], sort=False):
        if quantity != "total" and _never_reached(part):  # a wall of "-": one line instead
            unreached.append(f"{_target_label(target)} {curve}")
            continue
        title = ("Total communication cost (client participations)" if quantity == "total"
                 else f"Communication cost to reach {_target_label(target)} {curve}")
        sections.append((title + ratio, pivot(part, rows, "text")))
    note = "'-' = never reached; [k/n] = mean over the k of n seeds that reached it.\n"
    if unreached:
        note += (f"No table of the cost to reach {' nor '.join(unreached)}: no run of any cell reached it "
                 "(and no published cost to compare with).\n")
    if (table["paper"] != "").any():
        note += "paper = the published cost (ratio to the same row); Δ = ours − paper.\n"
    return sections, note


def _never_reached(part: pd.DataFrame) -> bool:
    """True when no run of any cell reached the target and no paper cost is shown beside it."""
    return bool((part["n_reached"].fillna(0) == 0).all() and (part["paper"] == "").all())


def comm_markdown(table: pd.DataFrame, rows: str, ratio_to=None, families: dict | None = None) -> str:
    """Markdown: the total-cost table, then one table per accuracy target."""
    sections, note = comm_sections(table, rows, ratio_to)
    body = "\n".join(f"### {title}\n\n{to_markdown(text, families=families)}" for title, text in sections)
    return body + "\n" + note


def comm_latex(table: pd.DataFrame, rows: str, ratio_to=None, families: dict | None = None) -> str:
    """The same tables as booktabs tabulars, each headed by its title as a comment."""
    sections, note = comm_sections(table, rows, ratio_to)
    return ("\n".join(to_latex(text, comment=title, families=families) for title, text in sections)
            + "% " + note.replace("\n", " "))


def _target_label(target: str) -> str:
    value = _as_float(target)
    return f"{100 * value:g}%" if isinstance(value, float) else target


# ---------------------------------------------------------------- rendering


def family_headings(index, families: dict | None):
    """(heading, row) for every row of a grid in its order; heading = the row's family on the first
    row of each family (the grid is ordered by family), else None. No grouping without ``families``."""
    previous = object()
    for row in index:
        family = None if families is None else families.get(canon(row), OTHER_FAMILY)
        yield (family if family != previous else None), row
        previous = family


def with_family(table: pd.DataFrame, rows: str, families: dict | None) -> pd.DataFrame:
    """A long table with a ``family`` column after the row key (unchanged without ``families``)."""
    if families is None or rows not in table:
        return table
    table = table.drop(columns="family", errors="ignore")  # a copy
    table.insert(table.columns.get_loc(rows) + 1, "family",
                 [families.get(canon(r), OTHER_FAMILY) for r in table[rows]])
    return table


def to_markdown(text: pd.DataFrame, bold: pd.DataFrame | None = None, families: dict | None = None) -> str:
    """A Markdown table; with ``families`` ({row: family}), an italic heading row opens each family."""
    header = [str(text.index.name or ""), *map(str, text.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (heading, _), (row, values) in zip(family_headings(text.index, families), text.iterrows()):
        if heading is not None:
            lines.append("| " + " | ".join([f"*{heading}*", *[""] * len(values)]) + " |")
        marks = bold.loc[row] if bold is not None else [False] * len(values)
        cells = [f"**{v}**" if b else str(v) for v, b in zip(values, marks)]
        lines.append("| " + " | ".join([fmt(row), *cells]) + " |")
    return "\n".join(lines) + "\n"


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                 "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}"}


def latex_escape(text: str) -> str:
    escaped = "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(text))
    for symbol, tex in (("±", r"$\pm$"), ("Δ", r"$\Delta$"), ("†", r"$^\dagger$"), ("‡", r"$^\ddagger$")):
        escaped = escaped.replace(symbol, tex)
    return escaped


def to_latex(text: pd.DataFrame, bold: pd.DataFrame | None = None, comment: str = "",
             families: dict | None = None) -> str:
    """A booktabs tabular (needs ``\\usepackage{booktabs}``); bold cells in ``\\textbf``; with
    ``families``, an italic ``\\multicolumn`` heading (after a ``\\midrule``) opens each family."""
    header = [str(text.index.name or ""), *map(str, text.columns)]
    lines = [f"% {comment}" if comment else "% fedlnl-report", "% needs \\usepackage{booktabs}",
             "\\begin{tabular}{l" + "c" * len(text.columns) + "}", "\\toprule",
             " & ".join(map(latex_escape, header)) + r" \\", "\\midrule"]
    for (heading, _), (row, values) in zip(family_headings(text.index, families), text.iterrows()):
        if heading is not None:
            lines += ([] if lines[-1] == "\\midrule" else ["\\midrule"])
            lines.append(f"\\multicolumn{{{len(header)}}}{{l}}{{\\textit{{{latex_escape(heading)}}}}} \\\\")
        marks = bold.loc[row] if bold is not None else [False] * len(values)
        cells = [f"\\textbf{{{latex_escape(v)}}}" if b else latex_escape(v)
                 for v, b in zip(values, marks)]
        lines.append(" & ".join([latex_escape(fmt(row)), *cells]) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def incomplete_runs(frame: pd.DataFrame, rows: str) -> list[str]:
    """One line per run that is not complete: path, status and row value if known."""
    bad = frame[~frame["status"].isin(["complete", NOT_RUN])]
    return [f"- {r['path']}: {r['status']} ({rows}={fmt(r.get(rows))})" for _, r in bad.iterrows()]




# ---------------------------------------------------------------- checks on what a table pools


def missing_seeds(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()) -> list[str]:
    """One line per cell with fewer complete seeds than the table's seeds (every seed any run of
    the table used): its n and the seeds it lacks (never started, still running or failed).
    Cells without any complete run are left out: the table shows them as missing."""
    runs, columns, keys = with_columns(frame, rows, by)
    real = runs[runs["status"] != NOT_RUN]
    seeds = sorted({canon(s) for s in real.get("seed", [])} - {None}, key=sort_key)
    lines = []
    columns = [c for c in columns if (real["column"] == c).any()]
    for row, column, _, cell in each_cell(real, rows, columns, keys):
        have = {canon(s) for s in complete_runs(cell).get("seed", [])}
        lacking = [s for s in seeds if s not in have]
        if lacking and have and len(seeds) > 1:  # n = 0 shows as "missing" in the table
            lines.append(f"- {fmt(row)} / {column}: n={len(have)}, missing seeds "
                         + ", ".join(map(fmt, lacking)))
    return lines


def effective_diffs(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()) -> dict[str, list[tuple[str, str]]]:
    """{column: [(value name, "0.01 (median); 0.05 (fedavg)")]} for every column whose complete
    runs differ in a local-training value actually used (``effective.*`` of the summaries: lr,
    epochs, batch size, FedCorr+X's stage3, ...)."""
    runs, columns, _ = with_columns(frame, rows, by)
    done = complete_runs(runs)
    names = [k for k in done if k.startswith("effective.")]
    out = {}
    for column in columns:
        part = done[done["column"] == column]
        diffs = []
        for name in names:
            by_value: dict = {}
            for row, value in zip(part[rows], part[name]):
                if canon(value) is not None:
                    by_value.setdefault(fmt(value), set()).add(fmt(row))
            if len(by_value) > 1:
                shown = "; ".join(f"{v} ({', '.join(sorted(r))})" for v, r in sorted(by_value.items()))
                diffs.append((name.removeprefix("effective."), shown))
        if diffs:
            out[column] = diffs
    return out


def effective_warnings(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()) -> list[str]:
    """One line per column of :func:`effective_diffs`."""
    return [f"NOTE {column}: the rows used different local-training values (each method's own, from "
            "summary.json `effective`) — " + " | ".join(f"{n}: {v}" for n, v in diffs)
            for column, diffs in effective_diffs(frame, rows, by).items()]


# ---------------------------------------------------------------- detection and noise


DETECTION = (("detection.client_precision", "client P"), ("detection.client_recall", "client R"),
             ("detection.client_f1", "client F1"), ("detection.mu_mae", "μ̂ MAE"),
             ("detection.relabel_acc", "relabel acc"), ("detection.noise_after_correction", "noise after"))


#: (summary key, label, scale, digits) of the compute table: the process's CPU minutes and the wall
#: minutes of a run (a shared prefix's included: the method's cost), and its optimiser steps
COMPUTE = (("cpu_time_s", "CPU min", 1 / 60, 1), ("wall_time_s", "wall min", 1 / 60, 1),
           ("local_steps", "local steps", 1, 0))


def detection_table(frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = ()) -> pd.DataFrame:
    """Long form: per cell and detection score (noisy-client precision/recall/F1, μ̂ MAE, relabel
    accuracy, label noise after correction, from each summary's ``detection``), mean ± std (ddof=0)
    over the complete seeds that report it; rows without any score are left out."""
    return score_table(frame, rows, by, [(name, label, 1, 3) for name, label in DETECTION])


def compute_table(frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = ()) -> pd.DataFrame:
    """Long form: per cell, CPU minutes, wall minutes and local steps (``COMPUTE``), mean ± std
    (ddof=0) over the complete seeds that record them (runs before ``cpu_time_s`` existed: wall and
    steps only)."""
    return score_table(frame, rows, by, COMPUTE)


def score_table(frame: pd.DataFrame, rows: str, by: Sequence[str], scores) -> pd.DataFrame:
    """Long form: per cell and score ``(summary key, label, scale, digits)``, mean ± std (ddof=0) of
    the scaled values over the complete seeds that report it; cells without the score are left out."""
    runs, columns, keys = with_columns(frame, rows, by)
    lines = []
    for row, column, key_values, cell in each_cell(runs, rows, columns, keys):
        done = complete_runs(cell)
        for name, label, scale, digits in scores:
            values = np.array([float(v) * scale for v in done.get(name, []) if canon(v) is not None])
            if len(values):
                lines.append({rows: row, "column": column, **key_values, "score": label, "mean": values.mean(),
                              "std": values.std(ddof=0), "n": len(values), "digits": digits})
    return pd.DataFrame(lines, columns=[rows, "column", *keys, "score", "mean", "std", "n", "digits"])


def sweep_cpu_hours(frame: pd.DataFrame) -> tuple[float, int] | None:
    """(CPU hours, runs) of the finished runs (complete or diverged: both spent it) that record
    ``cpu_time_s``, a shared prefix counted once (a run started from one inherits its saver's CPU
    seconds, ``prefix.cpu_time_s``); None if none."""
    done = frame[frame["status"].isin(["complete", "diverged"])]
    if "cpu_time_s" not in done:
        return None
    cpu = [float(v) for v in done["cpu_time_s"] if canon(v) is not None]
    inherited = [float(v) for v in done.get("prefix.cpu_time_s", []) if canon(v) is not None]
    return ((sum(cpu) - sum(inherited)) / 3600, len(cpu)) if cpu else None


def score_grid(table: pd.DataFrame, rows: str) -> pd.DataFrame:
    """Cell texts of a ``score_table``, rows x "column: score"."""
    table = table.assign(label=[f"{c}: {s}" for c, s in tuples(table, "column", "score")],
                         text=[f"{m:,.{d}f} ± {s:,.{d}f} (n={n})"
                               for m, s, n, d in tuples(table, "mean", "std", "n", "digits")])
    grid = table.pivot(index=table.columns[0], columns="label", values="text")
    order = list(dict.fromkeys(table["label"]))
    return grid.reindex(index=list(dict.fromkeys(table[rows])), columns=order).fillna("")


def noise_table(frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = ()) -> pd.DataFrame:
    """Per column and seed, the noise the setting asked for vs the noise the federation has: mean
    requested client level μ_k and realised label-noise share overall, noisy clients and the
    largest per-client |realised − requested| (from diagnostics.json, one run per seed: every
    method of a column and seed shares the federation)."""
    runs, columns, _ = with_columns(frame, rows, by)
    done = complete_runs(runs)
    lines = []
    for column in columns:
        part = done[done["column"] == column]
        for seed in sorted({canon(s) for s in part.get("seed", [])}, key=sort_key):
            run = part[part["seed"].map(canon) == seed].iloc[0]
            clients = _clients(run.get("path"))
            if clients is None:
                continue
            mu = np.array([np.nan if v is None else v for v in clients["mu"]], float)
            real = np.array([np.nan if v is None else v for v in clients["true_rate"]], float)
            sizes = np.array(clients.get("size") or np.ones(len(mu)), float)
            known = np.isfinite(mu) & np.isfinite(real)
            lines.append({"column": column, "seed": seed,
                          "requested": float(np.sum(mu[known] * sizes[known]) / max(sizes[known].sum(), 1)),
                          "realised": float(np.sum(real[known] * sizes[known]) / max(sizes[known].sum(), 1)),
                          "noisy_clients": int(np.sum(clients.get("noisy_client") or [])),
                          "clients": len(mu),
                          "max_client_gap": float(np.max(np.abs(real[known] - mu[known]))) if known.any() else np.nan})
    return pd.DataFrame(lines, columns=["column", "seed", "requested", "realised", "noisy_clients", "clients",
                                        "max_client_gap"])


def _clients(run_dir) -> dict | None:
    if canon(run_dir) in (None, ""):
        return None
    path = Path(str(run_dir)) / "diagnostics.json"
    try:
        clients = json.loads(path.read_text()).get("clients")
    except (OSError, ValueError):
        return None
    return clients if clients and clients.get("mu") is not None and clients.get("true_rate") is not None else None


def noise_markdown(table: pd.DataFrame) -> str:
    head = ("| column | seed | requested noise (mean μ_k) | realised noise | noisy clients | "
            "max per-client gap |\n|---|---|---|---|---|---|\n")
    body = "".join(f"| {r.column} | {fmt(r.seed)} | {r.requested:.4f} | {r.realised:.4f} | "
                   f"{r.noisy_clients}/{r.clients} | {r.max_client_gap:.4f} |\n" for r in table.itertuples())
    return ("Requested vs realised label noise per column and seed (share of samples; clients weighted "
            "by size). The per-client view is runs/*/noise_realised.png. μ_k is the share of a client's "
            "samples the noise model picks; a pick changes the label with a kind's own probability "
            "(symmetric: 1 − 1/M, the redraw may hit the true class; asymmetric: only the mapped "
            "classes move), so realised noise and the gap are measured against μ_k, not an "
            "expected value.\n\n" + head + body)
