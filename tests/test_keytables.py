"""One typed declaration per config key: every key of the shipped config is declared (type, check,
doc), the validator walks those declarations, and docs/configuration.md's key tables are generated
from them."""
from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from conftest import CONF, REPO, compose_cfg
from fedlnl.benchmark import keytables
from fedlnl.benchmark.runkeys import Federation, Logger, RunKeys, Tune
from fedlnl.benchmark.validate import NODES
from fedlnl.conf.checks import ConfigError, allowed, check_node, integer, key, rule
from fedlnl.datasets import kinds
from fedlnl.methods.common.protocol import FL_FIELDS, FLSettings


def names(*decls) -> set[str]:
    return {f.name for d in decls for f in dataclasses.fields(d)}


def test_the_docs_key_tables_are_the_generated_ones():
    block = keytables.block_of((REPO / "docs" / "configuration.md").read_text())
    assert block is not None, "docs/configuration.md has no key-table markers"
    assert block == keytables.generate(), \
        "stale key tables: run python -m fedlnl.benchmark.keytables docs/configuration.md"


def test_every_shipped_key_is_declared_once():
    cfg = compose_cfg([])
    groups = {"model", "dataset", "partition", "noise", "method", "fl", "logger", "selection", "hydra"}
    assert set(cfg) - groups == names(RunKeys)  # every top-level run key, and nothing undeclared
    assert set(OmegaConf.load(CONF / "fl" / "default.yaml")) == names(Federation, FLSettings)
    assert not names(Federation) & names(FLSettings)  # one declaration per fl key
    assert FL_FIELDS == tuple(f.name for f in dataclasses.fields(FLSettings))
    for path in (CONF / "logger").glob("*.yaml"):
        assert set(OmegaConf.load(path)) <= names(Logger), path.name
    assert set(OmegaConf.load(CONF / "tuning" / "optuna.yaml")["tune"]) == names(Tune)


@pytest.mark.parametrize("decl", [d for _, d in NODES] + [k.options for k in kinds.partitions().values()]
                         + [k.options for k in kinds.noises().values()], ids=lambda d: d.__name__)
def test_every_declared_key_has_a_type_a_check_and_a_doc(decl):
    for f in dataclasses.fields(decl):
        assert f.type and f.metadata["doc"], f.name
        if f.name != "kind":  # checked against the registry before the options
            assert f.metadata["check"] is not None and allowed(f.metadata["check"]) != "anything", f.name


@dataclasses.dataclass(frozen=True)
class _Toy:
    n: int = key("a count", rule(integer, 1), required=True)
    m: int = key("read only with n 2", rule(integer, 0), read_if=lambda node: node.get("n") == 2)

    @staticmethod
    def relations(node, prefix):
        if node.get("m", 0) > node["n"]:
            raise ConfigError(f"{prefix}m={node['m']} exceeds {prefix}n={node['n']}")


@pytest.mark.parametrize("node,message", [
    ({"n": 3}, None),
    ({}, "toy.n=None is invalid: allowed an integer >= 1"),  # required: absent is refused
    ({"n": 0}, "toy.n=0 is invalid: allowed an integer >= 1"),
    ({"n": 3, "m": -1}, None),  # m is not read with n 3: not checked
    ({"n": 2, "m": -1}, "toy.m=-1 is invalid: allowed an integer >= 0"),
    ({"n": 2, "m": 5}, "toy.m=5 exceeds toy.n=2"),  # the relation, after the keys
    ({"n": 3, "z": 1}, "toy.z=1 is invalid: allowed the keys of toy: n, m"),  # closed
])
def test_the_generic_walk(node, message):
    if message is None:
        check_node(_Toy, node, "toy.", closed="toy")
        return
    with pytest.raises(ConfigError) as err:
        check_node(_Toy, node, "toy.", closed="toy")
    assert str(err.value) == message


def test_allowed_is_the_text_of_the_error():
    assert allowed(rule(integer, 1)) == "an integer >= 1"
    assert allowed(dataclasses.fields(FLSettings)[0].metadata["check"]) == "a fraction in (0, 1]"
