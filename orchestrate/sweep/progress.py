"""One line of progress for trials running on this machine, read from their folders (no MLflow round trip).

The trial job appends structured progress records to its folder (:class:`asr_core.contract.trial.ProgressLog`);
:func:`trial_phase` reads the last one with :func:`asr_core.contract.trial.read_progress` and never parses the
trainer's log text. A glance at the folders says how far each trial is:
``[orchestrate] 2/8 finished, 2 running, 4 waiting: ctx10s-…-s1 train 30/60, ctx10s-…-s2 eval test 4/12``;
a trial whose job failed, or checkpointed and stopped when preempted, is counted as such, not as running:
``[orchestrate] 2/8 finished, 1 running, 1 failed, 1 preempted, 3 waiting: ctx10s-…-s1 train 30/60, ctx10s-…-s2
failed, ctx10s-…-s3 preempted``.

:func:`trial_pace` adds what ``status`` shows of each trial: the share of its work done, its rate over the last
minutes (steps a second while training) and the time left at that rate, and the GPU-hours its segments ran.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asr_core.contract.folder.segments import read_segments
from asr_core.contract.trial import Progress, TrialFolder, progress_tail, read_progress

STOPPED = ("failed", "preempted", "cancelled")  # phases of a trial whose job is no longer running (and not finished)


def trial_phase(trial_dir: Path) -> str | None:
    """``"done"``, ``"train 30/60"``, ``"eval test 1/4"``, ``"starting"`` (and the other
    :meth:`~asr_core.contract.trial.Progress.describe` texts), or None if the trial has not started.

    ``DONE`` in the folder means done whatever the records say; a job that started (its log exists) but has not
    written a record yet is ``"starting"``."""
    folder = TrialFolder(Path(trial_dir))
    if folder.done.exists():
        return "done"
    progress = read_progress(folder.path)
    return phase_text(False, progress, progress is not None or folder.log.exists())


def phase_text(done: bool, progress: Progress | None, started: bool) -> str | None:
    """The phase :func:`trial_phase` reports, from what a caller has already read: ``done`` (DONE exists), the last
    progress record, and whether the job has started at all (``starting`` until its first record)."""
    if done:
        return "done"
    if progress is not None:
        return progress.describe()
    return "starting" if started else None


class ProgressPrinter:
    """Prints a progress line every ``every_s`` seconds when it changed; call :meth:`tick` from a polling loop."""

    def __init__(self, trials: dict[str, Path], labels: dict[str, str], every_s: float = 20.0) -> None:
        self.trials, self.labels, self.every_s = trials, labels, every_s
        self._last_print = time.monotonic()
        self._last_line = ""

    def line(self) -> str:
        """``[orchestrate] D/N finished, R running[, F failed][, P preempted], W waiting: LABEL PHASE, ...`` for the
        trials now: the running ones with their phase, then the failed and the preempted ones. A job that failed or
        checkpointed on preemption is not running; the counts of failed and preempted show only when not zero."""
        phases = {k: trial_phase(d) for k, d in self.trials.items()}
        done = sum(p == "done" for p in phases.values())
        waiting = sum(p is None for p in phases.values())
        stopped = {phase: [k for k, p in phases.items() if p == phase] for phase in STOPPED}
        running = [k for k, p in phases.items() if p is not None and p != "done" and p not in STOPPED]
        parts = [f"{done}/{len(phases)} finished", f"{len(running)} running"]
        parts += [f"{len(keys)} {phase}" for phase, keys in stopped.items() if keys]
        parts.append(f"{waiting} waiting")
        shown = [f"{self.labels.get(k, k)} {phases[k]}" for k in running + [k for keys in stopped.values()
                                                                          for k in keys]]
        return "[orchestrate] " + ", ".join(parts) + (": " + ", ".join(shown) if shown else "")

    def tick(self) -> bool:
        """Print if due and changed. Returns False, so it can serve as a never-stopping poll callback."""
        now = time.monotonic()
        if now - self._last_print >= self.every_s:
            self._last_print = now
            line = self.line()
            if line != self._last_line:
                print(line, file=sys.stderr, flush=True)
                self._last_line = line
        return False


# ---- pace: rate, time left, GPU-hours ------------------------------------------------------------------------------
RATE_WINDOW_S = 600.0  # the rate is measured over the records of the last ten minutes of the current segment
TAIL_BYTES = 32_768  # the end of progress.jsonl read for it (a record every log_every steps: hundreds of records)


@dataclass(frozen=True)
class Pace:
    """How far a trial is and how fast it goes (see :func:`trial_pace`)."""

    progress: float | None  # share of its work done, 0..1 (None: nothing recorded yet)
    rate: float | None  # units (steps while training) a second over the last minutes of its current segment
    eta_s: float | None  # seconds until the current phase ends at that rate
    unit: str  # "steps" while training, "units" (recordings x conditions) while evaluating
    gpu_hours: float  # wall hours its segments ran (one GPU each)


def recent_progress(trial_dir: Path, tail_bytes: int = TAIL_BYTES, window_s: float | None = None) -> list[Progress]:
    """The complete progress records at the end of a trial folder's ``progress.jsonl``, oldest first (none when it
    has none). With ``window_s``: only those of the current segment (from its last ``start``) within ``window_s``
    seconds of the newest, read from the end and no further (3,000 folders: status stays well under its goal)."""
    out: list[Progress] = []
    for rec in reversed(progress_tail(trial_dir, tail_bytes)):
        if window_s is not None and out and (rec.phase == "start" or rec.time < out[0].time - window_s):
            if rec.phase == "start":
                out.append(rec)
            break
        out.append(rec)
    return out[::-1]


def newest_of(trial_dir: Path, phases: tuple[str, ...], tail_bytes: int = TAIL_BYTES) -> Progress | None:
    """The newest record of one of ``phases`` at the end of the trial's progress records, or None."""
    return next((r for r in reversed(progress_tail(trial_dir, tail_bytes)) if r.phase in phases), None)


