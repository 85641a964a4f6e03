"""Statistics of a table: which differences are real at n seeds, how methods rank over the cells,
and whether the ordering agrees with the paper's. Everything is computed from the per-seed values of
the complete runs already on disk.

Library: scipy (it comes with scikit-learn, so nothing new is installed). It has every test used
here: the paired t-test (``ttest_rel``), the Wilcoxon signed-rank test, the Friedman test, the
studentized range distribution behind the Nemenyi critical difference, Kendall's τ and the
bootstrap. The Holm step-down correction is a reordering of p-values, written out below.

Paired tests. Every method of a column sees the same federation for a seed, so two methods are
compared on the seeds both completed (the pairs). The default test is the two-sided paired t-test
(minimum 2 pairs: one degree of freedom). The Wilcoxon signed-rank test (``--test wilcoxon``)
makes no normality assumption but its exact two-sided p-value is at least 2 / 2^n, so it can reject
at α only from n = ⌈log2(2/α)⌉ pairs on (6 at α = 0.05): with the 2-5 seeds benchmarks run it could
never mark a difference. Below a test's minimum a comparison is "not tested" and the table says so
instead of marking.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

TESTS = ("ttest", "wilcoxon")
NOT_ENOUGH = "not enough runs"


@dataclass(frozen=True)
class Test:
    """A paired test over seeds and its minimum number of pairs at ``alpha``."""
    name: str = "ttest"
    alpha: float = 0.05

    @property
    def min_n(self) -> int:
        if self.name == "wilcoxon":  # exact two-sided p >= 2 / 2^n
            return max(1, math.ceil(math.log2(2.0 / self.alpha)))
        return 2

    @property
    def label(self) -> str:
        kind = "paired t-test" if self.name == "ttest" else "Wilcoxon signed-rank test (exact)"
        return f"two-sided {kind} over seeds (minimum {self.min_n} paired seeds)"

    def p_value(self, x: np.ndarray, y: np.ndarray) -> float:
        """Two-sided p of x vs y paired; NaN below the minimum n. Identical pairs: p = 1."""
        x, y = np.asarray(x, float), np.asarray(y, float)
        if len(x) < self.min_n:
            return math.nan
        d = x - y
        if np.allclose(d, 0.0, atol=1e-12):
            return 1.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if self.name == "wilcoxon":
                return float(sps.wilcoxon(x, y, zero_method="wilcox", alternative="two-sided",
                                          method="auto").pvalue)
            p = float(sps.ttest_rel(x, y).pvalue)
        # differences of one constant non-zero value: t is infinite, the difference certain
        return 0.0 if math.isnan(p) and np.ptp(d) < 1e-12 else p


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment (Holm 1979): sort the m p-values ascending, p_(i) ->
    max_{j<=i} min(1, (m - j + 1) p_(j)). NaN (untested) stays NaN and does not count in m."""
    p = np.asarray(pvalues, float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def bootstrap_ci(values, level: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean over seeds (as rliable reports for RL
    benchmarks), from a seeded generator: deterministic. (NaN, NaN) with fewer than 2 values."""
    values = np.asarray([v for v in values if not math.isnan(v)], float)
    if len(values) < 2:
        return math.nan, math.nan
    if np.ptp(values) == 0:
        return float(values[0]), float(values[0])
    res = sps.bootstrap((values,), np.mean, confidence_level=level, n_resamples=n_resamples,
                        method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


# ---------------------------------------------------------------- per column: against the best


def seed_matrix(cell_values: dict) -> dict:
    """{row: {seed: value}} with NaN values dropped."""
    return {row: {s: v for s, v in seeds.items() if not math.isnan(v)} for row, seeds in cell_values.items()}


def pairs(a: dict, b: dict) -> tuple[np.ndarray, np.ndarray]:
    common = sorted(set(a) & set(b), key=str)
    return np.array([a[s] for s in common], float), np.array([b[s] for s in common], float)


def against_best(column: dict, test: Test) -> dict:
    """For one column {row: {seed: value}}: the best row (highest mean among the rows with the most
    seeds: a row that lost seeds, e.g. to a divergence, is no reference), and for every other row
    the paired p-value against it, Holm-adjusted over the column's comparisons, the number of
    pairs, and whether it is not significantly worse (``tie``) at ``test.alpha``."""
    column = {r: s for r, s in seed_matrix(column).items() if s}
    if not column:
        return {}
    means = {r: float(np.mean(list(s.values()))) for r, s in column.items()}
    most = max(len(s) for s in column.values())
    best = max((r for r in means if len(column[r]) == most), key=lambda r: (means[r], str(r)))
    others = [r for r in column if r != best]
    raw, n_pairs = [], []
    for row in others:
        x, y = pairs(column[row], column[best])
        n_pairs.append(len(x))
        raw.append(test.p_value(x, y))
    adjusted = holm(raw)
    out = {best: {"best": True, "p": math.nan, "p_holm": math.nan, "n_pairs": len(column[best]), "tie": True,
                  "tested": True}}
    for row, p, ph, n in zip(others, raw, adjusted, n_pairs):
        tested = not math.isnan(p)
        out[row] = {"best": False, "p": p, "p_holm": ph, "n_pairs": n, "tested": tested,
                    "tie": tested and ph >= test.alpha}
    return out


# ---------------------------------------------------------------- across the columns of a table


def ranks(means: pd.DataFrame) -> pd.DataFrame:
    """Rank of each row (method) in each column (cell) by mean, 1 = highest, ties averaged."""
    return means.rank(axis=0, ascending=False, method="average")


def complete_block(means: pd.DataFrame, min_rows: int = 3) -> tuple[pd.DataFrame, list, list]:
    """The largest part of a rows x columns table of means without gaps, found by dropping the row
    with the most gaps while that leaves fewer than 2 complete columns: (table, dropped rows,
    dropped columns). Rows without gaps are never dropped (with a single column nothing helps)."""
    table, dropped_rows = means.copy(), []
    while len(table) > min_rows and table.notna().all(axis=0).sum() < 2:
        gaps = table.isna().sum(axis=1)
        if gaps.max() == 0:
            break
        worst = gaps.idxmax()
        dropped_rows.append(worst)
        table = table.drop(index=worst)
    full = table.columns[table.notna().all(axis=0)]
    return table[full], dropped_rows, [c for c in means.columns if c not in full]


def nemenyi_cd(k: int, n: int, alpha: float = 0.05) -> float:
    """Critical difference of mean ranks (Nemenyi test, Demšar 2006 Eq. 2): q_α √(k(k+1)/(6N)),
    with q_α the studentized range quantile at k groups and infinite degrees of freedom over √2."""
    q = sps.studentized_range.ppf(1.0 - alpha, k, np.inf) / math.sqrt(2.0)
    return float(q * math.sqrt(k * (k + 1) / (6.0 * n)))


def friedman(means: pd.DataFrame, alpha: float = 0.05) -> dict:
    """Mean rank of every row over the complete columns, the Friedman test (rows = treatments,
    columns = blocks; at least 3 rows and 2 columns) and the Nemenyi critical difference."""
    block, dropped_rows, dropped_cols = complete_block(means)
    out = {"rows": list(block.index), "columns": list(block.columns), "dropped_rows": dropped_rows,
           "dropped_columns": dropped_cols, "k": len(block), "n": len(block.columns)}
    if len(block) < 2 or len(block.columns) < 1:
        return {**out, "status": NOT_ENOUGH, "mean_rank": {}}
    mean_rank = ranks(block).mean(axis=1).sort_values()
    out["mean_rank"] = {r: float(v) for r, v in mean_rank.items()}
    if len(block) < 3 or len(block.columns) < 2:
        return {**out, "status": f"{NOT_ENOUGH}: the Friedman test needs 3 methods and 2 cells without gaps "
                                 f"(have {len(block)} and {len(block.columns)})"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = sps.friedmanchisquare(*block.to_numpy(float))
    stat, p = float(res.statistic), float(res.pvalue)
    if math.isnan(p):  # every column ranks the rows identically up to ties of all: no evidence
        stat, p = 0.0, 1.0
    return {**out, "status": "ok", "statistic": stat, "p": p,
            "cd": nemenyi_cd(len(block), len(block.columns), alpha), "alpha": alpha}


def win_tie_loss(columns: dict, test: Test) -> tuple[pd.DataFrame, pd.DataFrame]:
    """{column: {row: {seed: value}}} -> (matrix of "w/t/l" texts, long form). Each (A, B, column)
    with enough paired seeds is a win for A when A's mean is higher and the paired test rejects at
    α (uncorrected: each cell answers its own question), a loss in the mirror case, a tie when the
    test does not reject; pairs below the test's minimum count as untested."""
    rows = list(dict.fromkeys(r for col in columns.values() for r in col))
    counts = {(a, b): [0, 0, 0, 0] for a in rows for b in rows if a != b}
    for column in columns.values():
        column = {r: s for r, s in seed_matrix(column).items() if s}
        for a in column:
            for b in column:
                if a == b:
                    continue
                x, y = pairs(column[a], column[b])
                p = test.p_value(x, y)
                if math.isnan(p):
                    counts[(a, b)][3] += 1
                elif p >= test.alpha:
                    counts[(a, b)][1] += 1
                else:
                    counts[(a, b)][0 if x.mean() > y.mean() else 2] += 1
    long = pd.DataFrame([{"row": a, "against": b, "win": w, "tie": t, "loss": l, "untested": u}
                         for (a, b), (w, t, l, u) in counts.items()],
                        columns=["row", "against", "win", "tie", "loss", "untested"])
    text = pd.DataFrame("", index=rows, columns=rows, dtype=object)
    for (a, b), (w, t, l, u) in counts.items():
        text.loc[a, b] = f"{w}/{t}/{l}" + (f" ({u} untested)" if u else "")
    for r in rows:
        text.loc[r, r] = "—"
    return text, long


def tested_matrix(text: pd.DataFrame, long: pd.DataFrame, columns: dict,
                  test: Test) -> tuple[pd.DataFrame | None, str]:
    """The win/tie/loss matrix of :func:`win_tie_loss` shown only where a pair was tested: the rows
    (and columns) with at least one tested pair, and a line on what is left out; no pair tested
    anywhere: (None, why not), never a wall of "0/0/0 (k untested)"."""
    decided = long[long[["win", "tie", "loss"]].sum(axis=1) > 0] if len(long) else long
    if decided.empty:
        most = max((len(s) for col in columns.values() for s in seed_matrix(col).values()), default=0)
        if len(text) < 2:
            why = "fewer than 2 rows"
        elif most <= 1:
            why = (f"every cell has n = {most} seed{'s' if most != 1 else ''}; the {test.label} needs "
                   f"≥ {test.min_n} seeds per method, paired")
        else:
            why = f"no two rows share {test.min_n} completed seeds in any cell ({test.label})"
        return None, f"No win/tie/loss matrix: no pair tested ({why})."
    tested = set(decided["row"]) | set(decided["against"])
    keep = [r for r in text.index if r in tested]
    left = [str(r) for r in text.index if r not in tested]
    line = f"Left out of the matrix (no tested pair): {', '.join(left)}." if left else ""
    return text.loc[keep, keep], line


def agreement(table: pd.DataFrame, rows: str) -> dict:
    """Kendall τ_b between our mean and the paper's mean over the rows of every column that has
    both for at least 2 rows, and pooled: Σ(concordant − discordant) / Σ pairs over the columns
    (the pair-weighted mean of the columns' τ_a), with the count of pairs in the same order."""
    cells, conc, disc, total = [], 0, 0, 0
    for column, part in table.groupby("column", sort=False):
        part = part[part["mean"].notna() & part["paper_mean"].notna()]
        if len(part) < 2:
            continue
        ours, paper = part["mean"].to_numpy(float), part["paper_mean"].to_numpy(float)
        c, d = _concordance(ours, paper)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = sps.kendalltau(ours, paper)
        m = len(part) * (len(part) - 1) // 2
        cells.append({"column": column, "n_methods": len(part), "tau": float(res.statistic),
                      "p": float(res.pvalue), "concordant": c, "discordant": d, "pairs": m,
                      "ours": " > ".join(map(str, part.sort_values("mean", ascending=False)[rows])),
                      "paper": " > ".join(map(str, part.sort_values("paper_mean", ascending=False)[rows]))})
        conc, disc, total = conc + c, disc + d, total + m
    pooled = {"tau": (conc - disc) / total if total else math.nan, "concordant": conc, "discordant": disc,
              "pairs": total, "columns": len(cells)}
    return {"cells": cells, "pooled": pooled}


def _concordance(x: np.ndarray, y: np.ndarray) -> tuple[int, int]:
    c = d = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            s = np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
            c, d = c + (s > 0), d + (s < 0)
    return int(c), int(d)


def friedman_text(fr: dict) -> str:
    """The Friedman / Nemenyi result of ``friedman`` in one sentence (report.md, report.html)."""
    if fr.get("status") != "ok":
        return str(fr.get("status", NOT_ENOUGH)) + "."
    dropped = ""
    if fr["dropped_rows"] or fr["dropped_columns"]:
        dropped = (f" (cells without gaps only: left out {len(fr['dropped_rows'])} row(s), "
                   f"{len(fr['dropped_columns'])} column(s))")
    approx = " (χ² approximation, indicative with fewer than 10 cells)" if fr["n"] < 10 else ""
    return (f"χ²_F = {fr['statistic']:.2f}, p = {fr['p']:.3g}{approx} over k = {fr['k']} methods and N = {fr['n']} "
            f"cells{dropped}; Nemenyi critical difference at α = {fr['alpha']:g}: CD = {fr['cd']:.2f} "
            "(methods whose mean ranks differ by less are not significantly different; cd_diagram.png).")


def agreement_text(ag: dict) -> str:
    """The Kendall agreement with the paper's ordering in one sentence (report.md, report.html)."""
    pooled = ag["pooled"]
    if not ag["cells"]:
        return f"{NOT_ENOUGH}: no cell has ours and the paper's value for 2 methods or more."
    per = "; ".join(f"{c['column']} τ = {c['tau']:.2f} ({c['n_methods']} methods)" for c in ag["cells"])
    return (f"Kendall τ_b per cell: {per}. Pooled over {pooled['columns']} cell(s): τ = {pooled['tau']:.2f} "
            f"({pooled['concordant']} of {pooled['pairs']} method pairs in the paper's order, "
            f"{pooled['discordant']} reversed). agreement.csv has every cell.")
