"""Paper numbers: reading results/reference-style CSVs and matching their rows to table cells."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from fedlnl.benchmark.metrics import LAST_K
from fedlnl.benchmark.report.cells import (NOT_RUN, canon, fmt, part_label, sort_key, column_parts,
                                           with_columns)
from fedlnl.benchmark.report.loading import COMPLETE_KEYS, row_label

log = logging.getLogger(__name__)

REF_KEYS = ("method", "variant", "dataset", "model", "partition", "rho", "tau", "p", "alpha")
REF_COLUMNS = (*REF_KEYS, "target", "metric", "mean", "std", "source")
#: dataset -> its family (the paper's dataset name), only for summaries written before the runner
#: recorded ``setting.family``; reference rows are matched on the family
LEGACY_FAMILIES = {"cifar10_jpeg": "cifar10"}
#: a run's results (accuracies, costs, per-client figures), never copied into a placeholder of a cell
#: without runs
RESULT_PREFIXES = ("best_", "final_", f"last{LAST_K}_", "cost_to_target", "selected_", "reported_round", "client_",
                   "clients.")

def packaged_reference(preset: str) -> Path | None:
    """The paper numbers shipped with fedlnl (``fedlnl/benchmark/reference/<preset>.csv``)."""
    path = resources.files("fedlnl.benchmark").joinpath("reference", f"{preset}.csv")
    return Path(str(path)) if path.is_file() else None


def reference_paths(frame: pd.DataFrame, explicit: str | Path | None = None) -> list[Path]:
    """``explicit``, else for every preset of the summaries ``results/reference/<preset>.csv`` in
    the current directory (a user's own numbers) or the copy shipped as package data."""
    if explicit is not None:
        return [Path(explicit)]
    presets = sorted({str(v) for v in frame.get("preset", []) if canon(v) not in (None, "")})
    found = []
    for preset in presets:
        local = Path.cwd() / "results" / "reference" / f"{preset}.csv"
        hit = local if local.is_file() else packaged_reference(preset)
        if hit is None:
            log.warning("preset %s: no reference numbers (looked for %s and the packaged "
                        "fedlnl/benchmark/reference/%s.csv)", preset, local, preset)
        else:
            found.append(hit)
    return found


def load_reference(paths: Sequence[Path]) -> pd.DataFrame | None:
    """The reference CSVs in one frame (keys as stripped text, numbers as floats, ``target`` as a
    fraction); None when there are none."""
    frames = [read_reference(path) for path in paths]
    return pd.concat(frames, ignore_index=True) if frames else None


def read_reference(path: Path) -> pd.DataFrame:
    ref = pd.read_csv(path, dtype=str, keep_default_na=False)
    lacking = [c for c in REF_COLUMNS if c not in ref]
    if lacking:
        raise ValueError(f"{path}: reference CSV lacks the columns {', '.join(lacking)} "
                         f"(expected {','.join(REF_COLUMNS)})")
    for column in ref:
        ref[column] = ref[column].str.strip()
    for column in ("rho", "tau", "p", "alpha", "target", "mean", "std"):
        ref[column] = pd.to_numeric(ref[column], errors="coerce")  # "" and "-" -> NaN
    ref["target"] = ref["target"].where(~(ref["target"] > 1), ref["target"] / 100.0)  # 80 -> 0.8
    ref["file"] = str(path)
    return ref


def _text(value) -> str:
    value = canon(value)
    return "" if value is None else str(value).strip().lower()


def _norm(key: str, value) -> str:
    text = _text(value)
    if key == "partition":
        return text.replace("-", "").replace("_", "")
    return text


def run_identity(run: Mapping) -> dict:
    """The keys a reference row is matched on, from a run's flattened summary."""
    ident = {k: canon(run.get(k)) for k in REF_KEYS}
    ident["method"] = canon(run.get("base_method", run.get("method")))
    ident["dataset"] = dataset_family(run)
    return ident


def dataset_family(run: Mapping):
    """The run's dataset family (``setting.family``: cifar10 for cifar10 and cifar10_jpeg), else
    the legacy alias of its dataset name."""
    family = canon(run.get("setting.family"))
    if family is not None:
        return family
    dataset = canon(run.get("dataset"))
    return None if dataset is None else LEGACY_FAMILIES.get(_text(dataset), dataset)


def matches(ref_row: Mapping, ident: Mapping) -> bool:
    """Whether a reference row describes this cell: method and variant must be equal (an empty
    variant is the plain method); an empty dataset, model, partition or number is a wildcard."""
    for key in ("method", "variant"):
        if _text(ref_row[key]) != _text(ident.get(key)):
            return False
    for key in ("dataset", "model", "partition"):
        theirs, ours = _norm(key, ref_row[key]), _norm(key, ident.get(key))
        if theirs and ours and theirs != ours:
            return False
    for key in ("rho", "tau", "p", "alpha"):
        theirs, ours = ref_row[key], canon(ident.get(key))
        if canon(theirs) is None:
            continue
        if not isinstance(ours, (int, float)) or abs(float(ours) - float(theirs)) > 1e-9:
            return False
    return True


def reference_row(reference: pd.DataFrame, ident: Mapping, metric: str, target: float | None = None):
    """The first reference row for this cell and metric (and target), or None."""
    rows = reference[reference["metric"] == metric]
    if target is not None:
        rows = rows[np.isclose(rows["target"].astype(float), target)]
    hits = [row for _, row in rows.iterrows() if matches(row, ident)]
    if len({(canon(h["mean"]), canon(h["std"])) for h in hits}) > 1:
        log.warning("several reference values for %s %s; using the first (%s)", ident.get("method"),
                    metric, hits[0]["source"])
    return hits[0] if hits else None


def paper_value(reference: pd.DataFrame, ident: Mapping, metric: str) -> dict:
    hit = reference_row(reference, ident, metric)
    if hit is None:
        return {"paper_mean": np.nan, "paper_std": np.nan, "paper_source": ""}
    return {"paper_mean": hit["mean"], "paper_std": hit["std"], "paper_source": hit["source"]}


def cell_identity(runs: pd.DataFrame, rows: str, row, column: str) -> dict:
    """Identity of a table cell: a run of the cell, or for an empty cell a run of its column
    with the row's own keys (method and variant when the rows are methods)."""
    same_row = runs[rows].map(canon) == row
    in_column = runs["column"] == column
    cell = runs[same_row & in_column]
    if len(cell):
        return run_identity(cell.iloc[0])
    ident = run_identity(runs[in_column].iloc[0])
    row_run = runs[same_row].iloc[0]
    if rows == "method":
        ident.update(method=canon(row_run.get("base_method")), variant=canon(row_run.get("variant")))
    elif rows in ident:
        ident[rows] = canon(row_run.get(rows))
    return ident


def add_missing_cells(frame: pd.DataFrame, reference: pd.DataFrame | None) -> pd.DataFrame:
    """Append a ``not run`` placeholder for every cell of the reference grid that no run (of any
    status) matches, so the tables show it as missing."""
    if reference is None or frame.empty:
        return frame
    idents = [run_identity(run) for _, run in frame.iterrows()]
    cells = reference.drop_duplicates(subset=list(REF_KEYS))
    extra = [_placeholder(frame, cell) for _, cell in cells.iterrows()
             if not any(matches(cell, ident) for ident in idents)]
    if not extra:
        return frame
    return pd.concat([frame, pd.DataFrame(extra, dtype=object)], ignore_index=True)


def _placeholder(frame: pd.DataFrame, cell: pd.Series) -> dict:
    """A run record for a reference cell without runs: a run of the same dataset (else the first)
    as template for every other key, with the cell's keys (empty ones kept from the template)."""
    families = [_text(dataset_family(run)) for _, run in frame.iterrows()]
    same = frame[[f == _norm("dataset", cell["dataset"]) for f in families]]
    template = (same if len(same) else frame).iloc[0].to_dict()
    record = {k: v for k, v in template.items()
              if k not in (*COMPLETE_KEYS, "seed") and not k.startswith(RESULT_PREFIXES)}
    record.update(status=NOT_RUN, path="", base_method=cell["method"], variant=cell["variant"] or None)
    record["method"] = row_label(cell["method"], record["variant"])
    if cell["dataset"] and _text(dataset_family(template)) != _norm("dataset", cell["dataset"]):
        record["dataset"] = record["setting.dataset"] = cell["dataset"]
        if "setting.family" in record:
            record["setting.family"] = cell["dataset"]
    if cell["model"]:
        record["model"] = cell["model"]
    if cell["partition"]:
        part = "noniid" if _norm("partition", cell["partition"]) == "noniid" else _text(cell["partition"])
        record["partition"] = record["setting.partition"] = part
    for key in ("rho", "tau", "p", "alpha"):
        if canon(cell[key]) is not None:
            record[key] = record[f"setting.{key}"] = float(cell[key])
        elif key in ("p", "alpha") and record.get("partition") == "iid":
            record[key] = record[f"setting.{key}"] = None
    return record


def drop_empty_columns(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()) -> pd.DataFrame:
    """The frame without the placeholders of columns that hold no run: a partial sweep's tables
    show only the columns it ran (``--full-grid`` keeps the whole reference grid)."""
    if frame.empty or "status" not in frame:
        return frame
    runs, _, _ = with_columns(frame, rows, by)
    ran = set(runs.loc[runs["status"] != NOT_RUN, "column"])
    empty = runs.index[(runs["status"] == NOT_RUN) & ~runs["column"].isin(ran)]
    return frame.drop(index=empty)


def missing_summary(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()) -> list[str]:
    """One line per row with cells of the reference grid that have no run: their count and a
    compact range, each column part with its values ("model lenet, resnet18 × (ρ,τ) (0,0), (0.4,0)
    … (0.8,0.5) (7 values)"), and how many of the combinations are missing when not all are."""
    runs, _, _ = with_columns(frame, rows, by)
    todo = runs[runs["status"] == NOT_RUN]
    if todo.empty:
        return []
    parts = column_parts(runs, rows, by)
    lines = []
    for row in sorted({canon(v) for v in todo[rows]}, key=sort_key):
        cells = todo[todo[rows].map(canon) == row]
        ranges, product = [], 1
        for part in parts:
            order = sorted(((tuple(sort_key(r.get(k)) for k in part), part_label(part, r))
                            for _, r in cells.iterrows()))
            labels = [lab for lab in dict.fromkeys(lab for _, lab in order) if lab]
            if labels:
                ranges.append(f"{PART_NAMES.get(part, part[-1].split('.')[-1])} {_compact(labels)}")
                product *= len(labels)
        n = len(cells.drop_duplicates(subset=["column"]))
        combos = f" ({n} of the {product} combinations)" if n < product else ""
        lines.append(f"- {fmt(row)}: {n} cell{'s' if n != 1 else ''} not run — " + " × ".join(ranges) + combos)
    return lines


PART_NAMES = {("rho", "tau"): "(ρ,τ)", ("partition", "p", "alpha"): "partition", ("num_clients",): "clients"}


def _compact(labels: list[str]) -> str:
    if len(labels) <= 4:
        return ", ".join(labels)
    return f"{labels[0]}, {labels[1]} … {labels[-1]} ({len(labels)} values)"


def missing_cells(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()) -> list[str]:
    """'row / column' of every placeholder (a reference cell without any run)."""
    runs, _, _ = with_columns(frame, rows, by)
    todo = runs[runs["status"] == NOT_RUN]
    return [f"- {fmt(r[rows])} / {r['column']}" for _, r in todo.iterrows()]


def shown_path(path: str) -> str:
    """A reference file as the report names it: the packaged copy by its place in the package (no
    machine path in a report), any other file as given."""
    packaged = packaged_reference(Path(path).stem)
    if packaged is not None and Path(path).resolve() == packaged.resolve():
        return f"fedlnl/benchmark/reference/{Path(path).name}"
    return str(path)


def reference_note(reference: pd.DataFrame) -> str:
    files = ", ".join(dict.fromkeys(shown_path(f) for f in reference["file"]))
    sources = ", ".join(s for s in dict.fromkeys(reference["source"]) if s)
    return (f"Paper values from {files}" + (f" ({sources})" if sources else "")
            + "; Δ = ours − paper, in percentage points.")

