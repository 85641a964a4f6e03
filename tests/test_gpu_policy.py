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


def test_a_cpu_run_does_not_import_the_compiler_to_set_a_flag_already_off():
    """torch.use_deterministic_algorithms imports torch._inductor (~1 s a process): a CPU run, whose
    flag is already off, skips the call (every worker and every single run paid it before)."""
    import subprocess
    import sys

    code = ("import sys, torch; from fedlnl.benchmark import device; "
            "device.apply_determinism(torch.device('cpu'), 'strict'); "
            "print('torch._inductor' in sys.modules, torch.are_deterministic_algorithms_enabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_threads_0_is_the_processs_default_whatever_cell_ran_before(monkeypatch):
    """A joblib worker runs many cells: a threads=0 cell after a threads=2 one runs with the process's
    own count, not the 2 left behind (its numbers must not depend on the cells before it)."""
    monkeypatch.setattr(device, "cores", lambda: 2)
    device.place(compose_cfg(["device=cpu", "threads=2", "logger=none"]))
    assert torch.get_num_threads() == 2
    device.place(compose_cfg(["device=cpu", "threads=0", "logger=none"]))
    assert torch.get_num_threads() == device.DEFAULT_THREADS == 1  # conftest's count, set before fedlnl's import


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


def test_a_diverged_update_is_replayed_with_the_first_passs_dropout_masks():
    """A non-finite loss injected at step 3 of 5 makes ``train_steps`` replay the update with the
    per-step check. The replay must draw what the first pass drew: the shuffle from ``gen`` and the
    dropout masks from the generator ``random_source`` binds (restored with ``gen``). So the replay's
    masks and losses equal the first pass's up to the divergence, and its weights are those of a
    pass that checked every step (run separately from the same seeds)."""
    import math

    from torch import nn

    from fedlnl.methods.common import engine
    from fedlnl.models.layers import ClientDropout, random_source

    masks = []

    class Recorded(ClientDropout):
        def forward(self, x):
            out = super().forward(x)
            masks.append(out == 0)
            return out

    data = torch.Generator().manual_seed(2)
    x, y = torch.randn(40, 6, generator=data) + 3.0, torch.randint(0, 3, (40,), generator=data)

    def update(checked: bool):
        torch.manual_seed(0)  # the same initial weights for both runs
        model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), Recorded(0.5), nn.Linear(32, 3))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        gen, seen = torch.Generator().manual_seed(1), []

        def losses():
            for step, pos in enumerate(engine.batches(40, 8, gen)):
                loss = F.cross_entropy(model(x[pos]), y[pos])
                seen.append(float(loss.detach()))
                yield loss * float("inf") if step == 3 else loss  # diverges at step 3, in every pass

        masks.clear()
        with random_source(torch.Generator().manual_seed(7)):
            if not checked:
                return engine.train_steps(model, opt, gen, losses), list(masks), seen, model
            values = []
            for loss in losses():  # a pass that checks every step from the start
                values.append(engine.sgd_step(opt, loss))
                if not math.isfinite(values[-1]):
                    break
            return values, list(masks), seen, model

    values, drawn, seen, model = update(checked=False)
    assert len(drawn) == 5 + 4 and len(seen) == 5 + 4  # the first pass (5 batches), the replay (4)
    assert all(torch.equal(a, b) for a, b in zip(drawn[5:], drawn[:4]))  # the same masks again
    assert not torch.equal(drawn[4], drawn[5])  # (masks do differ from batch to batch)
    assert seen[5:] == seen[:4] and values[:3] == seen[:3] and math.isinf(values[3])
    ref_values, ref_masks, _, ref_model = update(checked=True)
    assert values == ref_values and all(torch.equal(a, b) for a, b in zip(drawn[5:], ref_masks))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref_model.state_dict().values()))


# ------------------------------------------------------------------ data placement
@pytest.mark.parametrize("method", ["fedavg", "rofl", "dividemix", "fedcorr", "coteaching", "feddyn"])
def test_host_placement_gives_byte_identical_metrics(tmp_path, monkeypatch, method):
    """``data_placement=host`` streams every training batch through ``HostImages.stream`` (the
    prefetch; pinned staging and a side-stream copy where CUDA exists) and must give the bytes device
    placement gives. The loops covered: ``local_train`` (fedavg, rofl, fedcorr), ``epoch_loop`` and
    the DivideMix epoch with its unlabeled passes (dividemix), the pair loop (coteaching), FedDyn's."""
    from fedlnl.compute.placement import HostImages

    streamed = []
    real = HostImages.stream

    def counting(self, batches):
        for raw in real(self, batches):
            streamed.append(raw.shape[0])
            yield raw

    monkeypatch.setattr(HostImages, "stream", counting)
    sums = {}
    for where in ("device", "host"):
        run_dir = tmp_path / where / "run"  # apart: FedCorr's shared prefix would start the second at stage 3
        streamed.clear()
        code, out, err = cli([*TINY, "threads=1", f"method={method}", "noise.rho_tau=[0.6,0.5]",
                              f"data_placement={where}", f"hydra.run.dir={run_dir}"], tmp_path)
        assert code == 0, err
        assert f"training images on the {where}" in (run_dir / "run.log").read_text()
        sums[where] = (run_dir / "metrics.jsonl").read_bytes()
        steps = json.loads((run_dir / "summary.json").read_text())["local_steps"]
        assert steps > 0 and (len(streamed) >= steps if where == "host" else streamed == [])
    assert sums["host"] == sums["device"]


