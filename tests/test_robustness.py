"""Nothing a user types or a machine does crashes a run, loses it, or silently changes it (issue 9).

Malformed inputs go through the real command line (``fedlnl-run``'s ``main``, in this process): exit
code 2, one ``fedlnl-run: error:`` line naming the key or file, no traceback, nothing written.
Faults: truncated checkpoints, two processes on one cell, W&B resume, invalid and very long sweeps.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from conftest import REPO, compose_cfg, run_tiny

TINY = ["debug=tiny", "logger=none", "device=cpu"]

#: (overrides, text the error line must contain: the key or the file)
MALFORMED = [
    # runner keys
    (["seed=1.5"], "seed=1.5"), (["seed=-1"], "seed=-1"), (["seed=abc"], "seed='abc'"), (["seed=null"], "seed=None"),
    (["seed=true"], "seed=True"), (["threads=-1"], "threads=-1"), (["threads=1.5"], "threads=1.5"),
    (["checkpoint_every=-5"], "checkpoint_every=-5"), (["checkpoint_every=abc"], "checkpoint_every"),
    (["skip_complete=maybe"], "skip_complete"), (["targets=[abc]"], "targets="), (["targets=[0]"], "targets="),
    (["targets=[1.5]"], "targets="), (["targets=[]"], "targets="), (["targets=0.5"], "targets="),
    (["fidelity=papr"], "fidelity='papr'"), (["noise.fidelity=x"], "noise.fidelity='x'"),
    (["device=gpu"], "device='gpu'"), (["device=cuda:x"], "device="), (["name=a/b"], "name='a/b'"),
    (["logger=wandb", "logger.mode=onlin"], "logger.mode='onlin'"),
    # federation and local training
    (["fl.frac=0"], "fl.frac=0"), (["fl.frac=1.5"], "fl.frac=1.5"), (["fl.frac=abc"], "fl.frac"),
    (["fl.rounds=0"], "fl.rounds=0"), (["fl.rounds=2.5"], "fl.rounds=2.5"), (["fl.local_epochs=0"], "fl.local_epochs=0"),
    (["fl.batch_size=0"], "fl.batch_size=0"), (["fl.batch_size=null"], "fl.batch_size=None"),
    (["fl.lr=0"], "fl.lr=0"), (["fl.lr=-1"], "fl.lr=-1"), (["fl.lr=abc"], "fl.lr"), (["fl.lr=null"], "fl.lr=None"),
    (["fl.momentum=5"], "fl.momentum=5"), (["fl.momentum=-0.1"], "fl.momentum=-0.1"),
    (["fl.weight_decay=-1"], "fl.weight_decay=-1"), (["fl.eval_batch_size=0"], "fl.eval_batch_size=0"),
    (["fl.eval_every=0"], "fl.eval_every=0"), (["fl.num_clients=0"], "fl.num_clients=0"),
    (["fl.num_clients=100000"], "fl.num_clients=100000"), (["fl.augment=maybe"], "fl.augment"),
    # noise and partition
    (["noise.rho=1.5"], "noise.rho=1.5"), (["noise.rho=-0.1"], "noise.rho=-0.1"), (["noise.tau=2"], "noise.tau=2"),
    (["noise.rho=abc"], "noise.rho"), (["noise.rho_tau=[0.6]"], "noise.rho_tau"),
    (["noise.rho_tau=[0.6,0.5]", "noise.rho=0.2"], "noise.rho=0.2 contradicts noise.rho_tau"),
    (["partition=noniid", "partition.p=0"], "partition.p=0"), (["partition=noniid", "partition.alpha=0"], "partition.alpha=0"),
    (["partition=noniid", "partition.p_alpha=[0.7]"], "partition.p_alpha"),
    # names of config options, unknown keys
    (["paper=fedcorr_t22"], "paper=fedcorr_t22"), (["debug=tine"], "debug=tine"), (["experiment=quickstrat"], "experiment=quickstrat"),
    (["method=fedavgg"], "method=fedavgg"), (["dataset=cifar11"], "dataset=cifar11"), (["model=resnet19"], "model=resnet19"),
    (["partition=nonid"], "partition=nonid"), (["noise=symetric"], "noise=symetric"), (["logger=wand"], "logger=wand"),
    (["+method@method.stage3=fedprx"], "method=fedprx"), (["fl.lrr=1"], "fl.lrr"), (["method=fedprox", "method.muu=1"], "method.muu"),
    # method hyperparameters (the method's own checks) and values that cannot take effect
    (["method=fedprox", "method.mu=-1"], "method.mu=-1"), (["method=fedprox", "method.mu=abc"], "method.mu='abc'"),
    (["method=fedprox", "method.prox_form=x"], "method.prox_form='x'"), (["method=fedprox", "method.lr=-1"], "method.lr=-1"),
    (["method=fedcorr", "method.T1=0"], "method.T1=0"), (["method=fedcorr", "method.beta=-1"], "method.beta=-1"),
    (["method=fedcorr", "method.theta=2"], "method.theta=2"), (["method=fedcorr", "method.kappa_cmp=x"], "method.kappa_cmp"),
    (["method=feddiv", "method.zeta=2"], "method.zeta=2"), (["method=poc", "method.d=0"], "method.d=0"),
    (["method=feddyn", "method.alpha=0"], "method.alpha=0"), (["method=rofl", "method.forget_rate=1"], "method.forget_rate=1"),
    (["method=arfl", "method.lam=0"], "method.lam=0"), (["method=jointopt", "method.train_lr=0"], "method.train_lr=0"),
    (["method=dividemix", "method.p_threshold=1.5"], "method.p_threshold=1.5"),
    (["method=dividemix_central", "method.warmup_epochs=1000"], "method.warmup_epochs=1000"),
    (["method=fedcorr", "fl.rounds=5"], "fl.rounds=5 does not apply"),
    (["method=fedprox", "dataset=cifar10", "fl.lr=0.05"], "fl.lr=0.05 is shadowed by method.lr=0.01"),
    # models that cannot take the data, missing or broken data
    (["model=vgg11"], "model=vgg11 cannot take dataset=digits"),
    (["dataset=folder"], "dataset.root='???' is invalid"),
    (["dataset=folder", "dataset.root=/nonexistent/fedlnl"], "/nonexistent/fedlnl"),
    (["dataset=cifar10_jpeg", "dataset.root=/nonexistent/fedlnl"], "/nonexistent/fedlnl"),
]


def cli(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """``fedlnl-run ARGS`` in this process (Hydra's real entry point), from ``cwd``."""
    from fedlnl.benchmark.run import main

    GlobalHydra.instance().clear()
    out, err = io.StringIO(), io.StringIO()
    argv, here = sys.argv, os.getcwd()
    sys.argv = ["fedlnl-run", *args]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code
    finally:
        sys.argv = argv
        os.chdir(here)
        GlobalHydra.instance().clear()
    return code, out.getvalue(), err.getvalue()


def assert_refused(result: tuple[int, str, str], message: str, cwd: Path) -> None:
    """The refusal contract: exit 2, exactly one ``fedlnl-run: error:`` line naming ``message``, no
    traceback, and nothing written under ``cwd``."""
    code, out, err = result
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]
    assert code == 2, (code, out, err)
    assert len(errors) == 1 and errors[0].startswith("fedlnl-run: error: "), lines
    assert message in errors[0], errors[0]
    assert "Traceback" not in out + err
    assert not any(cwd.iterdir()), f"left behind: {sorted(p.name for p in cwd.rglob('*'))}"


