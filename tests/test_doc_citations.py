"""Every citation of the method pages resolves, and no docs page is over 60 KB.

The method specifications are one page per method (or group of methods) under docs/methods/, cut from
the former docs/methods.md by ``tools/split_methods_doc.py``; section numbers are global across pages.
The code cites them as ``docs/methods/<page>.md §N.M`` and by label (``docs/methods/fedcorr.md Q6``:
FedCorr code vs. paper, ``D4``: FedDiv, ``R1``: RoFL, ``L3``: the local label-noise methods), a chain
of further references after the page (``docs/methods/fedcorr.md §2.6, §2.7 Q4``) staying on that page.
This scans every .py, .yaml and .md file under fedlnl/, tests/, benchmarks/, the docs and README.md,
and fails, listing file:line, for a page that does not exist, a section with no ``§N`` heading on the
page cited, a label with no ``**X**`` entry there, or a citation still in the old ``methods.md §N``
form. A bare Q/D/R/L + number token in fedlnl/methods/ and fedlnl/conf/ (the YAML switch comments
``# Q6: ...``) must be a label of some page.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = REPO / "docs" / "methods"
SCRIPT = REPO / "tools" / "split_methods_doc.py"
LIMIT = 60_000  # bytes per docs page (issue 35)

NUM = r"\d+(?:\.\d+)*"
LABEL = r"[QDRL]\d{1,2}"  # L: the local label-noise methods of §21
#: one reference of a chain: §N(.M), a bare N after a dash (``§3.5-3.7``), or a label / label range
REF = rf"§\s?{NUM}|(?<=[-–]){NUM}|{LABEL}(?:[–-]{LABEL})?"
#: separators between references; a comment or a Python string may continue on the next line
SEP = r'[\s,;/–-]*(?:and\s+)?(?:#\s*)?(?:"\s*")?'
#: a page (as text, or as the text and target of a Markdown link) + its chain of references, each
#: optionally followed by a parenthesised remark
CHAIN = re.compile(rf"(?<![\w./-])\[?(?:\.\./)*(?:docs/)?methods/(?P<page>[\w-]+)\.md(?:\]\([^)\s]*\))?"
                   rf"(?P<tail>(?:{SEP}(?:{REF})(?:\s*\([^()]*\))?)*)")
TOKEN = re.compile(rf"§\s?(?P<sec>{NUM})|(?<=[-–])(?P<bare>{NUM})|(?P<lab>{LABEL})(?:[–-](?P<lab2>{LABEL}))?")
BARE_LABEL = re.compile(rf"(?<![\w.]){LABEL}(?:[–-]{LABEL})?(?!\w|\.\d)")
#: the form before the split (not ../shared/docs/methods.md, another project's file)
OLD = re.compile(r"(?<![\w./-])(?:docs/)?methods\.md")
#: hand-kept files that quote the old form on purpose
OLD_FORM_OK = {"tests/test_doc_citations.py", "tests/test_methods_doc.py", "tools/split_methods_doc.py"}


def sources() -> list[Path]:
    files = [p for d in ("fedlnl", "tests", "benchmarks", "tools") for ext in ("py", "yaml", "md")
             for p in (REPO / d).rglob(f"*.{ext}")]
    files = [p for p in files if p != Path(__file__).resolve()]  # its examples are wrong on purpose
    return sorted(files) + [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


class Page:
    """Sections {number: (heading line, end line)} from the ``§N`` headings and labels {label: line}
    from entries opening with ``**X**``, of one page."""

    def __init__(self, text: str):
        self.text = text
        lines = text.splitlines()
        heads = [(i, m.group(1)) for i, line in enumerate(lines) if (m := re.match(rf"#{{2,4}} §({NUM})\s", line))]
        self.labels, self.dup = {}, []
        for i, line in enumerate(lines):
            if m := re.match(rf"(?:[-*]\s+)?\*\*({LABEL})\*\*", line):
                self.dup += [m.group(1)] if m.group(1) in self.labels else []
                self.labels[m.group(1)] = i
        self.sections = {}
        for j, (start, num) in enumerate(heads):
            self.dup += [f"§{num}"] if num in self.sections else []
            # a section runs until the next heading that is not one of its subsections
            end = next((s for s, n in heads[j + 1:] if not n.startswith(num + ".")), len(lines))
            self.sections[num] = (start, end)


def expand(first: str, last: str | None) -> list[str]:
    """``Q1–Q25`` -> Q1..Q25 (a range must stay in one family and go upwards)."""
    if last is None:
        return [first]
    if first[0] != last[0] or int(last[1:]) < int(first[1:]):
        return [f"{first}–{last} (bad range)"]
    return [f"{first[0]}{i}" for i in range(int(first[1:]), int(last[1:]) + 1)]


def scan(text: str, rel: str, label_zone: bool) -> tuple[list[tuple[str, str, str, str | None]], list[str]]:
    """Citations in one file as (file:line, page, reference, section the label must lie in), and the
    problems found while parsing. ``label_zone``: a bare label anywhere in the file counts (its page
    is then ``*``, any page)."""
    def where(pos: int) -> str:
        return f"{rel}:{text.count(chr(10), 0, pos) + 1}"

    cites, problems = [], []
    if rel not in OLD_FORM_OK:
        problems += [f"{where(m.start())}: old form '{m.group(0)}': cite docs/methods/<page>.md §N "
                     "(python tools/split_methods_doc.py rewrites it)" for m in OLD.finditer(text)]
    for m in CHAIN.finditer(text):
        page, tail = m.group("page"), m.group("tail")
        cites.append((where(m.start()), page, "", None))  # the page itself must exist
        if not tail.strip() and re.match(r"\s+\d|\s*§", text[m.end():]):
            problems.append(f"{where(m.start())}: 'methods/{page}.md' + a section it cannot read (write §N.M)")
        prev_sec = None
        masked = re.sub(r"\([^()]*\)", lambda r: " " * len(r.group(0)), tail)  # remarks cite nothing
        for t in TOKEN.finditer(masked):
            if t.group("sec") or t.group("bare"):
                prev_sec = t.group("sec") or t.group("bare")
                cites.append((where(m.start()), page, f"§{prev_sec}", None))
                continue
            # a label written right after its section ("§2.7 Q25") must sit in that section
            glued = prev_sec and re.search(rf"§\s?{re.escape(prev_sec)}\s+$", masked[:t.start()])
            for lab in expand(t.group("lab"), t.group("lab2")):
                cites.append((where(m.start()), page, lab, prev_sec if glued else None))
    if label_zone:
        for b in BARE_LABEL.finditer(text):
            first, _, last = b.group(0).replace("-", "–").partition("–")
            cites += [(where(b.start()), "*", lab, None) for lab in expand(first, last or None)]
    return cites, problems


def unresolved(cites, pages: dict[str, Page]) -> list[str]:
    out = []
    for where, name, ref, inside in cites:
        if name == "*":
            if not any(ref in p.labels for p in pages.values()):
                out.append(f"{where}: label {ref} has no entry on any page of docs/methods/")
            continue
        page = pages.get(name)
        if page is None:
            out.append(f"{where}: docs/methods/{name}.md does not exist")
        elif not ref:
            continue
        elif ref.startswith("§"):
            if ref[1:] not in page.sections:
                out.append(f"{where}: {ref} has no heading on docs/methods/{name}.md")
        elif ref not in page.labels:
            out.append(f"{where}: label {ref} has no entry on docs/methods/{name}.md")
        elif inside and not (inside in page.sections
                             and page.sections[inside][0] < page.labels[ref] < page.sections[inside][1]):
            out.append(f"{where}: {ref} is not under §{inside} on docs/methods/{name}.md")
    return out


def load_pages() -> dict[str, Page]:
    return {p.stem: Page(p.read_text(encoding="utf-8")) for p in sorted(PAGES.glob("*.md"))}


@pytest.fixture(scope="module")
def pages():
    return load_pages()


def test_headings_and_labels_are_unique_and_complete(pages):
    seen, dup = {}, []
    for name, page in pages.items():
        dup += [f"{name}.md: {d}" for d in page.dup]
        for key in [*page.sections, *page.labels]:
            dup += [f"{key} on {seen[key]}.md and {name}.md"] if key in seen else []
            seen[key] = name
    assert not dup, f"defined twice in docs/methods/: {dup}"
    assert {str(n) for n in range(0, 24)} <= set(seen), "a top-level § section is missing"
    for family, count, home in (("Q", 25, "2.7"), ("D", 20, "3.6"), ("R", 7, "6"), ("L", 16, "21")):
        page = pages[seen[home]]
        start, end = page.sections[home]
        for k in range(1, count + 1):
            assert f"{family}{k}" in page.labels, f"label {family}{k} missing from {seen[home]}.md"
            assert start < page.labels[f"{family}{k}"] < end, f"label {family}{k} is not under §{home}"


def test_every_citation_resolves(pages):
    cites, problems = [], []
    zones = (REPO / "fedlnl" / "methods", REPO / "fedlnl" / "conf")
    for path in sources():
        c, p = scan(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)),
                    any(path.is_relative_to(z) for z in zones))
        cites, problems = cites + c, problems + p
    n_sections = sum(1 for _, _, ref, _ in cites if ref.startswith("§"))
    # guards against a pattern that silently matches nothing (the code had 217 section citations)
    assert n_sections >= 150, f"only {n_sections} docs/methods § citations found"
    labels = [c for c in cites if c[2] and not c[2].startswith("§")]
    assert len(labels) >= 50, "too few Q/D/R/L label citations found"
    # the switches are described once, in the §23 tables and the Params field docs, which cite their
    # labels (Q6, D13, ...): the labels in fedlnl/methods are required
    in_methods = sum(1 for w, *_ in labels if w.startswith("fedlnl/methods/"))
    assert in_methods >= 80, f"only {in_methods} Q/D/R/L label citations found in fedlnl/methods"
    problems += unresolved(cites, pages)
    assert not problems, "unresolved docs/methods citations:\n" + "\n".join(problems)


def test_no_docs_page_is_over_60_kb():
    big = [f"{p.relative_to(REPO)}: {p.stat().st_size:,} bytes" for p in (REPO / "docs").rglob("*.md")
           if p.stat().st_size > LIMIT]
    assert not big, f"docs pages over {LIMIT:,} bytes (split them):\n" + "\n".join(big)


def index_rows(heading: str) -> list[list[str]]:
    """The cells of the table under ``## <heading>`` of docs/methods/index.md."""
    text = (PAGES / "index.md").read_text(encoding="utf-8")
    block = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]


