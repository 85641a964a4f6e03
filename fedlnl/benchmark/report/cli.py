"""``fedlnl-report DIR``: argument parsing and writing every output (see the package docstring)."""
from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fedlnl.benchmark.report import html, plots, stats, wandb_log
from fedlnl.benchmark.report.cells import (OTHER_FAMILY, canon, fmt, resolve_key, row_families,
                                           with_columns)
from fedlnl.benchmark.report.clients import clients_caption, clients_table, has_client_scores
from fedlnl.benchmark.report.commands import run_commands
from fedlnl.benchmark.report.control import (BASELINE, MARGIN, clean_control, control_caption, control_lines,
                                             failed)
from fedlnl.benchmark.report.figures import FIGURE_MODES, write_figures
from fedlnl.benchmark.report.loading import ReportInputError, load_summaries
from fedlnl.benchmark.report.metric import (ALIASES, AUTO, METRICS, SELECTED, Metric, default_metric, describe,
                                            resolve_metric)
from fedlnl.benchmark.report.reference import (add_missing_cells, drop_empty_columns, load_reference, matches,
                                               missing_cells, missing_summary, reference_note, reference_paths,
                                               run_identity)
from fedlnl.benchmark.report.tables import (CLEAN_MARK, accuracy_grid, accuracy_table, column_values, comm_latex,
                                            comm_markdown, comm_sections, comm_table, compute_table,
                                            detection_table, effective_diffs, effective_warnings, incomplete_runs,
                                            missing_seeds, noise_markdown, noise_table, score_grid, stats_caption,
                                            sweep_cpu_hours, to_latex, to_markdown, with_family)
from fedlnl.benchmark.report.stages import early_lines
from fedlnl.benchmark.report.tuning import tuned_section

log = logging.getLogger(__name__)

#: values ``fidelity=reference`` takes from the official code where the papers publish no setting
CODE_DEFAULTS = (
    "FedDiv ζ = 0 (relabel confidence), ξ = 0.2 and m = 0.5: the code's argparse defaults; the authors' "
    "run arguments are unpublished (the paper: ζ = 0.75, ξ = 0.5, m = 0.2)",
    "FedProx μ·‖w − w_g‖ with μ = 1 and the first batch of each epoch skipped: inferred from FedCorr's "
    "options help string (docs/methods/fedcorr.md Q24), not a published FedProx setting",
    "RoFL weight decay 1e-4: the unofficial code's default (unknown whether FedCorr kept it)",
)


#: the caption's sentence on rows grouped by family (the statistics never look at the groups)
GROUPED = (" Rows are grouped by method family (summary.json `family`, in fedlnl's FAMILIES order; by name "
           "within a family); bold, the tests and the ranks compare all rows, never only a family's.")


