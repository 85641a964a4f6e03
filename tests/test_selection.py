"""Model selection on the clients' noisy validation sets and per-client accuracy (``selection``):
the rule and the statistics in closed form, the validation split and the local test sets, what the
methods see, that no test label chooses the round, resume, and the legacy config hash."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose_cfg, crash_after, rows_of, run_tiny

NOISY = ["noise.rho_tau=[0.6,0.5]"]
#: the federation digest of debug=tiny at (0.6, 0.5), seed 0, computed by the code before validation
#: sets existed (commit 1406912): selection.val_share=0 must keep it
DIGEST_BEFORE = "d43075ced1f581811bf8ac47ac6fc278"
SELECTION_KEYS = ("selected_acc", "selected_round", "selected_val_acc", "reported_round", "client_acc_mean",
                  "client_acc_worst10", "client_gap", "clients")


# ------------------------------------------------------------------------------ the rule, closed form
ROWS = [
    {"round": 1, "acc": 0.50, "val_acc": 0.30},
    {"round": 2, "acc": None, "val_acc": 0.90},  # diverged: never selected, whatever its val_acc
    {"round": 3, "acc": 0.40, "val_acc": 0.60},
    {"round": 4, "acc": 0.70, "val_acc": 0.60},  # ties round 3: the earlier one stays
    {"round": 5, "acc": 0.80, "val_acc": float("nan")},
    {"round": 6, "acc": 0.80, "val_acc": 0.10},  # ties round 5's best test accuracy
]


def test_selection_rule_takes_the_earliest_best_validation_row_and_skips_diverged_ones():
    from fedlnl.benchmark.selection import Reported, best_row, selection_summary

    for stage in ("last", "any"):  # rows that name no stage: one rule
        assert selection_summary(ROWS, True, stage) == {"selected_acc": 0.40, "selected_round": 3, "selected_val_acc": 0.60}
        assert selection_summary(ROWS, False, stage) == dict.fromkeys(("selected_acc", "selected_round", "selected_val_acc"))
        assert selection_summary(ROWS[1:2], True, stage)["selected_round"] is None  # only a diverged row
    assert best_row(ROWS, "acc")["round"] == 5
    for key, want in (("val_acc", 3), ("acc", 5)):  # the running state agrees with the rule on the rows
        rep = Reported(key)
        for row in ROWS:
            rep.offer(row, [row["round"] / 10])
        assert (rep.round, rep.acc) == (want, [want / 10])


#: a two-stage run: the warm-up's round 2 has the best validation accuracy; round 5 diverged in the
#: training stage, round 6 did not (so the last stage is 'training'); a row without acc is no evaluation
STAGED = [
    {"round": 1, "acc": 0.30, "val_acc": 0.20, "stage": "warmup"},
    {"round": 2, "acc": 0.50, "val_acc": 0.70, "stage": "warmup"},
    {"round": 3, "acc": 0.45, "val_acc": 0.40, "stage": "training"},
    {"round": 4, "acc": 0.60, "val_acc": 0.55, "stage": "training"},
    {"round": 5, "acc": None, "val_acc": 0.90, "stage": "training"},
    {"round": 6, "acc": 0.58, "val_acc": 0.55, "stage": "training"},  # ties round 4: the earlier stays
]


def test_the_last_stage_rule_chooses_among_the_last_stages_evaluations_only():
    from fedlnl.benchmark.selection import Reported, choosable, final_stage, selection_summary

    assert final_stage(STAGED) == "training" and final_stage(STAGED[:2]) == "warmup" and final_stage(ROWS) is None
    assert final_stage(STAGED[:5]) == "training"  # round 5 diverged: round 4's stage
    assert [r["round"] for r in choosable(STAGED, "last")] == [3, 4, 5, 6]
    assert choosable(STAGED, "any") == STAGED and choosable(ROWS, "last") == ROWS
    assert selection_summary(STAGED, True, "any") == {"selected_acc": 0.50, "selected_round": 2, "selected_val_acc": 0.70}
    assert selection_summary(STAGED, True, "last") == {"selected_acc": 0.60, "selected_round": 4, "selected_val_acc": 0.55}
    assert selection_summary(STAGED[:2], True, "last")["selected_round"] == 2  # stopped in the warm-up: its rows
    for last_stage, want in ((False, 2), (True, 4)):  # the running state agrees with the rule on the rows
        rep = Reported("val_acc", last_stage=last_stage)
        for row in STAGED:
            rep.offer(row, [row["round"] / 10])
        assert (rep.round, rep.acc) == (want, [want / 10])


def test_the_last_stage_state_survives_a_resume_in_every_round():
    from fedlnl.benchmark.selection import Reported

    for cut in range(len(STAGED) + 1):
        first = Reported("val_acc", last_stage=True)
        for row in STAGED[:cut]:
            first.offer(row, [row["round"] / 10])
        resumed = Reported("val_acc", last_stage=True)
        resumed.load(first.state())
        for row in STAGED[cut:]:
            resumed.offer(row, [row["round"] / 10])
        assert (resumed.round, resumed.score, resumed.stage) == (4, 0.55, "training"), cut


def test_a_staged_run_reports_its_last_stages_round_unless_told_any(tmp_path):
    """Centralised JointOpt at debug=tiny: its best validation accuracy lies in the first step
    ('training', round 3); under the default ``last`` the selection, the reported round of the client
    figures and the summary all take the second step's ('retraining', round 4). Training is the same."""
    last = run_tiny(tmp_path / "last", NOISY, "jointopt_central")
    anyr = run_tiny(tmp_path / "any", [*NOISY, "selection.stage=any"], "jointopt_central")
    rows = rows_of(tmp_path / "last")
    assert rows == rows_of(tmp_path / "any")
    stage = {r["round"]: r["stage"] for r in rows if r.get("acc") is not None}
    assert stage[anyr["selected_round"]] == "training" and stage[last["selected_round"]] == "retraining"
    for s in (last, anyr):
        row = next(r for r in rows if r["round"] == s["selected_round"])
        assert (s["selected_acc"], s["selected_val_acc"], s["reported_round"]) == (row["acc"], row["val_acc"], row["round"])
    assert (last["selection"]["stage"], anyr["selection"]["stage"]) == ("last", "any")


