"""What the trial folders say, read cheaply (:mod:`orchestrate.ledger.reconcile` brings the ledger in line with them).

The trial folder (``<sweep>/trials/<key>/``, :class:`asr_core.contract.trial.TrialFolder`) holds the truth about a
trial: ``DONE``, ``TRAINED``, ``CANCELLED``, its lease (``lease/``, :mod:`asr_core.contract.folder.lease`), its
progress records, its segments and how each ended (``attempts.jsonl``), and what the job still has to tell MLflow
(``outbox/``).
MLflow is a mirror of it that may lag.

* :func:`read_folder_state` / :func:`read_folder_states`: one :class:`FolderState` per trial, from a handful of
  small reads per folder, never importing mlflow, torch, ray, submitit or pandas, and never raising on a missing or
  half-written file (3,000 folders in well under a second on a local disk; a thread pool hides the latency of a
  network filesystem).
* :func:`read_trial_refs`: each trial's key and label from ``trials.json``, without building its config.
* :func:`failure_reason`: a trial's failures against the sweep's budget, in words.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from asr_core.contract.folder.lease import read_lease
from asr_core.contract.trial import (ATTEMPTS_FILE, CANCELLED_FILE, DONE_FILE, FAILURE_OUTCOMES, LEASE_DIR,
                                     OUTBOX_DIR, PROGRESS_FILE, SEGMENTS_FILE, TRAINED_FILE, Attempt, Progress,
                                     TrialFolder, attempt_recorded, failures, read_attempts, read_progress)
from asr_core.contract.folder.segments import Segment, code_labels, read_segments

from orchestrate.sweep.folder import DEFAULT_MAX_FAILURES

if TYPE_CHECKING:
    from asr_core.contract.folder.lease import LeaseInfo
    from orchestrate.sweep.folder import SweepDir

__all__ = ["DEFAULT_MAX_FAILURES", "FolderState", "TrialRef", "failure_reason", "read_folder_state",
           "read_folder_states", "read_trial_refs"]

_READERS = 8  # threads reading folders: a network filesystem answers each small read in a millisecond or more
_CHUNK = 64  # folders per task of a reading thread
_THREADED_FROM = 2 * _CHUNK  # fewer folders than this are read in the calling thread

T = TypeVar("T")


def _safe(fn: Callable[[], T], default: T) -> T:
    """``fn()``, or ``default`` when a file it reads is missing, unreadable or half written."""
    try:
        return fn()
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return default


_OUTBOX: Any = None  # asr_core.contract.folder.outbox_files, imported on first use: only folders with an outbox need it


def _outbox() -> Any:
    global _OUTBOX
    if _OUTBOX is None:
        import asr_core.contract.folder.outbox_files

        _OUTBOX = asr_core.contract.folder.outbox_files
    return _OUTBOX


def _pending(trial_dir: Path) -> int:
    """Outbox records of the trial not yet shipped to MLflow (:func:`asr_core.contract.folder.outbox_files.pending`)."""
    return _safe(lambda: int(_outbox().pending(trial_dir)), 0)


# ---- one folder --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FolderState:
    """What one trial folder says (see :func:`read_folder_state`)."""

    key: str
    done: bool  # DONE exists
    trained: bool  # TRAINED exists
    cancelled: bool  # CANCELLED exists
    lease: "LeaseInfo | None"  # the newest lease generation (asr_core.contract.folder.lease.read_lease)
    live: bool  # lease is not None and lease.alive()
    progress: Progress | None  # the last progress record
    attempts: tuple[Attempt, ...]  # every recorded outcome, oldest first
    failures: tuple[Attempt, ...]  # the ones counting against max_failures (since the last reset)
    segments: int  # starts of the job (segments.jsonl)
    last_segment: Segment | None  # the newest segments.jsonl record
    unrecorded_segment: bool  # the last segment has no attempt recorded: it ended, or runs, without a word yet
    pending: int  # outbox records not yet shipped to MLflow
    codes: tuple[str, ...] = ()  # the distinct code labels that ran its segments, in the order they first ran
    exists: bool = True  # the folder exists (False: the trial was never prepared for a job)

    @property
    def last_attempt(self) -> Attempt | None:
        """The newest recorded attempt (a ``reset`` included), or None."""
        return self.attempts[-1] if self.attempts else None

    @property
    def last_outcome(self) -> str | None:
        """How the trial's latest segment (or lost job) ended: an ``OUTCOME_*`` of the newest attempt, or None when
        nothing is recorded or the newest segment has no outcome yet (:attr:`unrecorded_segment`)."""
        if self.unrecorded_segment or not self.attempts:
            return None
        return self.attempts[-1].outcome

    @property
    def failed(self) -> bool:
        """The latest outcome is a failure (failed by its own error, killed by the system, lost)."""
        return self.last_outcome in FAILURE_OUTCOMES

    @property
    def job_id(self) -> str:
        """The scheduler job that ran it last, as the folder knows it (lease, then the last segment)."""
        if self.lease is not None and self.lease.job_id:
            return str(self.lease.job_id)
        return self.last_segment.job if self.last_segment is not None else ""


def read_folder_state(trial_dir: Path, key: str) -> FolderState:
    """The :class:`FolderState` of one trial folder; a folder that does not exist reads as a trial not started.

    One directory listing tells which files exist, so a folder costs a few small reads: the tail of
    ``progress.jsonl``, ``segments.jsonl``, ``attempts.jsonl``, the lease and the outbox's count."""
    folder = TrialFolder(Path(trial_dir))
    try:
        names = set(os.listdir(folder.path))
    except OSError:
        return FolderState(key=key, done=False, trained=False, cancelled=False, lease=None, live=False,
                           progress=None, attempts=(), failures=(), segments=0, last_segment=None,
                           unrecorded_segment=False, pending=0, exists=False)
    path = folder.path
    lease = _safe(lambda: read_lease(path), None) if LEASE_DIR in names else None
    live = bool(_safe(lease.alive, False)) if lease is not None else False
    progress = _safe(lambda: read_progress(path), None) if PROGRESS_FILE in names else None
    attempts = tuple(_safe(lambda: read_attempts(path), [])) if ATTEMPTS_FILE in names else ()
    segs = _safe(lambda: read_segments(path), []) if SEGMENTS_FILE in names else []
    last = segs[-1] if segs else None
    unrecorded = last is not None and not attempt_recorded(list(attempts), last.number_or(len(segs)),
                                                           last.job)
    codes = code_labels(segs)
    pending = _pending(path) if OUTBOX_DIR in names else 0
    return FolderState(key=key, done=DONE_FILE in names, trained=TRAINED_FILE in names,
                       cancelled=CANCELLED_FILE in names, lease=lease, live=live, progress=progress,
                       attempts=attempts, failures=tuple(failures(list(attempts))), segments=len(segs),
                       last_segment=last, unrecorded_segment=unrecorded, pending=pending, codes=codes)


