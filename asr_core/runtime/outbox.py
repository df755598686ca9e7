"""The trial's outbox, the job's side: everything the job tells MLflow is appended to the trial folder first
(:class:`Outbox`) and shipped to MLflow by a background thread, so training never waits for the tracking server.

The folder and its records: :mod:`asr_core.contract.folder.outbox_files`; a shipping pass and the shipping of a job
that is gone: :mod:`asr_core.runtime.shipper`.

When it ships. The background thread sends what has accumulated when the trainer asks (every ``train.log_every``
steps), at most once a second, and at least every :data:`SHIP_INTERVAL_S` seconds; a status, artifact, params or tags
record is sent at once. A failed call is retried with back-off (:data:`BACKOFF_MIN_S` doubling to
:data:`BACKOFF_MAX_S`); the job's MLflow HTTP retries are set low (:func:`fail_fast_http`) so one call fails fast and
the outbox does the retrying. An outage of any length costs nothing but delay: the records wait in the folder. An
HTTP 400 is an outage too unless MLflow's error code says the value itself is invalid
(:func:`asr_core.runtime.shipper.refused_for_good`): its server answers 400 BAD_REQUEST for a database error.

What it writes. The writer keeps the first value per (metric key, step) across all files, so a segment resumed from a
checkpoint older than the steps its killed predecessor logged does not log those steps again. Everything up to a
checkpoint's step is fsynced before the checkpoint is written (:meth:`Outbox.sync`).
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asr_core.contract.tracking import bound_mlflow_http, mlflow_http
from asr_core.contract.trial import MAX_TAG_CHARS, STATES
from asr_core.contract.folder.outbox_files import (file_name, log, outbox_dir, parse_record, pending, read_lines,
                                                   record_files, write_run)
from asr_core.runtime.shipper import MAX_METRICS, MAX_PARAMS, MAX_TAGS, Outage, Shipper

BACKOFF_MIN_S, BACKOFF_MAX_S = 1.0, 30.0
FLUSH_BACKOFF_MAX_S = 2.0  # while a flush waits, retry more often than in the background
MIN_INTERVAL_S = 1.0  # the trainer's requests to ship are honoured at most this often


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


SHIP_INTERVAL_S = _env_float("ASR_CORE_OUTBOX_INTERVAL_S", 5.0)  # ship whatever waits at least this often
PREEMPT_FLUSH_S = _env_float("ASR_CORE_PREEMPT_FLUSH_S", 5.0)  # exit deadline after USR2/TERM (within signal_delay)
FINAL_FLUSH_S = _env_float("ASR_CORE_FINAL_FLUSH_S", 60.0)  # exit deadline at a normal end (finished or failed)

# MLflow's own HTTP retries (default: 7 with exponential back-off, minutes) set low in the job: one call fails fast
HTTP_DEFAULTS = mlflow_http(max_retries=0, backoff_factor=0, timeout_s=15)


def fail_fast_http() -> None:
    """Set MLflow's HTTP retry settings of this process to fail fast (:data:`HTTP_DEFAULTS`), unless the user set
    them. Process-wide, so only the commands call it (``trial``, ``train``, ``evaluate``), never a library caller or
    the orchestrator."""
    bound_mlflow_http(HTTP_DEFAULTS)


def _now_ms() -> int:
    return int(time.time() * 1000)


class Outbox:
    """The job's writer of one outbox file (see the module docstring) and its background shipper.

    ``segment`` names the file (None: append to the newest, for a start that opens no segment). ``run_id`` may come
    later (:meth:`set_run`, when the trainer created the run); records wait until then. ``guard`` (the lease's
    ``held``) is asked at most once a second: once it says False, appends are dropped (another job owns the trial).
    """

    def __init__(self, trial_dir: Path | str, *, segment: int | None = None, tracking_uri: str | None = None,
                 run_id: str | None = None, guard: Callable[[], bool] | None = None,
                 interval_s: float | None = None) -> None:
        self.trial_dir = Path(trial_dir)
        self.dir = outbox_dir(self.trial_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        files = record_files(self.dir)
        self.name = file_name(segment) if segment is not None else (files[-1] if files else file_name(0))
        self.path = self.dir / self.name
        self.tracking_uri, self.run_id = tracking_uri, run_id
        if run_id:
            write_run(self.dir, run_id, tracking_uri)
        self.guard, self._guard_checked, self.fenced = guard, 0.0, False
        self.interval_s = SHIP_INTERVAL_S if interval_s is None else interval_s
        self._max_step: dict[str, int] = {}
        self._tags: dict[str, str] = {}
        self._seq = 0
        for name in sorted(set(files) | {self.name}):
            self._scan(name)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size and not self._ends_with_newline():
            os.write(self._fd, b"\n")  # a line cut short by a crash stays a line of its own, skipped by the shipper
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._shipper: Shipper | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_ship = 0.0
        self._flushing = False
        self._done_seq = -1  # the own file's seq shipped by the last complete pass (-1: none yet)
        self._outage_since = 0.0
        self._outage_reported = 0.0
        self.last_error = ""

    # -- reading what is there --
    def _scan(self, name: str) -> None:
        path = self.dir / name
        if not path.exists():
            return
        for _, line in read_lines(path, 0):
            rec = parse_record(line)
            if rec is None:
                continue
            if name == self.name:
                self._seq = max(self._seq, int(rec.get("seq", 0)))
            if rec["kind"] == "metrics":
                step = int(rec.get("step", 0))
                for k in rec.get("metrics") or {}:
                    if step > self._max_step.get(k, -1):
                        self._max_step[k] = step
            elif rec["kind"] in ("tags", "status"):
                self._tags.update({k: str(v) for k, v in (rec.get("tags") or {}).items()})

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def known_tags(self) -> dict[str, str]:
        """Every tag this trial's outbox has recorded (the newest value of each), shipped or not."""
        with self._lock:
            return dict(self._tags)

    def last_step(self, key: str) -> int:
        """The highest step of metric ``key`` in the outbox (-1: none)."""
        return self._max_step.get(key, -1)

    # -- writing --
    def _append(self, rec: dict[str, Any], urgent: bool = False) -> bool:
        with self._lock:
            if self.guard is not None and not self.fenced and time.monotonic() - self._guard_checked >= 1.0:
                self._guard_checked = time.monotonic()
                if not self.guard():
                    self.fenced = True
                    log(f"this job no longer holds the lease of {self.trial_dir}: it writes nothing more to the "
                        "outbox")
            if self.fenced or self._fd < 0:
                return False
            self._seq += 1
            data = (json.dumps({"seq": self._seq, **rec}, separators=(",", ":")) + "\n").encode()
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            if rec["kind"] in ("tags", "status"):
                self._tags.update({k: str(v) for k, v in (rec.get("tags") or {}).items()})
        if urgent:
            self._wake.set()
        return True

    def params(self, params: dict[str, Any]) -> None:
        items = [(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            self._append({"kind": "params", "params": dict(items[i:i + MAX_PARAMS])}, urgent=True)

    def tags(self, tags: dict[str, Any]) -> None:
        items = [(k, str(v)[:MAX_TAG_CHARS]) for k, v in tags.items()]
        for i in range(0, len(items), MAX_TAGS):
            self._append({"kind": "tags", "tags": dict(items[i:i + MAX_TAGS])}, urgent=True)

    def status(self, status: str, tags: dict[str, Any] | None = None, *, time_ms: int | None = None) -> None:
        """The run's status (one of :data:`~asr_core.contract.trial.STATES`), with tags set just before it."""
        if status not in STATES:
            raise ValueError(f"unknown run state {status!r}; valid: {', '.join(STATES)}")
        rec: dict[str, Any] = {"kind": "status", "status": status, "time": time_ms or _now_ms()}
        if tags:
            rec["tags"] = {k: str(v)[:MAX_TAG_CHARS] for k, v in list(tags.items())[:MAX_TAGS]}
        self._append(rec, urgent=True)

    def metrics(self, step: int, values: dict[str, float], *, time_ms: int | None = None,
                first_only: bool = True) -> bool:
        """One step's metrics; keys already recorded at this step or a later one are left out (the first value per
        step stays; ``first_only=False`` records them anyway). Returns whether anything was recorded."""
        fresh = [(k, float(v)) for k, v in values.items() if not first_only or step > self._max_step.get(k, -1)]
        ts = time_ms or _now_ms()
        for i in range(0, len(fresh), MAX_METRICS):
            if not self._append({"kind": "metrics", "step": int(step), "time": ts,
                                 "metrics": dict(fresh[i:i + MAX_METRICS])}):
                return False
        for k, _ in fresh:
            self._max_step[k] = max(step, self._max_step.get(k, -1))
        return bool(fresh)

    def artifact(self, path: Path | str, artifact_dir: str | None = None) -> None:
        """A file to upload into the run's artifacts (under ``artifact_dir``); it must stay where it is."""
        p = Path(path).resolve()
        try:
            rel: Path | str = p.relative_to(self.trial_dir.resolve())
        except ValueError:
            rel = p
        self._append({"kind": "artifact", "path": str(rel), "dir": artifact_dir or ""}, urgent=True)

    def sync(self) -> None:
        """fsync what was appended (the trainer calls it before each checkpoint: no step up to the checkpoint's can
        be lost with the node)."""
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)

    @property
    def seq(self) -> int:
        return self._seq

    # -- shipping --
    def set_run(self, run_id: str, tracking_uri: str | None = None) -> None:
        self.run_id = run_id
        if tracking_uri is not None:
            self.tracking_uri = tracking_uri
        write_run(self.dir, run_id, self.tracking_uri)
        self._wake.set()

    def start(self) -> "Outbox":
        """Start the background shipper (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="asr-outbox", daemon=True)
            self._thread.start()
        return self

    def kick(self) -> None:
        """Ship what has accumulated soon (at most once a second): the trainer calls it every ``log_every`` steps."""
        if time.monotonic() - self._last_ship >= MIN_INTERVAL_S:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            now = time.monotonic()
            if self._failures:
                timeout = max(0.0, self._retry_at - now)
            else:
                timeout = self.interval_s
            self._wake.wait(timeout if not self._flushing else min(timeout, 0.2))
            self._wake.clear()
            if self._stop:
                break
            if not self.run_id:
                continue
            if self._failures and time.monotonic() < self._retry_at:
                continue
            self._pass()

    def _pass(self) -> None:
        if self._shipper is None or self._shipper.run_id != self.run_id:
            self._shipper = Shipper(self.dir, self.tracking_uri, str(self.run_id), self.trial_dir)
        with self._lock:  # every record up to here is wholly written
            target = self._seq
        self._last_ship = time.monotonic()
        try:
            complete = self._shipper.ship(lambda: self._stop)
        except Outage as e:
            self._failed(str(e))
        except Exception as e:  # noqa: BLE001 - a bug here must never end training; report it and retry
            traceback.print_exc()
            self._failed(f"{type(e).__name__}: {e}")
        else:
            if self._failures:
                log(f"MLflow reachable again after {time.monotonic() - self._outage_since:.0f} s; the outbox is "
                    "catching up")
            self._failures, self.last_error = 0, ""
            with self._cond:
                if complete:
                    self._done_seq = max(target, self._shipper.seq(self.name))
                self._cond.notify_all()

    def _failed(self, error: str) -> None:
        now = time.monotonic()
        if not self._failures:
            self._outage_since = now
        self._failures += 1
        self.last_error = error
        cap = FLUSH_BACKOFF_MAX_S if self._flushing else BACKOFF_MAX_S
        self._retry_at = now + min(cap, BACKOFF_MIN_S * 2 ** (self._failures - 1))
        if self._failures == 1 or now - self._outage_reported >= 60:
            self._outage_reported = now
            log(f"cannot ship to MLflow at {self.tracking_uri} ({error}); training goes on, the records wait in "
                f"{self.dir} (retry in {self._retry_at - now:.0f} s)")
        with self._cond:
            self._cond.notify_all()

    def shipped_all(self) -> bool:
        """Whether MLflow has everything appended so far."""
        return self._done_seq >= self._seq

    def flush(self, deadline_s: float, hurry: Callable[[], bool] | None = None,
              hurry_deadline_s: float | None = None) -> bool:
        """Ship what waits, for at most ``deadline_s`` seconds; returns whether MLflow has everything. Never blocks
        longer, whatever the network does. When ``hurry()`` turns true (a stop signal arrived), the remaining time
        shrinks to ``hurry_deadline_s`` (:data:`PREEMPT_FLUSH_S`)."""
        if not self.run_id:
            return self._seq == 0
        self.start()
        with self._lock:
            target = self._seq
        end = time.monotonic() + deadline_s
        hurried = False
        self._flushing = True
        self._retry_at = min(self._retry_at, time.monotonic())  # try now, whatever the back-off said
        self._wake.set()
        try:
            with self._cond:
                while self._done_seq < target:
                    now = time.monotonic()
                    if hurry is not None and not hurried and hurry():
                        hurried = True
                        end = min(end, now + (PREEMPT_FLUSH_S if hurry_deadline_s is None else hurry_deadline_s))
                    if now >= end:
                        return False
                    self._cond.wait(min(0.2, end - now))
                    self._wake.set()
            return True
        finally:
            self._flushing = False

    def close(self) -> None:
        """Stop the shipper (what is not shipped stays in the folder) and close the file."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def pending(self) -> int:
        return pending(self.trial_dir)
