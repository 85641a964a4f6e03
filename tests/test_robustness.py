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

from conftest import REPO, compose_cfg, run_tiny, shared_data  # noqa: F401

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
    # issue 19: model constructors, command-line forms and values that used to give a traceback or train silently
    (["model=lenet"], "model=lenet cannot be built for dataset=digits (1x8x8 images, 10 classes): LeNet needs"),
    (["model=resnet50"], "model=resnet50 cannot be built for dataset=digits (1x8x8 images, 10 classes): ResNet-50"),
    (["model=resnet50", "model.pretrained=true", "dataset=synthetic", "dataset.channels=1"],
     "pretrained ResNet-50 needs 3 input channels, got 1"),
    (["~fl.lr"], "~fl.lr is invalid: deleting a key is not supported"),
    (["~method"], "~method is invalid: deleting a key is not supported"),
    (["seed=99999999999999999999"], "seed=99999999999999999999 is invalid: allowed an integer in [0, 2**63 - 1]"),
    ([f"name={'x' * 300}"], "of at most 60 characters (got 300)"),
    (["threads=1000"], "threads=1000 is invalid: allowed an integer in [0, "),
    (["fl.lr=0.1", "fl.lr=0.2"], "fl.lr is given twice (fl.lr=0.1 and fl.lr=0.2): keep one"),
    (["+unknown=3"], "+unknown=3 is invalid: unknown is not a key of the config"),
    (["+fl.foo=3"], "+fl.foo=3 is invalid: fl.foo is not a key of the config"),
    (["+logger.foo=3"], "+logger.foo=3 is invalid"),
    (["checkpoint_minutes=-1"], "checkpoint_minutes=-1 is invalid"),
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

    from fedlnl.benchmark.lock import CellLock

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


def wandb_steps(run_dir: Path) -> dict[str, list[int]]:
    """{offline run folder: the history steps its .wandb file holds} (the file's record log: 32 KiB
    blocks of records with a 7-byte header each, FULL or FIRST/MIDDLE/LAST fragments)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    out = {}
    for path in sorted((run_dir / "wandb").glob("offline-run-*/*.wandb")):
        data, pos, block, records, part = path.read_bytes(), 7, 32768, [], b""
        while pos + 7 <= len(data):
            if block - pos % block < 7:
                pos += block - pos % block
                continue
            _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind == 0 and length == 0:
                break
            if kind in (1, 4):
                records.append(part + chunk)
                part = b""
            else:
                part += chunk
        steps = []
        for raw in records:
            record = pb.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "history":
                steps.append(record.history.step.num)
        out[path.parent.name] = steps
    return out


def test_a_resumed_run_continues_its_own_wandb_run(tmp_path, monkeypatch):
    """Offline, a run killed after its checkpoint and resumed leaves one W&B run with every round:
    the earlier attempt's folder is replaced, the rounds up to the checkpoint are logged again."""
    pytest.importorskip("wandb")
    from fedlnl.benchmark import runner as runmod

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_cfg(["method=fedavg", *TINY, "logger=wandb", "logger.mode=offline", "fl.rounds=4",
                       "checkpoint_every=2"])
    real = runmod.Runner.evaluate

    def crash_at_round_3(self, state, rnd, *a):
        if rnd == 2:
            raise KeyboardInterrupt
        return real(self, state, rnd, *a)

    monkeypatch.setattr(runmod.Runner, "evaluate", crash_at_round_3)
    with pytest.raises(KeyboardInterrupt):
        runmod.run(cfg, tmp_path, "fedavg")
    failed = json.loads((tmp_path / "summary.json").read_text())
    assert failed["status"] == "failed" and failed["error"] == "KeyboardInterrupt"
    assert list(wandb_steps(tmp_path).values()) == [[1, 2]]
    monkeypatch.setattr(runmod.Runner, "evaluate", real)
    resumed = runmod.run(cfg, tmp_path, "fedavg")
    assert resumed["status"] == "complete" and resumed["rounds_run"] == 4
    steps = wandb_steps(tmp_path)
    assert list(steps.values()) == [[1, 2, 3, 4]], steps  # one run, no stub, no gap
    assert next(iter(steps)).endswith(runmod.Runner(cfg, tmp_path, "fedavg", "single", None).wandb_id())


def test_online_wandb_without_a_server_falls_back_to_offline(tmp_path, monkeypatch, caplog):
    """No answer from the W&B server: one warning line, the run logs offline and completes."""
    pytest.importorskip("wandb")
    import logging

    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)  # a login is known; the server is what is missing
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # no settings file of this machine
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    cfg = compose_cfg(["method=fedavg", *TINY, "logger=wandb", "logger.mode=online", "fl.rounds=2"])
    from fedlnl.benchmark.runner import run

    with caplog.at_level(logging.WARNING, logger="fedlnl"):
        s = run(cfg, tmp_path, "fedavg")
    assert s["status"] == "complete" and len(_rows(tmp_path / "metrics.jsonl")) == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("W&B:")]
    assert len(lines) == 1 and "cannot reach http://127.0.0.1:9" in lines[0] and "logging offline" in lines[0]
    assert list(wandb_steps(tmp_path).values()) == [[1, 2]]


