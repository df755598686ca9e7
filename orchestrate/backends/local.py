"""``local``: Ray Tune on this machine, the embedded default.

Each submission is one Tune experiment (``<sweep>/tune/<submission id>``) whose grid is the submission's trials; a
trial needs ``cpus_per_task`` CPUs (1 by default), so Tune runs as many in parallel as the cores allow. The driver
(:mod:`orchestrate.backends.tune_driver`) runs as a process of its own and this backend blocks until it ends,
holding the sweep lock and printing a progress line now and then. If it dies, ``resume`` finds the trials lost and,
when they are exactly the trials of one earlier submission, continues that experiment with ``Tuner.restore``. When
some of that submission's trials finished meanwhile, the rest go out as a new submission instead: Tune saves its
experiment state only now and then, so a restore could start a finished trial again.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from orchestrate.backends.base import Backend, BackendError, Job, OnSubmitted, StoppedBySignal
from orchestrate.backends.tune_driver import driver_command, ray_auth_env
from orchestrate.sweep.progress import ProgressPrinter
from orchestrate.backends.runner import TrialProcess, install_forwarding, last_line


class LocalBackend(Backend):
    """Ray Tune on this machine; ``submit`` returns when every trial of the submission has ended."""

    name = "local"
    blocking = True

    def live_jobs(self) -> dict[str, str]:
        # A local sweep runs inside the process holding the sweep lock; whoever reconciles holds that lock, so no
        # trial of this sweep can be running anywhere else.
        return {}

    def cancel(self, job_ids: list[str]) -> None:
        return None

    def submit(self, jobs: list[Job], on_submitted: OnSubmitted) -> None:
        keys = [j.trial.key for j in jobs]
        previous = [s for s in self.sweep.submissions() if s.data.get("backend") == self.name]
        restore_from = next((s for s in reversed(previous)
                             if set(keys) == set(s.keys) and (self.sweep.path / "tune" / s.id).exists()), None)
        sub = restore_from or self.sweep.new_submission(self.name, keys, {j.trial.key: j.run_id for j in jobs})
        job_id = f"local:{os.getpid()}:{sub.id}"
        sub.data["run_ids"] = [{j.trial.key: j.run_id for j in jobs}.get(k, r)
                               for k, r in zip(sub.keys, sub.data["run_ids"])]
        sub.record_job(job_id)
        on_submitted({k: job_id for k in keys})
        # The Tune driver is its own process: Ray reads its authentication mode once, at import, and a clean
        # process also dies with us (PDEATHSIG) instead of leaving a Ray cluster behind.
        cmd = driver_command(self.sweep, sub.id, self.profile.cpus_per_task, restore=restore_from is not None)
        child = TrialProcess(cmd, Path.cwd(), self.sweep.path / "tune" / f"{sub.id}.log",
                             env=ray_auth_env(self.sweep))
        install_forwarding(child, (signal.SIGINT, signal.SIGTERM))
        print(f"[orchestrate] local: Ray Tune driver for {len(jobs)} trials (log {child.log_path})",
              file=sys.stderr, flush=True)
        progress = ProgressPrinter({j.trial.key: j.trial_dir for j in jobs},
                                   {j.trial.key: j.trial.label for j in jobs})
        rc = child.wait(stop=progress.tick)  # tick prints a progress line now and then; it never stops the driver
        print(progress.line(), file=sys.stderr, flush=True)
        if rc != 0 and child.signalled is not None:
            raise StoppedBySignal(f"stopped by {signal.Signals(child.signalled).name}: the running trainers "
                                  f"checkpointed where they were (driver exit {rc}, log {child.log_path}); "
                                  f"`{self.sweep.command('resume')}` continues the sweep", child.signalled)
        if rc != 0:
            raise BackendError(f"the local Tune driver exited with {rc}: {last_line(child.log_path)} "
                               f"(log {child.log_path}); `{self.sweep.command('resume')}` continues the sweep")
