"""The per-trial fence (``asr_core.contract.folder.lease``), with real processes where it matters.

A holder is a real process (``HOLDER`` below) that takes a lease and answers ``held``/``release`` on stdin, so
liveness is judged from a real pid (running, stopped with SIGSTOP, killed, a zombie). Staleness is reached by
stopping the holder (its heartbeat thread stops with it) under a small ``stale_s``, or, for the takeover race, by
setting the lease file's mtime, which is the heartbeat, into the past.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asr_core.contract.folder.lease import (HOST, KEEP_GENERATIONS, Lease, LeaseDirError, LeaseHeld, LeaseInfo,
                                            read_lease, release_if_dead)
from asr_core.contract.trial import TrialFolder
from asr_core.contract.folder.lease_clock import proc_stat

ROOT = Path(__file__).resolve().parents[1]

HOLDER = r"""
import sys
from asr_core.contract.folder.lease import Lease
trial, job, heartbeat_s, stale_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
lease = Lease(trial, job, heartbeat_s=heartbeat_s, stale_s=stale_s).acquire()
print("ACQUIRED", lease.info.generation, flush=True)
for line in sys.stdin:
    if line.strip() == "held":
        print("HELD", lease.held(), flush=True)
    elif line.strip() == "lost":  # whether its heartbeat has found the lease lost (and said so)
        print("LOST", lease.lost_to is not None, flush=True)
    elif line.strip() == "release":
        lease.release()
        print("RELEASED", flush=True)
