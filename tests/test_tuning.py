"""Equal-budget tuning (issue 33 item 3): the declared search spaces, ``tuned=`` and the tune sweep."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import EXPERIMENTS, REPO, build_method, compose_cfg, experiment_spec, method_names, swept_methods
from fedlnl.benchmark import compose, tuning
from fedlnl.benchmark.rundir import config_hash
from fedlnl.benchmark.validate import ConfigError

ENV = {**os.environ, "HYDRA_FULL_ERROR": "1", "PYTHONUNBUFFERED": "1"}
CELLS = ("[0.6,0.5]", "[0.0,0.0]")  # the tuning cell and the quickstart's clean cell


def has_validation() -> bool:
    """Whether this checkout has the noisy validation split (issue 33 item 1) the objective needs."""
    return OmegaConf.select(compose_cfg([]), "selection.val_share", default=None) is not None


needs_validation = pytest.mark.skipif(not has_validation(), reason="needs selection.val_share (issue 33 item 1)")


def space_of(name: str, cell: str = CELLS[0], extra=()):
    cfg = compose_cfg(["experiment=tune", f"method={name}", f"noise.rho_tau={cell}", *extra])
    method = build_method(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    return cfg, method, tuning.search_space(method, resolved["method"])


def built_with(cfg, key: str, value):
    """(the method built from ``cfg`` with ``key`` set as if typed, every check of a run included;
    its resolved method node)."""
    cfg = cfg.copy()
    OmegaConf.update(cfg, key, value, merge=False)
    method = build_method(cfg, [f"{key}={tuning.override_value(value)}"])
    return method, OmegaConf.to_container(cfg, resolve=True)["method"]


def read_back(method, node, key: str):
    """The value the built method uses for ``key``: the local-training lr of an lr key (fl.lr, a pin
    <path>.lr), else its own field."""
    path, _, field = key.rpartition(".")
    nodes = {p: obj for p, _node, obj in compose.method_nodes(method, node)}
    if key == "fl.lr":
        return method.fl.lr
    obj = nodes[path]
    return obj.fl.lr if field == "lr" else getattr(obj.params, field)


# ------------------------------------------------------------------------------ the declarations
@pytest.mark.parametrize("name", method_names())
@pytest.mark.parametrize("cell", CELLS)
def test_every_method_declares_lr_and_at_most_three_own_keys(name, cell):
    cfg, method, dims = space_of(name, cell)
    lr = [d for d in dims if d.space.lr]
    own = [d for d in dims if not d.space.lr]
    assert lr, f"{name}: no learning rate searched"
    assert len(own) <= tuning.MAX_OWN
    assert len({d.key for d in dims}) == len(dims)
    for d in dims:
        assert d.space.source.strip(), f"{name}: {d.key} names no source for its range"
        assert d.space.contains(d.default, d.default), f"{name}: default {d.key}={d.default} outside {d.describe()}"


@pytest.mark.parametrize("name", method_names())
def test_every_bound_passes_the_fields_own_checks_and_is_what_the_method_reads(name):
    """Each end of each range (each choice) set as if typed builds the method (its field checks,
    its relations, check_typed: no shadowed lr) and is the value the method then uses; the values
    that need the federation (PoC's d >= m) pass the schedule's check."""
    from fedlnl.benchmark import preflight

    cfg, _method, dims = space_of(name)
    for d in dims:
        values = d.space.choices if d.space.choices is not None else d.bounds
        for value in values:
            built, node = built_with(cfg, d.key, value)
            assert read_back(built, node, d.key) == pytest.approx(value), (d.key, value)
            job = cfg.copy()
            OmegaConf.update(job, d.key, value, merge=False)
            preflight.build_cell(job, built, "cnn")  # the data-dependent checks (d >= m, warm-up < rounds)


def test_the_lr_key_follows_a_pin_and_fl_unused():
    """fl.lr normally; method.lr where the YAML pins it; the method's own lr of its noise group where
    fl.lr is unused (JointOpt centralised); DivideMix also tunes its stage-2 lr."""
    keys = lambda name, cell=CELLS[0]: [d.key for d in space_of(name, cell)[2] if d.space.lr]  # noqa: E731
    assert keys("fedavg") == ["fl.lr"]
    assert keys("dividemix_central") == ["method.lr"]
    # one pinned lr for both noise groups (the high group runs it × lr_high_factor) and both steps (the
    # second runs it × second_lr_factor: a key of its own was searched blind, docs/methods/jointopt.md §11)
    assert keys("jointopt_central") == ["method.lr"]
    assert keys("jointopt_central", CELLS[1]) == ["method.lr"]
    assert keys("dividemix") == ["fl.lr", "method.train_lr"]
    # FedProx pins lr 0.01 on CIFAR-10: the tuned key is the pin, centred on it
    _cfg, _m, dims = space_of("fedprox", extra=["table_key=cifar10"])
    lr = next(d for d in dims if d.space.lr)
    assert (lr.key, lr.default, lr.bounds) == ("method.lr", 0.01, pytest.approx((0.001, 0.1)))


#: searched keys the clean cell reads and the tuning cell cannot: DivideMix's λ_u is a choice among the
#: paper's {0, 25, 50, 150} *by noise level* (Li et al. §4), 0 for the low group, so no factor ties it
#: to the high group's value
CLEAN_ONLY = {"dividemix": {"method.lambda_u_low"}, "dividemix_central": {"method.lambda_u_low"}}


@pytest.mark.parametrize("name", method_names())
def test_the_tuned_values_are_the_ones_every_cell_reads(name):
    """The tune runs at the noisy cell only and ``tuned=`` applies its values to every cell, so every
    searched key a method reads at the clean cell must be one the noisy cell's study searches.
    Centralised JointOpt read lr_low and β_low at (0,0) and tuned lr_high and β_high at (0.6,0.5): its
    clean row kept FedCorr's ResNet lr 0.1 on LeNet-5 and ended at chance, and on the quickstart its
    clean first step ran the untuned β = 1.5 against the tuned 0.31 (issue 32; docs/methods/jointopt.md §11)."""
    tuned = {d.key for d in space_of(name, CELLS[0])[2]}
    clean = {d.key for d in space_of(name, CELLS[1])[2]} - CLEAN_ONLY.get(name, set())
    assert clean <= tuned, f"{name}: the clean cell reads {sorted(clean - tuned)}, which the tuning cell never searches"


def test_around_ranges_are_relative_and_integer_ranges_round_inwards():
    from fedlnl.methods.common.params import around

    assert around(10, "x").bounds(0.05) == pytest.approx((0.005, 0.5))
    assert around(2, "x", integer=True).bounds(10) == (5, 20)
    assert around(2, "x", integer=True).bounds(7) == (4, 14)
    assert around(2, "x", integer=True).bounds(1) == (1, 2)


def test_the_user_guide_table_is_the_declarations():
    guide = (REPO / "docs" / "user-guide.md").read_text()
    for line in tuning.space_table(lambda name: space_of(name)[2], method_names()):
        assert line in guide, f"docs/user-guide.md lacks the row: {line}"


def test_the_objective_is_the_validation_figure_and_a_diverged_trial_scores_zero():
    summary = {"status": "complete", "selected_val_acc": 0.61, "best_acc": 0.9, "selected_acc": 0.8}
    assert tuning.objective(summary) == 0.61
    assert tuning.objective({**summary, "status": "diverged", "selected_val_acc": None}) == 0.0
    for bad in ({**summary, "selected_val_acc": None}, {**summary, "status": "running"}):
        with pytest.raises(RuntimeError):
            tuning.objective(bad)


# ------------------------------------------------------------------------------ tuned=
def results(path: Path, method: str, values: dict, trials: int = 5) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create({"name": "optuna", "best_params": values, "best_value": 0.5,
                                     "objective": tuning.OBJECTIVE, "method": method, "trials": trials,
                                     "setting": {"dataset": "digits"}}), path)
    return path


def applied(overrides, method="fedprox", typed=None):
    cfg = compose_cfg([f"method={method}", *overrides])
    record, extra = tuning.apply(cfg, method, compose.typed_keys(typed or overrides))
    return cfg, record, extra


def test_tuned_sets_the_values_as_typed_and_moves_the_hash(tmp_path):
    f = results(tmp_path / "t" / "fedprox" / tuning.RESULTS, "fedprox", {"fl.lr": 0.02, "method.mu": 0.1})
    plain = compose_cfg(["method=fedprox"])
    forms = ((f, tuning.RESULTS), (f.parent, tuning.RESULTS), (tmp_path / "t", f"fedprox/{tuning.RESULTS}"))
    for where, source in forms:
        cfg, record, extra = applied([f"tuned={where}"])
        assert (cfg.fl.lr, cfg.method.mu) == (0.02, 0.1)
        assert record == {"values": {"fl.lr": 0.02, "method.mu": 0.1}, "trials": 5, "objective": tuning.OBJECTIVE,
                          "source": source, "best_value": 0.5, "tuned_on": {"dataset": "digits"}}
        assert extra == {"fl.lr": "0.02", "method.mu": "0.1"}
        hashes = [config_hash(OmegaConf.to_container(c, resolve=True)) for c in (cfg, plain)]
        assert hashes[0] != hashes[1]
    # the path alone is result-neutral: the same values typed give the same hash
    typed = compose_cfg(["method=fedprox", "fl.lr=0.02", "method.mu=0.1"])
    assert config_hash(OmegaConf.to_container(typed, resolve=True)) == hashes[0]


def test_a_bare_name_is_a_committed_tuning_unless_a_path_of_that_name_exists(tmp_path, monkeypatch):
    root = tmp_path / "pkg"
    results(root / "mine" / "fedprox" / tuning.RESULTS, "fedprox", {"fl.lr": 0.02})
    monkeypatch.setattr(tuning, "TUNED_ROOT", root)
    monkeypatch.setattr(tuning, "COMMITTED", ["mine"])
    monkeypatch.chdir(tmp_path)
    assert tuning.results_file("mine", "fedprox") == (root / "mine" / "fedprox" / tuning.RESULTS,
                                                      f"fedprox/{tuning.RESULTS}")
    results(tmp_path / "mine" / tuning.RESULTS, "fedprox", {"fl.lr": 0.03})  # a path of that name wins
    assert tuning.results_file("mine", "fedprox") == (Path("mine") / tuning.RESULTS, tuning.RESULTS)
    with pytest.raises(ConfigError, match=r"a committed tuning: mine\)$"):
        tuning.results_file("other", "fedprox")


def committed_studies(where: str) -> dict[str, dict]:
    """Every study of a committed tuning (fedlnl/tuned/<where>/<method>/), by method."""
    out = {}
    for d in sorted((tuning.TUNED_ROOT / where).iterdir()):
        if d.is_dir():
            path, _ = tuning.results_file(where, d.name)
            out[d.name] = tuning.read_results(path, where, d.name)
    return out


#: the experiments that apply a committed tuning (``tuned: <name>`` in their YAML)
TUNED_EXPERIMENTS = [n for n in EXPERIMENTS if experiment_spec(n).get("tuned")]


@pytest.mark.parametrize("where", tuning.COMMITTED)
def test_every_study_of_a_committed_tuning_was_made_at_one_budget(where):
    """Equal budget (issue 33): a committed tuning's studies were all made in one setting (its name,
    the noisy cell (0.6, 0.5), seed 0) with the same number of trials, every trial run, maximising
    the validation objective; the staged methods that record their selection rule share one."""
    studies = committed_studies(where)
    assert studies, f"fedlnl/tuned/{where} holds no study"
    for name, data in studies.items():
        setting = data["setting"]
        assert (setting["name"], setting["rho"], setting["tau"], setting["seed"]) == (where, 0.6, 0.5, 0), name
        assert data["objective"] == tuning.OBJECTIVE and data["trials_complete"] == data["trials"], name
    assert len({data["trials"] for data in studies.values()}) == 1
    assert len({d["setting"]["selection_stage"] for d in studies.values() if "selection_stage" in d["setting"]}) <= 1


@pytest.mark.parametrize("name", TUNED_EXPERIMENTS)
def test_a_tuned_experiment_has_a_study_of_every_method_it_sweeps(name):
    """``make run`` and the experiments that name a committed tuning compare tuned methods (issue 33
    item 3): the tuning was made in the experiment's own setting and holds every swept method."""
    cfg = compose_cfg([f"experiment={name}", "method=fedavg"])
    assert cfg.tuned in tuning.COMMITTED and cfg.tuned == cfg.name
    assert set(swept_methods(name)) <= set(committed_studies(cfg.tuned))


