"""``compile: true``: the local step compiled once per run (fedlnl/compute/compiled.py).

One module-scoped pair of tiny FedAvg runs (eager, compiled) serves the compiled-run assertions:
compiling on the CPU takes seconds to a minute, so it is done once.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch._dynamo.utils import counters

from conftest import compose_cfg, run_tiny
from test_robustness import TINY, assert_refused, cli

from fedlnl.benchmark.rundir import config_hash
from fedlnl.conf.keys import CELL_DIR_EXCLUDED, NON_RESULT_KEYS
from fedlnl.methods import fedavg
from fedlnl.compute import compiled
from fedlnl.compute import data as compute_data

#: debug=tiny FedAvg: 3 rounds x 3 of 6 clients
ROUNDS, COHORT = 3, 3
#: compiled vs eager: relative tolerance of the test and training losses, absolute of the accuracy
TOL, ACC_TOL = 1e-3, 0.01


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{eager, compiled: (summary, metrics rows)}, and the graph count after each client update of
    the compiled run."""
    dirs = {"eager": tmp_path_factory.mktemp("eager"), "compiled": tmp_path_factory.mktemp("compiled")}
    eager = run_tiny(dirs["eager"], [])
    seen: list[int] = []
    update = fedavg.FedAvg.client_update

    def counted(self, state, client, ctx):
        out = update(self, state, client, ctx)
        seen.append(graphs())
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fedavg.FedAvg, "client_update", counted)
        fast = run_tiny(dirs["compiled"], ["compile=true"])
    rows = {k: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()] for k, d in dirs.items()}
    return {"eager": (eager, rows["eager"]), "compiled": (fast, rows["compiled"])}, seen


def test_the_step_compiles_once_and_no_client_or_round_compiles_again(runs):
    (fast, _), seen = runs[0]["compiled"], runs[1]
    assert fast["status"] == "complete" and fast["compile"] == "default"
    assert len(seen) == ROUNDS * COHORT
    # the whole step (forward, loss, backward, update: one graph) and the SGD update of a client's
    # short last batch (eager forward and backward; momentum buffers by then), both made during the
    # first client's update
    assert seen[0] == 2, seen
    assert seen == [seen[0]] * len(seen), f"graphs after each client update: {seen}"
    # no run is kept in the module: the policy travels with its run's data, so later eager code stays eager
    assert not any(isinstance(v, compiled.Run) for v in vars(compiled).values())


def test_compiled_numbers_equal_eager_ones_within_float_tolerance(runs):
    (eager, eager_rows), (fast, fast_rows) = runs[0]["eager"], runs[0]["compiled"]
    assert eager["compile"] is None
    assert fast["local_steps"] == eager["local_steps"] > 0  # every step counted (the optimiser's step hooks)
    assert len(fast_rows) == len(eager_rows) == ROUNDS
    # the same weights, batches and draws: fused kernels change the last bits, which grow over the
    # steps but stay within TOL of the losses and a test sample or two of the accuracy
    for e, f in zip(eager_rows, fast_rows):
        for key in ("loss", "train_loss"):
            assert math.isclose(f[key], e[key], rel_tol=TOL), (key, e, f)
        assert abs(f["acc"] - e["acc"]) <= ACC_TOL, (e, f)


@pytest.mark.parametrize("value", ["1", "yes", "null", "'true'"])
def test_bad_compile_values_are_refused_before_training(tmp_path, value):
    assert_refused(cli([*TINY, f"compile={value}"], tmp_path), "compile=", tmp_path)


def test_compile_is_part_of_the_config_hash_and_of_the_cell_name():
    def hashed(flag: str) -> str:
        return config_hash(OmegaConf.to_container(compose_cfg([*TINY, f"compile={flag}"]), resolve=True))

    assert compose_cfg(TINY).compile is False  # the default
    assert hashed("true") != hashed("false")
    assert "compile" not in NON_RESULT_KEYS and "compile" not in CELL_DIR_EXCLUDED
    # eager is how every run before the key was made: its hash is the hash without the key
    before = OmegaConf.to_container(compose_cfg(TINY), resolve=True)
    del before["compile"]
    assert hashed("false") == config_hash(before)


