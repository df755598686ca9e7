"""``orchestrate status``: where every trial of a sweep stands, from its trial folders, in well under a second.

The trial folders hold the truth (:mod:`orchestrate.sweep.trial_state`); the scheduler says which trials it still holds
(one plain ``squeue`` for the sweep's job names, skipped for the local backend); MLflow is a mirror that may lag, so
``status`` works the same while it is down and imports no mlflow unless it reconciles. States:

===========  ========================================================================================================
FINISHED     ``DONE`` exists
RUNNING      a live lease: a trainer heartbeats in the folder now
PENDING      queued and not yet (re)started: the scheduler lists its job as pending, or a local sweep's runner
             holds it and has not started it yet
QUEUED       the scheduler holds a job for it that is not pending (starting, and not yet heartbeating)
PREEMPTED    its last segment checkpointed after a preemption notice; the requeue is pending or ``resume`` continues it
FAILED       its last outcome was a failure (its own error, killed by the system, lost) and no job holds it; "gave up"
             once the failures since the last ``retry --failed`` reach the sweep's ``max_failures``
KILLED       cancelled (``CANCELLED``): final until ``retry --cancelled``
LOST         unfinished, not live, not held: never started, or its last segment ended without a word (status shows
             how the scheduler's accounting saw that job end, one ``sacct``; ``resume`` records it and resubmits
             within the budget)
===========  ========================================================================================================

Then the share of the work done (finished trials whole, the others by their training steps or evaluation units) and the
GPU-hours the trials' segments ran, every failed, killed and lost trial with its reason and failure count, the running
ones with their progress, rate (steps/s over the last minutes) and time left, each with its log, the code versions, the
trials whose outbox keeps records MLflow refused for good (``kept``, with the command that sends them again), and a
ledger line: how many trials hold outbox records not yet in MLflow. When the folders say the ledger is behind and MLflow
answers, ``status`` reconciles it (:func:`orchestrate.ledger.reconcile.reconcile_ledger`, under the sweep's lock, within
``--reconcile-deadline`` seconds) and says so; a lookup of the sweep's experiment (sqlite3 or one HTTP request, no
mlflow import) first tells whether MLflow answers and whether this folder owns it.

``--where KEY=VALUE`` (:mod:`orchestrate.sweep.where`) counts and lists only the matching trials; ``--state S`` lists
every trial in state S (repeatable) with its folder and log; ``--watch [SECONDS]`` redraws every SECONDS (30) until
no trial runs or waits in the queue, or Ctrl-C. The GPU-hours spent are set against the estimate a cluster
``submit`` recorded in the sweep folder (:mod:`orchestrate.budget.recorded`); a local sweep has none. The time left
comes from the running trials' measured rates and, for the trials still to run, that estimate (else the mean hours
of the finished trials): :func:`orchestrate.status.monitor.work_left`.

One screen: a sweep whose rows do not fit 45 lines (``--watch``: the terminal's height) is condensed
(:mod:`orchestrate.status.screen`): the failed, killed and lost trials grouped by cause with one example each, the
trials that matter now (running ones, slowest first, and the newest failures) with their latest loss, and the best
configuration so far (the lowest WER among finished trials); ``--all`` lists every row instead.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from asr_core.contract.trial import FAILED, KILLED, LOG_FILE, RUNNING
from asr_core.contract.folder.outbox_files import REJECTED_FILE, read_kept
from orchestrate.budget.recorded import estimated_hours, read_estimate
from orchestrate.status.monitor import fit_lines, work_left
from orchestrate.sweep.progress import duration_text
from orchestrate.status.ledger_line import ledger_line
from orchestrate.status.screen import SCREEN_LINES, compact_sections, time_left_line
from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.sweep.trial_state import DEFAULT_MAX_FAILURES, read_folder_states, read_trial_refs
from orchestrate.status.trial_status import (LOST, PENDING, PREEMPTED, QUEUED, STATUS_STATES, TrialStatus,
                                             scheduler_view, trial_statuses)
from orchestrate.sweep.where import WhereError

__all__ = ["add_arguments", "show_status", "watch_status"]

DEFAULT_RECONCILE_S = 30.0  # how long `status` may spend bringing a lagging ledger in line
MIN_SCREEN_LINES = 20  # the fewest lines the condensed view is fitted to, however short the terminal
DEFAULT_WATCH_S = 30.0  # --watch without a number: a redraw every 30 s (a trainer logs progress every few seconds)


# ---- the command -------------------------------------------------------------------------------------------------
def _print_table(rows: list[TrialStatus], fmt: Any) -> None:
    lw = max(len(r.label) for r in rows)
    for r in sorted(rows, key=lambda r: r.label):
        print(fmt(r, lw))


def _selected(sweep: SweepDir, trials: list[Any], where: list[str]) -> list[Any]:
    """The trials ``--where`` selects (their configs read from ``trials.json`` only then); raises
    :class:`~orchestrate.sweep.where.WhereError` when none matches."""
    if not where:
        return trials
    from orchestrate.sweep.where import matches, parse_where

    w = parse_where(where)
    keep = {t.key for t in sweep.read_trials() if matches(t, w)}
    if not keep:
        raise WhereError(f"--where {' '.join(where)} matches none of the {len(trials)} trials of sweep "
                         f"{sweep.name!r}; `orchestrate plan` or `status --json` shows their configs and keys")
    return [t for t in trials if t.key in keep]


def _pace(r: TrialStatus) -> str:
    """``2.41 steps/s, 4 h 43 min left`` for a running trial whose records give a rate, else ""."""
    if not r.rate:
        return ""
    unit = "steps/s" if (r.phase or "").startswith("train") else "units/s"
    left = f", {duration_text(r.eta_s)} left" if r.eta_s is not None else ""
    return f"{r.rate:.3g} {unit}{left}"


def _overall(rows: list[TrialStatus], estimate: float | None, backend: str = "slurm", short: bool = False) -> str:
    """The share of the work done and the GPU-hours spent (against the recorded ``estimate``), in one line; a local
    sweep's hours are its trials' hours on this machine, whatever device they used, not GPU-hours. ``short``: in
    fewer words, with how many trials evaluate now (the condensed view, whose lines fit a terminal's width)."""
    done = sum(r.progress or 0.0 for r in rows) / len(rows) if rows else 0.0
    hours = sum(r.gpu_hours for r in rows)
    if short:
        evaluating = sum(r.status == RUNNING and (r.phase or "").startswith("eval") for r in rows)
        spent = (f"{hours:.1f} trial-hours spent on this machine" if backend == "local" else
                 f"{hours:.1f} GPU-hours spent" + (f" of {estimate:.1f} estimated ({100 * hours / estimate:.0f}%)"
                                                   if estimate else " (no estimate recorded)"))
        return (f"  progress {100 * done:.1f}% (finished whole, others by training steps or evaluation units; "
                f"{evaluating} evaluating now); {spent}")
    progress = (f"  progress {100 * done:.1f}% (finished trials whole, the others by their training steps or "
                "evaluation units); ")
    if backend == "local":
        return progress + f"{hours:.1f} trial-hours spent on this machine (local backend: one core or GPU each)"
    against = (f" of {estimate:.1f} estimated ({100 * hours / estimate:.0f}%; the estimate submit recorded)"
               if estimate else " (no estimate recorded: a cluster submit records one; `orchestrate plan GRID "
               "--estimate` gives it)")
    return progress + f"{hours:.1f} GPU-hours spent{against} (one GPU per trial)"


def show_status(args: argparse.Namespace, sweep: SweepDir, manifest: Manifest,
                trials: Sequence[Any] | None = None) -> int:
    """Print the sweep's status (see the module docstring); ``--json``: one JSON object per trial; ``--watch``:
    again every few seconds (:func:`watch_status`).

    ``trials``: the sweep's trials (anything with ``key`` and ``label``), or None to read their keys and labels
    from ``trials.json`` (cheaper than building every config). ``args``: ``json``, and optionally
    ``no_reconcile``, ``reconcile_deadline`` (seconds), ``where``, ``state`` and ``watch``."""
    if getattr(args, "watch", None) is not None:
        return watch_status(args, sweep, manifest, trials)
    screen = None
    if sys.stdout.isatty():  # a smaller terminal than SCREEN_LINES rows: fit it, the prompt and the command too
        size = shutil.get_terminal_size()
        screen = (min(SCREEN_LINES, max(MIN_SCREEN_LINES, size.lines - 5)), size.columns)
    _show_once(args, sweep, manifest, trials, screen=screen)
    return 0


def _capture(draw: Any) -> list[str]:
    """The lines ``draw()`` prints."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        draw()
    return buf.getvalue().splitlines()


def _show_once(args: argparse.Namespace, sweep: SweepDir, manifest: Manifest,
               trials: Sequence[Any] | None = None, screen: tuple[int, int | None] | None = None) -> list[TrialStatus]:
    """Print the status once; returns the rows of the selected trials. Unless ``--all`` or ``--state``, a sweep
    whose rows do not fit ``screen`` (lines, and the width its lines are clipped to; default
    :data:`~orchestrate.status.screen.SCREEN_LINES` lines, not clipped) is condensed
    (:func:`~orchestrate.status.screen.compact_sections`)."""
    trials = list(trials) if trials is not None else read_trial_refs(sweep)
    trials = _selected(sweep, trials, list(getattr(args, "where", None) or []))
    wanted = set(getattr(args, "state", None) or [])
    max_failures = int(getattr(manifest, "max_failures", DEFAULT_MAX_FAILURES) or DEFAULT_MAX_FAILURES)
    states = read_folder_states(sweep, [t.key for t in trials])
    view = scheduler_view(sweep, manifest)
    rows = trial_statuses(sweep, manifest, trials, states, view)
    deadline_s = float(getattr(args, "reconcile_deadline", None) or DEFAULT_RECONCILE_S)
    reconcile = not getattr(args, "no_reconcile", False)
    if getattr(args, "json", False):
        for r in rows:
            if not wanted or r.status in wanted:
                print(json.dumps(asdict(r)))
        line = ledger_line(sweep, manifest, trials, states, view, reconcile=reconcile, deadline_s=deadline_s,
                           max_failures=max_failures)
        print(line, file=sys.stderr)
        return rows
    n_eval = sum(bool(getattr(t, "is_evaluation", False)) for t in trials)
    lines, width = screen or (SCREEN_LINES, None)
    if wanted:
        body = _capture(lambda: _print_states(rows, wanted))
    else:
        body = _capture(lambda: (_print_sections(rows), n_eval and _print_evaluations(trials, rows)))
    body += _capture(lambda: _print_kept(sweep, rows))
    head = _capture(lambda: _print_head(args, sweep, manifest, trials, rows, view.note, max_failures, short=False))
    compact = not wanted and not getattr(args, "all", False) and len(head) + len(body) + 2 > lines
    if compact:
        head = _capture(lambda: _print_head(args, sweep, manifest, trials, rows, view.note, max_failures,
                                            short=True))
        body = compact_sections(sweep, rows, trials, states, lines - len(head) - 2)
    out = head + body
    print("\n".join(fit_lines(out, len(out), width) if compact and width else out))
    print()
    print(ledger_line(sweep, manifest, trials, states, view, reconcile=reconcile, deadline_s=deadline_s,
                      max_failures=max_failures))
    return rows


def _print_head(args: argparse.Namespace, sweep: SweepDir, manifest: Manifest, trials: Sequence[Any],
                rows: list[TrialStatus], note: str, max_failures: int, short: bool) -> None:
    """The lines every view opens with: the sweep, its folders, its code, the counts by state, the progress and
    hours spent, the time left, the scheduler's note (``short``: its first line, and the hours in fewer words)."""
    counts = {s: 0 for s in STATUS_STATES}
    for r in rows:
        counts[r.status] += 1
    n_eval = sum(bool(getattr(t, "is_evaluation", False)) for t in trials)
    print(f"sweep {sweep.name} ({manifest.backend}, {len(trials) - n_eval} models"
          + (f" and {n_eval} evaluation jobs" if n_eval else "") + f", ledger {manifest.tracking_uri})"
          + (f", where {' '.join(args.where)}" if getattr(args, "where", None) else ""))
    print(f"  folders {sweep.path / 'trials'}/KEY, each with its log {LOG_FILE} (--state STATE lists them"
          + ("; --all every trial)" if short else ")"))
    if len(manifest.code) > 1:
        print(f"  submitted and resumed from code {', '.join(manifest.code)}")
    gave_up = sum(r.gave_up for r in rows)
    for state in STATUS_STATES:
        if counts[state]:
            extra = f"  ({gave_up} gave up after {max_failures} failures)" if state == FAILED and gave_up else ""
            print(f"  {state:<9}  {counts[state]:>5}{extra}")
    keys = [r.key for r in rows]
    print(_overall(rows, estimated_hours(sweep.path, keys), manifest.backend, short=short))
    recorded = read_estimate(sweep.path)
    print(time_left_line(work_left(rows, {k: recorded[k] for k in keys if k in recorded}),
                         manifest.backend))
    if note:
        print(f"  scheduler: {note.splitlines()[0] if short else note}")


def _print_states(rows: list[TrialStatus], wanted: set[str]) -> None:
    """``--state``: every trial in those states, one line each and its log below."""
    for state in (s for s in STATUS_STATES if s in wanted):
        some = [r for r in rows if r.status == state]
        print(f"\n{len(some)} {state.lower()}" + (":" if some else ""))
        if some:
            _print_table(some, lambda r, lw: f"  {r.label:<{lw}}  {r.key}  {r.phase or '-':<16}  "
                                             + (_pace(r) + "  " if r.status == RUNNING and _pace(r) else "")
                                             + (r.reason or r.lease) + f"\n    log {r.log}")


def _print_sections(rows: list[TrialStatus]) -> None:
    """Without ``--state``: the failed, killed and lost trials, the running ones, those whose segments ran
    different code."""
    bad = [r for r in rows if r.status in (FAILED, KILLED, LOST)]
    if bad:
        print(f"\n{len(bad)} failed, killed or lost:")
        _print_table(bad, lambda r, lw: f"  {r.label:<{lw}}  {r.key}  {r.status:<6}  job {r.job_id or '-':<10}  "
                                        f"{r.reason}")
    running = [r for r in rows if r.status == RUNNING]
    if running:
        print(f"\n{len(running)} running:")
        _print_table(running, lambda r, lw: f"  {r.label:<{lw}}  {r.key}  {r.phase or 'starting':<16}  "
                                            + (f"{_pace(r)}  " if _pace(r) else "")
                                            + f"{r.lease or 'job ' + (r.job_id or '-')}")
    mixed = [r for r in rows if len(r.code) > 1]
    if mixed:
        print(f"\n{len(mixed)} trials ran different code in their segments (start and resumes):")
        _print_table(mixed, lambda r, lw: f"  {r.label:<{lw}}  {r.key}  {r.segments} segments  code "
                                          f"{' -> '.join(r.code)}")


def _moving(rows: list[TrialStatus]) -> bool:
    """Whether something may still change without a command: a trial runs, waits in the queue, or waits for the
    requeue of its preempted job."""
    return any(r.status in (RUNNING, PENDING, QUEUED) or (r.status == PREEMPTED and r.held) for r in rows)


def watch_status(args: argparse.Namespace, sweep: SweepDir, manifest: Manifest,
                 trials: Sequence[Any] | None = None) -> int:
    """``--watch [SECONDS]``: the status redrawn every SECONDS until no trial runs or waits in the queue (then a line
    says so), or Ctrl-C; exit 0 either way. On a terminal the screen is cleared and each frame drawn within its
    height and width (read again at each redraw, :func:`shutil.get_terminal_size`): a sweep too large to list whole
    is condensed to fit, and what still does not fit ends in a line ``… N more lines (--all)``."""
    every = float(args.watch)
    clear = sys.stdout.isatty() and not getattr(args, "json", False)
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C ends the watch even where the process was started ignoring SIGINT (a background job of a script
        # inherits that, and Python then leaves it ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            size = shutil.get_terminal_size() if clear else None
            # the frame: a stamp line above the status, and the cursor's row below it
            screen = (max(10, size.lines - 2), size.columns) if size else None
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rows = _show_once(args, sweep, manifest, trials, screen=screen)
            stamp = time.strftime("%H:%M:%S")
            frame = ([f"{stamp}  every {every:g} s, Ctrl-C ends  (orchestrate status {sweep.name} --watch)"]
                     if not getattr(args, "json", False) else []) + buf.getvalue().splitlines()
            if size is not None:
                more = ("(a taller terminal, or status --all without --watch)" if getattr(args, "all", False)
                        else "(--all)")
                frame = fit_lines(frame, max(2, size.lines - 1), size.columns, more)
                sys.stdout.write("\x1b[H\x1b[2J")
            sys.stdout.write("\n".join(frame) + "\n")
            if not _moving(rows):
                print(f"{stamp}  no trial runs or waits in the queue: watch ends", file=sys.stderr)
                return 0
            sys.stdout.flush()
            time.sleep(every)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 0


def _print_kept(sweep: SweepDir, rows: list[TrialStatus]) -> None:
    """The trials whose outbox keeps records MLflow refused for good, the last refusal, and the command that sends
    them again once the cause is fixed."""
    held = [r for r in rows if r.kept]
    if not held:
        return
    print(f"\n{len(held)} trials keep records MLflow refused (outbox/{REJECTED_FILE}); fix the cause, then send them "
          "again:")
    for r in sorted(held, key=lambda r: r.label):
        trial_dir = sweep.trial_dir(r.key)
        last = read_kept(trial_dir)[-1:]
        why = " ".join(str(last[0].get("error", "")).split())[:160] if last else ""
        print(f"  {r.label}  {r.key}  {r.kept} record{'s' if r.kept != 1 else ''} kept: {why}")
        print(f"    python -m asr_core ship {trial_dir}")


def _print_evaluations(trials: Sequence[Any], rows: list[TrialStatus]) -> None:
    """Per model that has evaluation jobs: its own state (training and its default evaluation), then each
    evaluation job's name, state and what it decodes."""
    by_key = {r.key: r for r in rows}
    models = {t.key: t for t in trials if not getattr(t, "is_evaluation", False)}
    jobs: dict[str, list[Any]] = {}
    for t in trials:
        if getattr(t, "is_evaluation", False):
            jobs.setdefault(t.model, []).append(t)
    counts: dict[str, int] = {}
    for js in jobs.values():
        for j in js:
            counts[by_key[j.key].status] = counts.get(by_key[j.key].status, 0) + 1
    print("\nevaluation jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    for model, js in sorted(jobs.items(), key=lambda kv: models[kv[0]].label if kv[0] in models else kv[0]):
        m = by_key.get(model)
        print(f"  {models[model].label if model in models else model}  {model}  "
              f"{m.status if m is not None else '?'}" + (f" ({m.phase})" if m is not None and m.phase and
                                                         m.status == RUNNING else ""))
        for j in js:
            r = by_key[j.key]
            phase = f", {r.phase}" if r.status == RUNNING and r.phase else ""
            why = f": {r.reason}" if r.status in (FAILED, KILLED, LOST) and r.reason else ""
            print(f"    {j.evaluation:<12} {r.status:<9} {j.conditions}  ({j.label}{phase}){why}")


def _state(text: str) -> str:
    state = text.strip().upper()
    if state not in STATUS_STATES:
        raise argparse.ArgumentTypeError(f"invalid state {text!r}; valid: {', '.join(STATUS_STATES)}")
    return state


def _seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = -1.0
    if not s > 0:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}; valid: seconds, a number above 0")
    return s


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags :func:`show_status` reads beyond the common ones (``--json``)."""
    p.add_argument("--state", type=_state, action="append", default=[], metavar="STATE",
                   help="list every trial in this state with its folder and log (repeatable; "
                        f"{', '.join(STATUS_STATES)})")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="only the trials that match: a config field (data.context_s=10.24), subgrid=NAME, key=KEY or "
                        "evaluation=NAME; repeat a key for alternatives, other keys must all hold")
    p.add_argument("--watch", type=_seconds, nargs="?", const=DEFAULT_WATCH_S, default=None, metavar="SECONDS",
                   help=f"redraw every SECONDS (default {DEFAULT_WATCH_S:g}) until no trial runs or waits in the "
                        "queue, or Ctrl-C")
    p.add_argument("--all", action="store_true",
                   help="every trial's row (failed, killed, lost, running, mixed code, evaluation jobs), however "
                        f"many; without it a sweep whose rows do not fit {SCREEN_LINES} lines (--watch: the "
                        "terminal) is condensed: failures by cause, the trials that matter now, the best so far")
    p.add_argument("--no-reconcile", action="store_true",
                   help="never write to the ledger, even when the trial folders say it is behind")
    p.add_argument("--reconcile-deadline", type=float, default=DEFAULT_RECONCILE_S, metavar="S",
                   help=f"seconds status may spend bringing a lagging ledger in line (default {DEFAULT_RECONCILE_S:g})")