def test_the_quickstart_is_tuned_and_the_tunes_search_from_the_yamls():
    """A tune never starts from a committed tuning, whatever its setting applies (issue 33)."""
    assert "quickstart" in TUNED_EXPERIMENTS
    for tune in ("tune", "tune_small"):
        assert compose_cfg([f"experiment={tune}", "method=fedavg"]).get("tuned") is None


@pytest.mark.parametrize("case, message", [
    ("missing", "no such file or directory"),
    ("other_method", "holds the tuned values of method fedavg, not of this run's method fedprox"),
    ("no_method_in_dir", "holds no tuned values for method fedprox (tuned methods there: fedavg)"),
    ("typed_too", "fl.lr=0.3 and tuned="),
    ("not_a_result", "is not the result of an experiment=tune run"),
])
def test_tuned_refusals_are_one_line(tmp_path, case, message):
    other = results(tmp_path / "d" / "fedavg" / tuning.RESULTS, "fedavg", {"fl.lr": 0.02})
    mine = results(tmp_path / "mine.yaml", "fedprox", {"fl.lr": 0.02})
    plain = tmp_path / "plain.yaml"
    plain.write_text("best_params: {fl.lr: 0.1}\nbest_value: 0.3\n")
    where, extra = {"missing": (tmp_path / "nope", []), "other_method": (other, []),
                    "no_method_in_dir": (tmp_path / "d", []), "typed_too": (mine, ["fl.lr=0.3"]),
                    "not_a_result": (plain, [])}[case]
    with pytest.raises(ConfigError) as err:
        applied([f"tuned={where}", *extra])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_tuned_value_shadowed_by_a_pin_is_refused_as_a_typed_one(tmp_path):
    """Applied as if typed: fl.lr tuned on digits, applied where FedProx pins its lr (CIFAR-10)."""
    f = results(tmp_path / tuning.RESULTS, "fedprox", {"fl.lr": 0.02})
    cfg, _record, extra = applied([f"tuned={f}", "table_key=cifar10"], typed=[])
    with pytest.raises(ConfigError, match="fl.lr=0.02 is shadowed by method.lr=0.01"):
        build_method(cfg, [f"{k}={v}" for k, v in extra.items()])


