"""Hydra's basic sweeper, validating the whole sweep before the first cell runs.

Every cell of ``fedlnl-run -m ...`` gets the checks a single run makes before training, with the
same code: its config (``preflight.check_cell``), its directory (``rundir.check_run_dir``: a run of
another config there, a ``.lock`` that is no file), the thread count on this machine, and what needs
the data and the model (``preflight.build_cell``: federation sizes, class coverage, noise inputs,
the model's constructor and offline weights, the model at the dataset's image size, the method's
schedule on the federation). If any cell is invalid, the sweep stops before anything runs or is
written, printing one line per invalid cell (its overrides and the reason) and exiting with 2.
Cells differing only in ``seed`` are composed once; datasets, federations and models are built once
per distinct setting.

``dry_run=true`` plans the sweep instead of running it (``fedlnl.benchmark.plan``): every cell with
its directory, whether it is already complete, its rounds, client participations, local steps and
uploaded bytes (exact, or an upper bound marked ``≤`` where training decides), and an estimate of
the time left from the seconds per local step its method took in the complete cells of this sweep
(the rounds of a shared prefix, ``rundir.shared_prefix``, counted once).

After the cells ran, a cell that another process is training (its lock is alive) is named, so a
sweep that leaves cells to someone else says so.

With a launcher that runs the cells on this machine (basic: in this process; joblib: in its pool
workers), ``local_launch`` makes a stop signal (Ctrl-C, ``kill``) stop the sweep cleanly: each
running cell saves its round (``fedlnl.benchmark.stop``), the signal is passed on to the workers, no
further cell starts, and the sweep names what was saved and exits with 128 + the signal. A cell
that another process is training, or that a stopped sweep does not start, is passed over before
Hydra writes anything into its directory (``guarded_run_job``).
"""
from __future__ import annotations

import contextlib
import copy
import multiprocessing
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra._internal.config_loader_impl import get_overrides_dirname
from omegaconf import OmegaConf, open_dict

from fedlnl.benchmark import compose, device, plan, preflight, stop, tuning
from fedlnl.benchmark.lock import CellLock
from fedlnl.benchmark.rundir import (check_identity, check_run_dir, check_writable, completed, config_hash,
                                     read_summary, shared_prefix)
from fedlnl.benchmark.validate import ConfigError


@dataclass
class Cell:
    overrides: list
    problem: str | None = None
    run_dir: Path | None = None
    hash: str | None = None
    method_name: str = "?"
    built: tuple | None = None  # (method, FederationInfo, model, total rounds, seed, eval_every, reporters): the plan
    done: dict | None = None  # its final summary, when complete
    no_data: str | None = None  # why its data cannot be loaded here (a plan or a SLURM sweep goes on)
    prefix: tuple | None = None  # (rounds, key, file) of its shared prefix (rundir.shared_prefix), on this machine