def test_the_index_maps_every_method_yaml_to_its_page(pages):
    """One row per conf/method/*.yaml: its page exists and holds the method's §23.N table."""
    methods = sorted(p.stem for p in (REPO / "fedlnl" / "conf" / "method").glob("*.yaml"))
    rows = {re.sub(r"`", "", r[0]): r for r in index_rows("Methods")}
    assert len(methods) >= 31 and sorted(rows) == methods, \
        f"index.md's Methods table: missing {sorted(set(methods) - set(rows))}, extra {sorted(set(rows) - set(methods))}"
    problems = []
    for name, (_, link, table, home) in rows.items():
        page = re.fullmatch(r"\[(\w+)\.md\]\((\w+)\.md\)", link)
        if page is None or page[1] != page[2] or page[1] not in pages:
            problems.append(f"{name}: page cell {link!r} names no page of docs/methods/")
            continue
        text = pages[page[1]].text
        if not re.search(rf"^### {re.escape(table)} `{name}`", text, re.M):
            problems.append(f"{name}: {page[1]}.md has no heading '### {table} `{name}`'")
        if home.lstrip("§") not in pages[page[1]].sections:
            problems.append(f"{name}: home section {home} is not on {page[1]}.md")
    assert not problems, "\n".join(problems)


def test_the_contents_name_the_page_of_every_top_level_section(pages):
    where = {num: name for name, p in pages.items() for num in p.sections if "." not in num}
    rows = {r[0].lstrip("§"): r[1] for r in index_rows("Contents")}
    assert sorted(rows, key=int) == sorted(where, key=int), "index.md's Contents table lists other sections"
    wrong = [f"§{n}: {cell}, is on {where[n]}.md" for n, cell in rows.items()
             if cell != f"[{where[n]}.md]({where[n]}.md)" and not (cell == "each method's page" and n == "23")]
    assert not wrong, "index.md's Contents table:\n" + "\n".join(wrong)


