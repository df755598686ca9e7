"""``slurm``: submitit job arrays, one array task per trial.

Resources come from the cluster profile (partition, ``--gpus-per-node=a100:1``, memory, time limit, account, QOS,
setup lines, ``max_parallel``). A submission of *n* trials becomes ceil(*n* / ``MaxArraySize``) arrays (the
cluster's, read from ``scontrol show config``; indices 0..k-1, so k ≤ ``MaxArraySize``), each its own submission
record: its job name is ``orch.<sweep>.<submission id>`` and task *i* runs ``keys[i]`` of
``<sweep>/submissions/<id>.json`` (written before ``sbatch``), so ``resume`` maps live tasks back to trials even
when the submitting process died before it recorded the job id.

One ``max_parallel`` for the whole sweep (:class:`SweepThrottle`), across its arrays and across ``resume`` calls: each
array's ``ArrayTaskThrottle`` is its share, and the shares never add up to more than ``max_parallel``. The shares
are fair (each array with work gets one slot in turn, older arrays first); an array whose share is 0 is held. They
move only under a lock (``<sweep>/slurm/throttle.lock``) and always lower before they raise, checking ``squeue``
in between, so no state ever lets more than ``max_parallel`` tasks run: a submission (``resume`` included) gives new
arrays only the slots nobody holds, and each array task that ends for good hands its slot on as it ends (to an
array below its share: that array's pending tasks wait on ``--dependency=afterany:<ending task>``, so it starts
nothing before the ending task has left RUNNING). A task that requeues itself keeps its slot; a pending, held,
suspended or requeued task is never cancelled or lost, only held back. ``resume`` (any reconciliation) rebalances
too, so an array a crashed submitter left held gets its slots.

Preemption and time limits: SLURM sends USR2 ``signal_delay_s`` before the limit (and on preemption). The trainer
receives it, checkpoints at the next step and exits ``EXIT_PREEMPTED`` (see :mod:`asr_core.contract.trial`); the
task then requeues itself (``scontrol requeue``) and, when it starts again, the trainer resumes from its checkpoint
in the same MLflow run. A 65-hour trial therefore survives a 48-hour limit. SIGTERM (``scancel``, ``scontrol
requeue``, a node going down) also makes the trainer checkpoint; SLURM itself decides whether the job comes back,
and ``resume`` resubmits it if not. Requeueing is the task's own (``scontrol requeue``), never submitit's
timeout handling, which the task's signal forwarding replaces.

How the trainer ended decides the rest (:func:`orchestrate.runner.trainer_ended`): killed by a signal (out of
memory, the system) or an exit code the trial job never uses → ``killed`` is recorded in ``attempts.jsonl`` and the
trainer's lease freed; ``EXIT_FENCED`` (another live trainer holds the lease) → the holder is named in the log, and
nothing else happens; ``EXIT_CANCELLED``, or a ``CANCELLED`` file in the trial folder → never requeued. What a
``resume`` does with a failed or killed trial is the failure budget's call (:mod:`orchestrate.dispatch`).

How jobs that ended without a word ended is read from the accounting (``sacct``, one call for many jobs:
:meth:`SlurmBackend.job_ends`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterator

from asr_core.contract.trial import (ENV_JOB_ID, EXIT_OK, EXIT_PREEMPTED, FAILED, OUTCOME_FAILED, TAG_ERROR,
                                     TrialFolder, error_line, mark_run, read_segments, record_attempt, trial_command)
from orchestrate.backends import slurm_commands
from orchestrate.backends.base import Backend, BackendError, Job, JobEnd, OnSubmitted
from orchestrate.backends.profile import Profile
from orchestrate.budget.resources import Resources, group_by_resources, trial_resources
from orchestrate.backends.slurm_commands import ArrayRow
from orchestrate.runner import TrialProcess, install_forwarding, trainer_ended
from orchestrate.sweep import Submission, SweepDir


class TrialTask:
    """What each array task runs (pickled by submitit): look up its trial, run it, requeue on USR2."""

    def __init__(self, sweep_path: str, sub_id: str) -> None:
        self.sweep_path = sweep_path
        self.sub_id = sub_id

    def __call__(self) -> int:
        # submitit submits a lone job (no array) when a submission holds a single trial: that is task 0.
        index = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
        array = os.environ.get("SLURM_ARRAY_JOB_ID")
        job_id = f"{array}_{index}" if array else os.environ.get("SLURM_JOB_ID", "?")
        path = Path(self.sweep_path)
        sweep = SweepDir(path.parent, path.name)
        comes_back = False
        try:
            return self.run(sweep, index, job_id)
        except SystemExit as e:
            comes_back = e.code == EXIT_PREEMPTED  # requeued (or SLURM decides): the task keeps its slot
            raise
        finally:
            if not comes_back:
                hand_on_slot(sweep, job_id)

    def run(self, sweep: SweepDir, index: int, job_id: str) -> int:
        """Run trial ``index`` of the submission as job ``job_id``; requeue on USR2."""
        manifest = sweep.read_manifest()
        sub = sweep.submission(self.sub_id)
        key, run_id = sub.keys[index], sub.data["run_ids"][index]
        folder = TrialFolder(sweep.trial_dir(key))
        before = len(read_segments(folder.path))
        try:
            child = TrialProcess(trial_command(folder.path, manifest.tracking_uri, run_id),
                                 manifest.workdir or Path.cwd(), folder.log, env={ENV_JOB_ID: job_id})
        except Exception as e:  # the trainer could not even start: say so in the folder and the ledger
            why = f"{type(e).__name__}: {e}"
            record_attempt(folder.path, OUTCOME_FAILED, f"the trainer could not start: {why}", job_id=job_id,
                           by="task")
            _mark_failed(manifest.tracking_uri, run_id, why)
            raise
        install_forwarding(child, (signal.SIGUSR2, signal.SIGTERM))
        print(f"[orchestrate] task {job_id}: trial {key} of {manifest.name}, trainer pid {child.proc.pid}",
              flush=True)
        rc = child.wait()
        end = trainer_ended(folder.path, rc, job_id=job_id, pid=child.proc.pid, segments_before=before,
                            log_path=folder.log)
        print(f"[orchestrate] task {job_id}: {end.message}", flush=True)
        if end.kind == "finished":
            return EXIT_OK
        if end.kind in ("cancelled", "fenced"):
            return EXIT_OK  # nothing to requeue: the task ends, the trial folder says why
        if end.kind == "preempted":
            if child.signalled == signal.SIGUSR2:
                # Time limit or preemption notice: the checkpoint is written; come back in a fresh allocation.
                print(f"[orchestrate] task {job_id}: checkpointed after USR2; requeueing", flush=True)
                slurm_commands.requeue(job_id)
            else:
                print(f"[orchestrate] task {job_id}: checkpointed after SIGTERM; SLURM decides about requeue",
                      flush=True)
            sys.exit(EXIT_PREEMPTED)  # SystemExit: submitit writes no result, so the task is not "done"
        raise RuntimeError(f"trial {key}: {end.message}")


def hand_on_slot(sweep: SweepDir, job_id: str) -> None:
    """An array task that ends for good gives its slot of the sweep's ``max_parallel`` to an array below its share
    (:meth:`SweepThrottle.rebalance`); a failure is printed, never raised (the slot then stays with the task's own
    array until the next task ends, or ``resume``)."""
    try:
        SweepThrottle(sweep).rebalance(ending=job_id)
    except Exception as e:  # noqa: BLE001 - the trial's own outcome is what the task reports
        print(f"[orchestrate] task {job_id}: could not hand its slot of the sweep's max_parallel on "
              f"({type(e).__name__}: {e}); the next task that ends, or `orchestrate resume`, does", flush=True)


def _mark_failed(uri: str, run_id: str, error: str) -> None:
    """FAILED with the error's last line, as the trial job itself would have recorded it; a ledger that does not
    answer is reported, never raised (the folder's ``failed`` attempt is mirrored by the next status or resume)."""
    try:
        mark_run(uri, run_id, FAILED, {TAG_ERROR: error_line(error)})
    except Exception as e:  # noqa: BLE001 - the error that stopped the trainer is the one to raise
        print(f"[orchestrate] cannot mark run {run_id} FAILED in {uri} ({type(e).__name__}: {e})", flush=True)


# squeue states of a task that holds a slot (SLURM's throttle counts it) and of one that waits for one
RUNNING_STATES = ("RUNNING", "CONFIGURING", "SUSPENDED", "STOPPED")
PENDING_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD")
LOCK_WAIT_S = 300.0  # how long a rebalance waits for another (a submission of many arrays holds the lock seconds)


def fair_shares(demands: list[int], slots: int) -> list[int]:
    """``slots`` shared among arrays that want ``demands`` (oldest first): one slot to each array that still wants
    one, in turn, older arrays first, until the slots or the demands run out (max-min fair)."""
    out = [0] * len(demands)
    left = max(0, slots)
    while left > 0:
        gave = False
        for i, d in enumerate(demands):
            if left > 0 and out[i] < d:
                out[i] += 1
                left -= 1
                gave = True
        if not gave:
            break
    return out


@dataclass
class ArrayState:
    """One of the sweep's arrays (or lone jobs) as ``squeue`` shows it now."""

    sub_id: str
    running: list[str]  # job ids of its tasks that hold a slot
    pending: list[ArrayRow]  # its rows that wait (the array's pending rest, requeued tasks)
    throttle: int  # its ArrayTaskThrottle; 0: none (anything pending may start)
    lone: bool  # a submission of one trial: a plain job, no throttle (it needs one slot)
    held_by_us: bool  # the throttle holds its pending rows (its share is 0)

    @property
    def array_id(self) -> str:
        return (self.pending[0].array_id if self.pending else self.running[0].split("_", 1)[0])

    def n_pending(self) -> int:
        return sum(r.tasks() for r in self.pending)

    def n_running(self, gone: Collection[str] = ()) -> int:
        return sum(1 for j in self.running if j not in gone)

    def demand(self, gone: Collection[str] = ()) -> int:
        """Slots it could fill: its running tasks (less those ``gone``: ending, their slot handed on) and its pending
        ones."""
        return self.n_running(gone) + self.n_pending()

    def own(self, gone: Collection[str] = ()) -> int:
        """Slots it holds or may fill without asking anyone (the tasks ``gone`` gone): its running tasks, and as many
        more as its throttle lets start, never more than it has tasks (a requeued task was one of the running ones).
        Rows held by the throttle start nothing; rows held by their user count (the user may release them)."""
        r = self.n_running(gone)
        startable = sum(row.tasks() for row in self.pending if not (self.held_by_us and row.held))
        if self.lone:
            return min(1, r + startable)
        if self.throttle <= 0:
            return r + startable
        return min(max(self.throttle, r), r + startable)


def handed_on(arrays: list[ArrayState]) -> set[str]:
    """Running tasks whose slot another array already waits for (``afterany:<task>``): they are ending, and count
    no longer as their own array's work (else the next rebalance would give their slot back to it)."""
    running = {j for a in arrays for j in a.running}
    waited = {j for a in arrays for r in a.pending for g in r.gates() if g.startswith("afterany:")
              for j in g.split(":")[1:]}
    return waited & running


class SweepThrottle:
    """One ``max_parallel`` for all of a sweep's arrays (see the module docstring). State, under
    ``<sweep>/slurm/``: ``throttle.json`` (the sweep's ``max_parallel``, the throttle last set on each array, the
    arrays it holds) and ``throttle.lock``; SLURM's own ``squeue`` is the truth for what runs and waits."""

    def __init__(self, sweep: SweepDir) -> None:
        self.sweep = sweep
        self.dir = sweep.path / "slurm"
        self.state_path = self.dir / "throttle.json"
        self.moves: list[str] = []  # what this process changed, for the log

    # ---- state -----------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
        """The sweep's throttle lock (``flock``; compute nodes take it too), waited for up to ``wait_s``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "throttle.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise BackendError(f"sweep {self.sweep.name}: its throttle lock "
                                           f"({self.dir / 'throttle.lock'}) stayed busy for {wait_s:.0f}s") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def load(self) -> dict[str, Any]:
        try:
            d = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            d = {}
        return {"max_parallel": int(d.get("max_parallel", 0)), "throttle": dict(d.get("throttle", {})),
                "held": list(d.get("held", []))}

    def save(self, state: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_path)

    def arrays(self, state: dict[str, Any]) -> list[ArrayState]:
        """The sweep's arrays that SLURM still holds, oldest first."""
        subs = [s for s in self.sweep.submissions() if s.data.get("backend") == SlurmBackend.name]
        subs.sort(key=lambda s: (float(s.data.get("created", 0.0)), s.id))
        rows_by_name: dict[str, list[ArrayRow]] = {}
        for row in slurm_commands.array_rows([s.job_name() for s in subs]):
            rows_by_name.setdefault(row.name, []).append(row)
        out = []
        for sub in subs:
            rows = rows_by_name.get(sub.job_name(), [])
            running = [r.job_id for r in rows if r.state in RUNNING_STATES]
            pending = [r for r in rows if r.state in PENDING_STATES]
            if not running and not pending:
                continue
            lone = all(r.lone for r in rows)
            shown = [r.throttle() or 0 for r in pending if "[" in r.job_id]  # the pending rest shows "%N" (or none)
            if lone:
                throttle = 1
            elif shown:
                throttle = shown[0]
            elif sub.id in state["throttle"]:
                throttle = int(state["throttle"][sub.id])
            else:  # every task has started (or was requeued): ask one of them
                throttle = slurm_commands.array_throttle((running or [r.job_id for r in pending])[0])
            out.append(ArrayState(sub.id, running, pending, throttle, lone, sub.id in state["held"]))
        return out

    # ---- moves -------------------------------------------------------------------------------------------------------
    def _try(self, what: str, fn: Any, *args: Any) -> bool:
        """Run one SLURM move; note it (:meth:`_report`) or print why it failed. A failed move is never raised: the
        state is read again before anything is raised, so a move that did not happen only leaves a slot unused."""
        try:
            fn(*args)
        except BackendError as e:
            print(f"[orchestrate] sweep {self.sweep.name}: {what} failed: {e}", file=sys.stderr, flush=True)
            return False
        self.moves.append(what)
        return True

    def _report(self, m: int) -> None:
        if self.moves:
            print(f"[orchestrate] sweep {self.sweep.name} (max_parallel {m}): {'; '.join(self.moves)}",
                  file=sys.stderr, flush=True)
        self.moves = []

    def _lower(self, arrays: list[ArrayState], targets: dict[str, int], state: dict[str, Any]) -> None:
        """Every array down to its share: throttle lowered (running tasks above it go on), share 0 → held."""
        for a in arrays:
            share = targets.get(a.sub_id, 0)
            if not a.lone:
                want = max(1, share)
                if (a.throttle <= 0 or a.throttle > want) and self._try(
                        f"array {a.array_id} throttle {a.throttle or 'none'} -> {want}", slurm_commands.set_throttle,
                        a.array_id, want):
                    state["throttle"][a.sub_id] = want
            if share > 0 or not a.pending:
                continue
            if not a.held_by_us and all(r.held for r in a.pending):
                continue  # held by its user: theirs to release (it counts with its throttle meanwhile)
            if a.sub_id not in state["held"]:
                state["held"].append(a.sub_id)
                self.save(state)  # recorded before the hold: a later rebalance releases it even if this one dies
            for r in a.pending:
                if not r.held:
                    self._try(f"{r.expression()} held", slurm_commands.hold, r.expression())

    def _raise(self, arrays: list[ArrayState], targets: dict[str, int], state: dict[str, Any], free: int,
               ending: str | None = None, gated: int = 0, gone: Collection[str] = ()) -> int:
        """Arrays below their share get ``free`` slots (nobody holds them), then the ``gated`` slots of task
        ``ending`` (its array no longer counts it): an array given one of those waits on ``afterany:<ending>``.
        ``gone``: running tasks not to count as their arrays' (``ending``, and those whose slot was handed on).
        Returns the free slots left."""
        for a in arrays:
            share = targets.get(a.sub_id, 0)
            have = a.own(gone)
            need = share - have
            if need <= 0 or a.n_pending() == 0:
                continue
            allot = min(need, free + gated)
            if allot <= 0:
                break
            if allot > free:  # part of it is the ending task's slot: start nothing before that task has ended
                deps = sorted({g for r in a.pending for g in r.gates()} | {f"afterany:{ending}"})
                if not all(self._try(f"{r.expression()} waits for {ending} to end", slurm_commands.set_dependency,
                                     r.expression(), ",".join(deps)) for r in a.pending):
                    continue
            to = have + allot
            if not a.lone and to != a.throttle:
                if not self._try(f"array {a.array_id} throttle {a.throttle} -> {to}", slurm_commands.set_throttle,
                                 a.array_id, to):
                    continue
                state["throttle"][a.sub_id] = to
            if a.held_by_us:
                for r in a.pending:
                    if r.held:
                        self._try(f"{r.expression()} released", slurm_commands.release, r.expression())
                state["held"] = [h for h in state["held"] if h != a.sub_id]
            used_free = min(allot, free)
            free -= used_free
            gated -= allot - used_free
        return free

    def rebalance(self, ending: str | None = None) -> None:
        """Shares again for the sweep's arrays, as they are now (``ending``: the job id of a task that is ending for
        good; its slot goes to an array below its share, which starts nothing before that task has ended)."""
        with self.locked():
            state = self.load()
            m = state["max_parallel"]
            if m <= 0:
                if state["held"] or state["throttle"]:
                    self._unlimit(state)
                return
            arrays = self.arrays(state)
            live = {a.sub_id for a in arrays}
            state["held"] = [h for h in state["held"] if h in live]
            if not arrays:
                self.save(state)
                return
            gone = handed_on(arrays) | ({ending} if ending else set())
            targets = dict(zip([a.sub_id for a in arrays], fair_shares([a.demand(gone) for a in arrays], m)))
            self._lower(arrays, targets, state)
            arrays = self.arrays(state)  # after lowering: what may start now is known, and only shrinks
            free = m - sum(a.own() for a in arrays)
            gated = 0
            if ending is not None:
                mine = [a for a in arrays if ending in a.running]
                gated = mine[0].own() - mine[0].own({ending}) if mine else 0
            self._raise(arrays, targets, state, max(0, free), ending, gated, handed_on(arrays) | gone)
            self.save(state)
            self._report(m)

    def lift(self) -> None:
        """No ``max_parallel`` for the sweep from now on (a profile without one): throttles off, held arrays
        released."""
        with self.locked():
            state = self.load()
            if state["max_parallel"] > 0 or state["held"] or state["throttle"]:
                state["max_parallel"] = 0
                self._unlimit(state)

    def _unlimit(self, state: dict[str, Any]) -> None:
        """``max_parallel`` 0 (no limit): throttles off, the arrays the throttle held released."""
        for a in self.arrays(state):
            if not a.lone and a.throttle != 0:
                self._try(f"array {a.array_id} throttle {a.throttle} -> none", slurm_commands.set_throttle,
                          a.array_id, 0)
            if a.held_by_us:
                for r in a.pending:
                    if r.held:
                        self._try(f"{r.expression()} released", slurm_commands.release, r.expression())
        state["held"], state["throttle"] = [], {}
        self.save(state)
        self._report(0)

    def admit(self, new: list[tuple[str, int]], max_parallel: int, user_hold: bool = False) -> list[tuple[int, bool]]:
        """Make room for new arrays (``(submission id, trials)``, in submission order) and say how each starts:
        (throttle, held). Call it holding :meth:`locked`, and submit before letting go. Old arrays go down to their
        fair share at once (their running tasks go on: the slots come free as they end, and each hands its slot to
        an array below its share); the new ones start with the slots nobody holds, held when there are none.
        ``user_hold``: the profile submits them held (``additional: {hold: true}``): never released here, and each
        counts with its throttle (at least 1) until its user releases it."""
        state = self.load()
        state["max_parallel"] = max_parallel
        arrays = self.arrays(state)
        state["held"] = [h for h in state["held"] if h in {a.sub_id for a in arrays}]
        gone = handed_on(arrays)
        shares = fair_shares([a.demand(gone) for a in arrays] + [n for _, n in new], max_parallel)
        old, new_shares = dict(zip([a.sub_id for a in arrays], shares)), shares[len(arrays):]
        self._lower(arrays, old, state)
        arrays = self.arrays(state)
        free = self._raise(arrays, old, state, max(0, max_parallel - sum(a.own() for a in arrays)),
                           gone=handed_on(arrays))
        out = []
        for (sub_id, _), share in zip(new, new_shares):
            allot = min(share, free)
            free -= allot
            throttle = allot if allot > 0 else max(1, share)
            state["throttle"][sub_id] = throttle
            held = allot == 0 and not user_hold
            if held:
                state["held"].append(sub_id)
            out.append((throttle, held))
        self.save(state)
        self._report(max_parallel)
        return out


def profile_executor(folder: Path, p: Profile, res: Resources, *, job_name: str, comment: str, parallelism: int,
                     hold: bool = False, signal_delay_s: int | None = None) -> object:
    """The submitit executor of one job array under profile ``p`` with ``res`` (time, ``--time-min``, memory): the
    one place the profile's partition, account, QoS, GPUs, CPUs, setup lines and extra sbatch options become
    parameters (for the arrays of :class:`SlurmBackend`: trials and evaluation jobs alike). ``signal_delay_s``:
    USR2 that long before the limit (None: submitit's default); tasks are requeued on node failure (``--requeue``)."""
    import submitit

    ex = submitit.SlurmExecutor(folder=folder)
    additional: dict[str, object] = {"requeue": True, **dict(p.additional)}
    if hold:
        additional["hold"] = True
    if res.start_min:
        additional["time-min"] = res.start_min
    params: dict[str, object] = {"job_name": job_name, "time": res.time_min, "cpus_per_task": max(1, p.cpus_per_task),
                                 "array_parallelism": parallelism, "comment": comment, "stderr_to_stdout": True,
                                 "additional_parameters": additional}
    if signal_delay_s is not None:
        params["signal_delay_s"] = signal_delay_s
    for k in ("partition", "account", "qos"):
        if getattr(p, k):
            params[k] = getattr(p, k)
    if p.gpus_per_node:
        params["gpus_per_node"] = p.gpus_per_node
    if res.mem_mb:
        params["mem"] = f"{res.mem_mb}MB"
    if p.setup:
        params["setup"] = list(p.setup)
    ex.update_parameters(**params)
    return ex


class SlurmBackend(Backend):
    """submitit job arrays that fit the cluster, one ``max_parallel`` for the sweep; SLURM holds the jobs,
    ``submit`` returns once they are queued."""

    name = "slurm"
    many_hosts = True
    task_class: type = TrialTask  # what each array task runs (tests swap in a trivial one)

    def validate(self) -> None:
        slurm_commands.check_cluster(self.profile)
        slurm_commands.max_array_size()  # before any run is created: a cluster that cannot say fails here
        if self.profile.time_rule and not self.profile.time_max:
            slurm_commands.partition_max_minutes(self.profile.partition)  # the cap of the trials' time limits

    # ---- submission -------------------------------------------------------------------------------------------------
    def _executor(self, sub_id: str, n: int, parallelism: int = 0, hold: bool = False,
                  res: Resources | None = None) -> object:
        p = self.profile
        res = res or Resources(p.time_limit_min(), mem_mb=int(float(p.mem_gb or 0) * 1024))
        # max_num_timeout is not set: it counts submitit's own timeout requeues, which TrialTask replaces with its own
        return profile_executor(self.sweep.path / "slurm" / sub_id, p, res, job_name=f"orch.{self.sweep.name}.{sub_id}",
                                comment=f"orchestrate sweep={self.sweep.name} submission={sub_id}",
                                parallelism=parallelism or n, hold=hold, signal_delay_s=p.signal_delay_s)

    def submit(self, jobs: list[Job], on_submitted: OnSubmitted) -> None:
        """One array per ``MaxArraySize`` trials, each its own submission record; with ``max_parallel``, under the
        sweep's throttle lock: new arrays get the slots the sweep's other arrays leave (:meth:`SweepThrottle.admit`)."""
        size = max(1, slurm_commands.max_array_size())
        res = self.resources(jobs)
        chunks: list[list[Job]] = []
        kinds: list[Resources] = []
        for r, group in group_by_resources(jobs, res):
            for i in range(0, len(group), size):
                chunks.append(group[i:i + size])
                kinds.append(r)
        subs = [self.sweep.new_submission(self.name, [j.trial.key for j in c], {j.trial.key: j.run_id for j in c})
                for c in chunks]
        m = self.profile.max_parallel
        throttle = SweepThrottle(self.sweep)
        if m <= 0:  # no limit: none on the sweep's older arrays either
            throttle.lift()
            self._submit_arrays(subs, chunks, [(0, False)] * len(chunks), kinds, on_submitted)
            return
        with throttle.locked():
            user_hold = bool(dict(self.profile.additional).get("hold"))
            starts = throttle.admit([(s.id, len(c)) for s, c in zip(subs, chunks)], m, user_hold)
            self._submit_arrays(subs, chunks, starts, kinds, on_submitted)

    def resources(self, jobs: list[Job]) -> dict[str, Resources]:
        """{trial key: what its task asks for} under the profile (:mod:`orchestrate.budget.resources`): fixed
        values, or each trial's own from its estimate, capped at ``time_max`` or the partition's ``MaxTime``.
        BackendError (before anything is submitted) when the estimate cannot be made."""
        from orchestrate.budget.estimate import EstimateError

        p = self.profile
        cap = None
        if p.time_rule and not p.time_max:
            cap = slurm_commands.partition_max_minutes(p.partition)
        try:
            return trial_resources([j.trial for j in jobs], p, cap)
        except EstimateError as e:
            raise BackendError(f"profile {p.name!r} asks each trial's time or memory from its estimate, which "
                               f"cannot be made: {e}; nothing was submitted") from None

    def _submit_arrays(self, subs: list[Submission], chunks: list[list[Job]], starts: list[tuple[int, bool]],
                       kinds: list[Resources], on_submitted: OnSubmitted) -> None:
        queued: list[str] = []
        for i, (sub, chunk, (parallelism, held), res) in enumerate(zip(subs, chunks, starts, kinds)):
            queued.append(self._submit_array(sub, chunk, parallelism, held, queued, i, len(chunks), res))
            on_submitted({k: self.task_job_id(sub, n) for n, k in enumerate(sub.keys)})

    def _submit_array(self, sub: Submission, jobs: list[Job], parallelism: int, hold: bool, queued: list[str],
                      i: int, n_arrays: int, res: Resources | None = None) -> str:
        ex = self._executor(sub.id, len(jobs), parallelism, hold, res)
        task = self.task_class(str(self.sweep.path), sub.id)
        t0 = time.perf_counter()
        try:
            with ex.batch():  # type: ignore[attr-defined]
                handles = [ex.submit(task) for _ in jobs]  # type: ignore[attr-defined]
        except Exception as e:  # submitit raises plain exceptions carrying sbatch's message
            done = (f"arrays {', '.join(queued)} ({i} of {n_arrays}) are queued, the other " if queued
                    else "nothing was submitted, the ")
            raise BackendError(f"sbatch failed for sweep {self.sweep.name}: {e}; {done}runs stay SCHEDULED and "
                               f"`orchestrate resume {self.sweep.name}` retries") from None
        array_id = handles[0].job_id.split("_")[0]
        sub.record_job(array_id)
        limit = f", at most {parallelism} at once" if parallelism else ""
        asks = f", {res.describe()}" if res is not None else ""
        print(f"[orchestrate] slurm: job array {array_id} with {len(jobs)} tasks ({time.perf_counter() - t0:.2f}s)"
              f"{asks}{limit}{', held until the sweep has a free slot' if hold else ''}; logs in "
              f"{self.sweep.path / 'slurm' / sub.id}", file=sys.stderr, flush=True)
        return array_id

    # ---- reconciliation ---------------------------------------------------------------------------------------------
    def live_jobs(self, settle_s: float = 90.0) -> dict[str, str]:
        subs = {s.job_name(): s for s in self.sweep.submissions() if s.data.get("backend") == self.name}
        live: dict[str, str] = {}
        for job_id, name, _state in slurm_commands.settled_squeue(list(subs), settle_s):
            sub = subs.get(name)
            if sub is None:
                continue
            idx = job_id.split("_", 1)[1] if "_" in job_id else "0"  # a lone job (one trial) is task 0
            if not idx.isdigit():
                continue
            i = int(idx)
            if i < len(sub.keys):
                live[sub.keys[i]] = job_id
        if subs:
            self._rebalance()
        return live

    def _rebalance(self) -> None:
        """Shares again (``resume``, ``cancel``): an array a crashed submitter left held gets its slots. Reported,
        never raised: what is live is the answer asked for."""
        try:
            SweepThrottle(self.sweep).rebalance()
        except Exception as e:  # noqa: BLE001
            print(f"[orchestrate] sweep {self.sweep.name}: could not rebalance its arrays' throttles "
                  f"({type(e).__name__}: {e})", file=sys.stderr, flush=True)

    def cancel(self, job_ids: list[str]) -> None:
        slurm_commands.scancel(job_ids)

    def job_ends(self, job_ids: list[str]) -> dict[str, JobEnd | None]:
        return slurm_commands.job_ends(job_ids)

    def task_job_id(self, sub: Submission, index: int) -> str:
        """``<array>_<index>``, or the lone job's id: submitit submits a submission of one trial as a plain job."""
        return str(sub.job_id) if len(sub.keys) == 1 else f"{sub.job_id}_{index}"
