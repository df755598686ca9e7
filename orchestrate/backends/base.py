"""The interface every backend implements, and the small set of facts the dispatcher needs from it.

A backend knows how to start trials (``submit``), which of the sweep's trials its scheduler still holds
(``live_jobs``), how jobs that ended without a word ended (``job_ends``: the scheduler's accounting, where it keeps
one), and how to stop them (``cancel``). The ledger, the sweep folder and the decision of what to (re)submit live
outside (:mod:`orchestrate.dispatch.dispatch`), so every backend behaves the same way on resume.
Cluster profiles (what a backend asks the scheduler for) live in :mod:`orchestrate.plan.profile`, with
:class:`BackendError`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from orchestrate.plan.profile import BackendError, Profile, StoppedBySignal
from orchestrate.sweep.folder import Submission, SweepDir
from orchestrate.sweep.trial import Trial

# The interface: what backends implement and raise, and what the dispatcher reads of them. BackendError is defined
# beside the profile, whose loading raises it first (the profile is below this module: it imports nothing here).
__all__ = ["Backend", "BackendError", "Job", "JobEnd", "OnSubmitted", "StoppedBySignal"]


@dataclass(frozen=True)
class JobEnd:
    """How a job ended, as the scheduler's accounting tells it: ``outcome`` is an attempt outcome of the trial
    contract (``killed``, ``failed``, ``preempted`` or ``lost``), ``reason`` a line for people (recorded in
    ``attempts.jsonl`` and shown by ``status``), ``state`` the scheduler's own word (``OUT_OF_MEMORY``)."""

    job_id: str
    state: str
    outcome: str
    reason: str


@dataclass(frozen=True)
class Job:
    """One trial to start: its config, the run it continues and its folder (config.json already written)."""

    trial: Trial
    run_id: str
    trial_dir: Path


# Called with {trial key: job id} as soon as the scheduler has accepted jobs, so the ledger is tagged before a
# blocking backend starts running them.
OnSubmitted = Callable[[dict[str, str]], None]


class Backend(abc.ABC):
    """Runs a sweep's jobs somewhere. Subclasses set ``name`` and ``blocking``."""

    name: ClassVar[str]
    blocking: ClassVar[bool] = False  # True: submit() returns when the trials have ended (local)
    # True: jobs run on other hosts and write the ledger from there, so a sqlite file (one host's) will not do
    many_hosts: ClassVar[bool] = False

    def __init__(self, sweep: SweepDir, tracking_uri: str, profile: Profile) -> None:
        self.sweep = sweep
        self.tracking_uri = tracking_uri
        self.profile = profile

    def validate(self) -> None:
        """Raise :class:`BackendError` if this backend cannot run here (called before anything is created)."""

    @abc.abstractmethod
    def submit(self, jobs: list[Job], on_submitted: OnSubmitted) -> None:
        """Start ``jobs``; call ``on_submitted({key: job_id})`` once the scheduler accepted them."""

    @abc.abstractmethod
    def live_jobs(self) -> dict[str, str]:
        """{trial key: job id} for every trial of the sweep that the scheduler still holds (pending, running,
        requeued), found from the submission files and the scheduler's own view, whether or not the ledger knows."""

    @abc.abstractmethod
    def cancel(self, job_ids: list[str]) -> None:
        """Stop these jobs (the trainer checkpoints on SIGTERM)."""

    def job_ends(self, job_ids: list[str]) -> dict[str, JobEnd | None]:
        """How each of ``job_ids`` (jobs the scheduler no longer holds) ended, from the scheduler's accounting:
        a :class:`JobEnd`, or None for a job the accounting still sees running (leave it alone). A job missing
        from the answer is unknown (the caller records it ``lost``). Without accounting: {}."""
        return {}

    def task_job_id(self, sub: Submission, index: int) -> str:
        """The scheduler's id of the job that runs trial ``index`` of submission ``sub`` (the one its segments record
        as their job id); by default the submission's one job."""
        return str(sub.job_id or "")
