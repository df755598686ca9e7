"""The trial's outbox: everything the job tells MLflow is appended to the trial folder first and shipped to MLflow
by a background thread, so training never waits for the tracking server.

Layout (``TRIAL_DIR/outbox/``, :data:`~asr_core.contract.trial.OUTBOX_DIR`):

* ``NNNNNN.jsonl``: the records of one segment of the job (``N`` = the segment number of
  :func:`~asr_core.contract.trial.read_segments`), append-only JSON lines in the order the job wrote them, each with a
  sequence number ``seq`` (1, 2, ... within the file). A start of the job that opens no segment (the trial is
  already DONE or CANCELLED, or its config is invalid) appends to the newest file (``000000.jsonl`` when there is
  none). Only the holder of the trial's lease writes, so a file has one writer.
* ``shipped.json``: the watermark, per file the byte ``offset`` and ``seq`` of the last record MLflow has
  acknowledged; replaced atomically after every call that succeeded.
* ``rejected.jsonl``: records MLflow refused for good (HTTP 400/404: an invalid value, a deleted run), with the
  error; they are reported on stderr and never block the records behind them.

Records (``kind``): ``params`` (at most 100), ``tags`` (at most 100), ``metrics`` (one step: ``step``, ``time`` in
ms, ``metrics`` {key: value}; the timestamp is the record's, so sending it twice sends the identical point),
``status`` (``status``, ``time`` in ms, optional ``tags`` sent before the status: RUNNING, SCHEDULED with
``trial.preemptions``, FINISHED, FAILED with ``trial.error``, KILLED) and ``artifact`` (``path`` relative to the
trial folder, ``dir`` in the run's artifacts).

Shipping. Consecutive params/tags/metrics records go in one ``log_batch`` call within MLflow's limits (1000 metrics,
100 params, 100 tags, 1000 entities); a status or artifact record is sent on its own, in order, so the run's status
follows the job's. The shipper sends what has accumulated when the trainer asks (every ``train.log_every`` steps),
at most once a second, and at least every :data:`SHIP_INTERVAL_S` seconds; a status, artifact, params or tags
record is sent at once. A failed call is retried with back-off (:data:`BACKOFF_MIN_S` doubling to
:data:`BACKOFF_MAX_S`); the job's MLflow HTTP retries are set low (:func:`fail_fast_http`) so one call fails fast and
the outbox does the retrying. An outage of any length costs nothing but delay: the records wait in the folder.

Exactly once. A crash between a call and its watermark re-sends at most that call's records, which is harmless:
MLflow's store keeps one row for an identical (key, value, timestamp, step) (its primary key; checked against the
real server by tests/test_outbox.py), params and tags are set to the same values and statuses are re-sent in
order. The writer keeps the first value per (metric key, step) across all files, so a segment resumed from a
checkpoint older than the steps its killed predecessor logged does not log those steps again. Everything up to a
checkpoint's step is fsynced before the checkpoint is written (:meth:`Outbox.sync`).

Who ships: the live job, for every file of the folder (older segments' leftovers first); for a job that is gone,
:func:`ship_pending` (``orchestrate status`` / ``resume``) with the same code and watermark. :func:`pending` counts the
records not yet shipped (cheap: no mlflow import).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asr_core.contract.trial import ENDED, MAX_TAG_CHARS, STATES, TrialFolder

WATERMARK_FILE = "shipped.json"
REJECTED_FILE = "rejected.jsonl"
FILE_DIGITS = 6
MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES = 1000, 100, 100, 1000  # MLflow's log_batch limits
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
ARTIFACT_ATTEMPTS = 3  # an artifact the store refuses (not an outage) this often is given up (it stays in the folder)
READ_CHUNK = 4 << 20

# MLflow's own HTTP retries (default: 7 with exponential back-off, minutes) set low in the job: one call fails fast
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


def fail_fast_http() -> None:
    """Set MLflow's HTTP retry settings of this process to fail fast (:data:`HTTP_DEFAULTS`), unless the user set
    them. Process-wide, so only the commands call it (``trial``, ``train``, ``evaluate``), never a library caller or
    the orchestrator."""
    for k, v in HTTP_DEFAULTS.items():
        os.environ.setdefault(k, v)


def _log(msg: str) -> None:
    print(f"[outbox] {msg}", file=sys.stderr, flush=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---- the folder ------------------------------------------------------------------------------------------------
def outbox_dir(trial_dir: Path | str) -> Path:
    return TrialFolder(Path(trial_dir)).outbox_dir


def file_name(number: int) -> str:
    return f"{number:0{FILE_DIGITS}d}.jsonl"


def _files(box: Path) -> list[str]:
    try:
        names = os.listdir(box)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(".jsonl") and n[:FILE_DIGITS].isdigit() and len(n) ==
                  FILE_DIGITS + 6)


def _read_watermark(box: Path) -> dict[str, dict[str, int]]:
    try:
        d = json.loads((box / WATERMARK_FILE).read_text())
    except (OSError, ValueError):
        return {}
    files = d.get("files") if isinstance(d, dict) else None
    if not isinstance(files, dict):
        return {}
    out = {}
    for name, w in files.items():
        if isinstance(w, dict) and isinstance(w.get("offset"), int):
            out[str(name)] = {"offset": int(w["offset"]), "seq": int(w.get("seq") or 0)}
    return out


def _write_watermark(box: Path, state: dict[str, dict[str, int]]) -> None:
    """Atomically replace the watermark, never moving a file's offset back (two shippers may overlap briefly)."""
    merged = _read_watermark(box)
    for name, w in state.items():
        if w["offset"] >= merged.get(name, {"offset": -1})["offset"]:
            merged[name] = dict(w)
    tmp = box / f".{WATERMARK_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps({"files": merged, "time": round(time.time(), 3)}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, box / WATERMARK_FILE)


