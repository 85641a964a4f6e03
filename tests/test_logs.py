"""Logs without walls (issue 35 item 4): progress bars only on a terminal, whole cell names in a plan."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import REPO
from fedlnl.benchmark.plan import cell_names
from fedlnl.datasets import sources

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
TINY = ["method=fedavg", "debug=tiny", "logger=none", "device=cpu", "threads=1"]


def test_a_redirected_decode_logs_a_start_and_an_end_line_and_no_bar(tmp_path, capfd, caplog):
    from PIL import Image

    paths = []
    for i in range(3):
        paths.append(tmp_path / f"{i}.jpg")
        Image.fromarray(np.full((4, 4, 3), 40 * i, dtype=np.uint8)).save(paths[-1])
    with caplog.at_level(logging.INFO, logger="fedlnl"):
        images, kept = sources._decode_all(paths, None, 1, "decoding toy/train")
    assert images.shape == (3, 3, 4, 4) and kept.tolist() == [0, 1, 2]
    assert [r.getMessage() for r in caplog.records] == ["decoding toy/train: 3 images", "decoding toy/train: done"]
    out, err = capfd.readouterr()
    assert "\r" not in out + err and "img/s" not in out + err


def test_a_run_logged_to_a_file_holds_no_carriage_return(tmp_path):
    log = tmp_path / "run.log"
    with log.open("w") as fh:
        proc = subprocess.run([sys.executable, "-m", "fedlnl.benchmark.run", *TINY, "fl.rounds=3",
                               f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=ENV, stdout=fh,
                              stderr=subprocess.STDOUT, timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-2000:]
    assert "\r" not in text and "fedavg seed 0: best acc" in text  # no frames; the run's end line


def test_a_logged_run_says_it_is_alive_once_per_heartbeat():
    """Not on a terminal, the runner logs a round line when Heartbeat.due(): at most once per
    ``every`` seconds, never per round (a clock passed in, not time)."""
    from fedlnl.benchmark.runner import Heartbeat

    now = [0.0]
    beat = Heartbeat(every=600.0, clock=lambda: now[0])
    due = []
    for step in range(1, 41):  # 40 rounds of 50 s each: 2000 s
        now[0] = 50.0 * step
        due.append(beat.due())
    assert [50 * (i + 1) for i, d in enumerate(due) if d] == [600, 1200, 1800]
    assert Heartbeat.EVERY_S == 600.0


def test_plan_cell_names_are_whole_and_relative_to_their_sweep():
    sweep = Path("/results/sweeps/a_rather_long_sweep_name")
    long = "method=dividemix,noise.rho_tau=[0.6,0.5],partition=dirichlet,partition.alpha_dir=0.5,seed=2"
    names, root = cell_names([sweep / long, sweep / "method=fedavg,seed=0"])
    assert (names, root) == ([long, "method=fedavg,seed=0"], sweep)
    names, root = cell_names([sweep / long, Path("/elsewhere/x")])
    assert (names, root) == ([str(sweep / long), "/elsewhere/x"], None)


def test_a_dry_run_prints_every_cell_name_whole(tmp_path):
    sweep = tmp_path / ("s" * 80)
    proc = subprocess.run([sys.executable, "-m", "fedlnl.benchmark.run", "-m", *TINY, "fl.rounds=2",
                           "seed=0,1", f"hydra.sweep.dir={sweep}", "dry_run=true"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"cells under {sweep}:" in proc.stdout
    for seed in (0, 1):
        name = f"debug=tiny,fl.rounds=2,method=fedavg,seed={seed}"
        rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(name + " ")]
        assert len(rows) == 1, proc.stdout
    assert not (REPO / "results" / "sweeps" / ("s" * 80)).exists()


def test_a_redirected_run_on_images_logs_each_decoded_split_in_two_lines(tmp_path):
    """A single run decodes its images before Hydra sets logging up: its start and end lines still
    reach the redirected log (on stderr), and no bar frame does."""
    from PIL import Image

    for split in ("train", "test"):
        for c in ("a", "b", "c"):
            folder = tmp_path / "img" / split / c
            folder.mkdir(parents=True)
            for i in range(20):
                Image.fromarray(np.full((6, 6, 3), 10 * i, dtype=np.uint8)).save(folder / f"{i}.png")
    log = tmp_path / "run.log"
    with log.open("w") as fh:
        proc = subprocess.run([sys.executable, "-m", "fedlnl.benchmark.run", *TINY, "dataset=folder",
                               f"dataset.root={tmp_path / 'img'}", f"dataset.cache_dir={tmp_path / 'cache'}",
                               "dataset.workers=1", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=ENV,
                              stdout=fh, stderr=subprocess.STDOUT, timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-2000:]
    assert "\r" not in text
    for split in ("train", "test"):
        assert [ln for ln in text.splitlines() if f"decoding img/{split}:" in ln] == [
            f"[fedlnl] decoding img/{split}: 60 images", f"[fedlnl] decoding img/{split}: done"], text[:2000]