def test_client_statistics_in_closed_form():
    from fedlnl.benchmark.selection import client_stats

    acc = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 1.0]
    noisy = [False] * 5 + [True] * 5 + [False]
    s = client_stats(acc, noisy)
    assert s["client_acc_mean"] == pytest.approx(5.5 / 11)
    assert s["client_acc_worst10"] == pytest.approx(0.05)  # ceil(11 / 10) = 2 worst: 0.0 and 0.1
    assert s["client_gap"] == pytest.approx(4.5 / 6 - 1.0 / 5)  # clean {.9 .8 .7 .6 .5 1} - noisy {.4 .3 .2 .1 0}
    thirty = client_stats([k / 30 for k in range(30)], [False] * 30)  # 0.1 * 30 > 3 in floats: still 3 clients
    assert thirty["client_acc_worst10"] == pytest.approx((0 + 1 + 2) / 90) and thirty["client_gap"] is None
    assert client_stats(None, noisy) == dict.fromkeys(("client_acc_mean", "client_acc_worst10", "client_gap"))


# ------------------------------------------------------------------------------ the federation
def test_hold_out_sizes_are_half_up_rounded_and_leave_a_training_sample():
    from fedlnl.datasets.federation import hold_out

    clients = [np.arange(s, dtype=np.int64) + 100 * k for k, s in enumerate((10, 15, 1, 4, 25))]
    train, val = hold_out(clients, 0.1, np.random.default_rng(0))
    assert [len(v) for v in val] == [1, 2, 0, 0, 3]  # 1.0, 1.5 -> 2, 0.1 -> 0, 0.4 -> 0, 2.5 -> 3
    for ix, t, v in zip(clients, train, val):
        assert not set(t) & set(v) and sorted([*t, *v]) == list(ix) and list(v) == sorted(v)
    _, val = hold_out(clients, 0.9, np.random.default_rng(0))
    assert [len(v) for v in val] == [9, 14, 0, 3, 23]  # 22.5 -> 23; 0.9 -> 1 and 3.6 -> 4 capped at n_k - 1
    same, none = hold_out(clients, 0.0, np.random.default_rng(0))
    assert same is clients and all(len(v) == 0 for v in none)


