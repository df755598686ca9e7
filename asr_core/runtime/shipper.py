"""Shipping an outbox's records to MLflow: :class:`Shipper` (one pass over the files past the watermark, used by
the job's background thread in :class:`asr_core.runtime.outbox.Outbox`) and :func:`ship_pending` (the same for a
job that is gone; ``python -m asr_core outbox``, :func:`cli`). The folder it reads is
:mod:`asr_core.contract.folder.outbox_files`.

Shipping. Consecutive params/tags/metrics records go in one ``log_batch`` call within MLflow's limits (1000 metrics,
100 params, 100 tags, 1000 entities); a status or artifact record is sent on its own, in order, so the run's status
follows the job's. A call that fails for an outage raises :class:`Outage` and the records stay where they are; a
record MLflow refuses for good goes to ``rejected.jsonl`` (kept: counted by ``orchestrate status``, sent again by
``python -m asr_core ship``, :mod:`asr_core.runtime.resend`) and never blocks the ones behind it.

Outage or refusal: MLflow's error code decides (:func:`refused_for_good`), not the HTTP status. Its server answers
400 BAD_REQUEST for every database error but OperationalError (a connection-pool timeout under load, a lock), 500
INTERNAL_ERROR for the unexpected, 503 TEMPORARILY_UNAVAILABLE for OperationalError: all outages, retried. Only
what says the request itself cannot succeed (:data:`REFUSED_CODES`: an invalid value, a run deleted or never made)
is refused for good.

Exactly once. A crash between a call and its watermark re-sends at most that call's records, which is harmless:
MLflow's store keeps one row for an identical (key, value, timestamp, step) (its primary key; checked against the
real server by tests/test_outbox.py), params and tags are set to the same values and statuses are re-sent in
order.

Who ships: the live job, for every file of the folder (older segments' leftovers first); for a job that is gone,
:func:`ship_pending` (``orchestrate status`` / ``resume``) with the same code and watermark.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asr_core.contract.trial import ENDED
from asr_core.contract.folder.outbox_files import (REJECTED_FILE, log, outbox_dir, parse_record, pending, read_lines,
                                                   read_run, read_watermark, record_files, write_run, write_watermark)

MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES = 1000, 100, 100, 1000  # MLflow's log_batch limits
ARTIFACT_ATTEMPTS = 3  # an artifact the store refuses (not an outage) this often is given up (it stays in the folder)
# MLflow's error codes (mlflow/protos/databricks.proto) that say the request itself cannot succeed: the value is
# invalid (a bad key, a param that changed, a run deleted meanwhile: "must be in the 'active' state"), the run does
# not exist, or its state refuses it. Every other code (BAD_REQUEST: a database error; INTERNAL_ERROR,
# TEMPORARILY_UNAVAILABLE, ...) and every answer that is not MLflow's JSON (a gateway's page) is an outage.
REFUSED_CODES = frozenset({"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "INVALID_STATE",
                           "RESOURCE_ALREADY_EXISTS"})


class Outage(Exception):
    """MLflow could not be reached or answered with a retryable error; the records stay and are sent later."""


@dataclass(frozen=True)
class ShipResult:
    """What :func:`ship_pending` did: records ``shipped`` (acknowledged by MLflow, including any ``rejected``: refused
    for good and kept in ``rejected.jsonl``), ``left`` (still pending) and ``error`` ("" when everything went)."""

    shipped: int
    left: int
    error: str = ""
    rejected: int = 0

    @property
    def complete(self) -> bool:
        return self.left == 0 and not self.error


def refused_for_good(exc: BaseException) -> bool:
    """Whether MLflow refused the request itself (its error code is one of :data:`REFUSED_CODES`): sending it
    again cannot help until someone fixes the cause. Everything else (connection failures, timeouts, BAD_REQUEST,
    INTERNAL_ERROR, TEMPORARILY_UNAVAILABLE, 401/403/429, a body that is not MLflow's) is an outage: retried."""
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:  # pragma: no cover - mlflow is a dependency
        return False
    return isinstance(exc, MlflowException) and str(getattr(exc, "error_code", "")) in REFUSED_CODES


def _connection_error(exc: BaseException) -> bool:
    try:
        import requests
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout))


