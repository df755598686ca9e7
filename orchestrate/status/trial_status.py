"""Where each trial of a sweep stands, for ``status`` (the states: :mod:`orchestrate.status.status`): its folder
(:mod:`orchestrate.sweep.trial_state`) and the scheduler's view, one plain ``squeue`` for the sweep's job names (skipped
for the local backend, whose trials are held by the process holding the sweep's lock), and one ``sacct`` for the
trials whose last segment ended without a word.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asr_core.contract.trial import (FAILED, FINISHED, KILLED, OUTCOME_CANCELLED, OUTCOME_FENCED, OUTCOME_FINISHED,
                                     OUTCOME_PREEMPTED, OUTCOME_RESET, RUNNING, TrialFolder)
from asr_core.contract.folder.outbox_files import kept
from orchestrate.sweep.progress import phase_text, trial_pace
from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.sweep.trial_state import DEFAULT_MAX_FAILURES, FolderState, failure_reason

__all__ = ["LOST", "PENDING", "PREEMPTED", "QUEUED", "STATUS_STATES", "SchedulerView", "TrialStatus", "classify",
           "scheduler_view", "trial_statuses"]

# besides the run states FINISHED, RUNNING, FAILED, KILLED:
PENDING, QUEUED, PREEMPTED, LOST = "PENDING", "QUEUED", "PREEMPTED", "LOST"
STATUS_STATES = (FINISHED, RUNNING, PENDING, QUEUED, PREEMPTED, FAILED, KILLED, LOST)  # the order status prints them
# the scheduler's states of a job waiting in the queue (squeue %T; a local sweep's runner reports PENDING for the
# trials it holds and has not started): a trial held by such a job is PENDING, not QUEUED (starting)
WAITING_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD")


# ---- the scheduler -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SchedulerView:
    """Which trials the scheduler holds now: {key: job id} and {key: scheduler state}. ``known`` is False when it
    could not be asked (``note`` says why); ``note`` also says what a local sweep's holder is."""

    held: Mapping[str, str]
    states: Mapping[str, str]
    known: bool = True
    note: str = ""


def _lock_holder(sweep: SweepDir) -> str | None:
    """What holds the sweep's lock now (``resume by pid 12``), or None when nobody does or it cannot be told."""
    path = sweep.path / "lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
        except OSError:
            return None
        return None
    finally:
        os.close(fd)  # closing drops the lock if it was taken here


def scheduler_view(sweep: SweepDir, manifest: Manifest) -> SchedulerView:
    """The trials the scheduler holds, from the sweep's submission files and one ``squeue`` (no settling: status
    only reports). A local sweep's trials are held by the process running it, while that process holds the lock."""
    subs = [s for s in _submissions(sweep) if s.data.get("backend") == manifest.backend]
    if manifest.backend == "local":
        holder = _lock_holder(sweep)
        if holder is None or not subs:
            return SchedulerView({}, {})
        newest = subs[-1]
        held = {k: str(newest.job_id or "local") for k in newest.keys}
        # the runner holds them; one that runs has a live lease (RUNNING), the others wait their turn
        return SchedulerView(held, {k: "PENDING" for k in held}, note=f"the sweep is being run ({holder})")
    from orchestrate.backends.base import BackendError
    from orchestrate.backends.slurm_commands import squeue

    by_name = {s.job_name(): s for s in subs}
    try:
        rows = squeue(list(by_name))
    except BackendError as e:
        return SchedulerView({}, {}, known=False, note=f"squeue failed: {e}")
    held: dict[str, str] = {}
    states: dict[str, str] = {}
    for job_id, name, state in rows:
        sub = by_name.get(name)
        if sub is None:
            continue
        if manifest.backend == "slurm":
            idx = job_id.split("_", 1)[1] if "_" in job_id else "0"  # a lone job (one trial) is task 0
            keys = [sub.keys[int(idx)]] if idx.isdigit() and int(idx) < len(sub.keys) else []
        else:  # ray-slurm: one allocation holds every trial of its submission
            keys = sub.keys
        for k in keys:
            held[k], states[k] = job_id, state
    return SchedulerView(held, states)


def _submissions(sweep: SweepDir) -> list[Any]:
    try:
        return sweep.submissions()
    except (OSError, ValueError):
        return []


