"""The runner's contract: outputs, determinism, shared federation, validation, W&B, report."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, compose_cfg, run_tiny

NOISY = ["noise.rho=0.6", "noise.tau=0.5"]


def test_summary_and_metrics_follow_the_contract(tmp_path):
    s = run_tiny(tmp_path, NOISY)
    for key in ("status", "best_acc", "final_acc", "last10_acc", "comm_cost", "cost_to_target",
                "wall_time_s", "federation_hash", "method", "seed", "bytes_up", "git_commit", "config"):
        assert key in s, key
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    # debug=tiny: 6 clients, frac 0.5 -> 3 participations per round
    assert [r["comm_cost"] for r in rows] == [3, 6, 9] and s["comm_cost"] == 9
    assert s["best_acc"] == max(r["acc"] for r in rows) and s["final_acc"] == rows[-1]["acc"]
    assert s["last10_acc"] == pytest.approx(sum(r["acc"] for r in rows) / 3)
    assert set(s["cost_to_target"]) == {"0.5", "0.65", "0.8"}
    for zeta, cost in s["cost_to_target"].items():
        hit = [r["comm_cost"] for r in rows if r["acc"] >= float(zeta)]
        assert cost == (hit[0] if hit else None)
    # balanced accuracy: every row has per-class recall; its mean over present classes is balanced_acc
    for r in rows:
        present = [a for a in r["class_acc"] if a is not None]
        assert len(r["class_acc"]) == 10 and r["balanced_acc"] == pytest.approx(sum(present) / len(present))
    assert s["best_balanced_acc"] == max(r["balanced_acc"] for r in rows)
    assert s["last10_balanced_acc"] == pytest.approx(sum(r["balanced_acc"] for r in rows) / 3)
    for zeta, cost in s["cost_to_target_balanced"].items():
        hit = [r["comm_cost"] for r in rows if r["balanced_acc"] >= float(zeta)]
        assert cost == (hit[0] if hit else None)
    assert (tmp_path / "diagnostics.json").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_summary_carries_the_digest_of_its_metrics_and_its_seal(tmp_path):
    """metrics_digest: SHA-256 and row count of metrics.jsonl's bytes as written; seal: the SHA-256
    of the summary's canonical JSON without the seal (fedlnl/benchmark/integrity.py)."""
    import hashlib

    run_tiny(tmp_path, NOISY)
    data = (tmp_path / "metrics.jsonl").read_bytes()
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["metrics_digest"] == {"sha256": hashlib.sha256(data).hexdigest(), "rows": 3}
    body = {k: v for k, v in written.items() if k != "seal"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert written["seal"] == hashlib.sha256(canonical).hexdigest()


def test_same_seed_same_numbers_and_methods_share_the_federation(tmp_path):
    a = run_tiny(tmp_path / "a", NOISY)
    b = run_tiny(tmp_path / "b", NOISY)
    ra = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    rb = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    strip = lambda rows: [{k: v for k, v in json.loads(r).items() if k != "time_s"} for r in rows]  # noqa: E731
    assert strip(ra) == strip(rb)
    assert a["best_acc"] == b["best_acc"]
    prox = run_tiny(tmp_path / "c", NOISY, method="fedprox")
    assert prox["federation_hash"] == a["federation_hash"]
    other_seed = run_tiny(tmp_path / "d", [*NOISY, "seed=1"])
    assert other_seed["federation_hash"] != a["federation_hash"]


def test_nan_loss_ends_run_as_diverged_with_a_summary(tmp_path):
    s = run_tiny(tmp_path, ["fl.lr=1e30"])
    assert s["status"] == "diverged"
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["status"] == "diverged" and "federation_hash" in saved


@pytest.mark.parametrize("override, key", [
    ("noise.rho=1.5", "noise.rho"), ("noise.tau=-0.1", "noise.tau"),
    ("fl.frac=0", "fl.frac"), ("fl.rounds=0", "fl.rounds"), ("fl.lr=-1", "fl.lr"),
    ("fl.batch_size=0", "fl.batch_size"), ("fl.local_epochs=0", "fl.local_epochs"),
    ("fl.num_clients=0", "fl.num_clients"), ("fl.num_clients=100000", "fl.num_clients"),
    ("partition=noniid partition.p=0", "partition.p"), ("partition=noniid partition.alpha=0", "partition.alpha"),
    ("noise.rho_tau=[0.6]", "noise.rho_tau"), ("fidelity=code", "fidelity"),
])
def test_invalid_config_is_one_line_error_before_anything_is_written(tmp_path, override, key):
    from fedlnl.benchmark.runner import run
    from fedlnl.benchmark.validate import ConfigError

    cfg = compose_cfg(["debug=tiny", "logger=none", *override.split()])
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path / "run", "fedavg")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(key) and "allowed" in msg
    assert not (tmp_path / "run").exists()


def test_cli_error_exits_nonzero_and_leaves_no_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "fedlnl.benchmark.run", "noise.rho=1.5", "logger=none", f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode != 0
    assert "fedlnl-run: error: noise.rho=1.5 is invalid: allowed a share in [0, 1]" in proc.stderr
    assert not run_dir.exists()


def test_unknown_method_keeps_hydras_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedlnl.benchmark.run", "method=nope", "logger=none",
                           f"hydra.run.dir={tmp_path / 'r'}"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode != 0 and "fedavg" in proc.stderr and "nope" in proc.stderr


def test_wandb_offline_run_is_created_and_finished(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    s = run_tiny(tmp_path, ["logger=wandb", "logger.mode=offline"])
    assert s["status"] == "complete"
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb")), "no W&B data file written"
    import wandb
    assert wandb.run is None  # finished, so the next Hydra job starts its own run


def test_tiny_sweep_then_report(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "fedlnl.benchmark.run", "-m", "debug=tiny", "logger=none", "device=cpu",
           "method=fedavg,fedprox", "noise.rho_tau=[0.0,0.0],[0.6,0.5]", "seed=0,1", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summaries = list(sweep.rglob("summary.json"))
    assert len(summaries) == 8
    from fedlnl.benchmark.report import main as report_main
    assert report_main([str(sweep)]) == 0
    table = (sweep / "report" / "accuracy.md").read_text()
    assert "fedavg" in table and "fedprox" in table and "(0.6,0.5)" in table
    assert (sweep / "report" / "acc_vs_cost.png").stat().st_size > 1000
