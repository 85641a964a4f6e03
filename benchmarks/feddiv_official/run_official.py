"""Run the official FedDiv loop (main.py of lijichang/FLNL-FedDiv @ 918624c, "code release/") on a
federation exported by fedlnl (benchmarks/export_federation.py --images), on CPU, instrumented.

Patches (all here, by wrapping; no line of the official files is edited):
  P1 data: get_dataset -> the exported uint8 images (suite order) through the official transforms
     (crop 32 pad 4 + flip + ImageNet normalisation for training; normalisation only for test),
     dict_clients -> the exported partition; args.device = cpu, args.num_classes = 10;
     mixup_data's permutation stays on the CPU (its default use_cuda=True calls .cuda())
  P2 noise: add_noise -> the exported noisy labels (and realised rates)
  P3 D18 shim: gmm.GaussianMixture.__init__ also stores X, covariances_init, is_quiet, the
     attributes scikit-learn >= 1.2's get_params needs (EM unchanged)
  P4 --xi / --m parsed as float (their argparse type is int)
  P5 evaluation: the per-client test after every local update in the training phase is skipped
     (it only logs); in the warm-up (one client per sub-round, so the client's model is the global
     one) only every --warmup_eval_every-th client and the last are tested
  P6 instrumentation (wrappers, no algorithmic change): per client the global-model losses, the
     split, relabels and training-set share; per round the global filter and the test accuracy
Usage: python run_official.py --fed FED.npz --log LOG.jsonl [--warmup_eval_every 10] -- <main.py flags>
"""
import argparse
import json
import sys
import time

import numpy as np
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--fed", required=True)
ap.add_argument("--log", required=True)
ap.add_argument("--warmup_eval_every", type=int, default=10)
ap.add_argument("--threads", type=int, default=1)
mine, rest = ap.parse_known_args()
if rest and rest[0] == "--":
    rest = rest[1:]
sys.argv = [sys.argv[0]] + rest
torch.set_num_threads(mine.threads)

# P4: float types for --xi / --m (must precede the parser's construction)
_add = argparse.ArgumentParser.add_argument


def _add_argument(self, *a, **kw):
    if a and a[0] in ("--xi", "--m"):
        kw["type"] = float
    return _add(self, *a, **kw)


argparse.ArgumentParser.add_argument = _add_argument

import gmm  # noqa: E402

# P3: D18 shim
_gmm_init = gmm.GaussianMixture.__init__


def _gmm_shim(self, X, n_components=3, covariance_type='full', weights_init=None, means_init=None,
              precisions_init=None, covariances_init=None, init_params='kmeans', tol=1e-3,
              random_state=None, is_quiet=False):
    self.X, self.covariances_init, self.is_quiet = X, covariances_init, is_quiet
    _gmm_init(self, X, n_components=n_components, covariance_type=covariance_type,
              weights_init=weights_init, means_init=means_init, precisions_init=precisions_init,
              covariances_init=covariances_init, init_params=init_params, tol=tol,
              random_state=random_state, is_quiet=is_quiet)


gmm.GaussianMixture.__init__ = _gmm_shim

import main as M  # noqa: E402
from PIL import Image  # noqa: E402
from torchvision import transforms  # noqa: E402

FED = np.load(mine.fed)
CLEAN = FED["clean_labels"]
OFF, IDX = FED["client_offsets"], FED["client_indices"]
LOG = open(mine.log, "w")
T0 = time.time()


def log(rec):
    rec["time_s"] = round(time.time() - T0, 1)
    LOG.write(json.dumps(rec) + "\n")
    LOG.flush()


class ArrayDataset(torch.utils.data.Dataset):
    def __init__(self, x_nchw, labels, transform):
        self.data = np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1))
        self.train_labels = np.asarray(labels)
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(Image.fromarray(self.data[i])), self.train_labels[i]