def test_at_least_sixty_malformed_inputs_are_covered():
    assert len(MALFORMED) >= 60


@pytest.mark.parametrize("overrides, key", MALFORMED, ids=[" ".join(o) for o, _ in MALFORMED])
def test_malformed_input_is_one_line_exit_2_and_writes_nothing(tmp_path, overrides, key):
    keys = {o.split("=")[0] for o in overrides}
    assert_refused(cli([*overrides, *(t for t in TINY if t.split("=")[0] not in keys)], tmp_path), key, tmp_path)


def test_a_sweep_with_one_invalid_cell_runs_nothing(tmp_path):
    code, out, err = cli(["-m", "method=fedavg,fedcorr", "fl.rounds=2", *TINY, "name=bad",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert code == 2
    assert "cell [method=fedcorr fl.rounds=2" in err and "fl.rounds=2 does not apply to FedCorr" in err
    assert "1 of 2 cells are invalid; nothing was run" in err and "Traceback" not in err
    assert not (tmp_path / "sweep").exists()


def test_a_very_long_override_list_gets_a_short_stable_cell_name(tmp_path):
    long = ["fl.lr=0.0500000000001", "fl.momentum=0.500000000001", "fl.weight_decay=0.0000000000001",
            "noise.rho_tau=[0.600000000001,0.500000000001]", "targets=[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8]",
            "method=fedprox", "method.mu=0.0100000000001", "method.prox_form=squared", "variant=a_long_variant_label",
            "seed=3", "fl.eval_every=1", "fl.augment=false", "fl.batch_size=16"]
    code, out, err = cli(["-m", *long, *TINY, f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert code == 0, err[-2000:]
    cells = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert len(cells) == 1 and len(cells[0].name.encode()) <= 160
    assert json.loads((cells[0] / "summary.json").read_text())["status"] == "complete"
    recorded = (cells[0] / ".hydra" / "overrides.yaml").read_text()
    assert all(o.split("=")[0] in recorded for o in long)


# ------------------------------------------------------------------------------------ faults
def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04truncated"])
def test_truncated_checkpoint_is_moved_aside_and_the_run_starts_over(tmp_path, content):
    straight = run_tiny(tmp_path / "straight", ["fl.rounds=3"])
    run_dir = tmp_path / "broken"
    run_dir.mkdir()
    (run_dir / "checkpoint.pt").write_bytes(content)
    again = run_tiny(run_dir, ["fl.rounds=3", "checkpoint_every=1"])
    assert again["status"] == "complete" and (run_dir / "checkpoint.pt.corrupt").read_bytes() == content
    assert again["best_acc"] == straight["best_acc"]
    assert _rows(run_dir / "metrics.jsonl") == _rows(tmp_path / "straight" / "metrics.jsonl")


def test_a_cell_locked_by_a_live_process_is_skipped_and_a_stale_lock_is_taken_over(tmp_path):
    import socket

    from fedlnl.benchmark.run import CellLock

    run_dir = tmp_path / "cell"
    run_dir.mkdir()
    (run_dir / ".lock").write_text(f"{socket.gethostname()} {os.getpid()}\n")  # alive: this process
    skipped = run_tiny(run_dir, ["fl.rounds=2"])
    assert skipped["status"] == "running" and not (run_dir / "metrics.jsonl").exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run_dir / ".lock").write_text(f"{socket.gethostname()} {int(dead.stdout)}\n")  # a finished process
    done = run_tiny(run_dir, ["fl.rounds=2"])
    assert done["status"] == "complete" and not (run_dir / ".lock").exists()
    assert CellLock(run_dir).acquire()


def test_two_processes_on_one_sweep_never_train_a_cell_twice(tmp_path):
    cmd = [sys.executable, "-m", "fedlnl.benchmark.run", "-m", "method=fedavg,fedprox", "seed=0,1", "fl.rounds=2",
           *TINY, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    trained = sum(o.count("best acc") for o in outs)
    cells = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert len(cells) == 4 and trained == 4, outs  # each cell trained by exactly one process
    for cell in cells:
        assert json.loads((cell / "summary.json").read_text())["status"] == "complete"
        rows = _rows(cell / "metrics.jsonl")
        assert [r["round"] for r in rows] == [1, 2]  # one writer: no interleaved rows


def test_a_resumed_run_continues_its_own_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from fedlnl.benchmark import run as runmod

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_cfg(["method=fedavg", *TINY, "logger=wandb", "logger.mode=offline", "fl.rounds=3",
                       "checkpoint_every=1"])
    real = runmod.Runner.evaluate

    def crash_at_round_2(self, state, rnd, *a):
        if rnd == 1:
            raise KeyboardInterrupt
        return real(self, state, rnd, *a)

    monkeypatch.setattr(runmod.Runner, "evaluate", crash_at_round_2)
    with pytest.raises(KeyboardInterrupt):
        runmod.run(cfg, tmp_path, "fedavg")
    failed = json.loads((tmp_path / "summary.json").read_text())
    assert failed["status"] == "failed" and failed["error"] == "KeyboardInterrupt"
    monkeypatch.setattr(runmod.Runner, "evaluate", real)
    resumed = runmod.run(cfg, tmp_path, "fedavg")
    assert resumed["status"] == "complete" and resumed["rounds_run"] == 3
    ids = {p.name.rsplit("-", 1)[-1] for p in (tmp_path / "wandb").glob("offline-run-*")}
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 2 and len(ids) == 1  # one W&B run, resumed


def test_a_failure_after_training_started_keeps_metrics_and_says_why(tmp_path, monkeypatch):
    from fedlnl.benchmark import run as runmod

    real = runmod.Runner.evaluate

    def disk_full(self, state, rnd, *a):
        if rnd == 1:
            raise OSError(28, "No space left on device")
        return real(self, state, rnd, *a)

    monkeypatch.setattr(runmod.Runner, "evaluate", disk_full)
    with pytest.raises(OSError):
        run_tiny(tmp_path, ["fl.rounds=3"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left on device" in summary["error"]
    assert [r["round"] for r in _rows(tmp_path / "metrics.jsonl")] == [1]


# ------------------------------------------------------------------------------------ numbers
def test_a_test_loss_of_exactly_zero_is_not_divergence(tmp_path, monkeypatch):
    from fedlnl.methods.common import engine

    monkeypatch.setattr(engine, "evaluate", lambda *a, **k: engine.Evaluation(1.0, 0.0, 1.0, [1.0] * 10))
    s = run_tiny(tmp_path, ["fl.rounds=2"])
    assert s["status"] == "complete" and s["best_acc"] == 1.0 and s["best_balanced_acc"] == 1.0


def test_an_exploding_run_is_diverged_not_complete(tmp_path):
    s = run_tiny(tmp_path, ["fl.rounds=3", "fl.lr=100000"])
    assert s["status"] == "diverged" and s["rounds_run"] < 3


def test_metrics_are_byte_identical_between_two_runs_and_timing_is_apart(tmp_path):
    run_tiny(tmp_path / "a", ["fl.rounds=2"])
    run_tiny(tmp_path / "b", ["fl.rounds=2"])
    a, b = (tmp_path / d / "metrics.jsonl" for d in "ab")
    assert a.read_bytes() == b.read_bytes() and "time_s" not in a.read_text()
    assert [r["round"] for r in _rows(tmp_path / "a" / "timing.jsonl")] == [1, 2]


def test_the_thread_count_is_part_of_the_config_hash():
    from fedlnl.benchmark.run import NON_RESULT_KEYS, config_hash

    one = compose_cfg(["threads=1", *TINY])
    two = compose_cfg(["threads=2", *TINY])
    from omegaconf import OmegaConf

    assert "threads" not in NON_RESULT_KEYS
    assert config_hash(OmegaConf.to_container(one, resolve=True)) != config_hash(OmegaConf.to_container(two, resolve=True))


def test_online_wandb_without_a_login_says_how_to_log_in(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    code, out, err = cli(["logger=wandb", "logger.mode=online", "debug=tiny", "device=cpu"], tmp_path)
    assert code == 2 and "logger.mode=online needs a W&B login: run `wandb login`" in err
    assert not any(tmp_path.iterdir())


def test_the_cli_error_path_has_no_traceback_in_a_real_subprocess(tmp_path):
    res = subprocess.run([sys.executable, "-m", "fedlnl.benchmark.run", "paper=fedcorr_t2", "debug=tine"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.strip() == "fedlnl-run: error: debug=tine is invalid: allowed tiny"
    assert not any(tmp_path.iterdir())


def test_dry_run_lists_the_cells_and_what_is_left_without_running_anything(tmp_path):
    sweep = tmp_path / "sweep"
    code, _, err = cli(["-m", "method=fedavg", "seed=0,1", "fl.rounds=2", *TINY, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert code == 0, err[-2000:]
    before = sorted(p.name for p in sweep.iterdir())
    code, out, err = cli(["-m", "method=fedavg", "seed=0,1,2", "fl.rounds=2", *TINY, f"hydra.sweep.dir={sweep}",
                          "dry_run=true"], tmp_path)
    assert code == 0, err[-2000:]
    assert "3 cells, 2 complete, 1 to run (~6 client participations)" in out  # 2 rounds x 3 of 6 clients
    assert "time left: ~" in out and sorted(p.name for p in sweep.iterdir()) == before