def test_the_sgd_subclass_outside_a_compiled_run_steps_as_torch_sgd_bit_for_bit():
    """The glue around the update (momentum buffers kept in the optimiser's state, weight decay,
    param groups) equals torch's SGD; eager here, so the comparison is exact."""
    torch.manual_seed(0)
    a = [torch.randn(5, 3, requires_grad=True), torch.randn(4, requires_grad=True)]
    b = [p.detach().clone().requires_grad_() for p in a]
    ref = torch.optim.SGD(a, lr=0.1, momentum=0.5, weight_decay=1e-3)
    ours = compiled.SGD(b, lr=0.1, momentum=0.5, weight_decay=1e-3)
    for step in range(4):
        g = [torch.randn_like(p) for p in a]
        for params, opt in ((a, ref), (b, ours)):
            opt.zero_grad(set_to_none=True)
            for p, gp in zip(params, g):
                p.grad = gp.clone()
            opt.step()
        assert all(torch.equal(p, q) for p, q in zip(a, b)), step
    assert all(torch.equal(ref.state[p]["momentum_buffer"], ours.state[q]["momentum_buffer"]) for p, q in zip(a, b))


def _bn_net() -> torch.nn.Module:
    """A convolution, batch norm (running statistics: buffers the whole step updates) and a head."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))


def test_the_whole_step_trains_as_torch_sgd_within_float_tolerance_and_fires_the_step_hooks():
    whole_step_matches_torch_sgd("cpu")


def whole_step_matches_torch_sgd(device: str) -> None:
    """Three full batches (the compiled whole step: weights, momentum buffers, weight decay, batch-norm
    statistics) then a short one (eager forward and backward, compiled update), against an eager
    ``torch.optim.SGD`` on the same batches; each step fires the optimiser's step hooks once. Step by
    step, since a batch-norm network's training is chaotic: over rounds an eager run whose weights
    are perturbed by 1e-7 drifts from itself as far as the compiled one does (ResNet-18, 30 steps:
    max |Δw| 3.7e-2 vs 4.0e-2), so run-level tolerances only hold for small plain networks."""
    from fedlnl.methods.common.engine import ce_loss
    torch.manual_seed(0)
    ref_net, net = _bn_net().to(device), _bn_net().to(device)
    net.load_state_dict(ref_net.state_dict())
    xs, ys = torch.randn(4, 8, 3, 8, 8, device=device), torch.randint(0, 10, (4, 8), device=device)
    ref = torch.optim.SGD(ref_net.parameters(), lr=0.1, momentum=0.5, weight_decay=1e-3)
    steps = []
    run = compiled.start(True, device)
    ours = compiled.SGD(net.parameters(), run, lr=0.1, momentum=0.5, weight_decay=1e-3)
    ours.register_step_post_hook(lambda *_: steps.append(1))
    whole = compiled.whole_step(run, ce_loss, ours, batch_size=8)
    assert whole is not None
    for i, n in enumerate((8, 8, 8, 5)):
        x, y = xs[i, :n], ys[i, :n]
        loss = whole(net, x, y)
        ref.zero_grad(set_to_none=True)
        expected = ce_loss(ref_net, x, y, 0, None)
        expected.backward()
        ref.step()
        assert math.isclose(float(loss), float(expected.detach()), rel_tol=1e-5), i
        for (name, a), b in zip(ref_net.state_dict().items(), net.state_dict().values()):
            assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-6), (i, name)
        for p, q in zip(ref_net.parameters(), net.parameters()):
            assert torch.allclose(ref.state[p]["momentum_buffer"], ours.state[q]["momentum_buffer"],
                                  rtol=1e-4, atol=1e-6), i
    assert len(steps) == 4


def test_the_whole_step_is_taken_only_for_a_pure_loss_and_a_plain_sgd():
    from fedlnl.methods.common.engine import ce_loss
    from fedlnl.methods.common.optimizers import ClipGrad
    from fedlnl.methods.common.protocol import Optim
    net = _bn_net()
    assert compiled.whole_step(None, ce_loss, compiled.SGD(net.parameters(), lr=0.1, momentum=0.5), 8) is None  # eager
    run = compiled.start(True, "cpu")
    plain = compiled.SGD(net.parameters(), run, lr=0.1, momentum=0.5)
    assert compiled.whole_step(run, ce_loss, plain, 8) is not None
    assert compiled.whole_step(None, ce_loss, plain, 8) is None  # no compiled run passed: eager
    assert compiled.whole_step(run, lambda m, x, y, s, g: ce_loss(m, x, y, s, g), plain, 8) is None  # not pure
    nesterov = compiled.SGD(net.parameters(), run, lr=0.1, nesterov=True, momentum=0.5)
    assert compiled.whole_step(run, ce_loss, nesterov, 8) is None
    assert compiled.whole_step(run, ce_loss, torch.optim.Adam(net.parameters()), 8) is None
    wrapped = ClipGrad(1.0)(net, Optim("sgd", 0.1, 0.0, 0.5), run=run)
    assert compiled.whole_step(run, ce_loss, wrapped, 8) is None  # a wrapper


def test_an_sgd_over_part_of_the_model_takes_eager_gradients_of_that_part_only():
    """An optimiser over the head alone: the whole step would differentiate and update every weight,
    so this one steps eagerly, and the body stays as it was (as with torch's SGD)."""
    from fedlnl.methods.common.engine import ce_loss
    torch.manual_seed(0)
    net = _bn_net()
    body = [p.detach().clone() for p in net[0].parameters()]
    run = compiled.start(True, "cpu")
    opt = compiled.SGD(net[4].parameters(), run, lr=0.1, momentum=0.5)
    head = net[4].weight.detach().clone()
    loss = compiled.whole_step(run, ce_loss, opt, 8)(net, torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,)))
    assert math.isfinite(float(loss))
    assert all(torch.equal(p, q) for p, q in zip(net[0].parameters(), body))
    assert not torch.equal(net[4].weight, head)


