"""The ledger brought in line with the trial folders (:mod:`orchestrate.sweep.trial_state` reads them).

MLflow is a mirror of the trial folders that may lag (the job ships its outbox in the background; a job killed by
the system, or a ``cancel`` while MLflow was down, leaves facts that only the orchestrator mirrors).

* :func:`ledger_targets`: the state each trial's run must have in the ledger given its folder (``DONE`` →
  FINISHED, ``CANCELLED`` → KILLED, a failure as the last outcome → FAILED with its reason), and which of those are
  facts only the orchestrator mirrors (the job ships its own).
* :func:`reconcile_ledger`: ships the pending outboxes of trials with no live job and moves the runs whose state
  lags their folder. It never raises on an unreachable MLflow; it says how far behind the ledger stays.

``<sweep>/ledger-sync.json`` (:data:`SYNC_FILE`) records the orchestrator-side facts reconciliation has mirrored
(a cancel, a failure recorded by the scheduler task or by ``resume``), so that ``status`` can tell from the folders
alone whether the ledger is behind, without asking MLflow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asr_core.contract.trial import FAILED, FINISHED, KILLED, RUNNING, SCHEDULED, TAG_ERROR
from orchestrate.sweep.folder import DEFAULT_MAX_FAILURES
from orchestrate.sweep.trial_state import FolderState, failure_reason

if TYPE_CHECKING:
    from orchestrate.ledger.ledger import Ledger, TrialRun
    from orchestrate.sweep.folder import SweepDir

__all__ = ["ReconcileResult", "SYNC_FILE", "Target", "behind", "ledger_target", "ledger_targets", "read_sync",
           "reconcile_ledger", "record_mirrored", "write_sync"]

SYNC_FILE = "ledger-sync.json"  # in the sweep folder: orchestrator-side facts already mirrored to the ledger


# ---- what the ledger must say ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """The state a trial's run must have in the ledger, given its folder.

    ``fact`` names the folder fact it mirrors; ``orchestrator`` is True when only the orchestrator mirrors it (a
    cancel, or a failure recorded by the scheduler task or by ``resume``), False when the job's own outbox carries
    it (``DONE``, a failure the job recorded itself)."""

    state: str
    error: str = ""
    fact: str = ""
    orchestrator: bool = False
    gave_up: bool = False


def ledger_target(fs: FolderState, *, held: bool = False, max_failures: int = DEFAULT_MAX_FAILURES) -> Target | None:
    """The ledger state ``fs`` calls for, or None when the folder makes no claim (the trial runs, waits, or its
    last segment has no outcome yet). A trial with a live lease or held by the scheduler only ever claims FINISHED
    (``DONE`` is final) or KILLED (a cancel is final)."""
    if fs.done:
        return Target(FINISHED, fact="done")
    if fs.cancelled:
        return Target(KILLED, error="cancelled", fact="cancelled", orchestrator=True)
    if fs.live or held or not fs.failed:
        return None
    last = fs.attempts[-1]
    gave_up = len(fs.failures) >= max_failures
    fact = f"{last.outcome}:{last.segment}:{last.job_id}:{last.time}"
    return Target(FAILED, error=failure_reason(fs, max_failures), fact=fact, orchestrator=last.by != "job",
                  gave_up=gave_up)


def ledger_targets(states: Mapping[str, FolderState], held: Collection[str] = (),
                   max_failures: int = DEFAULT_MAX_FAILURES) -> dict[str, Target]:
    """{key: Target} of every trial whose folder makes a claim on its run's state (see :func:`ledger_target`)."""
    out = {}
    for k, fs in states.items():
        t = ledger_target(fs, held=k in held, max_failures=max_failures)
        if t is not None:
            out[k] = t
    return out


def read_sync(sweep: "SweepDir") -> dict[str, str]:
    """{key: fact} of the orchestrator-side facts reconciliation has mirrored ({} when there is no record)."""
    try:
        d = json.loads((sweep.path / SYNC_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in d.items()} if isinstance(d, dict) else {}


def write_sync(sweep: "SweepDir", facts: Mapping[str, str]) -> None:
    """Record {key: fact} as the orchestrator-side facts the ledger mirrors (atomically; reconciliation writes it
    under the sweep's lock). A folder that cannot be written only costs ``status`` a reconciliation later."""
    path = sweep.path / SYNC_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(dict(sorted(facts.items())), indent=0))
        os.replace(tmp, path)
    except OSError:  # only an optimisation of `status`: the next reconciliation compares with the ledger anyway
        tmp.unlink(missing_ok=True)


def record_mirrored(sweep: "SweepDir", states: Mapping[str, FolderState], keys: Iterable[str], *,
                    held: Collection[str] = (), max_failures: int = DEFAULT_MAX_FAILURES) -> None:
    """Record that the ledger now mirrors the orchestrator-side facts of ``keys`` (for a caller that wrote their
    run states itself, e.g. ``cancel`` after marking the runs KILLED), so the next ``status`` need not reconcile.
    ``states`` are the folders as they are now (read after the facts were written). Call it under the sweep's
    lock."""
    sync = read_sync(sweep)
    new = dict(sync)
    for k in keys:
        fs = states.get(k)
        t = ledger_target(fs, held=k in held, max_failures=max_failures) if fs is not None and not fs.live else None
        if t is not None and t.orchestrator:
            new[k] = t.fact
    if new != sync:
        write_sync(sweep, new)


