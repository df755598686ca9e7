"""``local``: Ray Tune on this machine, the embedded default.

Each submission is one Tune experiment (``<sweep>/tune/<submission id>``) whose grid is the submission's trials; a
trial needs ``cpus_per_task`` CPUs (1 by default), so Tune runs as many in parallel as the cores allow. The driver
blocks until they end, holding the sweep lock. If it dies, ``resume`` finds the trials lost and, when they all belong
to one earlier submission, continues that experiment with ``Tuner.restore`` (finished Tune trials are not rerun).

Ray ≥ 2.59 turns token authentication on for local clusters and would write a token to ``~/.ray``; we keep
authentication on but give every sweep its own token file (mode 600) in its folder, so nothing outside the sweep is
touched and a Ray-on-SLURM cluster started from the same folder shares it.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

from orchestrate.backends.base import Backend, BackendError, Job, OnSubmitted
from orchestrate.progress import ProgressPrinter
from orchestrate.runner import EXIT_PREEMPTED, TrialProcess, install_forwarding, last_line
from orchestrate.sweep import SweepDir, trial_command


def ray_auth_env(sweep: SweepDir) -> dict[str, str]:
    """Environment that makes Ray use token authentication with this sweep's own token."""
    path = sweep.path / "ray_auth_token"
    if not path.exists():
        sweep.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def run_trial_job(config: dict[str, Any]) -> None:
    """The Tune trainable: run one trial's command; raise (so Tune marks the trial ERROR) unless it exited 0."""
    from ray import tune

    job = config["job"]
    child = TrialProcess(job["cmd"], job["workdir"], Path(job["trial_dir"]) / "trial.log",
                         env={"ORCHESTRATE_JOB_ID": job["job_id"]})
    flag = job.get("preempt_flag")
    rc = child.wait(stop=(lambda: Path(flag).exists()) if flag else None)
    if rc == EXIT_PREEMPTED:
        raise RuntimeError(f"trial {job['key']} was interrupted and checkpointed (exit 75); `orchestrate resume` "
                           "continues it")
    if rc != 0:
        raise RuntimeError(f"trial {job['key']} failed (exit {rc}): {last_line(child.log_path)}")
    tune.report({"exit_code": rc})


def run_tune(jobs: list[dict[str, Any]], storage: Path, name: str, resources: dict[str, float],
             restore: bool = False) -> dict[str, str]:
    """Run (or continue) a Tune experiment over ``jobs`` in the Ray cluster already initialised; returns
    {key: Tune trial state}."""
    from ray import tune

    trainable = tune.with_resources(run_trial_job, resources)
    path = storage / name
    if restore and tune.Tuner.can_restore(str(path)):
        print(f"[orchestrate] continuing Tune experiment {path} (Tuner.restore)", file=sys.stderr, flush=True)
        tuner = tune.Tuner.restore(str(path), trainable, resume_unfinished=True, resume_errored=False,
                                   restart_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space={"job": tune.grid_search(jobs)},
            tune_config=tune.TuneConfig(num_samples=1, reuse_actors=False,
                                        trial_dirname_creator=lambda t: t.config["job"]["key"],
                                        trial_name_creator=lambda t: t.config["job"]["label"]),
            run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=1,
                                      # one attempt per call: the ledger decides what a resume reruns
                                      failure_config=tune.FailureConfig(max_failures=0)),
        )
    grid = tuner.fit()
    out: dict[str, str] = {}
    for r in grid:
        key = r.config["job"]["key"] if r.config else "?"
        out[key] = "ERROR" if r.error else "TERMINATED"
    return out


