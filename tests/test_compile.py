"""``compile: true``: the local step compiled once per run (fedlnl/methods/common/compiled.py).

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
from fedlnl.methods.common import compiled

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
    # the cross-entropy step (forward + loss, its backward with it) and the SGD update's two graphs
    # (first step: no momentum buffers yet; later steps), all made during the first client's update
    assert seen[0] == 3, seen
    assert seen == [seen[0]] * len(seen), f"graphs after each client update: {seen}"
    assert compiled._RUN is None  # the policy ends with its run: later eager code stays eager


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
