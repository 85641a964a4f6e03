"""The checks vocabulary (fedlnl/conf/checks.py) and the methods' parameter objects (methods/common/params.py)."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
from conftest import build_method, compose_cfg, method_names

from fedlnl.conf import checks
from fedlnl.conf.checks import ConfigError
from fedlnl.methods.common.params import Method


@pytest.mark.parametrize("call, message", [
    (lambda: checks.integer("a.k", True, 1), "a.k=True is invalid: allowed an integer >= 1"),
    (lambda: checks.integer("a.k", 0, 1), "a.k=0 is invalid: allowed an integer >= 1"),
    (lambda: checks.integer("a.k", 1.0, 1, optional=True), "a.k=1.0 is invalid: allowed null or an integer >= 1"),
    (lambda: checks.number("a.x", float("inf"), lambda v: v > 0, "a number > 0"), "a.x=inf is invalid"),
    (lambda: checks.unit("a.p", 1.5), "a.p=1.5 is invalid: allowed a number in [0, 1]"),
    (lambda: checks.unit("a.p", None), "a.p=None is invalid"),
    (lambda: checks.positive("a.t", 0), "a.t=0 is invalid: allowed a number > 0"),
    (lambda: checks.flag("a.b", 1), "a.b=1 is invalid: allowed true or false"),
    (lambda: checks.choice("a.c", "z", ("x", "y")), "a.c='z' is invalid: allowed x, y"),
    (lambda: checks.choice("a.c", 1, ("1", "2"), text=True), "a.c=1 is invalid: allowed 1, 2"),
    (lambda: checks.number("a.r", "nois", lambda v: v < 1, "a share or noise", word="noise"), "a.r='nois' is invalid"),
])
def test_a_bad_value_is_one_line_naming_key_value_and_allowed(call, message):
    with pytest.raises(ConfigError) as err:
        call()
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_good_values_pass():
    checks.integer("k", 3, 1)
    checks.integer("k", None, 1, optional=True)
    checks.unit("p", 0.0)
    checks.unit("p", None, optional=True)
    checks.number("r", "noise", lambda v: 0 <= v < 1, "a share or noise", word="noise")
    checks.flag("b", False)
    assert checks.choice("c", "y", ("x", "y")) == "y"
    assert checks.rule(checks.integer, 1)("k", 2) is None


@pytest.mark.parametrize("name", method_names())
def test_every_key_of_a_method_yaml_is_one_documented_field(name):
    """The YAML's own keys (after the fl pins) are exactly the Params fields, each with a one-line doc
    and a rule (or a check of the whole object), the signature the composer reads is fl + the fields,
    and the object is frozen."""
    method = build_method(compose_cfg([f"method={name}"]))
    cls = type(method)
    assert isinstance(method, Method)
    fields = dataclasses.fields(cls.Params)
    assert list(inspect.signature(cls).parameters) == ["fl"] + [f.name for f in fields]
    for f in fields:
        doc = f.metadata.get("doc", "")
        assert doc and "\n" not in doc, f"{cls.__name__}.{f.name} has no one-line doc"
        # FedCorr's stage3 (a nested method) is checked by FedCorrParams.check
        assert f.metadata.get("check") is not None or f.name == "stage3", f"{cls.__name__}.{f.name} has no rule"
        assert getattr(method, f.name) is getattr(method.params, f.name)
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(method.params, fields[0].name, None)
        with pytest.raises(AttributeError):
            setattr(method, fields[0].name, None)


def test_a_field_named_like_a_class_attribute_is_refused():
    @dataclasses.dataclass(frozen=True)
    class P(Method.Params):
        family: int = 1

    with pytest.raises(TypeError, match="both a hyperparameter and a class attribute"):
        type("M", (Method,), {"family": "x", "Params": P})
