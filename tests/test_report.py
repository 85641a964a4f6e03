"""fedlnl-report on a fake sweep: 2 methods x 2 settings x 2 seeds, plus incomplete runs."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlnl.benchmark import report
from fedlnl.benchmark.report import reference, tables

#: (method, (rho, tau)) -> per seed: best_acc, cost to 0.5, cost to 0.8
RUNS = {
    ("fedavg", (0.4, 0.0)): [(0.80, 100, 300), (0.84, 120, None)],
    ("fedavg", (0.6, 0.5)): [(0.70, 200, None), (0.76, 220, None)],
    ("fedcorr", (0.4, 0.0)): [(0.78, 40, None), (0.80, 60, None)],
    ("fedcorr", (0.6, 0.5)): [(0.88, 50, 150), (0.86, 70, 250)],
}
ROUNDS = 10


def summary(method: str, noise: tuple[float, float], seed: int, best: float, costs, status="complete"):
    rho, tau = noise
    return {
        "status": status, "method": method, "dataset": "digits", "model": "cnn", "seed": seed,
        "best_acc": best, "final_acc": best - 0.01, "last10_acc": best - 0.02,
        "comm_cost": 10 * ROUNDS, "cost_to_target": {"0.5": costs[0], "0.8": costs[1]},
        "bytes_up": 1000, "wall_time_s": 1.0, "federation_hash": "abc", "git_commit": "0",
        "setting": {"dataset": "digits", "noise": "symmetric", "rho": rho, "tau": tau,
                    "partition": "iid", "p": None, "alpha": None, "num_clients": 10,
                    "fidelity": "paper"},
        "config": {"seed": seed, "fl": {"lr": 0.01}, "method": {"name": method}},
        "config_hash": "h",
    }


def write_run(run_dir: Path, summary_obj: dict | None, best: float) -> None:
    run_dir.mkdir(parents=True)
    lines = [{"round": r, "acc": best * r / ROUNDS, "loss": 1.0, "comm_cost": 10 * r}
             for r in range(1, ROUNDS + 1)]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    if summary_obj is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary_obj))


def write_hydra(run_dir: Path, method: str, rho: float, tau: float, seed: int) -> None:
    (run_dir / ".hydra").mkdir()
    cfg = {"seed": seed, "fidelity": "paper", "dataset": {"name": "digits"}, "partition": {"kind": "iid"},
           "noise": {"kind": "symmetric", "rho": rho, "tau": tau}, "fl": {"num_clients": 10, "lr": 0.01}}
    choices = {"method": method, "dataset": "digits", "model": "cnn", "partition": "iid"}
    (run_dir / ".hydra" / "config.yaml").write_text(json.dumps(cfg))  # JSON is valid YAML
    (run_dir / ".hydra" / "hydra.yaml").write_text(json.dumps({"hydra": {"runtime": {"choices": choices}}}))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for (method, noise), seeds in RUNS.items():
        for seed, (best, *costs) in enumerate(seeds):
            run_dir = root / f"{method}_{noise[0]}_{noise[1]}" / str(seed)
            write_run(run_dir, summary(method, noise, seed, best, costs), best)
    failed = summary("fedavg", (0.8, 0.5), 0, 0.1, (None, None), status="failed")
    write_run(root / "fedavg_0.8_0.5" / "0", failed, 0.1)  # the only run of its column
    write_run(root / "fedcorr_0.6_0.5" / "2", None, 0.5)  # still running: no summary yet
    write_hydra(root / "fedcorr_0.6_0.5" / "2", "fedcorr", 0.6, 0.5, 2)
    write_run(root / "broken" / "0", None, 0.5)
    (root / "broken" / "0" / "summary.json").write_text('{"status": "comp')  # half written
    return root


def cell(values: list[float]) -> str:
    """mean ± std [95% CI]: for two seeds the percentile bootstrap of the mean resamples {a, (a+b)/2,
    b} with probabilities 1/4, 1/2, 1/4, so its 2.5% and 97.5% quantiles are min and max."""
    pct = 100 * np.array(values)
    ci = f" [{pct.min():.2f}, {pct.max():.2f}]" if len(pct) == 2 else ""
    return f"{pct.mean():.2f} ± {pct.std():.2f}{ci}"


def test_accuracy_tables(sweep: Path, capsys, caplog):
    with caplog.at_level(logging.WARNING):
        assert report.main([str(sweep), "--figures", "none"]) == 0
    out = capsys.readouterr().out
    assert "unreadable" in caplog.text and "broken" in caplog.text
    md = (sweep / "report" / "accuracy.md").read_text()
    assert md.split("\n\n")[1] in out and f"report: {sweep / 'report'}" in out
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| fed")}
    # closed form: population std; fedavg best at (0.4,0), fedcorr best at (0.6,0.5)
    assert f"**{cell([0.80, 0.84])} (n=2)**" in rows["fedavg"]  # 82.00 ± 2.00
    # paired t-test vs the column's best, 2 seeds: differences (-18, -10), t = -3.5 on 1 df, p = 0.18:
    # not significantly worse (†); (0.4,0): fedcorr - fedavg = (-2, -4), t = -3, p = 0.20 (†)
    assert f"| {cell([0.70, 0.76])} (n=2) † |" in rows["fedavg"]  # 73.00 ± 3.00, not bold
    assert f"| {cell([0.78, 0.80])} (n=2) † |" in rows["fedcorr"]
    assert f"**{cell([0.88, 0.86])} (n=2, 1 incomplete)**" in rows["fedcorr"]
    assert "82.00 ± 2.00 [80.00, 84.00]" in rows["fedavg"] and "73.00 ± 3.00 [70.00, 76.00]" in rows["fedavg"]
    header = md.splitlines()[2]
    assert header == ("| method | (0.4,0) | (0.4,0) last10_acc | (0.6,0.5) | (0.6,0.5) last10_acc | (0.8,0.5) | "
                      "(0.8,0.5) last10_acc |")
    assert f"**{cell([0.78, 0.82])} (n=2)**" in rows["fedavg"]  # last-10 accuracy beside the best
    # the column whose only run failed is a missing cell
    assert rows["fedavg"].endswith("| missing (1 incomplete) |")
    assert rows["fedcorr"].endswith("| missing |")
    # one line per kind of note under the table; the full list in notes.md
    assert "- 3 incomplete run(s), not averaged" in md and md.count("broken/0") == 1
    notes = (sweep / "report" / "notes.md").read_text()
    assert "failed" in notes and "fedcorr_0.6_0.5/2: missing" in notes and "broken/0: unreadable" in notes
    assert "Holm-corrected" in md and "α = 0.05" in md and "n = 2 paired seeds" in md


def test_accuracy_csv_and_latex(sweep: Path):
    report.main([str(sweep), "--metric", "final_acc", "--figures", "none", "--beside", "none"])
    csv = pd.read_csv(sweep / "report" / "accuracy.csv")
    line = csv[(csv.method == "fedavg") & (csv.column == "(0.6,0.5)")].iloc[0]
    pct = 100 * (np.array([0.70, 0.76]) - 0.01)
    assert line["mean"] == pytest.approx(pct.mean()) and line["std"] == pytest.approx(pct.std())
    assert (line["n"], line["n_incomplete"], line["metric"]) == (2, 0, "final_acc")
    assert (line["rho"], line["tau"]) == (0.6, 0.5)
    missing = csv[(csv.method == "fedavg") & (csv.column == "(0.8,0.5)")].iloc[0]
    assert missing["n"] == 0 and missing["n_incomplete"] == 1 and np.isnan(missing["mean"])
    tex = (sweep / "report" / "accuracy.tex").read_text()
    assert "\\begin{tabular}{lccc}" in tex and "\\end{tabular}" in tex
    assert "\\textbf{82.00 $\\pm$ 2.00 (n=2)}" not in tex  # final_acc: 81.00
    assert "\\textbf{81.00 $\\pm$ 2.00 [79.00, 83.00] (n=2)}" in tex and tex.count("\\textbf") == 2
    assert "% Metric (%): test accuracy at the last evaluation (final_acc); mean" in tex  # names its metric


def test_comm_table(sweep: Path):
    report.main([str(sweep), "--ratio-to", "fedcorr", "--figures", "none"])
    md = (sweep / "report" / "comm.md").read_text()
    sections = {s.splitlines()[0]: s for s in md.split("### ")[1:]}
    to50 = sections["Communication cost to reach 50% test accuracy (ratio to fedcorr in brackets)"]
    to80 = sections["Communication cost to reach 80% test accuracy (ratio to fedcorr in brackets)"]
    assert "| fedavg | 110 (2.2) | 210 (3.5) | missing |" in to50
    assert "| fedcorr | 50 | 60 | missing |" in to50
    assert "| fedavg | 300 [1/2] | - | missing |" in to80  # reference never reached: no ratio
    assert "| fedcorr | - | 200 | missing |" in to80
    total = sections["Total communication cost (client participations) (ratio to fedcorr in brackets)"]
    assert "| fedavg | 100 (1.0) | 100 (1.0) | missing |" in total
    csv = pd.read_csv(sweep / "report" / "comm.csv")
    line = csv[(csv.method == "fedavg") & (csv.column == "(0.6,0.5)") & (csv.target == 0.5)].iloc[0]
    assert line["mean"] == 210 and line["ratio"] == pytest.approx(3.5) and line["n_reached"] == 2


def test_plot(sweep: Path):
    report.main([str(sweep)])
    png = sweep / "report" / "acc_vs_cost.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    lines = report.curves(report.load_summaries(sweep))
    cost, acc = lines["(0.6,0.5)"]["fedcorr"]
    np.testing.assert_allclose(cost, 10 * np.arange(1, ROUNDS + 1))
    np.testing.assert_allclose(acc[-1], 87.0)  # mean of the two complete seeds only


def test_by_config_key_and_errors(sweep: Path, capsys):
    report.main([str(sweep), "--by", "fl.lr", "--figures", "none", "--beside", "none"])  # resolved as config.fl.lr
    assert "| method | (0.4,0) lr=0.01 | (0.6,0.5) lr=0.01 |" in capsys.readouterr().out
    report.main([str(sweep), "--rows", "model", "--figures", "none", "--beside", "none"])  # methods join the columns
    assert "| model | fedavg (0.4,0) | fedavg (0.6,0.5) |" in capsys.readouterr().out
    assert report.main([str(sweep), "--by", "no.such.key"]) == 2
    assert report.main([str(sweep / "nothing")]) == 2


def test_default_columns_for_noniid_and_datasets():
    base = {"status": "complete", "method": "m", "best_acc": 0.5, "tau": 0.5, "rho": 0.6}
    frame = pd.DataFrame([
        {**base, "dataset": "cifar10", "partition": "iid", "p": None, "alpha": None},
        {**base, "dataset": "cifar10", "partition": "noniid", "p": 0.7, "alpha": 10.0},
        {**base, "dataset": "cifar100", "partition": "noniid", "p": 0.3, "alpha": 1.0},
    ])
    _, columns, _ = report.with_columns(frame, "method")
    assert columns == ["cifar10 (0.6,0.5) IID", "cifar10 (0.6,0.5) non-IID (0.7,10)",
                       "cifar100 (0.6,0.5) non-IID (0.3,1)"]
    frame["setting.fidelity"] = ["paper", "reference", "paper"]  # any other varying setting key
    _, columns, _ = report.with_columns(frame, "method")
    assert columns[1] == "cifar10 (0.6,0.5) non-IID (0.7,10) fidelity=reference"


# ---------------------------------------------------------------- paper reference numbers, ablations

REFERENCE = """method,variant,dataset,model,partition,rho,tau,p,alpha,target,metric,mean,std,source
fedavg,,digits,,iid,0.4,0.0,,,,best_acc,85.00,1.00,Fake Table 1
fedcorr,,digits,cnn,iid,0.6,0.5,,,,best_acc,90.00,0.50,Fake Table 1
fedavg,,digits,,iid,0.8,0.5,,,,best_acc,70.00,2.00,Fake Table 1
fedcorr,,digits,,iid,0.9,0.5,,,,best_acc,91.00,0.30,Fake Table 1
fedcorr,w/o correction,digits,,iid,0.6,0.5,,,,best_acc,88.00,0.50,Fake Table 6
fedavg,,digits,,iid,0.4,0.0,,,0.5,cost_to_target,100,,Fake Table 13
fedcorr,,digits,,iid,0.4,0.0,,,0.5,cost_to_target,50,,Fake Table 13
fedcorr,,digits,,iid,0.6,0.5,,,80,cost_to_target,180,,Fake Table 11
fedavg,,digits,,iid,0.6,0.5,,,80,cost_to_target,-,,Fake Table 11
"""


@pytest.fixture
def preset_sweep(tmp_path: Path) -> Path:
    """The fake sweep of a preset, plus an ablation variant of fedcorr at (0.6,0.5) and a failed
    run; the reference grid also has (0.9,0.5), which has no run."""
    root = tmp_path / "preset"
    runs = [(m, noise, seed, best, costs, None) for (m, noise), seeds in RUNS.items()
            for seed, (best, *costs) in enumerate(seeds)]
    runs += [("fedcorr", (0.6, 0.5), seed, best, (80, None), "w/o correction")
             for seed, best in enumerate([0.84, 0.82])]
    runs += [("fedavg", (0.8, 0.5), 0, 0.1, (None, None), None)]
    for i, (method, noise, seed, best, costs, variant) in enumerate(runs):
        s = summary(method, noise, seed, best, costs, status="failed" if best == 0.1 else "complete")
        s.update(preset="fake_table", variant=variant)
        write_run(root / f"run{i}", s, best)
    (tmp_path / "ref.csv").write_text(REFERENCE)
    return root


def md_rows(md: str) -> dict:
    return {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| fed")}


def test_reference_columns_ablation_rows_and_missing_cells(preset_sweep: Path, capsys):
    ref = preset_sweep.parent / "ref.csv"
    assert report.main([str(preset_sweep), "--reference", str(ref), "--figures", "none", "--beside", "none"]) == 0
    out = capsys.readouterr().out
    md = (preset_sweep / "report" / "accuracy.md").read_text()
    rows = md_rows(md)
    # (0.9,0.5) has no run at all: not a column, but one summary line for its row
    assert "| method | (0.4,0) | (0.6,0.5) | (0.8,0.5) |" in md.splitlines()
    assert f"| **{cell([0.80, 0.84])} (n=2); paper 85.00 ± 1.00, Δ -3.00** |" in rows["fedavg"]
    assert "| missing (1 incomplete); paper 70.00 ± 2.00 |" in rows["fedavg"]
    assert f"| **{cell([0.88, 0.86])} (n=2); paper 90.00 ± 0.50, Δ -3.00** |" in rows["fedcorr"]
    # the ablation variant is its own row, compared with its own paper value
    variant = rows["fedcorr (w/o correction)"]
    assert variant == (f"| fedcorr (w/o correction) | missing | {cell([0.84, 0.82])} (n=2); paper 88.00 ± 0.50, "
                       "Δ -5.00 | missing |")
    assert "Paper values from " + str(ref) + " (Fake Table 1, Fake Table 6, Fake Table 13, Fake Table 11)" in md
    assert "\n- fedcorr: 1 cell not run — (ρ,τ) (0.9,0.5)\n" in md and "fedcorr: 1 cell not run" in out
    notes = (preset_sweep / "report" / "notes.md").read_text()
    assert "- fedcorr / (0.9,0.5)" in notes
    assert "not run" not in notes.split("incomplete run(s)")[1].split("## ")[0]  # placeholders aren't runs
    csv = pd.read_csv(preset_sweep / "report" / "accuracy.csv")
    line = csv[(csv.method == "fedcorr (w/o correction)") & (csv.column == "(0.6,0.5)")].iloc[0]
    assert (line["paper_mean"], line["paper_std"], line["paper_source"]) == (88.0, 0.5, "Fake Table 6")
    assert line["diff"] == pytest.approx(-5.0) and line["n"] == 2
    assert csv[csv.column == "(0.4,0)"].set_index("method")["paper_mean"].isna().tolist() == [False, True, True]
    tex = (preset_sweep / "report" / "accuracy.tex").read_text()
    assert "paper 85.00 $\\pm$ 1.00, $\\Delta$ -3.00" in tex
    # --full-grid: every column of the reference grid, the cell without runs as "missing; paper ..."
    report.main([str(preset_sweep), "--reference", str(ref), "--figures", "none", "--beside", "none", "--full-grid"])
    md = (preset_sweep / "report" / "accuracy.md").read_text()
    assert "| method | (0.4,0) | (0.6,0.5) | (0.8,0.5) | (0.9,0.5) |" in md.splitlines()
    assert md_rows(md)["fedcorr"].endswith("| missing; paper 91.00 ± 0.30 |")


def test_partial_sweep_of_a_big_grid_shows_its_columns_and_one_line_per_method(tmp_path: Path):
    """A reference grid of 3 models x 7 noise settings with one run: one column, and the 20 cells
    without runs in one line (count and compact range)."""
    noise = [(0.0, 0.0), (0.4, 0.0), (0.4, 0.5), (0.6, 0.0), (0.6, 0.5), (0.8, 0.0), (0.8, 0.5)]
    lines = [REFERENCE.splitlines()[0]] + [f"fedcorr,,digits,{m},iid,{r},{t},,,,best_acc,70,1,T10"
                                           for m in ("lenet", "resnet18", "vgg11") for r, t in noise]
    (tmp_path / "ref.csv").write_text("\n".join(lines) + "\n")
    s = summary("fedcorr", (0.6, 0.5), 0, 0.6, (10, None))
    s["model"] = "lenet"
    write_run(tmp_path / "sweep" / "run0", s, 0.6)
    report.main([str(tmp_path / "sweep"), "--reference", str(tmp_path / "ref.csv"), "--figures", "none"])
    md = (tmp_path / "sweep" / "report" / "accuracy.md").read_text()
    assert "| method | (0.6,0.5) | (0.6,0.5) last10_acc |" in md.splitlines()
    assert ("- fedcorr: 20 cells not run — model lenet, resnet18, vgg11 × (ρ,τ) (0,0), (0.4,0) … (0.8,0.5) "
            "(7 values) (20 of the 21 combinations)") in md.splitlines()
    assert len(md.splitlines()) < 25 and (tmp_path / "sweep" / "report" / "notes.md").read_text().count("- fedcorr /") == 20


def test_reference_cost_table_with_ratios(preset_sweep: Path):
    ref = preset_sweep.parent / "ref.csv"
    report.main([str(preset_sweep), "--reference", str(ref), "--ratio-to", "fedcorr", "--figures", "none"])
    md = (preset_sweep / "report" / "comm.md").read_text()
    sections = {s.splitlines()[0]: s for s in md.split("### ")[1:]}
    to50 = md_rows(sections["Communication cost to reach 50% test accuracy (ratio to fedcorr in brackets)"])
    to80 = md_rows(sections["Communication cost to reach 80% test accuracy (ratio to fedcorr in brackets)"])
    assert "| 110 (2.2); paper 100 (2.0), Δ +10 |" in to50["fedavg"]
    assert "| 50; paper 50, Δ +0 |" in to50["fedcorr"]
    assert "| 80 (1.3) |" in to50["fedcorr (w/o correction)"]  # 80 / fedcorr's 60
    assert "| 200; paper 180, Δ +20 |" in to80["fedcorr"]
    assert "| -; paper - |" in to80["fedavg"]  # never reached, in ours and in the paper
    assert "paper = the published cost" in md
    csv = pd.read_csv(preset_sweep / "report" / "comm.csv")
    line = csv[(csv.method == "fedavg") & (csv.column == "(0.4,0)") & (csv.target == 0.5)].iloc[0]
    assert (line["paper_mean"], line["diff"], line["paper_ratio"]) == (100.0, 10.0, 2.0)


def test_reference_found_by_preset_name(preset_sweep: Path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(preset_sweep.parent)
    report.main([str(preset_sweep), "--figures", "none"])  # no results/reference/fake_table.csv yet
    out = capsys.readouterr().out
    assert "; paper " not in out and "Paper values" not in out and "preset fake_table: no reference numbers" in caplog.text
    (preset_sweep.parent / "results" / "reference").mkdir(parents=True)
    (preset_sweep.parent / "results" / "reference" / "fake_table.csv").write_text(REFERENCE)
    report.main([str(preset_sweep), "--figures", "none"])
    assert "82.00 ± 2.00 [80.00, 84.00] (n=2); paper 85.00 ± 1.00, Δ -3.00" in capsys.readouterr().out
    (preset_sweep.parent / "bad.csv").write_text("method,mean\nfedavg,1\n")
    assert report.main([str(preset_sweep), "--reference", str(preset_sweep.parent / "bad.csv")]) == 2


def test_reference_matching_rules():
    row = {"method": "FedCorr", "variant": "", "dataset": "cifar10", "model": "", "partition": "non-IID",
           "rho": 0.6, "tau": 0.5, "p": 0.7, "alpha": 10.0}
    run = {"method": "fedcorr", "variant": None, "dataset": "cifar10_jpeg", "model": "resnet18",
           "partition": "noniid", "rho": 0.6, "tau": 0.5, "p": 0.7, "alpha": 10}
    ours = reference.run_identity({**run, "setting.family": "cifar10"})
    assert ours["dataset"] == "cifar10"  # matched on the summary's dataset family
    assert report.matches(row, ours)  # case, family, wildcard model, partition spelling
    assert reference.run_identity(run)["dataset"] == "cifar10"  # no family recorded: the legacy alias
    assert reference.run_identity({**run, "setting.family": "other"})["dataset"] == "other"  # family wins
    assert not report.matches(row, {**ours, "variant": "w/o mixup"})  # a variant never matches the plain row
    assert not report.matches(row, {**ours, "alpha": 1.0})
    assert report.matches({**row, "p": np.nan, "alpha": np.nan}, {**ours, "alpha": 1.0})  # empty = any
    assert not report.matches({**row, "model": "vgg11"}, ours)


def test_real_noise_columns_name_the_label_set():
    base = {"status": "complete", "method": "m", "best_acc": 0.5, "rho": None, "tau": None,
            "partition": "iid", "setting.noise": "cifar10n"}
    frame = pd.DataFrame([{**base, "config.noise.label_set": "worse"},
                          {**base, "config.noise.label_set": "aggre"},
                          {**base, "rho": 0.6, "tau": 0.5, "setting.noise": "symmetric"}], dtype=object)
    _, columns, _ = report.with_columns(frame, "method")
    assert columns == ["cifar10n aggre", "cifar10n worse", "(0.6,0.5) noise=symmetric"]


# ---------------------------------------------------------------- pooling guards (issue 9), effective values


def _run(method, seed, best, **extra):
    return {"status": "complete", "method": method, "seed": seed, "best_acc": best, "rho": 0.0, "tau": 0.0,
            "partition": "iid", "comm_cost": 10, **extra}


def test_cells_never_pool_runs_that_differ_in_more_than_the_seed():
    frame = pd.DataFrame([_run("fedavg", 0, 0.8, **{"config.fl.lr": 0.05, "config.seed": 0, "config.device": "cpu"}),
                          _run("fedavg", 1, 0.6, **{"config.fl.lr": 0.01, "config.seed": 1, "config.device": "cuda"}),
                          _run("median", 0, 0.7, **{"config.fl.lr": 0.05, "config.seed": 0, "config.device": "cpu"})],
                         dtype=object)
    table = report.accuracy_table(frame)
    assert sorted(set(table["column"])) == ["(0,0) lr=0.01", "(0,0) lr=0.05"]
    fedavg = table[table["method"] == "fedavg"].set_index("column")
    assert fedavg["n"].to_dict() == {"(0,0) lr=0.01": 1, "(0,0) lr=0.05": 1}  # 0.8 and 0.6 never averaged
    assert fedavg["mean"].to_dict() == {"(0,0) lr=0.01": pytest.approx(60.0), "(0,0) lr=0.05": pytest.approx(80.0)}
    same = frame.assign(**{"config.fl.lr": 0.05})  # seed and device differ only: one cell of n=2
    assert report.accuracy_table(same).query("method == 'fedavg'")["n"].tolist() == [2]


def test_cells_never_pool_runs_of_another_thread_count():
    """The report pools what the config hash ignores, nothing more: ``threads`` is in the hash."""
    frame = pd.DataFrame([_run("fedavg", 0, 0.8, **{"config.threads": 1, "config.seed": 0}),
                          _run("fedavg", 1, 0.6, **{"config.threads": 2, "config.seed": 1})], dtype=object)
    assert report.accuracy_table(frame)["n"].tolist() == [1, 1]
    assert report.accuracy_table(frame.assign(**{"config.threads": 1}))["n"].tolist() == [2]


def test_missing_seeds_and_effective_value_warnings(tmp_path, caplog):
    frame = pd.DataFrame([_run("fedavg", 0, 0.8, **{"effective.lr": 0.05, "effective.stage3.lr": 0.05}),
                          _run("fedavg", 1, 0.82, **{"effective.lr": 0.05, "effective.stage3.lr": 0.05}),
                          _run("median", 0, 0.7, **{"effective.lr": 0.01, "effective.stage3.lr": 0.05}),
                          _run("poc", 0, 0.7)], dtype=object)  # a summary without ``effective``
    seeds = tables.missing_seeds(frame, "method")
    assert seeds == ["- median / (0,0): n=1, missing seeds 1", "- poc / (0,0): n=1, missing seeds 1"]
    warnings = tables.effective_warnings(frame, "method")
    assert warnings == ["NOTE (0,0): the rows used different local-training values (each method's own, "
                        "from summary.json `effective`) — lr: 0.01 (median); 0.05 (fedavg)"]
    md = report.write_report(frame, tmp_path / "out", figures="none")
    assert "- 2 cell(s) with fewer complete seeds than the table: median / (0,0): n=1, missing seeds 1; poc" in md
    assert "- 1 column(s) whose rows used different local-training values (lr" in md
    notes = (tmp_path / "out" / "notes.md").read_text()
    assert "missing seeds 1" in notes and warnings[0] in notes


def test_detection_noise_and_comm_latex_outputs(sweep: Path):
    for i, path in enumerate(sorted(sweep.rglob("summary.json"))):
        try:
            s = json.loads(path.read_text())
        except ValueError:
            continue
        s["detection"] = {"client_f1": 0.5 + 0.1 * (i % 2), "mu_mae": 0.1}
        path.write_text(json.dumps(s))
        diag = {"clients": {"mu": [0.0, 0.5], "true_rate": [0.0, 0.4], "noisy_client": [False, True],
                            "size": [10, 30]}}
        (path.parent / "diagnostics.json").write_text(json.dumps(diag))
    report.main([str(sweep), "--figures", "none"])
    out = sweep / "report"
    det = pd.read_csv(out / "detection.csv")
    f1 = det[(det["method"] == "fedavg") & (det["column"] == "(0.4,0)") & (det["score"] == "client F1")]
    assert f1["n"].item() == 2 and f1["mean"].item() == pytest.approx(0.55) and f1["std"].item() == pytest.approx(0.05)
    assert "client F1" in (out / "detection.md").read_text() and "\\begin{tabular}" in (out / "detection.tex").read_text()
    noise = pd.read_csv(out / "noise.csv")
    assert noise["requested"].tolist()[0] == pytest.approx(0.375) and noise["realised"].tolist()[0] == pytest.approx(0.3)
    assert noise["max_client_gap"].tolist()[0] == pytest.approx(0.1)
    tex = (out / "comm.tex").read_text()
    assert tex.count("\\begin{tabular}") == 3 and "% Total communication cost" in tex  # total + 2 targets


def test_compute_table_and_the_sweeps_cpu_hours_count_a_shared_prefix_once(sweep: Path):
    """Per cell the mean ± std (ddof=0) of CPU and wall minutes over seeds; the sweep's CPU hours sum
    the complete runs and subtract what a run inherited from a shared prefix (its saver counted it)."""
    for path in sorted(sweep.rglob("summary.json")):
        try:
            s = json.loads(path.read_text())
        except ValueError:
            continue
        if s["status"] == "complete":
            s["cpu_time_s"], s["wall_time_s"] = 60.0 * (1 + 2 * s["seed"]), 90.0  # 1 or 3 minutes
            if s["method"] == "fedcorr" and s["setting"]["rho"] == 0.6 and s["seed"] == 1:
                s["prefix"] = {"cpu_time_s": 30.0, "rounds": 5}
        else:  # the failed run: diverged after 120 s (not in the table's means, in the sweep's hours)
            s["status"], s["cpu_time_s"] = "diverged", 120.0
        path.write_text(json.dumps(s))
    report.main([str(sweep), "--figures", "none"])
    out = sweep / "report"
    compute = pd.read_csv(out / "compute.csv")
    cpu = compute[(compute["method"] == "fedavg") & (compute["column"] == "(0.4,0)") & (compute["score"] == "CPU min")]
    assert (cpu["n"].item(), cpu["mean"].item(), cpu["std"].item()) == (2, pytest.approx(2.0), pytest.approx(1.0))
    assert set(compute["score"]) == {"CPU min", "wall min"}  # no local_steps in these summaries: no row
    text = (out / "compute.md").read_text()
    # 8 complete runs: 4 x (60 + 180) s, less the 30 s one run inherited, and the diverged one's 120 s
    assert "The 9 finished runs (complete or diverged) that record CPU time took 0.29 CPU hours in all" in text
    assert "2.0 ± 1.0 (n=2)" in text and "1.5 ± 0.0 (n=2)" in text
    assert tables.sweep_cpu_hours(report.load_summaries(sweep)) == (pytest.approx(1050 / 3600), 9)


def test_report_imports_neither_the_runner_nor_torch_and_ships_the_paper_numbers():
    import subprocess
    import sys

    code = ("import sys, fedlnl.benchmark.report as r; "
            "print('torch' in sys.modules, any(m in sys.modules for m in ('fedlnl.benchmark.run', 'fedlnl.benchmark.runner')), "
            "r.reference.packaged_reference('fedcorr_t2') is not None, "
            "*sorted(m for m in sys.modules if m.startswith('fedlnl.methods')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # the method families come from a module of their own: no method (nor the protocol) is imported
    assert out.split() == ["False", "False", "True", "fedlnl.methods", "fedlnl.methods.common",
                           "fedlnl.methods.common.families"]


@pytest.mark.parametrize("part, noise, expected", [
    ({"kind": "iid", "sizes": "equal", "sigma": 1.0, "alpha": 1.0}, {"kind": "symmetric", "std": 0.1}, {}),
    ({"kind": "iid", "sizes": "lognormal", "sigma": 2.0, "alpha": 1.0}, {"kind": "symmetric"},
     {"sizes": "lognormal", "sigma": 2.0}),
    ({"kind": "iid", "sizes": "dirichlet", "sigma": 1.0, "alpha": 0.3}, {"kind": "symmetric"},
     {"sizes": "dirichlet", "size_alpha": 0.3}),
    ({"kind": "shards", "s": 3, "k": 2}, {"kind": "asymmetric", "map": "auto", "std": 0.1}, {"s": 3, "map": "auto"}),
    ({"kind": "classes", "k": 2, "min_size": 10}, {"kind": "instance", "map": "auto", "std": 0.2}, {"k": 2, "std": 0.2}),
    ({"kind": "dirichlet", "alpha": 0.5, "min_size": 10}, {"kind": "cifarn", "label_set": "worse", "std": 0.1},
     {"min_size": 10, "label_set": "worse"}),
    ({"kind": "noniid", "p": 0.7, "alpha": 10}, {"kind": "mixed", "map": "auto", "std": 0.1,
                                                 "groups": [{"kind": "asymmetric", "share": 1.0}]},
     {"map": "auto", "groups": [{"kind": "asymmetric", "share": 1.0}]}),
])
def test_setting_holds_only_the_options_its_kinds_read(part, noise, expected):
    """A run's setting names the options its partition and noise kinds read, nothing else, so runs
    that differ in an option they ignore group together and runs that differ in one they read don't
    (iid with Dirichlet sizes: its alpha is ``size_alpha``, not the label-skew alpha)."""
    from fedlnl.benchmark.setting import extras, setting_of

    setting = setting_of({"dataset": {"name": "digits"}, "partition": part, "noise": noise, "fl": {}})
    found = {k: v for k, v in setting.items() if k in extras()["partition"] + extras()["noise"]}
    assert found == expected
    assert setting["alpha"] == (part["alpha"] if part["kind"] in ("noniid", "dirichlet") else None)


# ---------------------------------------------------------------- balanced accuracy, bad input


def test_balanced_metric_builds_every_table_from_it(sweep: Path, capsys, caplog):
    """--metric balanced_acc: best_balanced_acc beside last10_balanced_acc, costs from
    cost_to_target_balanced, curves from metrics.jsonl's balanced_acc; a run written before the
    runner recorded it is one line, not a crash."""
    paths = sorted(p for p in sweep.rglob("summary.json") if "broken" not in p.parts)
    for i, path in enumerate(paths):
        s = json.loads(path.read_text())
        if i == 0:  # an old summary: no balanced keys
            continue
        s.update(best_balanced_acc=s["best_acc"] - 0.1, final_balanced_acc=s["final_acc"] - 0.1,
                 last10_balanced_acc=s["last10_acc"] - 0.1, cost_to_target_balanced={"0.5": 999, "0.8": None})
        path.write_text(json.dumps(s))
        rows = [json.loads(x) for x in (path.parent / "metrics.jsonl").read_text().splitlines()]
        (path.parent / "metrics.jsonl").write_text("".join(json.dumps({**r, "balanced_acc": r["acc"] / 2}) + "\n"
                                                          for r in rows))
    with caplog.at_level(logging.WARNING):
        assert report.main([str(sweep), "--metric", "balanced_acc"]) == 0
    out = sweep / "report"
    md = (out / "accuracy.md").read_text()
    assert md.startswith("Metric (%): best balanced test accuracy (mean per-class recall) over all evaluations "
                         "(best_balanced_acc; the papers' protocol: the round is chosen on the test set); beside it "
                         "(columns suffixed last10_balanced_acc), mean balanced test accuracy of the last 10 "
                         "evaluations (last10_balanced_acc); mean ± std")
    assert "(0.6,0.5) last10_balanced_acc |" in md.splitlines()[2]
    old = str(paths[0].parent)
    assert "1 of 8 complete run(s) have no best_balanced_acc, last10_balanced_acc in summary.json" in md
    assert old in (out / "notes.md").read_text() and caplog.text.count("have no best_balanced_acc") == 1
    csv = pd.read_csv(out / "accuracy.csv")
    assert set(csv["metric"]) == {"best_balanced_acc", "last10_balanced_acc"}
    fedcorr = csv[(csv.method == "fedcorr") & (csv.column == "(0.6,0.5)") & (csv.metric == "best_balanced_acc")]
    assert fedcorr["mean"].item() == pytest.approx(77.0)  # 87 - 10 points
    comm = pd.read_csv(out / "comm.csv")
    assert set(comm["curve"]) == {"balanced_acc"} and 999 in comm["mean"].tolist()
    assert "Communication cost to reach 50% balanced test accuracy" in (out / "comm.md").read_text()
    assert "best_balanced_acc" in (out / "accuracy.tex").read_text().splitlines()[0]
    lines = report.curves(report.load_summaries(sweep), curve="balanced_acc")
    np.testing.assert_allclose(lines["(0.6,0.5)"]["fedcorr"][1][-1], 87.0 / 2)
    page = (out / "report.html").read_text()
    assert "best_balanced_acc, last10_balanced_acc" in page and "cost_to_target_balanced" in page
    # explicit keys work too, and the plain metric still reads the old run
    assert report.main([str(sweep), "--metric", "final_balanced_acc", "--beside", "none", "--figures", "none"]) == 0
    assert (out / "accuracy.md").read_text().startswith(
        "Metric (%): balanced test accuracy at the last evaluation (final_balanced_acc); mean")
    assert report.main([str(sweep), "--figures", "none"]) == 0
    assert "have no" not in (out / "accuracy.md").read_text()


def _refused(capsys, argv) -> str:
    assert report.main(argv) == 2
    found = capsys.readouterr()
    err = found.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedlnl-report: error: ") and not found.out, found
    return err[0]


def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, sweep: Path, capsys):
    (tmp_path / "empty").mkdir()
    assert "no run directories" in _refused(capsys, [str(tmp_path / "empty")])
    assert "is not a directory" in _refused(capsys, [str(tmp_path / "nowhere")])
    assert "--alpha=1.5 is invalid" in _refused(capsys, [str(sweep), "--alpha", "1.5"])
    other = REFERENCE.replace("digits", "cifar100")
    (tmp_path / "other.csv").write_text(other)
    assert "matches no run" in _refused(capsys, [str(sweep), "--reference", str(tmp_path / "other.csv")])
    (tmp_path / "bad.csv").write_text("method,mean\nfedavg,1\n")
    assert "lacks the columns" in _refused(capsys, [str(sweep), "--reference", str(tmp_path / "bad.csv")])


def test_corrupt_files_and_single_seeds_never_give_a_p_value(tmp_path: Path, capsys):
    """Every summary corrupt or truncated, a metrics.jsonl cut mid-line, methods with one seed each:
    a report that says "not enough runs" and marks nothing."""
    root = tmp_path / "sweep"
    write_run(root / "a", summary("fedavg", (0.4, 0.0), 0, 0.8, (10, None)), 0.8)
    write_run(root / "b", summary("fedcorr", (0.4, 0.0), 1, 0.7, (10, None)), 0.7)  # another seed: no pair
    write_run(root / "c", None, 0.5)
    (root / "c" / "summary.json").write_bytes(b"\x00\xff{")
    with open(root / "a" / "metrics.jsonl", "a") as f:
        f.write('{"round": 11, "acc"')
    assert report.main([str(root)]) == 0
    md = (root / "report" / "accuracy.md").read_text()
    assert "no † marks: not enough runs" in md and "†" not in md.split("\n\n")[1]
    assert "Friedman test: not enough runs" in md
    stats_json = json.loads((root / "report" / "stats.json").read_text())
    assert all(r["p"] is None for r in stats_json["against_best"])
    only_bad = tmp_path / "bad"
    write_run(only_bad / "x", None, 0.5)
    (only_bad / "x" / "summary.json").write_text("{")
    assert report.main([str(only_bad), "--figures", "none"]) == 0  # a table of what is missing, no crash
    capsys.readouterr()


def test_report_cli_prints_no_traceback(tmp_path: Path):
    import subprocess
    import sys

    (tmp_path / "empty").mkdir()
    res = subprocess.run([sys.executable, "-m", "fedlnl.benchmark.report", str(tmp_path / "empty")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr + res.stdout and not res.stdout
    assert res.stderr.strip() == f"fedlnl-report: error: no run directories (summary.json or metrics.jsonl) below {tmp_path / 'empty'}"


def test_wandb_report_run_in_the_sweeps_group(sweep: Path, monkeypatch, capsys):
    """Runs that logged to W&B (offline): the report logs one run "report" into their group, with
    its tables and figures; `--wandb off` logs nothing."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for path in sweep.rglob("summary.json"):
        try:
            s = json.loads(path.read_text())
        except ValueError:
            continue
        s["config"].update(name="mysweep", logger={"kind": "wandb", "mode": "offline", "project": "fedlnl"})
        path.write_text(json.dumps(s))
    frame = report.load_summaries(sweep)
    from fedlnl.benchmark.report import wandb_log

    assert wandb_log.target(frame, sweep) == {"project": "fedlnl", "entity": None, "mode": "offline",
                                       "group": f"mysweep/{sweep.name}"}  # the runner's "<name>/<sweep dir>"
    assert report.main([str(sweep), "--wandb", "off"]) == 0
    assert not (sweep / "report" / "wandb").exists()
    assert report.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert f"W&B: report run logged offline in group mysweep/{sweep.name}; upload with `wandb sync " in out
    (run,) = (sweep / "report" / "wandb").glob("offline-run-*")
    import time

    for _ in range(60):  # W&B's service writes the offline log asynchronously after finish()
        log = next(run.glob("*.wandb")).read_bytes()
        if b"figures/cd_diagram" in log:
            break
        time.sleep(0.5)
    for key in (b"tables/accuracy", b"tables/ranks", b"tables/win_tie_loss", b"figures/acc_vs_cost",
                b"figures/cd_diagram", b"mysweep/" + sweep.name.encode()):
        assert key in log, key
    assert list((run / "files" / "media" / "images" / "figures").glob("acc_vs_cost_*.png"))
