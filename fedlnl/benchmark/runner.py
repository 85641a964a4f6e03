"""The runner: one federated run of a composed config, from its checks to ``summary.json``.

Data flow: validate → build (or reuse) the federation → instantiate model and method → loop rounds
(sample, local updates, relabels scored against the oracle, aggregate, evaluate, log, checkpoint) →
``summary.json``. The method never sees the oracle, the clients' validation samples or the test set
(``heldout.py``: model selection and per-client accuracy). ``run`` holds the cell's lock
while it trains; ``fedlnl-run`` (``run.py``) is the command around it.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.optim.optimizer import register_optimizer_step_post_hook
from tqdm import tqdm

from fedlnl.conf import resolvers  # noqa: F401  (registers ${fidelity:...})
from fedlnl.benchmark import compose, device, integrity, preflight
from fedlnl.benchmark.heldout import HeldOut
from fedlnl.benchmark.lock import CellLock, LockError
from fedlnl.benchmark.metrics import accuracy_summary, cost_to_target
from fedlnl.benchmark.oracle import OracleScorer
from fedlnl.benchmark.rundir import (check_identity, check_run_dir, completed, config_hash, read_summary,
                                     shared_prefix)
from fedlnl.benchmark.selection import SelectionSettings, selection_summary
from fedlnl.benchmark.setting import setting_of
from fedlnl.benchmark.sinks import JsonlSink, Sinks, WandbSink, json_safe, write_json_atomic
from fedlnl.benchmark.stop import StopRequest, refuse_after_signal
from fedlnl.benchmark.validate import ConfigError
from fedlnl.datasets.federation import federation_stats
from fedlnl.compute import compiled, evaluation, placement
from fedlnl.compute.data import TensorData
from fedlnl.methods.common import engine
from fedlnl.models.layers import random_source
from fedlnl.methods.common.protocol import ALL_CLIENTS, ClientView, RoundContext

log = logging.getLogger("fedlnl")

class Heartbeat:
    """Where the run's output is not a terminal (a redirected or SLURM log) a run logs its start and its
    end; ``due()`` adds one round line per ``every`` seconds in between, so a log of a run of hours
    shows it is alive without a line per round or per tenth of the rounds (issue 35)."""

    EVERY_S = 600.0

    def __init__(self, every: float = EVERY_S, clock=time.monotonic):
        self.every, self.clock = every, clock
        self.last = clock()

    def due(self) -> bool:
        now = self.clock()
        if now - self.last < self.every:
            return False
        self.last = now
        return True


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def model_name(cfg: DictConfig) -> str:
    """The model's config-group choice under Hydra, else the class named by its ``_target_``."""
    if HydraConfig.initialized():
        return HydraConfig.get().runtime.choices.get("model")
    return str(cfg.model._target_).rsplit(".", 1)[-1].lower()