@dataclass
class Note:
    """One kind of note: a line with its count and the cells it touches, and the full list."""
    kind: str
    line: str
    full: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything written, for the Markdown/LaTeX/CSV files, the HTML page and W&B."""
    title: str
    metric: Metric
    caption: str = ""
    grid: tuple | None = None
    tables: list = field(default_factory=list)
    statistics: dict = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    comm: list = field(default_factory=list)
    comm_note: str = ""
    detection: pd.DataFrame | None = None
    compute: pd.DataFrame | None = None
    compute_note: str = ""
    noise: pd.DataFrame | None = None
    clients: pd.DataFrame | None = None
    clients_note: str = ""
    commands: dict = field(default_factory=dict)
    families: dict | None = None  # {row: method family} when the rows are grouped by family


def write_report(frame: pd.DataFrame, out: Path, rows: str = "method", by: Sequence[str] = (),
                 metric: str | Metric = AUTO, ratio_to=None, reference: pd.DataFrame | None = None,
                 figures: str = "summary", beside: str | None = "auto", *, alpha: float = 0.05,
                 test: str = "ttest", full_grid: bool = False, source: Path | None = None,
                 wandb: str = "auto") -> str:
    """Write every table, statistic and plot into ``out`` (and report.html); return the text
    printed: the main Markdown table, its caption, the statistics in brief and one line per note.
    ``metric`` "auto": :func:`metric.default_metric`. ``out`` holds an ``INCOMPLETE`` marker from
    the first file written to the last, so an interrupted report is recognisable."""
    open_output(out)
    metric = metric if isinstance(metric, Metric) else (
        default_metric(frame, beside) if metric == AUTO else resolve_metric(metric, beside))
    test_ = stats.Test(test, alpha)
    full = add_missing_cells(frame, reference)
    frame = full if full_grid else drop_empty_columns(full, rows, by)
    rep = Report(title=f"fedlnl report: {source.name if source else out.parent.name}", metric=metric,
                 commands=run_commands(frame) if source is not None else {}, families=row_families(frame, rows))
    checks = clean_control(frame, rows, by, metric, reference)
    tables = [accuracy_table(frame, rows, by, m, reference if m == metric.main else None, test_, metric.paper)
              for m in metric.shown]
    tables[0] = mark_failed(tables[0], rows, failed(checks))
    rep.tables = [with_family(t, rows, rep.families) for t in tables]
    rep.grid = side_by_side([accuracy_grid(t, rows) for t in tables], metric.shown)
    rep.caption = (f"{metric.caption()}; mean ± std (population, ddof=0) over seeds, n = complete runs. "
                   f"{stats_caption(tables[0], test_)}" + control_caption(checks, metric)
                   + (GROUPED if rep.families else ""))
    if reference is not None:
        rep.caption += " " + reference_note(reference) + paper_protocol(metric)
    rep.statistics = table_statistics(frame, tables[0], rows, by, metric.main, test_, reference is not None)
    rep.missing = missing_summary(full, rows, by) if not full_grid else []
    rep.notes = notes(full, frame, rows, by, metric, full_grid, rep.families, control_lines(checks),
                      early_lines(frame, rows, by, metric))
    _write_tables(rep, frame, out, rows, by, ratio_to, reference)
    _write_statistics(rep, out, rows, draw=figures != "none")
    if figures != "none":
        write_figures(frame, out, rows, by, figures, metric.curve)
    text = main_text(rep) + tuned_section(frame, rows)
    (out / "accuracy.md").write_text(text + "\nThe full notes: notes.md; statistics: stats.md.\n")
    (out / "notes.md").write_text(notes_markdown(rep))
    html.write_html(rep, out)
    wandb_log.maybe_log(rep, frame, out, wandb, source)
    (out / INCOMPLETE).unlink(missing_ok=True)
    return text


#: the file that marks a report folder being written (or left by an interrupted report)
INCOMPLETE = "INCOMPLETE"
#: the report's own top-level files: an earlier report's are removed first, so none survives into a
#: report that no longer writes it (report.html embeds every PNG of the folder)
OUTPUTS = ("report.html", "accuracy.md", "accuracy.csv", "accuracy.tex", "stats.md", "stats.json", "ranks.csv",
           "wtl.csv", "agreement.csv", "notes.md", "comm.md", "comm.csv", "comm.tex", "detection.md", "detection.csv",
           "detection.tex", "compute.md", "compute.csv", "noise.md", "noise.csv", "clients.md", "clients.csv",
           "clients.png", "acc_vs_cost.png", "cd_diagram.png")


class ReportOutputError(OSError):
    """An output directory the report cannot write: printed as one line, exit code 2."""


def open_output(out: Path) -> None:
    """Create ``out``, put the ``INCOMPLETE`` marker in it and remove an earlier report's files
    (``OUTPUTS``), or say in one line why it cannot."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / INCOMPLETE).write_text(
            "fedlnl-report is writing this folder, or was interrupted (or failed) while writing it: its files may "
            "be partial. A finished report removes this file.\n")
        for name in OUTPUTS:
            if (out / name).is_file():
                (out / name).unlink()
    except OSError as err:
        raise ReportOutputError(f"--out {out}: cannot write the report there: {_why(out, err)}") from None


