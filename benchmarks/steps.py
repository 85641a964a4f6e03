"""What one local SGD step costs on the launch queue, per method: host reads, device moves and
dispatched aten ops, counted on the CPU (the counts are what a GPU would see: a move to the device the
data is already on is still a `Tensor.to` call).

Each method runs in-process at tiny size twice, with 1 and 3 local epochs (``--epochs``); a count per
step is the difference of the two runs divided by the extra optimizer steps, so set-up, evaluation
and aggregation cancel out and only what grows with the steps is left.

  host reads    Tensor.item / tolist / cpu / numpy, float() / int() / bool() / __index__ of a tensor
                (not engine.host_draw: the value of a host generator's draw, a CPU tensor by check)
  device moves  Tensor.to / cuda / pin_memory with a device, tensor / as_tensor with device=, copy_
  aten ops      every op dispatched (a TorchDispatchMode): on a GPU roughly one kernel launch each

A GPU-hour estimate prices each method from its own op count at ``--us-per-launch`` microseconds per
dispatched op (a launch-bound step: the device waits for the host).
Usage: python benchmarks/steps.py [--methods fedavg fedprox] [--ops-models lenet resnet18]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]
from fedlnl.methods.common.engine import HOST_DRAWS  # noqa: E402

READS = frozenset({"item", "__float__", "__int__", "__bool__", "__index__", "tolist", "cpu", "numpy"})
#: a tiny federation of 16x16 colour images with crop + flip (the augmentation every CIFAR preset uses)
#: (40 steps per local epoch, so a once-per-epoch decision costs <= 0.025 per step)
TINY = ["debug=tiny", "dataset=synthetic", "dataset.n_train=960", "dataset.n_test=60", "dataset.size=8",
        "dataset.augment={crop: 8, pad: 1, flip: true}", "fl.batch_size=4", "fl.eval_every=1",
        "logger=none", "device=cpu", "threads=1", "checkpoint_minutes=0"]


class Traffic(TorchFunctionMode):
    """Host reads and device moves (the calls that make the host wait for the device on a GPU)."""

    def __init__(self):
        super().__init__()
        self.reads = self.moves = self.host_draws = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS:
            # engine.host_draw: a CPU generator's value (mixup's λ, FedLSR's ω), which never waits for a
            # device; counted apart (shared/tools/step_traffic.py counts it as a read)
            drawn = HOST_DRAWS["depth"] > 0
            self.reads += not drawn
            self.host_draws += drawn

        elif name in ("to", "cuda", "pin_memory"):
            rest = list(args[1:]) + list(kwargs.values())
            if name != "to" or "device" in kwargs or any(isinstance(v, (torch.device, str, torch.Tensor)) for v in rest):
                self.moves += 1
        elif name == "copy_" or (name in ("tensor", "as_tensor") and "device" in kwargs):
            self.moves += 1
        return func(*args, **kwargs)


class Ops(TorchDispatchMode):
    """Dispatched aten ops."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def compose_cfg(overrides):
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from fedlnl.conf import resolvers  # noqa: F401

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="fedlnl.conf", version_base=None):
        return compose(config_name="config", overrides=overrides)


def count_run(method: str, epochs: int, extra=(), ops: bool = True) -> dict:
    """One in-process run of ``method`` with ``epochs`` local epochs: its reads, moves, ops, steps."""
    from fedlnl.benchmark.runner import run

    cfg = compose_cfg([f"method={method}", *TINY, f"fl.local_epochs={epochs}", *extra])
    steps = {"n": 0}
    hook = register_optimizer_step_post_hook(lambda *a, **k: steps.__setitem__("n", steps["n"] + 1))
    traffic, opc = Traffic(), Ops()
    try:
        with tempfile.TemporaryDirectory() as d, traffic, (opc if ops else contextlib.nullcontext()):
            out = run(cfg, Path(d) / "run", method)
    finally:
        hook.remove()
    assert out["status"] == "complete", out
    return {"reads": traffic.reads, "moves": traffic.moves, "host_draws": traffic.host_draws, "ops": opc.n,
            "steps": steps["n"]}


def warm(method: str, extra=()) -> None:
    """Load and check the federation once, so its cached loads count in neither run."""
    from fedlnl.benchmark import compose, preflight
    from fedlnl.benchmark.runner import Runner

    cfg = compose_cfg([f"method={method}", *TINY, *extra])
    with tempfile.TemporaryDirectory() as d:
        Runner(cfg, Path(d) / "run", method, "single", preflight.check_cell(cfg, compose.typed_keys(()))).prepare()


#: methods without local epochs (one central learner): more steps from a smaller batch instead
MORE_STEPS = {m: (["method.batch_size=8", "method.warmup_batch_size=8"], ["method.batch_size=4", "method.warmup_batch_size=4"])
              for m in ("dividemix_central",)}
MORE_STEPS["jointopt_central"] = (["method.batch_size=8"], ["method.batch_size=4"])