# P1
def get_dataset(args):
    args.device = torch.device("cpu")
    args.num_classes = 10
    norm = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    trans_train = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                      transforms.ToTensor(), norm])
    trans_val = transforms.Compose([transforms.ToTensor(), norm])
    train = ArrayDataset(FED["x_train"], CLEAN, trans_train)
    test = ArrayDataset(FED["x_test"], FED["y_test"], trans_val)
    dict_clients = {k: list(IDX[OFF[k]:OFF[k + 1]]) for k in range(len(OFF) - 1)}
    log({"event": "start", "federation_hash": str(FED["federation_hash"]), "args": sys.argv[1:]})
    return train, test, dict_clients


# P2
def add_noise(args, y_train, dict_clients):
    assert np.array_equal(y_train, CLEAN)
    return FED["labels"].copy(), FED["realized_rate"].copy()


M.get_dataset, M.add_noise = get_dataset, add_noise

# P1b: mixup_data moves its permutation to CUDA by default; CPU here (same torch.randperm draw)
import util.local_training as LT  # noqa: E402
_mixup = LT.mixup_data
LT.mixup_data = lambda x, y, alpha=1.0, use_cuda=True: _mixup(x, y, alpha, use_cuda=False)

# P5 + accuracy
S = {"eval_global": False, "warm": 0, "round": -1, "clients": [], "loss": None}
_globaltest = M.globaltest
_warm_total = None


def globaltest(net, ds, args):
    if S["eval_global"]:
        S["eval_global"] = False
        return _global_round(net, ds, args)
    if S["round"] >= 0:
        return float("nan")  # P5: training-phase per-client test skipped
    S["warm"] += 1
    total = args.iteration1 * int(args.num_clients * args.frac1) * int(1 / args.frac1)
    if S["warm"] % mine.warmup_eval_every == 0 or S["warm"] == total:
        acc = _globaltest(net, ds, args)
        log({"event": "warmup", "client_round": S["warm"], "acc": acc})
        return acc
    return float("nan")


M.globaltest = globaltest

# P6: per-client instrumentation
_split = M.local_data_splitting


def local_data_splitting(loss, global_noise_filter):
    S["loss"] = np.asarray(loss, np.float64)
    return _split(loss, global_noise_filter)


_relabel = M.relabeling_and_reselection


def relabeling_and_reselection(args, local_split, idx, sample_idx, idx_cnt, local_output, dataset_train, de_bias):
    if S["round"] != args.current_ep:
        S["round"], S["clients"] = args.current_ep, []
    before = np.array(dataset_train.train_labels)[sample_idx]
    out = _relabel(args, local_split, idx, sample_idx, idx_cnt, local_output, dataset_train, de_bias)
    revised, ds = out[0], out[1]
    after = np.array(ds.train_labels)[sample_idx]
    clean = CLEAN[sample_idx]
    correct = before == clean  # the label the client filters with is right
    flagged = np.asarray(local_split["pred_noisy"])
    changed = after != before
    loss = S["loss"]
    nl = (loss - loss.min()) / (loss.max() - loss.min())
    rev = np.array(sorted(revised), dtype=np.int64)
    S["clients"].append({
        "client": int(idx), "count": int(idx_cnt[idx]), "n": int(len(sample_idx)),
        "delta_hat": float(local_split["estimated_noisy_level"]),
        "true_rate": float(FED["realized_rate"][idx]), "current_noise": float(1 - correct.mean()),
        "flagged": int(flagged.sum()), "n_correct": int(correct.sum()),
        "flagged_correct": int((flagged & correct).sum()), "flagged_wrong": int((flagged & ~correct).sum()),
        "relabels": int(changed.sum()), "relabels_right": int((changed & (after == clean)).sum()),
        "train_n": int(len(rev)),
        "train_correct": int((np.array(ds.train_labels)[rev] == CLEAN[rev]).sum()) if len(rev) else 0,
        "loss_correct": float(loss[correct].mean()) if correct.any() else None,
        "loss_wrong": float(loss[~correct].mean()) if (~correct).any() else None,
        "nloss_correct": float(nl[correct].mean()) if correct.any() else None,
        "nloss_wrong": float(nl[~correct].mean()) if (~correct).any() else None,
        "loss_min": float(loss.min()), "loss_max": float(loss.max()),
    })
    return out


