"""`fedlnl-report DIR`: run summaries -> paper-style tables (md/csv/tex) and plots in DIR/report.

Reads every ``summary.json`` below DIR (never logs or W&B). A run directory whose summary is
missing (``metrics.jsonl`` only: still running or killed), unreadable, partial or not ``complete``
is not averaged; it is counted and listed as an incomplete run, so a partial sweep gives a table
with "missing" cells. Runs without a summary are placed in the table from their
``.hydra/config.yaml`` when there is one (best effort).

Tables: rows are ``--rows`` (default ``method``); columns are setting groups. By default a column
is the noise ``(rho,tau)`` plus ``non-IID (p,alpha)`` for non-IID partitions (``IID`` when IID and
non-IID runs are mixed); method (unless it is the row key), dataset, model, ``N=`` clients and any
other key of the runner's ``setting`` (e.g. ``fidelity=paper``) join the label whenever they vary,
so runs of different configurations are never pooled. ``--by KEY`` adds keys (any summary key,
setting key or dotted config key such as ``config.method.beta``; a bare ``method.beta`` is looked
up under ``config.`` too). A cell is the mean ± std over seeds of the metric in %, with the number
n of complete runs. The std is the population std (ddof=0): the papers (FedCorr, FedDiv) report
"mean ± std over 5 trials" without saying which; with n = 5, ddof=1 would be sqrt(5/4) = 1.118
times larger. The best mean of each column (compared at the printed 2 decimals) is bold.

Communication (FedCorr appendix B, C.3, Tables 11-13): total cost (client participations) and cost
to each accuracy target, as means over the complete seeds; a target is averaged over the seeds that
reached it ("[k/n]" when not all did) and is "-" when none did. ``--ratio-to METHOD`` adds the ratio
to that row's value in the same column, as FedCorr prints in brackets.

Outputs in DIR/report: accuracy.{md,csv,tex}, comm.{md,csv} (csv in long form, mean and std in %),
acc_vs_cost.png (mean test accuracy over seeds vs communication cost, one subplot per column).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from fedlnl.benchmark import resolvers  # noqa: F401 (${fidelity:...} in Hydra configs)
from fedlnl.benchmark.plots import plot_acc_vs_cost

log = logging.getLogger(__name__)

SETTING_KEYS = ("rho", "tau", "partition", "p", "alpha", "num_clients")
METRICS = ("best_acc", "final_acc", "last10_acc")
COMPLETE_KEYS = ("best_acc", "final_acc", "last10_acc", "comm_cost")
RUN_FILES = ("summary.json", "metrics.jsonl")
MISSING = "missing"


# ---------------------------------------------------------------- loading


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
    return frame


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
    runner's summary would be (``run.setting_of``)."""
    if not (hydra_dir / "config.yaml").exists():
        return {}
    from fedlnl.benchmark.run import setting_of  # noqa: PLC0415 (torch: only for such runs)

    cfg = OmegaConf.load(hydra_dir / "config.yaml")
    choices = {}
    if (hydra_dir / "hydra.yaml").exists():
        hydra = OmegaConf.to_container(OmegaConf.load(hydra_dir / "hydra.yaml"), resolve=False)
        choices = _get(hydra, "hydra.runtime.choices") or {}
    setting = setting_of(cfg)
    return {"method": choices.get("method"), "model": choices.get("model"),
            "dataset": setting.get("dataset"), "seed": cfg.get("seed"), "setting": setting,
            "config": _container(cfg)}


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
    flat = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name != "cost_to_target":
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = tuple(value) if isinstance(value, list) else value
    return flat


def read_metrics(path: str | Path) -> pd.DataFrame | None:
    """metrics.jsonl as a frame (unparsable lines, e.g. a half-written last line, are skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            log.warning("skipping a bad line of %s", path)
    return pd.DataFrame(rows) if rows else None


# ---------------------------------------------------------------- keys and columns


def resolve_key(frame: pd.DataFrame, key: str) -> str:
    """The frame column for a user key: itself, ``setting.KEY`` or ``config.KEY``."""
    for name in (key, f"setting.{key}", f"config.{key}"):
        if name in frame:
            return name
    raise KeyError(f"unknown key {key!r}; try a summary key, a setting key or config.<dotted.key>")


def _canon(value):
    """A hashable, NaN-free form of a cell value (NaN -> None, numpy scalars -> Python)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def _sort_key(value) -> tuple:
    value = _canon(value)
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, (int, float)):
        return (1, float(value), "")
    return (2, 0.0, str(value))