def per_step(method: str, epochs=(1, 3), extra=(), ops: bool = True) -> dict:
    """Reads, moves and ops that grow with the local steps, per extra optimizer step."""
    warm(method, extra)
    if method in MORE_STEPS:
        lo, hi = (count_run(method, 1, [*extra, *more], ops) for more in MORE_STEPS[method])
    else:
        lo, hi = (count_run(method, e, extra, ops) for e in epochs)
    extra_steps = hi["steps"] - lo["steps"]
    if extra_steps <= 0:
        raise RuntimeError(f"{method}: {epochs} local epochs ran {lo['steps']} and {hi['steps']} steps")
    out = {k: (hi[k] - lo[k]) / extra_steps for k in ("reads", "moves", "host_draws", "ops")}
    return {**out, "steps": (lo["steps"], hi["steps"])}


def method_names() -> list[str]:
    return sorted(p.stem for p in (REPO / "fedlnl" / "conf" / "method").glob("*.yaml"))


def ops_ratios(model: str, methods=("fedavg", "fedprox", "feddyn"), epochs=(1, 2)) -> dict:
    """Dispatched ops per local step of each method on ``model`` (32x32 images) and the ratio to FedAvg."""
    extra = [f"model={model}", "dataset.size=32", "dataset.augment={crop: 32, pad: 4, flip: true}",
             "dataset.n_train=240"]
    per = {m: per_step(m, epochs, extra)["ops"] for m in methods}
    return {m: (v, v / per[methods[0]]) for m, v in per.items()}


def term_ops(model_name: str) -> dict:
    """Dispatched ops of one batch-10 SGD step (forward, backward, step) of ``model_name`` on 32x32
    images: plain (FedAvg), and with FedProx's term (μ/2·‖w − w_g‖²) or FedDyn's (a_k·Σ⟨p, c⟩ with
    the weight decay its optimiser adds) written tensor by tensor (the reference expressions) or as
    the methods run them (``engine.prox_penalty`` with μ passed in, ``engine.linear_term``)."""
    from fedlnl.methods.common import engine
    from fedlnl.methods.common.protocol import Optim
    from fedlnl.methods.common.optimizers import FusedDecay
    from fedlnl.models.lenet import LeNet
    from fedlnl.models.resnet import resnet18

    torch.manual_seed(0)
    model = {"lenet": LeNet, "resnet18": resnet18}[model_name](10, (3, 32, 32))
    params = list(model.parameters())
    anchor = [p.detach().clone() for p in params]
    coef = [torch.randn_like(p) for p in params]
    x, y = torch.randn(10, 3, 32, 32), torch.randint(0, 10, (10,))
    def sgd(wd=0.0):
        return lambda: torch.optim.SGD(params, lr=0.01, momentum=0.5, weight_decay=wd)

    terms = {  # name: (term, optimiser)
        "none": (lambda: 0.0, sgd()),
        "prox per tensor": (lambda: 0.01 * (0.5 * sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))), sgd()),
        "prox fused": (lambda: engine.prox_penalty(model, anchor, "half_squared", 0.01), sgd()),
        "linear per tensor": (lambda: 0.1 * sum((p * c).sum() for p, c in zip(params, coef)), sgd(0.1)),
        "linear fused": (lambda: 0.1 * engine.linear_term(params, coef),
                         lambda: FusedDecay(0.1)(model, Optim("sgd", 0.01, 0.0, 0.5))),
    }
    out = {}
    for name, (term, make_opt) in terms.items():
        opt = make_opt()
        for _ in range(2):  # the second step: momentum buffers exist, as in every later step
            ops = Ops()
            with ops:
                loss = torch.nn.functional.cross_entropy(model(x), y) + term()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        out[name] = ops.n
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="*", default=None, help="default: every conf/method YAML")
    ap.add_argument("--ops-models", nargs="*", default=["lenet", "resnet18"])
    ap.add_argument("--us-per-launch", type=float, default=10.0,
                    help="host cost of one dispatched op on a GPU, in microseconds (launch-bound step)")
    ap.add_argument("--json", action="store_true", help="one JSON line per method instead of the table")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    print(f"per local step (1 vs 3 local epochs, tiny federation, 8x8 crop+flip, batch 4); "
          f"GPU-hours per 1e6 steps at {args.us_per_launch:g} us per dispatched op")
    print(f"| method | host reads / step | device moves / step | host-generator draws / step | aten ops / step "
          f"| GPU-h / 1e6 steps |")
    print("|---|---|---|---|---|---|")
    for m in args.methods or method_names():
        try:
            r = per_step(m)
        except Exception as e:  # one broken method must not hide the others' figures
            print(f"| {m} | error: {type(e).__name__}: {str(e)[:80]} | | | | |")
            continue
        hours = r["ops"] * args.us_per_launch * 1e-6 * 1e6 / 3600
        if args.json:
            print(json.dumps({"method": m, **r}))
        print(f"| {m} | {r['reads']:.2f} | {r['moves']:.2f} | {r['host_draws']:.2f} | {r['ops']:.0f} | {hours:.2f} |",
              flush=True)
    for model in ("lenet", "resnet18"):
        ops = term_ops(model)
        print(f"{model}: aten ops of one SGD step, {len(ops)} forms in this process: "
              + ", ".join(f"{k} {v} ({v / ops['none']:.2f}x)" for k, v in ops.items()), flush=True)
    for model in args.ops_models:
        ratios = ops_ratios(model)
        print(f"{model}: aten ops per step " + ", ".join(f"{m} {v:.0f} ({q:.2f}x)" for m, (v, q) in ratios.items()),
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
