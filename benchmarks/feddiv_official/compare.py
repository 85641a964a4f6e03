"""Side-by-side table + figure: official FedDiv code (run_official.py logs) vs the suite's runs.
Usage: python compare.py LOGS SWEEPS [FIGURE.png]
  LOGS: the folder of run_official.py logs (off_00_code.jsonl, off_06_05_code.jsonl, off_06_05_paperhp.jsonl)
  SWEEPS: the results/sweeps folder of the suite's runs (suite_driver.py, name=feddiv_official)"""
import glob
import json
import math
import os
import sys

import numpy as np

L, SW = (sys.argv[1:3] + [None, None])[:2]  # None: print the usage


def official(path):
    """rows: x (participations), acc, stage, + per round stats (training)."""
    if not os.path.exists(path):
        return None
    rows, cum_rel, cum_right = [], 0, 0
    for line in open(path):
        r = json.loads(line)
        if r["event"] == "warmup":
            rows.append({"x": r["client_round"], "acc": r["acc"], "stage": "warmup"})
        elif r["event"] == "round":
            cum_rel += r["relabels"]
            cum_right += r["relabels_right"]
            f = r["filter"]
            lo = int(np.argmin(f["means"]))
            rows.append({"x": 200 + 10 * r["round"], "round": r["round"], "acc": r["acc"], "stage": "training",
                         "mu_c": f["means"][lo], "mu_n": f["means"][1 - lo], "var_c": f["vars"][lo],
                         "var_n": f["vars"][1 - lo], "pi_c": f["weights"][lo],
                         "flag": r["flagged_share"], "flag_c": r["flagged_among_correct"],
                         "flag_w": r["flagged_among_wrong"], "noisy_clients": r["noisy_clients"],
                         "mae": r["mu_mae"], "relabels": cum_rel,
                         "relabel_acc": cum_right / cum_rel if cum_rel else float("nan"),
                         "share": r["train_share"], "noise": r["label_noise_all"]})
    return rows


def suite(d):
    p = os.path.join(d, "metrics.jsonl")
    if not os.path.exists(p):
        return None
    rows, k = [], 0
    for line in open(p):
        r = json.loads(line)
        st = r.get("stage", "fedavg")
        row = {"x": r["comm_cost"], "acc": r["acc"], "stage": st}
        if st == "training":
            k += 1
            row.update(round=k, mu_c=r.get("filter_mu_clean"), mu_n=r.get("filter_mu_noisy"),
                       var_c=r.get("x_var_clean"), var_n=r.get("x_var_noisy"), pi_c=r.get("x_pi_clean"),
                       flag=r.get("x_flag_share"), flag_c=r.get("x_flag_correct"), flag_w=r.get("x_flag_wrong"),
                       noisy_clients=r.get("noisy_clients"), mae=r.get("mu_mae"), relabels=r.get("relabels", 0),
                       relabel_acc=r.get("relabel_acc", float("nan")), share=r.get("train_share"),
                       noise=r.get("noise_after_correction"))
        rows.append(row)
    return rows


def summary(rows):
    if not rows:
        return None
    wu = [r for r in rows if r["stage"] == "warmup"]
    tr = [r for r in rows if r["stage"] == "training"] or [r for r in rows if r["stage"] == "fedavg"]
    if not tr:
        tr = wu[-1:]
    accs = [r["acc"] for r in rows if r["acc"] is not None and not math.isnan(r["acc"])]
    last = tr[-10:]
    out = {"wu_end": wu[-1]["acc"] if wu else float("nan"), "best": max(accs), "final": tr[-1]["acc"],
           "last10": float(np.mean([r["acc"] for r in last])), "rounds": len(tr)}
    if "flag" in tr[-1]:
        m = lambda k: float(np.nanmean([r[k] for r in last]))  # noqa: E731
        out.update(mu_c=tr[-1]["mu_c"], mu_n=tr[-1]["mu_n"], var_c=tr[-1]["var_c"], var_n=tr[-1]["var_n"],
                   pi_c=tr[-1]["pi_c"], flag=m("flag"), flag_c=m("flag_c"), flag_w=m("flag_w"), mae=m("mae"),
                   noisy_clients=m("noisy_clients"), relabels=tr[-1]["relabels"], relabel_acc=tr[-1]["relabel_acc"],
                   share=m("share"), noise=tr[-1]["noise"])
    return out


