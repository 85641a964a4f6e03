"""Shared test helpers: compose the real Hydra config and run tiny federations."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from fedlnl.conf import resolvers  # noqa: F401  (registers ${fidelity:...})

# Tiny models on 2 cores shared by pytest-xdist workers: one intra-op thread per worker is fastest.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # and in the subprocesses the CLI tests start

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "fedlnl" / "conf"
SHARED = Path(os.environ.get("FEDLNL_SHARED", REPO.parent / "shared"))


def compose_cfg(overrides: list[str]):
    """The config ``fedlnl-run`` would run with these overrides (no Hydra job dir)."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="fedlnl.conf", version_base=None):
        return compose(config_name="config", overrides=overrides)


def build_method(cfg, typed=()):
    """The method ``fedlnl-run`` would build for this config (its checks included)."""
    from fedlnl.benchmark import compose, preflight

    return preflight.check_cell(cfg, compose.typed_keys(typed))


def make(cls, **kw):
    """A method built directly: the shared local-training values in ``kw`` go into its FLSettings
    (others at small defaults), the rest are its own hyperparameters; ``rounds`` is the runner's."""
    from fedlnl.methods.common.protocol import FL_FIELDS, FLSettings

    kw.pop("rounds", None)
    fl = dict(frac=1.0, local_epochs=1, batch_size=2, optimizer="sgd", lr=0.1, momentum=0.0, betas=None,
              weight_decay=0.0, augment=False, eval_batch_size=1000)
    fl.update({k: kw.pop(k) for k in list(kw) if k in FL_FIELDS})
    if "score_batch_size" in kw:
        fl["eval_batch_size"] = kw.pop("score_batch_size")
    return cls(fl=FLSettings(**fl), **kw)


def method_names() -> list[str]:
    return sorted(p.stem for p in (CONF / "method").glob("*.yaml"))


#: every experiment YAML (fedlnl/conf/experiment/)
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def experiment_spec(name: str):
    """An experiment's YAML as written (not composed): its sweep grid and its top-level keys."""
    from omegaconf import OmegaConf

    return OmegaConf.load(CONF / "experiment" / f"{name}.yaml")


def swept_methods(name: str) -> list[str]:
    """The methods an experiment sweeps (``glob(*)`` = every method YAML)."""
    spec = str(experiment_spec(name).hydra.sweeper.params.method)
    return method_names() if spec == "glob(*)" else [m.strip() for m in spec.split(",")]


def run_tiny(tmp_path: Path, overrides: list[str], method: str = "fedavg") -> dict:
    from fedlnl.benchmark.runner import run

    cfg = compose_cfg([f"method={method}", "debug=tiny", "logger=none", "device=cpu", *overrides])
    return run(cfg, tmp_path, method)


def rows_of(run_dir) -> list[dict]:
    """metrics.jsonl without the wall-clock column."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time_s"} for r in rows]


def numbers(summary: dict, extra: tuple = ()) -> dict:
    """The summary's result figures (and ``extra`` keys): equal for two runs of one config."""
    keys = (*extra, "status", "best_acc", "final_acc", "last10_acc", "comm_cost", "cost_to_target", "bytes_up",
            "rounds_run", "total_rounds", "detection", "federation_hash", "config_hash")
    return {k: summary[k] for k in keys}


def crash_after(monkeypatch, last: int):
    """Make every run raise KeyboardInterrupt (a Ctrl-C or a preempted job) once it has evaluated
    round ``last``; ``monkeypatch.undo()`` or the returned function restores the runner."""
    from fedlnl.benchmark import runner as runmod

    real = runmod.Runner.evaluate

    def crash(self, state, rnd, losses, agg):
        row = real(self, state, rnd, losses, agg)
        if row["round"] == last:
            raise KeyboardInterrupt
        return row

    monkeypatch.setattr(runmod.Runner, "evaluate", crash)
    return lambda: monkeypatch.setattr(runmod.Runner, "evaluate", real)


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED / "data" / "cifar10-jpeg").is_dir():
        pytest.skip(f"shared data not found at {SHARED}/data (set FEDLNL_SHARED)")
    return SHARED / "data"


@pytest.fixture(autouse=True)
def _no_stop_signal_carries_over(monkeypatch):
    """A test that signals its own process (SIGUSR2 through StopRequest) marks the process as asked
    to stop (``stop.received``), which refuses every later cell in it: each test starts unmarked."""
    from fedlnl.benchmark import stop

    monkeypatch.setattr(stop, "received", None)
