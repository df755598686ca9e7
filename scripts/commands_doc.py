"""Writes docs/commands.md from the ``--help`` text of every command, so the reference cannot drift from the code.

    .venv/bin/python scripts/commands_doc.py > docs/commands.md     # regenerate
    .venv/bin/python scripts/commands_doc.py --check                # exit 1 when docs/commands.md is stale

Python commands are asked in this process (their ``main``/``cli`` with ``--help``, stdout and stderr captured), so
the page costs one interpreter start; shell scripts that take ``--help`` are run with it, and those that would act
on any argument (``setup.sh`` installs, ``test.sh`` hands every argument to pytest) are shown by their header
comment instead. Help is formatted at a fixed width (``COLUMNS``), so the page is the same on every terminal. Nothing
here needs SLURM, a GPU or a network.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import runpy
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "commands.md"
WIDTH = "100"  # argparse wraps at $COLUMNS; a fixed width keeps the page byte-identical everywhere
REGENERATE = ".venv/bin/python scripts/commands_doc.py > docs/commands.md"


@dataclass(frozen=True)
class Command:
    """One entry of the page: the command as a user types it, and how to ask it for its help text."""

    shown: str  # e.g. "python -m asr_core train --help"
    help: Callable[[], str]
    section: str


def _call(target: str, argv: list[str]) -> Callable[[], str]:
    """``module:function`` called with ``argv``; what it prints (stdout, then stderr), whatever it returns."""

    def run() -> str:
        module, func = target.split(":")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                getattr(importlib.import_module(module), func)(list(argv))
            except SystemExit:
                pass  # argparse ends --help with exit 0; a dispatcher's usage line with exit 2
        return out.getvalue() + err.getvalue()

    return run


def _script(path: str, argv: list[str]) -> Callable[[], str]:
    """A Python script under scripts/ run as ``__main__`` with ``argv``."""

    def run() -> str:
        out, err = io.StringIO(), io.StringIO()
        saved = sys.argv
        sys.argv = [path, *argv]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    runpy.run_path(str(ROOT / path), run_name="__main__")
                except SystemExit:
                    pass
        finally:
            sys.argv = saved
        return out.getvalue() + err.getvalue()

    return run


def _shell(path: str) -> Callable[[], str]:
    """A shell script that answers ``--help`` before it does anything else."""

    def run() -> str:
        done = subprocess.run(["bash", path, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "COLUMNS": WIDTH})
        return done.stdout + done.stderr

    return run


def _header(path: str) -> Callable[[], str]:
    """A shell script's header comment (from line 2 up to ``set -euo``), for scripts that act on any argument."""

    def run() -> str:
        lines = (ROOT / path).read_text().splitlines()[1:]
        kept = []
        for line in lines:
            if not line.startswith("#"):
                break
            kept.append(line[2:] if line.startswith("# ") else line[1:])
        return "\n".join(kept) + "\n"

    return run


ASR = "asr_core.__main__:main"
ORCH = "orchestrate.cli:main"
ANALYSIS = "analysis.__main__:main"
CONSOLE = "The one command: `asr-study GROUP` (each group is the command it names)"
TRAINER = "The trainer: `python -m asr_core COMMAND`"
ORCHESTRATE = "Sweeps: `orchestrate COMMAND` (also `python -m orchestrate COMMAND`)"
REPORT = "Analysis: `python -m analysis COMMAND`"
TOOLS = "Tools: `python -m MODULE`"
SCRIPTS = "Scripts"


def commands() -> list[Command]:
    """Every command of the project, in the order of the page."""
    out = [Command("asr-study --help", _call("asr_study.cli:main", ["--help"]), CONSOLE),
           Command("asr-study dashboard --help", _call("asr_study.sweep_dashboard:main", ["--help"]), CONSOLE),
           Command("python -m asr_core --help", _call(ASR, ["--help"]), TRAINER)]
    from asr_core.__main__ import COMMANDS as CORE  # every command, in its table's order (bench and lm below)

    for name in (n for n in CORE if n not in ("bench", "lm")):
        out.append(Command(f"python -m asr_core {name} --help", _call(ASR, [name, "--help"]), TRAINER))
    out.append(Command("python -m asr_core bench", _call(ASR, ["bench"]), TRAINER))
    for name in ("train", "decode", "data", "calibrate"):
        out.append(Command(f"python -m asr_core bench {name} --help", _call(ASR, ["bench", name, "--help"]), TRAINER))
    out.append(Command("python -m asr_core lm --help", _call(ASR, ["lm", "--help"]), TRAINER))
    for name in ("text", "train", "ppl", "tune"):
        out.append(Command(f"python -m asr_core lm {name} --help", _call(ASR, ["lm", name, "--help"]), TRAINER))
    out.append(Command("orchestrate --help", _call(ORCH, ["--help"]), ORCHESTRATE))
    for name in ("plan", "submit", "status", "resume", "retry", "cancel", "evaluate", "bench"):
        out.append(Command(f"orchestrate {name} --help", _call(ORCH, [name, "--help"]), ORCHESTRATE))
    out.append(Command("python -m analysis --help", _call(ANALYSIS, ["--help"]), REPORT))
    for name in ("report", "compare"):
        out.append(Command(f"python -m analysis {name} --help", _call(ANALYSIS, [name, "--help"]), REPORT))
    out += [
        Command("python -m orchestrate.tools.loadtest --help", _call("orchestrate.tools.loadtest:main", ["--help"]),
                TOOLS),
        Command("python -m orchestrate.budget.estimate --help",
                _call("orchestrate.budget.estimate:derive_cli", ["--help"]), TOOLS),
    ]
    for path in sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "scripts").glob("*.py")):
        if path != "scripts/commands_doc.py":
            out.append(Command(f"{path} --help", _script(path, ["--help"]), SCRIPTS))
    out += [
        Command("scripts/commands_doc.py --help", lambda: _parser().format_help(), SCRIPTS),
        Command("scripts/demo.sh --help", _shell("scripts/demo.sh"), SCRIPTS),
        Command("scripts/setup.sh (its header)", _header("scripts/setup.sh"), SCRIPTS),
        Command("scripts/test.sh (its header)", _header("scripts/test.sh"), SCRIPTS),
        Command("slurm/mlflow-server.sh --help", _shell("slurm/mlflow-server.sh"), SCRIPTS),
    ]
    return out


def render() -> str:
    """The whole page."""
    os.environ["COLUMNS"] = WIDTH
    parts = ["# Commands\n",
             "Every command's `--help`, as it prints it (generated by `scripts/commands_doc.py`; do not edit: run\n"
             f"`{REGENERATE}` after changing a help text). What each is for: the README's table of\n"
             "commands; how they fit together: [cluster.md](cluster.md) and [ARCHITECTURE.md](ARCHITECTURE.md).\n"]
    section = None
    for cmd in commands():
        if cmd.section != section:
            section = cmd.section
            parts.append(f"\n## {section}\n")
        text = cmd.help().rstrip("\n")
        parts.append(f"\n### `{cmd.shown}`\n\n```text\n{text}\n```\n")
    return "".join(parts)



def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/commands_doc.py",
                                description="print docs/commands.md, the --help text of every command")
    p.add_argument("--check", action="store_true",
                   help="compare with docs/commands.md instead of printing; exit 1 when it differs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    page = render()
    if not args.check:
        sys.stdout.write(page)
        return 0
    current = OUT.read_text() if OUT.exists() else ""
    if current == page:
        return 0
    print(f"docs/commands.md is out of date with the commands' --help texts; regenerate it:\n    {REGENERATE}",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
