"""The SLURM client commands both SLURM backends (``slurm``, ``ray-slurm``) use, wrapped once.

Every wrapper raises :class:`~orchestrate.backends.base.BackendError` with the command's own message, so a failed
``sbatch`` reads the same from either backend (except :func:`sacct`: a cluster without accounting is an answer, not
an error). Three rules live here and nowhere else:

* ``scancel`` takes at most :data:`SCANCEL_BATCH` ids per call, so cancelling a 10,000-trial sweep never builds a
  command line the system refuses;
* :func:`settled_squeue` waits while any job is in a :data:`SETTLING` state. Such a job may still come back
  (requeue) or not (cancel); deciding before SLURM does could leave two jobs training one trial;
* :func:`job_end` reads how a job ended from the accounting record (:func:`sacct`, one call for many jobs): out of
  memory, time limit, node failure, cancelled by someone other than the user, or a signal → the system killed it
  (``killed``); the user's own ``scancel`` → ``preempted`` (interrupted, not the trial's fault); a non-zero exit →
  ``failed``; a job accounting still sees running → ``None`` (not ended yet: never resubmitted).

The ``slurm`` backend's sweep-wide ``max_parallel`` (:class:`orchestrate.backends.slurm_throttle.SweepThrottle`) reads
the cluster's ``MaxArraySize`` (:func:`max_array_size`, once per process) and an array's pending tasks in rows of
tasks that wait alike (:func:`array_rows`: ``123_[5-999]`` holds the pending tasks 5 to 999, with one dependency
and hold), and moves array throttles, holds and dependencies (:func:`set_throttle`, :func:`hold`, :func:`release`,
:func:`set_dependency`). ``squeue`` is read one task a row (``-r``): without it SLURM folds tasks that wait
differently into one row, showing one task's dependency and no throttle. An update of an array some of whose tasks
have finished is made and still exits 1 (``1_0-17: Job has already finished`` / ``1_18-20: No error``):
:func:`_update` takes that answer for what it is, a success.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from asr_core.contract.trial import OUTCOME_FAILED, OUTCOME_KILLED, OUTCOME_LOST, OUTCOME_PREEMPTED
from orchestrate.backends.base import BackendError, JobEnd

if TYPE_CHECKING:
    from orchestrate.plan.profile import Profile

COMMANDS = ("sbatch", "squeue", "scancel", "scontrol")  # what a SLURM backend needs on PATH
SCANCEL_BATCH = 500  # job ids per scancel call (and per sacct call)
# squeue states a job passes through on its way out, from which it may still be requeued: wait for SLURM to decide.
SETTLING = ("COMPLETING", "SIGNALING", "STAGE_OUT")
# sacct states of a job that has not ended: it may still run (or run again), so it is never resubmitted
NOT_ENDED = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED", "CONFIGURING",
             "COMPLETING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT", "STOPPED")
# sacct states in which the system ended the job (the trial's code may be fine): a `killed` outcome
SYSTEM_ENDS = {"OUT_OF_MEMORY": "out of memory", "TIMEOUT": "time limit", "NODE_FAIL": "node failure",
               "BOOT_FAIL": "node boot failure", "DEADLINE": "deadline"}


class QueuedJob(NamedTuple):
    """One row of ``squeue -r``: an array task (``123_4``) or a lone job (``123``), its name and state."""

    job_id: str
    name: str
    state: str


def _call(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client command, whatever its exit code; BackendError when it is missing or does not answer."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise BackendError(f"{cmd[0]} not found: is SLURM installed here and SLURM_CONF set?") from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"{' '.join(cmd[:3])} ... did not answer within {timeout:.0f}s: is slurmctld up "
                           "(`scontrol ping`)?") from None


def _failed(cmd: list[str], p: subprocess.CompletedProcess[str]) -> BackendError:
    return BackendError(f"{' '.join(cmd[:3])} ... failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")


def run(cmd: list[str], timeout: float = 60) -> str:
    """Run a SLURM client command; its stdout, or BackendError with its stderr."""
    p = _call(cmd, timeout)
    if p.returncode != 0:
        raise _failed(cmd, p)
    return p.stdout


def check_cluster(profile: Profile) -> None:
    """BackendError unless the SLURM commands are on PATH and the profile's partition (if any) exists."""
    for cmd in COMMANDS:
        if shutil.which(cmd) is None:
            raise BackendError(f"{cmd} not found: is SLURM installed here and SLURM_CONF set?")
    part = profile.partition
    if part:
        known = sorted(set(run(["sinfo", "-h", "-o", "%R"]).split()))
        if part not in known:
            raise BackendError(f"profile {profile.name!r}: unknown partition {part!r}; valid: {', '.join(known)}")