def cli(*args, cwd=REPO, env=ENV, timeout=600):
    return subprocess.run([sys.executable, "-m", "fedlnl.benchmark.run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_tuned_run_and_sweep_record_their_values(tmp_path):
    """A sweep over two methods with tuned=<dir>: each cell gets its method's values, recorded in
    summary.json; a refused tuned= writes nothing."""
    results(tmp_path / "tuned" / "fedavg" / tuning.RESULTS, "fedavg", {"fl.lr": 0.07})
    results(tmp_path / "tuned" / "fedprox" / tuning.RESULTS, "fedprox", {"fl.lr": 0.02, "method.mu": 0.01})
    sweep = tmp_path / "sweep"
    proc = cli("-m", "method=fedavg,fedprox", "debug=tiny", "logger=none", "device=cpu", "threads=1",
               "fl.rounds=1", f"tuned={tmp_path / 'tuned'}", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = {s["method"]: s for s in (json.loads(p.read_text()) for p in sweep.glob("*/summary.json"))}
    assert summaries["fedavg"]["tuned"]["values"] == {"fl.lr": 0.07}
    assert summaries["fedavg"]["effective"]["lr"] == 0.07
    assert summaries["fedprox"]["tuned"]["values"] == {"fl.lr": 0.02, "method.mu": 0.01}
    assert summaries["fedprox"]["tuned"]["source"] == f"fedprox/{tuning.RESULTS}"
    assert summaries["fedprox"]["config"]["method"]["mu"] == 0.01
    run_dir = tmp_path / "run"
    refused = cli("method=krum", "debug=tiny", "logger=none", f"tuned={tmp_path / 'tuned'}", f"hydra.run.dir={run_dir}")
    assert refused.returncode == 2 and not run_dir.exists()
    assert refused.stderr.strip().splitlines()[-1].startswith("fedlnl-run: error: tuned=")
    assert "holds no tuned values for method krum (tuned methods there: fedavg, fedprox)" in refused.stderr


# ------------------------------------------------------------------------------ the tune sweep
def tune_cmd(root, *extra) -> list[str]:
    return ["-m", "experiment=tune", "method=fedavg", "debug=tiny", "tune.trials=2", "logger=none", "device=cpu",
            "hydra.launcher.n_jobs=1", f"tune.root={root}", *extra]


def test_a_tune_without_validation_is_refused_before_any_trial(tmp_path):
    extra = ["selection.val_share=0"] if has_validation() else []
    proc = cli(*tune_cmd(tmp_path / "r", *extra), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "fedlnl-run: error: selection.val_share=0: experiment=tune maximises the noisy-validation accuracy "
        "(selected_val_acc) and this config holds no validation set; set selection.val_share=0.1 (never the test set)")
    assert not (tmp_path / "r").exists() and not (tmp_path / "results").exists()


def tuning_sweeper():
    import types

    from fedlnl.benchmark.tune import TuningSweeperImpl

    sweeper = TuningSweeperImpl(sampler=None, direction="maximize", storage=None, study_name=None, n_trials=2,
                                n_jobs=1, max_failure_rate=0.0, search_space=None, custom_search_space=None, params=None)
    sweeper.hydra_context = types.SimpleNamespace(config_loader=None)
    return sweeper


def test_a_tune_runs_one_study_per_method_and_refuses_any_other_sweep():
    split = tuning_sweeper().split
    assert split(["experiment=tune", "method=fedavg,fedprox", "seed=2"]) == (
        [["method=fedavg"], ["method=fedprox"]], ["experiment=tune", "seed=2"])
    assert split(["experiment=tune", "method=fedavg"]) == ([[]], ["experiment=tune", "method=fedavg"])
    for args, message in ((["seed=0,1"], "seed=0,1 is a sweep: experiment=tune searches the declared spaces"),
                          (["tuned=x"], "tuned=x does not combine with experiment=tune")):
        with pytest.raises(ConfigError, match=message):
            split(["experiment=tune", *args])


@needs_validation
def test_a_fixed_value_of_a_searched_key_is_refused(tmp_path):
    proc = cli(*tune_cmd(tmp_path / "r", "fl.lr=0.1"), cwd=tmp_path)
    assert proc.returncode == 2 and "tune fedavg: fl.lr=0.1 sets a value the tune searches" in proc.stderr
    assert not (tmp_path / "r").exists()


#: run a tune in this process with the digits test labels permuted (the source debug=tiny loads)
PERMUTED = """
import dataclasses, sys, torch
import fedlnl.datasets.sources as sources
original = sources.digits
def digits(**kw):
    s = original(**kw)
    order = torch.randperm(len(s.y_test), generator=torch.Generator().manual_seed(7))
    return dataclasses.replace(s, y_test=s.y_test[order])
sources.digits = digits
from fedlnl.benchmark.run import main
sys.argv = ["fedlnl-run", *sys.argv[1:]]
main()
"""


def tune_result(root, method: str = "fedavg") -> dict:
    path = Path(root) / "quickstart-tiny" / method / tuning.RESULTS
    return OmegaConf.to_container(OmegaConf.load(path))


@needs_validation
def test_a_tiny_tune_writes_its_results_with_the_validation_objective(tmp_path):
    proc = cli(*tune_cmd(tmp_path / "r"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = tune_result(tmp_path / "r")
    assert res["objective"] == "selected_val_acc" and res["method"] == "fedavg" and res["trials"] == 2
    assert set(res["best_params"]) == {"fl.lr"} and 0.005 <= res["best_params"]["fl.lr"] <= 0.5
    assert (res["setting"]["rho"], res["setting"]["tau"], res["setting"]["seed"]) == (0.6, 0.5, 0)
    values = [h["value"] for h in res["history"]]
    assert len(values) == 2 and res["best_value"] == max(values)
    for h in res["history"]:  # each trial's value is its run's noisy-validation accuracy
        summary = json.loads((tmp_path / "r" / "quickstart-tiny" / "fedavg" / h["dir"] / "summary.json").read_text())
        assert h["value"] == summary["selected_val_acc"]
        assert summary["config"]["fl"]["lr"] == h["params"]["fl.lr"]
        assert "stage_last" not in h  # FedAvg names no stages
    assert "selected_before_last_stage" not in res


@needs_validation
@pytest.mark.parametrize("stage", ["any", "last"])
def test_a_tune_of_a_staged_method_records_where_each_trial_selected(tmp_path, stage):
    """Centralised JointOpt names its two steps ('training', 'retraining'): each trial records the
    stage of its selected round and of its last evaluation, read here from its own metrics.jsonl,
    and the study counts the trials that selected a round before the last stage (and says so).
    Under ``selection.stage=last`` (the default) none does: the objective is the second step's."""
    cmd = [a if a != "method=fedavg" else "method=jointopt_central" for a in tune_cmd(tmp_path / "r")]
    proc = cli(*cmd, *([f"selection.stage={stage}"] if stage == "any" else []), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = tune_result(tmp_path / "r", "jointopt_central")
    assert res["setting"]["selection_stage"] == stage  # the rule the objective was measured under
    early = 0
    for h in res["history"]:
        run = tmp_path / "r" / "quickstart-tiny" / "jointopt_central" / h["dir"]
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        selected = json.loads((run / "summary.json").read_text())["selected_round"]
        assert h["stage_last"] == rows[-1]["stage"] == "retraining"
        assert h["stage_selected"] == next(r["stage"] for r in rows if r["round"] == selected)
        early += h["stage_selected"] != "retraining"
    assert res["selected_before_last_stage"] == early and (early == 0 or stage == "any")
    assert (f"{early} of 2 trials selected a round of the 'training' stage, before the last ('retraining')"
            in proc.stderr) == (early > 0)


@needs_validation
def test_permuting_the_test_labels_changes_no_tuned_value(tmp_path):
    plain = cli(*tune_cmd(tmp_path / "a"), cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    permuted = subprocess.run([sys.executable, "-c", PERMUTED, *tune_cmd(tmp_path / "b")], cwd=tmp_path, env=ENV,
                              capture_output=True, text=True, timeout=600)
    assert permuted.returncode == 0, permuted.stderr[-3000:]
    a, b = tune_result(tmp_path / "a"), tune_result(tmp_path / "b")
    assert (a["best_params"], a["best_value"]) == (b["best_params"], b["best_value"])
    assert [h["value"] for h in a["history"]] == [h["value"] for h in b["history"]]
    # the permutation reached the runs: their test accuracy moved
    test_acc = lambda root, h: json.loads((Path(root) / "quickstart-tiny" / "fedavg" / h["dir"]  # noqa: E731
                                           / "summary.json").read_text())["best_acc"]
    assert [test_acc(tmp_path / "a", h) for h in a["history"]] != [test_acc(tmp_path / "b", h) for h in b["history"]]
