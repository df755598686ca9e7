"""The Ray Tune driver: one Tune experiment per submission, one Tune trial per grid trial.

Both Ray backends use it: ``local`` starts it as a process of its own (:func:`driver_command`), ``ray-slurm`` calls
:func:`drive` inside its allocation with the address of the Ray cluster it started there. The experiment lives in
``<sweep>/tune/<submission id>``, so a later call with ``restore=True`` continues it with ``Tuner.restore``
(finished Tune trials are not rerun).

Each Tune trial runs the trial job's command (:func:`asr_core.contract.trial.trial_command`) as a child
(:class:`orchestrate.backends.runner.TrialProcess`), and reports how it ended
(:func:`orchestrate.backends.runner.trainer_ended`, which also records a trainer killed by the system): finished,
cancelled or fenced end the Tune trial cleanly (a restored experiment never reruns them); preempted, failed or killed
make it ERROR. The trial folders, not Tune, decide what a resume reruns, so Tune never retries on its own; a restored
experiment (the Ray-on-SLURM allocation requeued) restarts its errored trials, but never one that is finished, cancelled
or past the sweep's ``max_failures``.

Ray ≥ 2.59 turns token authentication on for local clusters and would write a token to ``~/.ray``; we keep
authentication on but give every sweep its own token file (mode 600) in its folder (:func:`ray_auth_env`), so
nothing outside the sweep is touched and a Ray-on-SLURM cluster started from the same folder shares it.

A SIGTERM or SIGINT to the driver (the local submitter forwards its own; a dying submitter's PDEATHSIG sends one)
stops the submission without losing work: the driver touches ``<sweep>/tune/<submission>.stop``, every running
trainer gets SIGUSR2 (checkpoint where it is, exit ``EXIT_PREEMPTED``), trials not yet started are not started,
and the driver exits ``EXIT_PREEMPTED`` once they have all ended. Left to Ray, the driver's death would take its
workers down and their trainers with them (SIGKILL, no checkpoint).

``python -m orchestrate.backends.tune_driver SWEEP_PATH SUBMISSION [--restore] ...`` runs :func:`drive`.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from asr_core.contract.folder.segments import read_segments
from asr_core.contract.trial import (ENV_JOB_ID, EXIT_PREEMPTED, TrialFolder, failures, read_attempts,
                                     trial_command)
from orchestrate.backends.runner import TrialProcess, trainer_ended
from orchestrate.sweep.folder import SweepDir, SweepError

RAY_AUTH_TOKEN_FILE = "ray_auth_token"  # in the sweep folder


def ray_auth_env(sweep: SweepDir) -> dict[str, str]:
    """Environment that makes Ray use token authentication with this sweep's own token (created once)."""
    path = sweep.path / RAY_AUTH_TOKEN_FILE
    if not path.exists():
        sweep.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def driver_command(sweep: SweepDir, sub_id: str, cpus_per_trial: int, restore: bool = False) -> list[str]:
    """The command line that runs :func:`drive` for a submission on this machine (a Ray cluster of its own)."""
    cmd = [sys.executable, "-m", "orchestrate.backends.tune_driver", str(sweep.path), sub_id,
           "--cpus-per-trial", str(max(1, cpus_per_trial))]
    return cmd + (["--restore"] if restore else [])


def _not_to_run(trial_dir: Path) -> str:
    """Why a Tune trial must not start its trainer ("" when it may): finished, cancelled, or past the sweep's
    failure budget (a restored experiment restarts errored trials on its own)."""
    folder = TrialFolder(trial_dir)
    if folder.done.exists():
        return "finished"
    if folder.cancelled.exists():
        return "cancelled (`orchestrate retry --cancelled` runs it again)"
    sweep_path = trial_dir.parent.parent  # <sweep>/trials/<key>
    try:
        budget = SweepDir(sweep_path.parent, sweep_path.name).read_manifest().max_failures
    except (SweepError, OSError, ValueError, TypeError):
        return ""
    n = len(failures(read_attempts(trial_dir)))
    return f"gave up after {n} failures (`orchestrate retry --failed` runs it again)" if n >= budget else ""