"""


class Holder:
    """A real process holding the lease of ``trial`` as ``job``."""

    def __init__(self, trial: Path, job: str, heartbeat_s: float = 30, stale_s: float = 300) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(trial), job, str(heartbeat_s), str(stale_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("ACQUIRED"), line + self.proc.stderr.read()  # type: ignore[union-attr]
        self.pid = self.proc.pid

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:
        h.stop()


def _hold(holders: list[Holder], trial: Path, job: str, **kw: float) -> Holder:
    h = Holder(trial, job, **kw)
    holders.append(h)
    return h


def _files(trial: Path) -> list[str]:
    return sorted(os.listdir(TrialFolder(trial).lease_dir))


def test_acquire_then_another_job_is_refused_naming_the_holder_until_it_releases(tmp_path: Path,
                                                                                 holders: list[Holder]) -> None:
    h = _hold(holders, tmp_path, "123_4")
    info = read_lease(tmp_path)
    assert info is not None and (info.generation, info.job_id, info.host, info.pid) == (1, "123_4", HOST, h.pid)
    assert info.alive() and not info.released and info.took_over is None
    assert info.describe().startswith(f"job 123_4 on {HOST} pid {h.pid}, heartbeat ")

    with pytest.raises(LeaseHeld) as refused:
        Lease(tmp_path, "555").acquire()
    assert refused.value.info.token == info.token and not refused.value.raced
    assert f"job 123_4 on {HOST} pid {h.pid}" in str(refused.value) and str(tmp_path) in str(refused.value)
    assert _files(tmp_path) == ["000001.json"]  # the refused taker wrote nothing
    with pytest.raises(LeaseHeld):  # an empty job id never counts as the holder's own
        Lease(tmp_path, "").acquire()

    assert h.ask("held") == "HELD True"
    assert h.ask("release") == "RELEASED"
    assert h.ask("held") == "HELD False"
    released = read_lease(tmp_path)
    assert released is not None and released.released and not released.alive()
    assert released.describe().endswith(", released")

    with Lease(tmp_path, "555") as mine:
        assert mine.held() and mine.info.generation == 2
        assert mine.info.took_over is None  # a released lease is simply taken, not taken over
        current = read_lease(tmp_path)
        assert (current.token, current.job_id, current.pid) == (mine.info.token, "555", os.getpid())
    assert not mine.held() and read_lease(tmp_path).released


def test_a_stale_lease_is_taken_over_recorded_and_its_old_holder_knows(tmp_path: Path, holders: list[Holder],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    h = _hold(holders, tmp_path, "old_1", heartbeat_s=0.1, stale_s=1.0)
    os.kill(h.pid, signal.SIGSTOP)  # a hung node: the process lives, its heartbeat stops
    with pytest.raises(LeaseHeld):  # not stale yet
        Lease(tmp_path, "new_2", stale_s=1.0).acquire()
    while read_lease(tmp_path).age() < 1.2:
        time.sleep(0.05)
    assert read_lease(tmp_path).alive(stale_s=60) and not read_lease(tmp_path).alive(stale_s=1.0)

    new = Lease(tmp_path, "new_2", stale_s=1.0, heartbeat_s=0.1).acquire()
    try:
        assert new.held() and new.info.generation == 2
        took = new.info.took_over
        assert took is not None and (took["generation"], took["job_id"], took["pid"]) == (1, "old_1", h.pid)
        assert took["reason"].startswith("stale") and took["age_s"] >= 1.0
        recorded = json.loads((TrialFolder(tmp_path).lease_dir / "000002.json").read_text())
        assert recorded["took_over"] == took and recorded["job_id"] == "new_2"
        err = capsys.readouterr().err
        assert f"job new_2 on {HOST} took over the lease from job old_1 on {HOST} pid {h.pid}, heartbeat " in err
        assert "stale: no heartbeat for" in err

        os.kill(h.pid, signal.SIGCONT)  # the hung holder wakes up: the lease is no longer its own
        assert h.ask("held") == "HELD False"
        deadline = time.monotonic() + 30  # its heartbeat thread notices at its next beat (0.1 s; longer under load)
        while h.ask("lost") != "LOST True":
            assert time.monotonic() < deadline, "the woken holder's heartbeat did not find the lease lost in 30 s"
            time.sleep(0.05)
        assert new.held()
    finally:
        new.release()
    h.proc.stdin.close()  # type: ignore[union-attr]
    h.proc.wait(timeout=30)
    assert "lost the lease (generation 1) to job new_2" in h.proc.stderr.read()  # type: ignore[union-attr]


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path: Path, holders: list[Holder],
                                                          reaped: bool) -> None:
    h = _hold(holders, tmp_path, "dead_1")  # default STALE_S: minutes
    h.proc.kill()
    if reaped:
        h.proc.wait()
    else:  # killed but not yet reaped by its parent: a zombie is dead too
        while proc_stat(h.pid) is None or proc_stat(h.pid)[0] != "Z":
            time.sleep(0.01)
    assert not read_lease(tmp_path).alive()
    t0 = time.monotonic()
    with Lease(tmp_path, "next_2") as new:
        assert time.monotonic() - t0 < 5
        assert new.info.took_over["reason"].startswith("dead") and new.info.took_over["pid"] == h.pid


def test_a_reused_pid_is_not_mistaken_for_the_holder(tmp_path: Path) -> None:
    """The pid of a dead holder may belong to another process by now: its start time tells them apart."""
    with Lease(tmp_path, "a", heartbeat_s=0) as held:
        info = held.info
        assert info.pid_start is not None and info.alive()
        assert not LeaseInfo(**{**info.to_dict(), "pid_start": info.pid_start - 1}).alive()


def test_the_same_job_id_takes_over_at_once(tmp_path: Path, holders: list[Holder],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A SLURM task requeued after a node failure keeps its job id; its old incarnation cannot still run."""
    h = _hold(holders, tmp_path, "777_3")
    with Lease(tmp_path, "777_3") as again:
        assert again.info.took_over["reason"].startswith("same job id")
        assert again.info.took_over["pid"] == h.pid
        assert h.ask("held") == "HELD False" and again.held()
    assert f"took over the lease from job 777_3 on {HOST} pid {h.pid}" in capsys.readouterr().err