def _why(out: Path, err: OSError) -> str:
    """The reason of an output error in words: which path is a file, or the system's message."""
    for path in (out, *out.parents):
        if path.exists() and not path.is_dir():
            return f"{path} is a file, not a directory"
    return f"{err.strerror or err}" + (f" ({err.filename})" if err.filename else "")


def mark_failed(table: pd.DataFrame, rows: str, cells: set) -> pd.DataFrame:
    """The main accuracy table with ``degrades_clean``: whether the cell fails the clean-data control."""
    return table.assign(degrades_clean=[(canon(r), c) in cells for r, c in zip(table[rows], table["column"])])


def paper_protocol(metric: Metric) -> str:
    """What the paper values are when the main metric is not the papers' own."""
    if metric.paper == metric.main:
        return ""
    return (f" The paper values are the papers' {metric.paper} ({describe(metric.paper)}), beside our "
            f"{metric.main}: the orderings compare, the protocols differ.")


def main_text(rep: Report) -> str:
    text, bold = rep.grid
    body = f"{rep.caption}\n\n{to_markdown(text, bold, rep.families)}"
    brief = stats_brief(rep.statistics)
    if brief:
        body += "\n" + "\n".join(brief) + "\n"
    if rep.missing:
        body += "\nCells of the reference grid without any run (all listed in notes.md; --full-grid shows them):\n"
        body += "\n".join(rep.missing) + "\n"
    shown = [n for n in rep.notes if not (n.kind == "not run" and rep.missing)]
    if shown:
        body += "\nNotes (one line per kind; the full lists are in notes.md):\n"
        body += "\n".join(f"- {n.line}" for n in shown) + "\n"
    return body


def side_by_side(grids: list[tuple[pd.DataFrame, pd.DataFrame]], metrics: list[str]):
    """One grid with, for every column, a sub-column per metric ("(0,0)", "(0,0) last10_acc")."""
    if len(grids) == 1:
        return grids[0]
    texts, bolds = [], []
    for (text, bold), m in zip(grids, metrics):
        suffix = "" if m == metrics[0] else f" {m}"
        texts.append(text.rename(columns=lambda c: f"{c}{suffix}"))
        bolds.append(bold.rename(columns=lambda c: f"{c}{suffix}"))
    order = [c for pair in zip(*(t.columns for t in texts)) for c in pair]
    return pd.concat(texts, axis=1)[order], pd.concat(bolds, axis=1)[order].fillna(False).astype(bool)


# ---------------------------------------------------------------- statistics


def table_statistics(frame: pd.DataFrame, table: pd.DataFrame, rows: str, by: Sequence[str], metric: str,
                     test: stats.Test, with_paper: bool) -> dict:
    """Mean ranks + Friedman + Nemenyi CD over the table's columns, the win/tie/loss matrix and,
    for paper presets, the agreement of the orderings (Kendall τ)."""
    values = column_values(frame, rows, by, metric)
    means = table.pivot_table(index=rows, columns="column", values="mean", aggfunc="first", sort=False)
    means = means.reindex(index=list(dict.fromkeys(table[rows])), columns=list(dict.fromkeys(table["column"])))
    means = means.loc[means.notna().any(axis=1), means.notna().any(axis=0)]
    wtl_text, wtl_long = stats.win_tie_loss(values, test)
    shown, line = stats.tested_matrix(wtl_text, wtl_long, values, test)
    out = {"metric": metric, "metric_description": describe(metric), "test": test.name, "test_label": test.label,
           "min_n": test.min_n, "alpha": test.alpha,
           "friedman": stats.friedman(means, test.alpha), "wtl": wtl_long.to_dict("records"),
           "wtl_text": shown, "wtl_line": line, "against_best": _against_best_records(table, rows)}
    if with_paper and "paper_mean" in table:
        out["agreement"] = stats.agreement(table, rows)
    return out


