"""The report's listing of tuned values (fedlnl/benchmark/report/tuning.py)."""
from __future__ import annotations

import pandas as pd

from fedlnl.benchmark.report.loading import _flatten
from fedlnl.benchmark.report.tuning import tuned_lines, tuned_section


def frame(*summaries) -> pd.DataFrame:
    return pd.DataFrame([_flatten(s) for s in summaries], dtype=object)


def run(method, seed, tuned=None):
    return {"method": method, "seed": seed, "status": "complete", "best_acc": 0.5, "tuned": tuned}


def record(values, trials=20, best=0.8123):
    return {"values": values, "trials": trials, "objective": "selected_val_acc",
            "source": "x/optimization_results.yaml", "best_value": best, "tuned_on": {"dataset": "digits"}}


def test_one_row_per_method_with_its_values_budget_and_objective():
    lines = tuned_lines(frame(run("fedprox", 0, record({"fl.lr": 0.0213456, "method.mu": 0.01})),
                              run("fedprox", 1, record({"fl.lr": 0.0213456, "method.mu": 0.01})),
                              run("fedavg", 0, record({"fl.lr": 0.07})), run("krum", 0)))
    assert lines[0] == ("Tuned values (tuned=): 20 trials per method (the same budget for every tuned method), each "
                        "chosen by the best selected_val_acc of its study on the tuning cell (noisy validation, never "
                        "the test set); not tuned: krum.")
    assert lines[2:] == ["| method | values | trials | best selected_val_acc | from |", "|---|---|---|---|---|",
                         "| fedavg | fl.lr=0.07 | 20 | 81.2 | x/optimization_results.yaml |",
                         "| fedprox | fl.lr=0.02135, method.mu=0.01 | 20 | 81.2 | x/optimization_results.yaml |"]


def test_unequal_budgets_are_named_and_untuned_reports_say_nothing():
    lines = tuned_lines(frame(run("fedprox", 0, record({"fl.lr": 0.02}, trials=20)),
                              run("fedavg", 0, record({"fl.lr": 0.07}, trials=5))))
    assert "UNEQUAL budgets: 5, 20 trials" in lines[0]
    assert tuned_lines(frame(run("fedavg", 0), run("fedprox", 0))) == []
    assert tuned_section(frame(run("fedavg", 0))) == ""
