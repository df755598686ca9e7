"""Run one trial's command as a child process, the same way on every backend.

The trainer owns its signal handling (SIGUSR2/SIGTERM → checkpoint → exit ``EXIT_PREEMPTED``; the exit codes and
the command are :mod:`asr_core.trial_contract`'s), so it always runs as a separate process. The child asks the
kernel for SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``), so a killed driver or Ray worker
never leaves an orphan trainer writing to the run; it checkpoints and exits instead.

Each start appends a :data:`SEGMENT_HEADER` line (``==== <time> pid <pid>: <command>``) to the log, so one log
holds every segment of a trial (first start and each resume) in order.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Callable

_PR_SET_PDEATHSIG = 1
SEGMENT_HEADER = "==== "  # starts the line the runner writes to the log at every start of the command


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the parent's own signal forwarding still applies
        pass


def last_line(log_path: Path, limit: int = 4000) -> str:
    """The last non-empty line of a log, for error messages."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


class TrialProcess:
    """The trainer child: started, signalled and waited for without ever blocking inside a signal handler."""

    def __init__(self, cmd: list[str], cwd: str | Path, log_path: Path, env: dict[str, str] | None = None) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = open(log_path, "ab", buffering=0)
        header = f"{SEGMENT_HEADER}{time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {' '.join(cmd)}"
        self._log.write(f"\n{header}\n".encode())
        self.proc = subprocess.Popen(cmd, cwd=str(cwd), stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, preexec_fn=_die_with_parent)
        self.signalled: int | None = None

    def forward(self, signum: int) -> None:
        """Pass a scheduler's signal on to the trainer (safe from a signal handler: no waiting here)."""
        self.signalled = signum
        try:
            os.kill(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def wait(self, poll_s: float = 0.5, stop: Callable[[], bool] | None = None,
             stop_signal: int = signal.SIGUSR2) -> int:
        """Exit code of the trainer. Polls so that signal handlers run promptly in the meantime; once ``stop()``
        turns true the trainer gets ``stop_signal`` (checkpoint and exit ``EXIT_PREEMPTED``)."""
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self._log.close()
                return rc
            if stop is not None and stop():
                self.forward(stop_signal)
                stop = None
            time.sleep(poll_s)


def install_forwarding(child: TrialProcess, signals: tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM)) -> None:
    """In the main thread of a batch job: forward the scheduler's signals to the trainer instead of dying."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        child.forward(signum)

    for s in signals:
        signal.signal(s, handler)
