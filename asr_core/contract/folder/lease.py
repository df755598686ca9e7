"""The per-trial fence: an exclusive lease that the trial job takes before it touches the checkpoint or the run.

Two trainers must never run one trial: they would write one checkpoint and one MLflow run at once. The scheduler's
queue cannot promise that (``PrivateData=jobs`` hides other users' jobs; a finishing task stays COMPLETING), so the
trial folder itself holds the fence, in ``TRIAL_DIR/lease/`` (:attr:`~asr_core.contract.trial.TrialFolder.lease_dir`).

Layout (no ``flock``, so it works on NFS and Lustre)
    One file per lease *generation*, ``lease/000007.json``, created with ``O_CREAT | O_EXCL`` (atomic on NFSv3+ and
    Lustre) and holding the holder's job id, host, pid (and the pid's start time, to tell a reused pid), a random
    token, the time it was acquired and, after a takeover, ``took_over`` (the lease it replaced and why). The newest
    generation is the current lease. Taking a lease is creating generation ``g + 1``: of two takers only one
    creates it, the other raises :class:`LeaseHeld`. A holder that finds a newer generation has lost the lease.

Heartbeat
    The file's mtime: a daemon thread sets it (``os.utime`` with no time, so the filesystem stamps it) every
    :data:`HEARTBEAT_S` seconds while the lease is held, and stops on release or when the lease is lost. A lease
    whose heartbeat is older than :data:`STALE_S` is stale, its age read on the filesystem's clock
    (:func:`asr_core.contract.folder.lease_clock.fs_now`: a probe file touched in the lease folder), not the reader's: a
    skew between nodes changes no verdict. Release rewrites the file (write a temporary file, ``os.replace`` it over
    the generation) with ``released: true``. Readers on other nodes see an mtime or a new generation after their
    NFS attribute cache expires (at most a minute by default), which is why :data:`STALE_S` is minutes, not
    seconds.

Taking over
    :meth:`Lease.acquire` takes the lease when there is none, or the current one is released, stale, held by a dead
    pid on this host (seen at once; a zombie or a reused pid counts as dead), or held by the same non-empty job id
    (a SLURM task requeued after a node failure keeps its job id, and SLURM never runs two incarnations of one job
    at once). A takeover is recorded in the new generation's ``took_over`` and in one line on stderr. Otherwise it
    raises :class:`LeaseHeld`, whose message names the holder. Old generations are pruned (the newest
    :data:`KEEP_GENERATIONS` stay).

:func:`read_lease` and :meth:`LeaseInfo.alive` are cheap (one ``listdir``, one small read; no heavy imports) and
never raise on a missing or half-written file: a generation still being written reads as a lease with no holder
yet, alive while its mtime is young.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from asr_core.contract.folder.lease_clock import fs_now, pid_alive, pid_start
from asr_core.contract.trial import TrialFolder

ENV_HEARTBEAT_S = "ORCHESTRATE_LEASE_HEARTBEAT_S"
ENV_STALE_S = "ORCHESTRATE_LEASE_STALE_S"
KEEP_GENERATIONS = 4  # generation files kept in lease/ (the current one and the few it replaced, for the record)
_NAME = re.compile(r"^(\d+)\.json$")
_MAX_BYTES = 65536  # a lease file is a few hundred bytes; anything longer is not one


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"environment variable {name}={raw!r} is not a positive number of seconds; set it to one "
                         f"(default {default:g}) or unset it")
    return value


HEARTBEAT_S: float = _seconds(ENV_HEARTBEAT_S, 30.0)  # how often a holder refreshes its lease
STALE_S: float = _seconds(ENV_STALE_S, 300.0)  # a lease whose heartbeat is older than this may be taken over
if HEARTBEAT_S >= STALE_S:
    raise ValueError(f"{ENV_HEARTBEAT_S}={HEARTBEAT_S:g} s but {ENV_STALE_S}={STALE_S:g} s: a live holder would look "
                     f"stale between two heartbeats; make {ENV_STALE_S} several times {ENV_HEARTBEAT_S}")
HOST = socket.gethostname()


# ---- the lease record ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeaseInfo:
    """One lease generation, as read from ``lease/NNNNNN.json`` (``heartbeat`` is the file's mtime).

    A generation whose file is still being written (or was left empty by a crash while it was created) reads with
    an empty ``token`` and no holder: alive while its mtime is younger than ``stale_s``."""

    generation: int
    job_id: str
    host: str
    pid: int
    token: str
    acquired: float
    heartbeat: float
    released: bool
    took_over: dict | None
    pid_start: int | None = None  # the holder's start time (``/proc/PID/stat`` ticks), to tell a reused pid
    # the filesystem's clock minus time.monotonic() when this was read (None: no probe; this host's clock is used)
    clock: float | None = field(default=None, compare=False, repr=False)

    def age(self, now: float | None = None) -> float:
        """Seconds since the last heartbeat, on the filesystem's clock when it was probed (else this host's)."""
        if now is None:
            now = time.time() if self.clock is None else time.monotonic() + self.clock
        return max(0.0, now - self.heartbeat)

    def alive(self, now: float | None = None, stale_s: float | None = None) -> bool:
        """Not released, heartbeat younger than ``stale_s`` (default :data:`STALE_S`) and, when the holder runs on
        this host, its pid still running."""
        if self.released:
            return False
        if self.age(now) >= (STALE_S if stale_s is None else stale_s):
            return False
        if self.host and self.host == HOST and not pid_alive(self.pid, self.pid_start):
            return False
        return True

    def holder(self) -> str:
        """``job 123_4 on node7 pid 991`` (``node7 pid 991`` without a job id)."""
        if not self.token:
            return f"generation {self.generation}, still being written"
        where = f"{self.host or 'an unknown host'} pid {self.pid}"
        return f"job {self.job_id} on {where}" if self.job_id else where

    def describe(self) -> str:
        """``job 123_4 on node7 pid 991, heartbeat 12 s ago`` (``, released`` once released)."""
        text = f"{self.holder()}, heartbeat {self.age():.0f} s ago"
        return text + ", released" if self.released else text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _file(lease_dir: Path, generation: int) -> Path:
    return lease_dir / f"{generation:06d}.json"


def _generations(lease_dir: Path) -> list[int]:
    """The generation numbers in ``lease_dir``, oldest first (none when it does not exist)."""
    try:
        names = os.listdir(lease_dir)
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _NAME.match(n)))


def _read(lease_dir: Path, generation: int) -> LeaseInfo | None:
    """One generation's record; None when its file is gone or unreadable."""
    try:
        with open(_file(lease_dir, generation), "rb") as f:
            mtime = os.fstat(f.fileno()).st_mtime
            data = f.read(_MAX_BYTES)
    except OSError:
        return None
    try:
        d = json.loads(data)
        if not isinstance(d, dict):
            raise ValueError("not an object")
        clock = None if d.get("released") else _fs_clock(lease_dir)  # a released lease needs no clock (no probe)
        took = d.get("took_over")
        start = d.get("pid_start")
        return LeaseInfo(generation=generation, job_id=str(d.get("job_id") or ""), host=str(d.get("host") or ""),
                         pid=int(d.get("pid") or 0), token=str(d.get("token") or ""),
                         acquired=float(d.get("acquired") or mtime), heartbeat=mtime,
                         released=bool(d.get("released")), took_over=took if isinstance(took, dict) else None,
                         pid_start=int(start) if isinstance(start, int) else None, clock=clock)
    except (ValueError, TypeError):  # being written (empty or cut short): a lease without a holder yet
        return LeaseInfo(generation=generation, job_id="", host="", pid=0, token="", acquired=mtime,
                         heartbeat=mtime, released=False, took_over=None, clock=_fs_clock(lease_dir))