def _against_best_records(table: pd.DataFrame, rows: str) -> list[dict]:
    keep = [rows, "column", "mean", "n", "is_best", "p", "p_holm", "n_pairs", "tested", "tie"]
    part = table[table["n"] > 0][[k for k in keep if k in table]]
    return [{k: _json_value(v) for k, v in r.items()} for r in part.to_dict("records")]


def _json_value(value):
    value = canon(value)
    return None if isinstance(value, float) and math.isnan(value) else value


def stats_brief(st: dict) -> list[str]:
    """The statistics in a few lines under the table."""
    lines = []
    fr = st.get("friedman") or {}
    if fr.get("mean_rank"):
        ranks = ", ".join(f"{fmt(r)} {v:.2f}" for r, v in fr["mean_rank"].items())
        lines.append(f"Mean rank of {st['metric']} over {fr['n']} cell(s) (1 = best): {ranks}.")
    lines.append("Friedman test: " + stats.friedman_text(fr))
    ag = st.get("agreement")
    if ag is not None:
        lines.append("Agreement with the paper's ordering: " + stats.agreement_text(ag))
    return lines


def _write_statistics(rep: Report, out: Path, rows: str, draw: bool = True) -> None:
    st = rep.statistics
    fr = st["friedman"]
    if fr.get("mean_rank"):
        with_family(pd.DataFrame({rows: list(fr["mean_rank"]), "mean_rank": list(fr["mean_rank"].values()),
                                  "metric": st["metric"]}), rows, rep.families).to_csv(out / "ranks.csv", index=False)
        title = f"Mean rank of {st['metric']} over {fr['n']} cell(s)"
        title += f"; Friedman p = {fr['p']:.3g}, Nemenyi CD = {fr['cd']:.2f}" if fr.get("status") == "ok" else ""
        if draw:
            plots.plot_cd_diagram(fr["mean_rank"], fr.get("cd"), out / "cd_diagram.png", title, rep.families)
    pd.DataFrame(st["wtl"], columns=["row", "against", "win", "tie", "loss", "untested"]).assign(
        metric=st["metric"]).to_csv(out / "wtl.csv", index=False)
    if "agreement" in st:
        cells = pd.DataFrame(st["agreement"]["cells"],
                             columns=["column", "n_methods", "tau", "p", "concordant", "discordant", "pairs", "ours",
                                      "paper"])
        pooled = {"column": "pooled", **{k: st["agreement"]["pooled"].get(k) for k in
                                         ("tau", "concordant", "discordant", "pairs")}}
        both = pd.concat([cells, pd.DataFrame([pooled])], ignore_index=True)
        both.assign(metric=st["metric"], paper_metric=rep.metric.paper).to_csv(out / "agreement.csv", index=False)
    machine = {k: v for k, v in st.items() if k != "wtl_text"}
    (out / "stats.json").write_text(json.dumps(_finite(machine), indent=1, default=_json_default, allow_nan=False))
    (out / "stats.md").write_text(stats_markdown(rep, rows))


def _finite(value):
    """NaN -> None all through (JSON has no NaN), numpy scalars -> Python."""
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return _json_value(value)


def _json_default(value):
    value = canon(value)
    return None if value is None else str(value)