def test_the_heartbeat_keeps_a_lease_alive_past_stale_s_and_stops_on_release(tmp_path: Path,
                                                                             holders: list[Holder]) -> None:
    h = _hold(holders, tmp_path, "beating", heartbeat_s=0.1, stale_s=0.6)
    time.sleep(2.0)  # more than three times stale_s
    info = read_lease(tmp_path)
    assert info.age() < 0.6 and info.alive(stale_s=0.6)
    with pytest.raises(LeaseHeld):
        Lease(tmp_path, "other", stale_s=0.6).acquire()
    assert h.ask("release") == "RELEASED"
    path = TrialFolder(tmp_path).lease_dir / "000001.json"
    mtime = path.stat().st_mtime
    time.sleep(0.5)
    assert path.stat().st_mtime == mtime  # no heartbeat after release


def _contend(trial: str, job: str, start: multiprocessing.synchronize.Barrier,
             end: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue) -> None:
    start.wait()
    try:
        Lease(trial, job, heartbeat_s=0).acquire()
        results.put((job, "won", ""))
    except LeaseHeld as e:
        results.put((job, "raced" if e.raced else "held", e.info.job_id))
    end.wait()  # the winner stays alive until every contender has tried: a dead winner may be taken over


@pytest.mark.slow
def test_two_processes_racing_to_take_over_a_stale_lease_exactly_one_wins(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    rounds, contenders, raced = 0, 2, 0
    while rounds < 40 or (raced < 5 and rounds < 200):  # until O_EXCL has decided some real races
        r, rounds = rounds, rounds + 1
        trial = tmp_path / f"t{r}"
        old = Lease(trial, "old", heartbeat_s=0).acquire()
        t = time.time() - 1000  # a holder whose heartbeat stopped 1000 s ago
        os.utime(old.path, (t, t))
        start, end, results = ctx.Barrier(contenders), ctx.Barrier(contenders), ctx.Queue()
        procs = [ctx.Process(target=_contend, args=(str(trial), f"c{i}", start, end, results))
                 for i in range(contenders)]
        for p in procs:
            p.start()
        outcome = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        winners = [job for job, how, _ in outcome if how == "won"]
        assert len(winners) == 1, outcome
        assert all(seen == winners[0] for _, how, seen in outcome if how != "won"), outcome  # losers name it
        assert _files(trial) == ["000001.json", "000002.json"] and read_lease(trial).job_id == winners[0]
        assert read_lease(trial).took_over["job_id"] == "old"
        raced += sum(how == "raced" for _, how, _ in outcome)
    # a round is a real race when both contenders saw the stale lease and only O_EXCL decided it
    assert raced > 0, f"no real race in {rounds} rounds: the contenders never overlapped"


def test_release_if_dead_frees_only_a_dead_holders_lease(tmp_path: Path, holders: list[Holder]) -> None:
    h = _hold(holders, tmp_path, "child_9")
    assert not release_if_dead(tmp_path, h.pid)  # still running
    assert not release_if_dead(tmp_path, h.pid + 100000)  # not its pid
    assert not release_if_dead(tmp_path, h.pid, host=f"not-{HOST}")  # not its host
    assert read_lease(tmp_path).alive()
    h.proc.kill()
    h.proc.wait()
    assert release_if_dead(tmp_path, h.pid)
    info = read_lease(tmp_path)
    assert info.released and info.job_id == "child_9" and not info.alive()
    assert not release_if_dead(tmp_path, h.pid)  # already released
    with Lease(tmp_path, "next") as new:
        assert new.info.took_over is None and new.info.generation == 2
    assert not release_if_dead(tmp_path / "no-such-trial", 1)


def test_read_lease_never_raises_on_a_missing_or_half_written_file(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert read_lease(tmp_path / "no-such-trial") is None
    lease_dir = TrialFolder(tmp_path).lease_dir
    lease_dir.mkdir()
    assert read_lease(tmp_path) is None
    # a taker that crashed between creating its generation and writing it: held while young, then stale
    (lease_dir / "000003.json").write_bytes(b"")
    (lease_dir / "junk.txt").write_text("not a lease")
    info = read_lease(tmp_path)
    assert info is not None and (info.generation, info.token, info.pid) == (3, "", 0) and info.alive()
    assert "still being written" in info.describe()
    with pytest.raises(LeaseHeld, match="generation 3, still being written"):
        Lease(tmp_path, "x").acquire()
    (lease_dir / "000003.json").write_bytes(b'{"job_id": "cut')  # cut short
    t = time.time() - 1000
    os.utime(lease_dir / "000003.json", (t, t))
    assert read_lease(tmp_path).token == "" and not read_lease(tmp_path).alive()
    with Lease(tmp_path, "x") as new:
        assert new.info.generation == 4 and new.info.took_over["generation"] == 3
    for text in (b"[1, 2]", b'{"pid": "nine"}', b"\xff\xfe"):
        (lease_dir / "000009.json").write_bytes(text)
        assert read_lease(tmp_path).generation == 9  # read, never raised


def test_old_generations_are_pruned(tmp_path: Path) -> None:
    for _ in range(KEEP_GENERATIONS + 3):
        Lease(tmp_path, "j", heartbeat_s=0).acquire().release()
    last = KEEP_GENERATIONS + 3
    assert _files(tmp_path) == [f"{g:06d}.json" for g in range(last - KEEP_GENERATIONS + 1, last + 1)]
    assert read_lease(tmp_path).generation == last


def test_a_lease_folder_that_cannot_be_written_is_an_os_error_naming_it(tmp_path: Path) -> None:
    TrialFolder(tmp_path).lease_dir.write_text("a file where the lease folder should be")
    with pytest.raises(LeaseDirError) as e:
        Lease(tmp_path, "j").acquire()
    assert isinstance(e.value, OSError) and str(TrialFolder(tmp_path).lease_dir) in str(e.value)
    assert read_lease(tmp_path) is None


def test_settings_come_from_the_environment_and_bad_ones_are_named(tmp_path: Path) -> None:
    code = ("import sys; from asr_core.contract.folder import lease; print(lease.HEARTBEAT_S, lease.STALE_S, "
            "*(m in sys.modules for m in ('torch', 'mlflow', 'numpy')))")  # and nothing heavy is imported
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ORCHESTRATE_LEASE_HEARTBEAT_S": "2.5",
           "ORCHESTRATE_LEASE_STALE_S": "40"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.stdout.split() == ["2.5", "40.0", "False", "False", "False"], done.stderr
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "ORCHESTRATE_LEASE_STALE_S": "five minutes"})
    assert done.returncode != 0 and "ORCHESTRATE_LEASE_STALE_S='five minutes'" in done.stderr
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "ORCHESTRATE_LEASE_STALE_S": "2"})
    assert done.returncode != 0 and "look stale between two heartbeats" in done.stderr


def test_reading_the_leases_of_3000_trials_takes_well_under_a_second(tmp_path: Path) -> None:
    trials = [tmp_path / f"{i:04d}" for i in range(3000)]
    for i, trial in enumerate(trials):
        held = Lease(trial, f"job_{i}", heartbeat_s=0).acquire()
        if i % 2:
            held.release()  # half released, half held by this (live) process: the pid check runs for those
    costs = []
    for _ in range(3):  # CPU seconds (user + system), the best of three: what reading costs, not how busy the
        t0 = time.process_time()  # shared machine is
        alive = [info.alive() for info in map(read_lease, trials)]
        costs.append(time.process_time() - t0)
        assert sum(alive) == 1500
    assert min(costs) < 0.8, f"{min(costs):.2f} CPU s for 3000 leases"  # about 0.2 s, 0.3 s on a busy machine
