"""``ray-slurm``: a Ray cluster inside one SLURM allocation; Ray Tune schedules the trials onto its GPUs.

Ray Tune cannot make a trial a SLURM job by itself, so a submission is one ``sbatch`` job (named
``orch.<sweep>.<submission id>``) whose batch step runs ``python -m orchestrate.backends.ray_slurm allocation``:

1. start the Ray head on the first node and a worker on every other node, each with ``srun --overlap``, declaring
   the CPUs and GPUs SLURM allocated there (``SLURM_CPUS_ON_NODE``, ``SLURM_GPUS_ON_NODE``);
2. run the Tune driver (:func:`orchestrate.backends.tune_driver.drive`) against that cluster, each trial asking for
   ``cpus_per_task`` CPUs and one GPU when the profile has GPUs, so trials fill the allocation's GPUs;
3. on USR2 (time limit or preemption, sent to the batch step) tell every running trial to checkpoint (a flag file
   their wrappers watch), wait for Tune to wind down, ``scontrol requeue`` the job and exit; when the job starts
   again the driver continues the same Tune experiment with ``Tuner.restore`` and trainers resume their checkpoints.
   An allocation whose trials are all finished or cancelled (``orchestrate cancel`` wrote ``CANCELLED``) is never
   requeued.

The cluster uses token authentication with the sweep's own token (see ``tune_driver.ray_auth_env``). The SLURM
commands (``sbatch``, settled ``squeue``, batched ``scancel``) are the ones the ``slurm`` backend uses, from
:mod:`orchestrate.backends.slurm_commands`.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from asr_core.contract.trial import EXIT_OK, EXIT_PREEMPTED, TrialFolder
from orchestrate.backends import slurm_commands
from orchestrate.backends.base import Backend, BackendError, Job, JobEnd, OnSubmitted
from orchestrate.backends.tune_driver import drive, ray_auth_env
from orchestrate.sweep.folder import SweepDir

PREEMPT_FLAG = "PREEMPT"  # in <sweep>/ray_slurm/<submission>/: touched on USR2, watched by every trial's wrapper


class RaySlurmBackend(Backend):
    """One ``sbatch`` allocation per submission, running a Ray cluster and the Tune driver inside it."""

    name = "ray-slurm"
    many_hosts = True

    def validate(self) -> None:
        slurm_commands.check_cluster(self.profile)
        p = self.profile
        if p.time_rule and not p.time_max:
            raise BackendError(f"profile {p.name!r}: time_limit 'estimate' gives each trial its own limit, but "
                               "ray-slurm runs many trials in one allocation: set time_max (the allocation's "
                               "limit) or a fixed time_limit")
        if str(p.mem_gb).strip() == "estimate":
            raise BackendError(f"profile {p.name!r}: mem_gb 'estimate' is per trial, but ray-slurm asks memory for "
                               "an allocation of several trials: give mem_gb as a number (GB per GPU's trial)")

    def _script(self, sub_id: str, n_trials: int) -> str:
        p = self.profile
        gpus = p.gpu_count()
        per_node = max(1, gpus)
        out_dir = self.sweep.path / "ray_slurm" / sub_id
        lines = ["#!/bin/bash",
                 f"#SBATCH --job-name={self.sweep.job_name(sub_id)}",
                 f"#SBATCH --comment={shlex.quote(f'orchestrate sweep={self.sweep.name} submission={sub_id}')}",
                 f"#SBATCH --nodes={p.nodes}",
                 "#SBATCH --ntasks-per-node=1",
                 # one trial per GPU, each with cpus_per_task CPUs (plus none for Ray itself: it idles)
                 f"#SBATCH --cpus-per-task={max(1, p.cpus_per_task) * per_node}",
                 f"#SBATCH --time={p.time_limit_min()}",
                 f"#SBATCH --signal=B:USR2@{p.signal_delay_s}",
                 "#SBATCH --requeue",
                 "#SBATCH --open-mode=append",
                 f"#SBATCH --output={out_dir}/%j.log"]
        if gpus:
            lines.append(f"#SBATCH --gpus-per-node={p.gpus_per_node}")
        if p.partition:
            lines.append(f"#SBATCH --partition={p.partition}")
        if p.account:
            lines.append(f"#SBATCH --account={p.account}")
        if p.qos:
            lines.append(f"#SBATCH --qos={p.qos}")
        if p.mem_gb:
            lines.append(f"#SBATCH --mem={int(p.mem_gb * 1024 * per_node)}M")
        for k, v in p.additional:
            lines.append(f"#SBATCH --{k.replace('_', '-')}" + ("" if v is True else f"={v}"))
        manifest = self.sweep.read_manifest()
        env = ray_auth_env(self.sweep)
        lines += ["", *p.setup, ""]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
        lines += [f"cd {shlex.quote(manifest.workdir or str(Path.cwd()))}",
                  f"exec {shlex.quote(sys.executable)} -m orchestrate.backends.ray_slurm allocation "
                  f"{shlex.quote(str(self.sweep.path))} {sub_id} --cpus-per-trial {max(1, p.cpus_per_task)} "
                  f"--gpus-per-trial {1 if gpus else 0}", ""]
        return "\n".join(lines)

    def submit(self, jobs: list[Job], on_submitted: OnSubmitted) -> None:
        keys = [j.trial.key for j in jobs]
        sub = self.sweep.new_submission(self.name, keys, {j.trial.key: j.run_id for j in jobs})
        out_dir = self.sweep.path / "ray_slurm" / sub.id
        out_dir.mkdir(parents=True, exist_ok=True)
        script = out_dir / "job.sbatch"
        script.write_text(self._script(sub.id, len(jobs)))
        job_id = slurm_commands.sbatch(script)
        sub.record_job(job_id)
        on_submitted({k: job_id for k in keys})
        print(f"[orchestrate] ray-slurm: allocation job {job_id} for {len(jobs)} trials; log {out_dir}/{job_id}.log",
              file=sys.stderr, flush=True)

    def live_jobs(self, settle_s: float = 90.0) -> dict[str, str]:
        # One allocation holds every trial of its submission.
        subs = {s.job_name(): s for s in self.sweep.submissions() if s.data.get("backend") == self.name}
        live: dict[str, str] = {}
        for job_id, name, _state in slurm_commands.settled_squeue(list(subs), settle_s):
            for k in subs[name].keys if name in subs else []:
                live[k] = job_id
        return live

    def cancel(self, job_ids: list[str]) -> None:
        slurm_commands.scancel(job_ids)

    def job_ends(self, job_ids: list[str]) -> dict[str, JobEnd | None]:
        return slurm_commands.job_ends(job_ids)


# ---- inside the allocation ------------------------------------------------------------------------------------------
def pick_free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _node_address(node: str) -> str:
    """The IP address of the SLURM node ``node``: its ``NodeAddr`` (what slurmctld reaches it by), resolved. A node
    name need not be a host name (``NodeName=gpu-1 NodeAddr=10.0.0.7``, or several ``slurmd`` of one host), so it is
    only the fallback when ``scontrol`` names no address."""
    out = slurm_commands.run(["scontrol", "-o", "show", "node", node])
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", out)
    return socket.gethostbyname(m.group(1) if m else node)


def _allocated_gpus() -> int:
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        v = os.environ.get(var, "")
        if v:
            try:
                return int(v.rsplit(":", 1)[-1])
            except ValueError:
                pass
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in cvd.split(",") if d.strip()]) if cvd else 0


def allocation(sweep_path: Path, sub_id: str, cpus_per_trial: int, gpus_per_trial: float) -> int:
    """The batch step: Ray head (+ workers) via srun, the Tune driver, USR2 → checkpoint all → requeue."""
    sweep = SweepDir(sweep_path.parent, sweep_path.name)
    job_id = os.environ["SLURM_JOB_ID"]
    nodes = slurm_commands.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]).split()
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE", os.cpu_count() or 1))
    gpus = _allocated_gpus()
    head_ip = _node_address(nodes[0])
    ray_bin = str(Path(sys.executable).with_name("ray"))

    def common(port: int) -> list[str]:
        tmp = f"/tmp/ray-{job_id}-{port}"  # short (Ray keeps unix sockets under it) and unique per allocation
        return ["--num-cpus", str(cpus), "--num-gpus", str(gpus), "--temp-dir", tmp, "--disable-usage-stats",
                "--block"]

    def launch(port: int) -> subprocess.Popen[bytes]:
        print(f"[orchestrate] ray-slurm job {job_id}: head {head_ip}:{port} with {cpus} CPUs, {gpus} GPUs; "
              f"{len(nodes) - 1} worker nodes", flush=True)
        return subprocess.Popen(["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", nodes[0], ray_bin, "start",
                                 "--head", "--node-ip-address", head_ip, "--port", str(port),
                                 "--include-dashboard=false", *common(port)])

    head, port = start_head(launch, lambda p, proc: wait_for_head(f"{head_ip}:{p}", ray_bin, proc))
    address = f"{head_ip}:{port}"
    steps = [head]
    for node in nodes[1:]:
        steps.append(subprocess.Popen(["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w", node, ray_bin, "start",
                                       "--address", address, *common(port)]))
    flag = sweep.path / "ray_slurm" / sub_id / PREEMPT_FLAG
    flag.unlink(missing_ok=True)
    preempted: list[int] = []

    def on_usr2(signum: int, frame: FrameType | None) -> None:
        preempted.append(signum)
        flag.touch()  # every trial wrapper watches it and passes USR2 to its trainer

    signal.signal(signal.SIGUSR2, on_usr2)
    restore = (sweep.path / "tune" / sub_id).exists()
    try:
        drive(sweep.path, sub_id, cpus_per_trial, restore, address=address, gpus_per_trial=gpus_per_trial,
              preempt_flag=flag)
    finally:
        for s in steps:
            s.terminate()
        for s in steps:
            try:
                s.wait(timeout=30)
            except subprocess.TimeoutExpired:
                s.kill()
    if preempted:
        left = _unfinished(sweep, sub_id)
        if not left:
            print(f"[orchestrate] ray-slurm job {job_id}: every trial finished or was cancelled; not requeued",
                  flush=True)
            return EXIT_OK
        print(f"[orchestrate] ray-slurm job {job_id}: {len(left)} trials checkpointed after USR2; requeueing",
              flush=True)
        slurm_commands.requeue(job_id)
        return EXIT_PREEMPTED  # the trial job's "checkpointed, run me again", for the allocation as a whole
    return EXIT_OK


def _unfinished(sweep: SweepDir, sub_id: str) -> list[str]:
    """The submission's trials that are neither finished (``DONE``) nor cancelled (``CANCELLED``)."""
    out = []
    for key in sweep.submission(sub_id).keys:
        folder = TrialFolder(sweep.trial_dir(key))
        if not folder.done.exists() and not folder.cancelled.exists():
            out.append(key)
    return out