class Shipper:
    """Reads an outbox's files past the watermark and sends them to one run, in order. One shipping pass
    (:meth:`ship`) either reaches the end of every file or raises :class:`Outage`."""

    def __init__(self, box: Path, tracking_uri: str | None, run_id: str, trial_dir: Path,
                 keep: Callable[[str, dict[str, Any], str], None] | None = None) -> None:
        """``keep(file name, record, error)`` takes a record refused for good (default: append it to
        ``rejected.jsonl``)."""
        self.box, self.tracking_uri, self.run_id, self.trial_dir = box, tracking_uri, run_id, trial_dir
        self.keep = keep or self._keep_in_folder
        self.state = read_watermark(box)
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
        for name in record_files(self.box):
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

        for end, line in read_lines(path, offset):
            if stop():
                send_group()
                return False
            rec = parse_record(line)
            if rec is None:
                if line.strip() and (name, end) not in self._bad_lines_reported:
                    self._bad_lines_reported.add((name, end))
                    log(f"{path}: skipping a line that is not a record (cut short by a crash?): {line[:80]!r}")
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
            self.send(name, rec)  # a status, an artifact (or a kind nobody knows: kept), on its own
            self._advance(name, end, rec, 1)
        send_group()
        return True

    def _advance(self, name: str, end: int, last: dict[str, Any] | None, n: int) -> None:
        seq = int(last.get("seq", 0)) if last else self.seq(name)
        self.state[name] = {"offset": end, "seq": max(seq, self.seq(name))}
        write_watermark(self.box, {name: self.state[name]})
        self.shipped += n

    # -- calls --
    def _call(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - classified: refused for good, or an outage to wait out
            if refused_for_good(e):
                raise
            raise Outage(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]) from e

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
        except Outage:
            raise
        except Exception as e:  # noqa: BLE001 - refused: params that clash with the run's, or one bad record
            first_error = e
        if p:  # params the run already holds with another value keep their first value (as the ledger wrote them)
            clash = self._clashing_params({x.key: x.value for x in p})
            if clash:
                log(f"run {self.run_id} holds other values of {', '.join(sorted(clash))} (execution settings or "
                    "data locations of the same trial); params keep the first values, config.json in the trial "
                    "folder has the current ones")
                m, p2, t = batch(recs, clash)
                try:
                    self._call(lambda: self.client.log_batch(self.run_id, metrics=m, params=p2, tags=t,
                                                             synchronous=True))
                    return
                except Outage:
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
            except Outage:
                raise
            except Exception as e:  # noqa: BLE001
                self._reject(name, r, e)

    def _clashing_params(self, params: dict[str, str]) -> set[str]:
        """The keys of ``params`` the run holds with another value (none when the run cannot be read for good)."""
        existing: dict[str, str] = {}
        try:
            self._call(lambda: existing.update(self.client.get_run(self.run_id).data.params))
        except Outage:
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
        except Outage:
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
            if refused_for_good(e):
                self._reject(name, rec, e)
                return
            from mlflow.exceptions import MlflowException

            if isinstance(e, MlflowException) or _connection_error(e):
                raise Outage(f"{type(e).__name__}: {e}"[:300]) from e
            tries = self._artifact_tries[key] = self._artifact_tries.get(key, 0) + 1
            if tries >= ARTIFACT_ATTEMPTS:  # the artifact store refuses this file: give it up, not the records after
                self._reject(name, rec, f"{type(e).__name__}: {e} ({tries} attempts); the file stays in the trial "
                                        "folder")
                return
            raise Outage(f"artifact {local}: {type(e).__name__}: {e}"[:300]) from e

    # -- one record, outside the files' order (python -m asr_core ship) --
    def send(self, name: str, rec: dict[str, Any]) -> None:
        """Send one record of file ``name`` on its own, the watermark untouched; a refusal goes to ``keep``, an
        outage raises :class:`Outage`."""
        kind = rec.get("kind")
        if kind in ("metrics", "params", "tags"):
            self._send_batch(name, [(0, rec)])
        elif kind == "status":
            self._send_status(name, rec)
        elif kind == "artifact":
            self._send_artifact(name, rec)
        else:
            self._reject(name, rec, f"unknown record kind {kind!r}")

    def _reject(self, name: str, rec: dict[str, Any], error: BaseException | str) -> None:
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.keep(name, rec, " ".join(text.split())[:1000])
        self.rejected += 1

    def _keep_in_folder(self, name: str, rec: dict[str, Any], text: str) -> None:
        log(f"MLflow refused a {rec.get('kind')} record of {self.box / name} for run {self.run_id} ({text}); it is "
            f"kept in {self.box / REJECTED_FILE} and the records after it go on; once the cause is fixed, "
            f"`python -m asr_core ship {self.trial_dir}` sends it again")
        with open(self.box / REJECTED_FILE, "a") as f:
            f.write(json.dumps({"file": name, "record": rec, "error": text, "time": round(time.time(), 3)}) + "\n")


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
    holder = live_holder(trial_dir)
    if holder:
        return ShipResult(0, before, f"a live job holds the lease ({holder}); it ships its own outbox")
    if not read_run(trial_dir)[0]:  # an outbox of an earlier version: `python -m asr_core ship` finds its run here
        write_run(outbox_dir(trial_dir), run_id, tracking_uri)
    shipper = Shipper(outbox_dir(trial_dir), tracking_uri, run_id, trial_dir)
    # past the deadline it ends after the call in flight; the watermark keeps whatever that call achieved
    error = within_deadline(shipper.ship, deadline_s, tracking_uri, "asr-outbox-pending")
    left = pending(trial_dir)
    return ShipResult(shipped=max(0, before - left), left=left, error=error, rejected=shipper.rejected)


