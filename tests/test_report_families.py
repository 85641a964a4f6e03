"""fedlnl-report groups its rows by method family (summary.json ``family``): table order, heading
rows, csv columns, the grouped acc_vs_cost figure, and a tiny quickstart sweep end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlnl.benchmark import report
from fedlnl.benchmark.report import plots
from fedlnl.benchmark.report import cells, figures
from fedlnl.methods.common.families import FAMILIES
from test_report import summary, write_run

FL, ROBUST, LOCAL, FEDERATED, CENTRAL = FAMILIES
REPO = Path(__file__).resolve().parents[1]

#: method -> (family, best_acc at (0.6,0.5) for seeds 0 and 1); "old" was written before summaries
#: recorded a family; "zeta" checks the name order within a family; "mine" a user's own family
METHODS = {
    "zeta": (FL, (0.70, 0.72)), "fedavg": (FL, (0.60, 0.64)), "krum": (ROBUST, (0.50, 0.56)),
    "sce": (LOCAL, (0.66, 0.62)), "fedcorr": (FEDERATED, (0.90, 0.92)), "jointopt_central": (CENTRAL, (0.95, 0.97)),
    "mine": ("my own family", (0.40, 0.42)), "old": (None, (0.30, 0.34)),
}
ORDER = ["fedavg", "zeta", "krum", "sce", "fedcorr", "fedcorr (w/o correction)", "jointopt_central", "mine", "old"]
HEADINGS = [FL, ROBUST, LOCAL, FEDERATED, CENTRAL, "my own family", "other"]


def family_summary(method: str, family, seed: int, best: float, variant=None) -> dict:
    s = summary(method, (0.6, 0.5), seed, best, (10, None))
    s["variant"] = variant
    s["detection"] = {"client_f1": 0.5 + 0.1 * seed}
    if family is not None:
        s["family"] = family
    return s


@pytest.fixture
def family_sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for method, (family, values) in METHODS.items():
        for seed, best in enumerate(values):
            write_run(root / f"{method}_{seed}", family_summary(method, family, seed, best), best)
    for seed, best in enumerate((0.80, 0.81)):  # an ablation variant: its own row, after its method
        s = family_summary("fedcorr", FEDERATED, seed, best, variant="w/o correction")
        write_run(root / f"fedcorr_wo_{seed}", s, best)
    return root


def md_order(md: str) -> tuple[list[str], list[str]]:
    """(family headings, row names) of the first Markdown table in their order (a tuned run's table
    of tuned values follows it)."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    cells_ = [line.split(" | ")[0].removeprefix("| ") for line in lines[start:end] if line.startswith("| ")]
    body = cells_[1:]  # without the header
    return [c.strip("*") for c in body if c.startswith("*")], [c for c in body if not c.startswith("*")]


def test_row_order_families_first_then_names(family_sweep: Path):
    frame = report.load_summaries(family_sweep)
    families = cells.row_families(frame, "method")
    assert list(families) == ORDER  # the tables' order
    assert families["old"] == cells.OTHER_FAMILY and families["fedcorr (w/o correction)"] == FEDERATED
    assert cells.row_values(frame, "method") == ORDER
    assert cells.row_families(frame, "model") is None  # one row holds every family: not methods
    assert cells.row_families(frame, "family") is None
    assert cells.row_families(frame.drop(columns="family"), "method") is None  # no run records one


def test_tables_are_grouped_and_the_best_is_over_all_rows(family_sweep: Path, capsys):
    assert report.main([str(family_sweep), "--figures", "none", "--beside", "none"]) == 0
    out = family_sweep / "report"
    md = (out / "accuracy.md").read_text()
    assert md_order(md) == (HEADINGS, ORDER)
    assert "| *FL baselines* |  |" in md
    # bold = the column's best over all rows (the centralized reference), not each family's best
    assert md.count("**") == 2 and "| jointopt_central | **96.00" in md
    assert "never only a family's" in md and "1 row(s) grouped under 'other'" in md and ": old" in md
    csv = pd.read_csv(out / "accuracy.csv")
    assert list(csv.columns[:3]) == ["method", "family", "column"]
    assert csv["method"].tolist() == ORDER and csv["family"].tolist()[:2] == [FL, FL]
    assert csv["is_best"].sum() == 1 and csv.loc[csv["is_best"], "method"].item() == "jointopt_central"
    assert csv.set_index("method").loc["old", "family"] == "other"
    tex = (out / "accuracy.tex").read_text()
    assert tex.count("\\multicolumn{2}{l}{\\textit{") == len(HEADINGS)
    assert tex.count("\\midrule") == len(HEADINGS)  # under the header, then before each later family
    assert md_order((out / "comm.md").read_text().split("### ")[1])[1] == ORDER
    assert pd.read_csv(out / "comm.csv")["family"].notna().all()
    detection = (out / "detection.md").read_text()
    assert md_order(detection) == (HEADINGS, ORDER)
    assert pd.read_csv(out / "detection.csv").columns[1] == "family"
    ranks = pd.read_csv(out / "ranks.csv")
    assert len(ranks) == len(ORDER) and ranks["mean_rank"].iloc[0] == 1.0 and "family" in ranks
    assert md_order((out / "stats.md").read_text().split("## Win / tie / loss")[1])[1] == ORDER
    page = (out / "report.html").read_text()
    compute = (out / "compute.md").read_text()  # wall minutes: every summary records wall_time_s
    assert md_order(compute) == (HEADINGS, ORDER) and pd.read_csv(out / "compute.csv").columns[1] == "family"
    # accuracy, comm (total and the 50% target: no run reaches 80%, so that table is one line), detection,
    # compute, win/tie/loss
    assert "No table of the cost to reach 80% test accuracy: no run of any cell reached it" in (out / "comm.md").read_text()
    grouped = 1 + 2 + 1 + 1 + 1
    assert page.count('<tr class="family">') == grouped * len(HEADINGS)
    accuracy = page.split('data-name="accuracy"')[1].split("</table>")[0]
    assert [h.split("</th>")[0].split(">")[-1] for h in accuracy.split('<tr class="family">')[1:]] == HEADINGS


