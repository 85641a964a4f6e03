"""Every command shown in README.md and docs/*.md is exercised, so the documentation cannot drift.

Commands are parsed out of the Markdown, so a new page is covered as soon as it exists:
- fenced blocks marked ``bash``, ``sh``, ``shell``, ``console`` or unmarked (``text`` blocks are
  listings, not commands): every line, ``\\`` continuations joined, ``# comments`` dropped, ``NAME="..."``
  assignments expanded where ``$NAME`` is used; in ``console`` blocks the ``$ `` lines are commands
  and the lines after one are its output;
- inline code spans that start with ``fedlnl-run``, ``fedlnl-report`` or ``make`` and an argument
  (a span with ``...`` or ``…`` abbreviates a family of commands and is not one).
``<placeholders>`` become ``x``. How each program is exercised:
- ``fedlnl-run``: as a plan, ``-m ... dry_run=true`` in a scratch directory (exit 0; nothing runs), or
  as typed for ``--help`` / ``--cfg``; a list of seeds is narrowed to its first seed, and a paper
  preset's plan to its first seed and first method unless the command names them
  (tests/test_presets.py checks every preset's grid); a command shown with an error line as
  its output must print exactly that line (``...`` in it matches anything) and exit 2;
- ``fedlnl-report DIR ...``: run with its options on a small sweep of fake runs written here;
- ``make TARGET``: ``make -n`` (the target exists and its recipe expands);
- ``python -m pytest ...``: collected (``--collect-only``); ``python script.py ...``: its ``--help``;
- ``wandb sync ...``: ``wandb sync --help`` (uploading needs an account and the network).
A command of any other program fails the test: the docs show only what a test can run.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import CONF, REPO, SHARED
from test_robustness import cli

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]  # docs/methods/ too
PROGRAMS = ("fedlnl-run", "fedlnl-report", "fedlnl-export", "make", "python", "wandb")
INLINE = ("fedlnl-run ", "fedlnl-report ", "make ")
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")


@dataclass
class Command:
    text: str
    where: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)


def _join(lines: list[str]) -> list[tuple[int, str]]:
    out, buf, start = [], "", 0
    for i, line in lines:
        if not buf:
            start = i
        part = line.strip() if buf else line
        buf += part.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else part
        if not line.rstrip().endswith("\\"):
            out.append((start, buf.strip()))
            buf = ""
    return out


def _strip_comment(line: str) -> str:
    """Drop a trailing `` # comment`` outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"":
            quote = None if quote == ch else (quote or ch)
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def parse(text: str, name: str) -> list[Command]:
    found: list[Command] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if not m:
            found += _inline(lines[i], f"{name}:{i + 1}")
            i += 1
            continue
        lang, body, i = m.group(1), [], i + 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1
        if lang in SHELL_BLOCKS:
            found += _block(body, lang, name)
    return found


def _block(body: list[tuple[int, str]], lang: str, name: str) -> list[Command]:
    found, env = [], {}
    if lang == "console":
        for n, line in body:
            if line.startswith("$ "):
                found.append(Command(line[2:].strip(), [f"{name}:{n}"]))
            elif found and line.strip():
                found[-1].output.append(line)
        return found
    for n, line in _join([(n, _strip_comment(line)) for n, line in body]):
        if not line:
            continue
        if m := re.fullmatch(r"([A-Z_]+)=(.*)", line):
            env[m.group(1)] = shlex.split(m.group(2))[0]
            continue
        line = re.sub(r"\$\{?([A-Z_]+)\}?", lambda v: env.get(v.group(1), v.group(0)), line)
        found.append(Command(line, [f"{name}:{n}"]))
    return found


def _inline(line: str, where: str) -> list[Command]:
    spans = re.findall(r"`([^`]+)`", line)
    return [Command(s.strip(), [where]) for s in spans
            if s.startswith(INLINE) and "..." not in s and "…" not in s]


