"""The tuning sweeper of ``experiment=tune``: Hydra's Optuna sweeper over the declared search spaces.

``fedlnl-run -m experiment=tune method=<name>[,<name>...]`` runs, for each method in turn, one Optuna
study of ``tune.trials`` trials with a TPE sampler seeded by ``tune.seed`` (a fresh sampler per
method: every method gets the same budget and the same sampler), maximising the noisy-validation
accuracy (``tuning.OBJECTIVE``). The study's parameters are built at sweep start from the method's
declarations (``tuning.search_space``), never typed. Before any trial runs, every method's default
cell is checked as a grid sweep's cells are (``sweeper.ValidatingSweeper``, data and model
included), and a config without a validation set is refused; each batch of trials is checked the
same way before it trains (a trial refused by a relation between values is told to Optuna as
failed, never trained). Trials run through the configured launcher, ``hydra.launcher.n_jobs`` at a
time (the batch Optuna asks for at once), in ``<tune.dir>/<method>/<trial overrides>``; a trial
already complete is read, not trained again (``skip_complete``), so a stopped tune re-run with the
same seed replays its trials and goes on; a stop signal (Ctrl-C, ``kill``) reaches the trials as in a
local sweep (``sweeper.local_launch``): each saves its round, the tune exits with one line and writes
nothing, and the re-run resumes the stopped trials. The study writes ``<tune.dir>/<method>/optimization_results.yaml``:
Hydra's keys (name, best_params, best_value) and ours (objective, method, trials, setting, space,
history).
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

logging.getLogger("alembic").setLevel(logging.WARNING)  # optuna imports it; its plugin lines are noise here
import optuna  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate  # noqa: E402
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
from omegaconf import OmegaConf, open_dict

from fedlnl.benchmark import plan, preflight, stop, tuning
from fedlnl.benchmark.rundir import check_writable, read_summary
from fedlnl.benchmark.selection import SelectionSettings, stages_of
from fedlnl.benchmark.setting import setting_of
from fedlnl.benchmark.sweeper import ValidatingSweeper, local_launch, stopped_by
from fedlnl.benchmark.validate import ConfigError

log = logging.getLogger("fedlnl")


class TuningSweeperImpl(OptunaSweeperImpl):
    """Registered as ``hydra_plugins.fedlnl_sweeper.TuningSweeper``, configured by ``conf/tuning/optuna.yaml``."""

    def setup(self, *, hydra_context, task_function, config) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.checker = ValidatingSweeper(max_batch_size=None)  # the grid sweeps' checks, on our launcher
        self.checker.config, self.checker.hydra_context, self.checker.launcher = config, hydra_context, self.launcher

    # ------------------------------------------------------------------ the sweep
    def sweep(self, arguments: list[str]) -> None:
        try:
            methods, fixed = self.split(self._parse_sweeper_params_config() + list(arguments))
            studies = [self.prepare(fixed, m) for m in methods]
        except ConfigError as err:
            print(f"fedlnl-run: error: {err}", file=sys.stderr)
            sys.exit(2)
        problems = [s for s in studies if isinstance(s, str)]
        if problems:
            for p in problems:
                print(f"fedlnl-run: error: {p}", file=sys.stderr)
            print(f"fedlnl-run: error: {len(problems)} of {len(studies)} tunes are invalid; nothing was run",
                  file=sys.stderr)
            sys.exit(2)
        if self.config.get("dry_run"):
            self.print_plan(studies)
            return
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        for study in studies:
            self.run_study(**study)

    def split(self, params: list[str]) -> tuple[list[list[str]], list[str]]:
        """(one override list per method to tune, the fixed overrides). Only ``method`` may list
        several values (one study each); any other sweep is refused: a study searches the declared
        spaces at one cell."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        methods, fixed = [[]], []
        for ov in parser.parse_overrides(params):
            key = ov.get_key_element()
            if key == "tuned":
                raise ConfigError(f"{ov.input_line} does not combine with experiment=tune: a tune starts from the "
                                  "methods' own values")
            if key == "method" and ov.is_sweep_override():
                methods = [[f"method={v}"] for v in ov.sweep_string_iterator()]
            elif ov.is_sweep_override():
                raise ConfigError(f"{ov.input_line} is a sweep: experiment=tune searches the declared spaces of a "
                                  f"method at one cell; give one value (only method= may list several)")
            else:
                fixed.append(ov.input_line)
        return methods, fixed

    def prepare(self, fixed: list[str], method: list[str]) -> dict | str:
        """A method's study (its base overrides, search space, directory and setting), or why not."""
        overrides = [o for o in fixed if not o.startswith("method=")] + method if method else list(fixed)
        base = self.checker.compose(overrides)
        if isinstance(base, str):
            return f"tune [{' '.join(overrides)}]: {base}"
        cfg, built, _typed = base
        tuning.check_validation(cfg)  # refused for every method at once: the key is the sweep's
        from fedlnl.benchmark.run import method_label

        label = method_label(cfg.hydra)
        resolved = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
        dims = tuning.search_space(built, resolved["method"])
        typed = {o.split("=", 1)[0].lstrip("+~"): o for o in overrides}
        searched = next((d for d in dims if d.key in typed), None)
        if searched is not None:
            return (f"tune {label}: {typed[searched.key]} sets a value the tune searches ({searched.describe()}); "
                    "drop it")
        study_dir = Path(str(cfg.tune.dir)) / label
        check_writable(study_dir, "tune.dir")
        cell = self.checker.check_cells([overrides + [self.dir_override(study_dir)]])[0]
        if cell.problem:
            return f"tune [{' '.join(overrides)}]: {cell.problem}"
        return {"label": label, "overrides": overrides, "dims": dims, "study_dir": study_dir, "cell": cell,
                "setting": {**setting_of(resolved), "name": resolved.get("name"), "seed": resolved.get("seed"),
                            "rounds": resolved["fl"]["rounds"], "val_share": tuning.validation_share(cfg),
                            "selection_stage": SelectionSettings.of(resolved.get("selection")).stage},
                "trials": int(cfg.tune.trials), "sampler_cfg": cfg.hydra.sweeper.sampler}

    @staticmethod
    def print_plan(studies: list[dict]) -> None:
        """``dry_run=true``: each study's directory, space and budget, and what its trials cost (each
        trial: the method's default cell's plan; values drawn later may change a bound, not the
        schedule); nothing runs or is written."""
        for s in studies:
            cell = s["cell"]
            cost = "no plan: the data is not available here"
            if cell.built is not None:
                p = plan.plan_run(*cell.built)
                cost = (f"{s['trials']} × ({plan.describe(p)}) = {s['trials'] * p.local_steps:,} local steps"
                        + (" (bounds)" if not p.exact["local_steps"] else ""))
            print(f"{s['label']}: {s['trials']} trials -> {s['study_dir']}/{tuning.RESULTS}")
            for d in s["dims"]:
                print(f"  {d.key}: {d.describe()} (default {d.default})")
            print(f"  {cost}")
        print(f"{len(studies)} tunes, {sum(s['trials'] for s in studies)} trials, maximising {tuning.OBJECTIVE}\n"
              "dry_run=true: nothing was trained or written")

    @staticmethod
    def dir_override(study_dir: Path) -> str:
        """The trials' sweep directory (each trial: a subdirectory named by its overrides)."""
        return f"hydra.sweep.dir='{study_dir}'"

    def run_study(self, label: str, overrides: list[str], dims: list, study_dir: Path, setting: dict,
                  trials: int, sampler_cfg, cell=None) -> None:
        sampler = instantiate(sampler_cfg)  # fresh and seeded for every method
        study = optuna.create_study(sampler=sampler, direction="maximize")
        study_dir.mkdir(parents=True, exist_ok=True)
        with open_dict(self.config):
            self.config.hydra.sweep.dir = str(study_dir)  # where the launcher saves the sweep's config
        OmegaConf.save(self.config, study_dir / "multirun.yaml")
        print(f"[fedlnl] tuning {label}: {trials} trials of {', '.join(f'{d.key} {d.describe()}' for d in dims)}; "
              f"maximising {tuning.OBJECTIVE} -> {study_dir}", file=sys.stderr)
        history, left, batch, untold = [], trials, max(1, int(self.n_jobs)), []
        with local_launch(self.launcher) as local:  # stop signals: each trial saves its round (stop.py)
            while left > 0 and not untold and not (local and stop.received is not None):
                size = min(batch, left)
                untold = self.run_batch(study, label, overrides, dims, study_dir, history, size, local)
                left -= size
        if untold or (local and stop.received is not None):
            self.report_stop(label, untold, trials, history)
        self.write(study, label, dims, study_dir, setting, trials, history, overrides)

    def run_batch(self, study, label: str, overrides: list[str], dims: list, study_dir: Path, history: list,
                  size: int, local: bool) -> list:
        """Ask ``size`` trials, check and run them, tell Optuna each value. Returns the cells of the
        trials that ended without a value (stopped by a signal, or not started): told nothing, so
        that the same command, re-run, asks the same trials again and resumes them."""
        asked = [study.ask() for _ in range(size)]
        jobs = [(t, overrides + [f"{d.key}={tuning.override_value(d.suggest(t))}" for d in dims]
                 + [self.dir_override(study_dir)]) for t in asked]
        cells = self.checker.check_cells([list(o) for _, o in jobs])
        runnable = []
        for (trial, job), cell in zip(jobs, cells):
            if cell.problem:  # a relation between the drawn values: never trained
                log.warning("tune %s: trial %d refused: %s", label, trial.number, cell.problem)
                print(f"fedlnl-run: warning: tune {label}: trial {trial.number} not run: {cell.problem}",
                      file=sys.stderr)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                history.append(self.entry(trial, None, "refused", None))
            else:
                runnable.append((trial, job, cell))
        untold = []
        if runnable:
            try:
                returns = self.launcher.launch([tuple(j) for _, j, _ in runnable], initial_job_idx=self.job_idx)
            except (Exception, SystemExit) as err:  # a worker the stop signal ended before its trial
                if not local or stop.received is None:
                    raise
                print(f"fedlnl-run: warning: {type(err).__name__}: {preflight.first_line(err)[:300]}",
                      file=sys.stderr)
                return [cell for _, _, cell in runnable]
            self.job_idx += len(returns)
            for (trial, _job, cell), ret in zip(runnable, returns):
                value = ret.return_value  # re-raises the trial's exception: the sweep stops
                if not isinstance(value, float):  # stopped (None) or not started (why, a str)
                    untold.append(cell)
                    continue
                study.tell(trial, value)
                history.append(self.entry(trial, value, "complete", cell.run_dir))
        return untold

    @staticmethod
    def report_stop(label: str, untold: list, trials: int, history: list) -> None:
        """A tune a stop signal reached (its process or a trial's): one line naming what was saved, and
        exit with 128 + the signal; a trial passed over for another reason (another process trains
        it): one error line, exit 1. Nothing is written for the study: re-running resumes it."""
        signals = [s for s in (stopped_by(read_summary(cell.run_dir)) for cell in untold) if s is not None]
        saved, signum = len(signals), stop.received if stop.received is not None else min(signals, default=None)
        complete = sum(1 for h in history if h["state"] == "complete")
        if signum is None:
            names = ", ".join(cell.run_dir.name for cell in untold)
            print(f"fedlnl-run: error: tune {label}: trial(s) {names} did not run (another process trains them); "
                  f"{complete} of {trials} trials complete: run the same command again once they are done",
                  file=sys.stderr, flush=True)
            sys.exit(1)
        print(f"fedlnl-run: stopped by {stop.name_of(signum)}: tune {label}: {saved} trial(s) saved their round "
              f"(status interrupted), {complete} of {trials} trials complete; run the same command again to resume "
              f"(complete trials are read, not trained again)", file=sys.stderr, flush=True)
        sys.exit(128 + int(signum))

    @staticmethod
    def entry(trial, value, state: str, run_dir) -> dict:
        """A trial of the history; one whose run completed (not diverged) and names its stages also
        records the stage of its selected round and of its last evaluation (``selection.stages_of``)."""
        out = {"number": trial.number, "params": dict(trial.params), "value": value, "state": state,
               "dir": run_dir.name if run_dir is not None else None}
        summary = read_summary(run_dir) if state == "complete" else None
        if summary and summary.get("status") == "complete":
            stages = stages_of(run_dir, summary.get("selected_round"))
            out.update({k: stages[k] for k in ("stage_selected", "stage_last") if k in stages})
        return out

    @staticmethod
    def early(history: list) -> tuple[list, list]:
        """(the complete trials that name stages, those whose selected round lies before the last
        stage: the values read only in later stages did not reach the objective in them)."""
        staged = [h for h in history if "stage_last" in h]
        return staged, [h for h in staged if h["stage_selected"] != h["stage_last"]]

    def write(self, study, label, dims, study_dir: Path, setting: dict, trials: int, history: list,
              overrides: list[str]) -> None:
        """``optimization_results.yaml``: Hydra's Optuna keys, then ours; written whole (os.replace)."""
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not done:
            raise RuntimeError(f"tune {label}: no trial completed; nothing to write")
        best = study.best_trial
        results = {
            "name": "optuna", "best_params": dict(best.params), "best_value": best.value,
            "objective": tuning.OBJECTIVE, "direction": "maximize", "method": label, "trials": trials,
            "trials_complete": len(done), "best_trial": best.number,
            "sampler": {"name": type(study.sampler).__name__, "seed": OmegaConf.select(self.config, "tune.seed")},
            "batch": max(1, int(self.n_jobs)), "setting": setting,
            "overrides": [o for o in overrides if not o.startswith("hydra.")],
            "space": {d.key: {"range": d.describe(), "default": d.default, "source": d.space.source} for d in dims},
            "history": history,
        }
        staged, early = self.early(history)
        if staged:
            results["selected_before_last_stage"] = len(early)
        path = study_dir / tuning.RESULTS
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        OmegaConf.save(OmegaConf.create(results), tmp)
        tmp.replace(path)
        print(f"[fedlnl] tuned {label}: best {tuning.OBJECTIVE} {best.value:.4f} at "
              f"{', '.join(f'{k}={tuning.override_value(v)}' for k, v in best.params.items())} -> {path}",
              file=sys.stderr)
        if early:
            where = ", ".join(f"'{s}'" for s in dict.fromkeys(str(h["stage_selected"]) for h in early))
            print(f"[fedlnl] tune {label}: {len(early)} of {len(staged)} trials selected a round of the {where} "
                  f"stage, before the last ('{staged[0]['stage_last']}'): values read only in later stages did "
                  f"not reach {tuning.OBJECTIVE} in those trials", file=sys.stderr)
