"""The local optimiser choice (``fl.optimizer``: sgd | adam): it reaches every method's local training,
Adam configs are accepted or refused in one line before training, and runs record it.

Parametrized over conf/method/*.yaml: a new method is covered as soon as its YAML exists.
"""
from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from conftest import build_method, compose_cfg, method_names, run_tiny
from fedlnl.benchmark.rundir import config_hash
from fedlnl.benchmark.validate import ConfigError
from fedlnl.methods.common import engine
from fedlnl.methods.common.protocol import Optim

NOISY = ["noise.rho=0.5", "noise.tau=0.5"]
ADAM = ["fl.optimizer=adam", "fl.betas=[0.8,0.97]", "fl.weight_decay=0.0001"]


def _spy(monkeypatch) -> list[tuple[str, dict]]:
    """Record (optimiser class, hyperparameters of its first group) at every optimiser step."""
    steps = []
    for cls in (torch.optim.SGD, torch.optim.Adam):
        real = cls.step

        def step(self, *args, _real=real, **kwargs):
            group = self.param_groups[0]
            steps.append((type(self).__name__, {k: group.get(k) for k in ("lr", "momentum", "betas", "weight_decay")}))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "step", step)
    return steps


@pytest.mark.parametrize("method", method_names())
def test_adam_reaches_the_local_training_of_every_method(tmp_path, method, monkeypatch):
    """With ``fl.optimizer=adam`` every local step of every stage is an Adam step with the typed betas
    (a method's own stage values may replace lr and weight decay, never the optimiser)."""
    steps = _spy(monkeypatch)
    s = run_tiny(tmp_path, [*NOISY, *ADAM], method)
    assert s["status"] == "complete", s
    names = {name for name, _ in steps}
    assert names == {"Adam"}, names
    assert {group["betas"] for _, group in steps} == {(0.8, 0.97)}
    assert s["effective"]["optimizer"] == "adam" and s["effective"]["momentum"] is None


def test_sgd_is_the_default_and_builds_the_optimiser_it_did():
    fl = build_method(compose_cfg(["method=fedavg"])).fl
    assert (fl.optimizer, fl.momentum, fl.betas) == ("sgd", 0.5, None)
    assert fl.optim() == Optim("sgd", lr=fl.lr, weight_decay=0.0, momentum=0.5)
    model = torch.nn.Linear(3, 2)
    opt = engine.optimizer(model, fl.optim(lr=0.2, momentum=0.9, betas=(0.5, 0.5)))  # betas: not SGD's, dropped
    assert type(opt) is torch.optim.SGD
    assert {k: opt.defaults[k] for k in ("lr", "momentum", "weight_decay", "nesterov", "dampening")} == {
        "lr": 0.2, "momentum": 0.9, "weight_decay": 0.0, "nesterov": False, "dampening": 0}
    adam = build_method(compose_cfg(["method=fedavg", *ADAM]), ADAM).fl
    opt = engine.optimizer(model, adam.optim(lr=0.01, momentum=0.9))  # momentum: not Adam's, dropped
    assert type(opt) is torch.optim.Adam
    assert (opt.defaults["lr"], opt.defaults["betas"], opt.defaults["weight_decay"]) == (0.01, (0.8, 0.97), 1e-4)
    with pytest.raises(TypeError, match="no optimiser value 'eps'"):
        adam.optim(eps=1e-6)


@pytest.mark.parametrize("overrides", [
    ["fl.optimizer=adam"], ["fl.optimizer=adam", "fl.betas=[0.5,0.9]", "fl.lr=0.001", "fl.weight_decay=0.01"],
    ["fl.optimizer=sgd", "fl.momentum=0.9"], ["fl.optimizer=adam", "fl.momentum=null"],
    ["method=fednoro", "fidelity=reference", "method.betas=[0.5,0.9]"],
    ["method=fednoro", "fidelity=reference", "method.optimizer=sgd", "fl.momentum=0.9"],
])
def test_adam_and_sgd_configs_accepted(overrides):
    method = build_method(compose_cfg(overrides), overrides)
    typed = dict(o.split("=", 1) for o in overrides)
    fl = method.fl
    default = "adam" if "fidelity=reference" in overrides else "sgd"
    want = typed.get("method.optimizer", typed.get("fl.optimizer", default))
    assert fl.optimizer == want
    assert (fl.momentum is None) == (want == "adam") and (fl.betas is None) == (want == "sgd")
    if "fl.betas" in typed or "method.betas" in typed:
        assert fl.betas == (0.5, 0.9)