def stats_markdown(rep: Report, rows: str) -> str:
    st = rep.statistics
    parts = [f"# Statistics of {st['metric']}\n",
             f"Metric: {describe(st['metric'])}, in %.\n",
             f"Per cell: {st['test_label']}, each method against the cell's best, Holm-corrected, "
             f"α = {st['alpha']:g} (accuracy.csv: p, p_holm, n_pairs, tie).\n"]
    parts += [f"- {line}" for line in stats_brief(st)]
    parts.append(f"\n## Win / tie / loss over cells (row vs column; tie = not significant at α = {st['alpha']:g}, "
                 "uncorrected, per cell)\n")
    if st["wtl_text"] is not None:
        parts.append(to_markdown(st["wtl_text"].rename_axis(rows), families=rep.families))
    if st["wtl_line"]:
        parts.append(st["wtl_line"] + "\n")
    if "agreement" in st and st["agreement"]["cells"]:
        parts.append("\n## Agreement with the paper's ordering (Kendall τ_b)\n")
        frame = pd.DataFrame(st["agreement"]["cells"]).set_index("column")
        frame = frame.assign(tau=frame["tau"].map("{:.2f}".format), p=frame["p"].map("{:.3g}".format))
        parts.append(to_markdown(frame[["n_methods", "tau", "p", "ours", "paper"]].astype(str)))
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- notes


def notes(full: pd.DataFrame, frame: pd.DataFrame, rows: str, by: Sequence[str], metric: Metric,
          full_grid: bool, families: dict | None = None, degraded: Sequence[str] = (),
          early: Sequence[str] = ()) -> list[Note]:
    """One :class:`Note` per kind: how the default metric was chosen, clean cells that fail the
    clean-data control (``degraded``), cells reported at a round before the method's last stage
    (``early``), incomplete runs, cells with missing seeds, config keys that
    had to split cells, different local-training values, runs without the metric, rows without a
    method family, reference-only code defaults, reference cells without runs (with --full-grid;
    else the per-method summary), the per-client table's absence."""
    _, _, keys = with_columns(frame, rows, by)
    found = []
    if metric.why:
        found.append(Note("metric", metric.why, [metric.why]))
    if degraded:
        methods = list(dict.fromkeys(line.removeprefix("- ").split(" / ")[0] for line in degraded))
        found.append(Note("clean control", f"{len(methods)} method(s) degrade clean data ({CLEAN_MARK}: at ρ = τ = 0 "
                                           f"they trail {BASELINE} by more than the papers' gap + {MARGIN:g} "
                                           f"points, or their last-10 falls more than {MARGIN:g} points below their "
                                           f"best): {_some(list(degraded))}", list(degraded)))
    if early:
        rule = ("; runs made with selection.stage=any, the rule before selection.stage=last" if metric.main == SELECTED
                else "")
        found.append(Note("stage", f"{len(early)} cell(s) report {metric.main} at a round before the method's last "
                                   f"training stage (the figure is that earlier stage's model, e.g. a warm-up that "
                                   f"trains as FedAvg{rule}): {_some(list(early))}", list(early)))
    incomplete = incomplete_runs(frame, rows)
    if incomplete:
        found.append(Note("incomplete", f"{len(incomplete)} incomplete run(s), not averaged (failed, diverged, "
                                        f"partial or still running): {_some(incomplete)}", incomplete))
    seeds = missing_seeds(frame, rows, by)
    if seeds:
        found.append(Note("seeds", f"{len(seeds)} cell(s) with fewer complete seeds than the table: {_some(seeds)}",
                          seeds))
    split = [k.removeprefix("config.") for k in keys if k.startswith("config.") and k not in by]
    if split:
        line = (f"WARNING: runs of one cell differ in {', '.join(split)} besides the seed; these keys "
                "were added to the columns so such runs are never averaged as seeds")
        log.warning("%s", line.removeprefix("WARNING: "))  # the log format adds the level itself
        found.append(Note("split", line, [line]))
    diffs = effective_diffs(frame, rows, by)
    if diffs:
        names = sorted({n for d in diffs.values() for n, _ in d})
        found.append(Note("effective", f"{len(diffs)} column(s) whose rows used different local-training values "
                                       f"({', '.join(names)}; each method's own, from summary.json `effective`): "
                                       f"{_some(list(diffs))}", effective_warnings(frame, rows, by)))
    lacking = lacking_metric(frame, metric)
    if lacking:
        log.warning("%s", lacking.line)
        found.append(lacking)
    unknown = sorted((fmt(r) for r, f in (families or {}).items() if f == OTHER_FAMILY), key=str)
    if unknown:
        found.append(Note("family", f"{len(unknown)} row(s) grouped under '{OTHER_FAMILY}': none of their runs "
                                    "records a method family (summary.json written before the runner recorded "
                                    f"it, or no summary): {_some(unknown)}", unknown))
    if "setting.fidelity" in frame and (frame["setting.fidelity"] == "reference").any():
        found.append(Note("code defaults", f"fidelity=reference: {len(CODE_DEFAULTS)} values are code defaults, "
                                           "not published settings (FedDiv ζ/ξ/m, FedProx μ reading, RoFL weight decay)",
                          list(CODE_DEFAULTS)))
    missing = missing_cells(full, rows, by)
    if missing:
        found.append(Note("not run", f"{len(missing)} cell(s) of the reference grid without any run"
                                     + ("" if full_grid else " (summarised per method above)"), missing))
    if not (frame["status"] == "complete").any() or has_client_scores(frame):
        return found
    line = ("no per-client table (clients.md) nor clients.png: no summary.json records client_acc_mean, "
            "client_acc_worst10 or client_gap (written before the runner recorded per-client accuracy)")
    return found + [Note("no clients", line, [line])]


