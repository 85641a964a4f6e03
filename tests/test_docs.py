"""Every ``methods.md`` citation in the code resolves in docs/methods.md.

The code cites the method specifications as ``methods.md §N`` / ``§N.M`` and by label (``Q6``: FedCorr
code vs. paper, ``D4``: FedDiv, ``R1``: RoFL). This scans every .py, .yaml and .md file under fedlnl/
plus README.md and the other docs/ pages and fails, listing file:line, for a section that has no
``§N`` heading or a label that has no ``**X**`` entry in docs/methods.md. Labels are collected (a) in the chain of references that
follows ``methods.md``, (b) in the last column of the fidelity-switch tables of method docstrings
(header cell ``methods.md``), (c) anywhere in fedlnl/methods/ and fedlnl/conf/, where a bare
Q/D/R/L + number token means nothing but such a label (the YAML switch comments ``# Q6: ...``).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "methods.md"

NUM = r"\d+(?:\.\d+)?"
LABEL = r"[QDRL]\d{1,2}"  # L: the local label-noise methods of §21
#: one reference of a chain: §N(.M), a bare N after a dash (``§11-12``), or a label / label range
REF = rf"§\s?{NUM}|(?<=[-–]){NUM}|{LABEL}(?:[–-]{LABEL})?"
#: separators between the references of a chain; a YAML comment may continue on the next line
SEP = r"[\s,;/–-]*(?:and\s+)?(?:#\s*)?"
#: ``methods.md`` + its chain of references, each optionally followed by a parenthesised remark
CHAIN = re.compile(rf"methods\.md(?P<tail>(?:{SEP}(?:{REF})(?:\s*\([^()]*\))?)*)")
TOKEN = re.compile(rf"§\s?(?P<sec>{NUM})|(?<=[-–])(?P<bare>{NUM})|(?P<lab>{LABEL})(?:[–-](?P<lab2>{LABEL}))?")
BARE_LABEL = re.compile(rf"(?<![\w.]){LABEL}(?:[–-]{LABEL})?(?!\w|\.\d)")


def sources() -> list[Path]:
    files = [p for ext in ("py", "yaml", "md") for p in (REPO / "fedlnl").rglob(f"*.{ext}")]
    pages = [p for p in (REPO / "docs").glob("*.md") if p != DOC]  # the user guide, configuration, ...
    return sorted(files) + [REPO / "README.md", *sorted(pages)]


def doc_index(doc: str) -> tuple[dict[str, tuple[int, int]], dict[str, int], list[str]]:
    """Sections {number: (heading line, end line)} from the ``§N`` headings, labels {label: line} from
    entries opening with ``**X**``, and duplicates of either."""
    lines = doc.splitlines()
    heads = [(i, m.group(1)) for i, line in enumerate(lines)
             if (m := re.match(rf"#{{2,4}} §({NUM})\s", line))]
    labels, dup = {}, []
    for i, line in enumerate(lines):
        if m := re.match(rf"(?:[-*]\s+)?\*\*({LABEL})\*\*", line):
            dup += [m.group(1)] if m.group(1) in labels else []
            labels[m.group(1)] = i
    sections = {}
    for j, (start, num) in enumerate(heads):
        dup += [f"§{num}"] if num in sections else []
        # a section runs until the next heading that is not one of its subsections
        end = next((s for s, n in heads[j + 1:] if not n.startswith(num + ".")), len(lines))
        sections[num] = (start, end)
    return sections, labels, dup


def expand(first: str, last: str | None) -> list[str]:
    """``Q1–Q25`` -> Q1..Q25 (a range must stay in one family and go upwards)."""
    if last is None:
        return [first]
    if first[0] != last[0] or int(last[1:]) < int(first[1:]):
        return [f"{first}–{last} (bad range)"]
    return [f"{first[0]}{i}" for i in range(int(first[1:]), int(last[1:]) + 1)]


def scan(text: str, rel: str, label_zone: bool) -> tuple[list[tuple[str, str, str | None]], list[str], int]:
    """Citations in one file as (file:line, reference, section the label must lie in), problems
    found while parsing, and the number of fidelity-table rows read. ``label_zone``: a bare label
    anywhere in the file counts (fedlnl/methods, fedlnl/conf)."""
    def where(pos: int) -> str:
        return f"{rel}:{text.count(chr(10), 0, pos) + 1}"

    cites, problems = [], []
    for m in CHAIN.finditer(text):
        tail = m.group("tail")
        if not tail.strip():
            # a mention without a reference is fine (a link, a table header), a malformed one is not
            if re.match(r"\s+\d|\s*§", text[m.end():]):
                problems.append(f"{where(m.start())}: 'methods.md' + a section it cannot read (write §N.M)")
            continue
        prev_sec = None
        for t in TOKEN.finditer(tail):
            if t.group("sec") or t.group("bare"):
                prev_sec = t.group("sec") or t.group("bare")
                cites.append((where(m.start()), f"§{prev_sec}", None))
                continue
            # a label written right after its section ("§2.7 Q25") must sit in that section
            glued = prev_sec and re.search(rf"§\s?{re.escape(prev_sec)}\s+$", tail[:t.start()])
            for lab in expand(t.group("lab"), t.group("lab2")):
                cites.append((where(m.start()), lab, prev_sec if glued else None))
    rows = fidelity_rows(text, rel, cites, problems)
    if label_zone:
        for b in BARE_LABEL.finditer(text):
            first, _, last = b.group(0).replace("-", "–").partition("–")
            cites += [(where(b.start()), lab, None) for lab in expand(first, last or None)]
    return cites, problems, rows


def fidelity_rows(text: str, rel: str, cites: list, problems: list) -> int:
    """Rows of docstring tables whose last header cell is ``methods.md``: each must cite a label or
    a section in its last cell, or carry a footnote marker ``(a)``. Returns the number of rows read."""
    lines, rows = text.splitlines(), 0
    for i, line in enumerate(lines):
        if not re.fullmatch(r"\s*\|.*\|\s*methods\.md\s*\|\s*", line):
            continue
        for j in range(i + 2, len(lines)):  # i + 1 is the |---| rule
            if not lines[j].lstrip().startswith("|"):
                break
            rows += 1
            last = lines[j].strip().strip("|").split("|")[-1]
            found = list(TOKEN.finditer(last))
            # a footnote marker such as "(a)" states on purpose that no divergence is listed
            if not found and not re.fullmatch(r"\s*\([a-z]\)\s*", last):
                problems.append(f"{rel}:{j + 1}: fidelity-table row cites no methods.md label")
            for t in found:
                refs = [f"§{t.group('sec')}"] if t.group("sec") else expand(t.group("lab"), t.group("lab2"))
                cites += [(f"{rel}:{j + 1}", r, None) for r in refs]
    return rows


def unresolved(cites, sections, labels) -> list[str]:
    out = []
    for where, ref, inside in cites:
        if ref.startswith("§"):
            if ref[1:] not in sections:
                out.append(f"{where}: {ref} has no heading in docs/methods.md")
        elif ref not in labels:
            out.append(f"{where}: label {ref} has no entry in docs/methods.md")
        elif inside and not sections[inside][0] < labels[ref] < sections[inside][1]:
            out.append(f"{where}: {ref} is not under §{inside} in docs/methods.md")
    return out


@pytest.fixture(scope="module")
def index():
    return doc_index(DOC.read_text(encoding="utf-8"))


def test_doc_headings_and_labels_are_unique_and_complete(index):
    sections, labels, dup = index
    assert not dup, f"duplicated in docs/methods.md: {dup}"
    assert {str(n) for n in range(0, 18)} <= set(sections), "a top-level § section is missing"
    for family, count, home in (("Q", 25, "2.7"), ("D", 20, "3.6"), ("R", 7, "6"), ("L", 16, "21")):
        start, end = sections[home]
        for k in range(1, count + 1):
            assert f"{family}{k}" in labels, f"label {family}{k} missing"
            assert start < labels[f"{family}{k}"] < end, f"label {family}{k} is not under §{home}"


def test_every_methods_md_citation_resolves(index):
    sections, labels, _ = index
    cites, problems, rows = [], [], 0
    zones = (REPO / "fedlnl" / "methods", REPO / "fedlnl" / "conf")
    for path in sources():
        c, p, r = scan(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)),
                       any(path.is_relative_to(z) for z in zones))
        cites, problems, rows = cites + c, problems + p, rows + r
    n_sections = sum(1 for _, ref, _ in cites if ref.startswith("§"))
    # guards against a pattern that silently matches nothing (the code had 108 "methods.md" mentions)
    assert n_sections >= 80, f"only {n_sections} methods.md § citations found"
    assert len(cites) - n_sections >= 50, "too few Q/D/R label citations found"
    # the switches are described once, in docs/methods.md §23 and the Params field docs, which cite
    # their labels (Q6, D13, ...): a docstring table is optional, the labels in fedlnl/methods are not
    in_methods = sum(1 for w, ref, _ in cites if w.startswith("fedlnl/methods/") and not ref.startswith("§"))
    assert in_methods >= 80, f"only {in_methods} Q/D/R/L label citations found in fedlnl/methods"
    problems += unresolved(cites, sections, labels)
    assert not problems, "unresolved methods.md citations:\n" + "\n".join(problems)


EXAMPLE_TABLE = """
| switch | paper | reference | methods.md |
|---|---|---|---|
| ``a`` | x | y | Q6 |
| ``b`` | x | y | D99 |
| ``c`` | x | y | none |
| ``d`` | x | y | (a) |
"""


@pytest.mark.parametrize("snippet, n_cites, n_bad", [
    ("see methods.md §2.6 and", 1, 0),
    ("# (methods.md §1.1, §2.6,\n# §3.5, §4): x", 4, 0),
    ("methods.md §3 (code), §3.5 (hyperparameters), §3.6\n(divergences), §16 (Tables)", 4, 0),
    ("(methods.md §11-12): groups", 2, 0),
    ("(methods.md §2.7, Q1–Q25).", 26, 0),
    ("(methods.md §2.7 Q25)", 2, 0),
    ("(methods.md §16.99)", 1, 1),
    ("(methods.md §3.6 Q25)", 2, 1),   # Q25 lives in §2.7
    ("(methods.md Q99)", 1, 1),
    ("(methods.md 1.1)", 0, 1),        # the § is required
    ("(methods.md §N)", 0, 1),
    ("see [`docs/methods.md`](docs/methods.md)", 0, 0),
    (EXAMPLE_TABLE, 2, 2),             # D99 unknown, "none" cites nothing
])
def test_scanner_on_examples(index, snippet, n_cites, n_bad):
    """The scanner finds and rejects what it should, so the real scan can fail."""
    sections, labels, _ = index
    cites, problems, _ = scan(snippet, "x.py", label_zone=False)
    assert len(cites) == n_cites, cites
    assert len(problems + unresolved(cites, sections, labels)) == n_bad, (cites, problems)


def test_the_readme_is_a_front_page():
    """README.md is what fedlnl is, the two commands, one figure, one table excerpt, the commands used
    most and links (issue 35): at most 8,000 bytes, every link to a local page resolving."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 8000, len(readme.encode())
    assert "```bash\nmake run\nmake test\n```" in readme
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)", readme):
        assert (REPO / target).exists(), target
