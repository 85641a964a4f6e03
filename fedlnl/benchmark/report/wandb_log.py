"""The report in W&B: one run named ``report`` (job type ``report``) in the sweep's W&B group and
project, with every table as a W&B table, every figure as an image and the page as HTML. The mode
(offline by default) is the runs' own ``logger.mode``; an offline report run lies in
``<report dir>/wandb/`` and is uploaded with ``wandb sync`` like the runs. wandb is imported only
here and only when logging."""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pandas as pd

from fedlnl.benchmark.report.cells import canon
from fedlnl.benchmark.report.tables import with_family

log = logging.getLogger(__name__)
MODES = ("auto", "on", "off")


def sweep_dir(run_dir: Path, root: Path | None) -> Path:
    """The sweep directory of a run: the nearest folder above it with Hydra's multirun.yaml, else
    the directory the report reads (``root``), else the run's parent."""
    for folder in run_dir.parents:
        if (folder / "multirun.yaml").is_file():
            return folder
        if root is not None and folder == root:
            return root
    return run_dir.parent


def target(frame: pd.DataFrame, root: Path | None = None) -> dict | None:
    """project, entity, mode and group of the runs that logged to W&B (the most common group:
    "<name>/<sweep dir>", as the runner names it), or None when no run did."""
    if "config.logger.kind" not in frame:
        return None
    used = frame[frame["config.logger.kind"].map(canon) == "wandb"]
    if used.empty:
        return None
    first = used.iloc[0]
    root = root.resolve() if root is not None else None
    groups = Counter(f"{canon(r.get('config.name'))}/{sweep_dir(Path(str(r['path'])).resolve(), root).name}"
                     for _, r in used.iterrows())
    return {"project": canon(first.get("config.logger.project")) or "fedlnl",
            "entity": canon(first.get("config.logger.entity")),
            "mode": canon(first.get("config.logger.mode")) or "offline",
            "group": groups.most_common(1)[0][0]}


def maybe_log(rep, frame: pd.DataFrame, out: Path, when: str = "auto", root: Path | None = None) -> Path | None:
    """Log the report when ``when`` is "on", or "auto" and the runs used logger=wandb; a failure
    of W&B is one warning, never a failed report."""
    if when == "off":
        return None
    where = target(frame, root)
    if where is None and when == "auto":
        return None
    where = where or {"project": "fedlnl", "entity": None, "mode": "offline", "group": out.parent.name}
    try:
        return log_report(rep, out, **where)
    except Exception as err:  # W&B trouble never costs the files already written
        log.warning("W&B: the report was not logged (%s: %s)", type(err).__name__, str(err).splitlines()[0])
        return None


def log_report(rep, out: Path, project: str, entity: str | None, mode: str, group: str) -> Path:
    import wandb

    run = wandb.init(project=project, entity=entity, group=group, name="report", job_type="report",
                     dir=str(out), mode=mode, reinit="finish_previous",
                     config={"metric": rep.metric.main, "beside": rep.metric.beside,
                             "test": rep.statistics.get("test"), "alpha": rep.statistics.get("alpha")},
                     settings=wandb.Settings(silent=True, console="off"))
    try:
        for name, table in tables(rep).items():
            run.log({f"tables/{name}": wandb.Table(dataframe=table.astype(str))})
        for png in sorted(out.rglob("*.png")):
            if "wandb" not in png.relative_to(out).parts:
                run.log({f"figures/{png.relative_to(out).with_suffix('').as_posix()}": wandb.Image(str(png))})
        page = out / "report.html"
        if page.is_file():
            run.log({"report": wandb.Html(page.read_text(encoding="utf-8"))})
        fr = rep.statistics.get("friedman") or {}
        for key in ("statistic", "p", "cd"):
            if key in fr:
                run.summary[f"friedman/{key}"] = fr[key]
        pooled = (rep.statistics.get("agreement") or {}).get("pooled")
        if pooled and pooled.get("pairs"):
            run.summary["agreement/pooled_tau"] = pooled["tau"]
        run_dir = Path(run.dir).parent
    finally:
        run.finish()
    if mode == "offline":
        print(f"W&B: report run logged offline in group {group}; upload with `wandb sync {run_dir}`")
    else:
        print(f"W&B: report run logged in group {group} of project {project}")
    return run_dir


def tables(rep) -> dict[str, pd.DataFrame]:
    """Every table of the report as a flat frame: the long accuracy table, the communication
    sections, ranks, win/tie/loss, agreement, detection, compute, per-client accuracy and noise."""
    out = {"accuracy": pd.concat(rep.tables, ignore_index=True)}
    text, _ = rep.grid
    rows = text.index.name
    out["accuracy_grid"] = with_family(text.reset_index(), rows, rep.families)
    for i, (title, grid) in enumerate(rep.comm):
        out[f"comm_{i}"] = with_family(grid.reset_index(), rows, rep.families).assign(table=title)
    fr = rep.statistics.get("friedman") or {}
    if fr.get("mean_rank"):
        ranks = pd.DataFrame({"row": list(fr["mean_rank"]), "mean_rank": list(fr["mean_rank"].values())})
        out["ranks"] = with_family(ranks, "row", rep.families)
    if rep.statistics.get("wtl"):
        out["win_tie_loss"] = pd.DataFrame(rep.statistics["wtl"])
    if (rep.statistics.get("agreement") or {}).get("cells"):
        out["agreement"] = pd.DataFrame(rep.statistics["agreement"]["cells"])
    if rep.detection is not None:
        out["detection"] = rep.detection.reset_index()
    if rep.compute is not None:
        out["compute"] = rep.compute.reset_index()
    if rep.clients is not None:
        out["clients"] = rep.clients.reset_index()
    if rep.noise is not None:
        out["noise"] = rep.noise
    return out
