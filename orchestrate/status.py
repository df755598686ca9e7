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
the code versions, and a ledger line: how many trials hold outbox records not yet in MLflow. When the folders say
the ledger is behind and MLflow answers, ``status`` reconciles it (:func:`orchestrate.trial_state.reconcile_ledger`,
under the sweep's lock, within ``--reconcile-deadline`` seconds) and says so; a lookup of the sweep's experiment
(sqlite3 or one HTTP request, no mlflow import) first tells whether MLflow answers and whether this folder owns it.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import sqlite3
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asr_core.contract.trial import (FAILED, FINISHED, KILLED, OUTCOME_CANCELLED, OUTCOME_FENCED, OUTCOME_FINISHED,
                                     OUTCOME_PREEMPTED, OUTCOME_RESET, RUNNING, TAG_SWEEP_ID, TAG_SWEEP_ROOT)
from orchestrate.mlflow_rest import LedgerError, auth_header
from orchestrate.progress import phase_text
from orchestrate.sweep import Manifest, SweepDir, SweepError
from orchestrate.trial_state import (DEFAULT_MAX_FAILURES, FolderState, ReconcileResult, behind,
                                     failure_reason, read_folder_states, read_sync, read_trial_refs,
                                     reconcile_ledger)

__all__ = ["LedgerProbe", "ReconcileResult", "SchedulerView", "TrialStatus", "STATUS_STATES", "classify",
           "ledger_probe", "main", "reconcile_ledger", "scheduler_view", "show_status", "trial_statuses"]

QUEUED, PREEMPTED, LOST = "QUEUED", "PREEMPTED", "LOST"  # besides the run states FINISHED, RUNNING, FAILED, KILLED
STATUS_STATES = (FINISHED, RUNNING, QUEUED, PREEMPTED, FAILED, KILLED, LOST)  # the order status prints them
DEFAULT_RECONCILE_S = 30.0  # how long `status` may spend bringing a lagging ledger in line
PROBE_TIMEOUT_S = 3.0  # how long the lookup of the sweep's experiment waits for an mlflow server
# MLflow's own HTTP retries while status reconciles (unless set by the user): fail within seconds, not minutes
_MLFLOW_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


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
        return SchedulerView(held, {k: "RUNNING" for k in held}, note=f"the sweep is being run ({holder})")
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


def _lost_reason(fs: FolderState) -> str:
    if fs.unrecorded_segment:
        seg = fs.last_segment or {}
        job = seg.get("job_id") or "no job id"
        return (f"segment {seg.get('segment', fs.segments)} (job {job}) ended without a word; resume asks the "
                "scheduler how it ended")
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
    rows = [classify(states[t.key], t.label, held_job=view.held.get(t.key), held_state=view.states.get(t.key, ""),
                     scheduler_known=view.known, max_failures=max_failures, run_id=run_ids.get(t.key, ""))
            for t in trials]
    if manifest.backend == "slurm" and view.known:
        rows = _with_accounting(rows, states)
    return rows


def _with_accounting(rows: list[TrialStatus], states: Mapping[str, FolderState]) -> list[TrialStatus]:
    """LOST trials whose last segment ended without a word, with how the scheduler's accounting says its job ended
    (one ``sacct`` for all; read only: ``resume`` records it and counts it against the budget)."""
    asks = {r.key: str((states[r.key].last_segment or {}).get("job_id") or "") for r in rows
            if r.status == LOST and states[r.key].unrecorded_segment}
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
            seg = (states[r.key].last_segment or {}).get("segment", states[r.key].segments)
            how = ("the scheduler's accounting has it not ended, though the queue does not show it" if end is None
                   else f"{end.reason}; resume records it")
            r = dataclasses.replace(r, reason=f"segment {seg} (job {job}) ended without a word; {how}"
                                    + (f" ({r.failures}/{r.max_failures} failures so far)" if r.failures else ""))
        out.append(r)
    return out


# ---- the ledger, lightly -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LedgerProbe:
    """What one cheap lookup of the sweep's experiment said. ``answered``: MLflow answered (None: a store this
    lookup cannot read, e.g. a database server; then reconciliation simply tries)."""

    answered: bool | None
    error: str = ""
    exists: bool = False
    deleted: bool = False
    owner: str | None = None  # the experiment's sweep.id tag (None: untagged, made before sweeps had ids)
    owner_root: str = ""


def _credentials() -> dict[str, str]:
    """The ``Authorization`` header an MLflow client would send (:func:`orchestrate.mlflow_rest.auth_header`); none
    when the credentials file is unreadable (the probe then reports what the server answers)."""
    try:
        header = auth_header()
    except LedgerError:
        return {}
    return {"Authorization": header} if header else {}


def _probe_http(uri: str, name: str, timeout: float) -> LedgerProbe:
    url = (uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?"
           + urllib.parse.urlencode({"experiment_name": name}))
    req = urllib.request.Request(url, headers=_credentials())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the sweep's own server
            exp = json.loads(r.read().decode()).get("experiment") or {}
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        if e.code == 404 and "RESOURCE_DOES_NOT_EXIST" in body:
            return LedgerProbe(answered=True)
        return LedgerProbe(answered=False, error=f"{url.split('?')[0]} answered HTTP {e.code}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return LedgerProbe(answered=False, error=f"{uri}: {getattr(e, 'reason', e)}")
    tags = {t.get("key"): t.get("value") for t in exp.get("tags") or []}
    return LedgerProbe(answered=True, exists=True, deleted=exp.get("lifecycle_stage") == "deleted",
                       owner=tags.get(TAG_SWEEP_ID), owner_root=tags.get(TAG_SWEEP_ROOT) or "")


def _probe_sqlite(uri: str, name: str, timeout: float) -> LedgerProbe:
    path = Path(uri[len("sqlite:///"):])
    if not path.exists():
        return LedgerProbe(answered=False, error=f"{path} does not exist")
    try:
        con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout)
        try:
            row = con.execute("SELECT experiment_id, lifecycle_stage FROM experiments WHERE name = ? "
                              "ORDER BY experiment_id LIMIT 1", (name,)).fetchone()
            if row is None:
                return LedgerProbe(answered=True)
            tags = dict(con.execute("SELECT key, value FROM experiment_tags WHERE experiment_id = ?", (row[0],)))
        finally:
            con.close()
    except sqlite3.Error as e:
        return LedgerProbe(answered=False, error=f"{path}: {e}")
    return LedgerProbe(answered=True, exists=True, deleted=row[1] == "deleted", owner=tags.get(TAG_SWEEP_ID),
                       owner_root=tags.get(TAG_SWEEP_ROOT) or "")


def ledger_probe(uri: str, name: str, timeout: float = PROBE_TIMEOUT_S) -> LedgerProbe:
    """Look the sweep's experiment up without importing mlflow: one HTTP request to an mlflow server, or one
    read-only sqlite3 query of a sqlite ledger."""
    scheme = urllib.parse.urlparse(uri).scheme
    if scheme in ("http", "https"):
        return _probe_http(uri, name, timeout)
    if uri.startswith("sqlite:///"):
        return _probe_sqlite(uri, name, timeout)
    return LedgerProbe(answered=None)


def check_owner(probe: LedgerProbe, manifest: Manifest, sweep: SweepDir) -> None:
    """Raise :class:`orchestrate.ledger.SweepOwnershipError` when the sweep's experiment belongs to another sweep
    folder (the rule of :meth:`orchestrate.ledger.Ledger.check_owner` for a folder that existed: untagged
    experiments may be adopted)."""
    if not probe.exists or probe.owner is None or probe.owner == manifest.sweep_id:
        return
    from orchestrate.ledger import SweepOwnershipError

    owner_root = probe.owner_root or "a folder it did not record"
    ours = f"sweep id {manifest.sweep_id}" if manifest.sweep_id else "no sweep id"
    raise SweepOwnershipError(
        f"experiment {manifest.name!r} in {manifest.tracking_uri} belongs to another sweep: the folder {owner_root} "
        f"(sweep id {probe.owner}), not this one ({sweep.path}, {ours}); sweeps sharing one experiment would resume "
        f"and cancel each other's runs. Submit this one under another name with `--sweep NAME`, or run "
        f"status/resume/cancel from {owner_root}")


# ---- the command -------------------------------------------------------------------------------------------------
def _ledger_line(sweep: SweepDir, manifest: Manifest, trials: Sequence[Any], states: Mapping[str, FolderState],
                 view: SchedulerView, *, reconcile: bool, deadline_s: float, max_failures: int) -> str:
    """The ledger line: in step, behind (and why nothing was done), or what reconciliation did."""
    held = set(view.held) if view.known else {t.key for t in trials}  # unknown: treat every trial as possibly held
    evaluations = {t.key for t in trials if getattr(t, "is_evaluation", False)}
    lag = behind(states, read_sync(sweep), held, max_failures, evaluations)
    pending = sum(fs.pending for fs in states.values())
    outbox = sum(1 for fs in states.values() if fs.pending)
    head = (f"{outbox} trials hold {pending} outbox records not yet in MLflow" if outbox
            else "no outbox records waiting")
    probe = ledger_probe(manifest.tracking_uri, manifest.name)
    check_owner(probe, manifest, sweep)
    if not lag:
        down = f" (MLflow unreachable: {probe.error})" if probe.answered is False else ""
        return f"ledger: {head}; " + ("their jobs ship them" if outbox else "in step with the trial folders") + down
    if probe.answered is False:
        return (f"ledger: {head}; behind by {len(lag)} trials (MLflow unreachable: {probe.error}); the counts "
                "above are the trial folders'")
    if probe.deleted:
        return (f"ledger: {head}; behind by {len(lag)} trials, and the sweep's experiment is deleted in "
                f"{manifest.tracking_uri}: restore it, then run status or resume")
    if not reconcile:
        return f"ledger: {head}; behind by {len(lag)} trials (not reconciled: --no-reconcile)"
    for var, value in _MLFLOW_BOUNDS.items():  # a server that stops answering now must not hold status for minutes
        os.environ.setdefault(var, value)
    from orchestrate.ledger import Ledger, SweepOwnershipError

    try:
        with sweep.lock("status (reconciling the ledger)"):
            ledger = Ledger(manifest.tracking_uri, manifest.name)
            try:
                ledger.check_owner(manifest.sweep_id, str(sweep.path), adopt=True)
            except SweepOwnershipError:
                raise
            except Exception as e:  # noqa: BLE001 - MLflow stopped answering since the probe: report, go on
                return (f"ledger: {head}; behind by {len(lag)} trials (MLflow unreachable: {type(e).__name__}: "
                        f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''})")
            result = reconcile_ledger(ledger, sweep, trials, states, deadline_s=deadline_s, held=held,
                                      max_failures=max_failures)
    except SweepError as e:
        return f"ledger: {head}; behind by {len(lag)} trials (not reconciled: {e})"
    return f"ledger: {head}; reconciled (bounded at {deadline_s:g} s): {result.describe()}"


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
        line = _ledger_line(sweep, manifest, trials, states, view, reconcile=reconcile, deadline_s=deadline_s,
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
    print()
    print(_ledger_line(sweep, manifest, trials, states, view, reconcile=reconcile, deadline_s=deadline_s,
                       max_failures=max_failures))
    return 0


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

