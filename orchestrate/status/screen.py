"""What ``orchestrate status`` prints of a sweep whose rows do not fit one screen (a paper-scale sweep of 321 trials):
the failed, killed and lost trials grouped by cause with one example each, the trials that matter now (the running
ones, slowest first, and the newest failures) with their latest loss, and the best configuration so far; beside the
lines every view has, the time left (:func:`time_left_line`). ``status --all`` prints every row instead.

The choices are :mod:`orchestrate.status.monitor`'s (pure); this module reads the trials' outbox tails
(:mod:`orchestrate.status.trial_metrics`) and words the lines.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from asr_core.contract.trial import FAILED, FINISHED, RUNNING
from orchestrate.status.monitor import WorkLeft, best_trial, cause_of, failure_causes, trials_that_matter
from orchestrate.sweep.progress import duration_text
from orchestrate.status.trial_metrics import trial_metrics
from orchestrate.status.trial_status import TrialStatus

__all__ = ["MAX_CAUSES", "MIN_TRIALS", "SCREEN_LINES", "compact_sections", "time_left_line"]

SCREEN_LINES = 45  # what plain `status` fills at most (a 50-row terminal keeps the prompt and the command on screen)
MAX_CAUSES = 6  # causes of failure listed one a line; the rest counted in one line
MIN_TRIALS = 3  # trials that matter shown even when the rest of the view is long
CAUSE_CHARS = 70  # a cause cut to this many characters (its example trial follows it on the line)


def time_left_line(work: WorkLeft, backend: str) -> str:
    """``  time left ~1 d 4 h (32 trials at once); ~1234.5 GPU-hours of work left: ...``; a local sweep counts
    trial-hours on this machine, not GPU-hours."""
    unit = "trial-hours of work left on this machine" if backend == "local" else "GPU-hours of work left"
    basis = []
    if work.measured:
        basis.append(f"{work.measured} running by their measured rates")
    if work.estimated:
        basis.append(f"{work.estimated} others by " + ("the estimate submit recorded" if work.source == "recorded"
                                                       else "the mean hours of the finished trials"))
    if work.unknown:
        basis.append(f"{work.unknown} with no estimate (`orchestrate plan GRID --estimate` gives one)")
    hours = f"~{work.hours:.1f} {unit}" + (f" ({'; '.join(basis)})" if basis else "")
    if not work.measured and not work.estimated:
        if not work.unknown:
            return "  time left: none; no trial will run again unless `orchestrate retry` starts it"
        return (f"  time left unknown: {work.unknown} trials to run and no estimate recorded nor trial finished "
                "(`orchestrate plan GRID --estimate` estimates them)")
    if work.wall_s is None:
        return f"  time left unknown: no trial runs now (`orchestrate resume` starts them); {hours}"
    return f"  time left ~{duration_text(work.wall_s)} at {work.parallel} trials at once; {hours}"


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _ago(seconds: float) -> str:
    return f"{duration_text(max(0.0, seconds))} ago"


def _loss(m: Any) -> str:
    return f"loss {m.loss:.3f} (step {m.step})" if m.loss is not None else ""


def _cause_lines(rows: Sequence[TrialStatus], limit: int = MAX_CAUSES) -> list[str]:
    """A gap, a heading, a line per cause (at most ``limit``), and one for the causes left out."""
    causes = failure_causes(rows)
    if not causes:
        return []
    n = sum(c.count for c in causes)
    out = ["", f"{n} failed, killed or lost, by cause (one example each; --state STATE or --all lists them):"]
    for c in causes[:limit]:
        cause = _cut(c.cause, CAUSE_CHARS)
        out.append(f"  {c.count:>4}  {c.state:<6}  {cause:<{min(CAUSE_CHARS, max(len(x.cause) for x in causes))}}  "
                   f"e.g. {c.example.label} {c.example.key}")
    if len(causes) > limit:
        rest = causes[limit:]
        out.append(f"  … {len(rest)} more causes of {sum(c.count for c in rest)} trials (--all)")
    return out


def _matter_lines(sweep: Any, rows: Sequence[TrialStatus], n: int, failed_at: Mapping[str, float],
                  now: float) -> list[str]:
    running, failed = trials_that_matter(rows, n, failed_at)
    if not running and not failed:
        return []
    n_running = sum(r.status == RUNNING for r in rows)
    n_failed = sum(r.status == FAILED for r in rows)
    parts = []
    if n_running:
        parts.append(f"{len(running)} of {n_running} running (slowest first)")
    if n_failed:
        parts.append(f"{len(failed)} of {n_failed} failed (newest first)")
    out = ["", f"trials that matter now: {', '.join(parts)}; `orchestrate logs {sweep.name} KEY` shows a log:"]
    lw = max(len(r.label) for r in [*running, *failed])
    for r in running:
        m = trial_metrics(Path(r.folder)) if r.folder else None
        pace = ""
        if r.rate:
            unit = "steps/s" if (r.phase or "").startswith("train") else "units/s"
            pace = f"{r.rate:.3g} {unit}" + (f", {duration_text(r.eta_s)} left" if r.eta_s is not None else "")
        out.append(f"  {r.label:<{lw}}  {r.key}  {r.phase or 'starting':<18}  {pace:<28}  "
                   + (_loss(m) if m is not None else ""))
    for r in failed:
        m = trial_metrics(Path(r.folder)) if r.folder else None
        when = _ago(now - failed_at[r.key]) if failed_at.get(r.key) else ""
        out.append(f"  {r.label:<{lw}}  {r.key}  FAILED {when:<12}  {r.failures}/{r.max_failures}  "
                   f"{_cut(cause_of(r), CAUSE_CHARS - 20)}" + (f"  {_loss(m)}" if m is not None and m.loss is not None
                                                    else ""))
    return out


def _best_lines(rows: Sequence[TrialStatus], models: set[str]) -> list[str]:
    finished = [r for r in rows if r.key in models and r.status == FINISHED and r.folder]
    if not finished:
        return []
    wers = {r.key: trial_metrics(Path(r.folder)).wers for r in finished}
    best = best_trial(finished, wers)
    if best is None:
        return ["", f"best so far: none of the {len(finished)} finished trials holds a WER in its outbox yet"]
    return ["", f"best so far: {best.row.label} {best.row.key}  WER {best.wer:.2f}% (mean of "
                f"{', '.join(best.datasets)}; the lowest of {best.of} finished trials with a WER)"]


def _other_lines(rows: Sequence[TrialStatus], trials: Sequence[Any]) -> list[str]:
    """One line each for what ``--all`` lists in full: evaluation jobs, code that differed between segments,
    records MLflow refused."""
    out: list[str] = []
    jobs = {t.key for t in trials if getattr(t, "is_evaluation", False)}
    if jobs:
        counts: dict[str, int] = {}
        for r in rows:
            if r.key in jobs:
                counts[r.status] = counts.get(r.status, 0) + 1
        out.append("evaluation jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    mixed = sum(len(r.code) > 1 for r in rows)
    if mixed:
        out.append(f"{mixed} trials ran different code in their segments (--all lists them)")
    kept = [r for r in rows if r.kept]
    if kept:
        out.append(f"{len(kept)} trials keep records MLflow refused (--all lists them and the command that sends them "
                   "again)")
    return [""] + out if out else []


def compact_sections(sweep: Any, rows: Sequence[TrialStatus], trials: Sequence[Any], states: Mapping[str, Any],
                     lines: int, now: float | None = None) -> list[str]:
    """The lines below the counts of a sweep too large to list whole, at most ``lines`` of them when the trials
    that matter can be cut to fit (at least :data:`MIN_TRIALS` are shown): failures by cause, the trials that
    matter now, the best configuration so far, one line each for evaluation jobs, mixed code and refused records.
    ``states``: {key: :class:`~orchestrate.sweep.trial_state.FolderState`} (the times of the failures)."""
    now = time.time() if now is None else now
    failed_at = {k: max((a.time for a in fs.failures), default=0.0) for k, fs in states.items()
                 if getattr(fs, "failures", None)}
    models = {t.key for t in trials if not getattr(t, "is_evaluation", False)}
    best = _best_lines(rows, models)
    other = _other_lines(rows, trials)
    # the causes get what is left beside the rest and the fewest trials that matter (their heading, gap and
    # "more" line aside), at least one
    spare = lines - len(best) - len(other) - 2 - MIN_TRIALS
    causes = _cause_lines(rows, max(1, min(MAX_CAUSES, spare - 3)))
    room = lines - len(causes) - len(best) - len(other) - 2  # the heading of the trials that matter and its gap
    matter = _matter_lines(sweep, rows, max(MIN_TRIALS, room), failed_at, now)
    return causes + matter + best + other