def sbatch(script: Path) -> str:
    """Submit a batch script; returns the job id."""
    out = run(["sbatch", "--parsable", str(script)])
    return out.strip().split(";")[0]  # --parsable prints "ID" or "ID;CLUSTER"


def scancel(job_ids: list[str]) -> None:
    """Cancel jobs (or array tasks), :data:`SCANCEL_BATCH` ids per call."""
    for i in range(0, len(job_ids), SCANCEL_BATCH):
        run(["scancel", *job_ids[i:i + SCANCEL_BATCH]])


def requeue(job_id: str) -> bool:
    """``scontrol requeue`` from inside the job; False (and a line on stderr) if SLURM refused.

    A refusal is not raised: the caller is a job on its way out that has already checkpointed, and ``orchestrate
    resume`` resubmits a trial whose job did not come back."""
    try:
        p = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"[orchestrate] scontrol requeue {job_id} failed: {e}", file=sys.stderr, flush=True)
        return False
    if p.returncode != 0:
        print(f"[orchestrate] scontrol requeue {job_id} failed ({p.returncode}): {p.stderr.strip()}",
              file=sys.stderr, flush=True)
    return p.returncode == 0


_MAX_ARRAY_SIZE: dict[str, int] = {}  # SLURM_CONF -> MaxArraySize, read once per process and cluster


def max_array_size() -> int:
    """The cluster's ``MaxArraySize`` (``scontrol show config``; read once per process and ``SLURM_CONF``): array
    indices stay below it, so one array holds at most that many tasks (indices 0 to MaxArraySize - 1)."""
    conf = os.environ.get("SLURM_CONF", "")
    if conf not in _MAX_ARRAY_SIZE:
        try:
            out = run(["scontrol", "show", "config"])
        except BackendError as e:
            raise BackendError(f"cannot read the cluster's MaxArraySize, which sets how many trials one job array "
                               f"may hold: {e}") from None
        m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)", out, re.M)
        if m is None:
            raise BackendError("`scontrol show config` names no MaxArraySize, which sets how many trials one job "
                               "array may hold; is this a SLURM cluster (`scontrol ping`)?")
        _MAX_ARRAY_SIZE[conf] = int(m.group(1))
    return _MAX_ARRAY_SIZE[conf]


_PARTITION_MAX: dict[tuple[str, str], int | None] = {}


def partition_max_minutes(partition: str = "") -> int | None:
    """The ``MaxTime`` of ``partition`` (the cluster's default partition for "") in minutes, None when it is
    ``UNLIMITED``/``INFINITE`` (``scontrol show partition``; read once per process and ``SLURM_CONF``)."""
    from orchestrate.plan.profile import parse_minutes

    key = (os.environ.get("SLURM_CONF", ""), partition)
    if key not in _PARTITION_MAX:
        out = run(["scontrol", "show", "partition", "-o", *([partition] if partition else [])])
        rows = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines() if line.strip()]
        row = rows[0] if partition else next((r for r in rows if r.get("Default") == "YES"), None)
        if row is None or "MaxTime" not in row:
            raise BackendError(f"`scontrol show partition {partition}` names no MaxTime: set time_max in the profile "
                               "to cap the trials' time limits")
        t = row["MaxTime"]
        _PARTITION_MAX[key] = None if t.upper() in ("UNLIMITED", "INFINITE") else parse_minutes(t)
    return _PARTITION_MAX[key]


class ArrayRow(NamedTuple):
    """A running array task (``123_4``), an array's pending tasks that wait alike (``123_[5-999]``, or ``123_5``;
    :func:`array_rows`) or a lone job (``123``); its name, state, unfulfilled dependencies (``afterany:456_7``,
    comma-separated; "(null)" for none) and pending reason (``JobHeldUser``)."""

    job_id: str
    name: str
    state: str
    dependency: str
    reason: str

    @property
    def array_id(self) -> str:
        return self.job_id.split("_", 1)[0]

    @property
    def lone(self) -> bool:
        return "_" not in self.job_id

    def tasks(self) -> int:
        """How many tasks the row stands for: the indices of ``123_[5-999,1002%3]``, else 1."""
        m = re.fullmatch(r"[^_]+_\[([^%\]]*)(?:%\d+)?\]", self.job_id)
        if m is None:
            return 1
        n = 0
        for part in m.group(1).split(","):  # 5, 7-9 or 0-9:2 (every second index)
            span, _, step = part.partition(":")
            lo, _, hi = span.partition("-")
            n += (int(hi) - int(lo)) // int(step or 1) + 1 if hi else 1
        return n

    def throttle(self) -> int | None:
        """The ``%N`` of a pending array row; None when the row does not show one."""
        m = re.search(r"%(\d+)\]$", self.job_id)
        return int(m.group(1)) if m else None

    def expression(self) -> str:
        """The row as ``scontrol`` names it: ``123_[5-999]`` (without the throttle), ``123_4`` or ``123``."""
        return re.sub(r"%\d+\]$", "]", self.job_id)

    @property
    def held(self) -> bool:
        return self.reason.startswith("JobHeld")

    def gates(self) -> list[str]:
        """The dependencies still unfulfilled, as ``--dependency`` spells them (``afterany:456_7``)."""
        dep = "" if self.dependency in ("(null)", "") else self.dependency
        return [d.replace("(unfulfilled)", "") for d in dep.split(",") if d.endswith("(unfulfilled)")]