def _run_ids(sweep: SweepDir) -> dict[str, str]:
    """{key: run id} from the submission files (the newest submission of a key wins): known without MLflow."""
    out: dict[str, str] = {}
    for s in _submissions(sweep):
        ids = s.data.get("run_ids") or []
        for k, r in zip(s.keys, ids):
            if isinstance(r, str) and r:
                out[k] = r
    return out


# ---- one trial ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialStatus:
    """Where one trial stands (one line of ``status --json``)."""

    key: str
    label: str
    status: str  # one of STATUS_STATES
    reason: str  # why, in words ("2/3 failures: killed OUT_OF_MEMORY", "requeue pending (job 12_3)", ...)
    failures: int  # failures since the last reset
    max_failures: int
    gave_up: bool
    job_id: str  # the scheduler's job holding it, or the last that ran it
    held: bool | None  # the scheduler holds a job for it (None: the scheduler could not be asked)
    live: bool  # a live lease
    lease: str  # who holds the lease ("job 12_3 on node7 pid 991, heartbeat 12 s ago"), "" when none
    phase: str | None  # progress: "train 30/60", "eval test 4/12", "starting", "done", None before the first start
    segments: int
    code: tuple[str, ...]  # the code labels that ran its segments, in order
    pending: int  # outbox records not yet shipped to MLflow
    run_id: str  # from the submission files ("" when not submitted)
    kept: int = 0  # outbox records MLflow refused for good, kept until `python -m asr_core ship` sends them again
    folder: str = ""  # the trial folder (<sweep>/trials/<key>)
    log: str = ""  # the job's log in it (trial.log: stdout and stderr of every segment)
    progress: float | None = None  # the share of its work done (training steps, or an evaluation's units), 0..1
    rate: float | None = None  # steps (or evaluation units) a second over the last minutes, while it runs
    eta_s: float | None = None  # seconds until the current phase ends at that rate
    gpu_hours: float = 0.0  # the wall time its segments ran, one GPU each


def _lost_reason(fs: FolderState) -> str:
    seg = fs.last_segment
    if fs.unrecorded_segment and seg is not None:  # (an unrecorded segment is always the last one read)
        return (f"segment {seg.number_or(fs.segments)} (job {seg.job or 'no job id'}) ended without a word; resume "
                "asks the scheduler how it ended")
    outcome = fs.last_outcome
    if outcome is None:
        return "never started, and no job holds it" if fs.segments == 0 else "no job holds it"
    why = {OUTCOME_FENCED: "its last job found the lease held and exited",
           OUTCOME_CANCELLED: "cancelled, then released by retry --cancelled",
           OUTCOME_RESET: "failures reset by retry --failed",
           OUTCOME_FINISHED: "its job finished but DONE is missing"}.get(outcome, f"last outcome {outcome}")
    return f"{why}; no job holds it"


def classify(fs: FolderState, label: str, *, held_job: str | None, held_state: str = "", scheduler_known: bool = True,
             max_failures: int = DEFAULT_MAX_FAILURES, run_id: str = "") -> TrialStatus:
    """The :class:`TrialStatus` of one trial from its folder and the scheduler's view (``held_job``: the job the
    scheduler holds for it, or None)."""
    n = len(fs.failures)
    gave_up = False
    phase = phase_text(fs.done, fs.progress, fs.segments > 0)
    job = held_job or fs.job_id
    if fs.done:
        status, reason = FINISHED, ""
    elif fs.cancelled:
        status = KILLED
        reason = "cancelled" + (f"; job {fs.job_id} is still checkpointing" if fs.live else "")
    elif fs.live:
        status, reason = RUNNING, phase or "starting"
    elif fs.last_outcome == OUTCOME_PREEMPTED:
        status = PREEMPTED
        if held_job:
            reason = f"requeue pending (job {held_job}, {held_state or 'held'})"
        elif scheduler_known:
            reason = "checkpointed; no job holds it: resume continues it"
        else:
            reason = "checkpointed"
        if n:
            reason += f" ({n}/{max_failures} failures so far)"
    elif held_job and held_state in WAITING_STATES and not fs.unrecorded_segment:
        status = PENDING
        reason = f"job {held_job} {held_state.lower()} in the queue" + (", not started yet" if not fs.segments
                                                                         else ", to start again")
        if n:
            reason += f" after {n}/{max_failures} failures"
    elif held_job:
        status = QUEUED
        reason = f"job {held_job} {held_state or 'held'}" + ("" if not fs.unrecorded_segment else ", no heartbeat")
        if n:
            reason += f" after {n}/{max_failures} failures"
    elif fs.failed:
        status, reason = FAILED, failure_reason(fs, max_failures)
        gave_up = n >= max_failures
    else:
        status, reason = LOST, _lost_reason(fs)
        if n:
            reason += f" ({n}/{max_failures} failures so far)"
    if not scheduler_known and status in (LOST, FAILED):
        reason += " (the scheduler could not be asked: a job may hold it)"
    return TrialStatus(key=fs.key, label=label, status=status, reason=reason, failures=n, max_failures=max_failures,
                       gave_up=gave_up, job_id=job, held=(held_job is not None) if scheduler_known else None,
                       live=fs.live, lease=_describe_lease(fs), phase=phase, segments=fs.segments, code=fs.codes,
                       pending=fs.pending, run_id=run_id)