def lacking_metric(frame: pd.DataFrame, metric: Metric) -> Note | None:
    """Complete runs whose summary has none of the shown metrics (written before the runner
    recorded balanced accuracy), or lacks the main one (selected_acc: null without a validation
    set): one line, never a crash."""
    done = frame[frame["status"] == "complete"] if "status" in frame else frame.iloc[:0]
    present = [k for k in metric.shown if k in done]
    held = done[present].apply(lambda c: c.map(canon)).notna() if present else pd.DataFrame(index=done.index)
    without = done[~held.any(axis=1)] if present else done
    if not without.empty:
        line = (f"{len(without)} of {len(done)} complete run(s) have no {', '.join(metric.shown)} in summary.json "
                "(written before the runner recorded it): left out of these tables")
        return Note("no metric", line, [f"- {p}" for p in without.get("path", [])])
    lacking = done[~held[metric.main]] if metric.main in held else done
    if lacking.empty:
        return None
    why = ("null: no validation set, selection.val_share = 0, or a summary written before the runner recorded it"
           if metric.main == SELECTED else "written before the runner recorded it")
    line = (f"{len(lacking)} of {len(done)} complete run(s) have no {metric.main} ({why}): missing in its columns"
            + (f", shown in the {metric.beside} columns" if metric.beside else ""))
    return Note("no metric", line, [f"- {p}" for p in lacking.get("path", [])])


def _some(items: list, k: int = 3) -> str:
    shown = [str(i).removeprefix("- ") for i in items[:k]]
    return "; ".join(shown) + (f"; … ({len(items) - k} more)" if len(items) > k else "")


def notes_markdown(rep: Report) -> str:
    parts = [f"# Notes on the tables of {rep.title.removeprefix('fedlnl report: ')}\n"]
    for note in rep.notes:
        parts.append(f"## {note.line}\n")
        parts.append("\n".join(line if line.startswith("- ") else f"- {line}" for line in note.full) + "\n")
    if len(parts) == 1:
        parts.append("No notes: every cell is complete, with the same seeds and the same local-training values.\n")
    return "\n".join(parts)


# ---------------------------------------------------------------- the other tables