class ValidatingSweeper(BasicSweeper):  # registered as hydra_plugins.fedlnl_sweeper.ValidatingSweeper
    def sweep(self, arguments):
        params = self._parse_config()
        params.extend(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        self.overrides = self.split_arguments(parser.parse_overrides(params), self.max_batch_size)
        as_run = getattr(self.launcher, "cell_overrides", list)  # e.g. SLURM adds threads=<cpus_per_task>
        jobs = [as_run(list(job)) for batch in self.overrides for job in batch]
        if not jobs:  # e.g. seed=range(0): Hydra would launch nothing and exit 0
            print(f"fedlnl-run: error: the sweep has no cells ({empty_sweep_reason(arguments)}): nothing to run",
                  file=sys.stderr)
            sys.exit(2)
        cells = self.check_cells(jobs)
        problems = [c for c in cells if c.problem]
        if problems:
            for c in problems:
                print(f"fedlnl-run: error: cell [{' '.join(c.overrides)}]: {c.problem}", file=sys.stderr)
            print(f"fedlnl-run: error: {len(problems)} of {len(cells)} cells are invalid; nothing was run",
                  file=sys.stderr)
            sys.exit(2)

        if self.config.get("dry_run"):
            try:
                print_plan(cells)
            except ConfigError as err:  # a method the planner cannot walk (no plan hook)
                print(f"fedlnl-run: error: {err}", file=sys.stderr)
                sys.exit(2)
            return []
        sweep_dir = Path(self.config.hydra.sweep.dir)
        try:
            check_writable(sweep_dir, "hydra.sweep.dir")
        except ConfigError as err:
            print(f"fedlnl-run: error: {err}", file=sys.stderr)
            sys.exit(2)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns, start, began = [], 0, time.time()
        with local_launch(self.launcher) as local:
            try:
                for batch in self.overrides:
                    if local and stop.received is not None:
                        break  # stopped between two batches: no further cell starts
                    results = self.launcher.launch(batch, initial_job_idx=start)
                    for r in results:
                        _ = r.return_value  # re-raises a job's exception
                    start += len(batch)
                    returns.append(results)
            except (Exception, SystemExit) as err:  # a cell's error, or a worker the signal ended before its cell
                if not local or stop.received is None:
                    raise
                print(f"fedlnl-run: warning: {type(err).__name__}: {preflight.first_line(err)[:300]}", file=sys.stderr)
        self.batch_index = len(self.overrides)
        if local:
            report_stop(cells, [r for batch in returns for r in batch], began)  # exits when the sweep was stopped
        report_elsewhere(cells)
        return returns

    # ------------------------------------------------------------------ validation
    def check_cells(self, cells: list[list[str]]) -> list[Cell]:
        tic, composed, models = time.perf_counter(), {}, {}
        remote = "slurm" in str(self.config.hydra.launcher.get("_target_", "")).lower()
        out = []
        for overrides in cells:
            seed = next((o.split("=", 1)[1] for o in overrides if o.startswith("seed=")), None)
            if seed is not None and not preflight.valid_seed(seed):
                out.append(Cell(overrides, f"seed={seed} is invalid: allowed {preflight.SEED_RANGE}"))
                continue
            seedless = tuple(o for o in overrides if not o.startswith("seed="))
            if seedless not in composed:
                composed[seedless] = self.compose(list(overrides))
            base = composed[seedless]
            if isinstance(base, str):
                out.append(Cell(overrides, base))
                continue
            try:
                out.append(self.check_cell(base, overrides, models, remote or bool(self.config.get("dry_run"))))
            except ConfigError as err:
                out.append(Cell(overrides, str(err)))
            except Exception as err:  # noqa: BLE001  (a cell that cannot be built: its reason, not a traceback)
                out.append(Cell(overrides, preflight.first_line(err)[:300]))
        print(f"[fedlnl] validated {len(cells)} cells ({len(composed)} distinct configs) with their data and "
              f"models in {time.perf_counter() - tic:.1f}s", file=sys.stderr)
        missing = sorted({c.no_data for c in out if c.no_data})
        if missing and remote and not self.config.get("dry_run"):
            for reason in missing:
                print(f"fedlnl-run: warning: the data cannot be loaded on this machine ({reason}): the cells "
                      "using it are checked with their data in their tasks", file=sys.stderr)
        return out

    def compose(self, overrides: list[str]):
        """(config with hydra, method, typed keys) of a cell, or its problem as one line."""
        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            typed = compose.typed_keys(OmegaConf.to_container(cfg.hydra.overrides.task))
            typed.update(tuning.apply(cfg, _method_label(cfg), typed)[1])  # tuned=: as if typed
            job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            method = preflight.check_cell(job, typed)
        except ConfigError as err:
            return str(err)
        except Exception as err:  # composition errors of this cell
            return preflight.first_line(err)[:300]
        return cfg, method, typed

    def check_cell(self, base, overrides: list[str], models: dict, elsewhere: bool) -> Cell:
        """A cell's checks; ``elsewhere``: a plan, or a sweep whose tasks run on other machines (the
        data may be there only: a dataset that cannot be loaded here is noted, not refused)."""
        cfg, method, _typed = base
        seed = next((o.split("=", 1)[1] for o in overrides if o.startswith("seed=")), None)
        if seed is not None and int(seed) != int(cfg.seed):  # a cell of the same config with another seed
            cfg = copy.deepcopy(cfg)
            dirname = cfg.hydra.job.config.override_dirname
            with open_dict(cfg):
                cfg.seed = int(seed)
                cfg.hydra.job.override_dirname = get_overrides_dirname(
                    overrides=OverridesParser.create().parse_overrides(overrides), kv_sep=dirname.kv_sep, item_sep=dirname.item_sep,
                    exclude_keys=list(dirname.exclude_keys))
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        resolved = OmegaConf.to_container(job, resolve=True)
        cell = Cell(overrides, run_dir=Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir),
                    hash=config_hash(resolved), method_name=_method_label(cfg))
        check_run_dir(cell.run_dir, cell.hash, resolved, key="hydra.sweep.dir")
        remote = "slurm" in str(self.config.hydra.launcher.get("_target_", "")).lower()
        identity = None if remote else device.run_identity(job)
        if not remote:  # a SLURM task runs on another machine: it clamps threads to its allocation
            device.check_threads(job)
            # and may have another device: its task compares the identity (runner.run)
            check_identity(cell.run_dir, cell.hash, identity)
        cell.done = completed(cell.run_dir, cell.hash) if job.get("skip_complete", True) else None
        model_label = str(cfg.hydra.runtime.choices.get("model", "model"))
        try:
            built = preflight.build_cell(job, method, model_label, models=models)
        except preflight.DataUnavailable as err:
            if not elsewhere:
                raise
            cell.no_data = str(err)
            return cell
        cell.built = (method, built.info, built.model, built.total, int(job.seed), *built.evaluations(job))
        if identity is not None and job.get("reuse_prefix", True):
            cell.prefix = shared_prefix(method, built.info, resolved, built.fed.hash, identity, cell.run_dir)
        return cell


