"""Seed x side table (and figure) of FedDiv runs on one exported federation: the official code
(run_official.py logs) beside the suite (suite_driver.py run directories), one row per run.

Columns: warm-up end accuracy; best and last-10 test accuracy; the first 10 training rounds' mean
accuracy and the share of correct / wrong labels the global filter flags there; the share of
samples flagged in training round 1 (the initial filter's arbitrary split, docs/methods/feddiv.md §3.4);
relabel events with their accuracy; the share of wrong labels at the end. Best is over the same
evaluations on both sides: every 10th warm-up participation, the warm-up's last, and every
training round (the official harness tests only those in the warm-up).
Usage: python seeds.py [--figure PNG] RUN... (a RUN ending in .jsonl is an official log, else a
suite run directory; the label is the file or directory name)
"""
import json
import math
import os
import sys

import numpy as np

STATS = ("acc", "flag_c", "flag_w", "flag")


def official(path):
    """(warm-up [(participation, acc)], training [{acc, flag_c, flag_w, flag, relabels, right}], noise)"""
    wu, tr, noise = [], [], float("nan")
    for line in open(path):
        r = json.loads(line)
        if r["event"] == "warmup":
            wu.append((r["client_round"], r["acc"]))
        elif r["event"] == "round":
            tr.append({"acc": r["acc"], "flag_c": r["flagged_among_correct"], "flag_w": r["flagged_among_wrong"],
                       "flag": r["flagged_share"], "relabels": r["relabels"], "right": r["relabels_right"]})
            noise = r["label_noise_all"]
    return wu, tr, noise


def suite(path):
    rows = [json.loads(line) for line in open(os.path.join(path, "metrics.jsonl"))]
    wu = [(r["comm_cost"], r["acc"]) for r in rows if r.get("stage") == "warmup"]
    wu = [(x, a) for x, a in wu if x % 10 == 0 or x == len(wu)]
    tr, events, right = [], 0.0, 0.0
    for r in (r for r in rows if r.get("stage") == "training"):
        cum, acc = r.get("relabels", 0.0), r.get("relabel_acc", float("nan"))
        cum_right = cum * acc if cum else 0.0
        tr.append({"acc": r["acc"], "flag_c": r.get("x_flag_correct"), "flag_w": r.get("x_flag_wrong"),
                   "flag": r.get("x_flag_share"), "relabels": cum - events, "right": cum_right - right})
        events, right = cum, cum_right
    return wu, tr, rows[-1].get("noise_after_correction", float("nan"))


def summary(wu, tr, noise):
    mean = lambda v: float(np.nanmean([x if x is not None else np.nan for x in v])) if v else float("nan")  # noqa: E731
    first = tr[:10]
    rel = sum(r["relabels"] for r in tr)
    return {"wu_end": wu[-1][1] if wu else float("nan"),
            "best": max([a for _, a in wu] + [r["acc"] for r in tr]),
            "last10": mean([r["acc"] for r in tr[-10:]]), "rounds": len(tr),
            "first10": mean([r["acc"] for r in first]), "flag_c10": mean([r["flag_c"] for r in first]),
            "flag_w10": mean([r["flag_w"] for r in first]), "flag_r1": tr[0]["flag"] if tr else float("nan"),
            "relabels": rel, "relabel_acc": sum(r["right"] for r in tr) / rel if rel else float("nan"),
            "noise": noise}


def load(run):
    return official(run) if run.endswith(".jsonl") else suite(run)


def pct(v):
    return "–" if v is None or math.isnan(v) else f"{100 * v:.1f}"


def table(runs):
    head = ("run", "rounds", "wu end", "best", "last-10", "rounds 1–10 acc", "flagged c / w, rounds 1–10",
            "flagged, round 1", "relabels (acc.)", "noise after")
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for run in runs:
        s = summary(*load(run))
        lines.append(f"| {os.path.basename(run.rstrip('/'))} | {s['rounds']} | {pct(s['wu_end'])} | {pct(s['best'])} | "
                     f"{pct(s['last10'])} | {pct(s['first10'])} | {pct(s['flag_c10'])} / {pct(s['flag_w10'])} | "
                     f"{pct(s['flag_r1'])} | {s['relabels']:,.0f} ({pct(s['relabel_acc'])}) | {pct(s['noise'])} |")
    return "\n".join(lines)


def figure(runs, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, run in enumerate(runs):
        wu, tr, _ = load(run)
        n = wu[-1][0] if wu else 0
        xs = [x for x, _ in wu] + [n + 10 * (j + 1) for j in range(len(tr))]
        style = "-" if run.endswith(".jsonl") else "--"
        label = os.path.basename(run.rstrip("/"))
        axes[0].plot(xs, [a for _, a in wu] + [r["acc"] for r in tr], style, color=f"C{i}", lw=1.1, label=label)
        axes[1].plot(range(1, len(tr) + 1), [r["flag_c"] for r in tr], style, color=f"C{i}", lw=1.1, label=label)
    axes[0].set(xlabel="client participations", ylabel="global test accuracy")
    axes[1].set(xlabel="training round", ylabel="share of correct labels flagged noisy")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        sys.exit(print("usage: " + __doc__.split("Usage: ", 1)[1]))
    fig = None
    if args[0] == "--figure":
        fig, args = args[1], args[2:]
    print(table(args))
    if fig:
        figure(args, fig)
