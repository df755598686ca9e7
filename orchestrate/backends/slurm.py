"""``slurm``: submitit job arrays, one array task per trial.

Resources come from the cluster profile (partition, ``--gpus-per-node=a100:1``, memory, time limit, account, QOS,
setup lines, ``max_parallel``). A submission of *n* trials becomes ceil(*n* / ``MaxArraySize``) arrays (the
cluster's, read from ``scontrol show config``; indices 0..k-1, so k ≤ ``MaxArraySize``), each its own submission
record: its job name is ``orch.<sweep>.<submission id>`` and task *i* runs ``keys[i]`` of
``<sweep>/submissions/<id>.json`` (written before ``sbatch``), so ``resume`` maps live tasks back to trials even
when the submitting process died before it recorded the job id.

One ``max_parallel`` for the whole sweep, across its arrays and across ``resume`` calls: each array's
``ArrayTaskThrottle`` is its fair share, moved under the sweep's lock so that no state ever lets more than
``max_parallel`` tasks run (:mod:`orchestrate.backends.slurm_throttle`).

Preemption and time limits: SLURM sends USR2 ``signal_delay_s`` before the limit (and on preemption). The trainer
receives it, checkpoints at the next step and exits ``EXIT_PREEMPTED`` (see :mod:`asr_core.contract.trial`); the
task then requeues itself (``scontrol requeue``) and, when it starts again, the trainer resumes from its checkpoint
in the same MLflow run. A 65-hour trial therefore survives a 48-hour limit. SIGTERM (``scancel``, ``scontrol
requeue``, a node going down) also makes the trainer checkpoint; SLURM itself decides whether the job comes back,
and ``resume`` resubmits it if not. Requeueing is the task's own (``scontrol requeue``), never submitit's
timeout handling, which the task's signal forwarding replaces.

How the trainer ended decides the rest (:func:`orchestrate.backends.runner.trainer_ended`): killed by a signal (out of
memory, the system) or an exit code the trial job never uses → ``killed`` is recorded in ``attempts.jsonl`` and the
trainer's lease freed; ``EXIT_FENCED`` (another live trainer holds the lease) → the holder is named in the log, and
nothing else happens; ``EXIT_CANCELLED``, or a ``CANCELLED`` file in the trial folder → never requeued. What a
``resume`` does with a failed or killed trial is the failure budget's call (:mod:`orchestrate.dispatch.dispatch`).

How jobs that ended without a word ended is read from the accounting (``sacct``, one call for many jobs:
:meth:`SlurmBackend.job_ends`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from asr_core.contract.trial import (ENV_JOB_ID, EXIT_OK, EXIT_PREEMPTED, FAILED, OUTCOME_FAILED, TAG_ERROR,
                                     TrialFolder, error_line, mark_run, record_attempt, trial_command)
from asr_core.contract.folder.segments import read_segments
from orchestrate.backends import slurm_commands
from orchestrate.backends.base import Backend, BackendError, Job, JobEnd, OnSubmitted
from orchestrate.plan.profile import Profile
from orchestrate.backends.slurm_throttle import BACKEND, SweepThrottle, hand_on_slot
from orchestrate.budget.resources import Resources, group_by_resources, trial_resources
from orchestrate.backends.runner import TrialProcess, install_forwarding, trainer_ended
from orchestrate.sweep.folder import Submission, SweepDir


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


def _mark_failed(uri: str, run_id: str, error: str) -> None:
    """FAILED with the error's last line, as the trial job itself would have recorded it; a ledger that does not
    answer is reported, never raised (the folder's ``failed`` attempt is mirrored by the next status or resume)."""
    try:
        mark_run(uri, run_id, FAILED, {TAG_ERROR: error_line(error)})
    except Exception as e:  # noqa: BLE001 - the error that stopped the trainer is the one to raise
        print(f"[orchestrate] cannot mark run {run_id} FAILED in {uri} ({type(e).__name__}: {e})", flush=True)


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

    name = BACKEND
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
        return profile_executor(self.sweep.path / "slurm" / sub_id, p, res, job_name=self.sweep.job_name(sub_id),
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
                               f"`{self.sweep.command('resume')}` retries") from None
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
