"""Speed of the runner's local-training path against two baselines, measured in one process.

One client epoch of LeNet-5 on 500 random 3x32x32 images, batch 10, SGD momentum 0.5:
  runner   fedlnl.methods.common.engine.local_train on uint8 tensors with batched crop+flip augmentation
  no-aug   the same with augment=False (the bare loop does no augmentation either)
  bare     a bare SGD step loop over pre-normalised, pre-batched float tensors (no augmentation)
  loader   torchvision per-sample PIL transforms (RandomCrop 32 pad 4, flip, ToTensor, Normalize)
           through a DataLoader (num_workers=0), the reference codes' data path
Prints the median of several repeats and the ratios runner/bare and loader/runner.

Then the compiled step (``compile: true``, ``fedlnl/compute/compiled.py``) against the eager one:
the runner's path (crop+flip) on one working model reset to the same weights before each epoch, as
the runner loads each client's global weights; eager epochs before and after the compiled ones
(pooled median, so drift shows in neither alone), the compiled epochs after the first, and the first
compiled epoch's extra time (compilation). ``--no-compile`` skips it.
Usage: python benchmarks/speed.py [--repeats 5] [--samples 500] [--threads N] [--no-compile]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from fedlnl.compute import compiled
from fedlnl.methods.common import engine
from fedlnl.methods.common.protocol import Optim
from fedlnl.models.lenet import LeNet

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class PILDataset(Dataset):
    def __init__(self, images: np.ndarray, labels: np.ndarray, transform):
        self.images = [Image.fromarray(im) for im in images]  # HWC uint8, as torchvision CIFAR
        self.labels, self.transform = labels, transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), int(self.labels[i])


def new_model():
    torch.manual_seed(0)
    return LeNet(10, (3, 32, 32))


def time_runner(x_u8, y, bs, augment=True):
    model = new_model()
    data = engine.TensorData.build(x_u8, MEAN, STD, {"crop": 32, "pad": 4, "flip": True}, "cpu")
    idx = torch.arange(len(y))
    t = time.perf_counter()
    engine.local_train(model, data, idx, y, epochs=1, batch_size=bs, optim=Optim("sgd", 0.01, 0.0, 0.5),
                       gen=torch.Generator().manual_seed(0), augment=augment)
    return time.perf_counter() - t


def time_runner_plain(x_u8, y, bs):
    """The runner's path without the crop+flip the bare loop does not do either."""
    return time_runner(x_u8, y, bs, augment=False)


def time_bare(x_u8, y, bs):
    model = new_model()
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    xs = ((x_u8.float() / 255 - mean) / std).split(bs)
    ys = y.split(bs)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    t = time.perf_counter()
    for xb, yb in zip(xs, ys):
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t


def time_loader(x_u8, y, bs):
    model = new_model()
    tf = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    ds = PILDataset(x_u8.permute(0, 2, 3, 1).numpy(), y.numpy(), tf)
    loader = DataLoader(ds, batch_size=bs, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    t = time.perf_counter()
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return time.perf_counter() - t


def compare_compiled(x_u8, y, bs, repeats):
    """Seconds per client epoch, eager (before and after) and compiled, and the first compiled epoch."""
    model = new_model()
    start = engine.get_weights(model)
    data = engine.TensorData.build(x_u8, MEAN, STD, {"crop": 32, "pad": 4, "flip": True}, "cpu")
    idx = torch.arange(len(y))

    def epoch():
        engine.set_weights(model, start)
        t = time.perf_counter()
        engine.local_train(model, data, idx, y, epochs=1, batch_size=bs, optim=Optim("sgd", 0.01, 0.0, 0.5),
                           gen=torch.Generator().manual_seed(0))
        return time.perf_counter() - t

    epoch()  # warm-up
    eager = [epoch() for _ in range(repeats)]
    data.compiled = compiled.start(True, "cpu")  # the run's compiled step travels with its data
    try:
        first = epoch()
        fast = [epoch() for _ in range(repeats)]
    finally:
        data.compiled = None
    eager += [epoch() for _ in range(repeats)]
    return statistics.median(eager), statistics.median(fast), first


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave as is)")
    ap.add_argument("--no-compile", action="store_true", help="skip the eager / compiled comparison")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (args.samples, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (args.samples,), generator=g)
    timers = {"runner": time_runner, "no-aug": time_runner_plain, "bare": time_bare, "loader": time_loader}
    for fn in timers.values():  # warm-up
        fn(x[:50], y[:50], args.batch_size)
    times = {name: [] for name in timers}
    for _ in range(args.repeats):  # interleaved, so drift hits every path alike
        for name, fn in timers.items():
            times[name].append(fn(x, y, args.batch_size))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"one client epoch: LeNet-5, {args.samples} samples 3x32x32, batch {args.batch_size}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}")
    for name in timers:
        print(f"  {name:7s} {med[name] * 1000:8.1f} ms")
    print(f"  runner / bare   = {med['runner'] / med['bare']:.2f}x  (the runner's path, with crop+flip)")
    print(f"  no-aug / bare   = {med['no-aug'] / med['bare']:.2f}x  (the same path without augmentation: "
          f"the runner's own overhead)")
    print(f"  loader / runner = {med['loader'] / med['runner']:.2f}x  (speed-up over a per-sample DataLoader)")
    if args.no_compile:
        return
    eager, fast, first = compare_compiled(x, y, args.batch_size, args.repeats)
    print(f"compiled local step (compile: true) vs eager, same path and weights, median of {args.repeats} "
          f"(eager: {2 * args.repeats}, before and after)")
    print(f"  eager    {eager * 1000:8.1f} ms per client epoch")
    print(f"  compiled {fast * 1000:8.1f} ms per client epoch")
    print(f"  eager / compiled = {eager / fast:.2f}x  (> 1: the compiled step is faster)")
    print(f"  compilation: first compiled epoch {first:.1f} s, {first - fast:.1f} s more than a compiled epoch")


if __name__ == "__main__":
    main()
