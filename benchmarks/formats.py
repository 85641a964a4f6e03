"""Which memory format each model should get on this machine's CPU: NCHW vs channels-last inputs.

For every model, one thread, medians of several repeats (the machine may be shared):
  eval   a forward pass in inference mode over ``--eval-batch`` images (the test-set evaluation)
  train  one SGD step (forward, backward, step) at batch 10 (the local-training step)
and the largest difference between the two formats' logits (fp rounding only).
A model lists the device types where channels-last wins in its ``channels_last_on`` attribute
(``engine.memory_format``). Usage: python benchmarks/formats.py [--repeats 5] [--models lenet cnn]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fedlnl.models.cnn import CNN
from fedlnl.models.lenet import LeNet
from fedlnl.models.resnet import resnet18
from fedlnl.models.vgg import VGG11

MODELS = {  # name -> (constructor, input shape, eval batch scale)
    "lenet": (lambda: LeNet(10, (3, 32, 32)), (3, 32, 32), 1.0),
    "cnn": (lambda: CNN(10, (1, 8, 8), (16, 32), 2), (1, 8, 8), 1.0),
    "resnet18": (lambda: resnet18(10, (3, 32, 32)), (3, 32, 32), 0.1),
    "vgg11": (lambda: VGG11(10, (3, 32, 32), False, "client"), (3, 32, 32), 0.1),
}
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def timed(fns: dict, repeats: int) -> dict:
    """Median seconds of each function, calls interleaved so that load changes hit all alike."""
    for fn in fns.values():
        fn()  # warm-up (oneDNN primitive creation)
    out = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            out[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in out.items()}


def measure(name, repeats, eval_batch):
    make, shape, scale = MODELS[name]
    torch.manual_seed(0)
    model = make()
    n = max(int(eval_batch * scale), 10)
    x = torch.randn(n, *shape)
    xb, yb = x[:10], torch.randint(0, 10, (10,))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.5)
    model.eval()
    with torch.inference_mode():  # the same weights in both formats (before any training step)
        logits = {key: model(x.contiguous(memory_format=fmt)) for key, fmt in FORMATS.items()}
    evals, trains = {}, {}
    for key, fmt in FORMATS.items():
        xe, xt = x.contiguous(memory_format=fmt), xb.contiguous(memory_format=fmt)

        def ev(xe=xe):
            model.eval()
            with torch.inference_mode():
                model(xe)

        def tr(xt=xt):
            model.train()
            loss = F.cross_entropy(model(xt), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()

        evals[key], trains[key] = ev, tr
    ev_t, tr_t = timed(evals, repeats), timed(trains, repeats * 10)
    res = {key: (ev_t[key], tr_t[key]) for key in FORMATS}
    diff = (logits["nchw"] - logits["channels_last"]).abs().max().item()
    return n, res, diff


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--eval-batch", type=int, default=1000)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"CPU, 1 thread, median of {args.repeats} (eval) / {10 * args.repeats} (train step, batch 10)")
    for name in args.models:
        n, res, diff = measure(name, args.repeats, args.eval_batch)
        (e0, t0), (e1, t1) = res["nchw"], res["channels_last"]
        print(f"  {name:9s} eval {n:5d} imgs: nchw {e0 * 1e3:8.1f} ms  cl {e1 * 1e3:8.1f} ms  ({e0 / e1:4.2f}x) | "
              f"train step: nchw {t0 * 1e3:7.2f} ms  cl {t1 * 1e3:7.2f} ms  ({t0 / t1:4.2f}x) | "
              f"max |logit diff| {diff:.1e}")


if __name__ == "__main__":
    main()
