"""docs/adding-a-method.md's example, built from the guide's own code blocks, passes the checks
``make test`` runs on every method: so the guide states what a new method must do, and its example
does it.

The blocks after a line that names a file (`` `fedlnl/methods/<name>.py` ``, `` `fedlnl/conf/method/<name>.yaml` ``)
are written to a scratch package and config directory (the package joins ``fedlnl.methods``' search
path, the directory Hydra's), the ``markdown`` block holding the §23 table is read as the methods
docs' table, and the per-method tests of tests/test_methods_e2e.py, test_tuning.py, test_config.py
and test_methods_doc.py run on the example as they run on a shipped method.
"""
from __future__ import annotations

import re
import sys

import pytest

import conftest
import test_config
import test_methods_doc
import test_methods_e2e
import test_tuning
from conftest import REPO

GUIDE = REPO / "docs" / "adding-a-method.md"
#: a line naming a file in backticks, a blank line, then the fenced block with its content
FILE_BLOCK = re.compile(r"^`(?P<path>fedlnl/[\w/.]+)`[^\n]*\n\n```\w*\n(?P<body>.*?)^```", re.M | re.S)
TABLE_BLOCK = re.compile(r"^```markdown\n(?P<body>### §23\..*?)^```", re.M | re.S)


def guide_example() -> tuple[dict[str, str], str]:
    """({repo path: content} of the guide's file blocks, the text of its §23 table block)."""
    text = GUIDE.read_text(encoding="utf-8")
    files = {m["path"]: m["body"] for m in FILE_BLOCK.finditer(text)}
    table = TABLE_BLOCK.search(text)
    assert table is not None, "the guide shows no §23 table block"
    return files, table["body"]


@pytest.fixture
def example(tmp_path, monkeypatch):
    """The guide's method installed in a scratch package and config dir; its name."""
    import fedlnl.methods

    files, _ = guide_example()
    modules = [p for p in files if p.startswith("fedlnl/methods/") and p.endswith(".py")]
    yamls = [p for p in files if p.startswith("fedlnl/conf/method/") and p.endswith(".yaml")]
    assert len(modules) == 1 and len(yamls) == 1, sorted(files)
    name = yamls[0].rsplit("/", 1)[1][:-len(".yaml")]
    assert not (conftest.CONF / "method" / f"{name}.yaml").exists(), f"the example {name} is a shipped method"
    pkg, conf = tmp_path / "pkg", tmp_path / "conf"
    (pkg).mkdir()
    (conf / "method").mkdir(parents=True)
    (pkg / modules[0].rsplit("/", 1)[1]).write_text(files[modules[0]], encoding="utf-8")
    (conf / "method" / f"{name}.yaml").write_text(files[yamls[0]], encoding="utf-8")
    monkeypatch.setattr(fedlnl.methods, "__path__", [*fedlnl.methods.__path__, str(pkg)])
    real = conftest.compose_cfg

    def compose_cfg(overrides):
        return real([f"hydra.searchpath=[file://{conf}]", *overrides])

    for module in (conftest, test_methods_e2e, test_tuning, test_config):
        monkeypatch.setattr(module, "compose_cfg", compose_cfg)
    monkeypatch.setattr(test_methods_doc, "CONF", conf)
    yield name
    sys.modules.pop(f"fedlnl.methods.{name}", None)


def test_the_example_runs_as_planned_resumes_bit_identically_and_names_its_family(tmp_path, monkeypatch, example):
    test_methods_e2e.test_every_method_class_names_its_own_family(example)
    test_methods_e2e.test_method_runs_end_to_end_as_planned_and_resumes_mid_run(tmp_path, monkeypatch, example)


def test_the_example_never_uses_clean_labels(tmp_path, monkeypatch, example):
    test_methods_e2e.test_method_never_uses_clean_labels(tmp_path, example, monkeypatch)


@pytest.mark.parametrize("cell", test_tuning.CELLS)
def test_the_example_declares_its_search_space(example, cell):
    test_tuning.test_every_method_declares_lr_and_at_most_three_own_keys(example, cell)
    test_tuning.test_every_bound_passes_the_fields_own_checks_and_is_what_the_method_reads(example)


def test_the_example_checks_its_keys_and_the_typed_fl_values(example):
    test_config.test_fl_override_reaches_the_method_or_is_refused(example, "digits", "lr", 0.0123)
    test_config.test_fl_override_reaches_the_method_or_is_refused(example, "digits", "local_epochs", 7)
    node = conftest.compose_cfg([f"method={example}"]).method
    own = [k for k in node if k != "_target_" and k not in test_config.FL_FIELDS]
    assert own, "the example declares no own hyperparameter"
    for key in own:
        test_config.test_every_method_hyperparameter_refuses_a_wrong_type(example, key)


def test_the_example_has_its_defaults_table_and_the_fixed_header(example):
    _, table = guide_example()
    tables = test_methods_doc.doc_tables(table)
    assert list(tables) == [example], tables
    test_methods_doc.test_every_key_has_a_row_with_the_yaml_default(example, tables)
    test_methods_doc.test_every_row_names_its_source(example, tables)
    test_methods_doc.test_each_switch_is_described_once(example, tables)


def test_the_guide_names_the_base_class_and_every_optional_hook():
    """Every optional hook of the base class has a row in the guide's table of hooks."""
    import inspect

    from fedlnl.methods.common.params import Method

    text = GUIDE.read_text(encoding="utf-8")
    assert "fedlnl.methods.common.params.Method" in text
    hooks = [n for n, v in vars(Method).items() if not n.startswith("_") and n != "Params"
             and (callable(v) or isinstance(v, property) or n in ("family", "fl_unused"))]
    assert len(hooks) >= 13, hooks
    missing = [n for n in hooks if not re.search(rf"^\| `{n}[`(]", text, re.M)]
    assert not missing, f"hooks of params.Method without a row in docs/adding-a-method.md: {missing}"
    required = [n for n, v in vars(Method).items() if inspect.isfunction(v) and "NotImplementedError" in inspect.getsource(v)]
    assert sorted(required) == sorted(["init", "sample_clients", "client_update", "aggregate", "eval_model"])
