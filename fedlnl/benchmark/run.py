"""``fedlnl-run``: one federated run (or, with ``-m``, a Hydra sweep of runs).

The command line is checked before Hydra starts (``preflight.check_argv``); a single run makes every
check of its cell before Hydra creates its directory (``precheck``); then Hydra composes the config
and ``runner.run`` trains it. A refused run leaves nothing behind that this process made.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fedlnl.conf import resolvers  # noqa: F401  (registers ${fidelity:...})
from fedlnl.benchmark import compose, device, preflight, tuning
from fedlnl.benchmark.lock import CellLock
from fedlnl.benchmark.rundir import check_identity, check_run_dir, config_hash
from fedlnl.benchmark.runner import run
from fedlnl.benchmark.validate import ConfigError

log = logging.getLogger("fedlnl")


#: what existed before Hydra ran (``precheck``): cleanup after a refusal removes only what this process made
_BEFORE: dict = {}


def snapshot(run_dir: Path) -> None:
    """Record what exists at ``run_dir`` before Hydra adds to it (``remove_made_dirs`` undoes the rest)."""
    run_dir = run_dir.absolute()
    anchor = next(p for p in [run_dir, *run_dir.parents] if p.exists())
    _BEFORE.update(run_dir=run_dir, anchor=anchor,
                   entries=set(os.listdir(run_dir)) if run_dir.is_dir() else None)


def remove_made_dirs(run_dir: Path) -> None:
    """Hydra creates the job directory (``.hydra/``, ``run.log``) before the task runs; after a
    refusal remove what Hydra added for this process, and the directories it created, nothing else."""
    run_dir = run_dir.absolute()
    if not run_dir.is_dir():
        return
    # a single run (its directory may name a later second than the one ``precheck`` saw: ${now:...})
    multirun = HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN"
    single = (_BEFORE.get("run_dir") is not None and not multirun) or _BEFORE.get("run_dir") == run_dir
    before = _BEFORE.get("entries") if _BEFORE.get("run_dir") == run_dir else None
    hydra_only = lambda paths: all(p.name == ".hydra" or p.suffix == ".log" for p in paths)  # noqa: E731
    if before is not None:  # a directory that existed: remove only Hydra's new files
        new = [p for p in run_dir.iterdir() if p.name not in before]
        if hydra_only(new):
            for p in new:
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        return
    if not hydra_only(run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    if not single:  # a sweep cell: its sweep directory is the sweep's
        return
    for parent in run_dir.parents:  # the parents Hydra made for it, up to the first that existed
        if parent == _BEFORE["anchor"] or not parent.is_relative_to(_BEFORE["anchor"]):
            break
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


def quiet_log_file_errors() -> None:
    """A log file that cannot be written any more (a full disk) is one warning line on stderr, not
    logging's traceback for every message after it."""
    def failed(handler, record) -> None:
        if not getattr(handler, "fedlnl_failed", False):
            handler.fedlnl_failed = True
            err = sys.exc_info()[1]
            print(f"fedlnl-run: warning: cannot write the log file {handler.baseFilename} "
                  f"({type(err).__name__}: {preflight.first_line(err) if err else '?'}); logging to the console only",
                  file=sys.stderr)

    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = functools.partial(failed, handler)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    quiet_log_file_errors()
    hc = HydraConfig.get()
    group = Path(hc.sweep.dir).name if hc.mode.name == "MULTIRUN" else "single"
    out = Path(hc.runtime.output_dir)
    try:
        typed = list(hc.overrides.task)
        tuned, applied = tuning.apply(cfg, method_label(hc), compose.typed_keys(typed))
        summary = run(cfg, out, method_label(hc), group=f"{cfg.name}/{group}",
                      typed=typed + [f"{k}={v}" for k, v in applied.items()], tuned=tuned)
    except ConfigError as err:
        remove_made_dirs(out)
        print(f"fedlnl-run: error: {err}", file=sys.stderr)
        sys.exit(2)
    except OSError as err:  # the machine, not the config: disk full, a file system gone read-only
        if hc.mode.name == "MULTIRUN":
            raise  # the launcher names the failed cell (with its log on SLURM)
        from fedlnl.benchmark.rundir import read_summary

        recorded = (read_summary(out) or {}).get("status") == "failed"
        kept = "; checkpoint.pt holds the last saved round" if (out / "checkpoint.pt").is_file() else ""
        print(f"fedlnl-run: error: {out}: {type(err).__name__}: {preflight.first_line(err)} "
              f"({'summary.json records the failure' if recorded else 'no summary.json could be written'}{kept})",
              file=sys.stderr)
        sys.exit(1)
    if summary.get("status") == "not started":  # a stopped sweep: this cell's directory gets nothing
        remove_made_dirs(out)
        return None
    if summary.get("status") == "running" and hc.mode.name != "MULTIRUN":  # a sweep names these at its end
        print(f"fedlnl-run: error: {out} is being trained by another process ({CellLock(out).describe()}); "
              "this run did nothing", file=sys.stderr)
        sys.exit(1)
    if in_tune(hc):  # the value Optuna maximises: noisy validation, never a test figure
        return None if summary.get("status") == "interrupted" else tuning.objective(summary)
    return summary.get("best_acc")