class Runner:
    """Owns the loop; a method only sees client views and the round context."""

    def __init__(self, cfg: DictConfig, run_dir: Path, method_name: str, group: str, method, tuned: dict | None = None):
        self.cfg, self.run_dir, self.method_name, self.group = cfg, Path(run_dir), method_name, group
        self.tuned = tuned  # the values tuned= applied, and where they came from (benchmark/tuning.apply)
        self.method = method  # built and checked by preflight.check_cell, before any data
        self.resolved = OmegaConf.to_container(cfg, resolve=True)
        self.hash = config_hash(self.resolved)

    # ------------------------------------------------------------------ setup
    def prepare(self) -> None:
        cfg = self.cfg
        self.device = device.place(cfg)
        self.identity = device.identity(self.device, str(cfg.get("determinism", "strict")))
        # the torch.compile mode of the local step (None = eager): what ran, beside the config's key
        self.compile_mode = compiled.mode(bool(cfg.get("compile", False)), self.device)
        problem = compiled.check(self.device) if self.compile_mode else None
        if problem:
            raise ConfigError(problem)
        cell = preflight.build_cell(cfg, self.method, model_name(cfg), self.device)  # raises ConfigError
        self.fed, self.info, self.model, self.total = cell.fed, cell.info, cell.model, cell.total
        src = self.fed.source
        where = placement.choose(str(cfg.get("data_placement", "auto")), src.x_train.numel() * src.x_train.element_size(),
                                 self.device)
        self.train = TensorData.build(src.x_train, src.mean, src.std, src.augment, self.device, where)
        self.test = TensorData.build(src.x_test, src.mean, src.std, None, self.device)
        self.test_labels = src.y_test.to(self.device)
        self.labels = self.fed.labels.clone().to(self.device)  # observed labels; relabels land here
        self.client_idx = [torch.tensor(ix, dtype=torch.long, device=self.device)
                           for ix in self.fed.client_indices]
        self.heldout = HeldOut(self.fed, SelectionSettings.of(cfg.get("selection")), self.device)
        # the centralised references' pooled view: every training sample, none held out for validation
        self.pool = torch.tensor(np.sort(np.concatenate(self.fed.client_indices)), dtype=torch.long,
                                 device=self.device) if self.heldout.validated else None
        self.scorer = OracleScorer(self.fed.oracle, self.fed.client_indices, self.labels,
                                   held_out=self.heldout.val_idx.cpu())
        self.records: dict = {}  # ctx.record(...) diagnostics, written to diagnostics.json
        self.prefix = self._prefix()
        self.prefix_from = None  # the shared prefix this run started from, for summary.json
        self.effective = compose.effective(self.method, self.resolved["method"], int(cfg.fl.rounds), self.info)
        log.info("effective: %s", json.dumps(self.effective, sort_keys=True))
        log.info("device %s, %d torch threads", self.device, torch.get_num_threads())
        log.info("GPU: %s, determinism %s, training images on the %s, local step %s", self.identity["gpu"] or "none",
                 self.identity["determinism"], where, f"compiled ({self.compile_mode})" if self.compile_mode else "eager")

    def view(self, k: int) -> ClientView:
        if k == ALL_CLIENTS:
            idx = self.pool if self.pool is not None else torch.arange(self.labels.numel(), device=self.device)
        else:
            idx = self.client_idx[k]
        return ClientView(k, idx, self.labels[idx].clone(), self.train)

    def context(self, rnd: int) -> RoundContext:
        return RoundContext(
            round=rnd, total_rounds=self.total, seed=int(self.cfg.seed), device=self.device,
            num_clients=self.info.num_clients, client_sizes=self.info.client_sizes,
            data=self.train, views=self.view, relabel=self.scorer.relabel,
            report_clients=self.scorer.clients, report_samples=self.scorer.samples,
            record=self.records.__setitem__,
        )

    # ------------------------------------------------------------------ checkpoints
    def _ckpt_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    def save_checkpoint(self, state, rnd: int, path: Path | None = None, **extra) -> None:
        """Write ``checkpoint.pt`` (or ``path``) atomically; a failed write (a full disk) leaves the
        last one and no temporary file, and raises OSError naming the file and the free space."""
        path = path or self._ckpt_path()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # several processes may write one prefix
        try:
            torch.save({"config_hash": self.hash, "config": self.resolved, "identity": self.identity, "round": rnd,
                        "state": state, "labels": self.labels,
                        "scorer": (self.scorer.num_relabels, self.scorer.num_correct_relabels, self.scorer.latest,
                                   self.scorer.mu_hat, self.scorer.flagged), "records": self.records,
                        "rows": self.rows, "comm": self.comm, "bytes": self.bytes_up, "steps": self.steps,
                        "selection": self.heldout.reported.state(),
                        "elapsed": time.time() - self.t0, "cpu": time.process_time() - self.c0, **extra}, tmp)
            tmp.replace(path)
        except (OSError, RuntimeError) as err:  # torch reports a full disk as "file write failed"
            tmp.unlink(missing_ok=True)
            free = shutil.disk_usage(path.parent).free
            raise OSError(errno.ENOSPC if free < 1 << 20 else errno.EIO,
                          f"could not write {path} ({preflight.first_line(err)}); "
                          f"{free / 1e6:,.1f} MB free on its file system") from err

    def _restore(self, ck: dict):
        """The runner's side of a saved round (labels, scores, rows, counters); the method's state."""
        self.labels.copy_(ck["labels"])
        (self.scorer.num_relabels, self.scorer.num_correct_relabels, self.scorer.latest,
         self.scorer.mu_hat, self.scorer.flagged) = ck["scorer"]
        self.records.update(ck["records"])
        self.rows, self.comm, self.bytes_up, self.steps = ck["rows"], ck["comm"], ck["bytes"], ck.get("steps", 0)
        self.heldout.reported.load(ck.get("selection"))  # None: saved before per-client figures were kept
        self.t0 -= ck["elapsed"]
        self.c0 -= ck.get("cpu", 0.0)
        return ck["state"], ck["round"] + 1

    def load_checkpoint(self):
        path = self._ckpt_path()
        if not path.exists():
            return None
        try:
            ck = torch.load(path, map_location=self.device, weights_only=False)
            if not isinstance(ck, dict) or "config_hash" not in ck:
                raise ValueError("not a fedlnl checkpoint")
        except Exception as err:  # truncated, empty or foreign: keep it for inspection, start over
            aside = _free_name(path.with_name(path.name + ".corrupt"))
            path.replace(aside)
            log.warning("checkpoint %s is unreadable (%s); moved to %s, starting over",
                        path, str(err).splitlines()[0] if str(err) else type(err).__name__, aside.name)
            return None
        if ck["config_hash"] != self.hash:  # (check_run_dir refuses such a directory: a race) kept, never overwritten
            aside = _free_name(path.with_name(path.name + ".other-config"))
            path.replace(aside)
            log.warning("checkpoint in %s is for another config; moved to %s, starting over", self.run_dir, aside.name)
            return None
        log.info("resuming after round %d of %d (%s)", ck["round"] + 1, self.total, path)
        return self._restore(ck)

    # ------------------------------------------------------------------ shared prefixes
    def _prefix(self) -> tuple[int, str, Path] | None:
        """(rounds, key, file) of this run's shared prefix (``rundir.shared_prefix``), or None."""
        if not self.cfg.get("reuse_prefix", True):
            return None
        return shared_prefix(self.method, self.info, self.resolved, self.fed.hash, self.identity, self.run_dir)

    def load_prefix(self):
        """The state after the shared prefix, saved by another run of the same key; None when there
        is none (or it is unreadable: this run computes the prefix and saves it again)."""
        if self.prefix is None or not self.prefix[2].is_file():
            return None
        rounds, key, path = self.prefix
        try:
            ck = torch.load(path, map_location=self.device, weights_only=False)
            if not isinstance(ck, dict) or ck.get("prefix_key") != key:
                raise ValueError("not the state of this prefix")
        except Exception as err:  # noqa: BLE001  (a foreign or truncated file: written whole by os.replace, so never
            # one being written; removed, so that this run saves it again)
            log.warning("shared prefix %s is unreadable (%s); computing rounds 1-%d", path, preflight.first_line(err), rounds)
            path.unlink(missing_ok=True)
            return None
        self.prefix_from = {"key": key, "rounds": rounds, "saved_by": ck.get("saved_by"), "elapsed_s": ck["elapsed"],
                            "cpu_time_s": ck.get("cpu")}
        log.info("starting after round %d of %d from the shared prefix %s, saved by %s (same federation, config of "
                 "rounds 1-%d, code and device; reuse_prefix=false computes them)", rounds, self.total, path,
                 ck.get("saved_by"), rounds)
        return self._restore(ck)

    def save_prefix(self, state, rnd: int) -> None:
        """Save the state after the prefix's last round for the runs that share it; a failed write
        only costs them the time (logged), never this run."""
        rounds, key, path = self.prefix
        if rnd + 1 != rounds or path.is_file():
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.save_checkpoint(state, rnd, path=path, prefix_key=key, saved_by=self.run_dir.name)
        except OSError as err:
            log.warning("could not save the shared prefix (%s); runs that share it compute it", preflight.first_line(err))

    # ------------------------------------------------------------------ the loop
    def run(self, stop: StopRequest | None = None) -> dict:
        """Train to the end of the schedule, or, once ``stop`` has caught a signal, to the end of
        the round in progress: checkpoint, ``status: interrupted``."""
        self.t0, self.c0 = time.time(), time.process_time()
        self.rows, self.comm, self.bytes_up, self.steps = [], 0, 0, 0
        self.stopped = None
        state, start = None, 0
        resumed = self.load_checkpoint() or self.load_prefix()
        if resumed:
            state, start = resumed
        else:
            with random_source(self.context(0).generator("dropout", "server")):
                state = self.method.init(self.model, self.info, self.context(0))
        sinks = self.open_sinks()
        status = "complete"
        every = int(self.cfg.fl.eval_every)
        ck_every, ck_seconds = int(self.cfg.checkpoint_every or 0), 60.0 * float(self.cfg.get("checkpoint_minutes") or 0)
        last_ck = time.monotonic()
        counter = register_optimizer_step_post_hook(self._count_step)
        bar = tqdm(range(start, self.total), desc=f"{self.method_name} s{self.cfg.seed}", unit="rnd",
                   dynamic_ncols=True, disable=None, leave=False)  # None: a bar on a terminal only
        beat = Heartbeat()
        # the compiled step reaches every local-training loop with the training data it reads (after
        # ``init``: an optimiser a method builds there is eager, as it always was)
        self.train.compiled = compiled.start(bool(self.cfg.get("compile", False)), self.device)
        try:
            for rnd in bar:
                ctx = self.context(rnd)
                ids = self.method.sample_clients(state, ctx)
                updates = []
                for k in ids:  # dropout masks from each client's own stream (models/layers.py)
                    with random_source(ctx.generator("dropout", k)):
                        updates.append(self.method.client_update(state, self.view(k), ctx))
                self.comm += sum(1 for k in ids if k != ALL_CLIENTS)
                self.bytes_up += sum(engine.payload_bytes(u.weights) + engine.payload_bytes(u.payload)
                                     for u in updates)
                with random_source(ctx.generator("dropout", "server")):
                    state, agg = self.method.aggregate(state, updates, ctx)
                losses = [u.train_loss for u in updates]
                diverged = any(not math.isfinite(x) for x in losses)
                if diverged or (rnd + 1) % every == 0 or rnd + 1 == self.total:
                    row = self.evaluate(state, rnd, losses, agg)
                    sinks.log(row)
                    bar.set_postfix(acc=f"{row['acc']:.3f}" if row["acc"] is not None else "nan")
                    if diverged or row["acc"] is None or row["loss"] is None or not math.isfinite(row["loss"]):
                        status = "diverged"
                        log.warning("run diverged at round %d (non-finite loss)", rnd + 1)
                        break
                if bar.disable and beat.due():  # a log, not a terminal: no per-round lines, a sign of life
                    log.info("%s s%d: round %d/%d acc=%s", self.method_name, self.cfg.seed, rnd + 1, self.total,
                             self.rows[-1]["acc"] if self.rows else None)
                if rnd + 1 == self.total:
                    break
                if self.prefix is not None:
                    self.save_prefix(state, rnd)
                stopping = stop is not None and stop.signum is not None
                due = (ck_every and (rnd + 1) % ck_every == 0) or (ck_seconds and time.monotonic() - last_ck >= ck_seconds)
                if due or stopping:
                    self.save_checkpoint(state, rnd)
                    last_ck = time.monotonic()
                if stopping:
                    status, self.stopped = "interrupted", (stop.name, rnd + 1)
                    log.warning("stopped by %s after round %d of %d; checkpoint saved in %s: run the same "
                                "command again to resume", stop.name, rnd + 1, self.total, self._ckpt_path())
                    break
        except BaseException as err:
            reason = (str(err).strip().splitlines() or [""])[0]
            try:
                self.finish("failed", sinks, error=f"{type(err).__name__}: {reason}" if reason else type(err).__name__)
            except OSError as also:  # a full disk takes the summary too: the first error is the one to see
                log.error("could not record the failure in %s: %s", self.run_dir, also)
            raise
        finally:
            bar.close()
            counter.remove()
            self.train.compiled = None
        return self.finish(status, sinks)

    def _count_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1

    @torch.no_grad()
    def evaluate(self, state, rnd: int, losses: list[float], agg: dict) -> dict:
        model = self.method.eval_model(state)
        batch = int(self.cfg.fl.eval_batch_size)
        ev = evaluation.evaluate(model, self.test, self.test_labels, batch, num_classes=self.info.num_classes,
                             groups=self.heldout.tests)
        val = self.heldout.val_acc(model, self.train, batch)  # the clients' counts: sent, so counted
        self.bytes_up += self.heldout.upload()
        finite = [x for x in losses if math.isfinite(x)]
        ok = math.isfinite(ev.loss)
        row = {
            "round": rnd + 1, "acc": ev.acc if ok else None, "loss": ev.loss,
            "balanced_acc": ev.balanced_acc if ok else None, "class_acc": ev.class_acc if ok else None,
            "comm_cost": self.comm, "bytes_up": self.bytes_up,
            "train_loss": float(np.mean(finite)) if finite and len(finite) == len(losses) else float("nan"),
            "time_s": time.time() - self.t0,
        }
        row.update(self.heldout.observe(row, ev.group_correct, val, stage=agg.get("stage")))
        row.update({k: v for k, v in agg.items()})
        row.update(self.scorer.latest)
        self.rows.append(row)
        return row

    def open_sinks(self) -> Sinks:
        """W&B first (it may take seconds or fall back to offline), then metrics.jsonl with the rows
        up to the checkpoint after a resume."""
        sinks = []
        lg = self.cfg.logger
        if lg.kind == "wandb":
            s = setting_of(self.resolved)
            tags = [self.method_name, s["dataset"], f"rho={s['rho']}", f"tau={s['tau']}", str(s["partition"])]
            sinks.append(WandbSink(self.resolved, self.run_dir, name=f"{self.method_name}-s{self.cfg.seed}-{self.hash}",
                                   group=self.group, tags=tags, mode=lg.mode, project=lg.project,
                                   entity=lg.get("entity"), run_id=self.wandb_id(), history=self.rows))
        jsonl = JsonlSink(self.run_dir / "metrics.jsonl")
        for row in self.rows:  # after a resume: the rows up to the checkpoint, none after it
            jsonl.log(row)
        return Sinks([jsonl, *sinks])

    def wandb_id(self) -> str:
        """A W&B run id stable for this run directory and config: a resumed run continues it."""
        key = f"{self.run_dir.resolve()}/{self.hash}"
        return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()

    def finish(self, status: str, sinks: Sinks, error: str | None = None) -> dict:
        if status == "interrupted":
            name, done = self.stopped
            error = f"stopped by {name} after round {done} of {self.total}; resumes from checkpoint.pt when run again"
        summary = {
            "status": status, "error": error, "effective": self.effective, "method": self.method_name,
            "family": self.method.family, "dataset": str(self.cfg.dataset.name),
            "model": model_name(self.cfg),
            "seed": int(self.cfg.seed), "variant": self.cfg.get("variant"), "preset": self.cfg.get("preset"),
            **accuracy_summary(self.rows), **selection_summary(self.rows, self.heldout.validated, self.heldout.settings.stage),
            **self.heldout.summary(),
            "comm_cost": self.comm, "cost_to_target": cost_to_target(self.rows, list(self.cfg.targets)),
            "cost_to_target_balanced": cost_to_target(self.rows, list(self.cfg.targets), key="balanced_acc"),
            "bytes_up": self.bytes_up, "local_steps": self.steps, "rounds_run": self.rows[-1]["round"] if self.rows else 0,
            "total_rounds": self.total, "wall_time_s": time.time() - self.t0,
            # this process's CPU seconds (all its threads) in the loop, resumed and shared rounds included:
            # the compute, unlike the wall clock, does not count pauses or other processes' time
            "cpu_time_s": time.process_time() - self.c0,
            "federation_hash": self.fed.hash, "federation": federation_stats(self.fed),
            "detection": dict(self.scorer.latest), "git_commit": git_commit(),
            "setting": setting_of(self.resolved), "config": self.resolved, "config_hash": self.hash,
            "device": str(self.device), "identity": self.identity, "compile": self.compile_mode,
            "prefix": self.prefix_from, "tuned": self.tuned,
        }
        sinks.summary(summary)
        sinks.close(status)
        # metrics.jsonl as written, and a seal of the summary: a sweep's skip and the report check both (integrity.py)
        try:
            summary[integrity.DIGEST_KEY] = integrity.digest(self.run_dir / "metrics.jsonl")
        except OSError:  # unreadable: no digest, no seal
            summary[integrity.DIGEST_KEY] = None
        else:
            summary[integrity.SEAL_KEY] = integrity.seal(json_safe(summary))
        diag = {**self.scorer.diagnostics(self.info.num_classes), "records": self.records}
        write_json_atomic(self.run_dir / "diagnostics.json", diag)
        write_json_atomic(self.run_dir / "summary.json", summary)  # last: its presence = finished
        if status == "complete" and self._ckpt_path().exists():
            self._ckpt_path().unlink()
        return summary