def _write_tables(rep: Report, frame: pd.DataFrame, out: Path, rows: str, by: Sequence[str], ratio_to,
                  reference) -> None:
    text, bold = rep.grid
    pd.concat(rep.tables, ignore_index=True).to_csv(out / "accuracy.csv", index=False)
    (out / "accuracy.tex").write_text(to_latex(text, bold, rep.caption, rep.families))
    comm = comm_table(frame, rows, by, ratio_to, reference, rep.metric.cost_key)
    with_family(comm, rows, rep.families).to_csv(out / "comm.csv", index=False)
    (out / "comm.md").write_text(comm_markdown(comm, rows, ratio_to, rep.families))
    (out / "comm.tex").write_text(comm_latex(comm, rows, ratio_to, rep.families))
    rep.comm, rep.comm_note = comm_sections(comm, rows, ratio_to)
    table = detection_table(frame, rows, by)
    if not table.empty:
        with_family(table.drop(columns="digits"), rows, rep.families).to_csv(out / "detection.csv", index=False)
        rep.detection = score_grid(table, rows)
        about = "Noise detection: mean ± std (ddof=0) over seeds of each run's final scores"
        (out / "detection.md").write_text(f"{about}.\n\n{to_markdown(rep.detection, families=rep.families)}")
        (out / "detection.tex").write_text(to_latex(rep.detection, comment=about, families=rep.families))
    table = compute_table(frame, rows, by)
    if not table.empty:
        with_family(table.drop(columns="digits"), rows, rep.families).to_csv(out / "compute.csv", index=False)
        rep.compute = score_grid(table, rows)
        rep.compute_note = compute_note(sweep_cpu_hours(frame))
        (out / "compute.md").write_text(f"{rep.compute_note}\n\n{to_markdown(rep.compute, families=rep.families)}")
    table = clients_table(frame, rows, by)
    if not table.empty:
        with_family(table.drop(columns="digits"), rows, rep.families).to_csv(out / "clients.csv", index=False)
        rep.clients = score_grid(table, rows)
        rep.clients_note = clients_caption(frame)
        (out / "clients.md").write_text(f"{rep.clients_note}\n\n{to_markdown(rep.clients, families=rep.families)}")
    noise = noise_table(frame, rows, by)
    if len(noise):
        rep.noise = noise
        noise.to_csv(out / "noise.csv", index=False)
        (out / "noise.md").write_text(noise_markdown(noise))


def compute_note(total: tuple[float, int] | None) -> str:
    text = ("Compute per run: the process's CPU minutes and the wall minutes in the training loop (a run "
            "resumed or started from a shared prefix includes the earlier process's: the method's cost), "
            "and its optimiser steps; mean ± std (ddof=0) over seeds.")
    if total is not None:
        text += (f" The {total[1]} finished runs (complete or diverged) that record CPU time took {total[0]:.2f} "
                 "CPU hours in all, each shared prefix counted once.")
    return text


# ---------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fedlnl-report", description="run summaries -> paper-style tables and plots")
    parser.add_argument("dir", type=Path, help="directory searched recursively for summary.json")
    parser.add_argument("--by", nargs="+", action="extend", default=[], metavar="KEY",
                        help="extra column keys: summary, setting or dotted config keys")
    parser.add_argument("--rows", default="method", help="row key (default: method)")
    parser.add_argument("--metric", default=AUTO, choices=[AUTO, *METRICS, *ALIASES],
                        help="the accuracy of the tables: auto (default: selected_acc when every complete run has "
                             "one, else best_acc), selected (= selected_acc beside last10_acc), balanced_acc (= "
                             "best_balanced_acc beside last10_balanced_acc, costs from the balanced curve) or any "
                             "summary key listed")
    parser.add_argument("--beside", default="auto", choices=["auto", *METRICS, "none"],
                        help="a second metric next to --metric in every column (auto: last-10 of the same accuracy)")
    parser.add_argument("--ratio-to", metavar="METHOD", help="comm-cost ratios to this row")
    parser.add_argument("--reference", type=Path, metavar="FILE",
                        help="paper numbers (CSV); default: ./results/reference/<preset>.csv, else the packaged "
                             "fedlnl/benchmark/reference/<preset>.csv of the runs' preset")
    parser.add_argument("--figures", default="summary", choices=FIGURE_MODES,
                        help="per-run figures: one run per cell (summary), every run (all), none")
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level of the tests (default 0.05)")
    parser.add_argument("--test", default="ttest", choices=stats.TESTS,
                        help="paired test over seeds: ttest (default, from 2 seeds) or wilcoxon (from 6 at α=0.05)")
    parser.add_argument("--full-grid", action="store_true",
                        help="show every column of the reference grid, also those without any run")
    parser.add_argument("--wandb", default="auto", choices=("auto", "on", "off"),
                        help="log tables and figures to W&B: auto = when the runs used logger=wandb")
    parser.add_argument("--out", type=Path, help="output directory (default: DIR/report)")
    return parser.parse_args(argv)