def pending(trial_dir: Path | str) -> int:
    """Records of a trial folder's outbox not yet shipped to MLflow (complete lines past the watermark). Cheap: no
    mlflow import, reads only what lies past the watermark. 0 when there is no outbox."""
    box = outbox_dir(trial_dir)
    files = _files(box)
    if not files:
        return 0
    marks = _read_watermark(box)
    n = 0
    for name in files:
        offset = marks.get(name, {"offset": 0})["offset"]
        try:
            size = os.path.getsize(box / name)
            if size <= offset:
                continue
            with open(box / name, "rb") as f:
                f.seek(offset)
                while chunk := f.read(READ_CHUNK):
                    n += chunk.count(b"\n")
        except OSError:
            continue
    return n


def _lines(path: Path, offset: int) -> Iterator[tuple[int, bytes]]:
    """(end offset, line) of each complete line from ``offset`` on; a line still being written (no newline yet) is
    left for later."""
    with open(path, "rb") as f:
        f.seek(offset)
        base, buf = offset, b""  # base: the file offset of buf[0]
        while chunk := f.read(READ_CHUNK):
            buf += chunk
            start = 0
            while (nl := buf.find(b"\n", start)) >= 0:
                yield base + nl + 1, buf[start:nl]
                start = nl + 1
            base += start
            buf = buf[start:]


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("kind"), str) else None


# ---- shipping ---------------------------------------------------------------------------------------------------
class _Outage(Exception):
    """MLflow could not be reached or answered with a retryable error; the records stay and are sent later."""


@dataclass(frozen=True)
class ShipResult:
    """What :func:`ship_pending` did: records ``shipped`` (acknowledged by MLflow, including any ``rejected`` for
    good), ``left`` (still pending) and ``error`` ("" when everything went)."""

    shipped: int
    left: int
    error: str = ""
    rejected: int = 0

    @property
    def complete(self) -> bool:
        return self.left == 0 and not self.error


def _permanent(exc: BaseException) -> bool:
    """MLflow refused the request itself (HTTP 400 invalid value or state, 404 run gone): sending it again cannot
    help. Connection failures, timeouts, 401/403/429 and 5xx are outages: retried."""
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:  # pragma: no cover - mlflow is a dependency
        return False
    return isinstance(exc, MlflowException) and exc.get_http_status_code() in (400, 404)


def _connection_error(exc: BaseException) -> bool:
    try:
        import requests
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout))