def set_aside_unverified(run_dir: Path, cfg_hash: str) -> None:
    """A final summary of this config that its metrics.jsonl does not bear out (``integrity``) is
    not skipped: its files are renamed ``<name>.unverified`` (never deleted) and the cell runs again."""
    summary = read_summary(run_dir)
    if not summary or summary.get("config_hash") != cfg_hash or summary.get("status") not in ("complete", "diverged"):
        return
    why = integrity.problem(run_dir, summary)
    if why is None:
        return
    moved = []
    for name in ("summary.json", "metrics.jsonl", "timing.jsonl", "diagnostics.json"):
        path = Path(run_dir) / name
        if path.exists():
            aside = _free_name(path.with_name(name + ".unverified"))
            path.replace(aside)
            moved.append(aside.name)
    log.warning("%s: the %s summary is not borne out by its metrics (%s): running the cell again; the old files "
                "are kept as %s", run_dir, summary["status"], why, ", ".join(moved))


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... : the first name not taken."""
    k, out = 0, path
    while out.exists():
        k += 1
        out = path.with_name(f"{path.name}.{k}")
    return out


#: what ``run`` returns for a cell a stopped local sweep does not start (nothing written)
NOT_STARTED = {"status": "not started", "best_acc": None}


def run(cfg: DictConfig, run_dir: Path, method_name: str, group: str = "single", typed=(),
        tuned: dict | None = None) -> dict:
    """One run: check everything that needs no data, skip a complete cell, load data and check what
    needs it, then (holding the cell's lock) train. Nothing is written before the last check."""
    if refuse_after_signal():  # a local sweep asked to stop: this cell does not start
        return dict(NOT_STARTED)
    method = preflight.check_cell(cfg, compose.typed_keys(typed))
    runner = Runner(cfg, run_dir, method_name, group, method, tuned)
    check_run_dir(run_dir, runner.hash, runner.resolved)  # another config's run, a .lock that is no file
    # this config's run recorded on another device kind or determinism mode: never continued or skipped
    check_identity(run_dir, runner.hash, device.run_identity(cfg))
    if cfg.get("skip_complete", True):
        done = completed(run_dir, runner.hash)
        if done:
            log.info("skipping %s: %s summary for this config exists", run_dir, done["status"])
            return done
    runner.prepare()  # data-dependent checks: raises before anything is written
    if refuse_after_signal():  # asked to stop while the data loaded
        return dict(NOT_STARTED)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    lock = CellLock(run_dir, runner.hash)
    try:
        acquired = lock.acquire()
    except LockError as err:
        raise ConfigError(str(err)) from err
    if not acquired:
        log.warning("skipping %s: another process (%s) is running this cell", run_dir, lock.describe())
        return {"status": "running", "best_acc": None}
    with StopRequest() as stop:
        try:
            done = completed(run_dir, runner.hash) if cfg.get("skip_complete", True) else None
            if done:  # finished by another process while this one was preparing
                return done
            set_aside_unverified(run_dir, runner.hash)
            summary = runner.run(stop)
        finally:
            lock.release()
        if stop.signum is not None and summary.get("status") == "interrupted":  # saved and unlocked: hand it on
            stop.exit()  # returns in a local sweep: its launcher stops and says so
            return summary
        if stop.signum is not None:
            stop.completed()
    log.info("%s seed %s: best acc %.4f, final %.4f, comm cost %d, %.1fs -> %s", method_name, cfg.seed,
             summary["best_acc"] or float("nan"), summary["final_acc"] or float("nan"),
             summary["comm_cost"], summary["wall_time_s"], run_dir)
    return summary
