"""Bad input to any of the three tools exits 2 with one message naming the bad file, key or value, never a traceback.

Each case of the table (``tests/plugins/bad_inputs.py``, which ``scripts/refusal_times.py`` times) runs the real
command (``python -m asr_core|orchestrate|analysis ...``) as a subprocess in a scratch folder and checks: exit status
2, no "Traceback" in its output, every expected piece (the file, key or value, what is valid) named, nothing a user
must not be told (torch's advice to load the file with ``weights_only=False`` would run code from it). Its CPU time is
shown on a failure, not asserted (a speed target is a benchmark's, not a timed test's). The fast tier runs the cases
marked ``fast``; the others are marked slow (each imports torch or pandas).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plugins.bad_inputs import CASES, REPO, Case, Ran, case_args, make_scratch, problems, run_tool


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bad files the cases name, in one folder."""
    return make_scratch(tmp_path_factory.mktemp("bad"))


def _param(c: Case) -> object:
    return pytest.param(c, id=c.id, marks=() if c.fast else (pytest.mark.slow,))


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input_exits_2_naming_it(case: Case, scratch: Path) -> None:
    args = case_args(case, scratch)
    work = scratch / "work" / case.id
    work.mkdir(parents=True)
    ran = run_tool(case.tool, args, work)
    shown = (f"({ran.cpu_s:.1f} s of CPU) python -m {case.tool} {' '.join(args)} -> exit {ran.returncode}:\n"
             f"{ran.out[-3000:]}")
    found = problems(case, scratch, ran)
    assert not found, f"{found}; {shown}"
    # its time is not asserted: speed targets belong in a benchmark (scripts/refusal_times.py), not a timed test on a
    # shared machine; ``cpu_s`` is shown on failure


def test_at_least_thirty_cases_across_the_tools() -> None:
    assert len(CASES) >= 30 and {c.tool for c in CASES} == {"asr_core", "orchestrate", "analysis", "asr_study"}
    assert len({c.id for c in CASES}) == len(CASES)


def test_the_check_finds_each_kind_of_wrong_answer() -> None:
    case = Case("x", "asr_core", ("evaluate", "{d}/a.pt"), ("{d}/a.pt", "not found"))
    assert problems(case, Path("/s"), Ran(2, "evaluate: /s/a.pt: not found", 0.1, 0.1)) == []
    assert problems(case, Path("/s"), Ran(1, "Traceback ...\nload it with weights_only=False", 0.1, 0.1)) == [
        "exit 1, not 2", "'Traceback' in its output", "'weights_only=False' in its output", "'/s/a.pt' not named",
        "'not found' not named"]


# ---- a bug: one line naming a log that holds the traceback, exit 1 --------------------------------------------------
PLANT = """
import sys, {module} as m
def planted(argv):
    raise {error}("planted bug in " + " ".join(argv))
m._main = planted
sys.exit(m.main({argv!r}))
"""
ENTRY_POINTS = (("asr_core", "asr_core.__main__"), ("orchestrate", "orchestrate.cli.commands"),
                ("analysis", "analysis.__main__"))


def _planted(module: str, cwd: Path, argv: list[str], error: str = "RuntimeError", **env: str
             ) -> subprocess.CompletedProcess[str]:
    """``module.main(argv)`` in a subprocess whose command body is replaced by one that raises ``error`` (a bug
    planted where none is known: the entry point, its handler and the log are the real ones)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(cwd / "cache"), **env}
    if "ASR_STUDY_DEBUG" not in env:
        full_env.pop("ASR_STUDY_DEBUG", None)
    code = PLANT.format(module=module, error=error, argv=argv)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("prog,module", ENTRY_POINTS, ids=[p for p, _ in ENTRY_POINTS])
def test_a_planted_bug_prints_one_line_naming_its_log(prog: str, module: str, tmp_path: Path) -> None:
    r = _planted(module, tmp_path, ["plan", "x"])
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: internal error"), r.stderr
    assert "RuntimeError: planted bug in plan x" in lines[0]
    logs = list((tmp_path / "cache" / "long-context-asr-study" / "crash").glob(f"{prog}-*.log"))
    assert len(logs) == 1 and str(logs[0]) in lines[0], (lines, logs)
    text = logs[0].read_text()
    assert "Traceback" in text and "planted bug in plan x" in text and f"command: {prog} plan x" in text


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_lets_the_traceback_through(how: str, tmp_path: Path) -> None:
    argv, env = (["--debug", "plan"], {}) if how == "flag" else (["plan"], {"ASR_STUDY_DEBUG": "1"})
    r = _planted("orchestrate.cli.commands", tmp_path, argv, **env)
    assert r.returncode == 1 and "Traceback" in r.stderr and "planted bug in plan\n" in r.stderr + "\n", r.stderr
    assert not (tmp_path / "cache").exists()  # no log: the traceback was shown


def test_ctrl_c_ends_with_one_line_and_130(tmp_path: Path) -> None:
    r = _planted("analysis.__main__", tmp_path, ["report"], error="KeyboardInterrupt")
    assert r.returncode == 130 and r.stderr.strip() == "analysis: interrupted", r.stderr


def test_the_log_goes_to_the_temporary_folder_where_the_cache_cannot_be_written(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be\n")
    (tmp_path / "t").mkdir()
    r = _planted("asr_core.__main__", tmp_path, ["train"], XDG_CACHE_HOME=str(blocked), TMPDIR=str(tmp_path / "t"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(tmp_path / "t" / "long-context-asr-study-crash") in r.stderr


def test_a_damaged_checkpoint_is_named_not_a_torch_error(scratch: Path) -> None:
    from asr_core.training.checkpoint import CheckpointError, load_for_eval

    with pytest.raises(CheckpointError, match="mismatch.pt: its weights or tokenizer do not fit its config "
                                              r"\(RuntimeError: .*Missing key"):
        load_for_eval(scratch / "mismatch.pt")
    model, cfg, tok = load_for_eval(scratch / "real.pt")  # the fixture itself is a checkpoint
    assert tok.vocab_size == cfg.model.vocab_size