def _fmt(value) -> str:
    value = _canon(value)
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _varies(frame: pd.DataFrame, key: str) -> bool:
    return key in frame and len({_canon(v) for v in frame[key]}) > 1


def column_parts(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()) -> list[tuple]:
    """The key groups that define the table's columns, in label order (see module docstring);
    any other ``setting`` key of the runner (noise kind, fidelity) is added when it varies."""
    parts = [(k,) for k in ("method", "dataset", "model") if _varies(frame, k)]
    if "rho" in frame or "tau" in frame:
        parts.append(("rho", "tau"))
    partition = frame["partition"].map(_canon) if "partition" in frame else pd.Series(dtype=object)
    if (partition.notna() & (partition != "iid")).any() or _varies(frame, "partition"):
        parts.append(("partition", "p", "alpha"))
    if _varies(frame, "num_clients"):
        parts.append(("num_clients",))
    named = {f"setting.{k}" for k in (*SETTING_KEYS, "dataset")}
    parts += [(k,) for k in frame if k.startswith("setting.") and k not in named and _varies(frame, k)]
    parts += [(resolve_key(frame, k),) for k in by]
    return [part for part in parts if rows not in part]


def _part_label(part: tuple[str, ...], run: pd.Series) -> str:
    value = {k: run.get(k) for k in part}
    if part == ("rho", "tau"):
        return f"({_fmt(value['rho'])},{_fmt(value['tau'])})"
    if part == ("partition", "p", "alpha"):
        if _canon(value["partition"]) == "iid":
            return "IID"
        return f"non-IID ({_fmt(value['p'])},{_fmt(value['alpha'])})"
    (key,) = part
    if key == "num_clients":
        return f"N={_fmt(value[key])}"
    if key in ("method", "dataset", "model"):
        return _fmt(value[key])
    return f"{key.split('.')[-1]}={_fmt(value[key])}"


def with_columns(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()):
    """Runs that have a row value, with their ``column`` label; plus the column labels in order
    and the keys behind them."""
    runs = frame[frame[rows].map(_canon).notna()].copy() if rows in frame else frame.iloc[:0].copy()
    parts = column_parts(runs, rows, by)
    keys = [k for part in parts for k in part if k in runs]
    labels = [" ".join(_part_label(p, run) for p in parts) or "all" for _, run in runs.iterrows()]
    orders = [tuple(_sort_key(run.get(k)) for k in keys) for _, run in runs.iterrows()]
    runs["column"] = pd.Series(labels, index=runs.index, dtype=object)
    columns = list(dict.fromkeys(lab for _, lab in sorted(zip(orders, labels))))
    return runs, columns, keys


def _row_values(runs: pd.DataFrame, rows: str) -> list:
    return sorted({_canon(v) for v in runs[rows]}, key=_sort_key)


def _cells(runs: pd.DataFrame, rows: str, columns: list[str], keys: list[str]):
    """Yield (row value, column label, key values of the column, runs of the cell)."""
    key_values = {c: runs.loc[runs["column"] == c, keys].iloc[0].to_dict() for c in columns}
    row_of = runs[rows].map(_canon)
    for row in _row_values(runs, rows):
        for column in columns:
            cell = runs[(row_of == row) & (runs["column"] == column)]
            yield row, column, key_values[column], cell


def _complete(cell: pd.DataFrame) -> pd.DataFrame:
    return cell[cell["status"] == "complete"]


# ---------------------------------------------------------------- accuracy