def _fs_clock(lease_dir: Path) -> float | None:
    """The filesystem's clock in ``lease_dir`` minus ``time.monotonic()`` (:attr:`LeaseInfo.clock`); None when it
    cannot be probed."""
    fs = fs_now(lease_dir)
    return None if fs is None else fs - time.monotonic()


def read_lease(trial_dir: Path | str) -> LeaseInfo | None:
    """The newest lease generation of a trial folder, or None when it has none (or it cannot be read)."""
    lease_dir = TrialFolder(Path(trial_dir)).lease_dir
    gens = _generations(lease_dir)
    return _read(lease_dir, gens[-1]) if gens else None


def _record(info: LeaseInfo, **extra: Any) -> bytes:
    # the heartbeat is the file's mtime; the clock is the reader's
    d = {k: v for k, v in info.to_dict().items() if k not in ("heartbeat", "clock")}
    return (json.dumps({**d, **extra}) + "\n").encode()


def _rewrite(lease_dir: Path, info: LeaseInfo, **extra: Any) -> None:
    """Replace a generation's file atomically (temporary file + ``os.replace``) with ``info`` and ``extra``."""
    path = _file(lease_dir, info.generation)
    tmp = lease_dir / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        tmp.write_bytes(_record(info, **extra))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_lease(trial_dir: Path | str, info: LeaseInfo) -> Path:
    """Write generation ``info`` as it is, its heartbeat (the file's mtime) included; returns the file. For tools
    that build a trial folder as a job left it: taking a lease is :meth:`Lease.acquire`."""
    lease_dir = TrialFolder(Path(trial_dir)).lease_dir
    lease_dir.mkdir(parents=True, exist_ok=True)
    _rewrite(lease_dir, info)
    path = _file(lease_dir, info.generation)
    os.utime(path, (info.heartbeat, info.heartbeat))
    return path


