"""The §23 tables of docs/methods/ document every default of every method YAML with its source.

One table per ``conf/method/<name>.yaml`` under a heading ``### §23.N `<name>` (...)`` on the method's
page (docs/methods/index.md maps each method to it; tests/test_doc_citations.py checks that), one row per
top-level key (``_target_`` and the Hydra ``defaults`` list excluded; a composition's
``/method@stage3: X`` entry is the row ``stage3`` with default ``X``):

    | `key` (→ `fl.key` when it pins a shared value) | `default as written in the YAML` | source | kind |

Each switch is described once: what a method's own key is, by its ``Params`` field doc (one line,
``tests/test_checks.py``); where its default comes from, by its §23 row. The YAML carries the values,
group headings (``# --- ...``) and a header pointing to both, never a per-key description.

The tests fail, per method, when a YAML key has no row (a new key or method must be documented), a
row names a key the YAML no longer has, a row's default differs from the YAML, a row's kind is not one
of paper / code / our choice / unsourced, or the method's home section does not link to its table.
"""
from __future__ import annotations

import re
from pathlib import Path

import dataclasses

import hydra.utils
import pytest
import yaml
from omegaconf import OmegaConf

from conftest import CONF, REPO

PAGES = REPO / "docs" / "methods"
METHODS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))
KINDS = ("paper", "code", "our choice", "unsourced")
UNSOURCED = "unsourced — our choice, reason not recorded"
HEADING = re.compile(r"^### §23\.(?P<num>\d+) `(?P<name>\w+)`")


def cells(row: str) -> list[str]:
    """The cells of a Markdown table row (``\\|`` inside a cell is not a separator)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip()[1:-1])]


def doc_tables(text: str) -> dict[str, dict]:
    """{method: {"num": "N", "rows": {key: (default, source, kind)}, "dups": [keys]}} from §23."""
    tables, current = {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            m = HEADING.match(line)
            current = tables.setdefault(m["name"], {"num": m["num"], "rows": {}, "dups": []}) if m else None
            continue
        if current is None or not line.startswith("|") or line.startswith("|---"):
            continue
        row = cells(line)
        key = re.match(r"`([^`]+)`", row[0])
        if key is None or len(row) != 4:  # the header row, or a malformed row (reported as missing)
            continue
        default = re.fullmatch(r"`([^`]*)`", row[1])
        entry = (default[1] if default else row[1], row[2], row[3])
        if key[1] in current["rows"]:
            current["dups"].append(key[1])
        current["rows"][key[1]] = entry
    return tables


def expected_rows(name: str) -> dict:
    """{key: default} of a method YAML, values unresolved (interpolations stay text)."""
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "method" / f"{name}.yaml"), resolve=False)
    rows = {k: v for k, v in cfg.items() if k not in ("_target_", "defaults")}
    for entry in cfg.get("defaults") or []:
        if isinstance(entry, dict) and "/method@stage3" in entry:
            rows["stage3"] = entry["/method@stage3"]
    return rows


def same_default(written: str, value) -> bool:
    """The doc's default cell equals the YAML value: text for strings (whitespace ignored), the
    parsed scalar otherwise (``5.0e-4`` and ``0.0005`` are the same number)."""
    if isinstance(value, str):
        return re.sub(r"\s+", "", written) == re.sub(r"\s+", "", value)
    try:
        parsed = yaml.safe_load(written)
    except yaml.YAMLError:
        return False
    return parsed == value and type(parsed) is type(value) or (
        isinstance(parsed, (int, float)) and not isinstance(parsed, bool)
        and isinstance(value, (int, float)) and not isinstance(value, bool) and float(parsed) == float(value))


def key_problems(name: str, tables: dict) -> list[str]:
    """Missing, stale, duplicated and mismatched rows of one method's table."""
    if name not in tables:
        return [f"docs/methods/ has no §23 table for conf/method/{name}.yaml (### §23.N `{name}` ...)"]
    rows, expected = tables[name]["rows"], expected_rows(name)
    out = [f"{name}: key `{k}` has no row" for k in expected if k not in rows]
    out += [f"{name}: row `{k}` names no key of the YAML" for k in rows if k not in expected]
    out += [f"{name}: row `{k}` appears twice" for k in tables[name]["dups"]]
    out += [f"{name}.{k}: doc default `{rows[k][0]}` != YAML `{v}`"
            for k, v in expected.items() if k in rows and not same_default(rows[k][0], v)]
    return out


def page_texts() -> dict[str, str]:
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(PAGES.glob("*.md"))}


@pytest.fixture(scope="module")
def text():
    """All pages, one after the other (each table's heading opens it, the next heading ends it)."""
    return "\n".join(page_texts().values())


@pytest.fixture(scope="module")
def outside():
    """The pages without their defaults tables (and without the index, whose method map names every
    table): where a method's home section links to its table."""
    return "\n".join(t.split("\n## Defaults and their sources\n", 1)[0]
                     for name, t in page_texts().items() if name != "index")


@pytest.fixture(scope="module")
def tables(text):
    return doc_tables(text)


def test_every_method_yaml_has_a_table(tables):
    assert len(METHODS) >= 31
    assert not sorted(set(tables) - set(METHODS)), "§23 tables for YAMLs that do not exist"
    assert [int(tables[m]["num"]) for m in sorted(tables, key=lambda m: int(tables[m]["num"]))] == \
        list(range(1, len(tables) + 1)), "§23.N numbers must run 1..n without gaps"


@pytest.mark.parametrize("name", METHODS)
def test_every_key_has_a_row_with_the_yaml_default(name, tables):
    problems = key_problems(name, tables)
    assert not problems, "the §23 tables of docs/methods/ are out of date:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", METHODS)