def behind(states: Mapping[str, FolderState], sync: Mapping[str, str], held: Collection[str] = (),
           max_failures: int = DEFAULT_MAX_FAILURES, evaluations: Collection[str] = ()) -> dict[str, str]:
    """{key: why} of the trials whose folders say the ledger is behind, from the folders and :data:`SYNC_FILE`
    alone: records in the outbox that no job will ship (no live lease, not ``held`` by the scheduler), or an
    orchestrator-side fact (cancel, a failure the job could not record) not mirrored yet. ``evaluations``: keys of
    evaluation jobs, whose state is their folder's alone (only their outbox can lag)."""
    out: dict[str, str] = {}
    for k, fs in states.items():
        if fs.pending and not fs.live and k not in held:  # a running or queued job ships its own records
            out[k] = f"{fs.pending} outbox records"
            continue
        if fs.live or k in evaluations:
            continue  # its job writes its own states (a cancelled one marks itself KILLED)
        t = ledger_target(fs, held=k in held, max_failures=max_failures)
        if t is not None and t.orchestrator and sync.get(k) != t.fact:
            out[k] = f"{t.state} not mirrored"
    return out


# ---- reconciliation ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReconcileResult:
    """What :func:`reconcile_ledger` did, and how far behind the ledger stays.

    ``runs`` is the ledger's view after the moves ({key: TrialRun}, None when MLflow could not be read), so a
    caller that classifies next needs no second search."""

    shipped: int = 0  # outbox records shipped
    shipped_trials: int = 0  # trials whose outbox was emptied
    moved: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> the state its run was moved to
    behind: tuple[str, ...] = ()  # keys whose run still lags its folder
    left_to_jobs: int = 0  # trials with pending records left to their live or queued job to ship
    missing: tuple[str, ...] = ()  # keys with records or a claim but no run in the ledger yet (resume creates it)
    error: str = ""  # why MLflow could not be brought in line ("" when it answered)
    seconds: float = 0.0
    runs: "dict[str, TrialRun] | None" = None

    @property
    def ok(self) -> bool:
        return not self.error and not self.behind

    def describe(self) -> str:
        """One line: what was shipped and moved, or ``ledger behind by N trials (MLflow unreachable: ...)``."""
        moves: dict[str, int] = {}
        for s in self.moved.values():
            moves[s] = moves.get(s, 0) + 1
        done = []
        if self.shipped:
            done.append(f"shipped {self.shipped} outbox records of {self.shipped_trials} trials")
        if moves:
            done.append("moved " + ", ".join(f"{n} runs to {s}" for s, n in sorted(moves.items())))
        did = "; ".join(done) or "nothing to ship or move"
        if self.error:
            text = f"ledger behind by {len(self.behind)} trials (MLflow unreachable: {self.error})"
            return text + (f"; before that: {did}" if done else "")
        text = f"{did} in {self.seconds:.1f} s"
        if self.behind:
            text += f"; ledger still behind by {len(self.behind)} trials (out of time)"
        if self.left_to_jobs:
            text += f"; {self.left_to_jobs} trials with running or queued jobs ship their own records"
        if self.missing:
            text += f"; {len(self.missing)} trials have no run in the ledger yet (resume creates them)"
        return text


def _ship(trial_dir: Path, tracking_uri: str, run_id: str, deadline_s: float) -> tuple[int, int, str]:
    """(shipped, left, error) of one trial's outbox, via asr_core.runtime.shipper.ship_pending."""
    try:
        from asr_core.runtime import shipper

        r = shipper.ship_pending(trial_dir, tracking_uri, run_id, deadline_s)
    except Exception as e:  # noqa: BLE001 - an unreachable tracker must never stop status or resume
        return 0, -1, f"{type(e).__name__}: {e}"
    return int(getattr(r, "shipped", 0)), int(getattr(r, "left", 0)), str(getattr(r, "error", "") or "")


def _error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}".rstrip(": ")[:300]