def _method_label(cfg) -> str:
    from fedlnl.benchmark.run import method_label

    return method_label(cfg.hydra)


# ---------------------------------------------------------------------------------------- the plan
def print_plan(cells: list[Cell]) -> None:
    """Every cell with its cost, which are complete, the totals and the time left."""
    rows, speed, bounds = [], {}, {}
    for c in cells:
        if c.no_data:
            rows.append((c, None))
            continue
        p = plan.plan_run(*c.built)
        for reason in p.bounds:
            bounds.setdefault(c.method_name, reason)
        done = c.done
        if done and done.get("local_steps"):
            speed.setdefault(c.method_name, []).append(done["wall_time_s"] / done["local_steps"])
        rows.append((c, p))
    names, root = plan.cell_names([c.run_dir for c, _ in rows])
    width = max([len("cell"), *map(len, names)])
    if root is not None:
        print(f"cells under {root}:")
    print(f"{'cell':<{width}} {'method':<18} {'rounds':>7} {'participations':>15} {'local steps':>13} "
          f"{'uploaded MB':>12}  status")
    for name, (c, p) in zip(names, rows):
        status = "complete" if c.done else "to run"
        if p is None:
            print(f"{name:<{width}} {c.method_name:<18} {'-':>7} {'-':>15} {'-':>13} {'-':>12}  "
                  f"{status}, no plan: data not available here")
            continue
        mb = f"{'' if p.exact['bytes_up'] else '≤'}{p.bytes_up / 1e6:,.1f}"
        print(f"{name:<{width}} {c.method_name:<18} {p.rounds:>7,} {p.figure('participations'):>15} "
              f"{p.figure('local_steps'):>13} {mb:>12}  {status}")
    unplanned = sorted({c.no_data for c, p in rows if p is None})
    todo = [(c, p) for c, p in rows if not c.done and p is not None]
    left = plan.Plan(0)
    for _, p in todo:
        left.participations += p.participations
        left.local_steps += p.local_steps
        left.bytes_up += p.bytes_up
        for key, exact in p.exact.items():
            left.exact[key] = left.exact[key] and exact
    complete = sum(1 for c, _ in rows if c.done)
    print(f"{len(rows)} cells, {complete} complete, {len(rows) - complete} to run: "
          f"{left.figure('participations')} client participations, {left.figure('local_steps')} local steps, "
          f"{plan.size(left.bytes_up, left.exact['bytes_up'])} uploaded"
          + (f" (without the {sum(1 for c, p in rows if p is None and not c.done)} cells whose data is not "
             "available here)" if unplanned else ""))
    for reason in unplanned:
        print(f"  no plan: the data is not available here ({reason}); the plan counts on the real federation")
    for name, reason in sorted(bounds.items()):
        print(f"  ≤ {name}: {reason}")
    seconds, unknown, reused = time_left(todo, speed)
    estimate = f"~{seconds / 3600:.2f} h on this device" if seconds else "no estimate"
    print(f"time left: {estimate} from the seconds per local step of complete cells of the same method"
          + (f"; {reused} cells start after a shared prefix, its rounds counted once" if reused else "")
          + (f"; {unknown} cells of methods without a complete cell yet" if unknown else ""))


