"""The outbox folder on disk (``TRIAL_DIR/outbox/``, :data:`~asr_core.contract.trial.OUTBOX_DIR`): its files, its
watermark and how its records are read. The writer is :class:`asr_core.runtime.outbox.Outbox`, the shipping
:mod:`asr_core.runtime.shipper`.

Layout:

* ``NNNNNN.jsonl``: the records of one segment of the job (``N`` = the segment number of
  :func:`~asr_core.contract.folder.segments.read_segments`), append-only JSON lines in the order the job wrote them,
  each with a sequence number ``seq`` (1, 2, ... within the file). A start of the job that opens no segment (the trial
  is already DONE or CANCELLED, or its config is invalid) appends to the newest file (``000000.jsonl`` when there is
  none). Only the holder of the trial's lease writes, so a file has one writer.
* ``shipped.json``: the watermark, per file the byte ``offset`` and ``seq`` of the last record MLflow has
  acknowledged; replaced atomically after every call that succeeded.
* ``rejected.jsonl``: the kept records, those MLflow refused for good (its error code says the value is invalid,
  e.g. a run deleted meanwhile: :data:`asr_core.runtime.shipper.REFUSED_CODES`), one line each
  (``{"file", "record", "error", "time"}``); reported on stderr, never blocking the records behind them, counted by
  :func:`kept` (``orchestrate status``) and sent again by ``python -m asr_core ship`` (:mod:`asr_core.runtime.resend`),
  which rewrites the file with those still refused.
* ``run.json``: where the records go, ``{"run_id", "tracking_uri"}``, written by the job once it knows its run
  (:func:`write_run`), so ``python -m asr_core ship TRIAL_DIR`` needs no more than the folder.

Records (``kind``): ``params`` (at most 100), ``tags`` (at most 100), ``metrics`` (one step: ``step``, ``time`` in
ms, ``metrics`` {key: value}; the timestamp is the record's, so sending it twice sends the identical point),
``status`` (``status``, ``time`` in ms, optional ``tags`` sent before the status: RUNNING, SCHEDULED with
``trial.preemptions``, FINISHED, FAILED with ``trial.error``, KILLED) and ``artifact`` (``path`` relative to the
trial folder, ``dir`` in the run's artifacts).

:func:`pending` counts the records not yet shipped (cheap: no mlflow import).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asr_core.contract.atomic import write_atomic
from asr_core.contract.trial import TrialFolder

WATERMARK_FILE = "shipped.json"
REJECTED_FILE = "rejected.jsonl"
RUN_FILE = "run.json"
FILE_DIGITS = 6
READ_CHUNK = 4 << 20


def log(msg: str) -> None:
    """One line of the outbox's own on stderr (``[outbox] ...``)."""
    print(f"[outbox] {msg}", file=sys.stderr, flush=True)


def outbox_dir(trial_dir: Path | str) -> Path:
    """``TRIAL_DIR/outbox``."""
    return TrialFolder(Path(trial_dir)).outbox_dir


def file_name(number: int) -> str:
    """The record file of segment ``number``: ``000007.jsonl``."""
    return f"{number:0{FILE_DIGITS}d}.jsonl"


def record_files(box: Path) -> list[str]:
    """The names of the outbox's record files (``NNNNNN.jsonl``), oldest first; none when the folder is missing."""
    try:
        names = os.listdir(box)
    except OSError:
        return []
    return sorted(n for n in names if n.endswith(".jsonl") and n[:FILE_DIGITS].isdigit() and len(n) ==
                  FILE_DIGITS + 6)


def read_watermark(box: Path) -> dict[str, dict[str, int]]:
    """{file name: {"offset", "seq"}} of what MLflow has acknowledged; empty when there is no (readable) watermark."""
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


def write_watermark(box: Path, state: dict[str, dict[str, int]]) -> None:
    """Atomically replace the watermark, never moving a file's offset back (two shippers may overlap briefly)."""
    merged = read_watermark(box)
    for name, w in state.items():
        if w["offset"] >= merged.get(name, {"offset": -1})["offset"]:
            merged[name] = dict(w)
    tmp = box / f".{WATERMARK_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps({"files": merged, "time": round(time.time(), 3)}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, box / WATERMARK_FILE)


def write_run(box: Path, run_id: str, tracking_uri: str | None) -> None:
    """Record where the outbox ships (``run.json``), atomically; unchanged when it already says so."""
    want = {"run_id": run_id, "tracking_uri": tracking_uri or ""}
    try:
        if json.loads((box / RUN_FILE).read_text()) == want:
            return
    except (OSError, ValueError):
        pass
    box.mkdir(parents=True, exist_ok=True)
    write_atomic(box / RUN_FILE, json.dumps(want).encode())


def read_run(trial_dir: Path | str) -> tuple[str, str]:
    """(run id, tracking URI) the trial's outbox ships to; ("", "") when it never recorded one."""
    try:
        d = json.loads((outbox_dir(trial_dir) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return "", ""
    if not isinstance(d, dict):
        return "", ""
    return str(d.get("run_id") or ""), str(d.get("tracking_uri") or "")


def read_kept(trial_dir: Path | str) -> list[dict[str, Any]]:
    """The kept records (``rejected.jsonl``), oldest first: ``{"file", "record", "error", "time"}`` each; a line that
    is not one (cut short by a crash) is left out."""
    try:
        lines = (outbox_dir(trial_dir) / REJECTED_FILE).read_bytes().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("record"), dict):
            out.append(d)
    return out


def kept(trial_dir: Path | str) -> int:
    """How many records MLflow refused for good the trial's outbox keeps (lines of ``rejected.jsonl``). Cheap: one
    ``stat`` when there are none, no mlflow import."""
    path = outbox_dir(trial_dir) / REJECTED_FILE
    try:
        if os.path.getsize(path) == 0:
            return 0
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def rewrite_kept(trial_dir: Path | str, entries: list[dict[str, Any]]) -> None:
    """Replace ``rejected.jsonl`` with ``entries`` atomically (removed when there are none)."""
    path = outbox_dir(trial_dir) / REJECTED_FILE
    if not entries:
        path.unlink(missing_ok=True)
        return
    write_atomic(path, b"".join(json.dumps(e).encode() + b"\n" for e in entries))


def pending(trial_dir: Path | str) -> int:
    """Records of a trial folder's outbox not yet shipped to MLflow (complete lines past the watermark). Cheap: no
    mlflow import, reads only what lies past the watermark. 0 when there is no outbox."""
    box = outbox_dir(trial_dir)
    files = record_files(box)
    if not files:
        return 0
    marks = read_watermark(box)
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


def read_lines(path: Path, offset: int) -> Iterator[tuple[int, bytes]]:
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


def parse_record(line: bytes) -> dict[str, Any] | None:
    """The record of one line, or None when the line is not one (cut short by a crash, or not a JSON object with a
    ``kind``)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("kind"), str) else None
