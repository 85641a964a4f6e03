"""fedlnl-report and the protocol of issue 33: test accuracy at the round selected on noisy validation
(selected_acc, the default when every run has it), every table naming its metric, per-client accuracy
(clients.{md,csv}, clients.png); the clean-data control of issue 32; no win/tie/loss wall with one
seed; output errors on stderr and an interrupted report that says so."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlnl.benchmark import report
from fedlnl.benchmark.report import clients, control, metric, plots
from fedlnl.methods.common.families import FAMILIES
from test_report import REFERENCE, cell, md_rows, summary, write_run

REPO = Path(__file__).resolve().parents[1]

#: (method, (rho, tau)) -> per seed: best_acc, selected_acc
SELECTED = {
    ("fedavg", (0.4, 0.0)): [(0.80, 0.78), (0.84, 0.80)],
    ("fedavg", (0.6, 0.5)): [(0.70, 0.66), (0.76, 0.70)],
    ("fedcorr", (0.4, 0.0)): [(0.78, 0.77), (0.80, 0.79)],
    ("fedcorr", (0.6, 0.5)): [(0.88, 0.85), (0.86, 0.85)],
}


def selected_summary(method, noise, seed, best, selected, clients=True) -> dict:
    """A summary of issue 33's runner: selected_acc at round 7, per-client accuracies of 4 clients
    (2 noisy at (0.6,0.5)); client figures are functions of the seed, so their means are closed form."""
    s = summary(method, noise, seed, best, (10, None))
    s.update(selected_acc=selected, selected_round=7, selected_val_acc=selected - 0.1, reported_round=7,
             family=FAMILIES[0] if method == "fedavg" else FAMILIES[3])
    s["config"]["selection"] = {"val_share": 0.1}
    if clients:
        noisy = [False, False, noise[0] > 0, noise[0] > 0]
        acc = [selected + 0.02, selected, selected - 0.02 * seed, selected - 0.1]
        rate = [0.0, 0.0, 0.5 * noisy[2], 0.8 * noisy[3]]
        s.update(client_acc_mean=float(np.mean(acc)), client_acc_worst10=min(acc),
                 client_gap=0.1 * (seed + 1), clients={"acc": acc, "noise_rate": rate, "noisy": noisy})
    return s


@pytest.fixture
def selected_sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for (method, noise), seeds in SELECTED.items():
        for seed, (best, selected) in enumerate(seeds):
            write_run(root / f"{method}_{noise[0]}_{noise[1]}" / str(seed),
                      selected_summary(method, noise, seed, best, selected), best)
    return root


# ---------------------------------------------------------------- the metric and its default


def frame_of(values: list, status: str = "complete") -> pd.DataFrame:
    return pd.DataFrame([{"status": status, "method": "m", "selected_acc": v} for v in values], dtype=object)


def test_default_metric_is_selected_acc_only_when_every_complete_run_has_one():
    assert metric.default_metric(frame_of([0.5, 0.6])).main == "selected_acc"
    assert metric.default_metric(frame_of([0.5, 0.6])).beside == "last10_acc"
    none = metric.default_metric(frame_of([None, None]))
    assert (none.main, none.why) == ("best_acc", "")  # the papers' protocol, nothing to explain
    assert metric.default_metric(pd.DataFrame([{"status": "complete", "method": "m"}])).main == "best_acc"
    mixed = metric.default_metric(frame_of([0.5, None, 0.7]))
    assert mixed.main == "best_acc" and mixed.why.startswith(
        "metric: best_acc, not selected_acc: 2 of 3 complete run(s) have a selected_acc, 1 have none")
    # a failed run without selected_acc does not count
    both = pd.concat([frame_of([0.5]), frame_of([None], status="failed")], ignore_index=True)
    assert metric.default_metric(both).main == "selected_acc"
    assert metric.resolve_metric("selected") == metric.Metric("selected_acc", "last10_acc")
    assert metric.Metric("selected_acc").paper == "best_acc" and metric.Metric("final_acc").paper == "final_acc"


def test_selected_metric_builds_every_table_and_each_names_its_metric(selected_sweep: Path, tmp_path: Path, capsys):
    (tmp_path / "ref.csv").write_text(REFERENCE)
    assert report.main([str(selected_sweep), "--reference", str(tmp_path / "ref.csv")]) == 0  # the default
    out = selected_sweep / "report"
    md = (out / "accuracy.md").read_text()
    described = ("Metric (%): test accuracy at the round of best noisy-validation accuracy (selected_acc; the round "
                 "is chosen without the test set); beside it (columns suffixed last10_acc), mean of the last 10 "
                 "evaluations (last10_acc); mean ± std")
    assert md.startswith(described)
    assert "| method | (0.4,0) | (0.4,0) last10_acc | (0.6,0.5) | (0.6,0.5) last10_acc |" in md.splitlines()
    rows = md_rows(md)
    # selected_acc, not best_acc: fedavg (0.4,0) = 79.00 ± 1.00 against the paper's best 85.00
    assert f"**{cell([0.78, 0.80])} (n=2); paper 85.00 ± 1.00, Δ -6.00**" in rows["fedavg"]
    assert f"**{cell([0.85, 0.85])} (n=2); paper 90.00 ± 0.50, Δ -5.00**" in rows["fedcorr"]
    assert "The paper values are the papers' best_acc (best test accuracy over all evaluations" in md
    csv = pd.read_csv(out / "accuracy.csv")
    assert set(csv["metric"]) == {"selected_acc", "last10_acc"}
    line = csv[(csv.method == "fedavg") & (csv.column == "(0.6,0.5)") & (csv.metric == "selected_acc")].iloc[0]
    assert (line["mean"], line["std"]) == (pytest.approx(68.0), pytest.approx(2.0))
    assert (out / "accuracy.tex").read_text().startswith("% " + described)
    stats_md = (out / "stats.md").read_text()
    assert stats_md.startswith("# Statistics of selected_acc\n\nMetric: test accuracy at the round of best "
                               "noisy-validation accuracy (selected_acc; the round is chosen without the test set)")
    assert set(pd.read_csv(out / "ranks.csv")["metric"]) == {"selected_acc"}
    assert set(pd.read_csv(out / "wtl.csv")["metric"]) == {"selected_acc"}
    agreement = pd.read_csv(out / "agreement.csv")
    assert set(agreement["metric"]) == {"selected_acc"} and set(agreement["paper_metric"]) == {"best_acc"}
    assert json.loads((out / "stats.json").read_text())["metric"] == "selected_acc"
    page = (out / "report.html").read_text()
    assert "Metric: <b>selected_acc, last10_acc</b>" in page and described.split("; mean")[0] in page
    assert "Communication cost to reach 50% test accuracy" in (out / "comm.md").read_text()
    default = md
    # --metric selected_acc and --metric selected: the same tables
    for name in ("selected_acc", "selected"):
        assert report.main([str(selected_sweep), "--reference", str(tmp_path / "ref.csv"), "--metric", name,
                            "--figures", "none"]) == 0
        assert (out / "accuracy.md").read_text() == default
    # --metric best_acc names the papers' protocol
    assert report.main([str(selected_sweep), "--metric", "best_acc", "--figures", "none"]) == 0
    assert (out / "accuracy.md").read_text().startswith(
        "Metric (%): best test accuracy over all evaluations (best_acc; the papers' protocol: the round is chosen on "
        "the test set); beside it")
    capsys.readouterr()


def test_runs_mixing_both_protocols_default_to_best_acc_and_say_why(selected_sweep: Path):
    path = selected_sweep / "fedavg_0.4_0.0" / "0" / "summary.json"
    s = json.loads(path.read_text())
    s["selected_acc"] = None  # a run without a validation set
    path.write_text(json.dumps(s))
    assert report.main([str(selected_sweep), "--figures", "none"]) == 0
    md = (selected_sweep / "report" / "accuracy.md").read_text()
    assert md.startswith("Metric (%): best test accuracy over all evaluations (best_acc;")
    assert ("- metric: best_acc, not selected_acc: 7 of 8 complete run(s) have a selected_acc, 1 have none (no "
            "validation set, selection.val_share = 0") in md
    assert report.main([str(selected_sweep), "--metric", "selected_acc", "--figures", "none"]) == 0
    md = (selected_sweep / "report" / "accuracy.md").read_text()
    assert ("- 1 of 8 complete run(s) have no selected_acc (null: no validation set, selection.val_share = 0, or a "
            "summary written before the runner recorded it): missing in its columns, shown in the last10_acc "
            "columns") in md
    # seed 1's 80.00 alone; not bold: the column's reference is a row with both seeds (stats.against_best)
    assert f"| {cell([0.80])} (n=1) |" in md_rows(md)["fedavg"]


def test_selected_round_is_marked_on_the_run_curve(tmp_path: Path, monkeypatch):
    run = tmp_path / "run"
    write_run(run, selected_summary("fedavg", (0.0, 0.0), 0, 0.8, 0.7), 0.8)
    seen = {}

    def spy(cost, acc, stages, path, title="", ylabel="", selected=None):
        seen.update(selected=selected, cost=cost[selected])
        return None
    monkeypatch.setattr(plots, "plot_run_curve", spy)
    report.run_figures(run, tmp_path / "out", "t")
    assert seen == {"selected": 6, "cost": 70.0}  # round 7 = the 7th evaluation, at cost 10 x 7


# ---------------------------------------------------------------- per-client accuracy


def test_client_table_is_mean_and_std_over_seeds_at_the_reported_round(selected_sweep: Path):
    assert report.main([str(selected_sweep)]) == 0
    out = selected_sweep / "report"
    csv = pd.read_csv(out / "clients.csv")
    assert list(csv.columns[:3]) == ["method", "family", "column"]
    cell_ = csv[(csv.method == "fedcorr") & (csv.column == "(0.6,0.5)")].set_index("score")
    # seeds 0, 1: selected 0.85 both; acc = (0.87, 0.85, 0.85 - 0.02 seed, 0.75)
    means = [np.mean([0.87, 0.85, 0.85 - 0.02 * k, 0.75]) for k in (0, 1)]
    assert cell_.loc["client_acc_mean", "mean"] == pytest.approx(100 * np.mean(means))
    assert cell_.loc["client_acc_mean", "std"] == pytest.approx(100 * np.std(means))
    assert cell_.loc["client_acc_worst10", "mean"] == pytest.approx(75.0)
    assert (cell_.loc["client_gap", "mean"], cell_.loc["client_gap", "std"]) == (pytest.approx(15.0),
                                                                                 pytest.approx(5.0))
    md = (out / "clients.md").read_text()
    assert md.startswith("Per-client test accuracy in %, mean ± std (ddof=0) over seeds: client_acc_mean = the mean "
                         "over clients, client_acc_worst10 = the mean of the worst 10 % of clients, client_gap")
    assert "reported_round: the round of best noisy-validation accuracy (the selected round)." in md
    assert f"*{FAMILIES[0]}*" in md and "| fedcorr | " in md and "(0.6,0.5): client_gap" in md.splitlines()[2]
    assert "15.00 ± 5.00 (n=2)" in md_rows(md)["fedcorr"]
    assert 'data-name="clients"' in (out / "report.html").read_text()
    png = out / "clients.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and 'data-name="clients.png"' in (out / "report.html").read_text()
    points = clients.client_points(report.load_summaries(selected_sweep))
    assert [row for row, _ in points] == ["fedavg", "fedcorr"]
    rate, acc, noisy = points[1][1]["(0.6,0.5)"]  # the lowest seed: seed 0
    np.testing.assert_allclose(acc, [87.0, 85.0, 85.0, 75.0])
    assert rate.tolist() == [0.0, 0.0, 0.5, 0.8] and noisy.tolist() == [False, False, True, True]


def test_without_client_keys_no_table_and_one_line(selected_sweep: Path):
    for path in selected_sweep.rglob("summary.json"):
        s = json.loads(path.read_text())
        for key in ("client_acc_mean", "client_acc_worst10", "client_gap", "clients", "selected_acc"):
            s.pop(key)
        path.write_text(json.dumps(s))
    assert report.main([str(selected_sweep)]) == 0
    out = selected_sweep / "report"
    assert not (out / "clients.md").exists() and not (out / "clients.csv").exists()
    assert not (out / "clients.png").exists() and 'data-name="clients"' not in (out / "report.html").read_text()
    assert ("- no per-client table (clients.md) nor clients.png: no summary.json records client_acc_mean, "
            "client_acc_worst10 or client_gap" in (out / "accuracy.md").read_text())


def test_best_test_round_without_validation_and_a_mix():
    base = {"status": "complete", "method": "m", "client_acc_mean": 0.5}
    without = pd.DataFrame([{**base, "selected_acc": None}] * 2, dtype=object)
    assert clients.reported_round(without) == "the round of best test accuracy (no validation set)"
    mixed = pd.DataFrame([{**base, "selected_acc": None}, {**base, "selected_acc": 0.4}], dtype=object)
    assert clients.reported_round(mixed) == (
        "the round of best noisy-validation accuracy (the selected round) for the 1 run(s) with a validation set, "
        "the round of best test accuracy (no validation set) for the other 1")


def test_clients_figure_of_31_methods(tmp_path: Path):
    """31 methods in 5 families, 2 settings of 100 clients: one panel per method; the PNG is kept in
    tests/artifacts/clients_31.png for a look."""
    rng = np.random.default_rng(0)
    panels, groups = [], {}
    for i in range(31):
        name = f"method_{i:02d}"
        groups[name] = FAMILIES[i * 5 // 31]
        noisy = rng.random(100) < 0.6
        rate = np.where(noisy, rng.uniform(0.3, 0.9, 100), 0.0)
        panel = {"(0,0)": (np.zeros(100), rng.normal(80, 4, 100), np.zeros(100, bool)),
                 "(0.6,0.5)": (rate, 75 - 20 * rate * (i % 3) + rng.normal(0, 3, 100), noisy)}
        panels.append((name, panel))
    artifacts = REPO / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    path = plots.plot_clients(panels, artifacts / "clients_31.png", "31 methods", groups)
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 50_000


# ---------------------------------------------------------------- the clean-data control (issue 32)

CLEAN_REFERENCE = """method,variant,dataset,model,partition,rho,tau,p,alpha,target,metric,mean,std,source
fedavg,,digits,,iid,0,0,,,,best_acc,93.11,0.12,T2
rofl,,digits,,iid,0,0,,,,best_acc,88.33,0.07,T2
"""

#: method -> per seed (best_acc, last10_acc) at (0,0); FedAvg's mean best is 60
CLEAN = {
    "fedavg": [(0.59, 0.58), (0.61, 0.60)],
    "fedprox": [(0.56, 0.56), (0.56, 0.56)],  # trails by 4 > 0 + 3: (a)
    "median": [(0.58, 0.58), (0.58, 0.58)],  # trails by 2: passes
    "rofl": [(0.53, 0.53), (0.53, 0.53)],  # trails by 7 < 4.78 + 3 (the papers' gap): passes
    "feddyn": [(0.52, 0.52), (0.52, 0.52)],  # trails by 8 > 4.78 + 3 only without a paper value: (a)
    "feddiv": [(0.62, 0.57), (0.62, 0.59)],  # last-10 4 points below best: (b)
    "fedcorr": [(0.62, 0.60), (0.62, 0.59)],  # 2.5 points: passes
}


def clean_frame(with_fedavg: bool = True) -> pd.DataFrame:
    runs = []
    for method, seeds in CLEAN.items():
        if method == "fedavg" and not with_fedavg:
            continue
        for seed, (best, last) in enumerate(seeds):
            for rho, tau in ((0.0, 0.0), (0.6, 0.5)):
                runs.append({"status": "complete", "method": method, "base_method": method, "seed": seed,
                             "best_acc": best - rho / 2, "last10_acc": last - rho / 2, "final_acc": last,
                             "rho": rho, "tau": tau, "partition": "iid", "dataset": "digits", "comm_cost": 10,
                             "setting.family": "digits"})
    return pd.DataFrame(runs, dtype=object)


def test_clean_control_closed_form():
    checks = control.clean_control(clean_frame(), "method", [], metric.Metric("best_acc"), None)
    assert {c.column for c in checks} == {"(0,0)"}  # the noisy column is never checked
    reasons = {c.row: c.reasons for c in checks}
    assert [m for m, r in reasons.items() if r] == ["feddiv", "feddyn", "fedprox", "rofl"]
    assert reasons["fedprox"] == ["best_acc 56.00 trails fedavg's 60.00 by 4.00 points, more than the papers' gap "
                                  "(+0.00) + 3"]
    assert reasons["feddiv"] == ["last10_acc 58.00 is 4.00 points below best_acc 62.00 (more than 3)"]


def test_clean_control_uses_the_papers_gap_and_needs_fedavg_for_a(tmp_path: Path):
    (tmp_path / "ref.csv").write_text(CLEAN_REFERENCE)
    ref = report.load_reference([tmp_path / "ref.csv"])
    checks = {c.row: c for c in control.clean_control(clean_frame(), "method", [], metric.Metric("best_acc"), ref)}
    assert checks["rofl"].paper_gap == pytest.approx(88.33 - 93.11) and checks["rofl"].reasons == []
    assert checks["feddyn"].paper_gap == 0.0 and len(checks["feddyn"].reasons) == 1  # no paper value for feddyn
    # without FedAvg only (b) applies
    alone = control.clean_control(clean_frame(False), "method", [], metric.Metric("best_acc"), ref)
    assert {c.row: bool(c.reasons) for c in alone} == {"median": False, "fedcorr": False, "feddiv": True,
                                                        "feddyn": False, "fedprox": False, "rofl": False}


def test_clean_control_marks_the_tables_and_writes_the_notes(tmp_path: Path):
    (tmp_path / "ref.csv").write_text(CLEAN_REFERENCE)
    ref = report.load_reference([tmp_path / "ref.csv"])
    md = report.write_report(clean_frame(), tmp_path / "out", reference=ref, figures="none")
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert rows["fedprox"].split(" | ")[1].endswith("(n=2) ‡")  # the (0,0) cell of the main metric
    assert "‡" not in rows["fedprox"].split(" | ", 2)[2]  # not the last-10 nor the noisy column
    assert "‡" in rows["feddiv"] and "‡" in rows["feddyn"] and "‡" not in rows["rofl"] + rows["median"]
    assert ("‡ = degrades clean data (ρ = τ = 0): trails fedavg by more than the papers' own (0,0) gap + 3 points "
            "in best_acc, or its last10_acc is more than 3 points below its best_acc (notes: 3 method(s)).") in md
    assert "- 3 method(s) degrade clean data (‡: at ρ = τ = 0 they trail fedavg by more than" in md
    notes = (tmp_path / "out" / "notes.md").read_text()
    assert "- feddyn / (0,0): best_acc 52.00 trails fedavg's 60.00 by 8.00 points" in notes
    csv = pd.read_csv(tmp_path / "out" / "accuracy.csv")
    flagged = csv[csv["degrades_clean"].fillna(False).astype(bool)]
    assert sorted(flagged["method"]) == ["feddiv", "feddyn", "fedprox"] and set(flagged["column"]) == {"(0,0)"}
    assert "$^\\ddagger$" in (tmp_path / "out" / "accuracy.tex").read_text()
    passing = clean_frame()
    passing = passing[passing["method"].isin(["fedavg", "median"])]
    md = report.write_report(passing, tmp_path / "ok", figures="none")
    assert "Clean-data control (ρ = τ = 0): no method degrades clean data" in md and "‡" not in md


def test_a_round_in_an_earlier_stage_is_named_in_the_notes(selected_sweep: Path):
    """fedcorr's runs at (0.6,0.5) name their stages: seed 0's selected round (7) lies in its warm-up
    (rounds 1-7), seed 1's in its training (warm-up rounds 1-4); fedavg's name none. One note line, for
    that cell only; best_acc's round is the last (write_run's accuracies rise): no line under it."""
    for seed, first in ((0, 8), (1, 5)):
        path = selected_sweep / "fedcorr_0.6_0.5" / str(seed) / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "stage": "warmup" if r["round"] < first else "training"}) + "\n"
                                for r in rows))
    assert report.main([str(selected_sweep), "--figures", "none"]) == 0
    notes = (selected_sweep / "report" / "notes.md").read_text()
    assert ("## 1 cell(s) report selected_acc at a round before the method's last training stage (the figure is "
            "that earlier stage's model, e.g. a warm-up that trains as FedAvg; runs made with selection.stage=any, the "
            "rule before selection.stage=last): fedcorr / (0.6,0.5): 1 of 2 run(s) "
            "at a round of its 'warmup' stage, before its last ('training')") in notes
    assert report.main([str(selected_sweep), "--figures", "none", "--metric", "best_acc", "--out",
                        str(selected_sweep / "best")]) == 0
    assert "training stage" not in (selected_sweep / "best" / "notes.md").read_text()


def test_stages_of_a_run_closed_form(tmp_path: Path):
    from fedlnl.benchmark.selection import stages_of

    rows = [{"round": 1, "acc": 0.5, "stage": "warmup"}, {"round": 2, "acc": 0.7, "stage": "warmup"},
            {"round": 3, "loss": 1.0, "stage": "training"},  # not an evaluation
            {"round": 4, "acc": 0.7, "stage": "training"}, {"round": 5, "acc": 0.6, "stage": "training"}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the best accuracy's first round (2, as best_acc), the selected round's, the last evaluation's
    assert stages_of(tmp_path, 4) == {"stage_last": "training", "stage_best": "warmup", "stage_selected": "training"}
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "stage"}) + "\n" for r in rows))
    assert stages_of(tmp_path, 4) == {}  # a method that names no stages


# ---------------------------------------------------------------- no walls (issue 35)


def test_one_seed_report_has_no_win_tie_loss_wall(tmp_path: Path):
    root = tmp_path / "sweep"
    for i, method in enumerate(("fedavg", "fedprox", "fedcorr")):
        for noise in ((0.0, 0.0), (0.6, 0.5)):
            write_run(root / f"{method}_{noise[0]}", summary(method, noise, 0, 0.5 + 0.1 * i, (10, None)), 0.5)
    assert report.main([str(root), "--figures", "none"]) == 0
    stats_md = (root / "report" / "stats.md").read_text()
    assert "untested" not in stats_md and "0/0/0" not in stats_md
    assert ("No win/tie/loss matrix: no pair tested (every cell has n = 1 seed; the two-sided paired t-test over "
            "seeds (minimum 2 paired seeds) needs ≥ 2 seeds per method, paired).") in stats_md
    page = (root / "report" / "report.html").read_text()
    assert 'data-name="wtl"' not in page and "No win/tie/loss matrix: no pair tested" in page
    # a second seed for two methods: their pair is tested, the third method is left out by name
    for method in ("fedavg", "fedprox"):
        for noise in ((0.0, 0.0), (0.6, 0.5)):
            write_run(root / f"{method}_{noise[0]}_s1", summary(method, noise, 1, 0.52, (10, None)), 0.5)
    assert report.main([str(root), "--figures", "none"]) == 0
    stats_md = (root / "report" / "stats.md").read_text()
    assert "| method | fedavg | fedprox |" in stats_md and "| fedcorr |" not in stats_md
    assert "Left out of the matrix (no tested pair): fedcorr." in stats_md


#: what a cell says when it holds no result: the marks of an "untested" / "never reached" wall
EMPTY_CELLS = {"", "-", "—", "–"}


def _tables(md: str) -> list[list[list[str]]]:
    """Every Markdown table of a page as its data rows (cells after the row label; family heading rows,
    whose cells are all empty by design, left out)."""
    tables, rows = [], None
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if rows is None:
                rows = []
            elif not set(cells) <= {"---", ""} and not cells[0].startswith("*"):
                rows.append(cells[1:])
        elif rows is not None:
            tables.append(rows)
            rows = None
    return tables


def _is_wall(rows: list[list[str]]) -> bool:
    cells = [c for row in rows for c in row]
    return bool(cells) and all(c in EMPTY_CELLS or "untested" in c or c.startswith("0/0/0") for c in cells)


def test_tables_helper_finds_a_wall():
    md = ("| m | a | b |\n|---|---|---|\n| *fam* |  |  |\n| x | - | - |\n| y | 0/0/0 (2 untested) | — |\n\ntext\n"
          "| m | a |\n|---|---|\n| x | 10 |\n| y | - |\n")
    tables = _tables(md)
    assert tables == [[["-", "-"], ["0/0/0 (2 untested)", "—"]], [["10"], ["-"]]]
    assert [_is_wall(t) for t in tables] == [True, False]


def test_one_seed_report_has_no_table_of_only_empty_cells(tmp_path: Path):
    """A one-seed sweep where no run reaches the 80% target: every table of every Markdown page of the
    report holds some result (the win/tie/loss matrix and the cost to 80% become one line each), and
    report.html shows neither."""
    root = tmp_path / "sweep"
    for i, method in enumerate(("fedavg", "fedprox", "fedcorr", "krum")):
        for noise in ((0.0, 0.0), (0.6, 0.5)):
            s = summary(method, noise, 0, 0.5 + 0.1 * i, (10 * (i + 1), None))
            s.update(best_balanced_acc=0.4 + 0.1 * i, cost_to_target_balanced={"0.5": None, "0.8": None})
            write_run(root / f"{method}_{noise[0]}", s, 0.5 + 0.1 * i)
    assert report.main([str(root), "--figures", "none"]) == 0
    out = root / "report"
    walls = {page.name: t for page in sorted(out.glob("*.md")) for t in _tables(page.read_text()) if _is_wall(t)}
    assert not walls, walls
    comm = (out / "comm.md").read_text()
    assert "### Communication cost to reach 50% test accuracy" in comm  # reached by some: kept
    assert "### Communication cost to reach 80% test accuracy" not in comm
    assert ("No table of the cost to reach 80% test accuracy: no run of any cell reached it (and no published "
            "cost to compare with).") in comm
    page = (out / "report.html").read_text()
    assert "comm: Communication cost to reach 80%" not in page and "No table of the cost to reach 80%" in page
    assert "% Communication cost to reach 80%" not in (out / "comm.tex").read_text()  # no tabular for it
    # the balanced curve: no run reaches either target, so no cost-to-target table at all
    assert report.main([str(root), "--figures", "none", "--metric", "best_balanced_acc", "--out", str(tmp_path / "b")]) == 0
    comm = (tmp_path / "b" / "comm.md").read_text()
    assert comm.count("### ") == 1 and "No table of the cost to reach 50% balanced test accuracy nor 80% " in comm


# ---------------------------------------------------------------- output errors and interrupts (issue 34)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedlnl.benchmark.report", *args], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, **(env or {})})


def test_out_under_a_file_is_one_line_on_stderr(selected_sweep: Path, tmp_path: Path):
    (tmp_path / "afile").write_text("x")
    res = _cli(str(selected_sweep), "--out", str(tmp_path / "afile" / "rep"), "--figures", "none")
    assert res.returncode == 2 and "Traceback" not in res.stderr and not res.stdout
    assert res.stderr.strip().splitlines()[-1] == (
        f"fedlnl-report: error: --out {tmp_path / 'afile' / 'rep'}: cannot write the report there: "
        f"{tmp_path / 'afile'} is a file, not a directory")
    assert (tmp_path / "afile").read_text() == "x"


def _read_only_dir(tmp_path: Path) -> Path:
    """A directory this process cannot write into: chmod 0o555, or for root (who ignores modes) a
    directory of /sys, which refuses new entries to everyone."""
    if os.geteuid() != 0:
        path = tmp_path / "ro"
        path.mkdir()
        path.chmod(0o555)
        return path
    if Path("/sys/kernel").is_dir():
        return Path("/sys/kernel")
    pytest.skip("root without /sys: no read-only directory to try")


def test_read_only_out_is_one_line_on_stderr(selected_sweep: Path, tmp_path: Path):
    out = _read_only_dir(tmp_path) / "rep"
    res = _cli(str(selected_sweep), "--out", str(out), "--figures", "none")
    assert res.returncode == 2 and "Traceback" not in res.stderr and not res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"fedlnl-report: error: --out {out}: cannot write the report there: ") and "ermi" in last


def test_an_interrupted_report_is_marked_incomplete(selected_sweep: Path, monkeypatch, capsys):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(plots, "plot_acc_vs_cost", interrupt)
    assert report.main([str(selected_sweep)]) == 130
    found = capsys.readouterr()
    out = selected_sweep / "report"
    assert found.err.strip() == (f"fedlnl-report: error: interrupted (SIGINT): the report in {out} is incomplete "
                                 "(its INCOMPLETE file says so)")
    assert (out / "INCOMPLETE").is_file() and not (out / "report.html").exists()
    assert "interrupted" in (out / "INCOMPLETE").read_text()
    monkeypatch.undo()
    assert report.main([str(selected_sweep)]) == 0  # a finished report removes the marker
    assert not (out / "INCOMPLETE").exists() and (out / "report.html").is_file()
    # an earlier report's files never outlive the report that wrote them
    for path in selected_sweep.rglob("summary.json"):
        s = json.loads(path.read_text())
        for key in ("client_acc_mean", "client_acc_worst10", "client_gap", "clients"):
            s.pop(key)
        path.write_text(json.dumps(s))
    (out / "mine.txt").write_text("a file of the user's")
    assert report.main([str(selected_sweep), "--figures", "none"]) == 0
    assert not (out / "clients.png").exists() and not (out / "acc_vs_cost.png").exists()
    assert not (out / "clients.md").exists() and (out / "mine.txt").is_file()
    assert 'data-name="clients.png"' not in (out / "report.html").read_text()


def test_sigterm_mid_write_leaves_the_marker(selected_sweep: Path):
    code = ("import os, signal, sys; from fedlnl.benchmark.report import plots, main; "
            "plots.plot_acc_vs_cost = lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM); "
            f"sys.exit(main([{str(selected_sweep)!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    out = selected_sweep / "report"
    assert res.returncode == 128 + signal.SIGTERM and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (f"fedlnl-report: error: interrupted (SIGTERM): the report in "
                                                   f"{out} is incomplete (its INCOMPLETE file says so)")
    assert (out / "INCOMPLETE").is_file() and (out / "accuracy.csv").is_file()


def test_client_panels_start_a_row_per_family():
    names = ["a1", "a2", *(f"b{i}" for i in range(7))]
    groups = {n: n[0] for n in names}
    places = plots.panel_grid(names, groups, 6)
    assert places[:3] == [(0, 0, "a"), (0, 1, None), (1, 0, "b")]
    assert places[-2:] == [(1, 5, None), (2, 0, "b (cont.)")]
    assert plots.panel_grid(names, None, 6)[5:7] == [(0, 5, None), (1, 0, None)]