def all_commands() -> list[Command]:
    unique: dict[str, Command] = {}
    for page in PAGES:
        for cmd in parse(page.read_text(encoding="utf-8"), str(page.relative_to(REPO))):
            known = unique.setdefault(cmd.text, cmd)
            if known is not cmd:
                known.where += cmd.where
                known.output = known.output or cmd.output
    return list(unique.values())


COMMANDS = all_commands()


def test_the_parser_finds_the_commands():
    texts = [c.text for c in COMMANDS]
    assert len(COMMANDS) >= 25, texts
    assert "make run" in texts and "fedlnl-report results/sweeps/my_sweep" in texts
    unknown = [f"{c.where[0]}: {c.text}" for c in COMMANDS if c.text.split()[0] not in PROGRAMS]
    assert not unknown, "commands no test can exercise:\n" + "\n".join(unknown)


def test_parser_on_examples():
    page = ("text `fedlnl-run -m ... dry_run=true` and `make test`\n```bash\nP=\"a=1 b=2\"\n"
            "fedlnl-run -m x=1 $P  # comment\nfedlnl-report d \\\n  --figures none\n```\n```text\nnot a command\n```\n"
            "```console\n$ fedlnl-run bad=1\nfedlnl-run: error: bad\n```\n")
    found = parse(page, "p.md")
    assert [c.text for c in found] == ["make test", "fedlnl-run -m x=1 a=1 b=2", "fedlnl-report d --figures none",
                                       "fedlnl-run bad=1"]
    assert found[-1].output == ["fedlnl-run: error: bad"]


# ---------------------------------------------------------------- running them


@pytest.fixture(scope="module")
def fake_sweep(tmp_path_factory) -> Path:
    """3 methods x 2 noise settings x 2 seeds of fake complete runs with every summary key."""
    from test_report import summary, write_run

    root = tmp_path_factory.mktemp("docs") / "sweep"
    for m, method in enumerate(("fedavg", "fedprox", "fedcorr")):
        for noise in ((0.0, 0.0), (0.6, 0.5)):
            for seed in (0, 1):
                best = 0.6 + 0.1 * m - 0.05 * seed
                s = summary(method, noise, seed, best, (10 * (m + 1), None))
                s.update(best_balanced_acc=best - 0.1, final_balanced_acc=best - 0.11, last10_balanced_acc=best - 0.12,
                         cost_to_target_balanced={"0.5": 20, "0.8": None})
                run = root / f"{method}_{noise[0]}_{seed}"
                write_run(run, s, best)
                rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
                (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "balanced_acc": r["acc"] - 0.1}) + "\n"
                                                           for r in rows))
    return root


def _words(text: str) -> list[str]:
    return shlex.split(re.sub(r"<[^>]*>", "x", text))


def _first(preset: str, key: str) -> str | None:
    params = OmegaConf.load(CONF / "paper" / f"{preset}.yaml").hydra.sweeper.params
    value = params.get(key)
    return None if value is None else str(value).split(",")[0]


def plan_args(args: list[str]) -> list[str]:
    if "--help" in args or "--cfg" in args:
        return args
    args = (["-m"] if "-m" not in args else []) + args + ([] if "dry_run=true" in args else ["dry_run=true"])
    args = [a.split(",")[0] if a.startswith("seed=") else a for a in args]  # seeds never change validity
    preset = next((a.split("=", 1)[1] for a in args if a.startswith("paper=")), None)
    if preset:
        for key in ("seed", "method"):
            if not any(a.startswith(f"{key}=") for a in args) and (first := _first(preset, key)) is not None:
                args.append(f"{key}={first}")
    return args


def _expect_error(cmd: Command, code: int, out: str) -> None:
    expected = next(line for line in cmd.output if "error:" in line)
    printed = [line for line in out.splitlines() if "error:" in line]
    pattern = ".*".join(map(re.escape, expected.split("...")))
    assert code == 2 and len(printed) == 1 and re.fullmatch(pattern, printed[0]), (expected, printed)


