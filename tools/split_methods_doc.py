"""Split docs/methods.md into one page per method under docs/methods/ and move every citation to it.

    python tools/split_methods_doc.py            # split (or, on a split tree, rewrite stale citations)
    python tools/split_methods_doc.py --check    # change nothing; exit 1 if something would change

What it does, when docs/methods.md is the whole specification (it has ``## §N`` headings):

1. Cuts the document at its top-level ``## §N`` headings and writes each section to the page that
   ``PAGES`` names for N (section numbers stay as they are, so a citation keeps its number). The
   defaults tables ``### §23.N `name``` go to the page of their method, found from the table's own
   ``Home section: §X`` line; the §23 introduction (how to read a row) stays on ``index.md``, which
   also gets the conventions, a table of contents (§N -> page) and the method -> page map.
2. Rewrites every citation ``methods.md §X.Y`` / ``docs/methods.md §X`` / ``methods.md Q6`` (with its
   chain of further references: ``methods.md §1.1, §2.6, §3.5``) in fedlnl/, tests/, docs/,
   benchmarks/, README.md to ``docs/methods/<page>.md §X.Y``, naming a new page wherever the chain
   moves to another one; a mention without a section (a link) points to ``docs/methods/index.md``.
3. Removes docs/methods.md.

Re-running it is safe: without a whole docs/methods.md it reads the sections and labels from the
pages and only rewrites citations still in the old form (a branch merged after the split). A whole
docs/methods.md found next to existing pages (a branch that still edited it) regenerates the pages
from it. A new top-level section that ``PAGES`` does not place, a §23 table without a home section,
or a citation of a section no page has stops the script with a message and changes nothing.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "methods.md"
OUT = REPO / "docs" / "methods"

#: top-level section -> page (without .md). A new top-level section must be placed here.
PAGES = {
    0: "index", 1: "setup", 2: "fedcorr", 3: "feddiv", 4: "fedavg", 5: "fedprox", 6: "rofl", 7: "arfl",
    8: "median", 9: "feddyn", 10: "poc", 11: "jointopt", 12: "dividemix", 13: "setup", 14: "setup",
    15: "index", 16: "paper_tables", 17: "setup", 18: "fednoro", 19: "robust_aggregation",
    20: "fedexp_fedsam", 21: "local_lnl", 22: "fedlsr_fedrn_fedelc", 23: "index",
}
DEFAULTS_SECTION = 23  # its ### subsections are per-method tables, each placed with its method
#: titles of the pages that hold several top-level sections (the others take their section's title)
TITLES = {
    "index": "Method specifications (fedlnl)",
    "setup": "Shared setup, FedNoisy, evaluation protocol and numeric checks",
    "paper_tables": "Paper result tables",
}
#: hand-maintained files that quote the old form on purpose (the citation tests and this script)
SKIP = {"tests/test_doc_citations.py", "tests/test_methods_doc.py", "tools/split_methods_doc.py"}
SCAN_DIRS = ("fedlnl", "tests", "docs", "benchmarks", "tools")
SCAN_FILES = ("README.md", "Makefile")
SUFFIXES = {".py", ".yaml", ".yml", ".md", ".txt", ".toml", ".cfg", ".sh"}
LIMIT = 60_000  # bytes per docs page (issue 35)

NUM = r"\d+(?:\.\d+)*"
LABEL = r"[QDRL]\d{1,2}"
#: one reference of a chain: §N(.M), a bare N after a dash (``§11-12``), or a label / label range
REF = rf"§\s?{NUM}|(?<=[-–]){NUM}|{LABEL}(?:[–-]{LABEL})?"
#: separators between references; a comment or a Python string may continue on the next line
SEP = r'[\s,;/–-]*(?:and\s+)?(?:#\s*)?(?:"\s*")?'
TAIL = rf"(?P<tail>(?:{SEP}(?:{REF})(?:\s*\([^()]*\))?)*)"
TOKEN = re.compile(rf"§\s?(?P<sec>{NUM})|(?<=[-–])(?P<bare>{NUM})|(?P<lab>{LABEL})(?:[–-](?P<lab2>{LABEL}))?")
#: the old form: ``methods.md`` or ``docs/methods.md`` (never ``../shared/docs/methods.md``)
OLD = re.compile(rf"(?<![\w./-])(?:docs/)?methods\.md{TAIL}")
#: a Markdown link to the old page: ``[text](docs/methods.md)`` (+ a chain after it)
OLD_LINK = re.compile(rf"\[(?P<text>[^\]\n]*)\]\((?P<pre>(?:\.\./)*(?:docs/)?)methods\.md\){TAIL}")
HEAD = re.compile(rf"^(?P<hashes>#{{2,4}}) §(?P<num>{NUM})\s")
ENTRY = re.compile(rf"^(?:[-*]\s+)?\*\*({LABEL})\*\*")
HOME = re.compile(rf"Home section: §(?P<num>{NUM})")


class SplitError(Exception):
    """Something the script will not guess: the message says what to fix."""


@dataclass
class Index:
    """Where each section and label lives: {"2.7": "fedcorr"}, {"Q6": "fedcorr"}."""
    sections: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def page(self, ref: str) -> str | None:
        if ref.startswith("§"):
            return self.sections.get(ref[1:])
        return self.labels.get(ref)


# ---------------------------------------------------------------- splitting the document

@dataclass
class Section:
    num: str
    title: str
    text: str  # the heading line through the last line before the next top-level heading


def top_level_sections(doc: str) -> tuple[str, str, list[Section]]:
    """(title, preamble, sections) of the whole document, cut at ``## §N`` headings."""
    lines = doc.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise SplitError(f"{DOC.relative_to(REPO)}: the first line is not a '# title'")
    starts = [i for i, line in enumerate(lines) if re.match(r"^## §\d+\s", line)]
    preamble = "\n".join(lines[1:starts[0]])
    sections = []
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        m = re.match(r"^## §(\d+)\s+(.*)$", lines[a])
        sections.append(Section(m[1], m[2].strip(), tidy("\n".join(lines[a:b]))))
    return lines[0][2:].strip(), preamble, sections


