"""asr_core.runtime.signals.stop_group: a server started in its own session is stopped with its whole process group
(its workers too), a group that ignores SIGTERM is killed after the timeout, and an ended process is left alone."""

from __future__ import annotations

import os
import subprocess
import time

from asr_core.runtime.signals import stop_group


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie whose parent has not reaped it yet counts as ended
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _group(script: str) -> tuple[subprocess.Popen[bytes], int]:
    """A leader running ``script`` in a new session that starts one worker; (leader, worker pid)."""
    p = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    worker = int(p.stdout.readline())  # type: ignore[union-attr]
    return p, worker


def test_the_leader_and_its_workers_end() -> None:
    p, worker = _group("sleep 60 & echo $!; wait")
    stop_group(p, timeout=5)
    assert p.returncode is not None
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def test_a_group_that_ignores_term_is_killed_after_the_timeout() -> None:
    p, worker = _group("trap '' TERM; sleep 60 & echo $!; while true; do sleep 0.1; done")
    t0 = time.monotonic()
    stop_group(p, timeout=0.5)
    assert p.returncode == -9 and 0.4 < time.monotonic() - t0 < 5
    deadline = time.monotonic() + 5
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def test_an_ended_process_is_left_alone() -> None:
    p = subprocess.Popen(["true"], start_new_session=True)
    p.wait()
    stop_group(p)  # no error, no signal to a pid that may have been reused
    assert p.returncode == 0
