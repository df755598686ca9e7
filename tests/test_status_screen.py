"""``orchestrate status`` of a paper-scale sweep (321 trials) fits one screen: drawn in a real 50x160 terminal
(tmux), the header, the counts by state and the time left are all on screen after ``status`` ends, and at each
``--watch`` redraw.

Real pieces: the 321-trial sweep folder of :mod:`orchestrate.tools.fake_sweep` (the trial contract's own writers),
a recorded GPU-hour estimate as ``submit`` writes it, ``status`` run in a fresh process inside a tmux pane whose
screen is read back with ``capture-pane``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from orchestrate.sweep.folder import SweepDir
from orchestrate.tools.fake_sweep import make_fake_sweep

REPO = Path(__file__).resolve().parents[1]
TMUX = shutil.which("tmux")
ROWS, COLS = 50, 160

pytestmark = pytest.mark.skipif(TMUX is None, reason="needs tmux to draw in a terminal of a known size")


@pytest.fixture(scope="module")
def sweep321(tmp_path_factory: pytest.TempPathFactory) -> SweepDir:
    sweep = make_fake_sweep(tmp_path_factory.mktemp("screen"), 321)
    keys = [t.key for t in sweep.read_trials()]
    # what a cluster submit records (orchestrate.budget.recorded): 20 GPU-hours a trial
    (sweep.path / "estimate.json").write_text(json.dumps({"calibration": "a100-paper", "total_gpu_hours": 20.0 * 321,
                                                          "trials": {k: 20.0 for k in keys}}))
    return sweep


class Pane:
    """A tmux server of its own (``-L``) with one detached ROWS x COLS session running a command."""

    def __init__(self, command: str) -> None:
        self.socket = f"status-screen-{uuid.uuid4().hex[:8]}"
        env = f"PYTHONPATH={shlex.quote(str(REPO))} OMP_NUM_THREADS=1 TERM=xterm-256color"
        self.tmux("new-session", "-d", "-s", "s", "-x", str(COLS), "-y", str(ROWS), "-c", str(REPO),
                  f"env {env} {command}; echo __ENDED__; sleep 600")

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        return subprocess.run([TMUX, "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def screen(self) -> str:
        """What the terminal shows now (its ROWS rows, no scrollback)."""
        return self.tmux("capture-pane", "-p", "-t", "s")

    def wait_for(self, *texts: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(t in screen for t in texts):
                return screen
            time.sleep(0.3)
        raise AssertionError(f"not on screen within {timeout:g} s: {texts}\n{screen}")

    def close(self) -> None:
        subprocess.run([TMUX or "tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def status_command(sweep: SweepDir, *args: str) -> str:
    return " ".join(shlex.quote(a) for a in (sys.executable, "-m", "orchestrate", "status", sweep.name,
                                             "--sweep-root", str(sweep.path.parent), "--no-reconcile", *args))


def assert_fits(screen: str, sweep: SweepDir) -> None:
    """The header, every count by state and the time left are on the screen."""
    assert f"sweep {sweep.name} (slurm, 321 models" in screen, screen
    for state in ("FINISHED", "RUNNING", "PREEMPTED", "FAILED", "KILLED", "LOST"):
        assert any(line.split()[:1] == [state] for line in screen.splitlines()), f"{state} scrolled off:\n{screen}"
    assert "time left" in screen, screen
    assert "GPU-hours" in screen and " left" in screen, screen


def test_status_of_321_trials_fits_a_50_row_terminal(sweep321: SweepDir) -> None:
    pane = Pane(status_command(sweep321))
    try:
        screen = pane.wait_for("__ENDED__")
    finally:
        pane.close()
    assert_fits(screen, sweep321)
    assert "ledger:" in screen, screen


def test_status_watch_of_321_trials_redraws_within_the_terminal(sweep321: SweepDir) -> None:
    pane = Pane(status_command(sweep321, "--watch", "2"))
    try:
        first = pane.wait_for("Ctrl-C ends", "time left")
        time.sleep(2.5)  # the next redraw
        again = pane.wait_for("Ctrl-C ends", "time left")
    finally:
        pane.close()
    for screen in (first, again):
        assert_fits(screen, sweep321)
        assert len(screen.rstrip("\n").splitlines()) <= ROWS
    assert "__ENDED__" not in again  # still watching: 32 trials run


def test_status_all_keeps_every_row(sweep321: SweepDir) -> None:
    p = subprocess.run(shlex.split(status_command(sweep321, "--all")), capture_output=True, text=True, cwd=REPO,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr
    assert "failed, killed or lost:" in p.stdout and len(p.stdout.splitlines()) > 150, p.stdout[:3000]