class _Shipper:
    """Reads an outbox's files past the watermark and sends them to one run, in order. One shipping pass
    (:meth:`ship`) either reaches the end of every file or raises :class:`_Outage`."""

    def __init__(self, box: Path, tracking_uri: str | None, run_id: str, trial_dir: Path) -> None:
        self.box, self.tracking_uri, self.run_id, self.trial_dir = box, tracking_uri, run_id, trial_dir
        self.state = _read_watermark(box)
        self.shipped = 0
        self.rejected = 0
        self._client: Any = None
        self._artifact_tries: dict[tuple[str, int], int] = {}
        self._bad_lines_reported: set[tuple[str, int]] = set()

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def seq(self, name: str) -> int:
        return self.state.get(name, {"seq": 0})["seq"]

    # -- one pass --
    def ship(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """Send everything the files hold now; True when it got to the end (False: ``stop()`` turned true)."""
        for name in _files(self.box):
            if not self._ship_file(name, stop):
                return False
        return True

    def _ship_file(self, name: str, stop: Callable[[], bool]) -> bool:
        path = self.box / name
        offset = self.state.get(name, {"offset": 0})["offset"]
        group: list[tuple[int, dict[str, Any]]] = []  # (end offset, record) of batchable records
        counts = [0, 0, 0]  # metrics, params, tags in the group

        def send_group() -> None:
            if group:
                self._send_batch(name, group)
                self._advance(name, group[-1][0], group[-1][1], len(group))
                group.clear()
                counts[:] = [0, 0, 0]

        for end, line in _lines(path, offset):
            if stop():
                send_group()
                return False
            rec = _parse(line)
            if rec is None:
                if line.strip() and (name, end) not in self._bad_lines_reported:
                    self._bad_lines_reported.add((name, end))
                    _log(f"{path}: skipping a line that is not a record (cut short by a crash?): {line[:80]!r}")
                send_group()
                self._advance(name, end, None, 0)
                continue
            kind = rec["kind"]
            if kind in ("metrics", "params", "tags"):
                n = (len(rec.get("metrics") or {}), len(rec.get("params") or {}), len(rec.get("tags") or {}))
                full = (counts[0] + n[0] > MAX_METRICS or counts[1] + n[1] > MAX_PARAMS or
                        counts[2] + n[2] > MAX_TAGS or sum(counts) + sum(n) > MAX_ENTITIES)
                if full:
                    send_group()
                group.append((end, rec))
                counts[:] = [a + b for a, b in zip(counts, n)]
                continue
            send_group()
            if kind == "status":
                self._send_status(name, rec)
            elif kind == "artifact":
                self._send_artifact(name, rec)
            else:
                self._reject(name, rec, f"unknown record kind {kind!r}")
            self._advance(name, end, rec, 1)
        send_group()
        return True

    def _advance(self, name: str, end: int, last: dict[str, Any] | None, n: int) -> None:
        seq = int(last.get("seq", 0)) if last else self.seq(name)
        self.state[name] = {"offset": end, "seq": max(seq, self.seq(name))}
        _write_watermark(self.box, {name: self.state[name]})
        self.shipped += n

    # -- calls --
    def _call(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - classified: refused for good, or an outage to wait out
            if _permanent(e):
                raise
            raise _Outage(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]) from e

    def _send_batch(self, name: str, group: list[tuple[int, dict[str, Any]]]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        def batch(recs: list[dict[str, Any]], drop_params: set[str]) -> tuple[list, list, list]:
            metrics, params, tags = [], {}, {}
            for r in recs:
                if r["kind"] == "metrics":
                    metrics += [Metric(k, float(v), int(r["time"]), int(r["step"])) for k, v in r["metrics"].items()]
                elif r["kind"] == "params":
                    params.update({k: str(v) for k, v in r["params"].items() if k not in drop_params})
                else:
                    tags.update({k: str(v) for k, v in r["tags"].items()})
            return metrics, [Param(k, v) for k, v in params.items()], [RunTag(k, v) for k, v in tags.items()]

        recs = [r for _, r in group]
        m, p, t = batch(recs, set())
        try:
            self._call(lambda: self.client.log_batch(self.run_id, metrics=m, params=p, tags=t, synchronous=True))
            return
        except _Outage:
            raise
        except Exception as e:  # noqa: BLE001 - refused: params that clash with the run's, or one bad record
            first_error = e
        if p:  # params the run already holds with another value keep their first value (as the ledger wrote them)
            clash = self._clashing_params({x.key: x.value for x in p})
            if clash:
                _log(f"run {self.run_id} holds other values of {', '.join(sorted(clash))} (execution settings or "
                     "data locations of the same trial); params keep the first values, config.json in the trial "
                     "folder has the current ones")
                m, p2, t = batch(recs, clash)
                try:
                    self._call(lambda: self.client.log_batch(self.run_id, metrics=m, params=p2, tags=t,
                                                             synchronous=True))
                    return
                except _Outage:
                    raise
                except Exception as e:  # noqa: BLE001
                    first_error = e
        if len(recs) == 1:
            self._reject(name, recs[0], first_error)
            return
        for r in recs:  # find the record it refused; send the others
            mi, pi, ti = batch([r], self._clashing_params({k: str(v) for k, v in (r.get("params") or {}).items()})
                               if r["kind"] == "params" else set())
            try:
                self._call(lambda: self.client.log_batch(self.run_id, metrics=mi, params=pi, tags=ti,
                                                         synchronous=True))
            except _Outage:
                raise
            except Exception as e:  # noqa: BLE001
                self._reject(name, r, e)

    def _clashing_params(self, params: dict[str, str]) -> set[str]:
        """The keys of ``params`` the run holds with another value (none when the run cannot be read for good)."""
        existing: dict[str, str] = {}
        try:
            self._call(lambda: existing.update(self.client.get_run(self.run_id).data.params))
        except _Outage:
            raise
        except Exception:  # noqa: BLE001 - the run itself is refused: the batch is rejected below
            return set()
        return {k for k, v in params.items() if k in existing and existing[k] != v}

    def _send_status(self, name: str, rec: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        status, tags = rec.get("status"), rec.get("tags") or {}
        try:
            if tags:
                self._call(lambda: self.client.log_batch(
                    self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True))
            if status in ENDED:
                self._call(lambda: self.client.set_terminated(self.run_id, status=status, end_time=int(rec["time"])))
            else:
                self._call(lambda: self.client.update_run(self.run_id, status=status))
        except _Outage:
            raise
        except Exception as e:  # noqa: BLE001
            self._reject(name, rec, e)

    def _send_artifact(self, name: str, rec: dict[str, Any]) -> None:
        path = Path(rec["path"])
        local = path if path.is_absolute() else self.trial_dir / path
        if not local.exists():
            self._reject(name, rec, f"{local} no longer exists")
            return
        key = (name, int(rec.get("seq", 0)))
        try:
            self.client.log_artifact(self.run_id, str(local), artifact_path=rec.get("dir") or None)
            return
        except Exception as e:  # noqa: BLE001 - the store's own failure, or an outage
            if _permanent(e):
                self._reject(name, rec, e)
                return
            from mlflow.exceptions import MlflowException

            if isinstance(e, MlflowException) or _connection_error(e):
                raise _Outage(f"{type(e).__name__}: {e}"[:300]) from e
            tries = self._artifact_tries[key] = self._artifact_tries.get(key, 0) + 1
            if tries >= ARTIFACT_ATTEMPTS:  # the artifact store refuses this file: give it up, not the records after
                self._reject(name, rec, f"{type(e).__name__}: {e} ({tries} attempts); the file stays in the trial "
                                        "folder")
                return
            raise _Outage(f"artifact {local}: {type(e).__name__}: {e}"[:300]) from e

    def _reject(self, name: str, rec: dict[str, Any], error: BaseException | str) -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        text = " ".join(text.split())[:1000]
        _log(f"MLflow refused a {rec.get('kind')} record of {self.box / name} for run "
             f"{self.run_id} ({text}); it is kept in {self.box / REJECTED_FILE} and the records after it go on")
        with open(self.box / REJECTED_FILE, "a") as f:
            f.write(json.dumps({"file": name, "record": rec, "error": text, "time": round(time.time(), 3)}) + "\n")
        self.rejected += 1


# ---- the job's side --------------------------------------------------------------------------------------------
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
        files = _files(self.dir)
        self.name = file_name(segment) if segment is not None else (files[-1] if files else file_name(0))
        self.path = self.dir / self.name
        self.tracking_uri, self.run_id = tracking_uri, run_id
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
        self._shipper: _Shipper | None = None
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
        for _, line in _lines(path, 0):
            rec = _parse(line)
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
                    _log(f"this job no longer holds the lease of {self.trial_dir}: it writes nothing more to the "
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
            self._shipper = _Shipper(self.dir, self.tracking_uri, str(self.run_id), self.trial_dir)
        with self._lock:  # every record up to here is wholly written
            target = self._seq
        self._last_ship = time.monotonic()
        try:
            complete = self._shipper.ship(lambda: self._stop)
        except _Outage as e:
            self._failed(str(e))
        except Exception as e:  # noqa: BLE001 - a bug here must never end training; report it and retry
            traceback.print_exc()
            self._failed(f"{type(e).__name__}: {e}")
        else:
            if self._failures:
                _log(f"MLflow reachable again after {time.monotonic() - self._outage_since:.0f} s; the outbox is "
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
            _log(f"cannot ship to MLflow at {self.tracking_uri} ({error}); training goes on, the records wait in "
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


# ---- a job that is gone -----------------------------------------------------------------------------------------
def ship_pending(trial_dir: Path | str, tracking_uri: str | None, run_id: str, deadline_s: float = 30.0) -> ShipResult:
    """Ship what a trial's outbox still holds to ``run_id`` (same code and watermark as the job's shipper), for at
    most ``deadline_s`` seconds; for a trial whose job is gone (``orchestrate status`` / ``resume`` reconcile the
    ledger with it). Never raises for an unreachable MLflow: the result says what is left and why. Refuses (ships
    nothing) while a live job holds the trial's lease: that job ships its own outbox."""
    trial_dir = Path(trial_dir)
    before = pending(trial_dir)
    if before == 0:
        return ShipResult(0, 0)
    holder = _live_holder(trial_dir)
    if holder:
        return ShipResult(0, before, f"a live job holds the lease ({holder}); it ships its own outbox")
    shipper = _Shipper(outbox_dir(trial_dir), tracking_uri, run_id, trial_dir)
    result: dict[str, str] = {}
    stop = threading.Event()

    def work() -> None:
        try:
            shipper.ship(stop.is_set)
        except _Outage as e:
            result["error"] = f"MLflow unreachable at {tracking_uri}: {e}"
        except Exception as e:  # noqa: BLE001 - reported in the result, never raised into orchestrate
            result["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=work, name="asr-outbox-pending", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        stop.set()  # it ends after the call in flight; the watermark keeps whatever that call achieved
        result.setdefault("error", f"not done within {deadline_s:g} s (MLflow at {tracking_uri} slow or unreachable)")
    left = pending(trial_dir)
    return ShipResult(shipped=max(0, before - left), left=left, error=result.get("error", ""),
                      rejected=shipper.rejected)


def _live_holder(trial_dir: Path) -> str:
    try:
        from asr_core.runtime.lease import read_lease
    except ImportError:
        return ""
    try:
        info = read_lease(trial_dir)
    except Exception:  # noqa: BLE001 - a lease that cannot be read holds nothing
        return ""
    return info.describe() if info is not None and info.alive() else ""


def cli(argv: list[str] | None = None) -> int:
    """``python -m asr_core outbox TRIAL_DIR --tracking-uri URI --run-id RUN [--deadline S]``: ship a trial's
    pending outbox by hand; ``python -m asr_core outbox TRIAL_DIR`` alone prints how many records wait."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m asr_core outbox", description=cli.__doc__.split("\n")[0])
    ap.add_argument("trial_dir", type=Path)
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--deadline", type=float, default=60.0)
    a = ap.parse_args(argv)
    if not a.run_id:
        print(pending(a.trial_dir))
        return 0
    r = ship_pending(a.trial_dir, a.tracking_uri, a.run_id, a.deadline)
    print(f"shipped {r.shipped}, left {r.left}, rejected {r.rejected}" + (f": {r.error}" if r.error else ""))
    return 0 if r.complete else 1


main = cli  # the name the alias asr_core/outbox.py calls

if __name__ == "__main__":
    sys.exit(cli())