def test_links_into_the_method_pages_resolve(pages):
    """Relative Markdown links in the docs, the README and the method pages to a method page exist,
    and an anchor they name is an ``<a id>`` on it."""
    problems = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"\]\((?P<target>[^)\s#]*)(?:#(?P<anchor>[^)\s]+))?\)", text):
            target = (path.parent / m["target"]).resolve() if m["target"] else path
            if target.parent != PAGES.resolve() and path.parent != PAGES:
                continue
            rel = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
            if not target.exists():
                problems.append(f"{rel}: link to {m['target']} that does not exist")
            elif m["anchor"] and target.suffix == ".md" and \
                    f'<a id="{m["anchor"]}"></a>' not in target.read_text(encoding="utf-8"):
                problems.append(f"{rel}: {target.name} has no <a id=\"{m['anchor']}\">")
    assert not problems, "\n".join(problems)


def test_the_split_script_has_nothing_left_to_do():
    """On the split tree the script finds no page to write and no old-form citation to rewrite."""
    split = load_script()
    writes, deletes, notes = split.plan()
    assert not writes and not deletes, f"tools/split_methods_doc.py would change {sorted(map(str, writes))}"


def load_script():
    """tools/split_methods_doc.py as a module (tools/ is no package)."""
    if "split_methods_doc" not in sys.modules:
        spec = importlib.util.spec_from_file_location("split_methods_doc", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["split_methods_doc"] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["split_methods_doc"]


EXAMPLE_DOC = """# Specs

Intro paragraph.

Conventions: x.

---

## §0 Sources

Sources.

---

## §2 FedCorr

### §2.7 Differences

**Q1** — one.

---

## §3 FedDiv

**D1** — one.

## §23 Defaults and their sources

How to read a row.

### §23.1 `fedcorr` (FedCorr)

Home section: §2.7.

| key | default | source | kind |
|---|---|---|---|

### §23.2 `feddiv` (FedDiv)

Home section: §3.

| key | default | source | kind |
|---|---|---|---|
"""


def test_the_script_places_sections_and_tables_and_rewrites_chains():
    split = load_script()
    pages = split.build_pages(EXAMPLE_DOC)
    assert sorted(pages) == ["fedcorr", "feddiv", "index"]
    assert "### §23.1 `fedcorr`" in pages["fedcorr"] and "### §23.2 `feddiv`" in pages["feddiv"]
    assert "## §0 Sources" in pages["index"] and "## §23 Defaults" in pages["index"]
    assert "| `feddiv` | [feddiv.md](feddiv.md) | §23.2 | §3 |" in pages["index"]
    idx = split.index_of(pages)
    missing = []
    for old, new in [
        ("(methods.md §2.7 Q1)", "(docs/methods/fedcorr.md §2.7 Q1)"),
        ("# (methods.md §0, §2,\n# §3, D1): x", "# (docs/methods/index.md §0, docs/methods/fedcorr.md §2,\n"
                                                "# docs/methods/feddiv.md §3, D1): x"),
        ("docs/methods.md §2-3)", "docs/methods/fedcorr.md §2, docs/methods/feddiv.md §3)"),
        ("methods.md §3 (default = CIFAR-10)", "docs/methods/feddiv.md §3 (default = CIFAR-10)"),
        ("see [methods](methods.md).", "see [methods](methods/index.md)."),
        ("([methods.md](docs/methods.md) §2.7", "([docs/methods/fedcorr.md](docs/methods/fedcorr.md) §2.7"),
        ("../shared/docs/methods.md §2", "../shared/docs/methods.md §2"),
        ("docs/methods/fedcorr.md §2.7", "docs/methods/fedcorr.md §2.7"),
    ]:
        assert split.rewrite_text(old, "x.py", idx, missing) == new, old
    assert not missing
    split.rewrite_text("methods.md §16.99", "x.py", idx, missing)
    assert missing == ["x.py:1: §16.99 is on no page"]


def test_the_script_stops_on_an_unplaced_section():
    split = load_script()
    with pytest.raises(split.SplitError, match="new top-level section §99"):
        split.build_pages(EXAMPLE_DOC.replace("## §3 FedDiv", "## §99 New"))
    with pytest.raises(split.SplitError, match="no 'Home section"):
        split.build_pages(EXAMPLE_DOC.replace("Home section: §3.", ""))


@pytest.mark.parametrize("snippet, n_cites, n_bad", [
    ("see docs/methods/fedcorr.md §2.6 and", 2, 0),
    ("# (docs/methods/setup.md §1.1, docs/methods/fedcorr.md §2.6,\n# docs/methods/feddiv.md §3.5, §3.6): x", 7, 0),
    ("docs/methods/feddiv.md §3 (code), §3.5 (hyperparameters), §3.6\n(divergences)", 4, 0),
    ("(docs/methods/feddiv.md §3.5-3.7): groups", 3, 0),
    ("(docs/methods/fedcorr.md §2.7, Q1–Q25).", 27, 0),
    ("(docs/methods/fedcorr.md §2.7 Q25)", 3, 0),
    ("(docs/methods/paper_tables.md §16.99)", 2, 1),
    ("(docs/methods/fedcorr.md §3.6)", 2, 1),        # §3.6 is on feddiv.md
    ("(docs/methods/feddiv.md Q25)", 2, 1),           # Q25 is on fedcorr.md
    ("(docs/methods/fedcorr.md Q99)", 2, 1),
    ("(docs/methods/nosuch.md §2)", 2, 2),           # no page (and so no section on it)
    ("(docs/methods/fedcorr.md 2.1)", 1, 1),         # the § is required
    ("[docs/methods/fedlsr_fedrn_fedelc.md](docs/methods/fedlsr_fedrn_fedelc.md) §22.1", 2, 0),
    ("see [methods](methods/index.md)", 1, 0),
    ("(methods.md §2.6)", 0, 1),                     # the old form
    ("see ../shared/docs/methods.md §3", 0, 0),      # another project's file
])
def test_scanner_on_examples(pages, snippet, n_cites, n_bad):
    """The scanner finds and rejects what it should, so the real scan can fail."""
    cites, problems = scan(snippet, "x.py", label_zone=False)
    assert len(cites) == n_cites, cites
    assert len(problems + unresolved(cites, pages)) == n_bad, (cites, problems)


def test_the_readme_is_a_front_page():
    """README.md is what fedlnl is, the two commands, one figure, one table excerpt, the commands used
    most and links (issue 35): at most 8,000 bytes, every link to a local page resolving."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 8000, len(readme.encode())
    assert "```bash\nmake run\nmake test\n```" in readme
    for target in re.findall(r"\]\(((?:docs/)[^)#]+)", readme):
        assert (REPO / target).exists(), target


def test_the_configuration_reference_lists_every_method():
    """docs/configuration.md's method table names every YAML of conf/method/ (issue 35 item 5): a new
    method cannot be missing from it."""
    text = (REPO / "docs" / "configuration.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| `")]
    listed = {name for line in table for name in re.findall(r"`([a-z_0-9]+)`", line.split(" | ")[0])}
    methods = {p.stem for p in (REPO / "fedlnl" / "conf" / "method").glob("*.yaml")}
    assert not sorted(methods - listed), f"docs/configuration.md lacks: {sorted(methods - listed)}"


def test_the_configuration_reference_lists_every_option_of_each_group():
    """The "What is available" table of docs/configuration.md (one row per group: dataset, partition,
    noise, model, logger) names every YAML of fedlnl/conf/<group>/ and none that is not there: a new
    dataset, partition, noise model, model or logger cannot be missing from it either."""
    text = (REPO / "docs" / "configuration.md").read_text()
    rows = {}
    for line in text.splitlines():
        if m := re.match(r"\| `(\w+)` \| (.*) \|$", line):
            if (REPO / "fedlnl" / "conf" / m.group(1)).is_dir() and m.group(1) != "method":
                # bare option names only: `key=value` spans (e.g. `noise.map=`) are not options
                rows[m.group(1)] = set(re.findall(r"`([a-z_0-9]+)`", m.group(2)))
    assert set(rows) == {"dataset", "partition", "noise", "model", "logger"}, sorted(rows)
    for group, listed in rows.items():
        options = {p.stem for p in (REPO / "fedlnl" / "conf" / group).glob("*.yaml")}
        assert not sorted(options - listed), f"docs/configuration.md's `{group}` row lacks {sorted(options - listed)}"
        assert not sorted(listed - options), f"docs/configuration.md's `{group}` row names {sorted(listed - options)}"