def test_sweeps_without_families_are_not_grouped(family_sweep: Path):
    for path in family_sweep.glob("*/summary.json"):
        s = json.loads(path.read_text())
        s.pop("family", None)
        path.write_text(json.dumps(s))
    assert report.main([str(family_sweep), "--figures", "none", "--beside", "none"]) == 0
    md = (family_sweep / "report" / "accuracy.md").read_text()
    headings, rows = md_order(md)
    assert headings == [] and rows == sorted(ORDER)
    assert "family" not in pd.read_csv(family_sweep / "report" / "accuracy.csv")
    assert "grouped under" not in md and "never only a family's" not in md


def test_line_groups_cut_large_families_and_leave_out_the_baseline():
    families = {"fedavg": FL, "fedprox": FL, **{f"r{i}": ROBUST for i in range(3)},
                **{f"f{i:02d}": FEDERATED for i in range(11)}}
    names = list(families)
    groups = figures.line_groups(names, families)
    assert [t for t, _ in groups] == [FL, ROBUST, f"{FEDERATED} (1/2)", f"{FEDERATED} (2/2)"]
    assert groups[0][1] == ["fedprox"]  # fedavg: the dashed line of every panel
    assert [len(g) for _, g in groups[2:]] == [6, 5]
    assert [n for _, g in groups for n in g] == names[1:]  # every other curve exactly once, in order
    assert figures.line_groups(names[::-1], families) == groups  # the tables' order, whatever the curves'
    assert figures.line_groups(names[:8], families) is None  # few curves: one panel per column
    assert figures.line_groups(names, None) is None


def test_grouped_figure_has_a_row_of_panels_per_group(tmp_path: Path):
    cost = np.arange(0, 50, 5)
    columns = ["(0,0)", "(0.6,0.5)"]
    groups = [(FL, ["fedprox"]), (ROBUST, [f"r{i}" for i in range(7)])]
    curves = {c: {n: (cost, cost * 0.5 + i) for i, n in enumerate(["fedavg", "fedprox", *groups[1][1]])}
              for c in columns}
    refs = {c: {"jointopt_central": 40.0, "dividemix_central": 35.0} for c in columns}
    fig = plots.grouped_figure(curves, groups, refs, baseline="fedavg")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == len(groups) * len(columns)
    for ax, (group, names) in zip(panels, [g for g in groups for _ in columns]):
        lines = ax.get_lines()
        dashed = [ln for ln in lines if ln.get_linestyle() == "--" and ln.get_color() == "k"]
        flat = [ln for ln in lines if len(set(np.asarray(ln.get_ydata(), float))) == 1]  # axhline
        assert len(dashed) == 1 and len(flat) == 2  # fedavg and both references in every panel
        solid = [ln for ln in lines if ln.get_linestyle() == "-"]
        assert len(solid) == len(names) and len({ln.get_color() for ln in solid}) == len(names)
    assert len({ax.get_ylim() for ax in panels}) == 1  # one accuracy axis
    path = plots.plot_acc_vs_cost(curves, tmp_path / "acc.png", refs, groups=groups, baseline="fedavg")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_cd_diagram_colours_labels_by_family(tmp_path: Path):
    groups = {"a": FL, "b": FL, "c": ROBUST}
    colours = plots.group_colours(["a", "b", "c"], groups)
    assert colours["a"] == colours["b"] != colours["c"]
    assert plots.group_colours(["a", "b"], {"a": FL, "b": FL}) == {}  # one family: no colours
    ranks = {f"m{i}": 1.0 + i * 30 / 31 for i in range(31)}
    families = {m: FAMILIES[i % 5] for i, m in enumerate(ranks)}
    path = plots.plot_cd_diagram(ranks, 5.0, tmp_path / "cd.png", "t", families)
    assert path.stat().st_size > 2000


@pytest.mark.slow  # CI runs it (make test-slow); the default suite stays short
def test_tiny_quickstart_of_ten_methods_is_grouped_end_to_end(tmp_path: Path):
    """The quickstart restricted on the command line to 10 methods of all 5 families (one seed, its
    noisy cell, one job at a time), then fedlnl-report: tables grouped, every figure drawn."""
    methods = ["fedavg", "fedprox", "poc", "median", "krum", "sce", "coteaching", "fedcorr", "fednoro",
               "jointopt_central"]
    sweep = tmp_path / "quickstart"
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    cmd = [sys.executable, "-m", "fedlnl.benchmark.run", "-m", "experiment=quickstart", "debug=tiny",
           "hydra.launcher.n_jobs=1", f"method={','.join(methods)}", "seed=0",
           "noise.rho_tau=[0.6,0.5]", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    assert len(summaries) == len(methods) and {s["status"] for s in summaries} == {"complete"}
    assert report.main([str(sweep)]) == 0
    out = sweep / "report"
    headings, rows = md_order((out / "accuracy.md").read_text())
    assert headings == list(FAMILIES)
    assert rows == ["fedavg", "fedprox", "poc", "krum", "median", "coteaching", "sce", "fedcorr", "fednoro",
                    "jointopt_central"]
    csv = pd.read_csv(out / "accuracy.csv")
    assert dict(zip(csv["method"], csv["family"]))["median"] == ROBUST
    assert "grouped under" not in (out / "notes.md").read_text()
    for name in ("acc_vs_cost.png", "cd_diagram.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name