def _describe_lease(fs: FolderState) -> str:
    if fs.lease is None:
        return ""
    try:
        return str(fs.lease.describe())
    except Exception:  # noqa: BLE001 - a lease that cannot describe itself still counts by `live`
        return ""


def trial_statuses(sweep: SweepDir, manifest: Manifest, trials: Sequence[Any],
                   states: Mapping[str, FolderState], view: SchedulerView) -> list[TrialStatus]:
    """One :class:`TrialStatus` per trial of ``trials`` (anything with ``key`` and ``label``), in their order."""
    max_failures = int(getattr(manifest, "max_failures", DEFAULT_MAX_FAILURES) or DEFAULT_MAX_FAILURES)
    run_ids = _run_ids(sweep)
    now = time.time()
    rows = []
    for t in trials:
        fs, folder = states[t.key], sweep.trial_dir(t.key)
        row = classify(fs, t.label, held_job=view.held.get(t.key), held_state=view.states.get(t.key, ""),
                       scheduler_known=view.known, max_failures=max_failures, run_id=run_ids.get(t.key, ""))
        pace = (trial_pace(folder, done=fs.done, live=fs.live, attempts=fs.attempts, last=fs.progress,
                           evaluation=bool(getattr(t, "is_evaluation", False)), now=now) if fs.exists else None)
        rows.append(dataclasses.replace(
            row, kept=kept(folder) if fs.exists else 0, folder=str(folder), log=str(TrialFolder(folder).log),
            progress=pace.progress if pace else None, rate=pace.rate if pace else None,
            eta_s=pace.eta_s if pace else None, gpu_hours=round(pace.gpu_hours, 4) if pace else 0.0))
    if manifest.backend == "slurm" and view.known:
        rows = _with_accounting(rows, states)
    return rows


def _with_accounting(rows: list[TrialStatus], states: Mapping[str, FolderState]) -> list[TrialStatus]:
    """LOST trials whose last segment ended without a word, with how the scheduler's accounting says its job ended
    (one ``sacct`` for all; read only: ``resume`` records it and counts it against the budget)."""
    asks = {r.key: seg.job for r in rows if r.status == LOST and states[r.key].unrecorded_segment
            and (seg := states[r.key].last_segment) is not None}
    asks = {k: j for k, j in asks.items() if j}
    if not asks:
        return rows
    from orchestrate.backends.base import BackendError
    from orchestrate.backends.slurm_commands import job_ends

    try:
        ends = job_ends(sorted(set(asks.values())))
    except BackendError:
        return rows  # no accounting: the reason already says that resume asks
    out = []
    for r in rows:
        job = asks.get(r.key)
        if job is not None and job in ends:
            end = ends[job]
            last = states[r.key].last_segment
            seg = last.number_or(states[r.key].segments) if last is not None else states[r.key].segments
            how = ("the scheduler's accounting has it not ended, though the queue does not show it" if end is None
                   else f"{end.reason}; resume records it")
            r = dataclasses.replace(r, reason=f"segment {seg} (job {job}) ended without a word; {how}"
                                    + (f" ({r.failures}/{r.max_failures} failures so far)" if r.failures else ""))
        out.append(r)
    return out