def run_trial_job(config: dict[str, Any]) -> None:
    """The Tune trainable: run one trial's command; raise (so Tune marks the trial ERROR) when the trainer was
    preempted, failed or killed, and end cleanly when it finished, was cancelled or was fenced.

    With ``job["preempt_flag"]`` set, the trainer gets SIGUSR2 (checkpoint, exit :data:`EXIT_PREEMPTED`) as soon
    as that file exists: the Ray-on-SLURM allocation touches it when SLURM warns of the end."""
    from ray import tune

    job = config["job"]
    trial_dir = Path(job["trial_dir"])
    skip = _not_to_run(trial_dir)
    if skip:
        print(f"[orchestrate] trial {job['key']} not started: {skip}", file=sys.stderr, flush=True)
        tune.report({"exit_code": 0, "skipped": skip})
        return
    flags = [Path(f) for f in (job.get("preempt_flag"), job.get("stop_flag")) if f]
    if any(f.exists() for f in flags):  # ERROR, not a clean end: a restored experiment must still run it
        raise RuntimeError(f"trial {job['key']} not started: the submission was stopped; "
                           "`orchestrate resume` runs it")
    before = len(read_segments(trial_dir))
    child = TrialProcess(job["cmd"], job["workdir"], TrialFolder(trial_dir).log, env={ENV_JOB_ID: job["job_id"]})
    rc = child.wait(stop=(lambda: any(f.exists() for f in flags)) if flags else None)
    end = trainer_ended(trial_dir, rc, job_id=job["job_id"], pid=child.proc.pid, segments_before=before,
                        log_path=child.log_path)
    if end.kind == "preempted":
        raise RuntimeError(f"trial {job['key']} was interrupted and checkpointed (exit {EXIT_PREEMPTED}); "
                           "`orchestrate resume` continues it")
    if end.kind not in ("finished", "cancelled", "fenced"):
        raise RuntimeError(f"trial {job['key']}: {end.message}")
    tune.report({"exit_code": rc, "end": end.kind})


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


def drive(sweep_path: Path, sub_id: str, cpus_per_trial: int, restore: bool, address: str | None = None,
          gpus_per_trial: float = 0, preempt_flag: Path | None = None, own_signals: bool = False) -> int:
    """Run a submission's trials with Ray Tune; returns 0 once every Tune trial has ended (cleanly or not: the
    ledger holds each trial's outcome).

    ``address``: an existing Ray cluster (Ray-on-SLURM); without it a Ray cluster of this machine's CPUs is started.
    ``preempt_flag``: a file whose appearance makes every running trial checkpoint and exit. ``own_signals``: this
    process is the driver alone (the local backend's), so SIGTERM/SIGINT stop the submission
    (:func:`stop_on_signals`) and the return is ``EXIT_PREEMPTED`` when they did."""
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
                     "preempt_flag": str(preempt_flag) if preempt_flag else ""})
    stop_flag = sweep.path / "tune" / f"{sub.id}.stop"
    stop_flag.parent.mkdir(parents=True, exist_ok=True)
    stop_flag.unlink(missing_ok=True)  # left by an earlier stopped driver of this submission
    for job in jobs:
        job["stop_flag"] = str(stop_flag)
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=os.cpu_count() or 1, num_gpus=0, include_dashboard=False, log_to_driver=False)
    if own_signals:  # after ray.init, whose own SIGTERM handler ends the process (and the trainers with it)
        stop_on_signals(stop_flag)
    try:
        resources: dict[str, float] = {"cpu": cpus_per_trial}
        if gpus_per_trial:
            resources["gpu"] = gpus_per_trial
        states = run_tune(jobs, sweep.path / "tune", sub.id, resources, restore=restore)
    finally:
        ray.shutdown()
    bad = [k for k, s in states.items() if s != "TERMINATED"]
    print(f"[orchestrate] {len(states) - len(bad)} trials ended cleanly, {len(bad)} did not", flush=True)
    if stop_flag.exists():
        print(f"[orchestrate] stopped by a signal: the running trainers checkpointed (exit {EXIT_PREEMPTED})",
              flush=True)
        return EXIT_PREEMPTED
    return 0


def stop_on_signals(flag: Path) -> None:
    """Make SIGTERM and SIGINT to this process touch ``flag`` (every trial job watches it) instead of killing the
    driver, and keep Tune's own SIGINT handler (which would end the trials' workers) out. Only from the main
    thread (elsewhere signals cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
        return
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"

    def handler(signum: int, frame: object) -> None:
        if not flag.exists():
            flag.touch()
            print(f"[orchestrate] {signal.Signals(signum).name}: every running trainer checkpoints and stops",
                  file=sys.stderr, flush=True)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrate.backends.tune_driver``: :func:`drive` for one submission."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m orchestrate.backends.tune_driver", description="Ray Tune driver")
    p.add_argument("sweep_path", type=Path)
    p.add_argument("submission")
    p.add_argument("--cpus-per-trial", type=int, default=1)
    p.add_argument("--gpus-per-trial", type=float, default=0)
    p.add_argument("--address", default=None, help="an existing Ray cluster (Ray-on-SLURM); default: start one")
    p.add_argument("--restore", action="store_true", help="continue the submission's Tune experiment")
    p.add_argument("--preempt-flag", type=Path, default=None,
                   help="a file whose appearance makes every running trial checkpoint and exit")
    a = p.parse_args(argv)
    return drive(a.sweep_path, a.submission, a.cpus_per_trial, a.restore, a.address, a.gpus_per_trial,
                 a.preempt_flag, own_signals=True)


if __name__ == "__main__":
    # Run main() of the imported module, not of __main__: Ray pickles run_trial_job by reference only when it
    # belongs to an importable module, so workers import this file instead of receiving a copy of __main__'s.
    from orchestrate.backends.tune_driver import main as _main

    sys.exit(_main())
