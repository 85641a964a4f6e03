"""fedlnl-run with extra FedDiv statistics in metrics.jsonl (scratch instrumentation, oracle-based):
per round the share of samples the global filter flags, among samples whose current label is right
(x_flag_correct) and wrong (x_flag_wrong), the mean raw / normalised global-model loss of right and
wrong labels, the local filters' fitted means, and the global filter's variances and weights.

``--fed-seed S`` builds the federation (partition, noisy labels) from seed S whatever ``seed=`` says,
so ``seed=`` varies only the training randomness (model init, client sampling, warm-up order,
shuffling, augmentation, mixup, GMM seeds), as ``--seed`` does for the official code run on one
exported federation (run_official.py). The federation hash is logged by fedlnl-run; compare it with
the export's.

``--warmup-prefix`` declares the warm-up a shared prefix (protocol.shared_prefix): runs of one
federation, seed and warm-up config (the keys in WARMUP_KEYS, which are all the warm-up reads)
start the training phase from the state the first of them saved, so variants of the training
phase's keys cost only its rounds. Run directories must share a parent (the prefix lives there).
``--fit-on-global`` (a diagnostic, not a method option) fits each local filter on the losses the
client filtered with, the global model's pre-training losses, instead of the trained local model's
(D7: the filter is fitted on one model's losses and applied to another's).
Usage: python suite_driver.py [--fed-seed S] [--warmup-prefix] [--fit-on-global] <fedlnl-run overrides>
"""
import numpy as np
import torch

from fedlnl.benchmark import run, runner
from fedlnl.datasets import federation
from fedlnl.methods import feddiv as fd

G = {}
_prepare = runner.Runner.prepare


def prepare(self):
    _prepare(self)
    G["clean"] = self.fed.oracle.clean_labels.clone()


runner.Runner.prepare = prepare
_client = fd.FedDiv._training_client


def training_client(self, state, view, ctx):
    G["view"] = view
    return _client(self, state, view, ctx)


_split = fd.FedDiv._split
_filter_input = fd.filter_input


def filter_input(loss, normalize):
    """--fit-on-global: the post-training fit reads the pre-training (global-model) losses."""
    x = _filter_input(loss, normalize)
    if G.get("phase") == "split":
        G["x_global"] = x
    elif G.get("phase") == "after" and G.get("fit_on_global"):
        return G["x_global"]
    return x


def split(self, state, cs, loss, ctx, k):
    G["phase"] = "split"
    filt, clean, delta = _split(self, state, cs, loss, ctx, k)
    G["phase"] = None
    v = G["view"]
    right = (v.labels.cpu() == G["clean"][v.indices.cpu()]).numpy()
    flagged = ~clean.cpu().numpy()
    x = loss.detach().double().cpu().numpy()
    nx = fd.minmax(x)
    acc = state.setdefault("_x", [])
    acc.append(dict(n=len(x), right=int(right.sum()), flag_right=int((flagged & right).sum()),
                    flag_wrong=int((flagged & ~right).sum()),
                    loss_right=float(x[right].mean()) if right.any() else np.nan,
                    loss_wrong=float(x[~right].mean()) if (~right).any() else np.nan,
                    nloss_right=float(nx[right].mean()) if right.any() else np.nan,
                    nloss_wrong=float(nx[~right].mean()) if (~right).any() else np.nan))
    return filt, clean, delta


_after = fd.FedDiv._after_training


def after_training(self, model, view, cs, filt, labels, ctx):
    G["phase"] = "after"
    local = _after(self, model, view, cs, filt, labels, ctx)
    G["phase"] = None
    lo = int(np.argmin(local["means"]))
    G.setdefault("local", []).append((float(local["means"][lo]), float(local["means"][1 - lo])))
    return local


_report = fd.FedDiv._report


def report(self, state, ctx):
    out = _report(self, state, ctx)
    xs = state.pop("_x", [])
    s = lambda key: sum(c[key] for c in xs)  # noqa: E731
    n, right = s("n"), s("right")
    out.update(x_flag_share=(s("flag_right") + s("flag_wrong")) / n,
               x_flag_correct=s("flag_right") / max(right, 1), x_flag_wrong=s("flag_wrong") / max(n - right, 1),
               x_loss_right=float(np.nanmean([c["loss_right"] for c in xs])),
               x_loss_wrong=float(np.nanmean([c["loss_wrong"] for c in xs])) if n > right else 0.0,
               x_nloss_right=float(np.nanmean([c["nloss_right"] for c in xs])),
               x_nloss_wrong=float(np.nanmean([c["nloss_wrong"] for c in xs])) if n > right else 0.0)
    loc = G.pop("local", [])
    if loc:
        out.update(x_local_mu_clean=float(np.mean([a for a, _ in loc])),
                   x_local_mu_noisy=float(np.mean([b for _, b in loc])))
    f = state.get("filter")
    if f is not None and not self.local_filter:
        lo = int(np.argmin(f["means"]))
        out.update(x_var_clean=float(f["variances"][lo]), x_var_noisy=float(f["variances"][1 - lo]),
                   x_pi_clean=float(f["weights"][lo]))
    return out


#: the method keys the warm-up reads (FedDiv._warmup_client, _batch_loss, init's filter, fl.lr pin)
WARMUP_KEYS = ("_target_", "lr", "warmup_iterations", "training_rounds", "mixup_alpha", "eta", "regularizer",
               "eta_twice", "unmixed_forward", "reg_covar")


def warmup_prefix(self, info, method_cfg):
    return self._warmup_rounds(info.num_clients), {k: v for k, v in method_cfg.items() if k in WARMUP_KEYS}


fd.filter_input = filter_input
fd.FedDiv._training_client = training_client
fd.FedDiv._split = split
fd.FedDiv._after_training = after_training
fd.FedDiv._report = report

if __name__ == "__main__":
    import sys

    if sys.argv[1:2] in (["-h"], ["--help"]):
        sys.exit(print("usage: python suite_driver.py [--fed-seed S] [--warmup-prefix] [--fit-on-global] <fedlnl-run overrides>\n\n" + __doc__))
    if sys.argv[1:2] == ["--fed-seed"]:
        fed_seed = int(sys.argv[2])
        del sys.argv[1:3]
        _build = federation.build_federation

        def build_federation(dataset, partition, noise, num_clients, seed):
            return _build(dataset, partition, noise, num_clients, fed_seed)
        federation.build_federation = build_federation
    if sys.argv[1:2] == ["--warmup-prefix"]:
        del sys.argv[1]
        fd.FedDiv.shared_prefix = warmup_prefix
    if sys.argv[1:2] == ["--fit-on-global"]:
        del sys.argv[1]
        G["fit_on_global"] = True
    torch.set_num_threads(1)
    run.main()
