"""``orchestrate resume SWEEP --dry-run`` and ``orchestrate retry SWEEP --failed|--cancelled --dry-run``: which
trials the command would (re)submit and why (new, lost, preempted, failed, cancelled), printed; nothing is
submitted, created or written, not even the sweep's lock file.

What it reads: the sweep's files (``sweep.json``, ``trials.json``, its submission files and each trial folder) and
what the scheduler holds (one ``squeue`` for a cluster sweep; a local sweep's runner by its lock). The ledger is not
read, so the preview works while MLflow does not answer: a trial with no word in its folder that a submission sent
out counts as lost (the real command asks the ledger, and re-attaches a job the scheduler still holds)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.sweep.trial import Trial

if TYPE_CHECKING:
    from orchestrate.dispatch import Plan
    from orchestrate.sweep.trial_state import FolderState


def preview(args: argparse.Namespace, sweep: SweepDir, manifest: Manifest, retry: tuple[str, ...],
            only: "Callable[[Trial], bool] | None") -> int:
    """Print what ``resume`` (``retry`` empty) or ``retry --failed/--cancelled`` would do with ``sweep``, checking
    ``--set`` as the command checks it; exit status 0. ``only``: ``--where`` as a test of a trial (None: all)."""
    from asr_core.contract.trial import OUTCOME_PREEMPTED
    from orchestrate.commands import check_data, execution_overrides
    from orchestrate.dispatch import classify
    from orchestrate.plan.evaluations import plan_default
    from orchestrate.sweep.trial_state import failure_reason, read_folder_states
    from orchestrate.trial_status import scheduler_view

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