def reconcile_ledger(ledger: "Ledger", sweep: "SweepDir", trials: Iterable[Any], states: Mapping[str, FolderState],
                     *, deadline_s: float = 60.0, held: Collection[str] = (),
                     max_failures: int = DEFAULT_MAX_FAILURES) -> ReconcileResult:
    """Bring the ledger in line with the trial folders, within ``deadline_s`` seconds; never raises on an unreachable
    MLflow (the result says how far behind the ledger stays and why).

    Call it under the sweep's lock. ``trials``: the sweep's trials (anything with a ``key``; an evaluation job, one
    with ``is_evaluation`` true, ships its outbox to its ``model``'s run and moves no run's state); ``states``: their
    :class:`FolderState`; ``held``: the keys the scheduler holds now (their jobs ship their own records and may be
    about to run: left alone except for FINISHED and KILLED, which are final); ``max_failures``: the sweep's
    budget (a trial past it is FAILED even when the ledger says SCHEDULED).

    For trials with no live job (no live lease, not held): the outbox is shipped
    (:func:`asr_core.runtime.shipper.ship_pending`), then the runs whose state lags the folder are moved: ``DONE`` →
    FINISHED; ``CANCELLED`` → KILLED; a failure as the last outcome → FAILED with its reason in ``trial.error``,
    from RUNNING (the job died, or could not say so), or from SCHEDULED once the budget is spent (otherwise
    SCHEDULED means ``resume`` already queued it again)."""
    t0 = time.monotonic()
    deadline = t0 + max(0.0, deadline_s)
    trials = list(trials)
    keys = [t.key for t in trials]
    run_of = {t.key: t.model for t in trials if getattr(t, "is_evaluation", False)}  # evaluation job -> its model
    held = set(held)
    targets = ledger_targets({k: states[k] for k in keys if k in states and k not in run_of}, held, max_failures)
    sync = read_sync(sweep)
    try:
        runs = dict(ledger.trial_runs())
    except Exception as e:  # noqa: BLE001 - MLflow down, or any error of its client: report, never raise
        lagging = tuple(behind({k: states[k] for k in keys if k in states}, sync, held, max_failures, run_of))
        return ReconcileResult(behind=lagging, error=_error(e), seconds=time.monotonic() - t0)

    # 1. the outboxes of trials no job will ship: the job's own records, in its order (statuses included)
    ship = [k for k in keys if k in states and states[k].pending and not states[k].live and k not in held]
    left_to_jobs = sum(1 for k in keys if k in states and states[k].pending and k not in ship)
    shipped = shipped_trials = 0
    error = ""
    unshipped: list[str] = []
    workers = 1 if getattr(ledger, "uri", "").startswith("sqlite:") else 4

    missing = tuple(k for k in dict.fromkeys([*ship, *targets]) if run_of.get(k, k) not in runs)  # resume makes them
    ship = [k for k in ship if run_of.get(k, k) in runs]

    def ship_one(k: str) -> tuple[str, int, int, str]:
        run = runs[run_of.get(k, k)]
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return k, 0, states[k].pending, ""
        return (k, *_ship(sweep.trial_dir(k), ledger.uri, run.run_id, left_s))

    if ship:
        if workers == 1 or len(ship) == 1:
            results = [ship_one(k) for k in ship]
        else:
            with ThreadPoolExecutor(min(workers, len(ship))) as ex:
                results = list(ex.map(ship_one, ship))
        for k, n, left, err in results:
            shipped += n
            if left == 0 and not err:
                shipped_trials += 1
            else:
                unshipped.append(k)
                error = error or (f"trial {k}: {err}" if err else "")
        if shipped:
            try:
                runs = dict(ledger.trial_runs())  # the shipped records moved states: read them back once
            except Exception as e:  # noqa: BLE001
                return ReconcileResult(shipped=shipped, shipped_trials=shipped_trials,
                                       behind=tuple(unshipped) + tuple(k for k in targets if k not in unshipped),
                                       left_to_jobs=left_to_jobs, error=_error(e),
                                       seconds=time.monotonic() - t0)

    # 2. states that lag the folder, grouped into one call per (state, tags)
    moves: dict[tuple[str, str], list[str]] = {}
    for k, t in targets.items():
        run = runs.get(k)
        if run is None or k in unshipped or run.status in (t.state, FINISHED) or states[k].live:
            continue  # a FINISHED run stays so; a live job writes its own states
        if t.state == FAILED and not (run.status == RUNNING or (run.status == SCHEDULED and t.gave_up)):
            continue
        moves.setdefault((t.state, t.error), []).append(k)
    moved: dict[str, str] = {}
    for (state, err), ks in moves.items():
        if time.monotonic() > deadline:
            unshipped += ks
            continue
        tags = {TAG_ERROR: err} if state in (FAILED, KILLED) and err else None
        try:
            ledger.set_status([runs[k].run_id for k in ks], state, tags=tags)
        except Exception as e:  # noqa: BLE001
            error = error or _error(e)
            unshipped += ks
            continue
        for k in ks:
            moved[k] = state
            runs[k] = dataclasses.replace(runs[k], status=state, error=err if tags else runs[k].error)

    # 3. remember the orchestrator-side facts now mirrored (or found mirrored), so status needs no MLflow to know
    # (moved, found in step, deliberately left: a FINISHED run, a FAILED claim on a run queued again; or without a
    # run to mirror it to)
    new_sync = {k: v for k, v in sync.items() if k in targets}
    for k, t in targets.items():
        if t.orchestrator and k not in unshipped and not states[k].live:
            new_sync[k] = t.fact
    if new_sync != sync:
        write_sync(sweep, new_sync)
    lagging = tuple(dict.fromkeys(unshipped))
    return ReconcileResult(shipped=shipped, shipped_trials=shipped_trials, moved=moved, behind=lagging,
                           left_to_jobs=left_to_jobs, missing=missing, error=error, seconds=time.monotonic() - t0,
                           runs=runs)