HEAD_TRIES = 3  # ports tried for the Ray head: a free port can be taken by another process before Ray binds it


def start_head(launch: Callable[[int], subprocess.Popen[bytes]],
               wait: Callable[[int, subprocess.Popen[bytes]], None], tries: int = HEAD_TRIES,
               free_port: Callable[[], int] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Start the Ray head (``launch(port)``) and wait for it (``wait(port, process)``, BackendError when it exits
    first); a head that exits before it is up (its port taken meanwhile: "Failed to start the grpc server ...
    Address already in use") is started again on another free port, up to ``tries`` times. (head, port)."""
    pick = free_port or pick_free_port
    for attempt in range(1, tries + 1):
        port = pick()
        head = launch(port)
        try:
            wait(port, head)
            return head, port
        except BackendError as e:
            if head.poll() is None:
                head.terminate()
            if attempt == tries:
                raise BackendError(f"{e} ({tries} ports tried)") from None
            print(f"[orchestrate] ray-slurm: {e} (port {port}); trying another port", flush=True)
    raise AssertionError("unreachable")


def wait_for_head(address: str, ray_bin: str, head: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Return once ``ray status`` answers at ``address``; BackendError if the head exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise BackendError(f"the Ray head exited with {head.returncode} before it was up")
        p = subprocess.run([ray_bin, "status", "--address", address], capture_output=True, text=True)
        if p.returncode == 0:
            return
        time.sleep(2.0)
    raise BackendError(f"the Ray head at {address} did not come up within {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrate.backends.ray_slurm allocation ...``: what the sbatch script runs."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m orchestrate.backends.ray_slurm")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("allocation", help="run inside the sbatch job: Ray cluster + Tune driver")
    a.add_argument("sweep_path", type=Path)
    a.add_argument("submission")
    a.add_argument("--cpus-per-trial", type=int, default=1)
    a.add_argument("--gpus-per-trial", type=float, default=0)
    args = p.parse_args(argv)
    return allocation(args.sweep_path, args.submission, args.cpus_per_trial, args.gpus_per_trial)


if __name__ == "__main__":
    sys.exit(main())
