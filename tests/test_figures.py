"""fedlnl-report's per-run figures, drawn from fake metrics.jsonl and diagnostics.json files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedlnl.benchmark import report
from fedlnl.benchmark.report import plots

N, M = 20, 10
FIGURES = ("curve", "lid_gmm", "lid_iterations", "noise_estimation", "noise_realised", "partition", "confusion")


def fake_diagnostics(rng: np.random.Generator) -> dict:
    noisy = np.arange(N) % 5 < 3  # 12 noisy clients
    true_rate = np.where(noisy, rng.uniform(0.5, 0.9, N), 0.0)
    lid = np.where(noisy, rng.normal(30, 2, N), rng.normal(20, 2, N))
    before = np.diag(np.full(M, 80)) + 2
    after = np.diag(np.full(M, 95)) + np.eye(M, k=1, dtype=int) * 5
    gmm = {"means": [[20.0], [30.0]], "variances": [[[4.0]], [[4.0]]], "weights": [0.4, 0.6]}
    lid_record = {"iteration": 5, "cumulative_lid": lid.tolist(), "noisy": (lid > 25).tolist(), "gmm": gmm}
    history = {f"lid/iter{t}": {**lid_record, "iteration": t, "cumulative_lid": (lid * t / 5).tolist(),
                                "gmm": {**gmm, "means": [[4.0 * t], [6.0 * t]]}} for t in range(1, 6)}
    return {
        "clients": {"true_rate": true_rate.tolist(), "mu": true_rate.tolist(), "noisy_client": noisy.tolist(),
                    "mu_hat": [float(r + 0.05) if k % 2 else None for k, r in enumerate(true_rate)],
                    "flagged": [bool(x) for x in noisy], "size": [100] * N},
        "class_counts": rng.integers(0, 40, (N, M)).tolist(),
        "confusion_before": before.tolist(), "confusion_after": after.tolist(),
        "records": {"lid": lid_record, **history, "finetuning": {"clean_pool": [1, 2]}},
    }


def fake_metrics() -> list[dict]:
    rows, cost = [], 0
    for stage, steps, per in (("preprocessing", 40, 1), ("finetuning", 30, 2), ("usual training", 30, 2)):
        for _ in range(steps):
            cost += per
            rows.append({"round": len(rows) + 1, "acc": 0.9 * (1 - np.exp(-cost / 40)), "comm_cost": cost,
                         "stage": stage})
    return rows


def write_fake_run(run_dir: Path, method: str, seed: int, rho: float, with_diag: bool = True) -> None:
    run_dir.mkdir(parents=True)
    rows = fake_metrics()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if with_diag:
        (run_dir / "diagnostics.json").write_text(json.dumps(fake_diagnostics(np.random.default_rng(seed))))
    summary = {"status": "complete", "method": method, "dataset": "digits", "model": "cnn", "seed": seed,
               "best_acc": max(r["acc"] for r in rows), "final_acc": rows[-1]["acc"],
               "last10_acc": rows[-1]["acc"], "comm_cost": rows[-1]["comm_cost"], "cost_to_target": {},
               "setting": {"rho": rho, "tau": 0.5, "partition": "iid", "p": None, "alpha": None,
                           "num_clients": N}}
    (run_dir / "summary.json").write_text(json.dumps(summary))


def is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 2000 and path.read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for method in ("fedcorr", "fedavg"):
        for seed in (1, 0):
            write_fake_run(tmp_path / "sweep" / f"{method}_s{seed}", method, seed, 0.6,
                           with_diag=(method, seed) == ("fedcorr", 0))
    return tmp_path / "sweep"


def test_every_figure_of_a_representative_run(sweep: Path):
    assert report.main([str(sweep), "--out", str(sweep / "rep")]) == 0
    runs = sweep / "rep" / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["fedavg_0.6_0.5_seed0", "fedcorr_0.6_0.5_seed0"]
    for name in FIGURES:
        assert is_png(runs / "fedcorr_0.6_0.5_seed0" / f"{name}.png"), name
    assert [p.name for p in (runs / "fedavg_0.6_0.5_seed0").iterdir()] == ["curve.png"]  # no diagnostics
    assert is_png(sweep / "rep" / "acc_vs_cost.png")


def test_figure_modes(sweep: Path):
    frame = report.load_summaries(sweep)
    chosen = {mode: report.figure_runs(frame, "method", [], mode) for mode in report.FIGURE_MODES}
    assert [name for _, name, _ in chosen["summary"]] == ["fedavg_0.6_0.5_seed0", "fedcorr_0.6_0.5_seed0"]
    assert len(chosen["all"]) == 4 and chosen["none"] == []
    assert chosen["summary"][1][2] == "fedcorr, (0.6,0.5), seed 0"  # the figures' title
    report.main([str(sweep), "--figures", "none", "--out", str(sweep / "none")])
    assert not list((sweep / "none").glob("**/*.png")) and (sweep / "none" / "accuracy.md").exists()


def test_stage_spans_and_gmm_density():
    spans = plots.stage_spans(np.array([1, 2, 3, 5, 7]), ["a", "a", "b", "b", None])
    assert spans == [("a", 1.0, 2.0), ("b", 3.0, 5.0)]
    x = np.linspace(-10, 10, 2001)
    total, comp = plots.gmm_density(x, {"means": [[-2.0], [3.0]], "variances": [[[1.0]], [[0.25]]],
                                        "weights": [0.3, 0.7]})
    dx = x[1] - x[0]
    assert total.sum() * dx == pytest.approx(1.0, abs=1e-6)
    assert comp[1].sum() * dx == pytest.approx(0.7, abs=1e-6)
    assert comp[1].max() == pytest.approx(0.7 / np.sqrt(2 * np.pi * 0.25))


def test_malformed_diagnostics_lose_only_their_figure(tmp_path: Path, caplog):
    run = tmp_path / "run"
    write_fake_run(run, "fedcorr", 0, 0.6)
    diag = json.loads((run / "diagnostics.json").read_text())
    diag["records"]["lid"]["gmm"] = {"means": [1.0]}  # no variances
    (run / "diagnostics.json").write_text(json.dumps(diag))
    made = report.run_figures(run, tmp_path / "out", "t")
    assert sorted(p.stem for p in made) == sorted(set(FIGURES) - {"lid_gmm"})
    assert "no lid_gmm.png" in caplog.text


def test_line_styles_are_distinct_for_up_to_forty_methods():
    names = [f"method{i}" for i in range(40)]
    styles = plots.line_styles(names)
    assert len(set(styles.values())) == len(names)  # no two methods share (colour, line style)
    assert len({styles[n][0] for n in names[:10]}) == 10  # the first ten differ in colour alone


def test_panel_titles_name_the_axes():
    assert plots.panel_title("(0.6,0.5)") == "ρ=0.6, τ=0.5"
    assert plots.panel_title("cifar10 (0,0) non-IID (0.7,10)") == "cifar10 ρ=0, τ=0 non-IID p=0.7, α_Dir=10"
    assert plots.panel_title("cifar10n aggre") == "cifar10n aggre"


def test_centralized_rows_become_reference_lines(tmp_path: Path):
    lines = {"(0,0)": {"fedavg": (np.array([0, 10, 20]), np.array([10.0, 50.0, 80.0])),
                       "jointopt_central": (np.array([0.0]), np.array([91.0])),
                       "zero_cost": (np.array([0.0, 0.0]), np.array([30.0, 40.0]))}}
    kept, refs = report.figures.split_references(lines)
    assert list(kept["(0,0)"]) == ["fedavg"] and refs == {"(0,0)": {"jointopt_central": 91.0, "zero_cost": 40.0}}
    path = plots.plot_acc_vs_cost(kept, tmp_path / "acc.png", refs)
    assert path.stat().st_size > 0


@pytest.mark.slow  # CI runs it (make test-slow); the default suite stays short
def test_run_figures_drawn_in_two_processes_are_the_same_files(tmp_path: Path, caplog, monkeypatch):
    """A report's run figures spread over processes (figures.draw_runs): the same PNG bytes as drawn
    in this process, and a drawing process's warning reaches the report's log."""
    from fedlnl.benchmark.report import figures

    runs = []
    for k in range(4):
        run = tmp_path / f"run{k}"
        write_fake_run(run, "fedcorr", k, 0.6)
        runs.append(run)
    diag = json.loads((runs[2] / "diagnostics.json").read_text())
    diag["records"]["lid"]["gmm"] = {"means": [1.0]}  # no variances: that run loses lid_gmm.png, with a warning
    (runs[2] / "diagnostics.json").write_text(json.dumps(diag))
    jobs = lambda out: [(run, out / run.name, run.name, "acc") for run in runs]  # noqa: E731
    monkeypatch.setattr(figures, "RUNS_PER_PROCESS", 10**6)
    assert figures.processes(len(runs)) == 1
    figures.draw_runs(jobs(tmp_path / "one"))
    monkeypatch.setattr(figures, "RUNS_PER_PROCESS", 2)
    monkeypatch.setattr(figures.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert figures.processes(len(runs)) == 2
    caplog.clear()
    figures.draw_runs(jobs(tmp_path / "two"))
    assert "run2" in caplog.text and "no lid_gmm.png" in caplog.text
    one = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.png"))
    two = sorted(p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*.png"))
    assert one == two and len(one) == 4 * len(FIGURES) - 1
    assert all((tmp_path / "one" / p).read_bytes() == (tmp_path / "two" / p).read_bytes() for p in one)
