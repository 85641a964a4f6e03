"""Model selection without the test set, and per-client accuracy (the ``selection`` config node).

- Selection: each client holds out ``val_share`` of its noisy training samples (``datasets/federation.py``);
  at each evaluation every client with such a set reports its correct/total counts for the evaluated
  global model and the server forms ``val_acc``. ``selected_acc`` is the test accuracy at the
  evaluation with the best ``val_acc`` (ties -> the earlier): no test label chooses the round. For a
  method that names its training stages (the rows' ``stage``), ``stage=last`` chooses among the
  evaluations of its last stage only: the figure is the method's own model, not a warm-up's (which
  trains as FedAvg), and a tune's objective sees the values read only in that stage. ``stage=any``
  chooses among all evaluations (the rule before the key existed). A method without stages: all.
- Per-client accuracy: client k's local test set is the global test set sampled to its training class
  proportions; its accuracy at the *reported* evaluation (the selected one, or the best-test one when
  there is no validation set) gives ``client_acc_mean``, ``client_acc_worst10`` and ``client_gap``
  (clean minus noisy clients, the oracle's split: reporting only).

Pure Python and numpy: the report reads these names without torch.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedlnl.benchmark.metrics import read_rows
from fedlnl.conf.checks import choice, flag, integer, key, number, rule

#: the config path of the settings, in error messages
PREFIX = "selection."
#: the share of clients ``client_acc_worst10`` averages (the worst ceil(N / WORST) clients)
WORST = 10
#: bytes of one client's validation report at one evaluation: its correct and total counts, two int64
REPORT_BYTES = 16
#: the selection rules of ``selection.stage``; ``any`` reproduces the runs made before the key existed
STAGE_RULES = ("last", "any")


@dataclass(frozen=True)
class SelectionSettings:
    """The ``selection`` node of the config; every key checked by the validator before any data."""

    val_share: float = key("share of each client's noisy training samples held out for validation "
                              "(round(share * n_k), half up, at most n_k - 1); 0 = none: the papers' protocol",
                              rule(number, lambda v: 0.0 <= v < 1.0, "a share in [0, 1) (0 = no validation set)"))
    client_test_size: int = key("images in each client's local test set (the test set sampled to its "
                                   "training class proportions)", rule(integer, 1))
    client_every_eval: bool = key("also write client_acc_mean / client_acc_worst10 / client_gap into every "
                                     "metrics.jsonl row", rule(flag))
    stage: str = key("which evaluations the validation chooses from: last = those of the method's last "
                     "training stage (its own model; a method without stages: all), any = all (a warm-up's too)",
                     rule(choice, STAGE_RULES, text=True))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            f.metadata["check"](PREFIX + f.name, getattr(self, f.name))

    @classmethod
    def of(cls, node) -> "SelectionSettings":
        """The settings of a config node (a mapping); the defaults where there is none."""
        if node is None:
            return cls(0.0, 500, False, "any")
        # a config written before ``stage`` existed chose among all evaluations
        return cls(**{f.name: node.get(f.name, "any") if f.name == "stage" else node[f.name]
                      for f in dataclasses.fields(cls)})


# ------------------------------------------------------------------------------ the selection rule
def better(row: dict, key: str, best: float | None) -> bool:
    """Whether ``row`` beats the best ``key`` so far: a finite value strictly above it (ties keep the
    earlier row); a diverged row (test accuracy None) never does."""
    value = row.get(key)
    if row.get("acc") is None or value is None or not math.isfinite(value):
        return False
    return best is None or value > best


def best_row(rows: list[dict], key: str) -> dict | None:
    """The first row with the highest finite ``key`` among the rows that did not diverge, or None."""
    best = None
    for row in rows:
        if better(row, key, None if best is None else best[key]):
            best = row
    return best


def final_stage(rows: list[dict]):
    """The stage of the last evaluation that did not diverge (None: no such row, or no stages)."""
    evals = [r for r in rows if r.get("acc") is not None]
    return evals[-1].get("stage") if evals else None


def choosable(rows: list[dict], stage: str) -> list[dict]:
    """The rows ``selection.stage`` lets the validation choose from: ``any``: all; ``last``: those of
    ``final_stage`` (all rows when the method names no stages: every row's stage is None)."""
    if stage == "any":
        return rows
    last = final_stage(rows)
    return [r for r in rows if r.get("stage") == last]


def round_stages(rows: list[dict], selected_round=None) -> dict:
    """The training stage (the rows' ``stage``, where the method names one) of the last evaluation,
    of the best accuracy's round (``best_row``, as ``best_acc``) and of ``selected_round``:
    ``stage_last``, ``stage_best``, ``stage_selected``; {} when the rows name no stage. A figure read
    at a round before the last stage is an earlier stage's model (``report.stages``)."""
    evals = [r for r in rows if r.get("acc") is not None]
    if not evals or "stage" not in evals[-1]:
        return {}
    at = {r["round"]: r.get("stage") for r in evals}
    return {"stage_last": final_stage(evals), "stage_best": (best_row(evals, "acc") or {}).get("stage"),
            "stage_selected": at.get(selected_round)}


def stages_of(run_dir: str | Path, selected_round) -> dict:
    """``round_stages`` of the run's metrics.jsonl ({} without the file)."""
    path = Path(run_dir) / "metrics.jsonl"
    return round_stages(read_rows(path), selected_round) if path.is_file() else {}


def selection_summary(rows: list[dict], validated: bool, stage: str) -> dict:
    """``selected_acc``, ``selected_round``, ``selected_val_acc``: the row of the best ``val_acc``
    among the ``choosable`` rows; all None without a validation set (``validated`` False) or a
    selectable row."""
    row = best_row(choosable(rows, stage), "val_acc") if validated else None
    if row is None:
        return {"selected_acc": None, "selected_round": None, "selected_val_acc": None}
    return {"selected_acc": row["acc"], "selected_round": row["round"], "selected_val_acc": row["val_acc"]}


# ------------------------------------------------------------------------------ per-client figures
def client_stats(acc, noisy) -> dict:
    """Mean accuracy over the clients, mean of the worst ceil(N / 10) (``client_acc_worst10``), and
    mean of the clean clients minus mean of the noisy ones (``client_gap``; None when a group is empty).
    ``acc`` None (no evaluated row) gives None everywhere."""
    if acc is None:
        return {"client_acc_mean": None, "client_acc_worst10": None, "client_gap": None}
    a, noisy = np.asarray(acc, dtype=np.float64), np.asarray(noisy, dtype=bool)
    worst = np.sort(a)[:-(-len(a) // WORST)]  # ceil(N / 10) in integers (0.1 * 30 > 3 in floats)
    clean, dirty = a[~noisy], a[noisy]
    gap = float(clean.mean() - dirty.mean()) if len(clean) and len(dirty) else None
    return {"client_acc_mean": float(a.mean()), "client_acc_worst10": float(worst.mean()), "client_gap": gap}


class Reported:
    """The per-client accuracies of the reported evaluation, kept while the run goes: the row with the
    best ``key`` so far under ``better`` (``val_acc`` with a validation set, else ``acc``); with
    ``last_stage`` (``selection.stage=last`` and a validation set), the best since the stage of the
    rows last changed, so that at the end it is ``selection_summary``'s row."""

    def __init__(self, key: str, last_stage: bool = False):
        self.key, self.last_stage = key, last_stage
        self.round: int | None = None
        self.score: float | None = None
        self.acc: list[float] | None = None
        self.stage = None  # the stage of the last evaluation that did not diverge (``final_stage``)
        self.lost = False  # resumed from a checkpoint without this state: the figures are unknown

    def offer(self, row: dict, acc: list[float]) -> None:
        if self.last_stage and row.get("acc") is not None and row.get("stage") != self.stage:
            self.round, self.score, self.acc, self.stage = None, None, None, row.get("stage")
        if better(row, self.key, self.score):
            self.round, self.score, self.acc = row["round"], row[self.key], list(acc)

    def state(self) -> dict:
        return {"key": self.key, "round": self.round, "score": self.score, "acc": self.acc, "stage": self.stage}

    def load(self, state: dict | None) -> None:
        if state is None:
            self.lost = True
            return
        self.round, self.score, self.acc = state["round"], state["score"], state["acc"]
        self.stage = state.get("stage")

    def summary(self, noise_rate, noisy) -> dict:
        """``reported_round``, the three client figures and ``clients`` (per client: accuracy, the
        oracle's realised noise rate of its training samples and noisy flag), for the report."""
        acc = None if self.lost else self.acc
        return {"reported_round": None if self.lost else self.round, **client_stats(acc, noisy),
                "clients": {"acc": acc, "noise_rate": [float(r) for r in noise_rate],
                            "noisy": [bool(x) for x in noisy]}}