def test_every_row_names_its_source(name, tables):
    problems = []
    for key, (_, source, kind) in tables.get(name, {"rows": {}})["rows"].items():
        if not source or not kind.startswith(KINDS):
            problems.append(f"{name}.{key}: kind {kind!r} (allowed: {', '.join(KINDS)}) / source {source!r}")
        if kind.startswith("unsourced") and UNSOURCED not in source:
            problems.append(f"{name}.{key}: an unsourced default must say {UNSOURCED!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", METHODS)
def test_home_section_links_to_the_table(name, outside, tables):
    if name not in tables:
        pytest.fail(f"no §23 table for {name}")
    ref = f"§23.{tables[name]['num']}"
    # a range "§23.2–§23.5" names its ends; the numbers in between are covered by it
    ranges = [(int(a), int(b)) for a, b in re.findall(r"§23\.(\d+)–§23\.(\d+)", outside)]
    num = int(tables[name]["num"])
    assert re.search(rf"{re.escape(ref)}(?!\d)", outside) or any(a <= num <= b for a, b in ranges), \
        f"no section of docs/methods/ outside the §23 tables links to {ref} ({name})"


def test_check_fails_on_a_removed_row_a_changed_default_and_an_unknown_key(text):
    """The checks above can fail: a copy of the real §23 with one row removed, one default changed
    and one row renamed is reported on exactly those."""
    real = doc_tables(text)
    assert not key_problems("fedcorr", real) and not key_problems("rfa", real)
    broken = text.replace("| `beta` | `5.0` |", "| `beta` | `6.0` |", 1)
    broken = re.sub(r"^\| `lid_k` \|.*\n", "", broken, count=1, flags=re.M)
    broken = broken.replace("| `nu` | `1.0e-5` |", "| `nu_` | `1.0e-5` |", 1)
    assert broken.count("\n") == text.count("\n") - 1
    tables = doc_tables(broken)
    assert key_problems("fedcorr", tables) == ["fedcorr: key `lid_k` has no row",
                                               "fedcorr.beta: doc default `6.0` != YAML `5.0`"]
    assert key_problems("rfa", tables) == ["rfa: key `nu` has no row", "rfa: row `nu_` names no key of the YAML"]
    assert key_problems("no_such_method", tables)[0].startswith("docs/methods/ has no §23 table")


def test_expected_rows_of_a_composition():
    """A stage-3 composition has one row, its nested method."""
    assert expected_rows("fedcorr_poc") == {"stage3": "poc"}
    assert same_default("1.0e-5", 1e-5) and same_default("5.0", 5.0) and not same_default("5", 5.5)
    assert same_default("null", None) and same_default("true", True) and not same_default("1", True)


def comment_problems(name: str, num: str) -> list[str]:
    """Per-key comments of a method YAML's own keys (module notes), and a header without the pointer."""
    path = CONF / "method" / f"{name}.yaml"
    target = OmegaConf.load(path).get("_target_")
    if target is None:  # a composition (defaults list only)
        return []
    params = hydra.utils.get_class(target).Params
    fields = {f.name for f in dataclasses.fields(params)}
    lines = path.read_text(encoding="utf-8").splitlines()
    first = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    header = " ".join(lines[:first])
    out = [] if not fields or (params.__name__ in header and f"§23.{num}" in header) else [
        f"{name}.yaml: the header does not point to {params.__name__} and §23.{num} (docs/methods/)"]
    block: list[str] = []
    for line in lines[first:]:
        if line.startswith("#"):
            block.append(line)
            continue
        key = re.match(r"^(\w+):", line)
        if key and key[1] in fields:
            if _has_comment(line):
                out.append(f"{name}.{key[1]}: a comment after the value (its description is the field doc)")
            if block and not block[0].startswith("# ---"):
                out.append(f"{name}.{key[1]}: a comment above the key that is no '# ---' group heading")
        block = []
    return out


def _has_comment(line: str) -> bool:
    """A YAML comment (`` #`` outside quotes) on the line."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and i and line[i - 1].isspace():
            return True
    return False


@pytest.mark.parametrize("name", METHODS)
def test_each_switch_is_described_once(name, tables):
    problems = comment_problems(name, tables[name]["num"])
    assert not problems, "\n".join(problems)


def test_the_comment_check_finds_a_per_key_comment(tmp_path, monkeypatch, tables):
    """The check fails on a described key (after or above it) and on a header without the pointer."""
    import test_methods_doc as module

    (tmp_path / "method").mkdir()
    text = (CONF / "method" / "fednoro.yaml").read_text(encoding="utf-8")
    monkeypatch.setattr(module, "CONF", tmp_path)
    num = tables["fednoro"]["num"]
    for edit, problem in [
        (("lambda_: 0.8", "lambda_: 0.8   # a, the KD weight"), "fednoro.lambda_: a comment after the value"),
        (("kd_temperature:", "# T dividing the teacher's logits\nkd_temperature:"),
         "fednoro.kd_temperature: a comment above"),
        (("# Each key: FedNoRoParams", "# Each key: FedNoRo's"), "the header does not point to FedNoRoParams"),
    ]:
        (tmp_path / "method" / "fednoro.yaml").write_text(text.replace(*edit, 1), encoding="utf-8")
        assert any(p.startswith(problem) or problem in p for p in comment_problems("fednoro", num)), edit
    (tmp_path / "method" / "fednoro.yaml").write_text(text, encoding="utf-8")
    assert comment_problems("fednoro", num) == []