def tidy(text: str) -> str:
    """A chunk without its trailing ``---`` rule and blank lines."""
    lines = text.rstrip().splitlines()
    while lines and lines[-1].strip() in ("", "---"):
        lines.pop()
    return "\n".join(lines)


def defaults_tables(section: Section) -> tuple[str, list[tuple[str, str, str, str]]]:
    """(§23 introduction, [(num, method, home section, table text)]) of the defaults section."""
    parts = re.split(r"(?m)^(?=### §)", section.text)
    tables = []
    for part in parts[1:]:
        m = re.match(rf"^### §{DEFAULTS_SECTION}\.(\d+) `(\w+)`", part)
        if m is None:
            raise SplitError(f"§{DEFAULTS_SECTION}: a subsection that is no method table: {part.splitlines()[0]!r}")
        home = HOME.search(part)
        if home is None:
            raise SplitError(f"§{DEFAULTS_SECTION}.{m[1]} `{m[2]}` has no 'Home section: §X' line, "
                             "so its page is unknown: add the line")
        tables.append((m[1], m[2], home["num"], tidy(part)))
    return tidy(parts[0]), tables


def page_of_top(num: str | int) -> str:
    page = PAGES.get(int(num))
    if page is None:
        raise SplitError(f"docs/methods.md has a new top-level section §{num}: place it in PAGES in "
                         f"tools/split_methods_doc.py (its page, or a new page name)")
    return page


def build_pages(doc: str) -> dict[str, str]:
    """{page name: Markdown text} from the whole document."""
    title, preamble, sections = top_level_sections(doc)
    chunks: dict[str, list[str]] = {}
    titles: dict[str, str] = {}
    intro, tables = "", []
    for s in sections:
        page = page_of_top(s.num)
        if int(s.num) == DEFAULTS_SECTION:
            intro, tables = defaults_tables(s)
            continue
        chunks.setdefault(page, []).append(s.text)
        titles.setdefault(page, s.title)
    home_pages, on_page = {}, {}
    for num, name, home, text in tables:
        page = page_of_top(home.split(".")[0])
        home_pages[name] = (num, home, page)
        on_page.setdefault(page, []).append(text)
    for page, texts in on_page.items():  # after the page's sections, in §23 order
        chunks.setdefault(page, []).append("\n\n".join(["## Defaults and their sources", DEFAULTS_NOTE, *texts]))
    pages = {}
    for page, parts in chunks.items():
        if page == "index":
            continue
        head = f"# {TITLES.get(page, titles.get(page, page))}\n\n{PAGE_NOTE}"
        pages[page] = head + "\n\n" + "\n\n---\n\n".join(parts) + "\n"
    pages["index"] = index_page(title, preamble, sections, chunks.get("index", []), intro, home_pages)
    return pages


PAGE_NOTE = ("Part of the [method specifications](index.md). Section numbers (§N) are the same on every "
             "page; [the index](index.md#contents) says which page holds each one.")
DEFAULTS_NOTE = (f"Every key of the method's YAML with its default and the source of that default; "
                 f"how to read a row: [index.md §{DEFAULTS_SECTION}](index.md#defaults).")


