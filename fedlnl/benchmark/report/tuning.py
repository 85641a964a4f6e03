"""The report's listing of tuned values: which runs used values of an ``experiment=tune`` study
(``tuned=``, summary.json ``tuned``), which values, the trial budget and the objective they were
chosen on, so that a table of tuned methods says what was tuned beside it (issue 33 item 3)."""
from __future__ import annotations

import math

import pandas as pd

VALUES = "tuned.values."


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def tuned_rows(frame: pd.DataFrame, rows: str = "method") -> pd.DataFrame:
    """One row per (row label, tuned values, source): the values, the study's trials, its objective
    and best value; rows of runs without tuned values say so. Empty when no run was tuned."""
    keys = sorted(c[len(VALUES):] for c in frame.columns if c.startswith(VALUES))
    if not keys or frame.empty:
        return pd.DataFrame()
    out = []
    for _, run in frame.iterrows():
        values = {k: run[VALUES + k] for k in keys if _present(run.get(VALUES + k))}
        tuned = bool(values)
        out.append({rows: run[rows],
                    "values": ", ".join(f"{k}={_number(v)}" for k, v in values.items()) if tuned else "not tuned",
                    "trials": run.get("tuned.trials") if tuned else None,
                    "objective": run.get("tuned.objective") if tuned else None,
                    "best value": run.get("tuned.best_value") if tuned else None,
                    "from": run.get("tuned.source") if tuned else None})
    table = pd.DataFrame(out, dtype=object)
    return table.drop_duplicates().sort_values([rows, "values"], kind="stable").reset_index(drop=True)


def tuned_lines(frame: pd.DataFrame, rows: str = "method") -> list[str]:
    """The Markdown listing (a sentence on the budget, then the table); [] when no run was tuned."""
    table = tuned_rows(frame, rows)
    if table.empty:
        return []
    trials = sorted({int(t) for t in table["trials"] if _present(t)})
    objectives = sorted({str(o) for o in table["objective"] if _present(o)})
    untuned = sorted({str(r) for r, v in zip(table[rows], table["values"]) if v == "not tuned"})
    budget = (f"{trials[0]} trials per method (the same budget for every tuned method)" if len(trials) == 1
              else f"UNEQUAL budgets: {', '.join(map(str, trials))} trials")
    lines = [f"Tuned values (tuned=): {budget}, each chosen by the best {' / '.join(objectives)} of its study "
             "on the tuning cell (noisy validation, never the test set)"
             + (f"; not tuned: {', '.join(untuned)}" if untuned else "") + ".", "",
             f"| {rows} | values | trials | best {' / '.join(objectives)} | from |", "|---|---|---|---|---|"]
    for _, r in table[table["values"] != "not tuned"].iterrows():
        best = f"{100 * float(r['best value']):.1f}" if _present(r["best value"]) else "—"
        trials_text = str(int(r["trials"])) if _present(r["trials"]) else "—"
        lines.append(f"| {r[rows]} | {r['values']} | {trials_text} | {best} | {r['from'] or '—'} |")
    return lines


def tuned_section(frame: pd.DataFrame, rows: str = "method") -> str:
    """``tuned_lines`` as a block to append under the main table ("" when no run was tuned)."""
    lines = tuned_lines(frame, rows)
    return "\n" + "\n".join(lines) + "\n" if lines else ""
