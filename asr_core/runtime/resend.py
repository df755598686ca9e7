"""``python -m asr_core ship TRIAL_DIR [--tracking-uri URI] [--run-id RUN]``: send what a trial's outbox still holds,
its pending records (:func:`asr_core.runtime.shipper.ship_pending`) and then the records MLflow refused for good
and the outbox kept (``outbox/rejected.jsonl``, :func:`resend_kept`), once the cause is fixed (a deleted run
restored, a server upgraded, another run named with ``--run-id``).

The run and the server come from the trial folder (``outbox/run.json``, written by the job); the flags override them.
A kept record is sent as it was, so nothing is doubled: a metric point is identical (MLflow keeps one row per
key, value, timestamp and step), params and tags are set to the same values. What later records of the outbox
superseded is left out: a status followed by a later status is not sent back over it (its tags are), nor a tag
that a later record set again. Records MLflow still refuses stay kept, with the new error. Nothing is sent while a
live job holds the trial's lease (it ships its own outbox).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asr_core.contract.folder.outbox_files import (REJECTED_FILE, outbox_dir, parse_record, pending, read_kept,
                                                   read_lines, read_run, record_files, rewrite_kept)
from asr_core.runtime.outbox import fail_fast_http
from asr_core.runtime.shipper import Shipper, live_holder, ship_pending, within_deadline

DEFAULT_DEADLINE_S = 120.0
LOCK_FILE = ".ship.lock"  # one `ship` of a folder at a time


class ShipError(RuntimeError):
    """The folder cannot be shipped as asked (no outbox, no run known); the message says what to pass."""


@dataclass(frozen=True)
class ResendResult:
    """What :func:`resend_kept` did: kept records ``sent`` again, ``superseded`` (left out: later records replaced
    them), ``kept`` (still kept: refused again, or not tried) and ``error`` ("" when every record was tried)."""

    sent: int
    superseded: int
    kept: int
    error: str = ""


Position = tuple[str, int]  # (record file, seq) of a record in the outbox


def _latest(box: Path) -> tuple[Position | None, dict[str, Position]]:
    """The position of the outbox's last status record and of the last record setting each tag."""
    status: Position | None = None
    tags: dict[str, Position] = {}
    for name in record_files(box):
        for _, line in read_lines(box / name, 0):
            rec = parse_record(line)
            if rec is None or rec["kind"] not in ("status", "tags"):
                continue
            pos = (name, int(rec.get("seq", 0)))
            if rec["kind"] == "status":
                status = max(status, pos) if status else pos
            for k in rec.get("tags") or {}:
                tags[k] = max(tags[k], pos) if k in tags else pos
    return status, tags


def _current(entry: dict[str, Any], status: Position | None, tags: dict[str, Position]) -> dict[str, Any] | None:
    """The part of a kept record no later record superseded (None: nothing of it)."""
    rec = dict(entry["record"])
    pos = (str(entry.get("file", "")), int(rec.get("seq", 0)))
    if rec.get("kind") not in ("status", "tags"):
        return rec
    fresh = {k: v for k, v in (rec.get("tags") or {}).items() if tags.get(k, pos) <= pos}
    if rec["kind"] == "status" and status is not None and status > pos:
        return {**rec, "kind": "tags", "tags": fresh} if fresh else None
    if rec["kind"] == "tags":
        return {**rec, "tags": fresh} if fresh else None
    return {**rec, "tags": fresh} if rec.get("tags") else rec


