"""A lease is judged by one clock, the shared filesystem's: the holder's heartbeat (its file's mtime) against the
mtime of a probe the reader touches in the lease folder, never against the reader's own clock.

The skew between nodes is simulated by patching ``time.time`` in the reader (the test process; a test-only hook,
named so in each test): the holder is a real process on this host whose heartbeat the filesystem stamps."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asr_core.contract.folder.lease import STALE_S, Lease, LeaseHeld, LeaseInfo, read_lease, write_lease

ROOT = Path(__file__).resolve().parents[1]
SKEW_S = STALE_S + 100  # more than the stale limit: the reader's clock alone would get every verdict wrong
HOLDER = r"""
import sys, time
from asr_core.contract.folder.lease import Lease
lease = Lease(sys.argv[1], "holder_1", heartbeat_s=0.5).acquire()
print("ACQUIRED", flush=True)
sys.stdin.read()
lease.release()
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A real process holding the lease of ``tmp_path``, heartbeating twice a second, until the test ends."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdout.readline().startswith("ACQUIRED")
    time.sleep(1.2)  # a couple of heartbeats
    yield proc
    proc.communicate(timeout=30)


def _skew_reader_clock(monkeypatch: pytest.MonkeyPatch, offset_s: float) -> None:
    """The test-only hook: this process's wall clock runs ``offset_s`` ahead (negative: behind) of the others'."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + offset_s)


def test_live_lease_stays_live_when_reader_clock_is_ahead_by_patched_time_time(
        tmp_path: Path, holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _skew_reader_clock(monkeypatch, SKEW_S)
    info = read_lease(tmp_path)
    assert info is not None and info.job_id == "holder_1"
    assert info.alive(), f"a heartbeating holder looks dead: {info.describe()}"
    assert info.age() < 30
    with pytest.raises(LeaseHeld, match="holder_1"):
        Lease(tmp_path, "other_2", heartbeat_s=0).acquire()


def test_stale_lease_stays_stale_when_reader_clock_is_behind_by_patched_time_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a holder on another node whose heartbeat stopped STALE_S + 200 s ago by the filesystem's clock
    beat = time.time() - (STALE_S + 200)
    write_lease(tmp_path, LeaseInfo(generation=1, job_id="gone_1", host="node-elsewhere", pid=4242, token="t",
                                    acquired=beat, heartbeat=beat, released=False, took_over=None))
    _skew_reader_clock(monkeypatch, -SKEW_S)
    info = read_lease(tmp_path)
    assert info is not None and not info.alive(), f"a dead holder looks alive: {info.describe()}"
    with Lease(tmp_path, "next_2", heartbeat_s=0) as new:
        assert new.info.took_over is not None and new.info.took_over["reason"].startswith("stale")
        assert new.info.took_over["age_s"] >= STALE_S + 150


def test_fs_clock_probe_leaves_no_file_and_ignores_patched_time_time(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from asr_core.contract.folder.lease_clock import fs_now

    _skew_reader_clock(monkeypatch, 1000.0)
    probe_dir = tmp_path / "lease"
    probe_dir.mkdir()
    t = fs_now(probe_dir, max_age_s=0)
    assert abs(t - (time.time() - 1000.0)) < 5  # the filesystem's clock (this machine's kernel), not the patched one
    assert list(probe_dir.iterdir()) == []
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o555)
    if os.access(read_only, os.W_OK):  # root writes anywhere: nothing to show here
        return
    assert fs_now(read_only, max_age_s=0) is None  # cannot probe: the caller falls back to its own clock