@pytest.mark.parametrize("augment", [{"crop": 32, "pad": 4, "flip": True}, {"crop": 28, "pad": 0, "flip": False},
                                     None])
def test_the_images_the_compiled_step_computes_equal_the_eager_ones_bit_for_bit(augment):
    deferred_images_equal_eager_ones(augment, "cpu")


def deferred_images_equal_eager_ones(augment, device: str) -> None:
    """A deferred batch (uint8 images and the same draws) gives ``images``' tensor: eagerly
    (``Batch.images``), through ``prepare`` (one-hot products instead of the gather) and compiled;
    and the draws of a deferred pass leave the generator where the eager pass does."""
    from fedlnl.methods.common import engine
    x = torch.randint(0, 256, (23, 3, 32, 32), dtype=torch.uint8)
    data = engine.TensorData.build(x, (0.49, 0.48, 0.45), (0.25, 0.24, 0.26), augment, device)
    idx = torch.randperm(23, generator=torch.Generator().manual_seed(1)).to(device)
    runs = {}
    for deferred in (False, True):
        gen = torch.Generator().manual_seed(0)
        engine.device_generator(gen, idx.device, fresh=True)
        runs[deferred] = (list(engine.epoch_batches(data, idx, 10, gen, augment=True, memory_format=torch.channels_last,
                                                    deferred=deferred)), torch.rand(1, generator=gen))
    (eager, after), (lazy, lazy_after) = runs[False], runs[True]
    assert torch.equal(after, lazy_after) and len(eager) == len(lazy) == 3
    prepare = torch.compile(compute_data.prepare, dynamic=False)
    for (pos, images), (pos2, batch) in zip(eager, lazy):
        assert torch.equal(pos, pos2) and isinstance(batch, engine.Batch)
        _, tensors, static = batch.graph_inputs()
        assert torch.equal(batch.images(), images)
        assert torch.equal(compute_data.prepare(*tensors, *static), images)
        assert torch.equal(prepare(*tensors, *static), images)
