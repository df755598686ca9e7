"""The pure parts of ``orchestrate status``'s one-screen view (:mod:`orchestrate.status.screen` draws it): failures
grouped by cause, the trials that matter now, the work and time left, the best configuration so far, and fitting
lines into a terminal. Nothing here reads a file or the clock: every input is a value, so each is tested alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from asr_core.contract.trial import FAILED, FINISHED, KILLED, RUNNING
from orchestrate.status.trial_status import LOST, TrialStatus

__all__ = ["BAD_STATES", "Best", "Cause", "WorkLeft", "best_trial", "cause_of", "failure_causes", "fit_lines",
           "trials_that_matter", "work_left"]

BAD_STATES = (FAILED, KILLED, LOST)  # the states whose trials need a person, grouped by cause
_COUNT = re.compile(r"^(\d+/\d+ failures|gave up after \d+ failures): ")
_SCHEDULER = " (the scheduler could not be asked: a job may hold it)"
_SO_FAR = re.compile(r" \(\d+/\d+ failures so far\)")
_JOB = re.compile(r"\b(segment \d+ \(job [^)]*\)|job [^\s,;)]*\d[^\s,;)]*)")  # a job named by its id


# ---- failures by cause ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cause:
    """Trials that stopped for one reason: the state, the reason without what differs per trial, how many, and one
    of them as the example."""

    state: str
    cause: str
    count: int
    example: TrialStatus


def cause_of(row: TrialStatus) -> str:
    """The reason of a failed, killed or lost trial without what differs from trial to trial: the failure count
    (``2/3 failures: killed OUT_OF_MEMORY`` -> ``killed OUT_OF_MEMORY``), the scheduler's note, job ids
    (``segment 1 (job 9000_60) ended without a word`` -> ``segment (job) ended without a word``)."""
    text = _COUNT.sub("", row.reason.replace(_SCHEDULER, ""))
    text = _SO_FAR.sub("", text)
    text = _JOB.sub(lambda m: "segment (job)" if m.group(0).startswith("segment") else "job", text)
    return text.strip() or row.status.lower()


def failure_causes(rows: Iterable[TrialStatus]) -> list[Cause]:
    """The failed, killed and lost trials grouped by (state, :func:`cause_of`), largest group first; the example of
    each is the trial with the most failures (then the first label)."""
    groups: dict[tuple[str, str], list[TrialStatus]] = {}
    for r in rows:
        if r.status in BAD_STATES:
            groups.setdefault((r.status, cause_of(r)), []).append(r)
    out = [Cause(state, cause, len(rs), min(rs, key=lambda r: (-r.failures, r.label)))
           for (state, cause), rs in groups.items()]
    return sorted(out, key=lambda c: (-c.count, BAD_STATES.index(c.state), c.cause))


# ---- the trials that matter now ------------------------------------------------------------------------------------
def trials_that_matter(rows: Sequence[TrialStatus], n: int,
                       failed_at: Mapping[str, float]) -> tuple[list[TrialStatus], list[TrialStatus]]:
    """At most ``n`` trials worth a line now: (running ones, newest failures). Running trials come slowest first
    (the longest time left; those without a rate yet after them), so the ones that decide when the sweep ends are
    the ones kept when not all fit; failed trials newest first by ``failed_at`` ({key: Unix time of the last
    failure}). When both kinds do not fit, a third of the lines (at least one) go to failures."""
    running = sorted((r for r in rows if r.status == RUNNING),
                     key=lambda r: (r.eta_s is None, -(r.eta_s or 0.0), r.label))
    failed = sorted((r for r in rows if r.status == FAILED), key=lambda r: (-failed_at.get(r.key, 0.0), r.label))
    n = max(0, n)
    if len(running) + len(failed) <= n:
        return running, failed
    n_failed = min(len(failed), max(1, n // 3)) if failed and n else 0
    n_running = min(len(running), n - n_failed)
    n_failed = min(len(failed), n - n_running)  # fewer running than their share: the failures take the rest
    return running[:n_running], failed[:n_failed]


# ---- work and time left --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkLeft:
    """What remains of a sweep: ``hours`` of work (GPU-hours on a cluster), from the measured rate for ``measured``
    running trials and from a per-trial estimate for ``estimated`` others (``source``: "recorded" for the estimate
    submit recorded, "finished" for the mean hours its finished trials took, "" for none); ``unknown`` trials had
    neither. ``wall_s``: seconds until the sweep ends at ``parallel`` trials at once (None when nothing runs or
    nothing is known)."""

    hours: float
    measured: int
    estimated: int
    unknown: int
    source: str
    parallel: int
    wall_s: float | None
    longest_s: float | None  # the running trial with the most time left


def work_left(rows: Sequence[TrialStatus], estimate: Mapping[str, float]) -> WorkLeft:
    """The :class:`WorkLeft` of ``rows``. Every trial that will still run counts (not finished, not cancelled, not
    failed for good): a running one by its measured time left (``eta_s``, its rate over the last minutes), any
    other by its estimated hours times the share of its work not done: the ``estimate`` submit recorded ({key:
    GPU-hours}), else the mean hours of the finished trials. The wall time is the hours left spread over the trials
    running now, and never less than the longest of them."""
    finished = [r.gpu_hours for r in rows if r.status == FINISHED and r.gpu_hours > 0]
    mean = sum(finished) / len(finished) if finished else None
    source = "recorded" if estimate else ("finished" if mean is not None else "")
    hours, measured, estimated, unknown = 0.0, 0, 0, 0
    longest: float | None = None
    for r in rows:
        if r.status in (FINISHED, KILLED) or (r.status == FAILED and r.gave_up):
            continue
        if r.status == RUNNING and r.eta_s is not None:
            hours += r.eta_s / 3600.0
            measured += 1
            longest = max(longest or 0.0, r.eta_s)
            continue
        per_trial = estimate.get(r.key) if estimate else mean
        if per_trial is None:
            unknown += 1
            continue
        hours += per_trial * (1.0 - min(1.0, max(0.0, r.progress or 0.0)))
        estimated += 1
    parallel = sum(r.status == RUNNING for r in rows)
    wall = None
    if parallel and (measured or estimated):
        wall = max(hours * 3600.0 / parallel, longest or 0.0)
    return WorkLeft(hours=hours, measured=measured, estimated=estimated, unknown=unknown, source=source,
                    parallel=parallel, wall_s=wall, longest_s=longest)


# ---- the best configuration so far ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Best:
    """The finished trial with the lowest WER, and of how many finished trials with a WER."""

    row: TrialStatus
    wer: float
    datasets: tuple[str, ...]
    of: int


def best_trial(rows: Iterable[TrialStatus], wers: Mapping[str, Mapping[str, float]]) -> Best | None:
    """The finished trial whose mean WER over its datasets (``wers``: {key: {dataset: WER}}) is lowest; None when
    no finished trial has one."""
    scored = [(sum(w.values()) / len(w), r, tuple(sorted(w))) for r in rows
              if r.status == FINISHED and (w := wers.get(r.key))]
    if not scored:
        return None
    wer, row, datasets = min(scored, key=lambda s: (s[0], s[1].label))
    return Best(row=row, wer=wer, datasets=datasets, of=len(scored))


# ---- the screen ----------------------------------------------------------------------------------------------------
def clip(line: str, width: int) -> str:
    """``line`` cut to ``width`` characters, its end marked ``…`` when cut (a line longer than the terminal is wide
    takes two rows, and the screen scrolls)."""
    return line if len(line) <= width or width < 2 else line[:width - 1] + "…"


def fit_lines(lines: Sequence[str], height: int, width: int | None = None,
              more: str = "(--all)") -> list[str]:
    """At most ``height`` lines (each clipped to ``width``): when there are more, the first ``height - 1`` and a
    last line ``… N more lines (--all)`` (``more`` says where they are)."""
    out = [clip(line, width) if width else line for line in lines]
    if len(out) <= height:
        return out
    keep = max(0, height - 1)
    return out[:keep] + [f"… {len(out) - keep} more lines {more}".rstrip()]