@pytest.mark.parametrize("overrides, message", [
    (["fl.optimizer=adamw"], "fl.optimizer='adamw' is invalid: allowed sgd, adam"),
    (["fl.optimizer=null"], "fl.optimizer=None is invalid: allowed sgd, adam"),
    (["fl.optimizer=adam", "fl.betas=[0.9,1.0]"],
     "fl.betas=[0.9, 1.0] is invalid: allowed a pair [β1, β2] of numbers in [0, 1)"),
    (["fl.optimizer=adam", "fl.betas=[0.9]"], "fl.betas=[0.9] is invalid"),
    (["fl.optimizer=adam", "fl.betas=0.9"], "fl.betas=0.9 is invalid"),
    (["fl.optimizer=adam", "fl.betas=null"], "fl.betas=None is invalid"),
    (["fl.optimizer=adam", "fl.betas=[true,0.9]"], "fl.betas=[True, 0.9] is invalid"),
    (["fl.momentum=null"], "fl.momentum=None is invalid: allowed a momentum in [0, 1)"),
    (["fl.optimizer=adam", "fl.momentum=0.9"],
     "fl.momentum=0.9 does not apply to fl.optimizer=adam: adam reads betas, not momentum"),
    (["fl.betas=[0.9,0.99]"], "fl.betas=[0.9,0.99] does not apply to fl.optimizer=sgd: sgd reads momentum, not betas"),
    (["method=fednoro", "fidelity=reference", "fl.momentum=0.9"],
     "fl.momentum=0.9 does not apply to method.optimizer=adam (FedNoRo on digits, conf/method/fednoro.yaml)"),
    (["method=fednoro", "fidelity=reference", "fl.optimizer=sgd"],
     "fl.optimizer=sgd is shadowed by method.optimizer=adam"),
    (["method=fednoro", "fidelity=reference", "method.optimizer=adamw"],
     "method.optimizer='adamw' is invalid: allowed sgd, adam"),
    (["method=fedcorr_fedprox", "fl.optimizer=adam", "fl.momentum=0.9"],
     "fl.momentum=0.9 does not apply to fl.optimizer=adam"),
])
def test_bad_optimizer_configs_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        build_method(compose_cfg(overrides), overrides)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_a_refused_optimizer_key_exits_2_before_training(tmp_path):
    from test_robustness import assert_refused, cli

    assert_refused(cli(["fl.optimizer=adam", "fl.momentum=0.9", "debug=tiny", "logger=none", "device=cpu"], tmp_path),
                   "fl.momentum=0.9 does not apply to fl.optimizer=adam", tmp_path)


def test_the_optimizer_is_in_effective_and_in_the_config_hash(tmp_path):
    sgd, adam = compose_cfg(["method=fedavg"]), compose_cfg(["method=fedavg", "fl.optimizer=adam"])
    hashes = {config_hash(OmegaConf.to_container(c, resolve=True)) for c in (sgd, adam)}
    assert len(hashes) == 2
    other_betas = compose_cfg(["method=fedavg", "fl.optimizer=adam", "fl.betas=[0.5,0.9]"])
    assert config_hash(OmegaConf.to_container(other_betas, resolve=True)) not in hashes
    run_tiny(tmp_path, ["fl.optimizer=adam"], "fedavg")
    s = json.loads((tmp_path / "summary.json").read_text())
    assert {k: s["effective"][k] for k in ("optimizer", "lr", "momentum", "betas", "weight_decay")} == {
        "optimizer": "adam", "lr": 0.05, "momentum": None, "betas": [0.9, 0.999], "weight_decay": 0.0}
    assert s["config"]["fl"]["optimizer"] == "adam"
    assert s["config_hash"] == config_hash(OmegaConf.to_container(compose_cfg(
        ["method=fedavg", "debug=tiny", "logger=none", "device=cpu", "fl.optimizer=adam"]), resolve=True))
