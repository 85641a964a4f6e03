"""Which accuracy the report's tables show, what each is called in a caption, and the default.

Two protocols choose the round a run is reported at: ``best_acc`` picks it on the test set (the
papers' protocol, flattering each method by its own amount), ``selected_acc`` picks it by the
federation's noisy-validation accuracy (``selection.val_share`` > 0), never looking at the test set.
``last10_acc`` and ``final_acc`` choose no round.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fedlnl.benchmark.metrics import LAST_K, summary_metrics
from fedlnl.benchmark.report.cells import canon

BEST, FINAL, LAST = summary_metrics("acc")
BEST_BALANCED, FINAL_BALANCED, LAST_BALANCED = summary_metrics("balanced_acc")
#: test accuracy at the round of the best noisy-validation accuracy (null without a validation set)
SELECTED = "selected_acc"
METRICS = (SELECTED, BEST, FINAL, LAST, BEST_BALANCED, FINAL_BALANCED, LAST_BALANCED)
#: ``--metric`` shorthands: (metric, default --beside)
ALIASES = {"acc": (BEST, LAST), "balanced_acc": (BEST_BALANCED, LAST_BALANCED), "selected": (SELECTED, LAST)}
AUTO = "auto"

_TEST_CHOSEN = "the papers' protocol: the round is chosen on the test set"
#: each metric as a caption names it: what it measures, its summary key, how its round is chosen
DESCRIPTIONS = {
    SELECTED: f"test accuracy at the round of best noisy-validation accuracy ({SELECTED}; the round is chosen "
              "without the test set)",
    BEST: f"best test accuracy over all evaluations ({BEST}; {_TEST_CHOSEN})",
    FINAL: f"test accuracy at the last evaluation ({FINAL})",
    LAST: f"mean of the last {LAST_K} evaluations ({LAST})",
    BEST_BALANCED: f"best balanced test accuracy (mean per-class recall) over all evaluations ({BEST_BALANCED}; "
                   f"{_TEST_CHOSEN})",
    FINAL_BALANCED: f"balanced test accuracy at the last evaluation ({FINAL_BALANCED})",
    LAST_BALANCED: f"mean balanced test accuracy of the last {LAST_K} evaluations ({LAST_BALANCED})",
}


def describe(key: str | None) -> str:
    """A metric as a caption names it (a summary key the report does not know: the key itself)."""
    return DESCRIPTIONS.get(key, str(key))


@dataclass(frozen=True)
class Metric:
    """What the tables show: ``main`` (bold, tests, paper values), ``beside`` it, the summaries'
    cost dict and the metrics.jsonl column the curves are drawn from; ``why``: how the default
    was chosen when it was (a note of the report)."""
    main: str = BEST
    beside: str | None = LAST
    why: str = ""

    @property
    def balanced(self) -> bool:
        return "balanced" in self.main

    @property
    def cost_key(self) -> str:
        return "cost_to_target_balanced" if self.balanced else "cost_to_target"

    @property
    def curve(self) -> str:
        return "balanced_acc" if self.balanced else "acc"

    @property
    def shown(self) -> list[str]:
        return [self.main] + ([self.beside] if self.beside not in (None, self.main) else [])

    @property
    def paper(self) -> str:
        """The reference CSVs' metric the main one is compared with: the papers publish their best
        test accuracy, the number selected_acc stands for under our protocol."""
        return BEST if self.main == SELECTED else self.main

    def caption(self) -> str:
        """The first sentence of a table caption: every metric shown, named."""
        text = "Metric (%): " + describe(self.main)
        if self.beside not in (None, self.main):
            text += f"; beside it (columns suffixed {self.beside}), {describe(self.beside)}"
        return text


def resolve_metric(metric: str, beside: str | None = "auto") -> Metric:
    """``--metric`` (an alias or a summary key) and ``--beside`` ("auto": last-10 of the same
    accuracy, "none": nothing) as a :class:`Metric`."""
    main, auto = ALIASES.get(metric, (metric, LAST_BALANCED if "balanced" in metric else LAST))
    if beside == "auto":
        beside = auto
    return Metric(main, None if beside in (None, "none") else ALIASES.get(beside, (beside,))[0])


def default_metric(frame: pd.DataFrame, beside: str | None = "auto") -> Metric:
    """``selected_acc`` when every complete run has one (each held a validation set), else
    ``best_acc``; runs mixing both get ``best_acc`` and a sentence saying why (``Metric.why``)."""
    done = frame[frame["status"] == "complete"] if "status" in frame else frame.iloc[:0]
    held = done[SELECTED].map(canon).notna() if SELECTED in done else pd.Series(False, index=done.index)
    if len(done) and held.all():
        return resolve_metric(SELECTED, beside)
    metric = resolve_metric(BEST, beside)
    if not held.any():
        return metric
    why = (f"metric: {BEST}, not {SELECTED}: {int(held.sum())} of {len(done)} complete run(s) have a {SELECTED}, "
           f"{int((~held).sum())} have none (no validation set, selection.val_share = 0, or a summary written "
           f"before the runner recorded it); one protocol for every row, so the tables show {BEST}. "
           f"`--metric {SELECTED}` shows the runs that have it")
    return Metric(metric.main, metric.beside, why)