_local_filter = M.local_filter_training


def local_filter_training(loss, idx, global_noise_filter, server_cached_local_filter):
    out = _local_filter(loss, idx, global_noise_filter, server_cached_local_filter)
    p = out[1][idx]["parameters"]
    loss = np.asarray(loss, np.float64)
    labels = np.array(M_DATA["train"].train_labels)[np.array(IDX[OFF[idx]:OFF[idx + 1]])]
    correct = labels == CLEAN[IDX[OFF[idx]:OFF[idx + 1]]]
    nl = (loss - loss.min()) / (loss.max() - loss.min())
    S["clients"][-1].update({
        "local_means": np.ravel(p["means"][-1]).tolist(), "local_vars": np.ravel(p["covariances"][-1]).tolist(),
        "local_weights": np.ravel(p["weights"][-1]).tolist(),
        "post_nloss_correct": float(nl[correct].mean()) if correct.any() else None,
        "post_nloss_wrong": float(nl[~correct].mean()) if (~correct).any() else None,
        "post_loss_correct": float(loss[correct].mean()) if correct.any() else None,
    })
    return out


M_DATA = {}
_training_phase = M.model_training_phase


def model_training_phase(args, dataset_train, *a, **kw):
    M_DATA["train"] = dataset_train
    gf = a[8]
    log({"event": "initial_filter", "means": np.ravel(gf.model.means_).tolist(),
         "precisions": np.ravel(gf.model.precisions_).tolist(), "weights": np.ravel(gf.model.weights_).tolist()})
    return _training_phase(args, dataset_train, *a, **kw)


_filter_agg = M.federated_filter_aggregation


def federated_filter_aggregation(server_cached_local_filter, dict_clients, global_noise_filter):
    _filter_agg(server_cached_local_filter, dict_clients, global_noise_filter)
    S["filter"] = {"means": np.ravel(global_noise_filter.avg_clients_means).tolist(),
                   "vars": np.ravel(global_noise_filter.avg_clients_covariances).tolist(),
                   "weights": np.ravel(global_noise_filter.avg_clients_weights).tolist(),
                   "cached": len(server_cached_local_filter)}
    S["eval_global"] = True


def _global_round(net, ds, args):
    acc = _globaltest(net, ds, args)
    cl = S["clients"]
    labels = np.array(M_DATA["train"].train_labels)
    tot = lambda k: int(sum(c[k] for c in cl))  # noqa: E731
    log({"event": "round", "round": int(args.current_ep) + 1, "acc": acc, "filter": S["filter"],
         "flagged_share": tot("flagged") / tot("n"),
         "flagged_among_correct": tot("flagged_correct") / max(tot("n_correct"), 1),
         "flagged_among_wrong": tot("flagged_wrong") / max(tot("n") - tot("n_correct"), 1),
         "noisy_clients": int(sum(c["delta_hat"] > args.clean_set_thres for c in cl)),
         "mu_mae": float(np.mean([abs(c["delta_hat"] - c["true_rate"]) for c in cl])),
         "relabels": tot("relabels"), "relabels_right": tot("relabels_right"),
         "train_share": tot("train_n") / tot("n"), "train_label_acc": tot("train_correct") / max(tot("train_n"), 1),
         "label_noise_all": float(np.mean(labels != CLEAN)),
         "clients": cl})
    return acc


M.local_data_splitting = local_data_splitting
M.relabeling_and_reselection = relabeling_and_reselection
M.local_filter_training = local_filter_training
M.model_training_phase = model_training_phase
M.federated_filter_aggregation = federated_filter_aggregation

if __name__ == "__main__":
    args = M.args_parser()
    args.pid = "0"
    M.args = args  # local_model_warmup reads the module-level args
    import os
    out = os.path.join("./record", os.path.basename(mine.log).replace(".jsonl", ""))
    os.makedirs(out, exist_ok=True)
    M.main(args, out)
    log({"event": "end"})
