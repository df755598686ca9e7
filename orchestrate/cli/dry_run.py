"""The dry runs: ``orchestrate submit GRID --dry-run`` (:func:`submit_preview`), ``orchestrate resume SWEEP
--dry-run`` and ``orchestrate retry SWEEP --failed|--cancelled --dry-run`` (:func:`preview`): which trials the
command would (re)submit and why (new, lost, preempted, failed, cancelled), printed; nothing is submitted, created or
written, not even the sweep's lock file.

What they read: the sweep's files (``sweep.json``, ``trials.json``, its submission files and each trial folder) and
what the scheduler holds (one ``squeue`` for a cluster sweep; a local sweep's runner by its lock). ``submit`` only
looks the ledger up (:func:`orchestrate.ledger.probe.ledger_probe`); ``resume`` and ``retry`` do not read it, so
their preview works while MLflow does not answer: a trial with no word in its folder that a submission sent out
counts as lost (the real command asks the ledger, and re-attaches a job the scheduler still holds)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.sweep.trial import Trial

if TYPE_CHECKING:
    from orchestrate.dispatch.dispatch import Plan
    from orchestrate.plan.grid import Grid
    from orchestrate.plan.profile import Profile
    from orchestrate.sweep.trial_state import FolderState


def preview(args: argparse.Namespace, sweep: SweepDir, manifest: Manifest, retry: tuple[str, ...],
            only: "Callable[[Trial], bool] | None") -> int:
    """Print what ``resume`` (``retry`` empty) or ``retry --failed/--cancelled`` would do with ``sweep``, checking
    ``--set`` as the command checks it; exit status 0. ``only``: ``--where`` as a test of a trial (None: all)."""
    from asr_core.contract.trial import OUTCOME_PREEMPTED
    from orchestrate.cli.checks import check_data, execution_overrides
    from orchestrate.dispatch.dispatch import classify
    from orchestrate.plan.evaluations import plan_default
    from orchestrate.sweep.trial_state import failure_reason, read_folder_states
    from orchestrate.status.trial_status import scheduler_view

    trials = sweep.read_trials()
    changed = execution_overrides(trials, args.overrides)
    if changed is not trials and not args.no_check_data:
        check_data(changed, Path(manifest.workdir or Path.cwd()))
    trials = plan_default(sweep, changed)
    max_failures = args.max_failures or manifest.max_failures
    states = read_folder_states(sweep, [t.key for t in trials])
    view = scheduler_view(sweep, manifest)
    live = {**{k: fs.job_id or "lease" for k, fs in states.items() if fs.live}, **dict(view.held)}
    plan = classify(trials, {}, live, states, include_failed=True, retry=retry, max_failures=max_failures)
    submitted = {k for s in sweep.submissions() for k in s.keys}
    new = []
    for k in plan.new:  # no ledger read: a trial sent out before has a run, so it is not new
        fs = states.get(k)
        if k not in submitted and (fs is None or not fs.segments):
            new.append(k)
        elif fs is not None and fs.last_outcome == OUTCOME_PREEMPTED:
            plan.preempted.append(k)
        else:
            plan.lost.append(k)
            if fs is not None and fs.failures:
                plan.reasons[k] = failure_reason(fs, max_failures)
    plan.new = new
    if only is not None:  # --where: the others are classified and left as they are
        chosen = {t.key for t in trials if only(t)}
        for name in ("new", "lost", "preempted", "failed", "uncancelled", "reset"):
            setattr(plan, name, [k for k in getattr(plan, name) if k in chosen])
    what = args.command + "".join(f" --{w}" for w in retry)
    print(f"sweep {sweep.name}, {what} (dry run: nothing submitted or written): {len(trials)} trials: "
          f"{plan.summary()}")
    print(f"  read from the sweep's folders, not the ledger ({manifest.tracking_uri}); scheduler: "
          + (f"holds {len(view.held)} of its jobs" if not view.note else view.note.splitlines()[0] if view.known
             else f"{view.note.splitlines()[0]} (a job it still holds is re-attached by the real command, not "
                  "resubmitted)"))
    by_key = {t.key: t for t in trials}
    todo = plan.to_submit()
    print(f"would resubmit {len(todo)}:" if todo else "would resubmit nothing")
    for k in todo:
        print(f"  {by_key[k].label}  {k}  {_why(k, plan, states)}"
              + ("  (evaluation job)" if by_key[k].is_evaluation else ""))
    return 0


def _why(key: str, plan: "Plan", states: "dict[str, FolderState]") -> str:
    """Why ``key`` would go out again: new, lost (its job ended without a word, or vanished), preempted, failed (with
    the last failure's reason; ``failure count reset`` under ``retry --failed``) or cancelled."""
    reason = plan.reasons.get(key, "")
    if key in plan.uncancelled:
        return "cancelled: started again from its checkpoint"
    if key in plan.failed:
        reset = ", failure count reset" if key in plan.reset else ""
        return f"failed{reset}" + (f": {reason}" if reason else "")
    if key in plan.preempted:
        return "preempted: continues from its checkpoint"
    if key in plan.lost:
        fs = states.get(key)
        said = "its last job ended without a word" if fs is not None and fs.unrecorded_segment else "no job holds it"
        return f"lost: {said}" + (f" ({reason})" if reason else "")
    return "new: never started"


def submit_preview(args: argparse.Namespace, grid: "Grid", profile: "Profile", sweep: SweepDir) -> int:
    """``submit --dry-run``: what ``submit`` would do with ``grid`` (checked as ``submit`` checks it), printed;
    nothing is created, written or submitted: no sweep folder, lock file, run or job. The ledger is only looked up
    (:func:`orchestrate.ledger.probe.ledger_probe`), the scheduler only asked which jobs it holds."""
    from asr_core.contract.tracking import sqlite_file
    from orchestrate.cli.checks import UsageError, submit_input
    from orchestrate.dispatch.dispatch import DEFAULT_MAX_FAILURES, classify
    from orchestrate.plan.evaluations import plan_default
    from orchestrate.ledger.store import check_tracking_uri
    from orchestrate.ledger.probe import ledger_probe
    from orchestrate.sweep.trial_state import read_folder_states
    from orchestrate.status.trial_status import scheduler_view

    checked = submit_input(args, grid.trials, profile, sweep)
    old, uri, trials = checked.old, checked.uri, checked.trials
    if not uri.startswith("sqlite:"):  # (for sqlite it would create the folder of the database)
        check_tracking_uri(uri)
    probe = ledger_probe(uri, sweep.name)
    if probe.exists and probe.owner and (old is None or probe.owner != old.sweep_id):
        raise UsageError(f"experiment {sweep.name!r} in {uri} belongs to another sweep (the folder "
                         f"{probe.owner_root or 'it did not record'}); submit this one under another name with "
                         "`--sweep NAME`")
    max_failures = args.max_failures or (old.max_failures if old is not None else DEFAULT_MAX_FAILURES)
    live: dict[str, str] = {}
    states: dict[str, FolderState] = {}
    submitted: set[str] = set()
    if old is not None:
        trials = plan_default(sweep, trials)
        states = read_folder_states(sweep, [t.key for t in trials])
        view = scheduler_view(sweep, old)
        live = {**{k: fs.job_id or "lease" for k, fs in states.items() if fs.live}, **dict(view.held)}
        submitted = {k for s in sweep.submissions() for k in s.keys}
    plan = classify(trials, {}, live, states, include_failed=False, max_failures=max_failures)
    plan.lost += [k for k in plan.new if k in submitted]  # they have runs: submit would send them again
    plan.new = [k for k in plan.new if k not in submitted]
    print(f"sweep {sweep.name} (dry run: nothing created, written or submitted): {len(trials)} trials: "
          f"{plan.summary()}")
    print(f"  backend {args.backend}, profile {args.profile or '(default)'}, ledger {uri}"
          + ("" if probe.answered is not False else " (submit creates it)" if uri.startswith("sqlite:")
             and not (sqlite_file(uri) or Path()).exists() else f" (unreachable: {probe.error})"))
    print(f"  folder {sweep.path}" + (" (exists)" if old is not None else " (would be created)"))
    by_key = {t.key: t for t in trials}
    why = {k: w for w, keys in (("new", plan.new), ("lost", plan.lost), ("preempted", plan.preempted),
                                ("failed", plan.failed)) for k in keys}
    todo = plan.to_submit()
    print(f"would submit {len(todo)}:")
    for k in todo:
        t = by_key[k]
        print(f"  {t.label}  {k}  {why.get(k, '')}" + ("  (evaluation job)" if t.is_evaluation else ""))
    return 0