def cell(noise, fid, method="feddiv", name="feddiv_official", extra=""):
    ds = [d for d in glob.glob(f"{SW}/{name}/*") if f"method={method}," in d and f"noise.rho_tau=[{noise}]" in d and (f"fidelity={fid}" in d if fid else "fidelity" not in d) and extra in d]
    return ds[0] if ds else None


def fmt(v, p=3):
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.{p}g}" if abs(v) < 1e-2 and v != 0 else f"{v:.{p}f}"
    return str(v)


RUNS = {}


def collect(specs):
    for noise, key in (("0.6,0.5", "06"), ("0.0,0.0", "00")):
        for label, kind, arg in specs(noise, key):
            rows = official(arg) if kind == "official" else suite(arg) if arg else None
            RUNS[(noise, label)] = rows


def default_specs(noise, key):
    """The runs of docs/feddiv_official.md: official code (its flags; with the paper's ζ, ξ, m) and the
    suite's FedDiv (defaults before and after the change to the code's behaviour where the paper is
    silent; reference fidelity), FedAvg on the same federation."""
    off = f"{L}/off_{key.replace('06', '06_05')}"
    return [("official code", "official", f"{off}_code.jsonl"),
            ("official code, paper ζ ξ m", "official", f"{off}_paperhp.jsonl"),
            ("suite reference", "suite", cell(noise, "reference", name=f"feddiv_ref{key}")),
            ("suite paper, raw losses (before)", "suite", cell(noise, "paper")),
            ("suite default (now)", "suite", cell(noise, None, name=f"feddiv_new{key}")),
            ("FedAvg (suite)", "suite", cell(noise, None, "fedavg", name="feddiv_fedavg"))]


def table():
    cols = ["wu_end", "best", "final", "last10", "mu_c", "mu_n", "var_c", "var_n", "pi_c", "flag", "flag_c",
            "flag_w", "mae", "relabels", "relabel_acc", "share", "noise"]
    lines = []
    for noise in ("0.6,0.5", "0.0,0.0"):
        lines.append(f"\n(ρ, τ) = ({noise})\n")
        lines.append("| run | " + " | ".join(cols) + " |")
        lines.append("|---" * (len(cols) + 1) + "|")
        for (n, label), rows in RUNS.items():
            if n != noise or not rows:
                continue
            s = summary(rows)
            lines.append(f"| {label} | " + " | ".join(fmt(s.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def figure(out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = ["acc", "flag_c", "mu_c"]
    titles = ["global test accuracy", "share of correct labels flagged noisy", "global filter: clean-component mean"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    labels = list(dict.fromkeys(label for _, label in RUNS))
    colour = {label: f"C{i}" for i, label in enumerate(labels)}  # one colour per run in every panel
    for i, noise in enumerate(("0.6,0.5", "0.0,0.0")):
        for j, k in enumerate(keys):
            ax = axes[i, j]
            for (n, label), rows in RUNS.items():
                if n != noise or not rows:
                    continue
                pts = [(r["x"], r.get(k)) for r in rows if r.get(k) is not None and not (isinstance(r.get(k), float) and math.isnan(r[k]))]
                if not pts:
                    continue
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=label, lw=1.2, color=colour[label])
            ax.axvline(200, color="grey", lw=0.6, ls=":")
            ax.set_title(f"{titles[j]}, (ρ,τ)=({noise})", fontsize=9)
            ax.set_xlabel("client participations (warm-up: 200)", fontsize=8)
            if k == "mu_c":
                ax.set_yscale("log")
        axes[i, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if L is None or L in ("-h", "--help"):
        sys.exit(print("usage: " + __doc__.split("Usage: ", 1)[1]))
    collect(default_specs)
    print(table())
    if len(sys.argv) > 3:
        figure(sys.argv[3])