def array_rows(names: list[str]) -> list[ArrayRow]:
    """Every job whose name is one of ``names``: one row a running task or lone job, and one row for each set of an
    array's pending tasks that wait alike (the same dependency, held or not), as ``123_[5-9,12]``. Read one task a
    row (``squeue -r``) and grouped here: SLURM's own folding shows one task's dependency for all and no throttle."""
    rows = _squeue(names, "%i|%j|%T|%E|%r", ArrayRow, per_task=True)
    out: list[ArrayRow] = []
    waiting: dict[tuple[str, str, str, str, bool], list[int]] = {}
    reasons: dict[tuple[str, str, str, str, bool], str] = {}
    for row in rows:
        array, _, index = row.job_id.partition("_")
        if row.state != "PENDING" or not index.isdigit():
            out.append(row)
            continue
        key = (array, row.name, row.state, row.dependency, row.held)
        waiting.setdefault(key, []).append(int(index))
        reasons.setdefault(key, row.reason)
    for key, indices in waiting.items():
        array, name, state, dependency, _ = key
        job = f"{array}_{indices[0]}" if len(indices) == 1 else f"{array}_[{index_ranges(indices)}]"
        out.append(ArrayRow(job, name, state, dependency, reasons[key]))
    return out


def index_ranges(indices: list[int]) -> str:
    """Array indices as SLURM writes them: ``[2, 3, 4, 7]`` → ``2-4,7``."""
    out: list[list[int]] = []
    for i in sorted(set(indices)):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in out)


def _squeue(names: list[str], fields: str, row: Any, per_task: bool) -> list[Any]:
    """``squeue`` of the jobs named ``names`` in ``fields`` (``|``-separated), one ``row(*fields)`` per line; array
    tasks one per row when ``per_task``, else a pending array's rest in one row."""
    if not names:
        return []
    out = run(["squeue", "-h", *(["-r"] if per_task else []), "-o", fields, "--name", ",".join(names)])
    width = fields.count("|") + 1
    return [row(*parts) for parts in (line.strip().split("|") for line in out.splitlines()) if len(parts) == width]


# what scontrol prints, one line per set of tasks, for an update made where it could be: the tasks it changed, and
# those that had finished (an array's done tasks); it exits 1 all the same
_UPDATE_LINE = re.compile(r"\S+: (No error|Job has already finished)")


def _update(cmd: list[str]) -> None:
    """Run ``scontrol`` update/hold/release ``cmd``; an exit 1 whose every line says "No error" or "Job has already
    finished" is a success (the change was made on every task that is still queued)."""
    p = _call(cmd)
    lines = [ln.strip() for ln in (p.stderr + "\n" + p.stdout).splitlines() if ln.strip()]
    if p.returncode != 0 and not (p.returncode == 1 and lines and all(_UPDATE_LINE.fullmatch(ln) for ln in lines)):
        raise _failed(cmd, p)


def set_throttle(array_id: str, n: int) -> None:
    """At most ``n`` tasks of array ``array_id`` run at once (0: no limit); running tasks above it are left alone."""
    _update(["scontrol", "update", f"JobId={array_id}", f"ArrayTaskThrottle={n}"])


def array_throttle(task: str) -> int:
    """The ArrayTaskThrottle of the array that task ``task`` (``123_4``) belongs to (0: none)."""
    m = re.search(r"\bArrayTaskThrottle=(\d+)", run(["scontrol", "show", "job", task]))
    return int(m.group(1)) if m else 0


def set_dependency(job: str, dependency: str) -> None:
    """Replace the dependency of the pending job or tasks ``job`` (``123_[5-999]``); "" removes it."""
    _update(["scontrol", "update", f"JobId={job}", f"Dependency={dependency}"])


def hold(job: str) -> None:
    """Hold pending ``job`` (``123_[5-999]``, ``123_4``): it starts nothing until released."""
    _update(["scontrol", "hold", job])


def release(job: str) -> None:
    """Release ``job`` held by :func:`hold` (or submitted held)."""
    _update(["scontrol", "release", job])


