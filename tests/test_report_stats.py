"""The report's statistics against closed-form values: Holm on hand-made p-values, the paired tests,
Friedman and the Nemenyi critical difference on a constructed table, Kendall τ per cell and pooled,
the bootstrap CI, win/tie/loss counts."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fedlnl.benchmark.report import plots
from fedlnl.benchmark.report import stats, tables


def test_holm_on_hand_made_p_values():
    # m = 3 tested: sorted 0.01, 0.03, 0.04 -> 3 * 0.01 = 0.03, 2 * 0.03 = 0.06, max(0.06, 1 * 0.04) = 0.06
    adjusted = stats.holm([0.01, 0.04, 0.03, math.nan])
    np.testing.assert_allclose(adjusted[:3], [0.03, 0.06, 0.06])
    assert math.isnan(adjusted[3])  # untested stays untested and does not count in m
    np.testing.assert_allclose(stats.holm([0.5, 0.9]), [1.0, 1.0])  # capped at 1
    assert stats.holm([]).size == 0


def test_paired_t_test_against_its_closed_form():
    # differences (1, 2, 3): t = 2 / (1 / sqrt 3) = 2 sqrt 3 on 2 df; for 2 df the t CDF is
    # 1/2 + t / (2 sqrt(t^2 + 2)), so the two-sided p is 1 - t / sqrt(t^2 + 2)
    t = 2 * math.sqrt(3)
    p = stats.Test().p_value([11.0, 12.0, 13.0], [10.0, 10.0, 10.0])
    assert p == pytest.approx(1 - t / math.sqrt(t * t + 2))
    assert stats.Test().p_value([1.0, 2.0], [1.0, 2.0]) == 1.0  # identical results: no difference
    assert stats.Test().p_value([3.0, 4.0], [1.0, 2.0]) == 0.0  # one constant difference: certain
    assert math.isnan(stats.Test().p_value([3.0], [1.0]))  # one pair: below the minimum of 2


def test_wilcoxon_minimum_n_follows_alpha():
    assert stats.Test("wilcoxon", 0.05).min_n == 6 and stats.Test("wilcoxon", 0.1).min_n == 5
    assert stats.Test("ttest").min_n == 2
    x = np.arange(6, dtype=float)
    assert math.isnan(stats.Test("wilcoxon").p_value(x[:5] + 1, x[:5]))  # 5 pairs: p >= 1/16, never < 0.05
    # six positive differences of distinct sizes: exact two-sided p = 2 / 2^6
    assert stats.Test("wilcoxon").p_value(x + np.arange(1, 7), x) == pytest.approx(2 / 64)


def test_a_row_that_lost_seeds_is_never_the_reference():
    """The quickstart's (0.6, 0.5): fedcorr_fedprox's seed 1 diverged, its one seed had the highest
    mean; the reference of the column is the best row with every seed, so the others stay testable."""
    column = {"lost": {0: 96.1}, "a": {0: 94.0, 1: 94.9, 2: 94.4}, "b": {0: 93.0, 1: 95.0, 2: 94.1}}
    res = stats.against_best(column, stats.Test())
    assert res["a"]["best"] and not res["lost"]["best"] and res["b"]["tested"]
    table = pd.DataFrame({"column": ["c"] * 3, "row": ["lost", "a", "b"], "mean": [96.1, 94.43, 94.03],
                          "std": [0.0, 0.4, 0.8], "n": [1, 3, 3], "n_incomplete": [1, 0, 0],
                          "ci_low": [float("nan")] * 3, "ci_high": [float("nan")] * 3})
    _texts, bold = tables.accuracy_grid(table, "row")
    assert bold.loc["a", "c"] and not bold.loc["lost", "c"] and not bold.loc["b", "c"]


def test_against_best_pairs_common_seeds_and_corrects():
    column = {"a": {0: 80.0, 1: 82.0, 2: 84.0}, "b": {0: 70.0, 1: 73.0, 2: 74.0}, "c": {0: 79.0, 1: 83.0},
              "d": {3: 10.0}}
    res = stats.against_best(column, stats.Test())
    assert res["a"]["best"] and not res["b"]["best"]
    assert res["c"]["n_pairs"] == 2 and res["b"]["n_pairs"] == 3 and res["d"]["n_pairs"] == 0
    assert not res["d"]["tested"] and not res["d"]["tie"]  # no common seed: not tested, no mark
    # b - a = (-10, -9, -10): p from the t-test, Holm over the 2 tested comparisons
    p_b = stats.Test().p_value([70, 73, 74], [80, 82, 84])
    p_c = stats.Test().p_value([79, 83], [80, 82])
    assert res["b"]["p"] == pytest.approx(p_b)
    assert res["b"]["p_holm"] == pytest.approx(min(1, 2 * p_b)) and p_b < p_c
    assert res["c"]["p_holm"] == pytest.approx(max(min(1, 2 * p_b), p_c))
    assert not res["b"]["tie"] and res["c"]["tie"]


def test_friedman_and_nemenyi_on_a_constructed_table():
    # 3 methods always ranked a < b < c over N = 4 cells: chi2_F = 12N/(k(k+1)) sum R^2 - 3N(k+1)
    # = 4 * 14 - 48 = 8; chi-square with 2 df: p = exp(-8/2)
    means = pd.DataFrame({f"c{i}": [90.0 - i, 80.0 - i, 70.0 - i] for i in range(4)}, index=["a", "b", "c"])
    fr = stats.friedman(means)
    assert fr["status"] == "ok" and fr["mean_rank"] == {"a": 1.0, "b": 2.0, "c": 3.0}
    assert fr["statistic"] == pytest.approx(8.0) and fr["p"] == pytest.approx(math.exp(-4))
    # q_0.05 for k = 3 is 2.343 (Demšar 2006, Table 5): CD = 2.343 sqrt(3 * 4 / (6 * 4))
    assert fr["cd"] == pytest.approx(2.343 * math.sqrt(0.5), abs=1e-3)
    assert stats.nemenyi_cd(10, 1) == pytest.approx(3.164 * math.sqrt(110 / 6), abs=1e-2)


def test_friedman_says_not_enough_and_uses_the_block_without_gaps():
    two = pd.DataFrame({"c0": [1.0, 2.0], "c1": [2.0, 1.0]}, index=["a", "b"])
    assert stats.friedman(two)["status"].startswith(stats.NOT_ENOUGH)
    one = pd.DataFrame({"c0": [1.0, 2.0, 3.0]}, index=["a", "b", "c"])
    assert stats.friedman(one)["status"].startswith(stats.NOT_ENOUGH)
    gaps = pd.DataFrame({"c0": [3.0, 2.0, 1.0, np.nan], "c1": [3.0, 2.0, 1.0, np.nan], "c2": [3.0, 1.0, 2.0, 5.0]},
                        index=["a", "b", "c", "d"])
    fr = stats.friedman(gaps)  # d has a value in one cell only: left out, 2 complete cells remain
    assert fr["dropped_rows"] == ["d"] and fr["columns"] == ["c0", "c1", "c2"] and fr["status"] == "ok"


def test_kendall_agreement_per_cell_and_pooled():
    table = pd.DataFrame({"method": ["a", "b", "c", "a", "b", "c"], "column": ["x"] * 3 + ["y"] * 3,
                          "mean": [90.0, 80.0, 70.0, 60.0, 50.0, np.nan],
                          "paper_mean": [85.0, 75.0, 80.0, 70.0, 65.0, 50.0]})
    ag = stats.agreement(table, "method")
    x, y = ag["cells"]
    # x: (a,b) and (a,c) in the same order, (b,c) reversed: tau = (2 - 1) / 3; y: a > b in both
    assert (x["tau"], x["concordant"], x["discordant"]) == (pytest.approx(1 / 3), 2, 1)
    assert (y["tau"], y["n_methods"]) == (pytest.approx(1.0), 2)
    assert ag["pooled"] == {"tau": pytest.approx(0.5), "concordant": 3, "discordant": 1, "pairs": 4, "columns": 2}
    assert x["ours"] == "a > b > c" and x["paper"] == "a > c > b"


def test_bootstrap_ci_is_seeded_and_closed_form_for_two_seeds():
    assert stats.bootstrap_ci([80.0, 84.0]) == (80.0, 84.0)  # resampled means a, (a+b)/2, b: 1/4, 1/2, 1/4
    values = [70.0, 71.5, 75.0, 69.0, 72.0]
    a, b = stats.bootstrap_ci(values), stats.bootstrap_ci(values)
    assert a == b and min(values) < a[0] < np.mean(values) < a[1] < max(values)
    assert all(math.isnan(v) for v in stats.bootstrap_ci([70.0]))
    assert stats.bootstrap_ci([70.0, 70.0, 70.0]) == (70.0, 70.0)


def test_win_tie_loss_counts():
    columns = {
        "x": {"a": {0: 90.0, 1: 91.0, 2: 92.0}, "b": {0: 80.0, 1: 81.0, 2: 82.0}},  # constant +10: a wins
        "y": {"a": {0: 90.0, 1: 70.0, 2: 80.0}, "b": {0: 80.0, 1: 81.0, 2: 79.0}},  # noisy: tie
        "z": {"a": {0: 90.0}, "b": {0: 80.0}},  # one pair: untested
    }
    text, long = stats.win_tie_loss(columns, stats.Test())
    row = long.set_index(["row", "against"]).loc[("a", "b")]
    assert (row["win"], row["tie"], row["loss"], row["untested"]) == (1, 1, 0, 1)
    assert text.loc["a", "b"] == "1/1/0 (1 untested)" and text.loc["b", "a"] == "0/1/1 (1 untested)"
    assert text.loc["a", "a"] == "—"


def test_cd_cliques_join_methods_closer_than_the_cd(tmp_path):
    assert plots.cd_cliques({"a": 1.0, "b": 1.5, "c": 3.0}, 1.0) == [(0, 1)]
    assert plots.cd_cliques({"a": 1.0, "b": 1.8, "c": 2.6}, 1.0) == [(0, 1), (1, 2)]
    assert plots.cd_cliques({"a": 1.0, "b": 3.0}, 1.0) == []
    path = plots.plot_cd_diagram({"a": 1.0, "b": 1.8, "c": 2.6, "d": 3.6}, 1.0, tmp_path / "cd.png", "title")
    assert path.read_bytes()[:4] == b"\x89PNG"