def rate_of(records: list[Progress], window_s: float = RATE_WINDOW_S) -> float | None:
    """Units a second of the newest record's phase (and dataset) over the records of the last ``window_s`` seconds
    of the current segment (after its last ``start``), or None with fewer than two records to compare."""
    starts = [i for i, r in enumerate(records) if r.phase == "start"]
    recs = records[starts[-1] + 1:] if starts else records
    if not recs or recs[-1].phase not in ("train", "eval"):
        return None
    last = recs[-1]
    same = [r for r in recs if r.phase == last.phase and r.dataset == last.dataset and r.total == last.total
            and r.time >= last.time - window_s]
    first = same[0]
    dt = last.time - first.time
    if len(same) < 2 or dt <= 0 or last.done <= first.done:
        return None
    return (last.done - first.done) / dt


def _work_done(done: bool, last: Progress | None, trial_dir: Path, evaluation: bool) -> float | None:
    """The share of the trial's work done: 1 when finished, else its training steps (a model: the newest train
    record; past training, 0.99) or an evaluation job's units; None when nothing was recorded."""
    if done:
        return 1.0
    phase = "eval" if evaluation else "train"
    if last is not None and last.phase != phase:  # preempted, failed, ...: the newest record of a phase before it
        last = newest_of(trial_dir, ("train", "eval"))
        if last is not None and last.phase != phase:
            return 0.99  # a model past training, evaluating
    if last is None or last.total <= 0:
        return None
    return min(0.99, last.done / last.total)


def segment_hours(trial_dir: Path, attempts: Any, live: bool, last_time: float, now: float | None = None) -> float:
    """Wall hours the trial's segments ran: each from its start (``segments.jsonl``) to the time its outcome was
    recorded (``attempts``: anything with ``segment``, ``job_id`` and ``time``), the last one to now while it
    runs (``live``) or else to its newest progress record (``last_time``). A segment no record ends counts
    nothing."""
    now = time.time() if now is None else now
    segs = read_segments(trial_dir)
    ends = {(a.segment, a.job_id): a.time for a in attempts if a.segment is not None and a.time}
    total = 0.0
    for i, seg in enumerate(segs, 1):
        n = seg.number_or(i)
        end = ends.get((n, seg.job)) or ends.get((n, "")) or 0.0
        if not end and i == len(segs):
            end = now if live else last_time
        if seg.time and end > seg.time:
            total += end - seg.time
    return total / 3600.0


def trial_pace(trial_dir: Path, *, done: bool, live: bool, attempts: Any, last: Progress | None = None,
               evaluation: bool = False, now: float | None = None) -> Pace:
    """The :class:`Pace` of one trial folder from its newest progress record (``last``, as the caller read it),
    the records of the last minutes while it runs (``live``: the rate and time left), its segments and its
    recorded outcomes (``attempts``)."""
    recent = recent_progress(trial_dir, window_s=RATE_WINDOW_S) if live else []
    if recent:
        last = recent[-1]
    rate = rate_of(recent) if recent else None
    eta = (max(0, last.total - last.done) / rate) if rate and last is not None else None
    unit = "steps" if last is not None and last.phase == "train" else "units"
    hours = segment_hours(trial_dir, attempts, live, last.time if last is not None else 0.0, now)
    return Pace(progress=_work_done(done, last, trial_dir, evaluation), rate=rate, eta_s=eta, unit=unit,
                gpu_hours=hours)


def duration_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``4 h 43 min``, ``3 d 2 h``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"