def in_tune(hc) -> bool:
    """Whether this job is a trial of ``experiment=tune`` (its sweeper is the tuning sweeper)."""
    return hc.mode.name == "MULTIRUN" and "TuningSweeper" in str(hc.sweeper.get("_target_", ""))


def presets_help() -> str:
    """One line per paper preset (its YAML's first comment line), for ``fedlnl-run --help``."""
    lines = ["Paper presets (fedlnl-run -m paper=NAME; add debug=tiny for a seconds-scale smoke run,",
             "dry_run=true to list the cells and the cost left):"]
    for path in sorted((preflight.CONF / "paper").glob("*.yaml")):
        about = next((ln[2:].strip() for ln in path.read_text().splitlines()[1:3] if ln.startswith("# ")), "")
        lines.append(f"  {path.stem:<14} {about[:100]}")
    return "\n".join(lines) + "\n"


def precheck(argv: list[str]) -> int | None:
    """A single run (no ``-m``): every check a run makes before training, before Hydra creates the
    run directory, with the config composed as Hydra composes it; also refuses a ``hydra.run.dir``
    that holds a run of another config or cannot be written. With ``dry_run=true`` it prints the
    run's plan. Returns the exit code to stop with, or None to start the run."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from fedlnl.benchmark import plan
    from fedlnl.benchmark.rundir import check_names, check_writable

    overrides = preflight.config_overrides(argv)
    try:
        with initialize_config_dir(str(preflight.CONF), version_base=None):
            cfg = hydra_compose("config", overrides=overrides, return_hydra_config=True)
    except Exception:  # noqa: BLE001  (check_argv named composition problems; Hydra reports the rest)
        return None
    HydraConfig.instance().set_config(cfg)
    shown = logging.StreamHandler(sys.stderr)  # warnings of the checks (a damaged cache), before Hydra's logging
    shown.setLevel(logging.WARNING)
    shown.setFormatter(logging.Formatter("fedlnl-run: warning: %(message)s"))
    log.addHandler(shown)
    try:
        typed = compose.typed_keys([o for o in overrides if not o.startswith("hydra")])
        _record, applied = tuning.apply(cfg, method_label(cfg.hydra), typed)
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        method = preflight.check_cell(job, {**typed, **applied})
        device.check_threads(job)
        resolved = OmegaConf.to_container(job, resolve=True)
        template = str(OmegaConf.to_container(cfg.hydra.run, resolve=False)["dir"])
        try:
            run_dir = Path(str(cfg.hydra.run.dir))
        except Exception:  # noqa: BLE001  (a directory that names Hydra's runtime values: known only later)
            run_dir, template = None, "${now:"
        if run_dir is not None:  # a plan writes nothing: only a name that cannot exist is refused
            check_names(run_dir, "hydra.run.dir") if job.get("dry_run") else check_writable(run_dir, "hydra.run.dir")
        identity = None if job.get("dry_run") else device.run_identity(job)  # a device this machine lacks
        if "${now:" not in template:  # a directory the user chose: it may hold another run
            check_run_dir(run_dir, config_hash(resolved), resolved)
            if identity is not None:
                check_identity(run_dir, config_hash(resolved), identity)
            lock = CellLock(run_dir)
            if not job.get("dry_run") and lock.owner() is not None and lock.stale() is None:
                print(f"fedlnl-run: error: {run_dir} is being trained by another process ({lock.describe()}); "
                      "this run did nothing", file=sys.stderr)  # before Hydra writes into the holder's directory
                return 1
        dry = bool(job.get("dry_run"))
        try:
            cell = preflight.build_cell(job, method, str(cfg.hydra.runtime.choices.get("model", "model")))
        except preflight.DataUnavailable as err:
            if not dry:
                raise
            print(f"{method_label(cfg.hydra)} seed {job.seed}: no plan: the data is not available here ({err}); "
                  "the plan counts on the real federation\ndry_run=true: nothing was trained or written")
            return 0
        p = plan.plan_run(method, cell.info, cell.model, cell.total, int(job.seed), *cell.evaluations(job)) if dry else None
    except ConfigError as err:
        print(f"fedlnl-run: error: {err}", file=sys.stderr)
        return 2
    finally:
        HydraConfig.instance().cfg = None
        log.removeHandler(shown)
    if p is not None:
        print(f"{method_label(cfg.hydra)} seed {job.seed}: {plan.describe(p)}")
        for reason in p.bounds:
            print(f"  ≤ {reason}")
        print("dry_run=true: nothing was trained or written")
        return 0
    if run_dir is not None:
        snapshot(run_dir)
    return None


def refusal(argv: list[str]) -> tuple[str, bool] | None:
    """(why a run of this command line would be refused, whether its config resolves at all), by
    the checks that need no data; None when they pass. For ``--cfg``, which only prints."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = preflight.config_overrides(argv)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(preflight.CONF), version_base=None):
            cfg = hydra_compose("config", overrides=overrides, return_hydra_config=True)
    except Exception:  # noqa: BLE001  (Hydra's own --cfg reports composition errors)
        return None
    HydraConfig.instance().set_config(cfg)
    try:
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        try:
            OmegaConf.to_container(job, resolve=True)
        except Exception as err:  # noqa: BLE001
            return f"{getattr(err, 'full_key', None) or 'config'}: {preflight.first_line(err)}", False
        preflight.check_cell(job, compose.typed_keys([o for o in overrides if not o.startswith("hydra")]))
        device.check_threads(job)
        device.run_identity(job)  # the device exists here
    except ConfigError as err:
        return str(err), True
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
    return None


