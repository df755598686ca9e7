"""Submit, resume, retry and cancel a sweep: the backend-neutral decisions.

Every operation takes the sweep lock before it writes anything, then reads the trial folders (the truth; MLflow
mirrors them), asks the backend which trials its scheduler still holds, brings the ledger in line with the folders
(:func:`orchestrate.ledger.reconcile.reconcile_ledger`) and classifies each trial:

* finished (``DONE`` in its folder, or FINISHED in the ledger) → skipped, even when the ledger lags;
* live: held by the scheduler (pending/running/requeued), or its lease is alive (a fresh heartbeat beats an empty
  ``squeue`` under ``PrivateData=jobs`` or a COMPLETING task) → re-attached (its job id tagged if the ledger lacked
  it, e.g. the submitting process died right after ``sbatch``); never started twice;
* cancelled (``CANCELLED`` in its folder, written by ``cancel``) → left KILLED; only ``retry --cancelled`` removes
  the marker and starts it again, from its checkpoint;
* past the failure budget (``failures`` in ``attempts.jsonl`` since the last reset ≥ the sweep's ``max_failures``)
  → left FAILED with ``gave up after N failures: <last reason>``; only ``retry --failed`` resets the count (a
  ``reset`` line) and starts it again;
* its last outcome is a failure of its own (``failed``) or the system killed it (``killed``: out of memory, time
  limit, node failure, a signal) → resubmitted by ``resume`` and ``retry --failed``, left by ``submit``;
* preempted (checkpointed and asked to run again) or lost (ended without a word, and the scheduler's accounting
  cannot say how) → resubmitted; it resumes from its checkpoint in the same run;
* no run yet → run created (SCHEDULED), then submitted.

A trial whose last segment ended without a recorded outcome (or whose last job never started one) gets it now, from
the scheduler's accounting (:meth:`~orchestrate.backends.base.Backend.job_ends`: ``sacct`` on SLURM) and
``record_attempt(..., by="resume")``, so that a trainer killed by the system counts against the budget exactly once.

Runs are created before anything is submitted and job ids are tagged after, so a crash at any point leaves a state
that this same function repairs.

``cancel`` is final (:mod:`orchestrate.dispatch.cancel`); ``submit`` and ``resume`` start no cancelled trial again, and
mark the runs of cancelled trials KILLED where a ``cancel`` without MLflow left them.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from asr_core.contract.trial import (FAILED, FINISHED, KILLED, OUTCOME_DIVERGED, OUTCOME_FAILED, OUTCOME_KILLED,
                                     OUTCOME_LOST, OUTCOME_PREEMPTED, OUTCOME_RESET, SCHEDULED, TAG_BACKEND, TAG_ERROR,
                                     TAG_JOB_ID, record_attempt)
from orchestrate.backends import make_backend
from orchestrate.backends.base import Backend, Job
from orchestrate.plan.profile import Profile
from orchestrate.dispatch.cancel import CANCELLED_ERROR
from orchestrate.ledger.ledger import Ledger, LedgerError, TrialRun
from orchestrate.sweep.folder import DEFAULT_MAX_FAILURES, Manifest, SweepDir, new_sweep_id
from orchestrate.sweep.trial import Trial
from orchestrate.ledger.reconcile import reconcile_ledger
from orchestrate.sweep.trial_state import FolderState, failure_reason, read_folder_state, read_folder_states

if TYPE_CHECKING:
    from asr_core.contract.provenance import CodeVersion

RETRY_WHAT = ("failed", "cancelled")  # what `retry` may start again


@dataclass
class Plan:
    """What reconciliation decided, by trial key."""

    finished: list[str] = field(default_factory=list)
    attached: dict[str, str] = field(default_factory=dict)  # key -> live job id
    new: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # not live, ended without a word (or never went out): resubmitted
    preempted: list[str] = field(default_factory=list)  # last outcome preempted: resubmitted
    failed: list[str] = field(default_factory=list)  # failed/killed within the budget, resubmitted
    left_failed: list[str] = field(default_factory=list)  # failed/killed within the budget, left (submit)
    gave_up: dict[str, str] = field(default_factory=dict)  # key -> "gave up after N failures: ...", left FAILED
    cancelled: list[str] = field(default_factory=list)  # CANCELLED, left KILLED
    uncancelled: list[str] = field(default_factory=list)  # CANCELLED, resubmitted by retry --cancelled
    stopping: list[str] = field(default_factory=list)  # CANCELLED and still live: retry --cancelled waits for them
    reset: list[str] = field(default_factory=list)  # failures reset by retry --failed (subset of failed)
    reasons: dict[str, str] = field(default_factory=dict)  # key -> the last failure's reason (failed, left, lost)
    ledger_behind: str = ""  # a blocking backend's trials ran, but the ledger did not answer at the end: why

    def to_submit(self) -> list[str]:
        return self.new + self.lost + self.preempted + self.failed + self.uncancelled

    def summary(self) -> str:
        parts = [f"{len(self.finished)} finished (skipped)", f"{len(self.attached)} live (re-attached)",
                 f"{len(self.new)} new", f"{len(self.lost)} lost (resubmitted)"]
        optional = [(len(self.preempted), "preempted (resubmitted)"),
                    (len(self.failed), "failed/killed (resubmitted)"),
                    (len(self.left_failed), "failed/killed (left; resume or retry --failed)"),
                    (len(self.gave_up), "gave up (left FAILED; retry --failed)"),
                    (len(self.cancelled), "cancelled (left KILLED; retry --cancelled)"),
                    (len(self.uncancelled), "cancelled (resubmitted)"),
                    (len(self.stopping), "cancelled, still stopping (retry --cancelled again once they ended)")]
        return ", ".join(parts + [f"{n} {what}" for n, what in optional if n])


def eval_dataset_names(trials: list[Trial]) -> list[str]:
    """The names of every dataset the trials evaluate on (``eval.datasets``, NAME=FORMAT:PATH), first seen first."""
    from asr_core.contract.specs import parse_dataset_spec

    names: dict[str, None] = {}
    for t in trials:
        for spec in t.config.eval.datasets:
            names.setdefault(parse_dataset_spec(spec)[0], None)
    return list(names)


def _fault(point: str) -> None:
    """Fault injection for the recovery tests: ``ORCHESTRATE_FAULT=<point>`` kills this process right there, the
    way a node reboot or an OOM kill would (no cleanup, no exception handlers)."""
    if os.environ.get("ORCHESTRATE_FAULT") == point:
        log(f"fault injected at {point}: exiting now")
        os._exit(137)


def log(msg: str) -> None:
    print(f"[orchestrate] {msg}", file=sys.stderr, flush=True)


def classify(trials: list[Trial], runs: dict[str, TrialRun], live: dict[str, str],
             states: dict[str, FolderState], *, include_failed: bool, retry: tuple[str, ...] = (),
             max_failures: int = DEFAULT_MAX_FAILURES) -> Plan:
    """Decide, from the folders (``states``), the ledger (``runs``) and what is live (``live``: the scheduler's
    jobs and live leases), what happens to each trial (see the module docstring). ``include_failed``: failed and
    killed trials within the budget are resubmitted (``resume``); ``retry``: only the trials ``retry`` names
    (``failed``: failed, killed and given up, their count reset; ``cancelled``) are resubmitted, nothing else."""
    plan = Plan()
    for t in trials:
        k = t.key
        r = runs.get(k)
        fs = states.get(k)
        if (fs is not None and fs.done) or (r is not None and r.status == FINISHED):
            plan.finished.append(k)
            continue
        if k in live:
            plan.attached[k] = live[k]
            if fs is not None and fs.cancelled and "cancelled" in retry:
                plan.stopping.append(k)
            continue
        if fs is not None and fs.cancelled:
            (plan.uncancelled if "cancelled" in retry else plan.cancelled).append(k)
            continue
        n_failed = len(fs.failures) if fs is not None else 0
        last = fs.last_outcome if fs is not None else None
        if fs is not None and n_failed and n_failed >= max_failures:
            plan.reasons[k] = failure_reason(fs, max_failures)
            if "failed" in retry:
                plan.failed.append(k)
                plan.reset.append(k)
            else:
                plan.gave_up[k] = plan.reasons[k]
            continue
        failed = last in (OUTCOME_FAILED, OUTCOME_DIVERGED, OUTCOME_KILLED) or (
            last is None and r is not None and r.status in (FAILED, KILLED))
        if failed:
            plan.reasons[k] = (failure_reason(fs, max_failures) if fs is not None and fs.failures
                               else (r.error if r is not None else ""))
            if "failed" in retry:
                plan.failed.append(k)
                plan.reset.append(k)
            elif retry:
                continue
            else:
                (plan.failed if include_failed else plan.left_failed).append(k)
            continue
        if retry:
            continue
        if r is None:
            plan.new.append(k)
        elif last == OUTCOME_PREEMPTED:
            plan.preempted.append(k)
        else:  # lost, ended without a word, or never went out (a submitter that died before sbatch)
            if last == OUTCOME_LOST and fs is not None:
                plan.reasons[k] = failure_reason(fs, max_failures)
            plan.lost.append(k)
    return plan


# ---- outcomes nobody recorded ----------------------------------------------------------------------------------
def _submitted_jobs(sweep: SweepDir, backend: Backend) -> dict[str, str]:
    """{key: the job id of the newest submission of the trial whose job id is known}, from the submission files."""
    out: dict[str, str] = {}
    for sub in sweep.submissions():  # oldest first (the file names start with the time)
        if sub.data.get("backend") != backend.name or not sub.job_id:
            continue
        for i, k in enumerate(sub.keys):
            out[k] = backend.task_job_id(sub, i)
    return out


def record_unreported_ends(sweep: SweepDir, backend: Backend, states: dict[str, FolderState],
                           live: dict[str, str]) -> tuple[dict[str, FolderState], dict[str, str]]:
    """Give every unfinished trial that no job runs an outcome for the end nobody recorded: its last segment (the
    trainer died without a word, and so did the task that ran it), or, when it never started one, its last
    submitted job. The scheduler's accounting says how each ended (one call for all); nothing known → ``lost``.

    Returns the states re-read for the trials that got an outcome, and {key: job id} of trials whose job the
    accounting still sees running (the queue did not show it: treat them as live)."""
    asks: dict[str, tuple[int | None, str]] = {}  # key -> (segment, job id)
    submitted: dict[str, str] | None = None
    for k, fs in states.items():
        if fs.done or fs.cancelled or fs.live or k in live:
            continue
        if fs.last_segment is not None:
            if not fs.unrecorded_segment:
                continue
            asks[k] = (fs.last_segment.number_or(fs.segments), fs.last_segment.job)
        else:
            if submitted is None:
                submitted = _submitted_jobs(sweep, backend)
            job = submitted.get(k, "")
            if job and not any(a.segment is None and a.job_id == job for a in fs.attempts):
                asks[k] = (None, job)
    if not asks:
        return {}, {}
    job_ids = sorted({j for _, j in asks.values() if j})
    ends = backend.job_ends(job_ids) if job_ids else {}
    recorded: list[str] = []
    running: dict[str, str] = {}
    for k, (seg, job) in asks.items():
        if job and job in ends and ends[job] is None:
            running[k] = job  # accounting still sees it: never resubmit it now
            continue
        end = ends.get(job) if job else None
        if end is None:
            outcome = OUTCOME_LOST
            reason = (f"job {job} ended without recording how, and the scheduler cannot say" if job
                      else "the trial's job ended without recording how (no job id to ask the scheduler about)")
        else:
            outcome, reason = end.outcome, end.reason
        if record_attempt(sweep.trial_dir(k), outcome, reason, segment=seg, job_id=job, by="resume") is not None:
            recorded.append(k)
            log(f"trial {k}: {'segment ' + str(seg) if seg is not None else 'job'} ended {outcome}: {reason}")
    return {k: read_folder_state(sweep.trial_dir(k), k) for k in recorded}, running


# ---- the sweep ---------------------------------------------------------------------------------------------------
def run_sweep(sweep: SweepDir, manifest: Manifest, trials: list[Trial], profile: Profile, *,
              include_failed: bool = True, retry: tuple[str, ...] = (), what: str = "submit",
              backend: Backend | None = None, write: bool = False, adopt: bool = False,
              code: "CodeVersion | None" = None,
              expand: "Callable[[list[Trial]], list[Trial]] | None" = None,
              only: "Callable[[Trial], bool] | None" = None) -> Plan:
    """Reconcile folders, ledger and scheduler, then submit what needs to run. Holds the sweep lock throughout, and
    takes it before anything is written.

    ``write``: record ``manifest`` and ``trials`` in the sweep folder first, under the lock and after the ledger
    confirmed that this folder owns the sweep's experiment (a refused or busy call changes nothing). ``code``: the
    running code version, appended to the manifest (a dirty tree's diff kept in ``code/``). ``adopt``: the folder
    existed before this command, so it may claim an experiment made before sweeps had ids. ``include_failed`` and
    ``retry``: see :func:`classify`. ``expand``: called under the lock with ``trials`` before anything is written,
    returns them with the evaluation jobs they need (:func:`orchestrate.plan.evaluations.plan_default`); its
    :class:`~orchestrate.plan.evaluations.EvaluationError` leaves everything unchanged. ``only``: which trials may be
    (re)submitted (``--where``, or one evaluation's jobs); the others are classified and left as they are.

    Evaluation jobs (``Trial.evaluation``) are classified from their folders alone: their model's run is the
    ledger's view of training, never theirs to move, create or requeue."""
    unknown = sorted(set(retry) - set(RETRY_WHAT))
    if unknown:
        raise ValueError(f"retry what? {unknown[0]!r}; valid: {', '.join(RETRY_WHAT)}")
    backend = backend or make_backend(manifest.backend, sweep, manifest.tracking_uri, profile)
    backend.validate()
    ledger = Ledger(manifest.tracking_uri, manifest.name)
    with sweep.lock(what):
        t0 = time.perf_counter()
        if expand is not None:
            trials = expand(trials)
        models = [t for t in trials if not t.is_evaluation]
        evals = [t for t in trials if t.is_evaluation]
        is_eval = {t.key for t in evals}
        parent = ledger.ensure_sweep(manifest.grid, manifest.backend, manifest.sweep_id, str(sweep.path),
                                     adopt=adopt, datasets=eval_dataset_names(models))
        if code is not None:
            if code.dirty and code.diff:
                sweep.save_diff(code.label, code.diff)
            manifest = manifest.with_code(code.label)
        if write:
            sweep.write_manifest(manifest)
            sweep.write_trials(trials)
        keys = [t.key for t in trials]
        states = read_folder_states(sweep, keys)
        held = backend.live_jobs()
        live = {**{k: fs.job_id or "lease" for k, fs in states.items() if fs.live}, **held}
        fresh, running = record_unreported_ends(sweep, backend, states, live)
        states.update(fresh)
        live.update(running)
        rec = reconcile_ledger(ledger, sweep, trials, states, held=set(held) | set(running),
                               max_failures=manifest.max_failures)
        if rec.error or rec.shipped or rec.moved:
            log(f"ledger: {rec.describe()}")
        runs = rec.runs if rec.runs is not None else ledger.trial_runs()
        if evals:
            from orchestrate.plan.evaluations import evaluation_runs

            runs = {**runs, **evaluation_runs(sweep, evals, runs)}
        plan = classify(trials, runs, live, states, include_failed=include_failed, retry=retry,
                        max_failures=manifest.max_failures)
        if only is not None:
            _restrict(plan, {t.key for t in trials if only(t)})
        log(f"sweep {sweep.name}: {len(trials)} trials: {plan.summary()}")
        for k, why in sorted(plan.gave_up.items()):
            log(f"trial {k}: {why}; left FAILED (retry --failed starts it again)")
        # Re-attach: tag job ids the ledger lacks (a submitter that died after sbatch, before tagging).
        fix = {runs[k].run_id: {TAG_JOB_ID: j, TAG_BACKEND: manifest.backend}
               for k, j in plan.attached.items() if k in held and k in runs and runs[k].job_id != j}
        if fix:
            ledger.tag_runs(fix)
            log(f"tagged {len(fix)} re-attached runs with their job ids")
        _mirror_left(ledger, {k: r for k, r in runs.items() if k not in is_eval}, plan)
        by_key = {t.key: t for t in trials}
        joined = ledger.join_subgrids([t for t in trials if t.key not in is_eval], runs)
        if joined:
            log(f"{joined} runs joined this grid's sub-grids (their tag trial.subgrids)")
        for k in plan.attached:  # live jobs read config.json when they are requeued: give them today's settings
            sweep.prepare_trial(profile.fit(by_key[k]))
        todo_keys = plan.to_submit()
        if not todo_keys:
            if len(set(plan.finished) - is_eval) == len(models):
                ledger.finish_parent()
            return plan
        for k in plan.reset:
            record_attempt(sweep.trial_dir(k), OUTCOME_RESET, f"{what} --failed: the failure count starts again",
                           by="retry")
        for k in plan.uncancelled:
            sweep.uncancel_trial(k)
        run_ids = ledger.create_trial_runs(parent, [by_key[k] for k in plan.new if k not in is_eval],
                                           manifest.backend, sweep=trials)
        todo_evals = [k for k in todo_keys if k in is_eval]
        missing = [k for k in todo_evals if run_ids.get(by_key[k].model) is None]
        if missing:  # a model without a run cannot be evaluated into it: left for the next command
            log(f"{len(missing)} evaluation jobs wait for their models' runs in the ledger: {', '.join(missing[:5])}")
            todo_keys = [k for k in todo_keys if k not in missing]
        run_ids.update({k: run_ids[by_key[k].model] for k in todo_evals if k not in missing})
        todo = [by_key[k] for k in todo_keys]
        again = [k for k in todo_keys if k not in plan.new]
        requeue = [runs[k].run_id for k in again if k in runs and runs[k].status != SCHEDULED and k not in is_eval]
        if requeue:  # FAILED/KILLED/stale RUNNING go back to SCHEDULED; the error tag is cleared
            ledger.set_status(requeue, SCHEDULED, tags={TAG_ERROR: ""})
        log(f"ledger ready in {time.perf_counter() - t0:.2f}s ({len(plan.new)} runs created)")
        jobs = [Job(trial=t, run_id=run_ids[t.key], trial_dir=sweep.prepare_trial(profile.fit(t))) for t in todo]
        _fault("after-runs")

        def on_submitted(job_ids: dict[str, str]) -> None:
            # The job ids reach the ledger from the jobs (each segment tags its run): no write per trial here.
            _fault("after-submit")

        backend.submit(jobs, on_submitted)
        if backend.blocking:  # the trials ran: an unreachable ledger now loses nothing (their outboxes hold it)
            try:
                final = ledger.trial_runs()
                if all(final.get(t.key) is not None and final[t.key].status == FINISHED for t in models):
                    ledger.finish_parent()
            except LedgerError as e:
                plan.ledger_behind = f"MLflow at {manifest.tracking_uri} does not answer ({e})"
                log(f"sweep {sweep.name}: {plan.ledger_behind}")
    return plan


def _restrict(plan: Plan, only: set[str]) -> None:
    """Leave out of what ``plan`` would (re)submit every trial not in ``only`` (``--where``)."""
    for name in ("new", "lost", "preempted", "failed", "uncancelled", "reset"):
        setattr(plan, name, [k for k in getattr(plan, name) if k in only])


def _mirror_left(ledger: Ledger, runs: dict[str, TrialRun], plan: Plan) -> None:
    """The ledger states of the trials left alone: given up → FAILED with why; cancelled → KILLED. Reconciliation
    moves most of them already; this covers runs it leaves (a SCHEDULED run of a trial that gave up, or one that a
    cancel while MLflow was down could not mark)."""
    by_error: dict[tuple[str, str], list[str]] = {}
    for k, why in plan.gave_up.items():
        r = runs.get(k)
        if r is not None and (r.status != FAILED or r.error != why):
            by_error.setdefault((FAILED, why), []).append(r.run_id)
    for k in plan.cancelled:
        r = runs.get(k)
        if r is not None and r.status != KILLED:
            by_error.setdefault((KILLED, CANCELLED_ERROR), []).append(r.run_id)
    for (state, why), run_ids in by_error.items():
        ledger.set_status(run_ids, state, tags={TAG_ERROR: why})


def new_manifest(name: str, grid: Path, backend: str, profile: str, tracking_uri: str,
                 overrides: tuple[str, ...], *, sweep_id: str = "", code: tuple[str, ...] = (),
                 max_failures: int = DEFAULT_MAX_FAILURES, allow_sqlite: bool = False) -> Manifest:
    """A new sweep's manifest (a fresh ``sweep_id`` unless given: the folder's identity towards the ledger)."""
    sweep_id = sweep_id or new_sweep_id()
    return Manifest(name=name, grid=str(grid), backend=backend, profile=profile, tracking_uri=tracking_uri,
                    overrides=overrides, created=time.time(), workdir=str(Path.cwd()), sweep_id=sweep_id, code=code,
                    max_failures=max_failures, allow_sqlite=allow_sqlite)
