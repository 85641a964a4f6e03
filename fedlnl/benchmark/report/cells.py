"""Table geometry: which runs form a row, a column and a cell; value canonicalisation."""
from __future__ import annotations

import math
from collections.abc import Sequence

import json

import numpy as np
import pandas as pd

from fedlnl.benchmark.setting import extras as setting_extras
from fedlnl.conf.keys import NON_RESULT_KEYS
from fedlnl.datasets import kinds
from fedlnl.methods.common.families import FAMILIES


SETTING_KEYS = ("rho", "tau", "partition", "p", "alpha", "num_clients")
MISSING = "missing"
NOT_RUN = "not run"  # status of a placeholder: a cell of the reference grid without any run


def resolve_key(frame: pd.DataFrame, key: str) -> str:
    """The frame column for a user key: itself, ``setting.KEY`` or ``config.KEY``."""
    for name in (key, f"setting.{key}", f"config.{key}"):
        if name in frame:
            return name
    raise KeyError(f"unknown key {key!r}; try a summary key, a setting key or config.<dotted.key>")


def canon(value):
    """A hashable, NaN-free form of a cell value (NaN -> None, numpy scalars -> Python)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return value


def sort_key(value) -> tuple:
    value = canon(value)
    if value is None:
        return (0, 0.0, "")
    if isinstance(value, (int, float)):
        return (1, float(value), "")
    return (2, 0.0, str(value))


def fmt(value) -> str:
    value = canon(value)
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _varies(frame: pd.DataFrame, key: str) -> bool:
    return key in frame and len({canon(v) for v in frame[key]}) > 1


def column_parts(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()) -> list[tuple]:
    """The key groups that define the table's columns, in label order (see module docstring);
    any other ``setting`` key of the runner (noise kind, fidelity) is added when it varies."""
    parts = [(k,) for k in ("method", "dataset", "model") if _varies(frame, k)]
    if "rho" in frame or "tau" in frame:
        parts.append(("rho", "tau"))
    partition = frame["partition"].map(canon) if "partition" in frame else pd.Series(dtype=object)
    if (partition.notna() & (partition != "iid")).any() or _varies(frame, "partition"):
        parts.append(("partition", "p", "alpha"))
    if _varies(frame, "num_clients"):
        parts.append(("num_clients",))
    named = {f"setting.{k}" for k in (*SETTING_KEYS, "dataset", "family")}
    parts += [(k,) for k in frame if k.startswith("setting.") and k not in named and _varies(frame, k)]
    parts += [(resolve_key(frame, k),) for k in by]
    return [part for part in parts if rows not in part]


def _setting(run: pd.Series, group: str) -> dict:
    """The run's setting values by bare key (what a kind's registered label reads): its partition or
    noise config keys, overridden by its setting keys where given."""
    values = {}
    for prefix in (f"config.{group}.", "setting."):
        values.update({k[len(prefix):]: canon(v) for k, v in run.items()
                       if str(k).startswith(prefix) and canon(v) is not None})
    return {**values, **{k: canon(run.get(k)) for k in SETTING_KEYS if k in run}}


def part_label(part: tuple[str, ...], run: pd.Series) -> str:
    """A column label part; a partition's, and a noise's without (rho, tau), is its kind's registered
    label (``fedlnl.datasets.kinds``), a kind this process does not know is named as it is."""
    value = {k: run.get(k) for k in part}
    if part == ("rho", "tau"):
        if canon(value["rho"]) is None:  # real noise (CIFAR-10N) or noise=mixed (groups): named by kind
            kind = kinds.noise(canon(run.get("setting.noise")))
            words = [kind.label_of(_setting(run, "noise"), fmt)] if kind is not None else [
                fmt(run.get(k)) for k in ("setting.noise", "config.noise.label_set") if canon(run.get(k)) is not None]
            tau = [f"τ={fmt(value['tau'])}"] if canon(value["tau"]) is not None else []
            return " ".join([w for w in words if w] + tau)
        return f"({fmt(value['rho'])},{fmt(value['tau'])})"
    if part == ("partition", "p", "alpha"):
        name = canon(value["partition"])
        kind = kinds.partition("noniid" if name is None else name)  # None: runs from before the kinds
        return str(name) if kind is None else kind.label_of(_setting(run, "partition"), fmt)
    (key,) = part
    extras = (*setting_extras()["partition"], *setting_extras()["noise"])
    if key.startswith("setting.") and key[len("setting."):] in extras and canon(value[key]) is None:
        return ""  # an option of another partition / noise kind (e.g. s= on a classes run)
    if key in ("setting.noise", "setting.label_set") and canon(run.get("rho")) is None:
        return ""  # real or mixed noise: the (rho, tau) part already names it
    if key == "num_clients":
        return f"N={fmt(value[key])}"
    if key in ("method", "dataset", "model"):
        return fmt(value[key])
    return f"{key.split('.')[-1]}={fmt(value[key])}"


def with_columns(frame: pd.DataFrame, rows: str, by: Sequence[str] = ()):
    """Runs that have a row value, with their ``column`` label; plus the column labels in order
    and the keys behind them. Config keys in which complete runs of one cell differ (anything but
    the seed and the bookkeeping keys) become column keys too, so a cell only pools seeds."""
    runs = frame[frame[rows].map(canon).notna()].copy() if rows in frame else frame.iloc[:0].copy()
    runs = by_device_kind(runs, rows)
    parts = column_parts(runs, rows, by)
    runs, columns, keys = _labelled(runs, parts)
    split = pooling_keys(runs, rows)
    if split:
        runs, columns, keys = _labelled(runs, parts + [(k,) for k in split])
    return runs, columns, keys


def device_kinds(frame: pd.DataFrame) -> pd.Series:
    """The device kind (cpu / cuda / mps) each run ran on: its recorded identity, else the kind of the
    device its summary names (summaries written before identities were recorded); None if unknown."""
    kinds = pd.Series([None] * len(frame), index=frame.index, dtype=object)
    if "device" in frame:
        kinds = frame["device"].map(lambda d: str(d).split(":")[0] if canon(d) is not None else None)
    if "identity.device_kind" in frame:
        recorded = frame["identity.device_kind"].map(canon)
        kinds = recorded.where(recorded.notna(), kinds)
    return kinds.astype(object)


def by_device_kind(runs: pd.DataFrame, rows: str) -> pd.DataFrame:
    """Runs of different device kinds are never seeds of one configuration (float reductions, cuDNN
    and cuBLAS kernels differ from the CPU's): when the runs hold more than one kind, every row value
    is labelled with its kind (``fedavg [cuda]``, ``fedavg [cpu]``), so each kind has its own row."""
    kinds = device_kinds(runs)
    if kinds.dropna().nunique() <= 1:
        return runs
    runs = runs.copy()
    runs[rows] = [f"{fmt(r)} [{k}]" if k is not None else r for r, k in zip(runs[rows], kinds)]
    return runs


def _labelled(runs: pd.DataFrame, parts: list[tuple]):
    keys = [k for part in parts for k in part if k in runs]
    labels = [" ".join(filter(None, (part_label(p, run) for p in parts))) or "all"
              for _, run in runs.iterrows()]
    orders = [tuple(sort_key(run.get(k)) for k in keys) for _, run in runs.iterrows()]
    runs = runs.assign(column=pd.Series(labels, index=runs.index, dtype=object))
    columns = list(dict.fromkeys(lab for _, lab in sorted(zip(orders, labels))))
    return runs, columns, keys


#: config keys over which a cell's runs are pooled: the seed and the keys that never change a result
BOOKKEEPING = ("seed", *NON_RESULT_KEYS)


def pooling_keys(runs: pd.DataFrame, rows: str) -> list[str]:
    """Resolved-config keys (``config.*``, bookkeeping removed) whose value differs between the
    complete runs of one (row, column) cell: such runs are not seeds of one configuration."""
    done = runs[runs["status"] == "complete"] if "status" in runs else runs
    names = [k for k in done if k.startswith("config.") and k.split(".")[1] not in BOOKKEEPING]
    if done.empty or not names:
        return []
    cell = done[rows].map(lambda v: str(canon(v))) + "\x00" + done["column"].astype(str)
    varying = []
    for name in names:
        values = done[name].map(lambda v: str(canon(v)))
        if (values.groupby(cell).nunique() > 1).any():
            varying.append(name)
    return varying


#: the group of rows none of whose runs records a method family (summaries written before the runner
#: recorded it, runs without a summary): shown last
OTHER_FAMILY = "other"


def row_families(runs: pd.DataFrame, rows: str) -> dict | None:
    """{row value: method family} in table order, from the summaries' ``family``; rows without one
    get :data:`OTHER_FAMILY`. None (no grouping) when no run records a family, when the rows are the
    families themselves, or when a row's runs name several families (rows that are not methods)."""
    if rows == "family" or "family" not in runs or rows not in runs:
        return None
    found: dict = {}
    for row, family in zip(map(canon, runs[rows]), map(canon, runs["family"])):  # Series.map: None -> NaN
        if row is not None:
            found.setdefault(row, set()).update([] if family is None else [str(family)])
    if not any(found.values()) or any(len(f) > 1 for f in found.values()):
        return None
    families = {row: next(iter(f)) if f else OTHER_FAMILY for row, f in found.items()}
    order = sorted(families, key=lambda row: (family_key(families[row]), sort_key(row)))  # the tables' order
    return {row: families[row] for row in order}


def family_key(family: str) -> tuple:
    """Sort key of a family: ``FAMILIES`` order, then families a user's method names (alphabetical),
    then :data:`OTHER_FAMILY`."""
    if family in FAMILIES:
        return (0, FAMILIES.index(family), "")
    return (2, 0, "") if family == OTHER_FAMILY else (1, 0, str(family))


def row_values(runs: pd.DataFrame, rows: str) -> list:
    """The rows in table order: grouped by family (:func:`family_key`) when the runs record one, by
    name (numbers by value) within a family, so a method's ablation variants follow it."""
    families = row_families(runs, rows)
    if families is not None:
        return list(families)
    return sorted({canon(v) for v in runs[rows]}, key=sort_key)


def each_cell(runs: pd.DataFrame, rows: str, columns: list[str], keys: list[str]):
    """Yield (row value, column label, key values of the column, runs of the cell)."""
    key_values = {c: runs.loc[runs["column"] == c, keys].iloc[0].to_dict() for c in columns}
    row_of = runs[rows].map(canon)
    for row in row_values(runs, rows):
        for column in columns:
            cell = runs[(row_of == row) & (runs["column"] == column)]
            yield row, column, key_values[column], cell


def complete_runs(cell: pd.DataFrame) -> pd.DataFrame:
    return cell[cell["status"] == "complete"]


def tuples(table: pd.DataFrame, *columns: str):
    return zip(*(table[c].tolist() for c in columns))


def pivot(table: pd.DataFrame, rows: str, value: str) -> pd.DataFrame:
    row_order = list(dict.fromkeys(table[rows]))
    column_order = list(dict.fromkeys(table["column"]))
    grid = table.pivot(index=rows, columns="column", values=value)
    return grid.reindex(index=row_order, columns=column_order)