def main() -> None:
    try:
        _main()
    except KeyboardInterrupt:  # Ctrl-C before training started (a run's rounds stop cleanly: stop.py)
        if _BEFORE.get("run_dir") is not None:
            remove_made_dirs(_BEFORE["run_dir"])
        print("fedlnl-run: interrupted (SIGINT) before training started: nothing was trained or saved",
              file=sys.stderr)
        sys.exit(130)


def _main() -> None:
    _BEFORE.clear()
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(presets_help())
    argv = sys.argv[1:]
    problem = preflight.check_argv(argv)  # names, syntax, composition: before Hydra starts
    if problem:
        print(f"fedlnl-run: error: {problem}", file=sys.stderr)
        sys.exit(2)
    if "experiment=tune" in argv or "experiment=tune_small" in argv:
        problem = preflight.check_tune(argv)
        if problem:
            print(f"fedlnl-run: error: {problem}", file=sys.stderr)
            sys.exit(2)
    plain = not any(a in ("-m", "--multirun", "--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help",
                          "--version", "--shell-completion", "-sc", "--experimental-rerun") for a in argv)
    if plain:
        code = precheck(argv)
        if code is not None:
            sys.exit(code)
    shown = any(a in ("--cfg", "-c") for a in argv) and not any(a in ("--help", "-h", "--hydra-help") for a in argv)
    refused = refusal(argv) if shown else None
    if refused and not refused[1] and "--resolve" in argv:  # Hydra could not print it resolved
        print(f"fedlnl-run: error: the config does not resolve: {refused[0]}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()
    if refused:  # --cfg printed a config that a run refuses: say so
        print(f"fedlnl-run: error: a run of this config would be refused: {refused[0]}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