class Interrupted(Exception):
    """A stop signal (SIGTERM) while the report is written."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame):
    raise Interrupted(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Errors are one ``fedlnl-report: error:`` line on stderr: exit 2 for unusable input or
    ``--out``, 1 for a write that failed midway; an interrupt (Ctrl-C, SIGTERM) says which report
    is left incomplete (its ``INCOMPLETE`` file) and exits 128 + the signal."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    args = parse_args(argv)
    out = args.out or args.dir / "report"
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    try:
        return _main(args, out)
    except (ReportInputError, ReportOutputError) as err:
        return _error(str(err), 2)
    except OSError as err:
        return _error(f"the report in {out} is incomplete (its {INCOMPLETE} file says so): {err}", 1)
    except (KeyboardInterrupt, Interrupted) as err:
        signum = getattr(err, "signum", signal.SIGINT)
        left = (f"the report in {out} is incomplete (its {INCOMPLETE} file says so)" if (out / INCOMPLETE).is_file()
                else "nothing written")
        return _error(f"interrupted ({signal.Signals(signum).name}): {left}", 128 + signum)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _error(message: str, code: int) -> int:
    print(f"fedlnl-report: error: {message}", file=sys.stderr)
    return code


def matches_any(frame: pd.DataFrame, reference: pd.DataFrame) -> bool:
    """Whether any run (of any status) is a cell of the reference table."""
    cells = reference.drop_duplicates(subset=["method", "variant", "dataset", "model", "partition", "rho", "tau",
                                              "p", "alpha"])
    idents = [run_identity(r) for _, r in frame.iterrows() if canon(r.get("method")) is not None]
    return any(matches(c, i) for _, c in cells.iterrows() for i in idents)


def _main(args: argparse.Namespace, out: Path) -> int:
    if not 0 < args.alpha < 1:
        raise ReportInputError(f"--alpha={args.alpha} is invalid: allowed a level in (0, 1)")
    if not args.dir.is_dir():
        raise ReportInputError(f"{args.dir} is not a directory")
    frame = load_summaries(args.dir)
    if frame.empty:
        raise ReportInputError(f"no run directories (summary.json or metrics.jsonl) below {args.dir}")
    if not (frame["status"] == "complete").any():
        log.warning("no complete run below %s: the tables show what is missing", args.dir)
    try:
        rows = resolve_key(frame, args.rows)
        by = [resolve_key(frame, k) for k in args.by]
    except KeyError as err:
        raise ReportInputError(err.args[0]) from None
    try:
        reference = load_reference(reference_paths(frame, args.reference))
    except (OSError, ValueError) as err:
        raise ReportInputError(f"cannot read the reference numbers: {err}") from None
    if args.reference is not None and reference is not None and not matches_any(frame, reference):
        raise ReportInputError(f"--reference {args.reference} matches no run below {args.dir} (method, dataset, "
                               "model, partition, rho, tau, p, alpha): a table of another sweep?")
    metric = args.metric if args.metric == AUTO else resolve_metric(args.metric, args.beside)
    print(write_report(frame, out, rows, by, metric, args.ratio_to, reference, args.figures, args.beside,
                       alpha=args.alpha,
                       test=args.test, full_grid=args.full_grid, source=args.dir, wandb=args.wandb))
    print(f"report: {out} (open {out / 'report.html'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
