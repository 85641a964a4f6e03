"""The FedCorr workload of the papers, timed three ways in one process.

LeNet-5, 100 IID clients on the CIFAR-10 JPEG copy, symmetric noise (rho, tau) = (0.6, 0.5),
T1 = T2 = T3 = 1, one local epoch, batch 10, lr 0.03, momentum 0.5, ``fidelity=reference`` (mixup in
every stage, scoring passes on augmented views), the global model tested on the 10,000 test images
after every round, i.e. after every client in stage 1, as the paper does. With ``--rounds K`` only
the first K rounds run (stage 1: K clients, K evaluations); ``--rounds 0`` runs all 102
(6,000 SGD steps, 102 evaluations).

  fedlnl  the runner (``Runner.prepare`` + ``Runner.run``), one thread; start-up timed apart
  bare    the same arithmetic in a bare loop: pre-normalised channels-last tensors, batched crop+flip,
          mixup, SGD; per stage-1 client a scoring pass (LID of the softmax outputs, per-sample losses)
          and an evaluation; stages 2-3 train 10 clients each and average them; relabel passes as
          prediction passes over 60 clients (GMM fits left out: milliseconds)
  loader  the reference codes' data path: per-sample PIL transforms through a torchvision DataLoader,
          a deep copy of the global model per client, evaluation through a DataLoader, NCHW
Prints the medians over ``--repeats`` (interleaved), the ratios, and the peak RSS after the first
fedlnl run (imports + one run). Needs the shared data (FEDLNL_SHARED, default ../shared).
Usage: python benchmarks/workload.py [--rounds 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import copy
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

from fedlnl.benchmark import preflight
from fedlnl.benchmark.runner import Runner
from fedlnl.methods.common import lnl
from fedlnl.models.lenet import LeNet

OVERRIDES = ["method=fedcorr", "dataset=cifar10_jpeg", "model=lenet", "noise.rho_tau=[0.6,0.5]",
             "method.T1=1", "method.T2=1", "method.T3=1", "fl.local_epochs=1", "fidelity=reference",
             "threads=1", "logger=none", "seed=0"]
LR, MOMENTUM, BS, ALPHA, LID_K, EVAL_BS = 0.03, 0.5, 10, 1.0, 20, 1000


def compose_cfg():
    with initialize_config_module(config_module="fedlnl.conf", version_base=None):
        return compose(config_name="config", overrides=OVERRIDES)


def run_fedlnl(cfg, rounds):
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        method = preflight.check_cell(cfg, {})  # built fresh per run, as fedlnl-run does
        runner = Runner(cfg, Path(tmp), "fedcorr", "bench", method)
        runner.prepare()
        t1 = time.perf_counter()
        if rounds:
            runner.total = rounds  # the first K rounds of the same schedule
        runner.run()
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1, runner


def plan(runner, rounds):
    """(stage, clients) of the rounds to run: stage 1 one client per round, then 10 + 10."""
    order = runner.method._stage1_plan(runner.info.num_clients, np.random.default_rng(0))
    out = [("pre", c) for c in order]
    rng = np.random.default_rng(1)
    out += [("avg", sorted(rng.choice(runner.info.num_clients, 10, replace=False).tolist())) for _ in range(2)]
    return out[:rounds] if rounds else out


# ------------------------------------------------------------------------------- bare loop
def time_bare(src, client_idx, labels, rounds_plan):
    torch.manual_seed(0)
    fmt = torch.channels_last
    mean = torch.tensor(src.mean).view(1, 3, 1, 1)
    std = torch.tensor(src.std).view(1, 3, 1, 1)
    norm = lambda x: ((x.float() / 255 - mean) / std).contiguous(memory_format=fmt)  # noqa: E731
    xtr = torch.cat([norm(c) for c in src.x_train.split(5000)])
    xpad = F.pad(xtr, (4, 4, 4, 4), value=0.0) + F.pad(torch.zeros_like(xtr[:1]), (4, 4, 4, 4), value=1.0) * (-mean / std)
    xte, yte = norm(src.x_test), src.y_test
    model = LeNet(10, (3, 32, 32))
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)

    def crop_flip(ix):
        oy = torch.randint(0, 9, (len(ix),), generator=gen).tolist()
        ox = torch.randint(0, 9, (len(ix),), generator=gen).tolist()
        fl = (torch.rand(len(ix), generator=gen) < 0.5).tolist()
        ims = [xpad[i, :, a:a + 32, b:b + 32] for i, a, b in zip(ix.tolist(), oy, ox)]
        return torch.stack([im.flip(-1) if f else im for im, f in zip(ims, fl)]).contiguous(memory_format=fmt)

    def train(k):
        idx, y = client_idx[k], labels[client_idx[k]]
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        for pos in torch.randperm(idx.numel(), generator=gen).split(BS):
            xb, yb = crop_flip(idx[pos]), y[pos]
            lam = float(rng.beta(ALPHA, ALPHA))
            perm = torch.randperm(len(pos), generator=gen)
            out = model(lam * xb + (1 - lam) * xb[perm])
            loss = lam * F.cross_entropy(out, yb) + (1 - lam) * F.cross_entropy(out, yb[perm])
            opt.zero_grad()
            loss.backward()
            opt.step()

    @torch.inference_mode()
    def predict(idx):
        model.eval()
        return torch.cat([model(crop_flip(c)) for c in idx.split(EVAL_BS)])

    @torch.inference_mode()
    def evaluate():
        model.eval()
        logits = torch.cat([model(c) for c in xte.split(EVAL_BS)])
        return (logits.argmax(1) == yte).float().mean().item()

    t = time.perf_counter()
    glob = copy.deepcopy(model.state_dict())
    for stage, ks in rounds_plan:
        if stage == "pre":
            model.load_state_dict(glob)
            train(ks[0])
            logits = predict(client_idx[ks[0]])
            lnl.lid_scores(logits.softmax(1), LID_K)
            F.cross_entropy(logits.softmax(1), labels[client_idx[ks[0]]], reduction="none")
            glob = copy.deepcopy(model.state_dict())
        else:
            ws = []
            for k in ks:
                model.load_state_dict(glob)
                train(k)
                ws.append(copy.deepcopy(model.state_dict()))
            glob = {n: sum(w[n] for w in ws) / len(ws) for n in glob}
            model.load_state_dict(glob)
        if stage == "avg" or len(rounds_plan) > 100 and stage == "pre" and ks == rounds_plan[99][1]:
            for k in range(60):  # relabel prediction passes of the noisy clients
                predict(client_idx[k])
        evaluate()
    return time.perf_counter() - t


# ------------------------------------------------------------------------------- DataLoader loop
class PILDataset(Dataset):
    def __init__(self, images, labels, transform):
        self.images = [Image.fromarray(im) for im in images]
        self.labels, self.transform = labels, transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.transform(self.images[i]), int(self.labels[i])


def time_loader(src, client_idx, labels, rounds_plan):
    torch.manual_seed(0)
    norm = transforms.Normalize(src.mean, src.std)
    train_tf = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), norm])
    hwc = src.x_train.permute(0, 2, 3, 1).numpy()
    test = PILDataset(src.x_test.permute(0, 2, 3, 1).numpy(), src.y_test.numpy(),
                      transforms.Compose([transforms.ToTensor(), norm]))
    ds = {}

    def client_ds(k):
        if k not in ds:
            ix = client_idx[k].numpy()
            ds[k] = PILDataset(hwc[ix], labels[client_idx[k]].numpy(), train_tf)
        return ds[k]

    net_glob = LeNet(10, (3, 32, 32))
    rng = np.random.default_rng(0)

    def train(k):
        net = copy.deepcopy(net_glob)  # the reference: a deep copy per client
        net.train()
        opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
        for xb, yb in DataLoader(client_ds(k), batch_size=BS, shuffle=True):
            lam = float(rng.beta(ALPHA, ALPHA))
            perm = torch.randperm(len(yb))
            out = net(lam * xb + (1 - lam) * xb[perm])
            loss = lam * F.cross_entropy(out, yb) + (1 - lam) * F.cross_entropy(out, yb[perm])
            opt.zero_grad()
            loss.backward()
            opt.step()
        return net

    @torch.no_grad()
    def predict(net, k):
        net.eval()
        return torch.cat([net(xb) for xb, _ in DataLoader(client_ds(k), batch_size=EVAL_BS)])

    @torch.no_grad()
    def evaluate(net):
        net.eval()
        return sum((net(xb).argmax(1) == yb).sum().item() for xb, yb in DataLoader(test, batch_size=EVAL_BS))

    t = time.perf_counter()
    for stage, ks in rounds_plan:
        if stage == "pre":
            net = train(ks[0])
            logits = predict(net, ks[0])
            lnl.lid_scores(logits.softmax(1), LID_K)
            net_glob.load_state_dict(net.state_dict())
        else:
            ws = [train(k).state_dict() for k in ks]
            net_glob.load_state_dict({n: sum(w[n] for w in ws) / len(ws) for n in ws[0]})
        if stage == "avg" or len(rounds_plan) > 100 and stage == "pre" and ks == rounds_plan[99][1]:
            for k in range(60):
                predict(net_glob, k)
        evaluate(net_glob)
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20, help="first K rounds (0 = the whole workload, 102)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", nargs="*", default=[], choices=["bare", "loader"])
    args = ap.parse_args(argv)
    os.environ.setdefault("FEDLNL_SHARED", str(Path(__file__).resolve().parents[1].parent / "shared"))
    data = Path(os.environ["FEDLNL_SHARED"]) / "data" / "cifar10-jpeg"
    if not data.is_dir():
        print(f"workload: skipped, no CIFAR-10 JPEG copy at {data} (set FEDLNL_SHARED)")
        return
    torch.set_num_threads(1)
    cfg = compose_cfg()
    times = {"startup": [], "fedlnl": [], "bare": [], "loader": []}
    peak = None
    for r in range(args.repeats):  # interleaved, so load changes on a shared machine hit all three
        start, loop, runner = run_fedlnl(cfg, args.rounds)
        times["startup"].append(start)
        times["fedlnl"].append(loop)
        if peak is None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        src, labels = runner.fed.source, runner.fed.labels
        client_idx = [torch.as_tensor(np.asarray(ix), dtype=torch.long) for ix in runner.fed.client_indices]
        rounds_plan = plan(runner, args.rounds)
        if "bare" not in args.skip:
            times["bare"].append(time_bare(src, client_idx, labels, rounds_plan))
        if "loader" not in args.skip:
            times["loader"].append(time_loader(src, client_idx, labels, rounds_plan))
        print(f"  repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items() if v), flush=True)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    rounds = args.rounds or runner.method.total_rounds(runner.info)
    print(f"FedCorr workload, LeNet-5 CIFAR-10 (JPEG copy), {rounds} rounds, 1 thread, median of {args.repeats}:")
    print(f"  fedlnl start-up of the first run (load the cached images, federation, model) "
          f"{times['startup'][0]:.1f} s (later repeats reuse the loaded source)")
    for k in ("fedlnl", "bare", "loader"):
        if k in med:
            print(f"  {k:7s} {med[k]:7.1f} s")
    if "bare" in med:
        print(f"  fedlnl / bare   = {med['fedlnl'] / med['bare']:.2f}x")
    if "loader" in med:
        print(f"  loader / fedlnl = {med['loader'] / med['fedlnl']:.2f}x")
    print(f"  peak RSS after imports + the first fedlnl run: {peak:.0f} MB")


if __name__ == "__main__":
    main()
