"""Metric sinks: a JSONL file per run (always) and Weights & Biases (optional).

This is the only module that imports wandb, and only when a W&B sink is built.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import urlparse

log = logging.getLogger("fedlnl")


def _clean(value):
    """JSON-safe: NaN/inf become null, numpy/torch scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:  # numpy arrays, tensors
        return _clean(value.tolist())
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


#: the values a JSON file of a run holds (summary.json's seal is computed over them)
json_safe = _clean


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to a temporary file and rename it over ``path``: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(_clean(obj), f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written temporary file
        raise


#: row keys measured by the wall clock: kept out of metrics.jsonl (which is byte-identical between
#: two runs of the same config) and written to timing.jsonl instead
CLOCK_KEYS = ("time_s",)


class JsonlSink:
    """metrics.jsonl (the numbers) and timing.jsonl (the wall clock of the same rows)."""

    def __init__(self, path: Path):
        self.file = open(path, "w")
        self.timing = open(Path(path).with_name("timing.jsonl"), "w")

    def log(self, row: dict) -> None:
        row = _clean(row)
        self.file.write(json.dumps({k: v for k, v in row.items() if k not in CLOCK_KEYS}) + "\n")
        self.timing.write(json.dumps({"round": row.get("round"), **{k: row[k] for k in CLOCK_KEYS if k in row}}) + "\n")
        self.file.flush()
        self.timing.flush()

    def summary(self, summary: dict) -> None:
        pass

    def close(self, status: str = "complete") -> None:
        self.file.close()
        self.timing.close()


class WandbSink:
    """One W&B run per run directory; finished in ``close`` before the next job starts.

    ``run_id`` is stable for the run directory and config, so a run resumed from its checkpoint
    continues the same W&B run: online, W&B resumes it (``resume="allow"``) and the rows it already
    holds are not sent again; offline, the earlier attempts' ``offline-run-*-<id>`` folders are
    replaced by one that holds every row (``history``: the rows up to the checkpoint, logged first),
    so ``wandb sync`` uploads one complete run, not a stub and a tail. Online mode without a
    reachable W&B server falls back to offline within ``PROBE_S`` seconds, with one warning line."""

    PROBE_S = 3.0
    INIT_TIMEOUT_S = 30  # how long an online start may take (a server that answers the probe, then hangs)

    def __init__(self, cfg: dict, run_dir: Path, name: str, group: str, tags: list[str],
                 mode: str, project: str, entity: str | None, run_id: str, history: list[dict] = ()):
        import wandb  # local import: wandb is loaded only when this sink is used

        self.wandb, self.first_step = wandb, 0
        if mode == "online":
            url = os.environ.get("WANDB_BASE_URL") or wandb.setup().settings.base_url  # env, else settings files
            problem = _unreachable(url, self.PROBE_S)
            if problem:
                log.warning("W&B: %s; logging offline to %s/wandb (upload later with `wandb sync`)", problem, run_dir)
                mode = "offline"
        if mode == "offline":
            for old in Path(run_dir, "wandb").glob(f"offline-run-*-{run_id}"):  # earlier attempts of this run
                shutil.rmtree(old, ignore_errors=True)
        kwargs = dict(project=project, entity=entity, group=group, name=name, tags=tags, config=cfg,
                      dir=str(run_dir), reinit="finish_previous", id=run_id, resume="allow")
        try:
            self.run = wandb.init(mode=mode, settings=wandb.Settings(silent=True, console="off",
                                                                     init_timeout=self.INIT_TIMEOUT_S),
                                  **kwargs)
        except Exception as err:  # noqa: BLE001  (the server refused or timed out: keep the run going)
            if mode != "online":
                raise
            log.warning("W&B: online start failed (%s); logging offline to %s/wandb (upload later with "
                        "`wandb sync`)", str(err).strip().splitlines()[0][:200] if str(err).strip() else
                        type(err).__name__, run_dir)
            # the failed start still holds this run id in W&B's service process ("run ID ... is in use"):
            # end the service, so that the offline run starts a fresh one with the same id
            wandb.teardown()
            self.run = wandb.init(mode="offline", settings=wandb.Settings(silent=True, console="off"), **kwargs)
            mode = "offline"
        if mode == "online":
            self.first_step = int(getattr(self.run, "step", 0) or 0)  # rows the server already holds
        for row in history:
            self.log(row)

    def log(self, row: dict) -> None:
        row = _clean(row)
        per_class = {f"class_acc/{c}": v for c, v in enumerate(row.get("class_acc") or []) if v is not None}
        row = {k: v for k, v in row.items() if isinstance(v, (int, float)) and v is not None}
        if int(row["round"]) < self.first_step:  # already in the resumed online run
            return
        self.run.log({**row, **per_class}, step=int(row["round"]))

    def summary(self, summary: dict) -> None:
        for key, value in _clean(summary).items():
            if isinstance(value, (int, float, str)) or value is None:
                self.run.summary[key] = value
        for zeta, cost in (summary.get("cost_to_target") or {}).items():
            self.run.summary[f"cost_to_{zeta}"] = cost
        for zeta, cost in (summary.get("cost_to_target_balanced") or {}).items():
            self.run.summary[f"cost_to_{zeta}_balanced"] = cost

    def close(self, status: str = "complete") -> None:
        if status == "interrupted" and hasattr(self.run, "mark_preempting"):
            self.run.mark_preempting()  # W&B shows it preempted, then running again when resumed
        self.run.finish(exit_code=0 if status in ("complete", "diverged") else 1)  # failed -> marked failed


class Sinks:
    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, row: dict) -> None:
        for s in self.sinks:
            s.log(row)

    def summary(self, summary: dict) -> None:
        for s in self.sinks:
            s.summary(summary)

    def close(self, status: str = "complete") -> None:
        for s in self.sinks:
            s.close(status)


def _unreachable(url: str, seconds: float) -> str | None:
    """Why the W&B server at ``url`` does not answer within ``seconds`` (name lookup, connection, and
    an HTTP answer of any status: a server that accepts connections but never answers made
    ``wandb.init`` wait for its own timeout), or None."""
    import ssl
    import urllib.error
    import urllib.request

    host = urlparse(url).hostname
    if not host:
        return f"no server in the W&B base URL {url!r}"
    result: list = []

    class Stay(urllib.request.HTTPRedirectHandler):  # a redirect is an answer: not followed elsewhere
        def redirect_request(self, *args, **kwargs):
            return None

    def ask():
        try:
            urllib.request.build_opener(Stay).open(url, timeout=seconds).close()
            result.append(None)
        except urllib.error.HTTPError:  # an answer, whatever its status
            result.append(None)
        except (OSError, ValueError) as err:  # URLError (refused, no such host), timeouts
            reason = getattr(err, "reason", err)
            if isinstance(reason, ssl.SSLError):  # it answered; W&B's own certificates may differ from urllib's
                result.append(None)
            elif isinstance(reason, TimeoutError):
                result.append(f"no answer from {url} within {seconds:.0f} s")
            else:
                result.append(f"cannot reach {url} ({type(reason).__name__}: {reason})")

    probe = threading.Thread(target=ask, daemon=True)
    probe.start()
    probe.join(seconds + 1)
    return result[0] if result else f"no answer from {url} within {seconds:.0f} s"