def _wandb_online(tmp_path, monkeypatch, url: str) -> dict:
    """A tiny online run against the W&B server at ``url``; its W&B warning lines."""
    import logging

    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose_cfg(["method=fedavg", *TINY, "logger=wandb", "logger.mode=online", "fl.rounds=2"])
    from fedlnl.benchmark.runner import run

    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("fedlnl").addHandler(handler)
    try:
        summary = run(cfg, tmp_path / "run", "fedavg")
    finally:
        logging.getLogger("fedlnl").removeHandler(handler)
    return {"summary": summary, "lines": [r.getMessage() for r in records if r.getMessage().startswith("W&B:")]}


def test_a_wandb_server_that_accepts_but_never_answers_falls_back_to_offline(tmp_path, monkeypatch):
    """The kernel accepts connections on a listening socket nobody reads: the probe gets no HTTP
    answer within PROBE_S and the run logs offline, instead of waiting for wandb.init's timeout."""
    pytest.importorskip("wandb")
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        got = _wandb_online(tmp_path, monkeypatch, url)
    assert got["summary"]["status"] == "complete" and len(_rows(tmp_path / "run" / "metrics.jsonl")) == 2
    assert len(got["lines"]) == 1 and f"no answer from {url} within 3 s; logging offline" in got["lines"][0]
    assert list(wandb_steps(tmp_path / "run").values()) == [[1, 2]]


def test_a_wandb_server_that_answers_but_never_starts_the_run_falls_back_cleanly(tmp_path, monkeypatch):
    """A server that answers a plain GET but never its API: wandb.init times out (INIT_TIMEOUT_S) and
    the run falls back to offline with the same run id (it died with "run ID ... is in use")."""
    pytest.importorskip("wandb")
    import socket
    import threading

    from fedlnl.benchmark.sinks import WandbSink

    server, held = socket.socket(), []
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            request = conn.recv(65536)
            if request.startswith(b"GET"):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                conn.close()
            else:
                held.append(conn)  # the API call: never answered

    threading.Thread(target=serve, daemon=True).start()
    monkeypatch.setattr(WandbSink, "INIT_TIMEOUT_S", 5)
    try:
        got = _wandb_online(tmp_path, monkeypatch, f"http://127.0.0.1:{server.getsockname()[1]}")
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert got["summary"]["status"] == "complete"
    assert len(got["lines"]) == 1 and got["lines"][0].startswith("W&B: online start failed (") and "in use" not in got["lines"][0]
    assert list(wandb_steps(tmp_path / "run").values()) == [[1, 2]]


def test_a_failure_after_training_started_keeps_metrics_and_says_why(tmp_path, monkeypatch):
    from fedlnl.benchmark import runner as runmod

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
    from fedlnl.compute import evaluation

    def perfect(*a, groups=None, **k):  # every prediction right, the clients' local test sets included
        return evaluation.Evaluation(1.0, 0.0, 1.0, [1.0] * 10, [groups.shape[1]] * groups.shape[0])

    monkeypatch.setattr(evaluation, "evaluate", perfect)
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
    from fedlnl.benchmark.rundir import config_hash
    from fedlnl.conf.keys import NON_RESULT_KEYS

    one = compose_cfg(["threads=1", *TINY])
    two = compose_cfg(["threads=2", *TINY])
    from omegaconf import OmegaConf

    assert "threads" not in NON_RESULT_KEYS
    assert config_hash(OmegaConf.to_container(one, resolve=True)) != config_hash(OmegaConf.to_container(two, resolve=True))


def test_a_cell_directory_leaves_out_the_declared_keys_and_the_user_guide_lists_the_hashed_ones():
    """One declaration (fedlnl/conf/keys.py): Hydra's ``exclude_keys`` reads it, the guide names it."""
    import re

    from hydra import compose, initialize_config_module

    from fedlnl.conf.keys import CELL_DIR_EXCLUDED, NON_RESULT_KEYS

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="fedlnl.conf", version_base=None):
        cfg = compose("config", overrides=["preset=x", "threads=1", "device=cpu", "fl.lr=0.1"], return_hydra_config=True)
    assert list(cfg.hydra.job.config.override_dirname.exclude_keys) == list(CELL_DIR_EXCLUDED)
    assert cfg.hydra.job.override_dirname == "fl.lr=0.1"
    guide = (REPO / "docs" / "user-guide.md").read_text()
    listed = re.search(r"\(`NON_RESULT_KEYS` in fedlnl/conf/keys.py\): ([^.]*)\.", guide.replace("\n", " "))
    assert listed and re.findall(r"`(\w+)`", listed.group(1)) == list(NON_RESULT_KEYS)


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
    # 2 rounds x 3 of 6 clients, one epoch of 32-sample batches over 215-216 training samples (239-240
    # minus the 24 of the client's validation set, selection.val_share=0.1): 7 steps an update
    assert "3 cells, 2 complete, 1 to run: 6 client participations, 42 local steps" in out
    cell = [ln for ln in out.splitlines() if "method=fedavg,seed=2" in ln][0].split()
    assert cell[1:5] == ["fedavg", "2", "6", "42"] and cell[-2:] == ["to", "run"], cell
    assert "time left: ~" in out and sorted(p.name for p in sweep.iterdir()) == before