def _host_data(n=20):
    from fedlnl.methods.common import engine

    x = torch.randint(0, 255, (n, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return engine.TensorData.build(x, [0.5], [0.25], None, "cpu", "host")


def test_the_prefetch_issues_batch_k_plus_1_before_batch_k_steps(monkeypatch):
    """The order of calls in ``local_train`` under host placement, recorded with the copy wrapped:
    within a pass, batch k+1's gather and copy (``HostImages._issue``) come before batch k's loss
    and step. A pass's first batch is issued when the pass starts (its shuffle is drawn then)."""
    from torch import nn

    from fedlnl.methods.common import engine
    from fedlnl.compute.placement import HostImages
    from fedlnl.methods.common.protocol import Optim

    data, calls = _host_data(), []
    first_row = {}
    real_issue = HostImages._issue

    def issue(self, idx):
        calls.append(("copy", len([c for c in calls if c[0] == "copy"])))
        first_row[calls[-1][1]] = int(idx[0])
        return real_issue(self, idx)

    monkeypatch.setattr(HostImages, "_issue", issue)

    def loss_fn(model, xb, yb, step, gen):
        calls.append(("loss", step))
        return F.cross_entropy(model(xb.flatten(1)), yb)

    def opt_fn(model, optim, run=None):
        opt = engine.optimizer(model, optim, run=run)
        opt.register_step_post_hook(lambda *a: calls.append(("step",)))
        return opt

    model = nn.Linear(16, 3)
    idx, labels = torch.arange(3, 17), torch.arange(14) % 3  # 14 samples in batches of 4: 4 per pass
    optim = Optim(name="sgd", lr=0.1, momentum=0.0, weight_decay=0.0)
    engine.local_train(model, data, idx, labels, epochs=2, batch_size=4, optim=optim, gen=torch.Generator().manual_seed(1),
                       loss_fn=loss_fn, augment=False, opt_fn=opt_fn)
    one_pass = ["copy", "copy", "loss", "step", "copy", "loss", "step", "copy", "loss", "step", "loss", "step"]
    assert [c[0] for c in calls] == one_pass * 2
    assert [c[1] for c in calls if c[0] == "loss"] == [0, 1, 2, 3] * 2
    # the batches copied are the ones trained on, in the shuffled order of each pass
    positions = list(engine.batches(14, 4, torch.Generator().manual_seed(1))) + \
        list(engine.batches(14, 4, _after_one_pass(1, 14)))
    assert [first_row[k] for k in range(8)] == [int(idx[p[0]]) for p in positions]


def _after_one_pass(seed, n):
    g = torch.Generator().manual_seed(seed)
    torch.randperm(n, generator=g)
    return g


def test_the_copies_run_on_a_side_stream_when_cuda_is_present(monkeypatch):
    """``HostImages`` with a CUDA device, the CUDA calls replaced by fakes that record them (no device
    here): each batch is staged in pinned memory and copied non-blocking inside the side stream, an
    event recorded there; the compute stream waits for that event (not the host) and keeps the batch
    alive (``record_stream``) only when the batch is handed out, after the next batch's copy is
    issued. That the copy then overlaps the step on a real device is reasoned, not run."""
    import contextlib

    from fedlnl.compute.placement import HostImages

    log, active = [], []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_event(self, event):
            log.append(("wait", self.name, event.n))

    class Event:
        made = 0

        def __init__(self):
            Event.made += 1
            self.n = Event.made

        def record(self, stream):
            log.append(("record", stream.name, self.n))

    @contextlib.contextmanager
    def on(stream):
        active.append(stream.name)
        yield
        active.pop()

    side, compute = Stream("side"), Stream("compute")
    real_empty, real_to = torch.empty_strided, torch.Tensor.to

    def empty_strided(*a, pin_memory=False, **k):
        log.append(("stage", "pinned" if pin_memory else "pageable"))
        return real_empty(*a, **k)

    def to(self, *a, **k):
        if a and str(a[0]).startswith("cuda"):
            log.append(("copy", active[-1] if active else "default", "non_blocking" if k.get("non_blocking") else "blocking"))
            return self.clone()
        return real_to(self, *a, **k)

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: side)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch, "empty_strided", empty_strided)
    monkeypatch.setattr(torch.Tensor, "to", to)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: log.append(("keep", s.name)))
    x = torch.randint(0, 255, (20, 1, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    host = HostImages(x, torch.device("cuda:0"))
    assert host.side is side
    batches = [torch.tensor([3, 1]), torch.tensor([7, 0, 2]), torch.tensor([5])]
    for k, raw in enumerate(host.stream(batches)):
        assert torch.equal(raw, x[batches[k]])
        log.append(("use", k))
    issued = [("stage", "pinned"), ("copy", "side", "non_blocking")]
    assert log == [*issued, ("record", "side", 1), *issued, ("record", "side", 2),
                   ("wait", "compute", 1), ("keep", "compute"), ("use", 0),
                   *issued, ("record", "side", 3), ("wait", "compute", 2), ("keep", "compute"), ("use", 1),
                   ("wait", "compute", 3), ("keep", "compute"), ("use", 2)]


def test_auto_placement_rule(monkeypatch):
    from fedlnl.compute.placement import DEVICE_SHARE, HOST_ABOVE, choose

    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    assert choose("auto", 10**12, cpu) == "device" and choose("host", 10, cpu) == "host"
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (80 * 10**9, 80 * 10**9))
    assert choose("auto", int(DEVICE_SHARE * 80e9) - 1, cuda) == "device"
    assert choose("auto", int(DEVICE_SHARE * 80e9) + 1, cuda) == "host"
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (10**12, 10**12))  # a card of 1 TB free
    assert choose("auto", HOST_ABOVE + 1, cuda) == "host"  # whatever the card says (full-size Clothing1M)
    assert choose("auto", HOST_ABOVE + 1, torch.device("mps")) == "host"
    assert choose("auto", 10**9, torch.device("mps")) == "device"
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