def run_fedlnl(cmd: Command, args: list[str], tmp_path: Path) -> None:
    if any("cifar10_jpeg" in a or a == "noise=cifarn" for a in args) and not (SHARED / "data").is_dir():
        pytest.skip(f"shared data not found at {SHARED}/data")
    tuned = next((a.split("=", 1)[1] for a in args if a.startswith("tuned=")), None)
    if tuned is not None:  # the results of an experiment=tune run, as it writes them: one study per method
        for method in (CONF / "method").glob("*.yaml"):
            study = tmp_path / tuned / method.stem
            study.mkdir(parents=True)
            (study / "optimization_results.yaml").write_text(f"name: optuna\nbest_params: {{}}\nbest_value: 0.5\n"
                                                             f"objective: selected_val_acc\nmethod: {method.stem}\n")
    where = next((a.split("=", 1)[1] for a in args if a.startswith("federation=")), None)
    if where is not None:  # an export of the same setting, as fedlnl-export writes it
        run_export([f"out={where}", *(a for a in args if a.split("=", 1)[0] in FEDERATION_KEYS)], tmp_path)
    if cmd.output:  # shown with its refusal: the very line, exit 2
        code, out, err = cli(args, tmp_path)
        _expect_error(cmd, code, out + err)
        return
    code, out, err = cli(plan_args(args), tmp_path)
    assert code == 0, f"{cmd.where}: {cmd.text}\n{(out + err)[-3000:]}"


#: the overrides an export needs to match a run's federation (the run-only keys left out)
FEDERATION_KEYS = ("dataset", "partition", "noise", "seed", "fl.num_clients", "selection.val_share",
                   "selection.client_test_size", "noise.rho_tau", "noise.rho", "noise.tau", "partition.p",
                   "partition.alpha_dir", "experiment", "debug")


def run_export(args: list[str], tmp_path: Path) -> None:
    """fedlnl-export as typed (on digits it takes seconds), in the scratch directory."""
    if any("cifar10_jpeg" in a or a == "noise=cifarn" for a in args) and not (SHARED / "data").is_dir():
        pytest.skip(f"shared data not found at {SHARED}/data")
    res = subprocess.run([sys.executable, "-m", "fedlnl.benchmark.export", *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]


def run_report(args: list[str], sweep: Path, tmp_path: Path) -> None:
    from fedlnl.benchmark import report

    takes_value = {"--by", "--rows", "--metric", "--beside", "--ratio-to", "--reference", "--figures", "--alpha",
                   "--test", "--wandb", "--out"}
    out, skip = [], False
    for a in args:
        if skip or a.startswith("-"):
            out.append(a)
            skip = a in takes_value
            continue
        out.append(str(sweep))  # DIR: the fake sweep
    assert report.main(out + ["--out", str(tmp_path / "report")]) == 0


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.text[:80] for c in COMMANDS])
def test_command(cmd: Command, fake_sweep: Path, tmp_path: Path):
    program, *args = _words(cmd.text)
    if program == "fedlnl-run":
        run_fedlnl(cmd, args, tmp_path)
    elif program == "fedlnl-report":
        run_report(args, fake_sweep, tmp_path)
    elif program == "fedlnl-export":
        run_export(args, tmp_path)
    elif program == "make":
        res = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    elif program == "python" and args[:2] == ["-m", "pytest"]:
        res = subprocess.run([sys.executable, *args, "--collect-only", "-q"], cwd=REPO, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-2000:]
    elif program == "python":
        res = subprocess.run([sys.executable, args[0], "--help"], cwd=REPO, capture_output=True, text=True)
        assert res.returncode == 0 and "usage" in res.stdout.lower(), res.stderr[-2000:]
    elif program == "wandb":
        pytest.importorskip("wandb")
        res = subprocess.run([sys.executable, "-m", "wandb", args[0], "--help"], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
    else:
        pytest.fail(f"{cmd.where}: no test can run {program}")