def test_the_time_left_counts_a_shared_prefix_once(tmp_path):
    """Seconds per local step x the steps to run, where a cell whose shared prefix is saved (a file)
    or is saved by an earlier cell of the sweep (the same key) runs only the rounds after it."""
    from fedlnl.benchmark.plan import Plan
    from fedlnl.benchmark.sweeper import Cell, time_left

    (tmp_path / "saved.pt").write_bytes(b"")
    plan = Plan(4, local_steps=30, round_steps=[10, 10, 5, 5])
    todo = [(Cell([], method_name="m", prefix=(2, "k", tmp_path / "absent.pt")), plan),  # computes it: 30
            (Cell([], method_name="m", prefix=(2, "k", tmp_path / "absent.pt")), plan),  # after it: 10
            (Cell([], method_name="m", prefix=(3, "j", tmp_path / "saved.pt")), plan),   # after 3 rounds: 5
            (Cell([], method_name="m"), plan),                                           # no prefix: 30
            (Cell([], method_name="x", prefix=(2, "k", tmp_path / "absent.pt")), plan)]  # no speed
    assert time_left(todo, {"m": [1.0, 3.0]}) == (2.0 * (30 + 10 + 5 + 30), 1, 3)


def test_a_plan_finds_the_shared_prefix_a_run_saved(tmp_path):
    """The plan's prefix keys are the runner's: after FedCorr + Median saved stages 1-2, FedCorr of the
    same seed starts after them (the file), and Median of seed 1 after FedCorr of seed 1 (earlier in
    the sweep)."""
    sweep = tmp_path / "sweep"
    code, _, err = cli(["-m", "method=fedcorr_median", "seed=0", *TINY, f"hydra.sweep.dir={sweep}"], tmp_path)
    assert code == 0, err[-2000:]
    assert len(list((sweep / ".prefixes").iterdir())) == 1
    code, out, err = cli(["-m", "method=fedcorr,fedcorr_median", "seed=0,1", *TINY, f"hydra.sweep.dir={sweep}",
                          "dry_run=true"], tmp_path)
    assert code == 0, err[-2000:]
    assert "4 cells, 1 complete, 3 to run" in out
    assert "; 2 cells start after a shared prefix, its rounds counted once; 2 cells of methods without" in out


def test_dry_run_of_a_single_run_prints_its_plan_and_trains_nothing(tmp_path):
    code, out, err = cli(["method=fedcorr", *TINY, "dry_run=true"], tmp_path)
    assert code == 0, err[-2000:]
    # 24 updates of one epoch over 215-216 training samples (the rest is validation): 7 steps of 32 each
    assert "fedcorr seed 0: 16 rounds, ≤24 client participations, ≤168 local steps" in out
    assert "dry_run=true: nothing was trained or written" in out and not any(tmp_path.iterdir())