def accuracy_table(
    frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = (), metric: str = "best_acc"
) -> pd.DataFrame:
    """Long form: one line per (row, column) cell with mean, std (ddof=0) in %, n complete runs
    and n_incomplete (failed, diverged, partial or missing runs)."""
    runs, columns, keys = with_columns(frame, rows, by)
    lines = []
    for row, column, key_values, cell in _cells(runs, rows, columns, keys):
        done = _complete(cell)
        _warn_duplicate_seeds(done, row, column)
        values = 100.0 * done.get(metric, pd.Series(dtype=float)).astype(float).to_numpy()
        lines.append({rows: row, "column": column, **key_values, "metric": metric,
                      "mean": values.mean() if len(values) else np.nan,
                      "std": values.std(ddof=0) if len(values) else np.nan,
                      "n": len(values), "n_incomplete": len(cell) - len(done)})
    return pd.DataFrame(lines, columns=[rows, "column", *keys, "metric", "mean", "std", "n",
                                        "n_incomplete"])


def _warn_duplicate_seeds(done: pd.DataFrame, row, column: str) -> None:
    if "seed" in done and done["seed"].duplicated().any():
        log.warning("%s / %s: several complete runs share a seed; all are averaged", row, column)


def accuracy_cell(mean: float, std: float, n: int, n_incomplete: int) -> str:
    extra = f", {n_incomplete} incomplete" if n_incomplete else ""
    if n == 0:
        return MISSING + (f" ({n_incomplete} incomplete)" if n_incomplete else "")
    return f"{mean:.2f} ± {std:.2f} (n={n}{extra})"


