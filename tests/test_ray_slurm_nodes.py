"""``ray-slurm`` across an allocation of two nodes, on a real two-node SLURM cluster of this machine.

The cluster is ``slurm/testcluster/start.sh`` with ``TESTCLUSTER_NODES=2``: two ``slurmd`` of this host (nodes
``HOST-1`` and ``HOST-2``, each with its own port, spool dir and log, 1 fake A100 and nproc CPUs), under
``$SLURM_TEST_STATE-nodes2`` (reused, left running) when ``SLURM_TEST_STATE`` is set, else under pytest's temporary
folder (stopped at the end); its ports are chosen free at random, so it runs beside the session's cluster.

A sweep of four probe trials goes out with the real ``RaySlurmBackend`` and a profile with ``nodes: 2`` and one GPU
per node: one ``sbatch`` allocation of both nodes whose batch step starts the Ray head on the first node and a
worker on the second (each by ``srun``) and runs the Tune driver, one trial per GPU. The only thing replaced is the
trial's command (:func:`probe_command` instead of the trainer): the probe records the SLURM node it runs on
(``SLURMD_NODENAME``, which the ``srun`` step that started its Ray node set), then holds its GPU until some trial
has run on another node (at most :data:`HOLD_S` seconds), so a second trial can only start on the other Ray node:
with a worker that never joins, every trial runs on the head node one after another and the test fails (after
about a minute: only the first probe waits).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrate.backends.base import Job
from orchestrate.plan.profile import Profile
from orchestrate.backends.ray_slurm import RaySlurmBackend
from orchestrate.sweep.folder import Manifest, SweepDir, new_sweep_id
from tests.plugins.slurm_cluster import SlurmCluster, own_cluster

REPO = Path(__file__).resolve().parents[1]
N_NODES = 2
N_TRIALS = 4
HOLD_S = 45.0  # how long a probe holds its GPU waiting for a trial on another node
RAN = "ran.jsonl"  # in each trial folder: one line per start of the probe
ENTRY = "-m orchestrate.backends.ray_slurm allocation"  # what the allocation's batch step runs

# The probe trial: python -c PROBE TRIAL_DIR NODES HOLD_S. Records where it runs, waits until trials of the sweep
# have run on NODES nodes (or HOLD_S s; no waiting once a trial has finished without that: the wait has failed),
# then leaves DONE as a finished trial job does, and exits 0.
PROBE = """
import json, os, socket, sys, time
from pathlib import Path
folder, nodes, hold = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rec = {"node": os.environ.get("SLURMD_NODENAME", ""), "job": os.environ.get("SLURM_JOB_ID", ""),
       "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
with open(folder / "ran.jsonl", "a") as f:
    f.write(json.dumps(rec) + "\\n")
def seen():
    return {json.loads(line)["node"] for p in folder.parent.glob("*/ran.jsonl") for line in p.read_text().splitlines()}
deadline = time.monotonic() + hold
while len(seen()) < nodes and not any(folder.parent.glob("*/DONE")) and time.monotonic() < deadline:
    time.sleep(0.2)
(folder / "DONE").write_text("finished\\n")
"""


def probe_command(trial_dir: Path, tracking_uri: str, run_id: str, python: str | None = None) -> list[str]:
    """Stands in for :func:`asr_core.contract.trial.trial_command` inside the allocation: the probe above."""
    return [python or sys.executable, "-c", PROBE, str(trial_dir), str(N_NODES), str(HOLD_S)]


class ProbeRaySlurmBackend(RaySlurmBackend):
    """The real backend; its batch step runs this module (the real allocation, with :func:`probe_command`)."""

    def _script(self, sub_id: str, n_trials: int) -> str:
        script = super()._script(sub_id, n_trials)
        assert script.count(ENTRY) == 1, f"the batch script no longer runs `{ENTRY}`:\n{script}"
        return script.replace(ENTRY, "-m tests.test_ray_slurm_nodes allocation")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A cluster of its own with two nodes (see the module docstring)."""
    yield from own_cluster(tmp_path_factory, f"nodes{N_NODES}",
                           {"TESTCLUSTER_NODES": str(N_NODES), "TESTCLUSTER_NAME": "twonodes",
                            "TESTCLUSTER_GPUS": "1", "TESTCLUSTER_CPUS": None}, "the two-node test cluster")


def cluster_nodes(cluster: SlurmCluster) -> list[str]:
    return sorted(cluster.run("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N").stdout.split())


def wait_for_end(cluster: SlurmCluster, job_id: str, log: Path, timeout: float) -> str:
    """The state the allocation ended in (accounting), with its log in the message when it does not end in time."""
    try:
        cluster.wait_for_state(job_id, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"], timeout)
        return cluster.wait_for_accounting(job_id, ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"], 30)
    except TimeoutError as e:
        cluster.run("scancel", job_id, check=False)
        text = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
        raise AssertionError(f"{e}\nallocation log {log}:\n{text}") from None


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_two_node_allocation_runs_trials_on_both_nodes(two_nodes: SlurmCluster, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrate.tools.fake_sweep import fake_trials

    nodes = cluster_nodes(two_nodes)
    assert len(nodes) == N_NODES, nodes
    # The backend's SLURM commands and the allocation (which inherits this environment) use this cluster; the
    # batch step imports this module.
    monkeypatch.setenv("SLURM_CONF", str(two_nodes.conf))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    two_nodes.cancel_all()

    sweep = SweepDir(tmp_path / "runs", "nodes2")
    trials = fake_trials(N_TRIALS)
    sweep.write_manifest(Manifest(name=sweep.name, grid="", backend="ray-slurm", profile="two-nodes",
                                  tracking_uri="sqlite:///unused.db", created=time.time(), workdir=str(REPO),
                                  sweep_id=new_sweep_id(), allow_sqlite=True))
    sweep.write_trials(trials)
    for t in trials:
        sweep.trial_dir(t.key).mkdir(parents=True)
    profile = Profile(name="two-nodes", partition="gpu", nodes=N_NODES, gpus_per_node="a100:1", cpus_per_task=1,
                      mem_gb=1, time_limit="00:10:00", signal_delay_s=30)
    backend = ProbeRaySlurmBackend(sweep, "sqlite:///unused.db", profile)
    backend.validate()

    t0 = time.monotonic()
    backend.submit([Job(t, f"run-{t.key}", sweep.trial_dir(t.key)) for t in trials], lambda ids: None)
    (sub,) = sweep.submissions()
    job_id = str(sub.job_id)
    out_dir = sweep.path / "ray_slurm" / sub.id
    log = out_dir / f"{job_id}.log"
    state = wait_for_end(two_nodes, job_id, log, timeout=240)
    took = time.monotonic() - t0
    text = log.read_text(errors="replace") if log.exists() else "(no log)"
    assert state == "COMPLETED", f"allocation {job_id} ended {state}; its log:\n{text[-4000:]}"

    # Every trial ran once, finished, and the trials ran on both nodes.
    ran = {t.key: [json.loads(line) for line in (sweep.trial_dir(t.key) / RAN).read_text().splitlines()]
           if (sweep.trial_dir(t.key) / RAN).exists() else [] for t in trials}
    print(f"{N_TRIALS} probe trials on {N_NODES} nodes: allocation {job_id} took {took:.1f} s from submit; "
          f"nodes: {sorted(r[0]['node'] for r in ran.values() if r)}")
    assert all(len(recs) == 1 for recs in ran.values()), ran
    assert all((sweep.trial_dir(t.key) / "DONE").exists() for t in trials)
    assert {recs[0]["job"] for recs in ran.values()} == {job_id}
    assert sorted({recs[0]["node"] for recs in ran.values()}) == nodes, ran

    # One allocation of both nodes, the Ray head on the first and a worker (by srun) on the second.
    assert "#SBATCH --nodes=2" in (out_dir / "job.sbatch").read_text()
    (alloc,) = [r for r in two_nodes.sacct(job_id, ("JobID", "NNodes", "NodeList")) if r["JobID"] == job_id]
    assert alloc["NNodes"] == str(N_NODES), alloc
    assert f"ray-slurm job {job_id}: head 127.0.0.1:" in text and "1 worker nodes" in text, text[-4000:]
    steps = two_nodes.sacct(job_id, ("JobID", "JobName", "NodeList"))
    ray_steps = {r["JobID"]: r["NodeList"] for r in steps if r["JobName"] == "ray"}
    assert ray_steps == {f"{job_id}.0": nodes[0], f"{job_id}.1": nodes[1]}, steps  # the head's srun comes first

if __name__ == "__main__":
    # The allocation's batch step (see ProbeRaySlurmBackend): the real one, with the probe as the trial command.
    from orchestrate.backends import ray_slurm, tune_driver

    tune_driver.trial_command = probe_command
    sys.exit(ray_slurm.main())


@pytest.mark.slow
def test_a_ray_head_whose_port_was_taken_starts_again_on_another(tmp_path: Path) -> None:
    """The allocation's Ray head: a free port taken by another process before Ray binds it (seen in CI: "Failed to
    start the grpc server ... port 38501") made the head exit, the allocation end and its trials wait for ever. A
    real ``ray start --head`` (no srun: the launch is the one thing replaced, so the test says so) is given a port
    this test holds first: it exits (after some 40 s of Ray's own retries), and the head comes up on the next port
    tried."""
    import shutil
    import socket
    import subprocess
    import tempfile

    from orchestrate.backends.ray_slurm import pick_free_port, start_head, wait_for_head

    ray_bin = str(Path(sys.executable).with_name("ray"))
    held = socket.socket()
    held.bind(("0.0.0.0", 0))  # as another process's server would hold it
    held.listen()
    ports = iter([held.getsockname()[1], pick_free_port()])
    started: list[subprocess.Popen[bytes]] = []
    short = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's unix sockets live under it: at most 107 bytes

    def launch(port: int) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen([ray_bin, "start", "--head", "--node-ip-address", "127.0.0.1", "--port",
                                         str(port), "--include-dashboard=false", "--num-cpus", "1",
                                         "--temp-dir", f"{short}/r{port}", "--disable-usage-stats",
                                         "--block"],
                                        stdout=open(tmp_path / f"head{port}.log", "w"), stderr=subprocess.STDOUT))
        return started[-1]

    try:
        head, port = start_head(launch, lambda p, proc: wait_for_head(f"127.0.0.1:{p}", ray_bin, proc, 150.0),
                                free_port=lambda: next(ports))
        assert len(started) == 2 and started[0].poll() is not None and head is started[1] and head.poll() is None
        assert port != held.getsockname()[1]
    finally:
        held.close()
        for p in started:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=60)
        shutil.rmtree(short, ignore_errors=True)
