"""``orchestrate status``: where every trial of a sweep stands, from its trial folders, in well under a second.

The trial folders hold the truth (:mod:`orchestrate.trial_state`); the scheduler says which trials it still holds
(one plain ``squeue`` for the sweep's job names, skipped for the local backend); MLflow is a mirror that may lag, so
``status`` works the same while it is down and imports no mlflow unless it reconciles. States:

===========  ========================================================================================================
FINISHED     ``DONE`` exists
RUNNING      a live lease: a trainer heartbeats in the folder now
QUEUED       the scheduler holds a job for it (pending, or starting and not yet heartbeating)
PREEMPTED    its last segment checkpointed after a preemption notice; the requeue is pending or ``resume`` continues it
FAILED       its last outcome was a failure (its own error, killed by the system, lost) and no job holds it; "gave up"
             once the failures since the last ``retry --failed`` reach the sweep's ``max_failures``
KILLED       cancelled (``CANCELLED``): final until ``retry --cancelled``
LOST         unfinished, not live, not held: never started, or its last segment ended without a word (status shows
             how the scheduler's accounting saw that job end, one ``sacct``; ``resume`` records it and resubmits
             within the budget)
===========  ========================================================================================================

Then every failed, killed and lost trial with its reason and failure count, the running ones with their progress,
the code versions, the trials whose outbox keeps records MLflow refused for good (``kept``, with the command that
sends them again), and a ledger line: how many trials hold outbox records not yet in MLflow. When the folders say
the ledger is behind and MLflow answers, ``status`` reconciles it (:func:`orchestrate.reconcile.reconcile_ledger`,
under the sweep's lock, within ``--reconcile-deadline`` seconds) and says so; a lookup of the sweep's experiment
(sqlite3 or one HTTP request, no mlflow import) first tells whether MLflow answers and whether this folder owns it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from asr_core.contract.trial import FAILED, KILLED, RUNNING
from asr_core.runtime.outbox_folder import REJECTED_FILE, read_kept
from orchestrate.mlflow_rest import LedgerError
from orchestrate.status_ledger import ledger_line
from orchestrate.sweep import Manifest, SweepDir, SweepError
from orchestrate.trial_state import DEFAULT_MAX_FAILURES, read_folder_states, read_trial_refs
from orchestrate.trial_status import LOST, STATUS_STATES, TrialStatus, scheduler_view, trial_statuses

__all__ = ["add_arguments", "main", "show_status"]

DEFAULT_RECONCILE_S = 30.0  # how long `status` may spend bringing a lagging ledger in line


# ---- the command -------------------------------------------------------------------------------------------------
def _print_table(rows: list[TrialStatus], fmt: Any) -> None:
    lw = max(len(r.label) for r in rows)
    for r in sorted(rows, key=lambda r: r.label):
        print(fmt(r, lw))


def show_status(args: argparse.Namespace, sweep: SweepDir, manifest: Manifest,
                trials: Sequence[Any] | None = None) -> int:
    """Print the sweep's status (see the module docstring); ``--json``: one JSON object per trial.

    ``trials``: the sweep's trials (anything with ``key`` and ``label``), or None to read their keys and labels
    from ``trials.json`` (cheaper than building every config). ``args``: ``json``, and optionally
    ``no_reconcile`` and ``reconcile_deadline`` (seconds)."""
    trials = list(trials) if trials is not None else read_trial_refs(sweep)
    max_failures = int(getattr(manifest, "max_failures", DEFAULT_MAX_FAILURES) or DEFAULT_MAX_FAILURES)
    states = read_folder_states(sweep, [t.key for t in trials])
    view = scheduler_view(sweep, manifest)
    rows = trial_statuses(sweep, manifest, trials, states, view)
    deadline_s = float(getattr(args, "reconcile_deadline", None) or DEFAULT_RECONCILE_S)
    reconcile = not getattr(args, "no_reconcile", False)
    if getattr(args, "json", False):
        for r in rows:
            print(json.dumps(asdict(r)))
        line = ledger_line(sweep, manifest, trials, states, view, reconcile=reconcile, deadline_s=deadline_s,
                           max_failures=max_failures)
        print(line, file=sys.stderr)
        return 0
    counts = {s: 0 for s in STATUS_STATES}
    for r in rows:
        counts[r.status] += 1
    is_eval = {t.key for t in trials if getattr(t, "is_evaluation", False)}
    n_eval = len(is_eval)
    print(f"sweep {sweep.name} ({manifest.backend}, {len(trials) - n_eval} models"
          + (f" and {n_eval} evaluation jobs" if n_eval else "") + f", ledger {manifest.tracking_uri})")
    if len(manifest.code) > 1:
        print(f"  submitted and resumed from code {', '.join(manifest.code)}")
    gave_up = sum(r.gave_up for r in rows)
    for state in STATUS_STATES:
        if counts[state]:
            extra = f"  ({gave_up} gave up after {max_failures} failures)" if state == FAILED and gave_up else ""
            print(f"  {state:<9}  {counts[state]:>5}{extra}")
    if view.note:
        print(f"  scheduler: {view.note}")
    bad = [r for r in rows if r.status in (FAILED, KILLED, LOST)]
    if bad:
        print(f"\n{len(bad)} failed, killed or lost:")
        _print_table(bad, lambda r, lw: f"  {r.label:<{lw}}  {r.key}  {r.status:<6}  job {r.job_id or '-':<10}  "
                                        f"{r.reason}")
    running = [r for r in rows if r.status == RUNNING]
    if running:
        print(f"\n{len(running)} running:")
        _print_table(running, lambda r, lw: f"  {r.label:<{lw}}  {r.key}  {r.phase or 'starting':<16}  "
                                            f"{r.lease or 'job ' + (r.job_id or '-')}")
    mixed = [r for r in rows if len(r.code) > 1]
    if mixed:
        print(f"\n{len(mixed)} trials ran different code in their segments (start and resumes):")
        _print_table(mixed, lambda r, lw: f"  {r.label:<{lw}}  {r.key}  {r.segments} segments  code "
                                          f"{' -> '.join(r.code)}")
    if n_eval:
        _print_evaluations(trials, rows)
    _print_kept(sweep, rows)
    print()
    print(ledger_line(sweep, manifest, trials, states, view, reconcile=reconcile, deadline_s=deadline_s,
                      max_failures=max_failures))
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags :func:`show_status` reads beyond the common ones (``--json``)."""
    p.add_argument("--no-reconcile", action="store_true",
                   help="never write to the ledger, even when the trial folders say it is behind")
    p.add_argument("--reconcile-deadline", type=float, default=DEFAULT_RECONCILE_S, metavar="S",
                   help=f"seconds status may spend bringing a lagging ledger in line (default {DEFAULT_RECONCILE_S:g})")


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrate.status SWEEP [--sweep-root R] [--json] ...``: the same output as ``orchestrate
    status``, for timing it and for scripts."""

    p = argparse.ArgumentParser(prog="python -m orchestrate.status", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep")
    p.add_argument("--sweep-root", default="runs")
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--json", action="store_true", help="one JSON object per trial")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        sweep = SweepDir(args.sweep_root, args.sweep)
        manifest = sweep.read_manifest()
        if args.tracking_uri and args.tracking_uri != manifest.tracking_uri:
            raise SweepError(f"--tracking-uri {args.tracking_uri} is not the sweep's ledger "
                             f"({manifest.tracking_uri}, in {sweep.manifest_path}); drop it")
        return show_status(args, sweep, manifest, None)
    except (SweepError, LedgerError) as e:
        print(f"orchestrate status: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

