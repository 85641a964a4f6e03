"""The GPU policy, proved on the CPU: what ``determinism`` sets in torch, the run identity written
and compared, the deterministic sums and pooling that replace atomic ones off the CPU (equal to the
old ones on the CPU), per-client dropout, and the report's separate rows per device kind. The
tests that need a CUDA device are in test_gpu.py."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from conftest import compose_cfg
from test_robustness import TINY, assert_refused, cli

from fedlnl.benchmark import device, report
from fedlnl.benchmark.validate import ConfigError


@pytest.fixture
def torch_flags():
    """Restore torch's global algorithm flags after a test that sets them."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.use_deterministic_algorithms(saved[0])
    (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
     torch.backends.cudnn.allow_tf32) = saved[1:]


def flags() -> dict:
    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn.deterministic": torch.backends.cudnn.deterministic, "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "matmul.tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn.tf32": torch.backends.cudnn.allow_tf32}


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend two CUDA devices (nothing runs on them): returns the set_device calls."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake GPU 80GB")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    return chosen


# ------------------------------------------------------------------ determinism: what torch is told
def test_strict_on_cuda_sets_every_reproducibility_flag(torch_flags, fake_cuda):
    cfg = compose_cfg(["device=cuda:1", "determinism=strict", "logger=none"])
    dev = device.place(cfg)
    assert str(dev) == "cuda:1" and [str(d) for d in fake_cuda] == ["cuda:1"]  # cuda:N is made current
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert flags() == {"deterministic_algorithms": True, "cudnn.deterministic": True, "cudnn.benchmark": False,
                       "matmul.tf32": False, "cudnn.tf32": False}
    assert device.identity(dev, "strict") == {"device_kind": "cuda", "gpu": "Fake GPU 80GB",
                                              "determinism": "strict", "torch": torch.__version__}


def test_fast_on_cuda_allows_benchmarking_and_tf32(torch_flags, fake_cuda):
    device.place(compose_cfg(["device=cuda", "determinism=fast", "logger=none"]))
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert flags() == {"deterministic_algorithms": False, "cudnn.deterministic": False, "cudnn.benchmark": True,
                       "matmul.tf32": True, "cudnn.tf32": True}


@pytest.mark.parametrize("mode", ["strict", "fast"])
def test_a_cpu_run_keeps_torchs_defaults_in_either_mode(torch_flags, mode):
    torch.use_deterministic_algorithms(True)  # a previous cell of the process (strict, on a GPU)
    dev = device.place(compose_cfg(["device=cpu", f"determinism={mode}", "logger=none"]))
    assert flags() == {"deterministic_algorithms": False, "cudnn.deterministic": False, "cudnn.benchmark": False,
                       "matmul.tf32": False, "cudnn.tf32": True}
    assert device.identity(dev, mode) == {"device_kind": "cpu", "gpu": None, "determinism": mode,
                                          "torch": torch.__version__}


def test_cuda_index_beyond_the_visible_devices_is_refused(fake_cuda):
    with pytest.raises(ConfigError, match=r"device='cuda:2' is invalid: 2 CUDA device\(s\) visible, allowed cuda:0 to cuda:1"):
        device.resolve_device("cuda:2")
    assert fake_cuda == []


def test_mps_where_torch_has_it(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert str(device.resolve_device("mps")) == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="device='mps' is invalid: no MPS"):
        device.resolve_device("mps")


@pytest.mark.parametrize("overrides, message", [
    (["determinism=quick"], "determinism='quick' is invalid: allowed strict, fast"),
    (["data_placement=gpu"], "data_placement='gpu' is invalid: allowed auto, device, host"),
    (["device=tpu"], "device='tpu' is invalid: allowed auto, cpu, cuda, cuda:N, mps"),
])
def test_bad_values_are_one_line_errors(tmp_path, overrides, message):
    args = ["debug=tiny", "logger=none", *overrides, f"hydra.run.dir={tmp_path / 'run'}"]
    assert_refused(cli(args, tmp_path), message, tmp_path)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="this machine has MPS")
def test_mps_without_an_apple_gpu_is_refused(tmp_path):
    overrides = ["debug=tiny", "logger=none", "device=mps", f"hydra.run.dir={tmp_path / 'run'}"]
    assert_refused(cli(overrides, tmp_path), "device='mps' is invalid: no MPS (Apple GPU) device is available", tmp_path)


