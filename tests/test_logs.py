"""``orchestrate logs SWEEP KEY [-f]``: a trial's log with progress bars at their last state, found by key, key
prefix or label; an unknown sweep or KEY exits 2 in one line; ``-f`` follows the log as the job writes it and ends
on Ctrl-C with 130 and no traceback.

Real pieces: a sweep folder of :mod:`orchestrate.tools.fake_sweep`, ``logs`` run in a fresh process as a person runs
it, a real SIGINT.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asr_core.contract.trial import TrialFolder
from orchestrate.cli.logs import LogFollower, collapse, collapse_line
from orchestrate.sweep.folder import SweepDir
from orchestrate.tools.fake_sweep import make_fake_sweep

REPO = Path(__file__).resolve().parents[1]
BAR = "epoch 1:  10%|#         | 1/10\repoch 1:  50%|#####     | 5/10\repoch 1: 100%|##########| 10/10\n"


def logs(sweep: SweepDir, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrate", "logs", sweep.name, *args, "--sweep-root",
                           str(sweep.path.parent)], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepDir:
    return make_fake_sweep(tmp_path_factory.mktemp("logs"), 6, backend="local", mix=(("finished", 1.0),))


def test_collapse_keeps_the_last_state_of_each_carriage_return_run() -> None:
    assert collapse_line("a\rb\rc") == "c"
    assert collapse_line("plain") == "plain"
    assert collapse_line("done 100%\r") == "done 100%"  # a bar's last redraw, or a CRLF line
    assert collapse_line("x\r50%\r") == "50%"
    assert collapse("one\n" + BAR + "two\r\n") == "one\nepoch 1: 100%|##########| 10/10\ntwo\n"


def test_a_follower_hands_back_whole_lines_and_the_partial_one_at_its_last_state(tmp_path: Path) -> None:
    log = tmp_path / "trial.log"
    reader = LogFollower(log)
    assert reader.read() == [] and reader.partial() == ""  # not written yet
    log.write_text("start\nstep 1\r")
    assert reader.read() == ["start"] and reader.partial() == "step 1"
    with open(log, "a") as f:
        f.write("step 2\rstep 3\nend\n")
    assert reader.read() == ["step 3", "end"] and reader.partial() == ""
    log.write_text("new\n")  # replaced: read from its start again
    assert reader.read() == ["new"]


def test_logs_prints_a_trials_log_collapsed_found_by_key_prefix_or_label(sweep: SweepDir) -> None:
    t = sweep.read_trials()[0]
    log = TrialFolder(sweep.trial_dir(t.key)).log
    log.write_text("[train] step 1 loss 4.0\n" + BAR + "[eval] dev 10.5\n")
    for name in (t.key, t.key[:8], t.label):
        p = logs(sweep, name)
        assert p.returncode == 0, p.stderr
        assert p.stdout == "[train] step 1 loss 4.0\nepoch 1: 100%|##########| 10/10\n[eval] dev 10.5\n"
        assert "\r" not in p.stdout


def test_an_unknown_key_or_sweep_exits_2_in_one_line(sweep: SweepDir) -> None:
    p = logs(sweep, "no-such-trial")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert "'no-such-trial'" in p.stderr and f"sweep {sweep.name!r}" in p.stderr and "key prefix or label" in p.stderr
    p = subprocess.run([sys.executable, "-m", "orchestrate", "logs", "no-such-sweep", "k", "--sweep-root",
                        str(sweep.path.parent)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "no sweep 'no-such-sweep'" in p.stderr and "--sweep-root" in p.stderr


def test_a_trial_without_a_log_says_so(sweep: SweepDir) -> None:
    t = sweep.read_trials()[1]
    TrialFolder(sweep.trial_dir(t.key)).log.unlink()
    p = logs(sweep, t.key)
    assert p.returncode == 1 and "has no log yet" in p.stderr and "logs -f" in p.stderr and "Traceback" not in p.stderr


def test_follow_prints_what_the_job_writes_until_ctrl_c(sweep: SweepDir) -> None:
    t = sweep.read_trials()[2]
    log = TrialFolder(sweep.trial_dir(t.key)).log
    log.write_text("first\n")
    p = subprocess.Popen([sys.executable, "-m", "orchestrate", "logs", sweep.name, t.key, "-f", "--sweep-root",
                          str(sweep.path.parent)], cwd=REPO, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        assert p.stdout is not None
        assert p.stdout.readline() == "first\n"
        with open(log, "a") as f:
            f.write("a 10%\ra 90%\ra 100%\nsecond\n")
        assert p.stdout.readline() == "a 100%\n"
        assert p.stdout.readline() == "second\n"
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "Traceback" not in err