# ---- errors --------------------------------------------------------------------------------------------------------
class LeaseHeld(Exception):
    """Another live trainer holds the trial's lease; ``info`` names it. ``raced``: this taker saw a lease it could
    take over, but another taker created the next generation first."""

    def __init__(self, info: LeaseInfo, trial_dir: Path | str = "", raced: bool = False) -> None:
        self.info = info
        self.trial_dir = str(trial_dir)
        self.raced = raced
        how = "another trainer took it over first: " if raced else ""
        super().__init__(
            f"the lease of trial {self.trial_dir or '?'} is held by {how}{info.describe()}; this trainer stops "
            "without touching the checkpoint or the run. The lease is free once its holder releases it or exits "
            f"(or its heartbeat is older than {STALE_S:g} s: {ENV_STALE_S})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (LeaseHeld, (self.info, self.trial_dir, self.raced))


class LeaseDirError(OSError):
    """The lease folder of a trial cannot be created or written."""


def _dir_error(e: OSError, path: Path, what: str) -> LeaseDirError:
    return LeaseDirError(e.errno, f"cannot {what} {path}: {e.strerror or e}; the trial job needs to create files "
                                  "in its trial folder: make it writable (and not full) for the job's user", str(path))


# ---- the lease -----------------------------------------------------------------------------------------------------
class Lease:
    """The exclusive right to run one trial: ``with Lease(trial_dir, job_id): train()``.

    ``heartbeat_s`` (default :data:`HEARTBEAT_S`; ``0`` starts no heartbeat thread, then :meth:`beat` is the
    caller's) and ``stale_s`` (default :data:`STALE_S`, how old another holder's heartbeat must be before this one
    takes its lease over). ``on_lost`` is called (from the heartbeat thread) with the newer lease when the heartbeat
    finds that another trainer has taken this one over."""

    def __init__(self, trial_dir: Path | str, job_id: str = "", *, heartbeat_s: float | None = None,
                 stale_s: float | None = None, on_lost: Callable[[LeaseInfo | None], None] | None = None) -> None:
        self.trial_dir = Path(trial_dir)
        self.dir = TrialFolder(self.trial_dir).lease_dir
        self.job_id = str(job_id or "")
        self.heartbeat_s = float(HEARTBEAT_S if heartbeat_s is None else heartbeat_s)
        self.stale_s = float(STALE_S if stale_s is None else stale_s)
        if not (self.stale_s > 0 and self.heartbeat_s >= 0):
            raise ValueError(f"lease of {self.trial_dir}: stale_s={self.stale_s:g} must be positive and "
                             f"heartbeat_s={self.heartbeat_s:g} not negative")
        self.on_lost = on_lost
        self.lost_to: LeaseInfo | None = None  # the lease that replaced ours, once the heartbeat saw it
        self._info: LeaseInfo | None = None
        self._released = False
        self._lock = threading.RLock()  # on_lost may call release() from the heartbeat thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- context manager --
    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def info(self) -> LeaseInfo:
        """Our lease, after :meth:`acquire`."""
        if self._info is None:
            raise RuntimeError(f"the lease of {self.trial_dir} was not acquired; call acquire() first")
        return self._info

    @property
    def path(self) -> Path:
        """Our generation's file."""
        return _file(self.dir, self.info.generation)

    def _takeover_reason(self, current: LeaseInfo) -> str | None:
        """Why ``current`` may be taken over (``released``, ``stale``, ``dead``, ``same job``), or None."""
        if current.released:
            return "released"
        age = current.age()
        if age >= self.stale_s:
            return f"stale: no heartbeat for {age:.0f} s"
        if current.host and current.host == HOST and not pid_alive(current.pid, current.pid_start):
            return "dead: its pid is gone"
        if self.job_id and current.job_id == self.job_id:
            return "same job id: the scheduler requeued the job"
        return None

    def acquire(self) -> Lease:
        """Take the lease (see the module's docstring); raises :class:`LeaseHeld` while another live holder has
        it, :class:`LeaseDirError` when the lease folder cannot be written."""
        if self._info is not None and not self._released:
            raise RuntimeError(f"the lease of {self.trial_dir} is already acquired (generation "
                               f"{self._info.generation}); release it first")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _dir_error(e, self.dir, "create the lease folder") from e
        gens = _generations(self.dir)
        current = self._settled(gens[-1]) if gens else None
        generation = (gens[-1] if gens else 0) + 1
        took_over = None
        reason = None
        if current is not None:
            reason = self._takeover_reason(current)
            if reason is None:
                raise LeaseHeld(current, self.trial_dir)
            if not current.released:
                took_over = {"generation": current.generation, "job_id": current.job_id, "host": current.host,
                             "pid": current.pid, "heartbeat": current.heartbeat,
                             "age_s": round(current.age(), 1), "reason": reason}
        now = time.time()
        pid = os.getpid()
        info = LeaseInfo(generation=generation, job_id=self.job_id, host=HOST, pid=pid, token=uuid.uuid4().hex,
                         acquired=round(now, 3), heartbeat=now, released=False, took_over=took_over,
                         pid_start=pid_start(pid))
        path = _file(self.dir, generation)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise LeaseHeld(self._winner(generation), self.trial_dir, raced=True) from None
        except OSError as e:
            raise _dir_error(e, path, "create the lease file") from e
        try:
            try:
                os.write(fd, _record(info))  # one write; a crash before it leaves an empty file, stale later
            finally:
                os.close(fd)
        except OSError as e:
            path.unlink(missing_ok=True)  # an empty generation would fence the trial until it is stale
            raise _dir_error(e, path, "write the lease file") from e
        self._info, self._released, self.lost_to = info, False, None
        if took_over is not None and current is not None:
            who = f"job {self.job_id}" if self.job_id else f"pid {pid}"
            print(f"[lease] {self.trial_dir}: {who} on {HOST} took over the lease from {current.describe()} "
                  f"({reason})", file=sys.stderr, flush=True)
        for old in gens:
            if old <= generation - KEEP_GENERATIONS:
                _file(self.dir, old).unlink(missing_ok=True)
        if self.heartbeat_s > 0:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._heartbeat, name=f"lease-heartbeat-{generation}",
                                            daemon=True)
            self._thread.start()
        return self

    def _settled(self, generation: int) -> LeaseInfo | None:
        """A generation's record, waiting up to a second while another taker that just created its file writes
        it (a file left empty by a crash stays empty: it reads as a lease without a holder until it is stale)."""
        deadline = time.monotonic() + 1.0
        while True:
            info = _read(self.dir, generation)
            if info is None or info.token or info.age() > 5.0 or time.monotonic() > deadline:
                return info
            time.sleep(0.01)

    def _winner(self, generation: int) -> LeaseInfo:
        """The generation another taker just created first."""
        now = time.time()
        return self._settled(generation) or LeaseInfo(generation=generation, job_id="", host="", pid=0, token="",
                                                      acquired=now, heartbeat=now, released=False, took_over=None)

    def _current(self) -> LeaseInfo | None:
        gens = _generations(self.dir)
        return _read(self.dir, gens[-1]) if gens else None

    def held(self) -> bool:
        """Whether the lease is still ours: acquired, not released, and no newer generation replaced it."""
        if self._info is None or self._released:
            return False
        current = self._current()
        return current is not None and current.token == self._info.token and not current.released

    def beat(self) -> bool:
        """Refresh the heartbeat now; False (and ``on_lost`` called, once) when the lease is no longer ours."""
        with self._lock:
            if self._info is None or self._released:
                return False
            if self.lost_to is not None:
                return False
            current = self._current()
            if current is None or current.token != self._info.token:
                self._lose(current)
                return False
            try:
                os.utime(self.path)  # no time given: the filesystem stamps it (one clock, see lease_clock)
            except FileNotFoundError:
                self._lose(self._current())
                return False
            except OSError as e:  # a passing network filesystem error: the next beat tries again
                print(f"[lease] warning: cannot refresh the heartbeat of {self.path}: {e}", file=sys.stderr,
                      flush=True)
            return True

    def _lose(self, newer: LeaseInfo | None) -> None:
        by = newer.describe() if newer is not None else "nobody (its file is gone)"
        # said before it is recorded: whoever sees lost_to set (the trainer, a test) finds the line already written
        print(f"[lease] {self.trial_dir}: lost the lease (generation {self.info.generation}) to {by}; this trainer "
              "must stop writing the checkpoint and the run", file=sys.stderr, flush=True)
        self.lost_to = newer or LeaseInfo(generation=0, job_id="", host="", pid=0, token="", acquired=0.0,
                                          heartbeat=0.0, released=False, took_over=None)
        if self.on_lost is not None:
            try:
                self.on_lost(newer)
            except Exception as e:  # noqa: BLE001 - the heartbeat thread must not die with a traceback
                print(f"[lease] on_lost callback failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if not self.beat():
                return

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released (when it is still ours); never raises for a lease file
        that cannot be written (it then ends when its pid is seen dead, or is stale)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)  # a beat stuck on a hung mount must not hang the job's exit
        self._thread = None
        with self._lock:
            if self._info is None or self._released:
                return
            self._released = True
            if self.lost_to is not None or not self._is_current():
                return
            try:
                _rewrite(self.dir, replace(self._info, released=True), released_at=round(time.time(), 3))
            except OSError as e:
                print(f"[lease] warning: cannot mark {self.path} released ({e}); it is taken over once this process "
                      f"has exited or its heartbeat is older than {self.stale_s:g} s", file=sys.stderr, flush=True)

    def _is_current(self) -> bool:
        current = self._current()
        return current is not None and self._info is not None and current.token == self._info.token


def release_if_dead(trial_dir: Path | str, pid: int, host: str | None = None) -> bool:
    """Free the lease held by ``pid`` on ``host`` (default: this host) once that process has died; a parent that saw
    its child die calls this so the next trainer need not wait for the lease to go stale.

    Returns True when it released the lease; False when the lease is not that process's, is already released, or
    (on this host) the process still runs."""
    host = host or HOST
    lease_dir = TrialFolder(Path(trial_dir)).lease_dir
    info = read_lease(trial_dir)
    if info is None or not info.token or info.released or info.pid != pid or info.host != host:
        return False
    if host == HOST and pid_alive(pid, info.pid_start):
        return False
    try:
        _rewrite(lease_dir, replace(info, released=True), released_at=round(time.time(), 3),
                 released_by=f"pid {os.getpid()} on {HOST}: its holder died")
    except OSError as e:
        print(f"[lease] warning: cannot mark {_file(lease_dir, info.generation)} released ({e})", file=sys.stderr,
              flush=True)
        return False
    return True
