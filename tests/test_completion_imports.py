"""Shell completion stays light: a Tab runs the console script as bash's hook runs it (``_ARGCOMPLETE``,
``COMP_LINE``, ``COMP_POINT``, the answer on fd 8) and the process imports none of torch, mlflow, ray or pandas
(read from ``-X importtime``), so it answers in a fraction of a second; subcommand names complete, not file names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr_study.complete import LM_SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "mlflow", "ray", "pandas", "scipy")


def tab(module: str, line: str, cwd: Path) -> tuple[set[str], set[str]]:
    """The candidates ``python -m module`` offers for ``line`` (cursor at its end), read from fd 8 as bash reads
    them, and the top-level packages the process imported."""
    env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_SHELL": "bash", "COMP_LINE": line,
           "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\013", "_ARGCOMPLETE_SUPPRESS_SPACE": "1"}
    env.pop("_ARGCOMPLETE_STDOUT_FILENAME", None)
    env.pop("ASR_STUDY_COMPLETING", None)
    hook = '"$@" 8>&1 9>/dev/null 1>/dev/null </dev/null'  # as argcomplete's bash hook: the answer on fd 8
    r = subprocess.run(["bash", "-c", hook, "tab", sys.executable, "-X", "importtime", "-m", module], cwd=cwd,
                       env=env, capture_output=True, text=True, timeout=60)
    answer = r.stdout
    assert r.returncode == 0, r.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in r.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    return {c.strip() for c in answer.split("\013")} - {""}, imported


@pytest.mark.parametrize("module, line, expected", [
    ("orchestrate", "orchestrate pl", {"plan"}),
    ("orchestrate", "orchestrate re", {"resume", "retry"}),
    ("orchestrate", "orchestrate retry x --fa", {"--failed"}),
    ("asr_study", "asr-study or", {"orchestrate"}),
    ("asr_study", "asr-study orchestrate pl", {"plan"}),
    ("asr_study", "asr-study core ", {"train", "evaluate", "lm", "bench"}),
    ("asr_study", "asr-study core lm ", set(LM_SUBCOMMANDS)),
    ("asr_study", "asr-study core lm ppl --lm-c", {"--lm-contexts"}),
    ("asr_study", "asr-study core bench ", {"train", "decode"}),
    ("asr_study", "asr-study core evaluate --str", {"--stride"}),
    ("asr_study", "asr-study core train --ru", {"--run-id"}),
    ("asr_study", "asr-study core params --s", {"--set"}),
    ("asr_study", "asr-study dashboard --p", {"--port"}),
    ("asr_study", "asr-study analysis ", {"report", "compare"}),
    ("asr_study", "asr-study analysis report --heads-repr ", {"A", "Q", "K", "V", "Y"}),
    ("asr_study", "asr-study analysis compare x --boot", {"--bootstrap"}),
])
def test_a_tab_completes_names_without_importing_torch(module: str, line: str, expected: set[str],
                                                       tmp_path: Path) -> None:
    (tmp_path / "plan.txt").write_text("a file a wrong completion would offer\n")
    got, imported = tab(module, line, tmp_path)
    assert expected <= got and "plan.txt" not in got, f"{line!r}: offered {sorted(got)}"
    assert not imported & set(HEAVY), f"{line!r} imported {sorted(imported & set(HEAVY))}"


def test_the_lm_subcommands_completed_are_the_ones_dispatched() -> None:
    from asr_core.lm.cli import SUBCOMMANDS

    assert tuple(SUBCOMMANDS) == LM_SUBCOMMANDS