def time_left(todo: list, speed: dict) -> tuple[float, int, int]:
    """(seconds, cells without a speed, cells that start after a shared prefix) for the cells to run,
    in sweep order, from ``speed`` (seconds per local step of each method's complete cells). A cell
    whose shared prefix is saved already, or will be by an earlier cell of the sweep, runs only the
    rounds after it. (Two jobs that reach the prefix at once both compute it: a lower bound then.)"""
    seconds, unknown, reused, shared = 0.0, 0, 0, set()
    for c, p in todo:
        steps = p.local_steps
        if c.prefix is not None:
            rounds, key, path = c.prefix
            if key in shared or path.is_file():
                steps -= sum(p.round_steps[:rounds])
                reused += 1
            shared.add(key)
        if c.method_name in speed:
            seconds += steps * sum(speed[c.method_name]) / len(speed[c.method_name])
        else:
            unknown += 1
    return seconds, unknown, reused


def empty_sweep_reason(arguments) -> str:
    """Which sweep override has no values (``seed=range(0)``), for the one-line refusal."""
    try:
        for ov in OverridesParser.create().parse_overrides(list(arguments)):
            if ov.is_sweep_override() and not list(ov.sweep_string_iterator()):
                return f"{ov.input_line} has no values"
    except Exception:  # noqa: BLE001  (the line stays useful without the name)
        pass
    return "a sweep override has no values"


# ------------------------------------------------------------------------------ local launches
def _local_kind(launcher) -> str | None:
    """'basic' (cells in this process), 'joblib' (cells in its pool workers), None (cells elsewhere:
    SLURM, submitit: their schedulers' signals are handled in the tasks)."""
    name = type(launcher).__name__
    return {"BasicLauncher": "basic", "JoblibLauncher": "joblib"}.get(name)


#: Hydra's functions replaced during a local launch (restored after it)
_REPLACED: dict = {}


@contextlib.contextmanager
def local_launch(launcher):
    """Around a local launch: stop signals noted (``stop.hold``: passed on to the pool workers, no
    further cell starts), and each cell passed over before Hydra writes into its directory when it
    must not start (``guarded_run_job``). Yields whether the launch is local."""
    kind = _local_kind(launcher)
    if kind is None:
        yield False
        return
    if kind == "basic":  # the namespace its launch reads run_job from
        namespace, replacements = type(launcher).launch.__globals__, {"run_job": guarded_run_job}
    else:  # joblib: its job function is pickled by name, so the workers run ``execute_cell``; a
        # sequential joblib run (one job) calls it in this process, with run_job replaced here too
        from hydra_plugins.hydra_joblib_launcher import _core

        namespace, replacements = _core.launch.__globals__, {"execute_job": execute_cell, "run_job": guarded_run_job}
    for name, replacement in replacements.items():
        _REPLACED[name] = namespace[name]
        namespace[name] = replacement
    try:
        with stop.hold():
            yield True
    finally:
        for name in replacements:
            namespace[name] = _REPLACED.pop(name)


def execute_cell(*args, **kwargs):
    """A joblib job: in a pool worker, stop signals are noted from now on, also between cells
    (``stop.hold_for_good``), and Hydra's ``run_job`` is ``guarded_run_job``; then Hydra's job."""
    from hydra_plugins.hydra_joblib_launcher import _core

    if multiprocessing.parent_process() is not None:  # a pool worker: its own copy of the module
        stop.hold_for_good()
        _core.run_job = guarded_run_job
    original = _REPLACED.get("execute_job", _core.execute_job)  # in this process: the one replaced
    return original(*args, **kwargs)