def test_local_test_sets_follow_the_class_mix_by_largest_remainder():
    from fedlnl.datasets.federation import largest_remainder, local_test_sets

    assert largest_remainder(np.array([1, 1, 1]), 10).tolist() == [4, 3, 3]
    assert largest_remainder(np.array([2, 1, 0]), 4).tolist() == [3, 1, 0]  # 8/3, 4/3: the larger remainder
    y_test = np.array([0] * 5 + [1] * 20 + [2] * 3)
    labels = np.array([0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    clients = [np.arange(10), np.array([2, 3])]
    tests = local_test_sets(labels, clients, y_test, 4, 12, np.random.default_rng(0))
    first, second = tests
    # client 0: proportions (2, 4, 4)/10 of 12 -> (2.4, 4.8, 4.8) -> (2, 5, 5); class 3 is absent
    assert np.bincount(y_test[first], minlength=4).tolist() == [2, 5, 5, 0]
    assert len(set(first[y_test[first] == 1])) == 5  # 20 images of class 1: drawn without replacement
    assert set(first[y_test[first] == 2]) <= {25, 26, 27}  # 3 images for 5 draws: with replacement
    assert np.bincount(y_test[second], minlength=4).tolist() == [0, 12, 0, 0] and len(set(second)) == 12


def test_local_test_sets_read_clean_labels_where_known_else_the_observed_ones():
    from fedlnl.datasets.federation import Source, _build

    observed = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    clean = torch.tensor([1, 1, 0, 0, -1, -1, -1, -1])  # -1: unknown (Clothing1M) -> the observed label
    y_test = torch.tensor([0] * 5 + [1] * 5 + [2] * 5)
    src = Source("synthetic", torch.zeros(8, 1, 2, 2, dtype=torch.uint8), observed,
                 torch.zeros(15, 1, 2, 2, dtype=torch.uint8), y_test, 3, (0.5,), (0.5,), y_train_clean=clean)
    fed = _build(src, {"kind": "iid"}, {"kind": "symmetric", "rho": 0.0, "tau": 0.0}, 1, 0, 0.0, 8)
    # mix (2, 4, 2): clean 1 1 0 0, then observed 1 1 2 2 (observed alone would be 4 2 2)
    assert np.bincount(y_test.numpy()[fed.client_test[0]], minlength=3).tolist() == [2, 4, 2]


def _tiny_federation(val_share: float, method: str = "fedavg"):
    from fedlnl.benchmark import preflight
    from fedlnl.datasets.federation import clear_cache

    clear_cache()  # built afresh, not the memoised object of another call
    cfg = compose_cfg([f"method={method}", "debug=tiny", "device=cpu", *NOISY, f"selection.val_share={val_share}"])
    return preflight.build_cell(cfg, preflight.check_cell(cfg, {}), "cnn").fed


def test_validation_split_is_part_of_the_federation_and_its_hash():
    before, fed = _tiny_federation(0), _tiny_federation(0.1)
    assert before.hash == DIGEST_BEFORE and fed.hash != DIGEST_BEFORE
    assert before.val_sizes == (0,) * 6 and _tiny_federation(0.0).hash == DIGEST_BEFORE
    for k, (all_k, train, val) in enumerate(zip(before.client_indices, fed.client_indices, fed.client_val)):
        assert len(val) == math.floor(0.1 * len(all_k) + 0.5)
        assert not set(train) & set(val) and sorted([*train, *val]) == list(all_k)
    assert torch.equal(fed.labels, before.labels)  # the same noisy labels; validation labels are observed ones
    assert fed.client_sizes == tuple(len(ix) for ix in fed.client_indices)  # what a method is told: training
    other = _tiny_federation(0.1, "jointopt_central")  # another method, the same seed: the same split
    assert other.hash == fed.hash and all(np.array_equal(a, b) for a, b in zip(other.client_val, fed.client_val))
    assert all(np.array_equal(a, b) for a, b in zip(other.client_test, fed.client_test))


# ------------------------------------------------------------------------------ runs
@pytest.mark.parametrize("method", ["fedavg", "jointopt_central"])
def test_no_client_view_holds_a_validation_sample(tmp_path, monkeypatch, method):
    from fedlnl.benchmark import runner as runmod

    seen: list[set] = []
    real = runmod.Runner.view

    def spy(self, k):
        view = real(self, k)
        seen.append(set(view.indices.tolist()))
        return view

    monkeypatch.setattr(runmod.Runner, "view", spy)
    s = run_tiny(tmp_path, NOISY, method)
    fed = _tiny_federation(0.1)
    val = set(np.concatenate(fed.client_val).tolist())
    train = set(np.concatenate(fed.client_indices).tolist())
    assert s["federation_hash"] == fed.hash and seen and len(val) == s["selection"]["val_samples"] > 0
    assert all(not v & val for v in seen)
    if method == "jointopt_central":  # the pooled view: every training sample, no validation one
        assert seen[0] == train


def test_rows_summary_and_bytes_with_and_without_validation(tmp_path):
    s = run_tiny(tmp_path / "v", [*NOISY, "selection.client_every_eval=true"])
    rows = rows_of(tmp_path / "v")
    assert all(set(r) >= {"val_acc", "client_acc_mean", "client_acc_worst10", "client_gap"} for r in rows)
    best = max(rows, key=lambda r: (r["val_acc"], -r["round"]))
    assert (s["selected_round"], s["selected_acc"], s["selected_val_acc"]) == (best["round"], best["acc"], best["val_acc"])
    assert s["reported_round"] == s["selected_round"] and s["selection"]["selected_by"] == "val_acc"
    assert s["client_acc_mean"] == best["client_acc_mean"] and s["client_gap"] == best["client_gap"]
    clients = s["clients"]
    assert len(clients["acc"]) == len(clients["noise_rate"]) == len(clients["noisy"]) == 6
    assert s["client_acc_mean"] == pytest.approx(np.mean(clients["acc"]))
    assert s["client_acc_worst10"] == min(clients["acc"])  # ceil(6 / 10) = 1 client

    p = run_tiny(tmp_path / "p", [*NOISY, "selection.val_share=0"])
    rows0 = rows_of(tmp_path / "p")
    assert not any(set(r) & {"val_acc", "client_acc_mean"} for r in rows0)
    assert (p["selected_acc"], p["selected_round"], p["selected_val_acc"]) == (None, None, None)
    first_best = next(r["round"] for r in rows0 if r["acc"] == p["best_acc"])
    assert p["reported_round"] == first_best and p["selection"]["selected_by"] == "acc"
    # every evaluation, each of the 6 clients reports two int64 counts: 16 bytes (3 evaluations)
    assert s["bytes_up"] - p["bytes_up"] == 3 * 6 * 16 and s["comm_cost"] == p["comm_cost"]


def test_permuting_the_test_labels_changes_no_selected_round(tmp_path, monkeypatch):
    from fedlnl.benchmark import runner as runmod

    over = [*NOISY, "fl.rounds=6"]
    plain = run_tiny(tmp_path / "a", over)
    real = runmod.Runner.prepare

    def permuted(self):
        real(self)
        self.test_labels = self.test_labels[torch.randperm(len(self.test_labels), generator=torch.Generator().manual_seed(1))]

    monkeypatch.setattr(runmod.Runner, "prepare", permuted)
    other = run_tiny(tmp_path / "b", over)
    assert [r["acc"] for r in rows_of(tmp_path / "a")] != [r["acc"] for r in rows_of(tmp_path / "b")]
    assert [r["val_acc"] for r in rows_of(tmp_path / "a")] == [r["val_acc"] for r in rows_of(tmp_path / "b")]
    assert (other["selected_round"], other["selected_val_acc"]) == (plain["selected_round"], plain["selected_val_acc"])
    assert other["reported_round"] == plain["reported_round"] is not None


def test_a_resumed_run_keeps_its_selection_and_client_figures(tmp_path, monkeypatch):
    from fedlnl.benchmark import runner as runmod

    cfg = compose_cfg(["method=fedavg", "debug=tiny", "logger=none", "device=cpu", *NOISY, "fl.rounds=6",
                       "checkpoint_every=2", "selection.client_every_eval=true"])
    straight = runmod.run(cfg, tmp_path / "straight", "fedavg")
    restore = crash_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        runmod.run(cfg, tmp_path / "resumed", "fedavg")
    restore()
    saved = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)
    assert saved["round"] + 1 == 4 and saved["selection"]["round"] <= 4 and len(saved["selection"]["acc"]) == 6
    resumed = runmod.run(cfg, tmp_path / "resumed", "fedavg")
    assert (tmp_path / "resumed" / "metrics.jsonl").read_bytes() == (tmp_path / "straight" / "metrics.jsonl").read_bytes()
    assert {k: resumed[k] for k in SELECTION_KEYS} == {k: straight[k] for k in SELECTION_KEYS}
    assert straight["selected_round"] is not None and straight["clients"]["acc"] is not None


def test_a_checkpoint_without_the_client_state_reports_no_client_figures(tmp_path, monkeypatch):
    """A checkpoint written before per-client figures were kept: the selection comes from the rows, the
    client figures of the rounds before it are unknown, so none is reported rather than a wrong one."""
    from fedlnl.benchmark import runner as runmod

    cfg = compose_cfg(["method=fedavg", "debug=tiny", "logger=none", "device=cpu", *NOISY, "fl.rounds=4",
                       "checkpoint_every=2"])
    restore = crash_after(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        runmod.run(cfg, tmp_path, "fedavg")
    restore()
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    del ck["selection"]
    torch.save(ck, tmp_path / "checkpoint.pt")
    s = runmod.run(cfg, tmp_path, "fedavg")
    assert s["status"] == "complete" and s["selected_round"] is not None
    assert s["reported_round"] is None and s["client_acc_mean"] is None and s["clients"]["acc"] is None


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize("override, allowed", [
    ("selection.val_share=1", "a share in [0, 1)"), ("selection.val_share=-0.1", "a share in [0, 1)"),
    ("selection.client_test_size=0", "an integer >= 1"), ("selection.client_every_eval=1", "true or false"),
    ("selection.stage=1", "last, any"),
])
def test_bad_selection_values_are_one_line_errors(override, allowed):
    from fedlnl.benchmark import preflight
    from fedlnl.benchmark.validate import ConfigError

    with pytest.raises(ConfigError) as err:
        preflight.check_cell(compose_cfg(["debug=tiny", override]), {})
    assert str(err.value).startswith(f"{override} is invalid: allowed {allowed}") and "\n" not in str(err.value)


def test_an_unknown_stage_rule_is_a_one_line_error():
    from fedlnl.benchmark import preflight
    from fedlnl.benchmark.validate import ConfigError

    with pytest.raises(ConfigError) as err:
        preflight.check_cell(compose_cfg(["debug=tiny", "selection.stage=first"]), {})
    assert str(err.value) == "selection.stage='first' is invalid: allowed last, any"


def _hash(overrides, drop=False):
    from fedlnl.benchmark.rundir import config_hash

    resolved = OmegaConf.to_container(compose_cfg(overrides), resolve=True)
    if drop:  # a config of before the node existed
        del resolved["selection"]
    return config_hash(resolved)


def test_the_papers_protocol_keeps_the_config_hash_of_before_the_selection_node():
    preset = ["paper=fedcorr_t2", "method=fedavg", "noise.rho_tau=[0.6,0.5]", "seed=0"]
    assert compose_cfg(preset).selection.val_share == 0
    assert _hash(preset) == _hash(preset, drop=True) == _hash([*preset, "selection.val_share=0.0"])
    for other in ("selection.val_share=0.1", "selection.client_test_size=100", "selection.client_every_eval=true"):
        assert _hash([*preset, other]) != _hash(preset), other
    plain = ["method=fedavg"]  # the suite's default selects on validation: a configuration of its own
    assert compose_cfg(plain).selection.val_share == 0.1 and _hash(plain) != _hash(plain, drop=True)


def _hash_without_stage(overrides):
    from fedlnl.benchmark.rundir import config_hash

    resolved = OmegaConf.to_container(compose_cfg(overrides), resolve=True)
    del resolved["selection"]["stage"]  # a config of before the key existed
    return config_hash(resolved)


def test_the_stage_rule_of_before_the_key_keeps_its_hash_and_is_inert_without_validation():
    plain = ["method=feddiv", "noise.rho_tau=[0.6,0.5]"]
    assert compose_cfg(plain).selection.stage == "last"  # the default: a configuration of its own
    assert _hash([*plain, "selection.stage=any"]) == _hash_without_stage(plain) != _hash(plain)
    preset = ["paper=feddiv_t1", "method=feddiv", "noise.rho_tau=[0.6,0.5]", "seed=0"]
    assert compose_cfg(preset).selection.val_share == 0  # no validation set: the rule cannot act
    assert _hash(preset) == _hash([*preset, "selection.stage=any"]) == _hash(preset, drop=True)


def test_legacy_values_compare_nodes_key_by_key_and_booleans_by_identity():
    from fedlnl.benchmark.rundir import is_legacy

    legacy = {"val_share": 0, "client_test_size": 500, "client_every_eval": False}
    assert is_legacy({"val_share": 0.0, "client_test_size": 500, "client_every_eval": False}, legacy)
    assert not is_legacy({"val_share": 0, "client_test_size": 500, "client_every_eval": 0}, legacy)
    assert not is_legacy({"val_share": False, "client_test_size": 500, "client_every_eval": False}, legacy)
    assert not is_legacy({"val_share": 0, "client_test_size": 500}, legacy)
    assert is_legacy(False, False) and not is_legacy(0, False)
