"""``orchestrate cancel``: stop a sweep for good, with or without its tracker, even when its own files do not read.

Under the sweep's lock (taken before ``sweep.json`` and ``trials.json`` are read), ``cancel`` writes ``CANCELLED``
into every unfinished trial folder first (a job that starts meanwhile exits at once), then cancels the live jobs
(their trainers checkpoint, find the marker and end KILLED, never requeued), then marks the runs KILLED.

* **It asks first** (:func:`confirmed`) when a whole sweep is cancelled from a terminal; ``--yes`` skips the question,
  and neither ``--where`` (a part) nor a run without a terminal (scripts, tests) asks.
* **Without the tracker.** ``cancel --offline``, or the default when the sweep's MLflow does not answer (a line says
  so): the folders are marked and the jobs stopped all the same; the runs are left as they are, and the next command
  that reaches MLflow (``status``, ``resume``, ``submit``, ``retry``) marks them KILLED from the folders
  (:func:`orchestrate.ledger.reconcile.reconcile_ledger`; ``status`` shows the ledger behind until then).
* **While a local sweep runs.** The command running a local sweep holds its lock: ``cancel`` then writes the markers
  without the lock and sends SIGTERM to the trainers whose leases name this machine (they end ``cancelled``; the
  Tune driver skips trials not yet started), and that command ends by itself.
* **An unreadable sweep file** (:class:`~orchestrate.sweep.folder.SweepFileError`): what can be found without it is
  still stopped: every trial folder under ``trials/`` is marked, the SLURM jobs named after the sweep's submissions
  (``orch.<sweep>.<submission id>``, from the file names in ``submissions/``) are cancelled, trainers leased on this
  machine are told to stop. The command then exits 2 naming the file and how to restore it; the runs are marked
  KILLED by the first command after the file is restored.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Collection

from asr_core.contract.trial import FINISHED, KILLED, TAG_ERROR, TrialFolder
from orchestrate.backends import make_backend
from orchestrate.backends.base import Backend, BackendError
from orchestrate.plan.profile import load_profile
from orchestrate.ledger.ledger import Ledger, LedgerError, SweepOwnershipError
from orchestrate.ledger.store import check_tracking_uri
from orchestrate.sweep.folder import Manifest, SweepBusy, SweepDir, SweepError, SweepFileError
from orchestrate.sweep.trial import Trial
from orchestrate.sweep.trial_state import FolderState, read_folder_states

CANCELLED_ERROR = "cancelled"  # trial.error of a run that `cancel` ended KILLED (as reconciliation writes it)
CATCH_UP = "the next command that reaches it (status, resume) marks the runs KILLED from the trial folders"


def log(msg: str) -> None:
    print(f"[orchestrate] {msg}", file=sys.stderr, flush=True)


def _ask(prompt: str) -> str:
    """``prompt`` on stderr (stdout may be piped), then one line of the terminal ("" at its end)."""
    print(prompt, end="", file=sys.stderr, flush=True)
    return sys.stdin.readline()


def confirmed(sweep: SweepDir, ask: Callable[[str], str] = _ask) -> bool:
    """Before a whole sweep is cancelled: on a terminal, ask (``y`` goes on; anything else, end of input or Ctrl-C
    cancels nothing and says so); without one (a script, a test, a pipe) go on as asked. ``--yes`` and ``--where``
    do not come here."""
    if not sys.stdin.isatty():
        return True
    keys = sweep.trial_keys_on_disk()
    unfinished = sum(not TrialFolder(sweep.trial_dir(k)).done.exists() for k in keys)
    try:
        answer = ask(f"cancel sweep {sweep.name!r} for good: its {unfinished} unfinished trials end KILLED (retry "
                     "--cancelled starts them again); --where cancels a part. Go on? [y/N] ")
    except (EOFError, KeyboardInterrupt):
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("\norchestrate cancel: nothing cancelled (answer y to go on, or pass --yes)", file=sys.stderr)
    return False


def cancel(sweep: SweepDir, read: Callable[[], Manifest], select: Callable[[Trial], bool] | None = None, *,
           offline: bool = False) -> str:
    """Cancel ``sweep`` (the trials ``select`` accepts; None: all) and return the line that says what was done.
    ``read``: the caller's reading of the manifest (it refuses a second tracking URI). ``offline``: leave MLflow
    alone. Raises :class:`SweepFileError` (after stopping what it could find) for an unreadable sweep file,
    :class:`SweepError` for a selection that matches nothing or a busy cluster sweep."""
    try:
        with sweep.lock("cancel"):
            try:
                manifest = read()
                trials = sweep.read_trials()
            except SweepFileError:
                _unreadable(sweep, select)
                raise
            only = _only(sweep, trials, select)
            ledger = None if offline else _ledger(manifest, sweep)
            if offline:
                log(f"cancel --offline: MLflow is left alone; {CATCH_UP}")
            backend = make_backend(manifest.backend, sweep, manifest.tracking_uri,
                                   load_profile(manifest.profile or None))
            job_ids = _cancel_locked(sweep, backend, ledger, [t.key for t in trials], only)
    except SweepBusy as busy:
        try:
            manifest = read()
            trials = sweep.read_trials() if manifest.backend == "local" else []
        except SweepFileError:
            _unreadable(sweep, select)
            raise
        if manifest.backend != "local":
            raise
        only = _only(sweep, trials, select)
        _cancel_while_run(sweep, busy.holder, [t.key for t in trials], only)
        job_ids = []
    which = (f" ({len(only)} of {len(trials)} models and evaluation jobs match --where)" if only is not None else "")
    return (f"sweep {sweep.name}: cancelled {len(job_ids)} jobs{which}; unfinished trials end KILLED (retry "
            "--cancelled starts them again)")


def _unreadable(sweep: SweepDir, select: Callable[[Trial], bool] | None) -> None:
    if select is not None:
        log("--where cannot be told without the sweep's files: nothing was cancelled")
    else:
        cancel_unreadable(sweep)


def _only(sweep: SweepDir, trials: list[Trial], select: Callable[[Trial], bool] | None) -> set[str] | None:
    if select is None:
        return None
    only = {t.key for t in trials if select(t)}
    if not only:
        raise SweepError(f"--where matches none of the {len(trials)} models and evaluation jobs of sweep "
                         f"{sweep.name!r}; nothing cancelled")
    return only


def _ledger(manifest: Manifest, sweep: SweepDir) -> Ledger | None:
    """The sweep's ledger, or None (and a line saying so) when MLflow does not answer: the cancel goes on without
    it. A ledger that answers but belongs to another sweep folder is refused (its runs are not ours to kill)."""
    try:
        check_tracking_uri(manifest.tracking_uri)
        ledger = Ledger(manifest.tracking_uri, manifest.name)
        ledger.check_owner(manifest.sweep_id, str(sweep.path), adopt=True)
        return ledger
    except SweepOwnershipError:
        raise
    except LedgerError as e:
        log(f"MLflow does not answer ({e}); cancelling without it, as `cancel --offline`: {CATCH_UP}")
        return None


def _cancel_locked(sweep: SweepDir, backend: Backend, ledger: Ledger | None, keys: list[str],
                   only: Collection[str] | None) -> list[str]:
    """Under the lock: the markers, then the live jobs, then the runs (when ``ledger``); the cancelled job ids."""
    keys = [k for k in keys if only is None or k in only]
    states = read_folder_states(sweep, keys)
    unfinished, marked = _mark(sweep, states)
    live = {k: j for k, j in backend.live_jobs().items() if only is None or k in only}
    job_ids = sorted(set(live.values()))
    if job_ids:
        backend.cancel(job_ids)
    if ledger is None:
        log(f"cancelled {len(job_ids)} jobs; {marked} trial folders marked CANCELLED; the runs are not marked yet")
        return job_ids
    try:
        runs = ledger.trial_runs()
        kill = [runs[k].run_id for k in unfinished if k in runs and runs[k].status not in (KILLED, FINISHED)]
        ledger.set_status(kill, KILLED, tags={TAG_ERROR: CANCELLED_ERROR})
    except Exception as e:  # noqa: BLE001 - the cancel itself is done: the folders hold it, the ledger follows
        log(f"cancelled {len(job_ids)} jobs and marked {marked} trial folders CANCELLED, but the ledger could "
            f"not be written ({e}); {CATCH_UP}")
        return job_ids
    log(f"cancelled {len(job_ids)} jobs; {marked} trial folders marked CANCELLED; {len(kill)} runs marked KILLED")
    return job_ids


def _mark(sweep: SweepDir, states: dict[str, FolderState]) -> tuple[list[str], int]:
    """``CANCELLED`` into the folder of every unfinished trial of ``states``: (the unfinished keys, how many folders
    were marked now)."""
    unfinished = [k for k, fs in states.items() if not fs.done]
    return unfinished, sum(sweep.cancel_trial(k, "orchestrate cancel") for k in unfinished)


def _signal_local_trainers(states: dict[str, FolderState]) -> int:
    """SIGTERM to the trainers of ``states`` whose live lease names this machine; how many were signalled."""
    here, signalled = socket.gethostname(), 0
    for fs in states.values():
        lease = fs.lease
        if fs.done or not fs.live or lease is None or lease.host != here or lease.pid <= 0:
            continue
        try:
            os.kill(lease.pid, signal.SIGTERM)
            signalled += 1
        except ProcessLookupError:
            pass
    return signalled


def _cancel_while_run(sweep: SweepDir, holder: str, keys: list[str], only: Collection[str] | None = None) -> None:
    """Cancel a local sweep while the command that runs it (and holds its lock) goes on: ``CANCELLED`` in every
    unfinished trial folder (what the trial job and the Tune driver read: a trial not yet started is skipped), then
    SIGTERM to the trainers that hold a lease on this machine (each checkpoints and ends its run KILLED, exit 77).
    The running command then ends; ``status`` and ``resume`` mirror the runs that never started."""
    keys = [k for k in keys if only is None or k in only]
    states = read_folder_states(sweep, keys)
    _, marked = _mark(sweep, states)
    signalled = _signal_local_trainers(states)
    log(f"sweep {sweep.name} is being run ({holder or 'another process'}): {marked} trial folders marked "
        f"CANCELLED, {signalled} running trainers told to stop (each checkpoints and ends KILLED); that command "
        "ends when they have")


def cancel_unreadable(sweep: SweepDir) -> None:
    """What ``cancel`` still does when a sweep file does not read: mark every unfinished trial folder under
    ``trials/``, cancel the SLURM jobs named after the sweep's submissions, tell trainers leased on this machine
    to stop; one line says what was done and what could not be."""
    states = read_folder_states(sweep, sweep.trial_keys_on_disk())
    _, marked = _mark(sweep, states)
    signalled = _signal_local_trainers(states)
    names = [sweep.job_name(i) for i in _cluster_submissions(sweep)]
    slurm = ""
    if names and shutil.which("squeue") is None:
        slurm = f"; {len(names)} submissions may hold SLURM jobs, but squeue is not on PATH here: cancel them " \
                f"with `scancel --name` (names orch.{sweep.name}.<submission id>)"
    elif names:
        from orchestrate.backends import slurm_commands

        try:
            job_ids = sorted({q.job_id for q in slurm_commands.squeue(names)})
            if job_ids:
                slurm_commands.scancel(job_ids)
            slurm = f", {len(job_ids)} SLURM jobs named orch.{sweep.name}.* cancelled"
        except BackendError as e:
            slurm = f"; SLURM could not be asked for the sweep's jobs ({e}): cancel them with `scancel --name`"
    log(f"sweep {sweep.name}: its files do not all read; {marked} trial folders marked CANCELLED, {signalled} "
        f"trainers on this machine told to stop{slurm}; the runs in MLflow are not marked: once the file is "
        "restored, `orchestrate status` marks them KILLED")


def _cluster_submissions(sweep: SweepDir) -> list[str]:
    """Ids of the submissions that may hold SLURM jobs: every one whose record is unreadable or not local."""
    out = []
    for sub_id in sweep.submission_ids():
        try:
            if sweep.submission(sub_id).data.get("backend") == "local":
                continue
        except (SweepFileError, OSError):
            pass
        out.append(sub_id)
    return out