def within_deadline(work: Callable[[Callable[[], bool]], object], deadline_s: float, tracking_uri: str | None,
                    name: str) -> str:
    """Run ``work(stop)`` in a daemon thread (``name``) for at most ``deadline_s`` seconds, then turn ``stop()``
    true; the error it ended with ("" for none): an outage, any other exception (reported, never raised into the
    caller), or the deadline passed."""
    result: dict[str, str] = {}
    stop = threading.Event()

    def run() -> None:
        try:
            work(stop.is_set)
        except Outage as e:
            result["error"] = f"MLflow unreachable at {tracking_uri}: {e}"
        except Exception as e:  # noqa: BLE001 - reported in the result, never raised into orchestrate
            result["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        stop.set()
        result.setdefault("error", f"not done within {deadline_s:g} s (MLflow at {tracking_uri} slow or unreachable)")
    return result.get("error", "")


def live_holder(trial_dir: Path) -> str:
    """Who holds the trial's lease while alive ("" when nobody does, or the lease cannot be read)."""
    try:
        from asr_core.contract.folder.lease import read_lease
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
    if not outbox_dir(a.trial_dir).is_dir():
        print(f"outbox: {a.trial_dir} has no outbox/ (not a trial folder, or nothing was ever logged): pass the "
              "folder of a trial, e.g. <sweep>/trials/<key>", file=sys.stderr)
        return 2
    if not a.run_id:
        print(pending(a.trial_dir))
        return 0
    r = ship_pending(a.trial_dir, a.tracking_uri, a.run_id, a.deadline)
    print(f"shipped {r.shipped}, left {r.left}, rejected {r.rejected}" + (f": {r.error}" if r.error else ""))
    if r.rejected:
        print(f"records MLflow refused are kept in {outbox_dir(a.trial_dir) / REJECTED_FILE}; once the cause is "
              f"fixed, `python -m asr_core ship {a.trial_dir}` sends them again")
    return 0 if r.complete else 1


if __name__ == "__main__":
    sys.exit(cli())