#: the return value of a cell passed over before Hydra started it: why
NOT_RUN = "fedlnl: not run"


def guarded_run_job(**kwargs):
    """Hydra's ``run_job``, unless the cell must not start: the sweep was asked to stop, or another
    live process holds the cell's lock. Hydra would write ``.hydra/`` and its log into the cell
    directory before the task could refuse; a passed-over cell gets nothing written."""
    from hydra.core.utils import JobReturn, JobStatus, run_job

    config = kwargs["config"]
    overrides = list(OmegaConf.to_container(config.hydra.overrides.task))
    why = None
    if stop.received is not None:
        why = f"not started: {stop.name_of(stop.received)} was received"
    else:
        try:
            run_dir = Path(str(OmegaConf.select(config, kwargs["job_dir_key"]))) / str(
                OmegaConf.select(config, kwargs["job_subdir_key"]))
            lock = CellLock(run_dir)
            if lock.owner() is not None and lock.stale() is None:
                why = f"locked: {lock.describe()}"
                print(f"[fedlnl] skipping {run_dir}: another process ({lock.describe()}) is training this cell",
                      file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001  (a directory that does not resolve here: the task reports it)
            why = None
    if why is None:
        return run_job(**kwargs)
    ret = JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
    ret.return_value = f"{NOT_RUN}: {why}"
    return ret


def stopped_by(summary: dict | None) -> int | None:
    """The signal an interrupted run's summary names (``error``: "stopped by SIGTERM after round …"), else None."""
    if not summary or summary.get("status") != "interrupted":
        return None
    found = re.match(r"stopped by (SIG\w+)", str(summary.get("error") or ""))
    return getattr(signal, found.group(1)) if found and hasattr(signal, found.group(1)) else None


def report_stop(cells: list[Cell], results: list, began: float) -> None:
    """After a local launch: when a stop signal reached the sweep or one of its cells, one line
    naming what was saved and what is left, and exit with 128 + the signal. ``results``: the
    launch's JobReturns, in cell order (fewer when it stopped early); ``began``: its start time."""
    saved, signals = [], set()
    passed = {i for i, r in enumerate(results) if str(r._return_value).startswith(f"{NOT_RUN}: locked")}
    for i, c in enumerate(cells):
        summary = read_summary(c.run_dir) if c.run_dir is not None and i not in passed else None
        if not summary or summary.get("status") != "interrupted" or summary.get("config_hash") != c.hash:
            continue
        if (c.run_dir / "summary.json").stat().st_mtime < began - 1:  # left by an earlier sweep
            continue
        if (signum := stopped_by(summary)) is not None:
            signals.add(signum)
            saved.append(c)
    signum = stop.received if stop.received is not None else min(signals, default=None)
    if signum is None:
        return
    done = sum(1 for c in cells if c.run_dir is not None and completed(c.run_dir, c.hash))
    left = len(cells) - done - len(saved)
    print(f"fedlnl-run: stopped by {stop.name_of(signum)}: {len(saved)} cell(s) saved their round (status "
          f"interrupted), {left} not started, {done} complete of {len(cells)}; run the same command again to "
          f"resume (complete cells are skipped)", file=sys.stderr, flush=True)
    sys.exit(128 + int(signum))


def report_elsewhere(cells: list[Cell]) -> None:
    """Name the cells this sweep left to another process that holds their lock."""
    elsewhere = []
    for c in cells:
        if c.run_dir is None or completed(c.run_dir, c.hash):
            continue
        lock = CellLock(c.run_dir)
        if lock.owner() is not None and lock.stale() is None:
            elsewhere.append(f"{c.run_dir.name} ({lock.describe()})")
    if elsewhere:
        print(f"fedlnl-run: warning: {len(elsewhere)} cells are being trained by another process, not by this "
              f"sweep: {'; '.join(elsewhere[:10])}{' ...' if len(elsewhere) > 10 else ''}", file=sys.stderr)

