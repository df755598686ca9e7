"""The SLURM client commands both SLURM backends (``slurm``, ``ray-slurm``) use, wrapped once.

Every wrapper raises :class:`~orchestrate.backends.base.BackendError` with the command's own message, so a failed
``sbatch`` reads the same from either backend. Two rules live here and nowhere else:

* ``scancel`` takes at most :data:`SCANCEL_BATCH` ids per call, so cancelling a 10,000-trial sweep never builds a
  command line the system refuses;
* :func:`settled_squeue` waits while any job is in a :data:`SETTLING` state. Such a job may still come back
  (requeue) or not (cancel); deciding before SLURM does could leave two jobs training one trial.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from orchestrate.backends.base import BackendError

if TYPE_CHECKING:
    from orchestrate.backends.profile import Profile

COMMANDS = ("sbatch", "squeue", "scancel", "scontrol")  # what a SLURM backend needs on PATH
SCANCEL_BATCH = 500  # job ids per scancel call
# squeue states a job passes through on its way out, from which it may still be requeued: wait for SLURM to decide.
SETTLING = ("COMPLETING", "SIGNALING", "STAGE_OUT")


class QueuedJob(NamedTuple):
    """One row of ``squeue -r``: an array task (``123_4``) or a lone job (``123``), its name and state."""

    job_id: str
    name: str
    state: str


def run(cmd: list[str], timeout: float = 60) -> str:
    """Run a SLURM client command; its stdout, or BackendError with its stderr."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise BackendError(f"{cmd[0]} not found: is SLURM installed here and SLURM_CONF set?") from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"{' '.join(cmd[:3])} ... did not answer within {timeout:.0f}s: is slurmctld up "
                           "(`scontrol ping`)?") from None
    if p.returncode != 0:
        raise BackendError(f"{' '.join(cmd[:3])} ... failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
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


def squeue(names: list[str]) -> list[QueuedJob]:
    """Every job (array tasks one per row) whose name is one of ``names``, as SLURM sees it now."""
    if not names:
        return []
    out = run(["squeue", "-h", "-r", "-o", "%i|%j|%T", "--name", ",".join(names)])
    rows = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            rows.append(QueuedJob(*parts))
    return rows


def settled_squeue(names: list[str], settle_s: float = 90.0, poll_s: float = 1.0) -> list[QueuedJob]:
    """:func:`squeue`, once no job is :data:`SETTLING` (or ``settle_s`` has passed: then settling jobs count as
    still held, the safe side: a trial is never started twice)."""
    deadline = time.monotonic() + settle_s
    rows = squeue(names)
    while any(r.state in SETTLING for r in rows) and time.monotonic() < deadline:
        time.sleep(poll_s)
        rows = squeue(names)
    return rows
