"""Run one trial's command as a child process, the same way on every backend.

The trainer owns its signal handling (SIGUSR2/SIGTERM → checkpoint → exit ``EXIT_PREEMPTED``; the exit codes and
the command are :mod:`asr_core.contract.trial`'s), so it always runs as a separate process. The child asks the
kernel for SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``), so a killed driver or Ray worker
never leaves an orphan trainer writing to the run; it checkpoints and exits instead.

Each start appends a :data:`SEGMENT_HEADER` line (``==== <time> pid <pid>: <command>``) to the log, so one log
holds every segment of a trial (first start and each resume) in order.

When the trainer has ended, :func:`trainer_ended` reads its exit code the same way for every backend's runner (the
SLURM task, the Ray Tune trainable) and records what the trainer itself could not in ``attempts.jsonl``: a trainer
killed by a signal (SIGKILL: out of memory, or the system) or ending with a code the trial job never uses is
``killed``, and its lease is freed at once (:func:`asr_core.contract.folder.lease.release_if_dead`) so the next start
need not wait for it to go stale; a trainer that found the lease held (``EXIT_FENCED``) is ``fenced`` (not a failure: it
changed nothing). A cancelled trial (``EXIT_CANCELLED``, or its folder holds ``CANCELLED``) is never requeued.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Callable

from asr_core.contract.folder.lease import read_lease, release_if_dead
from asr_core.contract.trial import (EXIT_CANCELLED, EXIT_DIVERGED, EXIT_FAILED, EXIT_FENCED, EXIT_OK, EXIT_PREEMPTED,
                                     EXIT_USAGE, OUTCOME_FAILED, OUTCOME_FENCED, OUTCOME_KILLED, TrialFolder,
                                     record_attempt)
from asr_core.contract.folder.segments import read_segments

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


# ---- how the trainer ended -----------------------------------------------------------------------------------------
ENDS = ("finished", "preempted", "failed", "killed", "fenced", "cancelled")  # TrainerEnd.kind


@dataclass(frozen=True)
class TrainerEnd:
    """How a trainer child ended, for the runner that started it: its exit code ``rc``, ``kind`` (one of
    :data:`ENDS`; only ``preempted`` may be run again by the runner itself, e.g. requeued) and ``message`` (a line
    for the runner's log or its error)."""

    rc: int
    kind: str
    message: str


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _segment_of(trial_dir: Path, job_id: str, segments_before: int) -> int | None:
    """The segment the trainer that just ended started (the newest record after ``segments_before`` with this job
    id, or any newer one when the job id is unknown); None when it started none (it died before)."""
    new = read_segments(trial_dir)[segments_before:]
    mine = [r for r in new if not job_id or r.job == job_id]
    return mine[-1].number if mine else None


def holder(trial_dir: Path) -> str:
    """Who holds the trial's lease, for a fenced trainer's message."""
    info = read_lease(trial_dir)
    return info.describe() if info is not None else "nobody any more"


def trainer_ended(trial_dir: Path, rc: int, *, job_id: str, pid: int, segments_before: int,
                  log_path: Path | None = None) -> TrainerEnd:
    """Classify the exit code ``rc`` of the trainer (pid ``pid``) that ran ``trial_dir`` for job ``job_id`` and
    record in ``attempts.jsonl`` (``by="task"``) what the trial job itself could not: ``killed`` for a signal or an
    exit code the job never uses (its lease freed at once), ``failed`` for an error exit the job did not record
    (e.g. it could not import), ``fenced`` when another trainer held the lease. ``segments_before``: how many
    segment records the folder held when the trainer started (so a requeued job's earlier segment is not taken for
    this one's). Records nothing twice: an outcome the job recorded for its segment stands."""
    folder = TrialFolder(Path(trial_dir))
    cancelled = folder.cancelled.exists()
    if rc == EXIT_OK:
        return TrainerEnd(rc, "finished", "trainer finished")
    if rc == EXIT_CANCELLED or (cancelled and rc in (EXIT_PREEMPTED, EXIT_FAILED)):
        return TrainerEnd(rc, "cancelled", f"trial cancelled (`orchestrate cancel`; exit {rc}); never requeued")
    if rc == EXIT_PREEMPTED:
        return TrainerEnd(rc, "preempted", f"trainer checkpointed and asked to be run again (exit {rc})")
    if rc == EXIT_FENCED:
        who = holder(folder.path)
        record_attempt(folder.path, OUTCOME_FENCED, f"the lease was held by {who}", segment=None, job_id=job_id,
                       by="task")
        return TrainerEnd(rc, "fenced", f"another trainer holds the trial's lease ({who}); this one changed "
                                        "nothing and is not requeued")
    segment = _segment_of(folder.path, job_id, segments_before)
    if rc in (EXIT_FAILED, EXIT_USAGE, EXIT_DIVERGED):
        why = last_line(log_path) if log_path is not None else ""
        record_attempt(folder.path, OUTCOME_FAILED, why or f"trainer exited {rc}", segment=segment, job_id=job_id,
                       by="task")
        return TrainerEnd(rc, "failed", f"trainer failed (exit {rc}): {why or 'see the trial log'}")
    if rc < 0:
        name = _signal_name(-rc)
        why = (f"trainer killed by {name} (out of memory or the system)" if -rc == signal.SIGKILL
               else f"trainer killed by {name}")
    else:
        why = f"trainer exited {rc}, a code the trial job never uses (killed by the system?)"
    if cancelled:
        release_if_dead(folder.path, pid)  # the next start need not wait for it to go stale
        return TrainerEnd(rc, "cancelled", f"trial cancelled; {why}")
    record_attempt(folder.path, OUTCOME_KILLED, why, segment=segment, job_id=job_id, by="task")
    release_if_dead(folder.path, pid)  # the next start need not wait for it to go stale
    return TrainerEnd(rc, "killed", why)