def accuracy_grid(table: pd.DataFrame, rows: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cell texts, bold mask) with rows x columns; bold = best printed mean of each column."""
    table = table.assign(
        text=[accuracy_cell(*v) for v in _tuples(table, "mean", "std", "n", "n_incomplete")],
        shown=table["mean"].round(2),
    )
    best = table.groupby("column", sort=False)["shown"].transform("max")
    table = table.assign(bold=(table["shown"] == best) & (table["n"] > 0))
    return _pivot(table, rows, "text"), _pivot(table, rows, "bold")


def _tuples(table: pd.DataFrame, *columns: str):
    return zip(*(table[c].tolist() for c in columns))


def _pivot(table: pd.DataFrame, rows: str, value: str) -> pd.DataFrame:
    row_order = list(dict.fromkeys(table[rows]))
    column_order = list(dict.fromkeys(table["column"]))
    grid = table.pivot(index=rows, columns="column", values=value)
    return grid.reindex(index=row_order, columns=column_order)


# ---------------------------------------------------------------- communication


def comm_table(
    frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = (), ratio_to=None
) -> pd.DataFrame:
    """Long form: per cell the mean total cost (``quantity`` total) and the mean cost to each
    target (``quantity`` cost_to_target, ``target`` as in the summaries), over complete seeds;
    ``ratio`` to the ``ratio_to`` row of the same column when given."""
    runs, columns, keys = with_columns(frame, rows, by)
    targets = _targets(_complete(runs))
    lines = []
    for row, column, key_values, cell in _cells(runs, rows, columns, keys):
        done = _complete(cell)
        base = {rows: row, "column": column, **key_values, "n": len(done)}
        total = _mean_reached(done.get("comm_cost", []))
        lines.append({**base, "quantity": "total", "target": "", **total})
        for target in targets:
            reached = [c.get(target) if isinstance(c, dict) else None
                       for c in done.get("cost_to_target", [])]
            lines.append({**base, "quantity": "cost_to_target", "target": target,
                          **_mean_reached(pd.Series(reached, dtype=object))})
    table = pd.DataFrame(lines, columns=[rows, "column", *keys, "quantity", "target", "mean",
                                         "n_reached", "n"])
    return _with_ratio(table, rows, ratio_to)


def _targets(done: pd.DataFrame) -> list[str]:
    found = {t for c in done.get("cost_to_target", []) if isinstance(c, dict) for t in c}
    return sorted(found, key=lambda t: _sort_key(_as_float(t)))


def _as_float(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def _mean_reached(costs: pd.Series) -> dict:
    reached = [float(c) for c in costs if _canon(c) is not None]
    return {"mean": float(np.mean(reached)) if reached else np.nan, "n_reached": len(reached)}


def _with_ratio(table: pd.DataFrame, rows: str, ratio_to) -> pd.DataFrame:
    table = table.assign(ratio=np.nan)
    if ratio_to is None:
        return table
    reference = table[table[rows] == ratio_to]
    if reference.empty:
        log.warning("--ratio-to %s: no such %s; no ratios", ratio_to, rows)
        return table
    ref = reference.set_index(["column", "quantity", "target"])["mean"]
    index = pd.MultiIndex.from_frame(table[["column", "quantity", "target"]])
    table["ratio"] = table["mean"].to_numpy() / ref.reindex(index).to_numpy()
    return table


def _fmt_cost(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def comm_cell(mean: float, n_reached: int, n: int, ratio: float, is_reference: bool) -> str:
    if n == 0:
        return MISSING
    if n_reached == 0:
        return "-"
    text = _fmt_cost(mean)
    if not is_reference and not math.isnan(ratio):
        text += f" ({ratio:.1f})"
    return text + (f" [{n_reached}/{n}]" if n_reached < n else "")


def comm_markdown(table: pd.DataFrame, rows: str, ratio_to=None) -> str:
    """Markdown: the total-cost table, then one table per accuracy target."""
    table = table.assign(text=[
        comm_cell(m, k, n, r, row == ratio_to)
        for m, k, n, r, row in _tuples(table, "mean", "n_reached", "n", "ratio", rows)
    ])
    ratio = f" (ratio to {ratio_to} in brackets)" if ratio_to is not None else ""
    sections = []
    for (quantity, target), part in table.groupby(["quantity", "target"], sort=False):
        title = ("Total communication cost (client participations)" if quantity == "total"
                 else f"Communication cost to reach {_target_label(target)} test accuracy")
        text = _pivot(part, rows, "text")
        sections.append(f"### {title}{ratio}\n\n{to_markdown(text)}")
    note = "'-' = never reached; [k/n] = mean over the k of n seeds that reached it.\n"
    return "\n".join(sections) + "\n" + note


def _target_label(target: str) -> str:
    value = _as_float(target)
    return f"{100 * value:g}%" if isinstance(value, float) else target


# ---------------------------------------------------------------- rendering


def to_markdown(text: pd.DataFrame, bold: pd.DataFrame | None = None) -> str:
    header = [str(text.index.name or ""), *map(str, text.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row, values in text.iterrows():
        marks = bold.loc[row] if bold is not None else [False] * len(values)
        cells = [f"**{v}**" if b else str(v) for v, b in zip(values, marks)]
        lines.append("| " + " | ".join([_fmt(row), *cells]) + " |")
    return "\n".join(lines) + "\n"


LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                 "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}"}


def latex_escape(text: str) -> str:
    escaped = "".join(LATEX_SPECIAL.get(ch, ch) for ch in str(text))
    return escaped.replace("±", r"$\pm$")


def to_latex(text: pd.DataFrame, bold: pd.DataFrame | None = None, comment: str = "") -> str:
    """A booktabs tabular (needs ``\\usepackage{booktabs}``); bold cells in ``\\textbf``."""
    header = [str(text.index.name or ""), *map(str, text.columns)]
    lines = [f"% {comment}" if comment else "% fedlnl-report", "% needs \\usepackage{booktabs}",
             "\\begin{tabular}{l" + "c" * len(text.columns) + "}", "\\toprule",
             " & ".join(map(latex_escape, header)) + r" \\", "\\midrule"]
    for row, values in text.iterrows():
        marks = bold.loc[row] if bold is not None else [False] * len(values)
        cells = [f"\\textbf{{{latex_escape(v)}}}" if b else latex_escape(v)
                 for v, b in zip(values, marks)]
        lines.append(" & ".join([latex_escape(_fmt(row)), *cells]) + r" \\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def incomplete_runs(frame: pd.DataFrame, rows: str) -> list[str]:
    """One line per run that is not complete: path, status and row value if known."""
    bad = frame[frame["status"] != "complete"]
    return [f"- {r['path']}: {r['status']} ({rows}={_fmt(r.get(rows))})" for _, r in bad.iterrows()]


# ---------------------------------------------------------------- curves


def curves(frame: pd.DataFrame, rows: str = "method", by: Sequence[str] = ()) -> dict:
    """{column label: {row value: (comm cost grid, mean accuracy in % over seeds)}} from the
    metrics.jsonl of complete runs, columns and rows in table order."""
    runs, columns, _ = with_columns(frame, rows, by)
    runs = _complete(runs)
    out: dict = {}
    for column in columns:
        for row in _row_values(runs, rows):
            cell = runs[(runs["column"] == column) & (runs[rows].map(_canon) == row)]
            series = [s for s in map(_run_curve, cell["path"]) if s is not None]
            if series:
                out.setdefault(column, {})[row] = mean_curve(series)
    return out


def _run_curve(run_dir: str) -> tuple[np.ndarray, np.ndarray] | None:
    path = Path(run_dir) / "metrics.jsonl"
    metrics = read_metrics(path) if path.exists() else None
    if metrics is None or not {"acc", "comm_cost"} <= set(metrics.columns):
        return None
    metrics = metrics.dropna(subset=["acc", "comm_cost"])
    last = metrics.groupby("comm_cost", sort=True)["acc"].last()  # several evaluations per cost
    return last.index.to_numpy(float), 100.0 * last.to_numpy(float)


def mean_curve(series: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds on the union of their cost grids (linear interpolation), restricted to the
    cost range every seed covers."""
    low, high = max(x[0] for x, _ in series), min(x[-1] for x, _ in series)
    grid = np.unique(np.concatenate([x for x, _ in series]))
    grid = grid[(grid >= low) & (grid <= high)]
    return grid, np.mean([np.interp(grid, x, y) for x, y in series], axis=0)


