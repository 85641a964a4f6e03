"""Whether a run's ``summary.json`` can be believed: unchanged since the run wrote it, and its
figures those of its ``metrics.jsonl``.

The runner writes into every summary

- ``metrics_digest``: ``{"sha256": ..., "rows": ...}`` of ``metrics.jsonl``'s bytes as written;
- ``seal``: the SHA-256 of the summary's own content (canonical JSON, the seal left out).

``problem`` checks a sealed summary against both: ``metrics.jsonl`` edited, truncated or replaced
after the run fails the digest; a hand-edited ``summary.json`` (``best_acc`` set to 0.99) fails the
seal. Neither check recomputes a figure, so a summary stays valid when a later version of the code
defines a figure differently; the figures are recomputed only to name what an edit changed.

A summary written before digests existed (no ``seal``) is checked by recomputing ``best_acc`` and
``last10_acc`` from ``metrics.jsonl`` (``metrics.accuracy_summary``; the two figures whose definition
never changed): the only evidence such a run has. ``sealed`` tells the two cases apart.

A sweep does not skip a cell whose summary fails (``rundir.completed``): the runner keeps the old
files as ``*.unverified`` and runs the cell again. The report counts a sealed run that fails as
``unverified`` (never averaged) and warns about an unsealed one. No torch here: the report imports it.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from fedlnl.benchmark.metrics import accuracy_summary, cost_to_target

#: the summary key holding the digest of metrics.jsonl, and the one holding the summary's seal
DIGEST_KEY, SEAL_KEY = "metrics_digest", "seal"
#: statuses whose figures a sweep skips on and the report averages
FINISHED = ("complete", "diverged")
#: what an unsealed (older) summary is checked on
UNSEALED_KEYS = ("best_acc", "last10_acc")


def digest(path: Path) -> dict:
    """{"sha256": hex digest of the file's bytes, "rows": its number of lines}."""
    data = Path(path).read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "rows": data.count(b"\n")}


def seal(summary: dict) -> str:
    """The SHA-256 of ``summary`` (JSON-safe values: what ``summary.json`` holds) without its seal."""
    body = {k: v for k, v in summary.items() if k != SEAL_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sealed(summary: dict) -> bool:
    return isinstance(summary.get(SEAL_KEY), str) and isinstance(summary.get(DIGEST_KEY), dict)


def problem(run_dir: Path, summary: dict) -> str | None:
    """Why ``summary`` (``run_dir``'s summary.json, as read) cannot be believed, as one clause; None
    when it holds (or when there is nothing to check it against: no rows, an unsealed failed run)."""
    path = Path(run_dir) / "metrics.jsonl"
    try:
        data = path.read_bytes()
    except OSError:
        return "metrics.jsonl is missing" if summary.get("rounds_run") or sealed(summary) else None
    if sealed(summary):
        recorded, lines = summary[DIGEST_KEY], data.count(b"\n")
        if hashlib.sha256(data).hexdigest() != recorded.get("sha256") or lines != recorded.get("rows"):
            return (f"metrics.jsonl changed after summary.json was written ({lines} rows, "
                    f"{recorded.get('rows')} when written; its SHA-256 differs)")
        if seal(summary) != summary[SEAL_KEY]:
            changed = figure_mismatch(data, summary)
            return "summary.json was edited after the run" + (f": {changed}" if changed else " (its seal differs)")
        return None
    return figure_mismatch(data, summary, UNSEALED_KEYS)


def figure_mismatch(data: bytes, summary: dict, keys: tuple[str, ...] | None = None) -> str | None:
    """``summary.json has best_acc=0.99 but metrics.jsonl gives 0.219`` for the first figure (of
    ``keys``; all recomputable ones by default) that the rows in ``data`` do not give; None if none."""
    try:
        rows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    except ValueError as err:
        return f"metrics.jsonl does not parse ({err})"
    if not all(isinstance(r, dict) for r in rows):
        return "metrics.jsonl holds a line that is not a row"
    expected = dict(accuracy_summary(rows))
    expected["rounds_run"] = rows[-1].get("round") if rows else 0
    targets = (summary.get("config") or {}).get("targets")
    if isinstance(targets, list):
        expected["cost_to_target"] = cost_to_target(rows, targets)
        expected["cost_to_target_balanced"] = cost_to_target(rows, targets, key="balanced_acc")
    if summary.get("status") in FINISHED and rows:  # the last row is the end of the run
        expected["comm_cost"], expected["bytes_up"] = rows[-1].get("comm_cost"), rows[-1].get("bytes_up")
    for key in keys or tuple(expected):
        if key in summary and key in expected and not _same(summary[key], expected[key]):
            return f"summary.json has {key}={_show(summary[key])} but metrics.jsonl gives {_show(expected[key])}"
    return None


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _show(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."