class AccountedJob(NamedTuple):
    """One row of ``sacct -X``: a job or array task, its state (``CANCELLED by 1000`` as sacct spells it) and its
    exit code and signal (``ExitCode`` ``3:0`` → 3, 0; ``0:9`` → 0, 9)."""

    job_id: str
    state: str
    exit_code: int
    signal: int


def sacct(job_ids: list[str], timeout: float = 60) -> dict[str, AccountedJob]:
    """How the scheduler's accounting sees ``job_ids`` (array tasks ``123_4`` or lone jobs), one ``sacct`` call per
    :data:`SCANCEL_BATCH` ids; {} for jobs it does not know.

    A cluster without accounting (or without ``sacct``, or with slurmdbd down) answers {} and a line on stderr:
    nothing is known about how those jobs ended, which the caller records as ``lost``."""
    out: dict[str, AccountedJob] = {}
    wanted = sorted(set(j for j in job_ids if j))
    for i in range(0, len(wanted), SCANCEL_BATCH):
        batch = wanted[i:i + SCANCEL_BATCH]
        cmd = ["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode", "-j", ",".join(batch)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"[orchestrate] sacct is not available ({e}); jobs that ended without a word count as lost",
                  file=sys.stderr, flush=True)
            return out
        if p.returncode != 0:
            msg = (p.stderr.strip() or p.stdout.strip()).splitlines()
            print(f"[orchestrate] sacct failed ({p.returncode}: {msg[-1] if msg else 'no message'}); without "
                  "accounting, jobs that ended without a word count as lost", file=sys.stderr, flush=True)
            return out
        for line in p.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 3 or parts[0] not in batch:
                continue  # a pending array range (123_[4-7]) or a job not asked for
            code, _, sig = parts[2].partition(":")
            out[parts[0]] = AccountedJob(parts[0], parts[1].strip(), _int(code), _int(sig))
    return out


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def job_end(row: AccountedJob | None, job_id: str, uid: int | None = None) -> JobEnd | None:
    """How job ``job_id`` ended, from its accounting ``row`` (None: accounting does not know it → ``lost``);
    None when accounting says it has not ended (pending, running, requeued: never resubmit it).

    ``uid``: the user whose own ``scancel`` is an interruption, not a failure (default: this process's user)."""
    if row is None:
        return JobEnd(job_id, "", OUTCOME_LOST, f"job {job_id} ended without recording how, and the scheduler's "
                                                "accounting does not know it")
    state = row.state.split()[0] if row.state.strip() else ""
    if state in NOT_ENDED:
        return None
    why = f"job {job_id} ended {row.state} (sacct)"
    if state in SYSTEM_ENDS:
        return JobEnd(job_id, state, OUTCOME_KILLED, f"killed by the system: {SYSTEM_ENDS[state]} ({why})")
    if state == "PREEMPTED":
        return JobEnd(job_id, state, OUTCOME_PREEMPTED, f"preempted ({why})")
    if state == "CANCELLED":
        by = row.state.split()[2] if len(row.state.split()) >= 3 else ""
        me = str(os.getuid() if uid is None else uid)
        if by == me:
            return JobEnd(job_id, state, OUTCOME_PREEMPTED, f"cancelled by its user with scancel ({why})")
        return JobEnd(job_id, state, OUTCOME_KILLED, f"killed by the system: cancelled by "
                                                     f"{'uid ' + by if by else 'the scheduler'} ({why})")
    if row.signal:
        return JobEnd(job_id, state, OUTCOME_KILLED, f"killed by {_signal_name(row.signal)} ({why})")
    if state == "FAILED" or row.exit_code:
        return JobEnd(job_id, state, OUTCOME_FAILED, f"exit code {row.exit_code} ({why}); see the trial's log")
    return JobEnd(job_id, state, OUTCOME_LOST, f"ended without recording how the trial ended ({why})")


def job_ends(job_ids: list[str]) -> dict[str, JobEnd | None]:
    """{job id: how it ended} for jobs the queue no longer holds, from one :func:`sacct` call (see :func:`job_end`)."""
    rows = sacct(job_ids)
    return {j: job_end(rows.get(j), j) for j in job_ids}


def squeue(names: list[str]) -> list[QueuedJob]:
    """Every job (array tasks one per row) whose name is one of ``names``, as SLURM sees it now."""
    return _squeue(names, "%i|%j|%T", QueuedJob, per_task=True)


def settled_squeue(names: list[str], settle_s: float = 90.0, poll_s: float = 1.0) -> list[QueuedJob]:
    """:func:`squeue`, once no job is :data:`SETTLING` (or ``settle_s`` has passed: then settling jobs count as
    still held, the safe side: a trial is never started twice)."""
    deadline = time.monotonic() + settle_s
    rows = squeue(names)
    while any(r.state in SETTLING for r in rows) and time.monotonic() < deadline:
        time.sleep(poll_s)
        rows = squeue(names)
    return rows
