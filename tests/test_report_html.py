"""report.html: every table and figure of the report folder is on the page, checked in the file and
in a real headless browser (Debian's chromium + chromium-driver through selenium), which must load
it without a console error. The browser's screenshot is kept in tests/artifacts/report_html.png
(gitignored). Where no browser can start, the browser test skips with one line saying why."""
from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from fedlnl.benchmark import report
from test_figures import fake_diagnostics, fake_metrics

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
REFERENCE = """method,variant,dataset,model,partition,rho,tau,p,alpha,target,metric,mean,std,source
fedavg,,digits,,iid,0.4,0.5,,,,best_acc,70.00,1.00,Fake Table
fedcorr,,digits,,iid,0.4,0.5,,,,best_acc,80.00,1.00,Fake Table
fedprox,,digits,,iid,0.4,0.5,,,,best_acc,75.00,1.00,Fake Table
fedcorr,,digits,,iid,0.9,0.5,,,,best_acc,60.00,1.00,Fake Table
"""


def write_run(run_dir: Path, method: str, rho: float, seed: int, scale: float) -> None:
    run_dir.mkdir(parents=True)
    rows = [{**r, "acc": r["acc"] * scale} for r in fake_metrics()]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if rho == 0.4 and method != "fedprox":  # per-run diagnostic figures for two cells (time)
        (run_dir / "diagnostics.json").write_text(json.dumps(fake_diagnostics(np.random.default_rng(seed))))
    best = max(r["acc"] for r in rows)
    summary = {"status": "complete", "method": method, "dataset": "digits", "model": "cnn", "seed": seed,
               "preset": "fake", "best_acc": best, "final_acc": rows[-1]["acc"], "last10_acc": rows[-1]["acc"],
               "comm_cost": rows[-1]["comm_cost"], "cost_to_target": {"0.5": 40}, "detection": {"client_f1": 0.8},
               "setting": {"rho": rho, "tau": 0.5, "partition": "iid", "p": None, "alpha": None, "num_clients": 20}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text(f"- method={method}\n- noise.rho={rho}\n- seed={seed}\n")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("html") / "sweep"
    scales = {"fedavg": 0.8, "fedprox": 0.85, "fedcorr": 1.0}
    for method, scale in scales.items():
        for rho in (0.4, 0.8):
            for seed in range(3):
                write_run(root / f"{method}_{rho}_{seed}", method, rho, seed, scale - 0.01 * seed)
    (root / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra:\n    - hydra.mode=MULTIRUN\n    task:\n"
        "    - method=fedavg,fedprox,fedcorr\n    - noise.rho=0.4,0.8\n    - seed=0,1,2\n")
    (root.parent / "ref.csv").write_text(REFERENCE)
    assert report.main([str(root), "--reference", str(root.parent / "ref.csv")]) == 0
    return root / "report"


class Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables, self.images, self.details, self.pre = [], [], 0, ""
        self._in_pre = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append(attrs.get("data-name"))
        elif tag == "img":
            self.images.append(attrs.get("data-name"))
            assert attrs["src"].startswith("data:image/png;base64,")  # embedded: no file is read
        elif tag == "details":
            self.details += 1
        self._in_pre = tag == "pre"

    def handle_data(self, data):
        if self._in_pre:
            self.pre += data


def expected(out: Path) -> tuple[set, set]:
    figures = {p.relative_to(out).as_posix() for p in out.rglob("*.png")}
    comm = [line.removeprefix("### ") for line in (out / "comm.md").read_text().splitlines() if line.startswith("### ")]
    tables = {"accuracy", "ranks", "wtl", "agreement", "detection", "noise", *(f"comm: {t}" for t in comm)}
    assert len(comm) == 2  # the total and the cost to 50%
    return figures, tables


def test_page_holds_every_table_figure_note_and_command(page: Path):
    found = Collect()
    found.feed((page / "report.html").read_text(encoding="utf-8"))
    figures, tables = expected(page)
    assert len(figures) > 10 and "cd_diagram.png" in figures and "acc_vs_cost.png" in figures
    assert set(found.images) == figures and len(found.images) == len(figures)
    assert set(found.tables) == tables
    assert found.details >= 1 + 6  # the notes (folded) and one fold per run's figures
    assert "fedlnl-run -m method=fedavg,fedprox,fedcorr noise.rho=0.4,0.8 seed=0,1,2" in found.pre
    assert "fedlnl-run method=fedcorr noise.rho=0.8 seed=2" in found.pre
    text = (page / "report.html").read_text(encoding="utf-8")
    assert "Kendall τ_b per cell" in text and "Friedman test" in text and "Holm-corrected" in text


def _browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as err:
        pytest.skip(f"skipped: selenium is not installed ({err})")
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("skipped: no chromium and chromium-driver on PATH (apt-get install chromium chromium-driver)")
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        return webdriver.Chrome(service=Service(driver), options=options)
    except Exception as err:  # a browser that cannot start here (sandbox, libraries): one line
        pytest.skip(f"skipped: chromium did not start ({type(err).__name__}: {str(err).splitlines()[0]})")


def test_page_in_a_headless_browser(page: Path):
    figures, tables = expected(page)
    browser = _browser()
    try:
        browser.get((page / "report.html").as_uri())
        shown = browser.execute_script(
            "return [...document.querySelectorAll('table[data-name]')].map(t => t.dataset.name)")
        images = browser.execute_script(
            "return [...document.querySelectorAll('img')].map(i => [i.dataset.name, i.complete && i.naturalWidth > 0])")
        errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        height = browser.execute_script("return document.body.scrollHeight")
        browser.set_window_size(1400, min(int(height) + 100, 12000))
        ARTIFACTS.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "report_html.png"))
    finally:
        browser.quit()
    assert not errors, errors
    assert set(shown) == tables
    assert {name for name, ok in images if ok} == figures and all(ok for _, ok in images)
    assert (ARTIFACTS / "report_html.png").read_bytes()[:4] == b"\x89PNG"
