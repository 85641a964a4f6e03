"""The commands that made a sweep's runs, from the files Hydra wrote: the sweep's ``multirun.yaml``
(the ``fedlnl-run -m`` command line) and every run's ``.hydra/overrides.yaml`` (its own overrides,
which rerun exactly that run)."""
from __future__ import annotations

import logging
import shlex
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from fedlnl.benchmark.report.cells import NOT_RUN, canon

log = logging.getLogger(__name__)


def _command(overrides, multirun: bool) -> str:
    args = [shlex.quote(str(o)) for o in overrides if str(o) != "hydra.mode=MULTIRUN"]
    return " ".join(["fedlnl-run", *(["-m"] if multirun else []), *args])


def sweep_command(path: Path) -> str | None:
    """``fedlnl-run -m ...`` from a sweep directory's multirun.yaml (Hydra's own overrides too)."""
    try:
        over = OmegaConf.to_container(OmegaConf.load(path), resolve=False)["hydra"]["overrides"]
    except Exception as err:  # an unreadable file loses its command line, never the report
        log.warning("cannot read the sweep command of %s: %s", path, err)
        return None
    return _command([*(over.get("hydra") or []), *(over.get("task") or [])], multirun=True)


def run_command(run_dir: Path) -> str | None:
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    try:
        return _command(OmegaConf.to_container(OmegaConf.load(path)) or [], multirun=False)
    except Exception as err:
        log.warning("cannot read %s: %s", path, err)
        return None


def run_commands(frame: pd.DataFrame) -> dict:
    """{"sweeps": [one command per multirun.yaml beside the runs], "runs": [(run dir, command)]}."""
    paths = [Path(str(p)) for p, s in zip(frame.get("path", []), frame.get("status", []))
             if canon(p) not in (None, "") and s != NOT_RUN]
    sweeps = sorted({p.parent / "multirun.yaml" for p in paths if (p.parent / "multirun.yaml").is_file()})
    return {"sweeps": [c for c in map(sweep_command, sweeps) if c],
            "runs": [(str(p), c) for p in sorted(paths) if (c := run_command(p))]}