def index_page(title: str, preamble: str, sections: list[Section], own: list[str], intro: str,
               home_pages: dict[str, tuple[str, str, str]]) -> str:
    """The index: what the pages are, the conventions, contents, the method map, then its sections."""
    paras = preamble.strip().split("\n\n")
    rest = "\n\n".join(p for p in paras[1:] if p.strip() != "---")  # the first paragraph is replaced
    contents = ["| § | page | section |", "|---|---|---|"]
    for s in sections:
        page = page_of_top(s.num)
        where = "each method's page" if int(s.num) == DEFAULTS_SECTION else f"[{page}.md]({page}.md)"
        contents.append(f"| §{s.num} | {where} | {s.title} |")
    methods = ["| method (`conf/method/`) | page | defaults | home section |", "|---|---|---|---|"]
    for name, (num, home, page) in sorted(home_pages.items(), key=lambda kv: int(kv[1][0])):
        methods.append(f"| `{name}` | [{page}.md]({page}.md) | §{DEFAULTS_SECTION}.{num} | §{home} |")
    intro_lines = intro.splitlines()
    defaults = "\n".join([intro_lines[0], "", f"The tables themselves are on each method's page, "
                          f"after its sections ([methods](#methods) says where).", *intro_lines[1:]])
    body = [
        f"# {title}", INDEX_INTRO, rest,
        '<a id="contents"></a>\n\n## Contents', "\n".join(contents),
        '<a id="methods"></a>\n\n## Methods', "One row per method YAML: its page, its defaults table "
        f"(§{DEFAULTS_SECTION}.N, on that page) and the section that describes it.", "\n".join(methods),
        "---", "\n\n---\n\n".join(own), "---", f'<a id="defaults"></a>\n\n{defaults}',
    ]
    return "\n\n".join(b.strip("\n") for b in body if b.strip()) + "\n"


INDEX_INTRO = """\
What each method does, per its paper and per its public reference code, with the hyperparameters per
dataset, the places where code and paper disagree, and the papers' result tables: one page per method
(or per group of methods described together), the shared setup on [setup.md](setup.md), the papers'
tables on [paper_tables.md](paper_tables.md). Sections are numbered across all pages (§N, §N.M) and
keep their numbers wherever they sit; code-vs-paper differences carry labels: **Q1–Q25** (FedCorr,
§2.7), **D1–D20** (FedDiv, §3.6), **R1–R7** (RoFL, §6), **L** (local label-noise methods, §21).
The code cites them as `docs/methods/<page>.md §N.M` or `docs/methods/<page>.md Q6`;
`tests/test_doc_citations.py` checks that every such citation names a page that holds that section or
label. The pages were cut from one document by `tools/split_methods_doc.py`; edit the pages now."""


# ---------------------------------------------------------------- where things are

def index_of(pages: dict[str, str]) -> Index:
    """Sections (``## §N`` .. ``#### §N.M.K`` headings) and labels (``**Q6**`` entries) per page."""
    idx, dup = Index(), []
    for page, text in pages.items():
        for line in text.splitlines():
            if m := HEAD.match(line):
                dup += [f"§{m['num']}"] if m["num"] in idx.sections else []
                idx.sections[m["num"]] = page
            elif m := ENTRY.match(line):
                dup += [m[1]] if m[1] in idx.labels else []
                idx.labels[m[1]] = page
    if dup:
        raise SplitError(f"defined twice in the method pages: {', '.join(dup)}")
    return idx


def read_pages() -> dict[str, str]:
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(OUT.glob("*.md"))}


# ---------------------------------------------------------------- rewriting citations

def tokens(tail: str) -> list[tuple[re.Match, list[str]]]:
    """The references of a chain, each with the names it cites (a label range: its first label)."""
    out = []
    # a parenthesised remark ("§3.5 (default = CIFAR-10)") holds no reference: blank it, keeping offsets
    masked = re.sub(r"\([^()]*\)", lambda r: " " * len(r.group(0)), tail)
    for t in TOKEN.finditer(masked):
        if t["sec"] or t["bare"]:
            out.append((t, [f"§{t['sec'] or t['bare']}"]))
        else:
            out.append((t, [t["lab"]]))
    return out


def resolve(ref: str, idx: Index, where: str, missing: list[str]) -> str:
    """The page of a reference; a section no page has falls back to its top-level section's page."""
    page = idx.page(ref)
    if page is None:
        missing.append(f"{where}: {ref} is on no page")
        if ref.startswith("§"):
            top = ref[1:].split(".")[0]
            page = idx.sections.get(top) or page_of_top(top)
        else:
            page = next((p for lab, p in idx.labels.items() if lab[0] == ref[0]), "index")
    return page