# ---------------------------------------------------------------- entry point


def write_report(frame: pd.DataFrame, out: Path, rows: str = "method", by: Sequence[str] = (),
                 metric: str = "best_acc", ratio_to=None) -> str:
    """Write every table and plot into ``out``; return the main Markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    table = accuracy_table(frame, rows, by, metric)
    text, bold = accuracy_grid(table, rows)
    about = f"{metric} in %: mean ± std (population, ddof=0) over seeds, n = complete runs"
    incomplete = incomplete_runs(frame, rows)
    main_md = f"{about}; best mean per column in bold.\n\n{to_markdown(text, bold)}"
    notes = "\nIncomplete runs (not averaged):\n" + "\n".join(incomplete) + "\n" if incomplete else ""
    (out / "accuracy.md").write_text(main_md + notes)
    table.to_csv(out / "accuracy.csv", index=False)
    (out / "accuracy.tex").write_text(to_latex(text, bold, about))
    comm = comm_table(frame, rows, by, ratio_to)
    comm.to_csv(out / "comm.csv", index=False)
    (out / "comm.md").write_text(comm_markdown(comm, rows, ratio_to))
    lines = curves(frame, rows, by)
    if lines:
        plot_acc_vs_cost(lines, out / "acc_vs_cost.png")
    else:
        log.warning("no metrics.jsonl of a complete run: no acc_vs_cost.png")
    return main_md + notes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fedlnl-report", description=__doc__.split("\n")[0])
    parser.add_argument("dir", type=Path, help="directory searched recursively for summary.json")
    parser.add_argument("--by", nargs="+", action="extend", default=[], metavar="KEY",
                        help="extra column keys: summary, setting or dotted config keys")
    parser.add_argument("--rows", default="method", help="row key (default: method)")
    parser.add_argument("--metric", default="best_acc", choices=METRICS)
    parser.add_argument("--ratio-to", metavar="METHOD", help="comm-cost ratios to this row")
    parser.add_argument("--out", type=Path, help="output directory (default: DIR/report)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    args = parse_args(argv)
    frame = load_summaries(args.dir)
    if frame.empty:
        log.error("no run directories (summary.json or metrics.jsonl) below %s", args.dir)
        return 1
    try:
        rows = resolve_key(frame, args.rows)
        by = [resolve_key(frame, k) for k in args.by]
    except KeyError as err:
        log.error("%s", err.args[0])
        return 2
    out = args.out or args.dir / "report"
    print(write_report(frame, out, rows, by, args.metric, args.ratio_to))
    print(f"report: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