def test_a_plan_without_the_data_lists_the_cells_and_says_why(tmp_path):
    """A plan may be made where the data is not (a login node): the cells are listed without figures;
    the same sweep, run, is refused."""
    args = ["-m", "method=fedavg,fedprox", "dataset=folder", "dataset.root=/nonexistent/fedlnl", "logger=none",
            "device=cpu", "fl.rounds=1", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    code, out, err = cli([*args, "dry_run=true"], tmp_path)
    assert code == 0, err[-2000:]
    assert out.count("no plan: data not available here") == 2 and "/nonexistent/fedlnl" in out
    assert not any(tmp_path.iterdir())
    assert_sweep_refused(cli(args, tmp_path), "/nonexistent/fedlnl", 2, 2, tmp_path)


# ------------------------------------------------------------------------- sweeps checked whole
def assert_sweep_refused(result, message: str, bad: int, total: int, cwd: Path) -> None:
    """Exit 2, one line per bad cell naming it and ``message``, a count line, nothing written."""
    code, out, err = result
    lines = [ln for ln in (out + err).splitlines() if "error:" in ln]
    assert code == 2, (code, out[-2000:], err[-2000:])
    assert all(ln.startswith("fedlnl-run: error: ") for ln in lines), lines
    cells = [ln for ln in lines if "cell [" in ln]
    assert len(cells) == bad and all(message in ln for ln in cells), lines
    assert lines[-1] == f"fedlnl-run: error: {bad} of {total} cells are invalid; nothing was run"
    assert "Traceback" not in out + err
    assert not any(cwd.iterdir()), f"left behind: {sorted(p.name for p in cwd.rglob('*'))}"


#: (sweep overrides, text every bad cell's line holds, bad cells, cells): checks that need the data or
#: the model, made for every cell before the first trains (a bad later cell included)
SWEEP_BAD = [
    (["fl.num_clients=5000", "method=fedavg,fedprox"], "fl.num_clients=5000 is invalid: allowed an integer in [1, 1437]", 2, 2),
    (["partition=noniid", "partition.p=0.05", "fl.num_clients=10", "method=fedavg,fedprox"],
     "class 2 (142 samples) is held by no client", 2, 2),
    (["model=cnn,vgg11"], "model=vgg11 cannot take dataset=digits images of 1x8x8", 1, 2),
    (["model=cnn,lenet,resnet50"], "cannot be built for dataset=digits (1x8x8 images, 10 classes)", 2, 3),
    (["seed=0,99999999999999999999"], "seed=99999999999999999999 is invalid", 1, 2),
    (["threads=1,1000"], "threads=1000 is invalid", 1, 2),
    ([f"name={'x' * 300}"], "of at most 60 characters", 1, 1),
]


@pytest.mark.parametrize("overrides, message, bad, total", SWEEP_BAD, ids=[" ".join(o)[:40] for o, *_ in SWEEP_BAD])
def test_a_sweep_refuses_every_bad_cell_before_the_first_trains(tmp_path, overrides, message, bad, total):
    keys = {o.split("=")[0] for o in overrides}
    args = ["-m", *overrides, *(t for t in TINY if t.split("=")[0] not in keys), "fl.rounds=1",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    assert_sweep_refused(cli(args, tmp_path), message, bad, total, tmp_path)


def test_a_sweep_with_the_cfg_flag_is_one_line(tmp_path):
    assert_refused(cli(["-m", "method=fedavg,fedprox", "--cfg", "job", *TINY], tmp_path),
                   "-m and --cfg cannot be combined", tmp_path)


# ------------------------------------------------------------------------- run directories
def test_a_run_directory_of_another_config_is_refused_and_left_untouched(tmp_path):
    run_dir = tmp_path / "runs" / "mine"
    code, _, err = cli([*TINY, "fl.rounds=2", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0, err[-2000:]
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    result = cli([*TINY, "fl.rounds=2", "fl.lr=0.02", f"hydra.run.dir={run_dir}"], tmp_path)
    code, out, err = result
    assert code == 2 and "Traceback" not in out + err
    errors = [ln for ln in (out + err).splitlines() if "error:" in ln]
    assert errors == [f"fedlnl-run: error: {run_dir} holds a complete run of another config (fl.lr: 0.05 -> 0.02): "
                      "set hydra.run.dir= to another directory, or move that run away"], errors
    after = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before  # summary, metrics, .hydra/ and run.log as they were


def test_a_lock_that_is_a_directory_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".lock").mkdir(parents=True)
    code, out, err = cli([*TINY, f"hydra.run.dir={run_dir}"], tmp_path)
    errors = [ln for ln in (out + err).splitlines() if "error:" in ln]
    assert code == 2 and len(errors) == 1 and f"{run_dir}/.lock is a directory, not a lock file: remove it" in errors[0]
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]


@pytest.mark.parametrize("obstacle", ["file", "read-only"])
def test_an_output_path_that_cannot_be_written_is_refused(tmp_path, obstacle):
    if obstacle == "file":
        (tmp_path / "results").write_text("not a directory")
        expected = f"{tmp_path / 'results'} is a file, not a directory"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories")
        (tmp_path / "results").mkdir()
        (tmp_path / "results").chmod(0o555)
        expected = f"{tmp_path / 'results'} is not writable"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, out, err = cli([*TINY, f"hydra.run.dir={tmp_path / 'results' / 'run'}"], tmp_path)
    errors = [ln for ln in (out + err).splitlines() if "error:" in ln]
    assert code == 2 and len(errors) == 1 and expected in errors[0], errors
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_sweep_directory_that_cannot_be_created_is_refused(tmp_path):
    (tmp_path / "results").write_text("not a directory")
    code, out, err = cli(["-m", "method=fedavg,fedprox", *TINY, f"hydra.sweep.dir={tmp_path / 'results' / 'sweep'}"],
                         tmp_path)
    errors = [ln for ln in (out + err).splitlines() if "error:" in ln]
    assert code == 2 and errors == [f"fedlnl-run: error: hydra.sweep.dir={tmp_path / 'results' / 'sweep'} cannot "
                                    f"be created: {tmp_path / 'results'} is a file, not a directory"], errors


def test_a_refusal_removes_only_what_this_process_made(tmp_path, monkeypatch):
    """Directories the user made beforehand, and the current directory, stay (issue: cleanup removed
    up to two empty parents); the job directory Hydra made for the refused run goes."""
    from fedlnl.benchmark import run as runmod

    made = tmp_path / "mine" / "empty"  # made by the user, empty
    made.mkdir(parents=True)
    run_dir = made / "results" / "run"
    monkeypatch.setattr(runmod, "_BEFORE", {})
    runmod.snapshot(run_dir)
    (run_dir / ".hydra").mkdir(parents=True)  # what Hydra writes before the task runs
    (run_dir / "run.log").write_text("")
    runmod.remove_made_dirs(run_dir)
    assert made.is_dir() and not (made / "results").exists()

    own = tmp_path / "own"  # a run directory the user made, holding a note
    own.mkdir()
    (own / "notes.txt").write_text("keep")
    runmod._BEFORE.clear()
    runmod.snapshot(own)
    (own / ".hydra").mkdir()
    (own / "run.log").write_text("")
    runmod.remove_made_dirs(own)
    assert sorted(p.name for p in own.iterdir()) == ["notes.txt"]


def test_a_refused_run_leaves_the_users_empty_directories(tmp_path):
    (tmp_path / "results" / "runs").mkdir(parents=True)
    code, _, err = cli(["model=lenet", *TINY], tmp_path)
    assert code == 2 and "model=lenet cannot be built" in err
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["results", "results/runs"]


def test_a_sweep_cell_of_another_config_is_named(tmp_path):
    sweep = tmp_path / "sweep"
    code, _, err = cli(["-m", "method=fedavg", *TINY, "fl.rounds=1", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert code == 0, err[-2000:]
    cell = sweep / "debug=tiny,fl.rounds=1,method=fedavg"
    summary = json.loads((cell / "summary.json").read_text())
    summary["config_hash"], summary["config"]["fl"]["lr"] = "0" * 16, 0.5  # as if a default had changed
    (cell / "summary.json").write_text(json.dumps(summary))
    code, out, err = cli(["-m", "method=fedavg", *TINY, "fl.rounds=1", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert code == 2 and f"{cell} holds a complete run of another config (fl.lr: 0.5 -> 0.05)" in err
    assert "1 of 1 cells are invalid; nothing was run" in err


def test_a_sweep_names_the_cells_another_process_is_training(tmp_path):
    import socket

    sweep = tmp_path / "sweep"
    cell = sweep / "debug=tiny,fl.rounds=1,method=fedavg,seed=1"
    cell.mkdir(parents=True)
    (cell / ".lock").write_text(f"{socket.gethostname()} {os.getpid()}\n")  # alive: this process
    code, out, err = cli(["-m", "method=fedavg", "seed=0,1", *TINY, "fl.rounds=1", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert code == 0, err[-2000:]
    warning = [ln for ln in err.splitlines() if "being trained by another process" in ln]
    assert len(warning) == 1 and f"{cell.name} (pid {os.getpid()} on {socket.gethostname()}" in warning[0], err[-2000:]
    assert not (cell / "summary.json").exists() and (sweep / "debug=tiny,fl.rounds=1,method=fedavg,seed=0" / "summary.json").exists()


# ------------------------------------------------------------------------- damaged inputs
def test_a_damaged_cifarn_file_is_one_line_naming_it(tmp_path):
    import numpy as np

    from fedlnl.datasets import DataError
    from fedlnl.datasets.noise import cifarn_labels

    bad = tmp_path / "CIFAR-10_human.pt"
    bad.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError) as err:
        cifarn_labels(bad, "aggre", np.zeros(10, dtype=np.int64))
    assert str(err.value).startswith(f"CIFAR-N file {bad} is damaged (") and "download CIFAR-10_human.pt again" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_damaged_cifarn_file_stops_the_run_before_training(tmp_path, shared_data):
    bad = tmp_path / "cifarn" / "CIFAR-10_human.pt"
    bad.parent.mkdir()
    bad.write_bytes((shared_data / "cifar-n" / "CIFAR-10_human.pt").read_bytes()[:5000])  # truncated
    work = tmp_path / "work"
    work.mkdir()
    assert_refused(cli(["dataset=cifar10_jpeg", f"dataset.root={shared_data / 'cifar10-jpeg'}", "noise=cifarn",
                        f"noise.file={bad}", "model=lenet", "logger=none", "device=cpu", "fl.rounds=1"], work),
                   f"CIFAR-N file {bad} is damaged", work)


# ------------------------------------------------------------------------- the disk
def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    from fedlnl.benchmark import runner as runmod

    def full(obj, path, *a, **k):
        Path(path).write_bytes(b"PK\x03\x04 half")  # what torch leaves when the write fails
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    monkeypatch.setattr(runmod.torch, "save", full)
    run_dir = tmp_path / "run"
    code, out, err = cli([*TINY, "fl.rounds=3", "checkpoint_every=1", f"hydra.run.dir={run_dir}"], tmp_path)
    errors = [ln for ln in (out + err).splitlines() if "error:" in ln]
    assert code == 1 and len(errors) == 1 and "Traceback" not in out + err, (out + err)[-3000:]
    assert f"could not write {run_dir / 'checkpoint.pt'}" in errors[0] and "MB free on its file system" in errors[0]
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "could not write" in summary["error"]


def test_a_single_run_whose_directory_another_process_trains_says_so_and_fails(tmp_path):
    import socket

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").write_text(f"{socket.gethostname()} {os.getpid()}\n")  # alive: this process
    code, out, err = cli([*TINY, f"hydra.run.dir={run_dir}"], tmp_path)
    errors = [ln for ln in (out + err).splitlines() if "error:" in ln]
    assert code == 1 and errors == [f"fedlnl-run: error: {run_dir} is being trained by another process (pid "
                                    f"{os.getpid()} on {socket.gethostname()}, " + errors[0].split(", ", 1)[1]]
    assert "this run did nothing" in errors[0] and not (run_dir / "metrics.jsonl").exists()
    assert [p.name for p in run_dir.iterdir()] == [".lock"]  # no .hydra/, no run.log in the holder's directory


# ------------------------------------------------------------------------- issue 34: nothing lost, nothing silent
def _errors(out: str, err: str) -> list[str]:
    return [ln for ln in (out + err).splitlines() if "error:" in ln]


def test_an_empty_sweep_is_one_line_and_writes_nothing(tmp_path):
    assert_refused(cli(["-m", "seed=range(0)", "name=e", "dataset=digits"], tmp_path),
                   "the sweep has no cells (seed=range(0) has no values): nothing to run", tmp_path)


@pytest.mark.parametrize("args, shown, why", [
    (["dataset=digits", "noise.rho=5", "--cfg", "job"], "  rho: 5\n", "noise.rho=5 is invalid: allowed a share in [0, 1]"),
    (["noise.rho_tau=[0.6,0.5]", "noise.rho=0.2", "--cfg", "job", "--resolve"], "  rho: 0.2\n",
     "noise.rho=0.2 contradicts noise.rho_tau=[0.6, 0.5]"),
])
def test_cfg_prints_a_config_a_run_refuses_then_says_why(tmp_path, args, shown, why):
    code, out, err = cli(args, tmp_path)
    assert code == 2 and shown in out and "Traceback" not in out + err, (code, out[-500:], err)
    errors = _errors(out, err)
    assert len(errors) == 1 and errors[0].startswith("fedlnl-run: error: a run of this config would be refused: ")
    assert why in errors[0] and errors[0] in err  # on stderr, after the config on stdout
    assert not any(tmp_path.iterdir())


def test_cfg_resolve_prints_a_switch_whose_value_is_a_list(tmp_path):
    """FedNoRo's reference Adam betas come from ``${fidelity:...,[0.9, 0.999]}``: a resolver returning
    a list, which ``--resolve`` could not hold (UnsupportedValueType); resolved as a run resolves it."""
    import yaml
    from omegaconf import OmegaConf

    from conftest import compose_cfg

    code, out, err = cli(["method=fednoro", "fidelity=reference", "--cfg", "job", "--resolve"], tmp_path)
    assert code == 0 and "Traceback" not in out + err, err[-2000:]
    printed = yaml.safe_load(out)
    assert printed["method"]["betas"] == [0.9, 0.999]
    assert printed["method"] == OmegaConf.to_container(compose_cfg(["method=fednoro", "fidelity=reference"]),
                                                       resolve=True)["method"]


def test_a_stage3_method_from_the_command_line_trains_fedcorr_with_it(tmp_path):
    """The documented ``+method@method.stage3=fedprox`` through the real command line (argv), not
    refused as "method is given twice": FedCorr stages 1-2, then FedProx."""
    from fedlnl.benchmark.preflight import check_argv

    run_dir = tmp_path / "run"
    code, out, err = cli(["dataset=digits", "fl.num_clients=6", "fl.frac=0.5", "fl.local_epochs=1", "fl.batch_size=32",
                          "threads=1", "logger=none", "method=fedcorr", "method.T1=1", "method.T2=1", "method.T3=1",
                          "+method@method.stage3=fedprox", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["method"] == "fedcorr_fedprox"
    assert summary["config"]["method"]["_target_"].endswith("FedCorr")
    assert summary["config"]["method"]["stage3"]["_target_"].endswith("FedProx") and "mu" in summary["config"]["method"]["stage3"]
    stages = [r["stage"] for r in _rows(run_dir / "metrics.jsonl")]
    assert stages[0] == "preprocessing" and "finetuning" in stages and stages[-1] == "usual", stages
    assert check_argv(["+method@method.stage3=fedprox", "+method@method.stage3=fedavg"]) == (
        "method@method.stage3 is given twice (+method@method.stage3=fedprox and +method@method.stage3=fedavg): keep one")


def test_a_run_directory_name_longer_than_the_file_system_allows_is_one_line(tmp_path):
    assert_refused(cli([*TINY, f"hydra.run.dir={tmp_path / ('x' * 300)}"], tmp_path),
                   "is 300 bytes, more than the", tmp_path)


def test_a_dangling_symlink_as_the_run_directory_is_one_line(tmp_path):
    link, target = tmp_path / "link", tmp_path / "gone" / "here"
    link.symlink_to(target)
    code, out, err = cli([*TINY, f"hydra.run.dir={link}"], tmp_path)
    assert code == 2 and "Traceback" not in out + err
    assert _errors(out, err) == [f"fedlnl-run: error: hydra.run.dir={link} cannot be created: {link} is a symbolic "
                                 f"link to {target}, which does not exist (create it, or set hydra.run.dir= to another "
                                 "directory)"]
    assert [p.name for p in tmp_path.iterdir()] == ["link"] and link.is_symlink() and not target.exists()


@pytest.fixture
def small_fs(tmp_path):
    """``mount(size)``: a tmpfs of ``size`` mounted below tmp_path (as root), unmounted after the test."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        try:
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as err:
            pytest.skip(f"cannot mount a tmpfs here: {err}")
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=60)


def test_a_nearly_full_file_system_is_refused_before_anything_is_written(tmp_path, small_fs):
    fs = small_fs("64k")
    code, out, err = cli(["dataset=digits", "fl.num_clients=6", "fl.frac=0.5", "fl.local_epochs=1", "threads=1",
                          "logger=none", "fl.rounds=150", f"hydra.run.dir={fs / 'run'}"], tmp_path)
    errors = _errors(out, err)
    assert code == 2 and len(errors) == 1 and "Traceback" not in out + err, (out + err)[-2000:]
    assert errors[0].startswith(f"fedlnl-run: error: hydra.run.dir={fs / 'run'} cannot be written: its file system has ")
    assert "KB free (a run needs at least 1 MB for its metrics, summary and checkpoints)" in errors[0]
    assert not any(fs.iterdir())


def test_a_file_system_that_fills_during_the_run_is_one_line_and_keeps_the_last_checkpoint(tmp_path, small_fs):
    import errno
    import time

    import torch

    fs = small_fs("2m")
    run_dir = fs / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fedlnl.benchmark.run", *TINY, "threads=1", "fl.rounds=300",
                             "checkpoint_every=1", f"hydra.run.dir={run_dir}"], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 300
    while not ((run_dir / "checkpoint.pt").is_file() and (run_dir / "metrics.jsonl").is_file()
               and len((run_dir / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    with open(fs / "filler", "wb") as filler:  # another process takes the rest of the disk
        try:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    out, err = proc.communicate(timeout=300)
    errors = _errors(out, err)
    assert proc.returncode == 1 and "Traceback" not in out + err, (out + err)[-3000:]
    assert len(errors) == 1 and errors[0].startswith(f"fedlnl-run: error: {run_dir}: OSError: [Errno 28]"), errors
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=False)  # the last complete one, whole
    rows = len((run_dir / "metrics.jsonl").read_text().splitlines())
    # the disk filled after round 3's row: its checkpoint (or a later one) may have failed, round 2's was written
    assert 2 <= saved["round"] + 1 <= rows and not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]


def test_ctrl_c_before_training_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """Ctrl-C while the data loads, before Hydra made the run directory or after (a run's rounds
    are stopped cleanly: tests/test_interrupts.py): one line, exit 130, nothing left."""
    from fedlnl.benchmark import preflight, runner

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    expected = ["fedlnl-run: interrupted (SIGINT) before training started: nothing was trained or saved"]
    for where, name in ((preflight, "build_cell"), (runner.Runner, "prepare")):
        with monkeypatch.context() as m:
            m.setattr(where, name, interrupted)
            code, out, err = cli([*TINY, f"hydra.run.dir={tmp_path / 'results' / 'run'}"], tmp_path)
        assert code == 130 and "Traceback" not in out + err, (name, out, err)
        assert [ln for ln in (out + err).splitlines() if ln.startswith("fedlnl-run")] == expected
        assert not any(tmp_path.iterdir()), (name, sorted(p.name for p in tmp_path.rglob("*")))


@pytest.mark.parametrize("dev", ["cuda", "mps"])
def test_a_device_this_machine_lacks_is_refused_leaving_nothing(tmp_path, dev):
    """Refused before Hydra makes results/runs/<time>_<method> (it used to leave results/runs/)."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    if (dev == "cuda" and torch.cuda.is_available()) or (dev == "mps" and mps is not None and mps.is_available()):
        pytest.skip(f"this machine has {dev}")
    assert_refused(cli([f"device={dev}", "debug=tiny", "logger=none"], tmp_path), f"device='{dev}' is invalid", tmp_path)


def test_an_interrupted_run_of_another_config_is_refused_with_an(tmp_path):
    run_dir = tmp_path / "runs" / "mine"
    code, _, err = cli([*TINY, "fl.rounds=2", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 0, err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    code, out, err = cli([*TINY, "fl.rounds=2", "fl.lr=0.02", f"hydra.run.dir={run_dir}"], tmp_path)
    assert code == 2 and _errors(out, err) == [
        f"fedlnl-run: error: {run_dir} holds an interrupted run of another config (fl.lr: 0.05 -> 0.02): set "
        "hydra.run.dir= to another directory, or move that run away"]


def test_the_report_says_warning_once_per_line(tmp_path):
    """Runs of one cell that differ besides the seed: the report's warning is ``WARNING: runs of one
    cell differ ...`` on stderr, not ``WARNING: WARNING: ...``."""
    sweep = tmp_path / "sweep"
    for seed, lr in ((0, 0.05), (1, 0.04)):
        code, _, err = cli(["-m", *TINY, "fl.rounds=1", f"seed={seed}", f"fl.lr={lr}", f"hydra.sweep.dir={sweep}"], tmp_path)
        assert code == 0, err[-2000:]
    report = "import sys; from fedlnl.benchmark.report.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", report, str(sweep), "--figures", "none"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WARNING: runs of one cell differ in fl.lr besides the seed" in proc.stderr
    assert "WARNING: WARNING:" not in proc.stdout + proc.stderr


# ------------------------------------------------------------------------- a summary is believed only when sealed
def test_a_hand_edited_summary_is_neither_skipped_by_a_sweep_nor_averaged_by_the_report(tmp_path):
    """best_acc edited to 0.99: the report counts the run as unverified (never averaged), a re-run
    sweep warns in one line, keeps the old files as *.unverified and runs the cell again."""
    import logging

    from fedlnl.benchmark.report.loading import load_summaries

    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "fl.rounds=2", f"hydra.sweep.dir={sweep}"]
    code, _, err = cli(args, tmp_path)
    assert code == 0, err[-2000:]
    cell = sweep / "debug=tiny,fl.rounds=2"
    true = json.loads((cell / "summary.json").read_text())
    metrics = (cell / "metrics.jsonl").read_bytes()
    edited = {**true, "best_acc": 0.99}
    (cell / "summary.json").write_text(json.dumps(edited, indent=2))

    seen, logger = [], logging.getLogger("fedlnl.benchmark.report.loading")
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    logger.disabled = False  # Hydra's logging setup (the in-process runs above) disables existing loggers
    try:
        frame = load_summaries(sweep)
    finally:
        logger.removeHandler(handler)
    assert list(frame["status"]) == ["unverified"]
    assert seen == [f"unverified {cell / 'summary.json'}: summary.json was edited after the run: summary.json has "
                    f"best_acc=0.99 but metrics.jsonl gives {true['best_acc']}: counted as incomplete"]

    code, out, err = cli(args, tmp_path)
    assert code == 0, err[-2000:]
    warning = [ln for ln in (out + err).splitlines() if "is not borne out by its metrics" in ln]
    assert len(warning) == 1 and "best_acc=0.99" in warning[0] and "running the cell again" in warning[0], out + err
    assert json.loads((cell / "summary.json.unverified").read_text()) == edited
    assert (cell / "metrics.jsonl.unverified").read_bytes() == metrics == (cell / "metrics.jsonl").read_bytes()
    again = json.loads((cell / "summary.json").read_text())
    assert again["status"] == "complete" and again["best_acc"] == true["best_acc"]


def test_metrics_changed_after_the_summary_and_unsealed_summaries(tmp_path):
    """The digest catches an edited metrics.jsonl; a summary written before seals existed is checked
    on best_acc and last10_acc recomputed from its rows."""
    from fedlnl.benchmark import integrity
    from fedlnl.benchmark.rundir import completed

    run_tiny(tmp_path, ["fl.rounds=3"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert integrity.problem(tmp_path, summary) is None and completed(tmp_path, summary["config_hash"]) == summary
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows[:2]) + "\n")
    assert integrity.problem(tmp_path, summary) == ("metrics.jsonl changed after summary.json was written (2 rows, 3 "
                                                    "when written; its SHA-256 differs)")
    assert completed(tmp_path, summary["config_hash"]) is None
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    old = {k: v for k, v in summary.items() if k not in (integrity.DIGEST_KEY, integrity.SEAL_KEY)}
    assert integrity.problem(tmp_path, {**old, "variant": "relabelled by hand"}) is None  # nothing to seal it
    assert integrity.problem(tmp_path, {**old, "last10_acc": 0.5}).startswith("summary.json has last10_acc=0.5 but")