class LocalBackend(Backend):
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
                             if set(keys) <= set(s.keys) and (self.sweep.path / "tune" / s.id).exists()), None)
        sub = restore_from or self.sweep.new_submission(self.name, keys, {j.trial.key: j.run_id for j in jobs})
        job_id = f"local:{os.getpid()}:{sub.id}"
        sub.data["run_ids"] = [{j.trial.key: j.run_id for j in jobs}.get(k, r)
                               for k, r in zip(sub.keys, sub.data["run_ids"])]
        sub.record_job(job_id)
        on_submitted({k: job_id for k in keys})
        # The Tune driver is its own process: Ray reads its authentication mode once, at import, and a clean
        # process also dies with us (PDEATHSIG) instead of leaving a Ray cluster behind.
        cmd = [sys.executable, "-m", "orchestrate.backends.local", str(self.sweep.path), sub.id,
               "--cpus-per-trial", str(max(1, self.profile.cpus_per_task))]
        if restore_from is not None:
            cmd.append("--restore")
        child = TrialProcess(cmd, Path.cwd(), self.sweep.path / "tune" / f"{sub.id}.log",
                             env=ray_auth_env(self.sweep))
        install_forwarding(child, (signal.SIGINT, signal.SIGTERM))
        print(f"[orchestrate] local: Ray Tune driver for {len(jobs)} trials (log {child.log_path})",
              file=sys.stderr, flush=True)
        progress = ProgressPrinter({j.trial.key: j.trial_dir for j in jobs},
                                   {j.trial.key: j.trial.label for j in jobs})
        rc = child.wait(stop=progress.tick)  # tick prints a progress line now and then; it never stops the driver
        print(progress.line(), file=sys.stderr, flush=True)
        if rc != 0:
            raise BackendError(f"the local Tune driver exited with {rc}: {last_line(child.log_path)} "
                               f"(log {child.log_path}); `orchestrate resume {self.sweep.name}` continues the sweep")


def drive(sweep_path: Path, sub_id: str, cpus_per_trial: int, restore: bool,
          address: str | None = None, gpus_per_trial: float = 0) -> int:
    """The Tune driver process (local, or inside a Ray-on-SLURM allocation with ``address``)."""
    import ray

    sweep = SweepDir(sweep_path.parent, sweep_path.name)
    manifest = sweep.read_manifest()
    sub = sweep.submission(sub_id)
    by_key = {t.key: t for t in sweep.read_trials()}
    workdir = manifest.workdir or str(Path.cwd())
    run_ids = dict(zip(sub.keys, sub.data["run_ids"]))
    jobs = []
    for key in sub.keys:
        jobs.append({"key": key, "label": by_key[key].label, "run_id": run_ids[key],
                     "trial_dir": str(sweep.trial_dir(key)), "workdir": workdir, "job_id": sub.job_id or "",
                     "cmd": trial_command(sweep.trial_dir(key), manifest.tracking_uri, run_ids[key]),
                     # Ray-on-SLURM: the allocation touches this file on USR2; the wrapper tells its trainer
                     "preempt_flag": str(sweep.path / "ray_slurm" / sub_id / "PREEMPT") if address else ""})
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=os.cpu_count() or 1, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        resources: dict[str, float] = {"cpu": cpus_per_trial}
        if gpus_per_trial:
            resources["gpu"] = gpus_per_trial
        states = run_tune(jobs, sweep.path / "tune", sub.id, resources, restore=restore)
    finally:
        ray.shutdown()
    bad = [k for k, s in states.items() if s != "TERMINATED"]
    print(f"[orchestrate] {len(states) - len(bad)} trials ended cleanly, {len(bad)} did not", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m orchestrate.backends.local", description="Ray Tune driver")
    p.add_argument("sweep_path", type=Path)
    p.add_argument("submission")
    p.add_argument("--cpus-per-trial", type=int, default=1)
    p.add_argument("--gpus-per-trial", type=float, default=0)
    p.add_argument("--address", default=None, help="an existing Ray cluster (Ray-on-SLURM); default: start one")
    p.add_argument("--restore", action="store_true", help="continue the submission's Tune experiment")
    a = p.parse_args(argv)
    return drive(a.sweep_path, a.submission, a.cpus_per_trial, a.restore, a.address, a.gpus_per_trial)


if __name__ == "__main__":
    sys.exit(main())