def read_folder_states(sweep: "SweepDir", keys: Iterable[str]) -> dict[str, FolderState]:
    """{key: FolderState} of the sweep's trials, in the order of ``keys`` (read by a pool of threads when there
    are many: on a network filesystem each small read waits for the server)."""
    keys = list(keys)

    def read(chunk: list[str]) -> list[FolderState]:
        return [read_folder_state(sweep.trial_dir(k), k) for k in chunk]

    if len(keys) < _THREADED_FROM:
        return dict(zip(keys, read(keys)))
    chunks = [keys[i:i + _CHUNK] for i in range(0, len(keys), _CHUNK)]
    with ThreadPoolExecutor(min(_READERS, len(chunks))) as ex:
        return dict(zip(keys, (fs for part in ex.map(read, chunks) for fs in part)))


# ---- the sweep's trials, lightly ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialRef:
    """A trial as status needs it: its key and label (reading ``trials.json`` without building 3,000 configs)."""

    key: str
    label: str
    model: str = ""  # an evaluation job: its model's key ("" for a model)
    evaluation: str = ""  # an evaluation job: its name
    conditions: str = ""  # an evaluation job: what it decodes, for people ("dev: snr5; other: clean, snr5")

    @property
    def is_evaluation(self) -> bool:
        return bool(self.model)


def _conditions_text(conds: Any) -> str:
    from asr_core.contract.evaluation import describe_conditions

    try:
        return describe_conditions(conds)
    except (AttributeError, TypeError, ValueError):
        return ""


def _ref(d: dict[str, Any]) -> TrialRef:
    ev = d.get("evaluation") or {}
    return TrialRef(key=str(d["key"]), label=str(d.get("label") or d["key"]), model=str(ev.get("model", "")),
                    evaluation=str(ev.get("name", "")), conditions=_conditions_text(ev.get("conditions", {})))


def read_trial_refs(sweep: "SweepDir") -> list[TrialRef]:
    """Key and label of every trial in ``trials.json``, in order (none when the file does not exist).

    Raises :class:`orchestrate.sweep.folder.SweepError` naming the file when it cannot be read as a list of trials."""
    from orchestrate.sweep.folder import SweepFileError, read_json

    path = sweep.trials_path
    try:
        data = read_json(path, "the sweep's trials", list)
    except FileNotFoundError:
        return []
    try:
        return [_ref(d) for d in data]
    except (TypeError, KeyError, AttributeError) as e:
        raise SweepFileError(path, "the sweep's trials", f"not a list of trials with a 'key' each "
                             f"({type(e).__name__}: {e})") from None


# ---- a trial's failures, in words --------------------------------------------------------------------------------
def failure_reason(fs: FolderState, max_failures: int) -> str:
    """``gave up after 3 failures: killed OUT_OF_MEMORY`` or ``2/3 failures: failed RuntimeError: boom``: the
    failures since the last reset against ``max_failures``, and the last one's outcome and reason."""
    last = next((a for a in reversed(fs.failures) if a.outcome in FAILURE_OUTCOMES), None)
    if last is None:
        what = "no failure recorded"
    elif last.reason.lower().startswith(last.outcome):  # "killed by the system: out of memory" says it already
        what = last.reason
    else:
        what = f"{last.outcome} {last.reason}".strip()
    n = len(fs.failures)
    if n >= max_failures:
        return f"gave up after {n} failures: {what}"
    return f"{n}/{max_failures} failures: {what}"