# ------------------------------------------------------------------ identity: recorded and compared
def _files(run_dir):
    return {p.relative_to(run_dir): (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.parametrize("field, recorded, differs", [
    ("device_kind", "cuda", "device kind cuda -> cpu"),
    ("determinism", "fast", "determinism fast -> strict"),
])
def test_a_cell_recorded_on_another_device_is_never_continued(tmp_path, field, recorded, differs):
    run_dir = tmp_path / "run"
    args = [*TINY, "threads=1", f"hydra.run.dir={run_dir}"]
    code, out, err = cli(args, tmp_path)
    assert code == 0, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["identity"] == {"device_kind": "cpu", "gpu": None, "determinism": "strict", "torch": torch.__version__}
    assert cli(args, tmp_path)[0] == 0  # the same identity: skipped as complete
    summary["identity"][field] = recorded  # as a run on a GPU would have written it
    (run_dir / "summary.json").write_text(json.dumps(summary))
    before = _files(run_dir)
    for extra in ([], ["skip_complete=false"]):
        code, out, err = cli([*args, *extra], tmp_path)
        errors = [ln for ln in (out + err).splitlines() if "error:" in ln]
        assert code == 2 and len(errors) == 1, (code, out, err)
        assert f"holds a complete run of this config made elsewhere (recorded -> now: {differs})" in errors[0]
        assert "start a separate cell (another name=, hydra.sweep.dir= or hydra.run.dir=)" in errors[0]
        assert _files(run_dir) == before  # nothing written


def test_a_checkpoint_made_on_another_device_is_not_resumed(tmp_path):
    """A killed run leaves a checkpoint and no summary: its recorded identity is compared too."""
    from fedlnl.benchmark import runner as runmod

    cfg = compose_cfg([*TINY, "threads=1", "fl.rounds=4", "checkpoint_every=1"])
    real = runmod.Runner.evaluate

    def crash(self, state, rnd, *a, **k):
        if rnd == 2:
            raise KeyboardInterrupt  # killed after the checkpoint of round 2
        return real(self, state, rnd, *a, **k)

    runmod.Runner.evaluate = crash
    try:
        with pytest.raises(KeyboardInterrupt):
            runmod.run(cfg, tmp_path, "fedavg")
    finally:
        runmod.Runner.evaluate = real
    (tmp_path / "summary.json").unlink()  # as after SIGKILL: only the checkpoint tells
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ck["identity"]["device_kind"] == "cpu"
    ck["identity"] = {**ck["identity"], "device_kind": "cuda", "gpu": "Fake GPU 80GB"}
    torch.save(ck, tmp_path / "checkpoint.pt")
    with pytest.raises(ConfigError, match=r"holds a checkpoint of this config made elsewhere \(recorded -> now: "
                                          r"device kind cuda -> cpu\)"):
        runmod.run(cfg, tmp_path, "fedavg")
    assert not (tmp_path / "summary.json").exists()


def test_the_report_never_pools_device_kinds():
    base = {"status": "complete", "method": "fedavg", "rho": 0.0, "tau": 0.0, "partition": "iid", "comm_cost": 10}
    frame = pd.DataFrame([{**base, "seed": 0, "best_acc": 0.8, "identity.device_kind": "cpu"},
                          {**base, "seed": 1, "best_acc": 0.7, "identity.device_kind": "cpu"},
                          {**base, "seed": 0, "best_acc": 0.6, "identity.device_kind": "cuda"},
                          {**base, "seed": 1, "best_acc": 0.5, "device": "cuda:1"}],  # written before identities
                         dtype=object)
    table = report.accuracy_table(frame).set_index("method")
    assert table["n"].to_dict() == {"fedavg [cpu]": 2, "fedavg [cuda]": 2}
    assert table["mean"].to_dict() == {"fedavg [cpu]": pytest.approx(75.0), "fedavg [cuda]": pytest.approx(55.0)}
    one_kind = frame.iloc[:2]
    assert report.accuracy_table(one_kind)["method"].tolist() == ["fedavg"]  # one kind: rows unlabelled


# ------------------------------------------------------------------ deterministic sums, pooling, dropout
def test_group_sum_is_index_add_on_the_cpu_and_the_one_hot_form_agrees():
    from fedlnl.methods.common.scatter import group_sum, onehot_sum

    g = torch.Generator().manual_seed(0)
    for shape, dtype in (((3000, 64), torch.float32), ((3000,), torch.float64)):
        values = torch.randn(*shape, generator=g, dtype=dtype)
        index = torch.randint(0, 10, (shape[0],), generator=g)
        old = torch.zeros(10, *shape[1:], dtype=dtype).index_add_(0, index, values)
        assert torch.equal(group_sum(values, index, 10), old)  # CPU bytes unchanged
        tol = 1e-4 if dtype == torch.float32 else 1e-10
        assert torch.allclose(onehot_sum(values, index, 10), old, atol=tol, rtol=0)  # the form used off the CPU


def test_arfl_corrections_equal_index_add_bit_for_bit():
    from fedlnl.methods.arfl import add_corrections

    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        rows, cols = (torch.rand(400, 9, generator=g) < 0.3).nonzero(as_tuple=True)  # as irls_aggregate finds them
        values = torch.randn(rows.numel(), generator=g) * 1e-3
        base = torch.randn(400, generator=g)
        old, new = base.clone().index_add_(0, rows, values), base.clone()
        add_corrections(new, rows, cols, values, 9)
        assert torch.equal(new, old)


@pytest.mark.parametrize("size, out", [((8, 8), 2), ((7, 5), 3), ((1, 1), 7), ((9, 6), (4, 5)), ((4, 4), 1)])
def test_pooling_by_products_equals_torchs_adaptive_pooling(size, out):
    from fedlnl.models.layers import AdaptiveAvgPool2d, pool_by_products

    x = torch.randn(3, 5, *size, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert torch.allclose(pool_by_products(x, out), F.adaptive_avg_pool2d(x, out), atol=1e-12, rtol=0)
    assert torch.equal(AdaptiveAvgPool2d(out)(x), F.adaptive_avg_pool2d(x, out))  # CPU: torch's own


def test_dropout_draws_from_the_bound_generator_not_the_global_one():
    from fedlnl.models.layers import ClientDropout, random_source

    layer, x = ClientDropout(0.5), torch.ones(64, 32)
    outs = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        state = torch.get_rng_state()
        with random_source(torch.Generator().manual_seed(7)):
            outs.append(layer(x))
        assert torch.equal(torch.get_rng_state(), state)  # the global RNG is not drawn from
    assert torch.equal(outs[0], outs[1])
    assert set(outs[0].unique().tolist()) == {0.0, 2.0} and 0.3 < (outs[0] == 0).float().mean() < 0.7
    with random_source(torch.Generator().manual_seed(8)):
        assert not torch.equal(layer(x), outs[0])
    layer.eval()
    assert torch.equal(layer(x), x)


def test_vgg11_trains_the_same_whatever_the_global_rng():
    from fedlnl.models.layers import ClientDropout, random_source
    from fedlnl.models.vgg import VGG11

    torch.manual_seed(0)
    model = VGG11(10, (3, 32, 32), reference_head=False, dropout_rng="client").train()
    assert sum(isinstance(m, ClientDropout) for m in model.modules()) == 2
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    outs = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        with random_source(torch.Generator().manual_seed(5)):
            outs.append(model(x))
    assert torch.equal(outs[0], outs[1])


# ------------------------------------------------------------------ data placement
@pytest.mark.parametrize("method", ["fedavg", "rofl"])
def test_host_placement_gives_byte_identical_metrics(tmp_path, method):
    """``data_placement=host`` runs its own gather (pinned staging and side-stream copy where CUDA
    exists) and must give the bytes device placement gives."""
    sums = {}
    for where in ("device", "host"):
        run_dir = tmp_path / where
        code, out, err = cli([*TINY, "threads=1", f"method={method}", "noise.rho_tau=[0.6,0.5]",
                              f"data_placement={where}", f"hydra.run.dir={run_dir}"], tmp_path)
        assert code == 0, err
        assert f"training images on the {where}" in (run_dir / "run.log").read_text()
        sums[where] = (run_dir / "metrics.jsonl").read_bytes()
    assert sums["host"] == sums["device"]


def test_auto_placement_rule(monkeypatch):
    from fedlnl.methods.common.placement import DEVICE_SHARE, choose

    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    assert choose("auto", 10**12, cpu) == "device" and choose("host", 10, cpu) == "host"
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (80 * 10**9, 80 * 10**9))
    assert choose("auto", int(DEVICE_SHARE * 80e9) - 1, cuda) == "device"
    assert choose("auto", int(DEVICE_SHARE * 80e9) + 1, cuda) == "host"
    assert choose("auto", 10**6, cuda, full_clothing1m=True) == "host"  # whatever the card says
    assert choose("device", 10**12, cuda) == "device"  # an explicit choice is kept


def test_stream_images_equal_images_in_order():
    from fedlnl.methods.common import engine

    x = torch.randint(0, 255, (50, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    aug = {"crop": 8, "pad": 2, "flip": True}
    batches = list(torch.randperm(50, generator=torch.Generator().manual_seed(5)).split(7))
    for where in ("device", "host"):
        data = engine.TensorData.build(x, [0.5] * 3, [0.25] * 3, aug, "cpu", where)
        g1, g2 = torch.Generator().manual_seed(6), torch.Generator().manual_seed(6)
        one = [data.images(b, augment=True, gen=g1) for b in batches]
        streamed = list(data.stream_images(batches, augment=True, gen=g2))
        assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(one, streamed))


def test_a_sweep_refuses_a_cell_recorded_on_another_device_before_running_any(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "threads=1", "seed=0", "method=fedavg", "noise.rho_tau=[0.0,0.0],[0.6,0.5]",
            f"hydra.sweep.dir={sweep}"]
    code, out, err = cli(args, tmp_path)
    assert code == 0, err
    paths = sorted(sweep.glob("*/summary.json"))
    assert len(paths) == 2
    summary = json.loads(paths[0].read_text())
    summary["identity"]["device_kind"] = "cuda"
    paths[0].write_text(json.dumps(summary))
    stamps = {p: p.stat().st_mtime_ns for p in sweep.rglob("*") if p.is_file()}
    code, out, err = cli(args, tmp_path)
    assert code == 2 and "(recorded -> now: device kind cuda -> cpu)" in err and "1 of 2 cells are invalid; nothing was run" in err
    assert {p: p.stat().st_mtime_ns for p in sweep.rglob("*") if p.is_file()} == stamps
