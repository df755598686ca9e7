"""``slurm``: one submitit job array per submission, one array task per trial.

Resources come from the cluster profile (partition, ``--gpus-per-node=a100:1``, memory, time limit, account, QOS,
setup lines, ``%`` parallelism). The array's job name is ``orch.<sweep>.<submission id>`` and task *i* runs
``keys[i]`` of ``<sweep>/submissions/<id>.json`` (written before ``sbatch``), so ``resume`` maps live tasks back to
trials even when the submitting process died before it recorded the job id.

Preemption and time limits: SLURM sends USR2 ``signal_delay_s`` before the limit (and on preemption). The trainer
receives it, checkpoints at the next step and exits ``EXIT_PREEMPTED`` (see :mod:`asr_core.trial_contract`); the
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

import os
import signal
import sys
import time
from pathlib import Path

from asr_core.trial_contract import (ENV_JOB_ID, EXIT_OK, EXIT_PREEMPTED, FAILED, OUTCOME_FAILED, TAG_ERROR,
                                     TrialFolder, error_line, mark_run, read_segments, record_attempt, trial_command)
from orchestrate.backends import slurm_commands
from orchestrate.backends.base import Backend, BackendError, Job, JobEnd, OnSubmitted
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


class SlurmBackend(Backend):
    """One submitit job array per submission; SLURM holds the jobs, ``submit`` returns once they are queued."""

    name = "slurm"
    many_hosts = True
    task_class: type = TrialTask  # what each array task runs (the benchmark swaps in a trivial one)

    def validate(self) -> None:
        slurm_commands.check_cluster(self.profile)

    # ---- submission -------------------------------------------------------------------------------------------------
    def _executor(self, sub_id: str, n: int) -> object:
        import submitit

        p = self.profile
        # max_num_timeout is not set: it counts submitit's own timeout requeues, which TrialTask replaces with its own
        ex = submitit.SlurmExecutor(folder=self.sweep.path / "slurm" / sub_id)
        params: dict[str, object] = {
            "job_name": f"orch.{self.sweep.name}.{sub_id}",
            "time": p.time_limit_min(),
            "cpus_per_task": max(1, p.cpus_per_task),
            "signal_delay_s": p.signal_delay_s,
            "array_parallelism": p.max_parallel or n,
            "comment": f"orchestrate sweep={self.sweep.name} submission={sub_id}",
            "stderr_to_stdout": True,
            # node failures bring the task back; our own USR2 path requeues explicitly
            "additional_parameters": {"requeue": True, **dict(p.additional)},
        }
        if p.partition:
            params["partition"] = p.partition
        if p.account:
            params["account"] = p.account
        if p.qos:
            params["qos"] = p.qos
        if p.gpus_per_node:
            params["gpus_per_node"] = p.gpus_per_node
        if p.mem_gb:
            params["mem"] = f"{int(p.mem_gb * 1024)}MB"
        if p.setup:
            params["setup"] = list(p.setup)
        ex.update_parameters(**params)
        return ex

    def submit(self, jobs: list[Job], on_submitted: OnSubmitted) -> None:
        keys = [j.trial.key for j in jobs]
        sub = self.sweep.new_submission(self.name, keys, {j.trial.key: j.run_id for j in jobs})
        ex = self._executor(sub.id, len(jobs))
        task = self.task_class(str(self.sweep.path), sub.id)
        t0 = time.perf_counter()
        try:
            with ex.batch():  # type: ignore[attr-defined]
                handles = [ex.submit(task) for _ in jobs]  # type: ignore[attr-defined]
        except Exception as e:  # submitit raises plain exceptions carrying sbatch's message
            raise BackendError(f"sbatch failed for sweep {self.sweep.name}: {e}; nothing was submitted, the "
                               f"runs stay SCHEDULED and `orchestrate resume {self.sweep.name}` retries") from None
        job_ids = {k: h.job_id for k, h in zip(keys, handles)}
        array_id = handles[0].job_id.split("_")[0]
        sub.record_job(array_id)
        on_submitted(job_ids)
        print(f"[orchestrate] slurm: job array {array_id} with {len(jobs)} tasks "
              f"({time.perf_counter() - t0:.2f}s); logs in {self.sweep.path / 'slurm' / sub.id}",
              file=sys.stderr, flush=True)

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
        return live

    def cancel(self, job_ids: list[str]) -> None:
        slurm_commands.scancel(job_ids)

    def job_ends(self, job_ids: list[str]) -> dict[str, JobEnd | None]:
        return slurm_commands.job_ends(job_ids)

    def task_job_id(self, sub: Submission, index: int) -> str:
        """``<array>_<index>``, or the lone job's id: submitit submits a submission of one trial as a plain job."""
        return str(sub.job_id) if len(sub.keys) == 1 else f"{sub.job_id}_{index}"
