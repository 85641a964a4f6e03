"""``report.html``: one self-contained page per sweep (no file or network access when opened):
every table, every figure of the report folder embedded as a data URI, the statistics, the notes
folded, and the commands that made the runs. Tables carry ``data-name`` and figures ``data-name``
(their path in the report folder), so a test can check that none is missing."""
from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from fedlnl.benchmark.report.cells import fmt
from fedlnl.benchmark.report.stats import agreement_text, friedman_text
from fedlnl.benchmark.report.tables import family_headings, with_family

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em auto;max-width:1400px;
padding:0 1em;color:#1d1d1f}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}h3{font-size:1.02em}
table{border-collapse:collapse;margin:.6em 0;font-size:12.5px}
th,td{border:1px solid #d0d0d0;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0}
tr.family th{background:#e4ecf5;font-style:italic;position:static}
td.best{font-weight:700;background:#eef6ee}
.caption{color:#444;max-width:1100px}.wrap{overflow-x:auto}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
details{margin:.3em 0}summary{cursor:pointer}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}
code{font-size:12px}
"""


def _e(text) -> str:
    return html.escape(str(text))


def grid_html(text: pd.DataFrame, name: str, bold: pd.DataFrame | None = None, caption: str = "",
              families: dict | None = None) -> str:
    """A rows x columns table of cell texts; bold cells get class ``best``; with ``families``
    ({row: family}), a heading row (class ``family``) opens each family."""
    head = "".join(f"<th>{_e(c)}</th>" for c in [text.index.name or "", *text.columns])
    body = []
    for (heading, _), (row, values) in zip(family_headings(text.index, families), text.iterrows()):
        if heading is not None:
            body.append(f'<tr class="family"><th colspan="{len(values) + 1}">{_e(heading)}</th></tr>')
        marks = bold.loc[row] if bold is not None else [False] * len(values)
        cells = "".join(f'<td class="best">{_e(v)}</td>' if b else f"<td>{_e(v)}</td>" for v, b in zip(values, marks))
        body.append(f"<tr><th>{_e(fmt(row))}</th>{cells}</tr>")
    cap = f'<p class="caption">{_e(caption)}</p>' if caption else ""
    return (f'{cap}<div class="wrap"><table data-name="{_e(name)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def frame_html(frame: pd.DataFrame, name: str, caption: str = "", floats: str = "{:.4g}") -> str:
    shown = frame.copy()
    for column in shown:
        if pd.api.types.is_float_dtype(shown[column]):
            shown[column] = shown[column].map(lambda v: "" if pd.isna(v) else floats.format(v))
    shown = shown.astype(str).set_index(shown.columns[0])
    return grid_html(shown, name, caption=caption)


def image_html(path: Path, out: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    name = path.relative_to(out).as_posix()
    return f'<figure><img data-name="{_e(name)}" alt="{_e(name)}" src="data:image/png;base64,{data}"></figure>'


def details(summary: str, inner: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{_e(summary)}</summary>{inner}</details>"


def write_html(rep, out: Path) -> Path:
    """report.html in ``out`` from a :class:`cli.Report` and the PNG files already written there."""
    st = rep.statistics
    text, bold = rep.grid
    parts = [f"<h1>{_e(rep.title)}</h1>",
             f"<p>Metric: <b>{_e(', '.join(rep.metric.shown))}</b> (in %; the table's caption says what each "
             f"is); costs to a target from <code>{_e(rep.metric.cost_key)}</code>; curves from "
             f"<code>{_e(rep.metric.curve)}</code>.</p>",
             "<h2>Accuracy</h2>", grid_html(text, "accuracy", bold, rep.caption, rep.families)]
    if rep.missing:
        parts.append("<p>Cells of the reference grid without any run:</p><ul>"
                     + "".join(f"<li>{_e(m.removeprefix('- '))}</li>" for m in rep.missing) + "</ul>")
    parts.append(_notes_html(rep))
    parts.append("<h2>Statistics</h2>" + _stats_html(st, out, friedman_text, agreement_text, rep.families))
    parts.append("<h2>Communication</h2>")
    for title, grid in rep.comm:
        parts.append(f"<h3>{_e(title)}</h3>" + grid_html(grid, f"comm: {title}", families=rep.families))
    parts.append(f'<p class="caption">{_e(rep.comm_note)}</p>')
    if rep.detection is not None:
        parts.append("<h2>Noise detection</h2>" + grid_html(
            rep.detection, "detection", caption="mean ± std (ddof=0) over seeds of each run's final scores",
            families=rep.families))
    if rep.compute is not None:
        parts.append("<h2>Compute</h2>" + grid_html(rep.compute, "compute", caption=rep.compute_note,
                                                    families=rep.families))
    if rep.clients is not None:
        parts.append("<h2>Per-client accuracy</h2>" + grid_html(rep.clients, "clients", caption=rep.clients_note,
                                                                families=rep.families))
    if rep.noise is not None:
        parts.append("<h2>Requested vs realised noise</h2>" + frame_html(rep.noise, "noise"))
    parts.append(_figures_html(out))
    parts.append(_commands_html(rep.commands))
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(rep.title)}</title>'
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n")
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def _notes_html(rep) -> str:
    if not rep.notes:
        return "<p>No notes: every cell is complete, with the same seeds and local-training values.</p>"
    items = "".join(details(n.line, "<ul>" + "".join(f"<li>{_e(x.removeprefix('- '))}</li>" for x in n.full)
                            + "</ul>") for n in rep.notes)
    return f"<h3>Notes (one per kind; open one for its full list)</h3>{items}"


def _stats_html(st: dict, out: Path, friedman_text, agreement_text, families: dict | None = None) -> str:
    fr = st["friedman"]
    parts = [f"<p>Per cell: {_e(st['test_label'])}, each method against the cell's best, Holm-corrected, "
             f"α = {st['alpha']:g}; the p-values are in accuracy.csv.</p>"]
    if fr.get("mean_rank"):
        ranks = pd.DataFrame({"method": list(fr["mean_rank"]), "mean rank": list(fr["mean_rank"].values())})
        ranks = with_family(ranks, "method", families)
        parts.append(frame_html(ranks, "ranks", caption=f"Mean rank of {st['metric']} over {fr['n']} cell(s) "
                                                          "(1 = best)", floats="{:.2f}"))
    parts.append(f"<p>Friedman test: {_e(friedman_text(fr))}</p>")
    if (out / "cd_diagram.png").is_file():
        parts.append(image_html(out / "cd_diagram.png", out))
    wtl = st["wtl_text"]
    if wtl is not None:
        parts.append(grid_html(wtl.rename_axis("row vs column"), "wtl",
                               caption=f"Win / tie / loss over cells (tie = not significant at α = {st['alpha']:g}, "
                                       "uncorrected, per cell)", families=families))
    if st.get("wtl_line"):
        parts.append(f"<p>{_e(st['wtl_line'])}</p>")
    ag = st.get("agreement")
    if ag is not None:
        parts.append(f"<p>Agreement with the paper's ordering: {_e(agreement_text(ag))}</p>")
        if ag["cells"]:
            parts.append(frame_html(pd.DataFrame(ag["cells"]), "agreement", floats="{:.3g}"))
    return "".join(parts)


def _figures_html(out: Path) -> str:
    top = sorted(p for p in out.glob("*.png") if p.name != "cd_diagram.png")
    parts = ["<h2>Figures</h2>", *(image_html(p, out) for p in top)]
    runs = sorted(d for d in (out / "runs").glob("*") if d.is_dir()) if (out / "runs").is_dir() else []
    for run in runs:
        images = "".join(image_html(p, out) for p in sorted(run.glob("*.png")))
        if images:
            parts.append(details(f"run {run.name}", images))
    return "".join(parts)


def _commands_html(commands: dict) -> str:
    if not commands or not (commands.get("sweeps") or commands.get("runs")):
        return ""
    parts = ["<h2>Commands that made the runs</h2>"]
    if commands.get("sweeps"):
        parts.append("<p>The sweep (its multirun.yaml):</p><pre>" + _e("\n".join(commands["sweeps"])) + "</pre>")
    if commands.get("runs"):
        lines = "\n".join(f"# {path}\n{cmd}" for path, cmd in commands["runs"])
        parts.append(details(f"each run alone ({len(commands['runs'])}, from its .hydra/overrides.yaml)",
                             f"<pre>{_e(lines)}</pre>"))
    return "".join(parts)