def rewrite_chain(tail: str, idx: Index, where: str, missing: list[str]) -> tuple[str, str | None]:
    """(new tail, page of the first reference): a page name is inserted where the chain changes page."""
    toks = tokens(tail)
    if not toks:
        return tail, None
    pages = [resolve(refs[0], idx, where, missing) for _, refs in toks]
    out, pos, current = [], 0, pages[0]
    for (t, _), page in zip(toks, pages):
        if page == current:
            continue
        if t["bare"]:  # "§11-12" across two pages: "…jointopt.md §11, docs/methods/dividemix.md §12"
            dash = t.start() - 1
            out += [tail[pos:dash], f", docs/methods/{page}.md §{t['bare']}"]
            pos = t.end()
        else:
            gap = tail[pos:t.start()]
            gap = gap[:-1] + ", " if gap.endswith("/") else gap  # "§10/§14" -> "§10, <page> §14"
            out += [gap, f"docs/methods/{page}.md "]
            pos = t.start()
        current = page
    out.append(tail[pos:])
    return "".join(out), pages[0]


def rewrite_text(text: str, rel: str, idx: Index, missing: list[str]) -> str:
    """A file's text with every old-form citation and link moved to the pages."""
    def where(m: re.Match, src: str) -> str:
        return f"{rel}:{src.count(chr(10), 0, m.start()) + 1}"

    def link(m: re.Match) -> str:
        tail, page = rewrite_chain(m["tail"], idx, where(m, text), missing)
        target = f"{m['pre']}methods/{page or 'index'}.md"
        if page is None:
            return f"[{m['text']}]({target}){m['tail']}"
        return f"[docs/methods/{page}.md]({target}){tail}"

    text = OLD_LINK.sub(link, text)

    def cite(m: re.Match) -> str:
        tail, page = rewrite_chain(m["tail"], idx, where(m, text), missing)
        if page is None:  # a mention without a section: the index
            return "docs/methods/index.md" + m["tail"]
        return f"docs/methods/{page}.md{tail}"

    return OLD.sub(cite, text)


def scanned_files() -> list[Path]:
    files = [REPO / f for f in SCAN_FILES if (REPO / f).exists()]
    for d in SCAN_DIRS:
        files += [p for p in sorted((REPO / d).rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                  and "__pycache__" not in p.parts]
    return [p for p in files if str(p.relative_to(REPO)) not in SKIP and not p.is_relative_to(OUT)
            and p != DOC]


# ---------------------------------------------------------------- main

def plan() -> tuple[dict[Path, str], list[Path], list[str]]:
    """({path: new text} for every file to write, [paths to delete], [notes])."""
    notes, writes, deletes = [], {}, []
    whole = DOC.exists() and re.search(r"(?m)^## §\d+\s", DOC.read_text(encoding="utf-8"))
    if whole:
        pages = build_pages(DOC.read_text(encoding="utf-8"))
        if OUT.exists() and any(OUT.glob("*.md")):
            notes.append("docs/methods/ regenerated from docs/methods.md: edits made to the pages since the "
                         "split are replaced (check git diff)")
        for old in OUT.glob("*.md") if OUT.exists() else []:
            if old.stem not in pages:
                deletes.append(old)
        writes.update({OUT / f"{name}.md": text for name, text in pages.items()})
        deletes.append(DOC)
    elif OUT.exists() and any(OUT.glob("*.md")):
        pages = read_pages()
    else:
        raise SplitError("neither docs/methods.md with its § sections nor docs/methods/*.md exists")
    idx = index_of(pages)
    too_big = [f"docs/methods/{n}.md: {len(t.encode()):,} bytes" for n, t in pages.items()
               if len(t.encode()) > LIMIT]
    if too_big:
        raise SplitError(f"pages over {LIMIT:,} bytes (split the section in PAGES): {'; '.join(too_big)}")
    missing: list[str] = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8")
        new = rewrite_text(text, str(path.relative_to(REPO)), idx, missing)
        if new != text:
            writes[path] = new
    if missing:
        notes.append("citations of sections or labels that no page holds (left on their top-level page; "
                     "tests/test_doc_citations.py will report them):\n  " + "\n  ".join(missing))
    for path, text in list(writes.items()):
        if path.exists() and path.read_text(encoding="utf-8") == text:
            del writes[path]
    return writes, [d for d in deletes if d.exists()], notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    args = ap.parse_args(argv)
    try:
        writes, deletes, notes = plan()
    except SplitError as e:
        print(f"split_methods_doc: {e}", file=sys.stderr)
        return 2
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    for p in sorted(writes):
        print(f"{'would write' if args.check else 'write'} {p.relative_to(REPO)}")
    for p in deletes:
        print(f"{'would delete' if args.check else 'delete'} {p.relative_to(REPO)}")
    if args.check:
        return 1 if writes or deletes else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for p, text in writes.items():
        p.write_text(text, encoding="utf-8")
    for p in deletes:
        p.unlink()
    print(f"{len(writes)} files written, {len(deletes)} deleted", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
