"""Experiments (fedlnl/conf/experiment/*.yaml): every method of an experiment's sweep gets the same
budget of client participations, counted by the planner on the real schedule, and a cell of each
experiment runs under ``debug=tiny``.

Parametrized over conf/experiment/*.yaml: a new experiment is covered as soon as its YAML exists.
"""
import json

import pytest
from omegaconf import OmegaConf

from conftest import EXPERIMENTS, compose_cfg, experiment_spec, run_tiny, swept_methods
from fedlnl.benchmark.plan import plan_config
from fedlnl.methods.common.engine import cohort_size

#: the comparisons (a grid of methods); the tunes (experiment=tune, tune_small) search one cell of a
#: comparison's setting per method, their budget is tune.trials (tests/test_tuning.py)
COMPARISONS = [n for n in EXPERIMENTS if OmegaConf.select(experiment_spec(n), "hydra.sweeper.params.method") is not None]


@pytest.mark.parametrize("name", COMPARISONS)
def test_every_federated_method_of_an_experiment_gets_the_same_participation_budget(name):
    # the digits data stand in for the experiment's dataset: a participation count depends on the
    # schedule and the number of clients, not on the images (the federation keeps its client count)
    base = [f"experiment={name}", "dataset=digits", "model=cnn", "logger=none", "device=cpu",
            "noise.rho_tau=[0.6,0.5]"]
    budgets = {}
    for method in swept_methods(name):
        cfg = compose_cfg([*base, f"method={method}"])
        if method.endswith("_central"):  # no clients: its budget is epochs of the pooled data
            continue
        plan = plan_config(cfg, "cnn")
        budgets[method] = plan.participations
    cfg = compose_cfg(base)
    expected = cfg.fl.rounds * cohort_size(cfg.fl.frac, cfg.fl.num_clients)
    assert budgets and set(budgets.values()) == {expected}, budgets


def test_reproduce_small_pins_the_small_schedule_column():
    """``table_key: small`` reaches every multi-stage schedule: FedCorr 5 + 11 + 9, FedDiv 5
    warm-up iterations + 20 rounds, JointOpt / DivideMix 14 + 56 rounds of 5 local epochs; the
    centralised references train 35 epochs (700 participations x 500 samples x 5 epochs / 50,000)."""
    def method(m):
        return compose_cfg(["experiment=reproduce_small", f"method={m}"]).method

    assert (method("fedcorr").T1, method("fedcorr").T2, method("fedcorr").T3) == (5, 11, 9)
    assert method("feddiv").warmup_iterations == 5 and method("feddiv").training_rounds is None
    for m in ("jointopt", "dividemix"):
        assert (method(m).warmup_rounds, method(m).train_rounds, method(m).train_local_epochs) == (14, 56, 5)
    cfg = compose_cfg(["experiment=reproduce_small"])
    # IID clients hold 1/num_clients of the images: the cohort's local epochs per round, in epochs of all
    passes = cfg.fl.rounds * cohort_size(cfg.fl.frac, cfg.fl.num_clients) * cfg.fl.local_epochs / cfg.fl.num_clients
    jointopt, dividemix = method("jointopt_central"), method("dividemix_central")
    assert jointopt.epochs + jointopt.second_epochs == dividemix.epochs == passes == 35
    assert (cfg.dataset.name, cfg.model._target_.rsplit(".", 1)[1], cfg.fl.num_clients) == ("cifar10_jpeg", "LeNet", 100)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_cell_of_each_experiment_runs_under_debug_tiny(tmp_path, name):
    s = run_tiny(tmp_path / "cell", [f"experiment={name}", "noise.rho_tau=[0.6,0.5]"], "feddiv")
    assert s["status"] == "complete" and s["rounds_run"] == s["total_rounds"]
    rows = [json.loads(line) for line in (tmp_path / "cell" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) >= 1 and all(0.0 <= r["acc"] <= 1.0 for r in rows if "acc" in r)


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS
                                  if experiment_spec(n).get("preset")])
def test_an_experiment_preset_ships_reference_rows_of_its_own_cells(name):
    """The report finds the paper numbers of an experiment with a ``preset`` (packaged CSV), and every
    row names a swept method and a swept noise cell, so the ordering agreement compares like cells."""
    from fedlnl.benchmark.report.reference import packaged_reference, read_reference

    spec = experiment_spec(name)
    path = packaged_reference(spec.preset)
    assert path is not None, f"{name}: no fedlnl/benchmark/reference/{spec.preset}.csv"
    ref = read_reference(path)
    noise = {tuple(float(x) for x in cell.strip("[]").split(","))
             for cell in str(spec.hydra.sweeper.params["noise.rho_tau"]).replace("],[", "] [").split()}
    assert len(ref) > 0 and set(ref["method"]) <= set(swept_methods(name))
    assert {(float(r), float(t)) for r, t in zip(ref["rho"], ref["tau"])} <= noise
