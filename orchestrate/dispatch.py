"""Submit, resume, retry and cancel a sweep: the backend-neutral decisions.

Every operation takes the sweep lock, reads the ledger once, asks the backend which trials it still holds, and
classifies each trial:

* FINISHED in the ledger → skipped;
* held by the scheduler (pending/running/requeued) → re-attached (its job id tagged if the ledger lacked it, e.g. the
  submitting process died right after ``sbatch``);
* no run yet → run created (SCHEDULED), then submitted;
* SCHEDULED/RUNNING but not held by the scheduler (job lost: cancelled, node failure, crash) → submitted again;
  it resumes from its checkpoint in the same run;
* FAILED/KILLED → submitted again by ``resume`` and ``retry --failed``; left alone by ``submit``'s second call only
  if ``include_failed`` is False.

Runs are created before anything is submitted and job ids are tagged after, so a crash at any point leaves a state
that this same function repairs.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from asr_core.trial_contract import FAILED, FINISHED, KILLED, RUNNING, SCHEDULED, TAG_BACKEND, TAG_ERROR, TAG_JOB_ID
from orchestrate.backends import make_backend
from orchestrate.backends.base import Backend, Job
from orchestrate.backends.profile import Profile
from orchestrate.ledger import Ledger, TrialRun
from orchestrate.sweep import Manifest, SweepDir, new_sweep_id
from orchestrate.trial import Trial


@dataclass
class Plan:
    """What reconciliation decided, by trial key."""

    finished: list[str] = field(default_factory=list)
    attached: dict[str, str] = field(default_factory=dict)  # key -> live job id
    new: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # FAILED/KILLED and to be resubmitted
    left_failed: list[str] = field(default_factory=list)  # FAILED/KILLED, left alone

    def to_submit(self) -> list[str]:
        return self.new + self.lost + self.failed

    def summary(self) -> str:
        return (f"{len(self.finished)} finished (skipped), {len(self.attached)} live (re-attached), "
                f"{len(self.new)} new, {len(self.lost)} lost (resubmitted), {len(self.failed)} failed/killed "
                f"(resubmitted), {len(self.left_failed)} failed (left; retry --failed)")


def _fault(point: str) -> None:
    """Fault injection for the recovery tests: ``ORCHESTRATE_FAULT=<point>`` kills this process right there, the
    way a node reboot or an OOM kill would (no cleanup, no exception handlers)."""
    if os.environ.get("ORCHESTRATE_FAULT") == point:
        log(f"fault injected at {point}: exiting now")
        os._exit(137)


def log(msg: str) -> None:
    print(f"[orchestrate] {msg}", file=sys.stderr, flush=True)


def classify(trials: list[Trial], runs: dict[str, TrialRun], live: dict[str, str], *, include_failed: bool,
             only_failed: bool = False) -> Plan:
    plan = Plan()
    for t in trials:
        r = runs.get(t.key)
        if r is not None and r.status == FINISHED:
            plan.finished.append(t.key)
        elif t.key in live:
            plan.attached[t.key] = live[t.key]
        elif r is not None and r.status in (FAILED, KILLED):
            (plan.failed if include_failed else plan.left_failed).append(t.key)
        elif only_failed:
            continue
        elif r is None:
            plan.new.append(t.key)
        else:
            plan.lost.append(t.key)
    return plan


def run_sweep(sweep: SweepDir, manifest: Manifest, trials: list[Trial], profile: Profile, *,
              include_failed: bool = True, only_failed: bool = False, what: str = "submit",
              backend: Backend | None = None, write: bool = False, adopt: bool = False) -> Plan:
    """Reconcile ledger, scheduler and sweep, then submit what needs to run. Holds the sweep lock throughout.

    ``write``: record ``manifest`` and ``trials`` in the sweep folder first, under the lock and after the ledger
    confirmed that this folder owns the sweep's experiment (a refused or busy call changes nothing). ``adopt``: the
    folder existed before this command, so it may claim an experiment made before sweeps had ids."""
    backend = backend or make_backend(manifest.backend, sweep, manifest.tracking_uri, profile)
    backend.validate()
    ledger = Ledger(manifest.tracking_uri, manifest.name)
    with sweep.lock(what):
        t0 = time.perf_counter()
        parent = ledger.ensure_sweep(manifest.grid, manifest.backend, manifest.sweep_id, str(sweep.path),
                                     adopt=adopt)
        if write:
            sweep.write_manifest(manifest)
            sweep.write_trials(trials)
        runs = ledger.trial_runs()
        live = backend.live_jobs()
        plan = classify(trials, runs, live, include_failed=include_failed, only_failed=only_failed)
        log(f"sweep {sweep.name}: {len(trials)} trials: {plan.summary()}")
        # Re-attach: tag job ids the ledger lacks (a submitter that died after sbatch, before tagging).
        fix = {runs[k].run_id: {TAG_JOB_ID: j, TAG_BACKEND: manifest.backend}
               for k, j in plan.attached.items() if k in runs and runs[k].job_id != j}
        if fix:
            ledger.tag_runs(fix)
            log(f"tagged {len(fix)} re-attached runs with their job ids")
        by_key = {t.key: t for t in trials}
        for k in plan.attached:  # live jobs read config.json when they are requeued: give them today's settings
            sweep.prepare_trial(by_key[k])
        todo_keys = plan.to_submit()
        if not todo_keys:
            if len(plan.finished) == len(trials):
                ledger.finish_parent()
            return plan
        todo = [by_key[k] for k in todo_keys]
        run_ids = ledger.create_trial_runs(parent, [by_key[k] for k in plan.new], manifest.backend)
        requeue = [runs[k].run_id for k in plan.lost + plan.failed if runs[k].status != SCHEDULED]
        if requeue:  # FAILED/KILLED/stale RUNNING go back to SCHEDULED; the error tag is cleared
            ledger.set_status(requeue, SCHEDULED, tags={TAG_ERROR: ""})
        log(f"ledger ready in {time.perf_counter() - t0:.2f}s ({len(plan.new)} runs created)")
        jobs = [Job(trial=t, run_id=run_ids[t.key], trial_dir=sweep.prepare_trial(t)) for t in todo]
        _fault("after-runs")

        def on_submitted(job_ids: dict[str, str]) -> None:
            _fault("after-submit")
            ledger.tag_runs({run_ids[k]: {TAG_JOB_ID: j, TAG_BACKEND: manifest.backend}
                             for k, j in job_ids.items()})

        backend.submit(jobs, on_submitted)
        if backend.blocking:
            final = ledger.trial_runs()
            if all(final.get(t.key) is not None and final[t.key].status == FINISHED for t in trials):
                ledger.finish_parent()
    return plan


def cancel_sweep(sweep: SweepDir, manifest: Manifest, profile: Profile) -> list[str]:
    """Cancel every live job of the sweep and mark unfinished runs KILLED; ``resume`` starts them again."""
    backend = make_backend(manifest.backend, sweep, manifest.tracking_uri, profile)
    ledger = Ledger(manifest.tracking_uri, manifest.name)
    with sweep.lock("cancel"):
        ledger.check_owner(manifest.sweep_id, str(sweep.path), adopt=True)
        live = backend.live_jobs()
        job_ids = sorted(set(live.values()))
        if job_ids:
            backend.cancel(job_ids)
        runs = ledger.trial_runs()
        unfinished = [r.run_id for r in runs.values() if r.status in (SCHEDULED, RUNNING)]
        ledger.set_status(unfinished, KILLED)
        log(f"cancelled {len(job_ids)} jobs; {len(unfinished)} runs marked KILLED")
        return job_ids


def new_manifest(name: str, grid: Path, backend: str, profile: str, tracking_uri: str,
                 overrides: tuple[str, ...], *, sweep_id: str = "", code: tuple[str, ...] = ()) -> Manifest:
    """A new sweep's manifest (a fresh ``sweep_id`` unless given: the folder's identity towards the ledger)."""
    sweep_id = sweep_id or new_sweep_id()
    return Manifest(name=name, grid=str(grid), backend=backend, profile=profile, tracking_uri=tracking_uri,
                    overrides=overrides, created=time.time(), workdir=str(Path.cwd()), sweep_id=sweep_id, code=code)