def resend_kept(trial_dir: Path | str, tracking_uri: str | None, run_id: str,
                deadline_s: float = DEFAULT_DEADLINE_S) -> ResendResult:
    """Send the trial's kept records again to ``run_id`` at ``tracking_uri``, oldest first, for at most
    ``deadline_s`` seconds; ``rejected.jsonl`` then keeps only those still refused or not tried (and any record a
    shipper kept meanwhile). Never raises for an unreachable MLflow: the result says what is left and why."""
    trial_dir = Path(trial_dir)
    box = outbox_dir(trial_dir)
    entries = read_kept(trial_dir)
    if not entries:
        return ResendResult(0, 0, 0)
    holder = live_holder(trial_dir)
    if holder:
        return ResendResult(0, 0, len(entries), f"a live job holds the lease ({holder}); it ships its own outbox")
    with open(box / LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return ResendResult(0, 0, len(entries), f"another `ship` of {trial_dir} is running; try again after it")
        entries = read_kept(trial_dir)  # under the lock
        status, tags = _latest(box)
        refused: list[str] = []
        shipper = Shipper(box, tracking_uri, run_id, trial_dir, keep=lambda n, r, e: refused.append(e))
        guard = threading.Lock()
        done: set[int] = set()  # sent or superseded: dropped from the file
        again: dict[int, str] = {}  # refused again: the new error
        counts = {"sent": 0, "superseded": 0}

        def work(stop: Callable[[], bool]) -> None:
            for i, entry in enumerate(entries):
                if stop():
                    return
                rec = _current(entry, status, tags)
                if rec is None:
                    with guard:
                        done.add(i)
                        counts["superseded"] += 1
                    continue
                refused.clear()
                shipper.send(str(entry.get("file", "")), rec)  # an outage or an error ends the pass (reported)
                with guard:
                    if refused:
                        again[i] = refused[-1]
                    else:
                        done.add(i)
                        counts["sent"] += 1

        # past the deadline the call in flight keeps its record kept: sent again later, harmlessly
        error = within_deadline(work, deadline_s, tracking_uri, "asr-outbox-resend")
        with guard:
            still = [{**e, "error": again[i], "tries": int(e.get("tries", 1)) + 1} if i in again else e
                     for i, e in enumerate(entries) if i not in done]
            sent, superseded = counts["sent"], counts["superseded"]
        newer = read_kept(trial_dir)[len(entries):]  # kept meanwhile by a shipper (status/resume's ship_pending)
        rewrite_kept(trial_dir, still + newer)
        return ResendResult(sent, superseded, len(still) + len(newer), error)


def destination(trial_dir: Path, tracking_uri: str | None, run_id: str | None) -> tuple[str | None, str]:
    """(tracking URI, run id) to ship to: the flags, else what the outbox recorded (``run.json``); raises
    :class:`ShipError` when the folder has no outbox or no run is known."""
    box = outbox_dir(trial_dir)
    if not box.is_dir():
        raise ShipError(f"{trial_dir} has no outbox/ (not a trial folder, or nothing was ever logged): pass the "
                        "folder of a trial, e.g. <sweep>/trials/<key>")
    recorded_run, recorded_uri = read_run(trial_dir)
    run = run_id or recorded_run
    if not run:
        raise ShipError(f"{box} records no run ({box / 'run.json'} is missing: written by earlier versions' jobs "
                        "only once shipped): pass --run-id RUN (and --tracking-uri URI), e.g. the run id `orchestrate "
                        "status --json` shows for the trial")
    return tracking_uri or recorded_uri or os.environ.get("MLFLOW_TRACKING_URI") or None, run


def cli(argv: list[str] | None = None) -> int:
    """``python -m asr_core ship TRIAL_DIR [--tracking-uri URI] [--run-id RUN] [--deadline S]``: send a trial's
    pending and kept MLflow records; exit 0 when nothing is left, 1 when some are, 2 on a wrong argument."""
    ap = argparse.ArgumentParser(prog="python -m asr_core ship", description=(
        "Send a trial's pending outbox records, then those MLflow refused for good (kept in "
        f"outbox/{REJECTED_FILE}), once the cause is fixed. The run and the server are the ones the trial's job "
        "shipped to, unless given. Exit 0 when nothing is left, 1 when some records are, 2 on a wrong argument."))
    ap.add_argument("trial_dir", type=Path, help="the trial folder (<sweep>/trials/<key>)")
    ap.add_argument("--tracking-uri", default=None, help="the server (default: the one the trial's job shipped to)")
    ap.add_argument("--run-id", default=None, help="the run (default: the one the trial's job shipped to)")
    ap.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, metavar="S",
                    help=f"seconds for each of the two passes (default {DEFAULT_DEADLINE_S:g})")
    a = ap.parse_args(argv)
    fail_fast_http()  # one call fails fast; the deadline holds
    if a.deadline <= 0:
        print(f"ship: --deadline {a.deadline:g} must be positive", file=sys.stderr)
        return 2
    try:
        uri, run = destination(a.trial_dir, a.tracking_uri, a.run_id)
    except ShipError as e:
        print(f"ship: {e}", file=sys.stderr)
        return 2
    first = ship_pending(a.trial_dir, uri, run, a.deadline)
    again = resend_kept(a.trial_dir, uri, run, a.deadline) if not first.error else ResendResult(
        0, 0, len(read_kept(a.trial_dir)))
    kept_file = outbox_dir(a.trial_dir) / REJECTED_FILE
    print(f"run {run} at {uri or '(MLflow default)'}: shipped {first.shipped}, left {pending(a.trial_dir)}; "
          f"sent again {again.sent} kept records, {again.superseded} superseded, still kept {again.kept}"
          + (f" in {kept_file}" if again.kept else ""))
    for err in (first.error, again.error):
        if err:
            print(f"  {err}")
    if again.kept and not again.error:
        last = read_kept(a.trial_dir)[-1:]
        why = last[0].get("error", "") if last else ""
        print(f"  MLflow still refuses them ({why[:200]}); fix the cause, or name another run with --run-id")
    return 0 if first.complete and again.kept == 0 and not again.error else 1


if __name__ == "__main__":
    sys.exit(cli())
