"""``fedlnl-run``: one federated run (or, with ``-m``, a Hydra sweep of runs).

Data flow: compose config → validate → build (or reuse) the federation → instantiate model and
method → loop rounds (sample, local updates, relabels scored against the oracle, aggregate,
evaluate, log, checkpoint) → ``summary.json``. The method never sees the oracle or the test set.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from fedlnl.conf import resolvers  # noqa: F401  (registers ${fidelity:...})
from fedlnl.benchmark import compose, preflight
from fedlnl.benchmark.setting import setting_of
from fedlnl.benchmark.logging import JsonlSink, Sinks, WandbSink, write_json_atomic
from fedlnl.benchmark.metrics import OracleScorer, accuracy_summary, cost_to_target
from fedlnl.benchmark.validate import ConfigError
from fedlnl.datasets.federation import build_federation, federation_stats, load_source
from fedlnl.methods.common import engine
from fedlnl.methods.common.protocol import ALL_CLIENTS, ClientView, FederationInfo, RoundContext

log = logging.getLogger("fedlnl")

#: config keys that do not change a run's numbers (left out of the config hash). ``threads`` is not
#: one of them: the CPU thread count can change float reductions, so a resume never mixes two.
NON_RESULT_KEYS = ("logger", "name", "preset", "checkpoint_every", "skip_complete", "dry_run", "device", "hydra")


def config_hash(cfg: dict) -> str:
    kept = {k: v for k, v in cfg.items() if k not in NON_RESULT_KEYS}
    return hashlib.blake2b(json.dumps(kept, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        count, job = torch.cuda.device_count(), _multirun_job_num()
        if count > 1 and job is not None:
            # parallel sweep jobs (e.g. hydra/launcher=joblib) on a multi-GPU node: one GPU per job,
            # round-robin by Hydra's job number; set_device sends any plain "cuda" tensor there too
            device = torch.device(f"cuda:{job % count}")
            torch.cuda.set_device(device)
            return device
        return torch.device("cuda")  # one visible GPU (e.g. a SLURM task's), or a single run
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r} is invalid: no CUDA device is available (use auto or cpu)")
    return torch.device(name)


def _multirun_job_num() -> int | None:
    """Hydra's job number inside a multirun (``-m``), else None."""
    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    return int(hc.job.num) if hc.mode is not None and hc.mode.name == "MULTIRUN" else None


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

    def __init__(self, cfg: DictConfig, run_dir: Path, method_name: str, group: str, method):
        self.cfg, self.run_dir, self.method_name, self.group = cfg, Path(run_dir), method_name, group
        self.method = method  # built and checked by preflight.check_cell, before any data
        self.resolved = OmegaConf.to_container(cfg, resolve=True)
        self.hash = config_hash(self.resolved)

    # ------------------------------------------------------------------ setup
    def prepare(self) -> None:
        cfg = self.cfg
        if int(cfg.get("threads") or 0) > 0:
            torch.set_num_threads(int(cfg.threads))
        self.device = resolve_device(str(cfg.device))
        try:
            source = load_source(cfg.dataset)
        except preflight.DATA_ERRORS as err:  # missing or broken data: the loader's own sentence
            raise ConfigError(str(err).strip().splitlines()[0]) from err
        preflight.check_data(cfg, num_train=int(source.y_train.shape[0]))
        try:
            self.fed = build_federation(cfg.dataset, cfg.partition, cfg.noise, cfg.fl.num_clients, cfg.seed)
        except preflight.DATA_ERRORS as err:  # partition/noise settings the data cannot satisfy
            raise ConfigError(str(err).strip().splitlines()[0]) from err
        src = self.fed.source
        self.train = engine.TensorData.build(src.x_train, src.mean, src.std, src.augment, self.device)
        self.test = engine.TensorData.build(src.x_test, src.mean, src.std, None, self.device)
        self.test_labels = src.y_test.to(self.device)
        self.labels = self.fed.labels.clone().to(self.device)  # observed labels; relabels land here
        self.client_idx = [torch.tensor(ix, dtype=torch.long, device=self.device)
                           for ix in self.fed.client_indices]
        self.scorer = OracleScorer(self.fed.oracle, self.fed.client_indices, self.labels)
        self.records: dict = {}  # ctx.record(...) diagnostics, written to diagnostics.json
        self.info = FederationInfo(self.fed.num_clients, self.fed.num_classes, self.fed.client_sizes,
                                   tuple(src.x_train.shape[1:]), int(cfg.seed),
                                   self.fed.meta.get("nominal_noise_rate"),
                                   self.fed.meta.get("nominal_noisy_share"))
        with torch.random.fork_rng(devices=[]):  # model init from the run seed, not global state
            torch.manual_seed(int(cfg.seed))
            self.model = instantiate(cfg.model, num_classes=self.info.num_classes,
                                     input_shape=self.info.input_shape).to(self.device)
        preflight.check_model(self.model, self.info.input_shape, model_name(cfg), str(cfg.dataset.name))
        try:
            self.total = compose.total_rounds(self.method, self.info, int(cfg.fl.rounds))
        except ValueError as err:  # a hyperparameter check that needs the federation (e.g. PoC's d >= m)
            raise ConfigError(str(err).splitlines()[0]) from err
        self.effective = compose.effective(self.method, self.resolved["method"], int(cfg.fl.rounds), self.info)
        log.info("effective: %s", json.dumps(self.effective, sort_keys=True))
        log.info("device %s, %d torch threads", self.device, torch.get_num_threads())

    def view(self, k: int) -> ClientView:
        idx = torch.arange(self.labels.numel(), device=self.device) if k == ALL_CLIENTS else self.client_idx[k]
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

    def save_checkpoint(self, state, rnd: int) -> None:
        tmp = self.run_dir / ".checkpoint.pt.tmp"
        torch.save({"config_hash": self.hash, "round": rnd, "state": state, "labels": self.labels,
                    "scorer": (self.scorer.num_relabels, self.scorer.num_correct_relabels, self.scorer.latest,
                               self.scorer.mu_hat, self.scorer.flagged), "records": self.records,
                    "rows": self.rows, "comm": self.comm, "bytes": self.bytes_up,
                    "elapsed": time.time() - self.t0}, tmp)
        tmp.replace(self._ckpt_path())

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
        if ck["config_hash"] != self.hash:
            log.warning("checkpoint in %s is for another config; starting over", self.run_dir)
            return None
        self.labels.copy_(ck["labels"])
        (self.scorer.num_relabels, self.scorer.num_correct_relabels, self.scorer.latest,
         self.scorer.mu_hat, self.scorer.flagged) = ck["scorer"]
        self.records.update(ck["records"])
        self.rows, self.comm, self.bytes_up = ck["rows"], ck["comm"], ck["bytes"]
        self.t0 -= ck["elapsed"]
        log.info("resuming after round %d of %d (%s)", ck["round"] + 1, self.total, path)
        return ck["state"], ck["round"] + 1

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict:
        self.t0 = time.time()
        self.rows, self.comm, self.bytes_up = [], 0, 0
        state, start = None, 0
        resumed = self.load_checkpoint()
        if resumed:
            state, start = resumed
        else:
            state = self.method.init(self.model, self.info, self.context(0))
        sinks = self.open_sinks()
        status = "complete"
        every = int(self.cfg.fl.eval_every)
        ck_every = int(self.cfg.checkpoint_every or 0)
        bar = tqdm(range(start, self.total), desc=f"{self.method_name} s{self.cfg.seed}", unit="rnd",
                   dynamic_ncols=True, disable=None, leave=False)
        try:
            for rnd in bar:
                ctx = self.context(rnd)
                ids = self.method.sample_clients(state, ctx)
                updates = [self.method.client_update(state, self.view(k), ctx) for k in ids]
                self.comm += sum(1 for k in ids if k != ALL_CLIENTS)
                self.bytes_up += sum(engine.payload_bytes(u.weights) + engine.payload_bytes(u.payload)
                                     for u in updates)
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
                if not sys.stderr.isatty() and (rnd + 1) % max(self.total // 10, 1) == 0:
                    log.info("round %d/%d acc=%s", rnd + 1, self.total, self.rows[-1]["acc"] if self.rows else None)
                if ck_every and (rnd + 1) % ck_every == 0 and rnd + 1 < self.total:
                    self.save_checkpoint(state, rnd)
        except BaseException as err:
            reason = (str(err).strip().splitlines() or [""])[0]
            self.finish("failed", sinks, error=f"{type(err).__name__}: {reason}" if reason else type(err).__name__)
            raise
        finally:
            bar.close()
        return self.finish(status, sinks)

    @torch.no_grad()
    def evaluate(self, state, rnd: int, losses: list[float], agg: dict) -> dict:
        model = self.method.eval_model(state)
        ev = engine.evaluate(model, self.test, self.test_labels, int(self.cfg.fl.eval_batch_size),
                             num_classes=self.info.num_classes)
        finite = [x for x in losses if math.isfinite(x)]
        ok = math.isfinite(ev.loss)
        row = {
            "round": rnd + 1, "acc": ev.acc if ok else None, "loss": ev.loss,
            "balanced_acc": ev.balanced_acc if ok else None, "class_acc": ev.class_acc if ok else None,
            "comm_cost": self.comm, "bytes_up": self.bytes_up,
            "train_loss": float(np.mean(finite)) if finite and len(finite) == len(losses) else float("nan"),
            "time_s": time.time() - self.t0,
        }
        row.update({k: v for k, v in agg.items()})
        row.update(self.scorer.latest)
        self.rows.append(row)
        return row

    def open_sinks(self) -> Sinks:
        sinks = [JsonlSink(self.run_dir / "metrics.jsonl")]
        for row in self.rows:  # after a resume: the rows up to the checkpoint, none after it
            sinks[0].log(row)
        lg = self.cfg.logger
        if lg.kind == "wandb":
            s = setting_of(self.resolved)
            tags = [self.method_name, s["dataset"], f"rho={s['rho']}", f"tau={s['tau']}", str(s["partition"])]
            sinks.append(WandbSink(self.resolved, self.run_dir, name=f"{self.method_name}-s{self.cfg.seed}-{self.hash}",
                                   group=self.group, tags=tags, mode=lg.mode, project=lg.project,
                                   entity=lg.get("entity"), run_id=self.wandb_id()))
        return Sinks(sinks)

    def wandb_id(self) -> str:
        """A W&B run id stable for this run directory and config: a resumed run continues it."""
        key = f"{self.run_dir.resolve()}/{self.hash}"
        return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()

    def finish(self, status: str, sinks: Sinks, error: str | None = None) -> dict:
        summary = {
            "status": status, "error": error, "effective": self.effective, "method": self.method_name,
            "family": getattr(self.method, "family", None), "dataset": str(self.cfg.dataset.name),
            "model": model_name(self.cfg),
            "seed": int(self.cfg.seed), "variant": self.cfg.get("variant"), "preset": self.cfg.get("preset"),
            **accuracy_summary(self.rows),
            "comm_cost": self.comm, "cost_to_target": cost_to_target(self.rows, list(self.cfg.targets)),
            "cost_to_target_balanced": cost_to_target(self.rows, list(self.cfg.targets), key="balanced_acc"),
            "bytes_up": self.bytes_up, "rounds_run": self.rows[-1]["round"] if self.rows else 0,
            "total_rounds": self.total, "wall_time_s": time.time() - self.t0,
            "federation_hash": self.fed.hash, "federation": federation_stats(self.fed),
            "detection": dict(self.scorer.latest), "git_commit": git_commit(),
            "setting": setting_of(self.resolved), "config": self.resolved, "config_hash": self.hash,
            "device": str(self.device),
        }
        sinks.summary(summary)
        sinks.close(status)
        diag = {**self.scorer.diagnostics(self.info.num_classes), "records": self.records}
        write_json_atomic(self.run_dir / "diagnostics.json", diag)
        write_json_atomic(self.run_dir / "summary.json", summary)  # last: its presence = finished
        if status == "complete" and self._ckpt_path().exists():
            self._ckpt_path().unlink()
        return summary


def completed(run_dir: Path, cfg_hash: str) -> dict | None:
    """The summary in ``run_dir`` if it is final for this config (a sweep cell to skip): complete, or
    diverged (deterministic: a re-run would diverge again). A failed/interrupted run is re-run."""
    path = Path(run_dir) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    final = summary.get("status") in ("complete", "diverged")
    return summary if final and summary.get("config_hash") == cfg_hash else None


def _free_name(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... : the first name not taken."""
    k, out = 0, path
    while out.exists():
        k += 1
        out = path.with_name(f"{path.name}.{k}")
    return out


class CellLock:
    """``run_dir/.lock`` held while a process trains the cell: two processes on one sweep directory
    never train the same cell or interleave its metrics.jsonl. A lock left by a dead process on this
    host is stale and taken over."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.held = False

    def owner(self) -> tuple[str, int] | None:
        try:
            host, pid = self.path.read_text().split()
            return host, int(pid)
        except (OSError, ValueError):
            return None

    def acquire(self) -> bool:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                if not self._stale():
                    return False
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(f"{socket.gethostname()} {os.getpid()}\n")
            self.held = True
            return True
        return False

    def _stale(self) -> bool:
        owner = self.owner()
        if owner is None:  # being written this instant, or garbage: garbage older than a minute is stale
            try:
                return time.time() - self.path.stat().st_mtime > 60
            except OSError:
                return True
        host, pid = owner
        if host != socket.gethostname():
            return False  # another machine's process: cannot tell, assume alive
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def run(cfg: DictConfig, run_dir: Path, method_name: str, group: str = "single", typed=()) -> dict:
    """One run: check everything that needs no data, skip a complete cell, load data and check what
    needs it, then (holding the cell's lock) train. Nothing is written before the last check."""
    method = preflight.check_cell(cfg, compose.typed_keys(typed))
    runner = Runner(cfg, run_dir, method_name, group, method)
    if cfg.get("skip_complete", True):
        done = completed(run_dir, runner.hash)
        if done:
            log.info("skipping %s: %s summary for this config exists", run_dir, done["status"])
            return done
    runner.prepare()  # data-dependent checks: raises before anything is written
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    lock = CellLock(run_dir)
    if not lock.acquire():
        host, pid = lock.owner() or ("?", -1)
        log.warning("skipping %s: another process (pid %s on %s) is running this cell", run_dir, pid, host)
        return {"status": "running", "best_acc": None}
    try:
        done = completed(run_dir, runner.hash) if cfg.get("skip_complete", True) else None
        if done:  # finished by another process while this one was preparing
            return done
        summary = runner.run()
    finally:
        lock.release()
    log.info("%s seed %s: best acc %.4f, final %.4f, comm cost %d, %.1fs -> %s", method_name, cfg.seed,
             summary["best_acc"] or float("nan"), summary["final_acc"] or float("nan"),
             summary["comm_cost"], summary["wall_time_s"], run_dir)
    return summary


def _remove_if_only_hydra_files(run_dir: Path) -> None:
    """Hydra creates the job directory before the task runs; a rejected config leaves nothing."""
    if run_dir.is_dir() and all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()):
        shutil.rmtree(run_dir, ignore_errors=True)
        for parent in list(run_dir.parents)[:2]:  # results/runs/, results/ when they were made for it
            try:
                parent.rmdir()  # only if empty
            except OSError:
                break


def method_label(hc) -> str:
    """The method's name in summaries: its config choice, ``<method>_<X>`` for a command-line stage 3."""
    method = hc.runtime.choices.method
    stage3 = hc.runtime.choices.get("method@method.stage3")
    if stage3 and not method.endswith(f"_{stage3}"):  # `+method@method.stage3=X` on the command line
        method = f"{method}_{stage3}"
    return method


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    group = Path(hc.sweep.dir).name if hc.mode.name == "MULTIRUN" else "single"
    out = Path(hc.runtime.output_dir)
    try:
        summary = run(cfg, out, method_label(hc), group=f"{cfg.name}/{group}", typed=list(hc.overrides.task))
    except ConfigError as err:
        _remove_if_only_hydra_files(out)
        print(f"fedlnl-run: error: {err}", file=sys.stderr)
        sys.exit(2)
    return summary.get("best_acc")


def presets_help() -> str:
    """One line per paper preset (its YAML's first comment line), for ``fedlnl-run --help``."""
    lines = ["Paper presets (fedlnl-run -m paper=NAME; add debug=tiny for a seconds-scale smoke run,",
             "dry_run=true to list the cells and the cost left):"]
    for path in sorted((preflight.CONF / "paper").glob("*.yaml")):
        about = next((ln[2:].strip() for ln in path.read_text().splitlines()[1:3] if ln.startswith("# ")), "")
        lines.append(f"  {path.stem:<14} {about[:100]}")
    return "\n".join(lines) + "\n"


def main() -> None:
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(presets_help())
    problem = preflight.check_argv(sys.argv[1:])  # names, syntax, composition: before Hydra starts
    if problem:
        print(f"fedlnl-run: error: {problem}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
