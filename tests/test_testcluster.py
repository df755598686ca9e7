"""The local SLURM test cluster is a real one: GPUs scheduled by gres, accounting through slurmdbd, requeue,
signals and node failures behave as on a production cluster, and start.sh cleans up after dead sessions."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.plugins.slurm_cluster import TESTCLUSTER, SlurmCluster, SlurmCommandError, _refuse

pytestmark = pytest.mark.timeout(300)


# squeue's pending reasons for a job that cannot start because its only node is down
_NODE_DOWN_REASONS = ("DOWN", "Nodes required", "ReqNodeNotAvail", "Resources")


def _held_for_the_down_node(cluster: SlurmCluster, job: str, timeout: float = 30) -> str:
    """Poll until the scheduler has considered ``job`` and held it for want of the node; returns the reason.
    Fails at once if the job leaves PENDING (it ran on a DOWN node), or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    state = reason = ""
    while time.monotonic() < deadline:
        out = cluster.run("squeue", "-h", "-j", job, "-o", "%T|%r").stdout.strip()
        state, _, reason = out.partition("|")
        assert state == "PENDING", f"job {job} is {state or 'gone'} ({reason}) with the node down"
        if any(r in reason for r in _NODE_DOWN_REASONS):
            return reason
        time.sleep(0.25)  # no scheduling pass has looked at the job yet (reason "None")
    raise TimeoutError(f"job {job} still {state} with reason {reason!r} after {timeout:.0f}s; slurmctld log tail:\n"
                       f"{cluster.log_tail('slurmctld')}")


def _wait_for_file_text(path: Path, pattern: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and re.search(pattern, text := path.read_text()):
            return text
        time.sleep(0.2)
    raise TimeoutError(f"{path} never matched {pattern!r}; it holds: {path.read_text() if path.exists() else '(missing)'}")


@pytest.mark.slurm
def test_cluster_is_registered_with_accounting_and_has_two_fake_a100s(slurm_cluster: SlurmCluster) -> None:
    print(f"cluster start took {slurm_cluster.start_seconds:.1f} s")
    clusters = slurm_cluster.run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster,controlhost").stdout
    assert f"{slurm_cluster.cluster_name}|127.0.0.1" in clusters.splitlines()
    assocs = slurm_cluster.run("sacctmgr", "-n", "-P", "list", "assoc", "format=account,user").stdout.splitlines()
    assert f"{slurm_cluster.account}|root" in assocs
    node = slurm_cluster.scontrol("-o", "show", "node", slurm_cluster.node)
    assert "Gres=gpu:a100:2" in node
    assert re.search(r"CfgTRES=\S*gres/gpu=2", node), node
    partitions = slurm_cluster.run("sinfo", "-h", "-o", "%P").stdout.split()
    assert "gpu*" in partitions and "debug" in partitions


@pytest.mark.slurm
def test_gpu_request_sets_cuda_visible_devices_and_sacct_records_completion(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    one = slurm_cluster.sbatch(
        "--gpus-per-node=a100:1", f"--output={tmp_path}/one.out", f"--chdir={tmp_path}", "--job-name=gpu-one",
        script="#!/bin/bash\necho CVD=$CUDA_VISIBLE_DEVICES\n",
    )
    two = slurm_cluster.sbatch(
        "--gpus-per-node=a100:2", f"--output={tmp_path}/two.out", f"--chdir={tmp_path}", "--job-name=gpu-two",
        script="#!/bin/bash\necho CVD=$CUDA_VISIBLE_DEVICES\n",
    )
    assert slurm_cluster.wait_for_accounting(one, "COMPLETED") == "COMPLETED"
    assert slurm_cluster.wait_for_accounting(two, "COMPLETED") == "COMPLETED"
    assert re.fullmatch(r"CVD=[01]\n", (tmp_path / "one.out").read_text())
    assert (tmp_path / "two.out").read_text() == "CVD=0,1\n"
    rows = slurm_cluster.sacct(one, fields=("JobID", "State", "ExitCode", "AllocTRES"))
    alloc = next(r for r in rows if r["JobID"] == one)
    assert alloc["ExitCode"] == "0:0" and "gres/gpu=1" in alloc["AllocTRES"], rows


@pytest.mark.slurm
def test_more_gpus_than_the_node_has_is_refused(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    with pytest.raises(SlurmCommandError, match="(?i)requested node configuration is not available"):
        slurm_cluster.sbatch("--gpus-per-node=a100:3", f"--chdir={tmp_path}", script="#!/bin/bash\ntrue\n")


@pytest.mark.slurm
def test_scontrol_requeue_restarts_a_running_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "requeue.out"
    job = slurm_cluster.sbatch(
        f"--output={out}", "--open-mode=append", f"--chdir={tmp_path}", "--job-name=requeue",
        script="#!/bin/bash\necho start restarts=${SLURM_RESTART_COUNT:-0}\nsleep 120\n",
    )
    try:
        slurm_cluster.wait_for_state(job, "RUNNING")
        _wait_for_file_text(out, r"start restarts=0")
        slurm_cluster.scontrol("requeue", job)
        # cred_expire=5 in the test cluster lets a requeued job start again after seconds, not two minutes.
        _wait_for_file_text(out, r"start restarts=1", timeout=90)
        assert slurm_cluster.job_state(job) == "RUNNING"
        assert "Restarts=1" in slurm_cluster.scontrol("show", "job", job)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    slurm_cluster.wait_for_accounting(job, "CANCELLED")
    # The interrupted first run is kept in accounting as its own REQUEUED record.
    history = slurm_cluster.run("sacct", "-n", "-P", "-D", "-X", "-j", job, "-o", "State").stdout.split()
    assert history[0] == "REQUEUED", history


@pytest.mark.slurm
def test_usr2_reaches_the_batch_script(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "signal.out"
    script = (
        "#!/bin/bash\n"
        "trap 'echo got USR2; exit 0' USR2\n"
        "echo ready\n"
        "for i in $(seq 600); do sleep 0.1; done\n"
        "echo no signal\n"
        "exit 1\n"
    )
    job = slurm_cluster.sbatch(f"--output={out}", f"--chdir={tmp_path}", "--signal=B:USR2@120", "--time=10", script=script)
    slurm_cluster.wait_for_state(job, "RUNNING")
    _wait_for_file_text(out, "ready")
    slurm_cluster.run("scancel", "--signal=USR2", "--batch", job)
    assert slurm_cluster.wait_for_accounting(job, ("COMPLETED", "FAILED")) == "COMPLETED"
    assert out.read_text() == "ready\ngot USR2\n"
    # The time limit and the warning signal were recorded as submitted (what a 48-hour profile relies on).
    shown = slurm_cluster.scontrol("show", "job", job)
    assert "TimeLimit=00:10:00" in shown


@pytest.mark.slurm
def test_node_down_holds_jobs_and_resume_runs_them(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    slurm_cluster.scontrol("update", f"nodename={slurm_cluster.node}", "state=down", "reason=test-down")
    try:
        assert slurm_cluster.wait_for_node(("down", "down*")).startswith("down")
        job = slurm_cluster.sbatch(f"--output={tmp_path}/down.out", f"--chdir={tmp_path}", script="#!/bin/bash\necho ran\n")
        _held_for_the_down_node(slurm_cluster, job)
        assert slurm_cluster.job_state(job) == "PENDING"
    finally:
        slurm_cluster.scontrol("update", f"nodename={slurm_cluster.node}", "state=resume", check=False)
    assert slurm_cluster.wait_for_accounting(job, "COMPLETED") == "COMPLETED"
    assert not slurm_cluster.node_state().startswith(("down", "drain"))
    assert (tmp_path / "down.out").read_text() == "ran\n"


@pytest.mark.slurm
def test_the_node_offers_every_cpu_of_the_host_whatever_omp_num_threads_says(slurm_cluster: SlurmCluster) -> None:
    """``nproc`` answers OMP_NUM_THREADS (1 under ./scripts/test.sh, and on many login nodes): a node sized by it
    had 1 CPU, and a ray-slurm allocation of 2 stayed PENDING (PartitionConfig) for good."""
    host = int(os.environ.get("TESTCLUSTER_CPUS") or len(os.sched_getaffinity(0)))
    node = slurm_cluster.scontrol("-o", "show", "node", slurm_cluster.node)
    assert f"CPUTot={host} " in node, (os.environ.get("OMP_NUM_THREADS"), node)


@pytest.mark.slurm
def test_start_again_is_idempotent(slurm_cluster: SlurmCluster) -> None:
    run_dir = slurm_cluster.state_dir / "run"
    before = {p.name: p.read_text().strip() for p in run_dir.glob("*.pid")}
    assert set(before) == {"munged.pid", "mariadbd.pid", "slurmdbd.pid", "slurmctld.pid", "slurmd.pid"}
    proc = subprocess.run(
        ["bash", str(TESTCLUSTER / "start.sh"), str(slurm_cluster.state_dir)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"export SLURM_CONF={slurm_cluster.conf}"
    after = {p.name: p.read_text().strip() for p in run_dir.glob("*.pid")}
    assert after == before  # nothing was restarted
    assert slurm_cluster.node_state() in {"idle", "mixed", "allocated"}


def _start_lone_munged(state_dir: Path) -> int:
    """A munged laid out as start.sh lays it out under STATE_DIR: what a dead session leaves running."""
    for sub in ("munge", "run", "log", "etc"):
        (state_dir / sub).mkdir(parents=True, exist_ok=True)
    key = state_dir / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (state_dir / "munge").chmod(0o700)
    subprocess.run(
        ["munged", "--force", f"--socket={state_dir}/munge/munge.socket", f"--key-file={key}",
         f"--pid-file={state_dir}/run/munged.pid", f"--log-file={state_dir}/log/munged.log",
         f"--seed-file={state_dir}/munge/munged.seed"],
        check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30,
    )
    deadline = time.monotonic() + 10
    while not (state_dir / "run" / "munged.pid").exists():
        assert time.monotonic() < deadline, "munged wrote no pid file"
        time.sleep(0.1)
    return int((state_dir / "run" / "munged.pid").read_text())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slurm
def test_start_stops_clusters_left_by_dead_sessions(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("starting munged needs root")
    registry = tmp_path / "registry"
    registry.mkdir()
    orphan_dir = tmp_path / "orphan"  # its owner (a test session) has exited
    gone_dir = tmp_path / "gone"  # its state dir was deleted (pytest rotates old temporary folders)
    live_dir = tmp_path / "live"  # owned by this very process: must survive
    orphan = _start_lone_munged(orphan_dir)
    gone = _start_lone_munged(gone_dir)
    live = _start_lone_munged(live_dir)
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        (orphan_dir / "owner").write_text(f"{dead.pid} 0\n")
        start_time = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[19]
        (live_dir / "owner").write_text(f"{os.getpid()} {start_time}\n")
        (registry / "clusters").write_text(f"{orphan_dir}\n{gone_dir}\n{live_dir}\n")
        subprocess.run(["rm", "-rf", str(gone_dir)], check=True)

        proc = subprocess.run(
            ["bash", str(TESTCLUSTER / "start.sh"), str(slurm_cluster.state_dir)],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
            env={**os.environ, "TESTCLUSTER_REGISTRY_DIR": str(registry)},
        )
        assert proc.returncode == 0, proc.stderr
        assert f"stopping stale cluster {orphan_dir} (its owner" in proc.stderr
        assert f"stopping stale cluster {gone_dir} (its state dir is gone)" in proc.stderr
        deadline = time.monotonic() + 10
        while (_alive(orphan) or _alive(gone)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(orphan) and not _alive(gone)
        assert _alive(live)
        listed = (registry / "clusters").read_text().split()
        assert str(orphan_dir) not in listed and str(gone_dir) not in listed and str(live_dir) in listed
    finally:
        for pid in (orphan, gone, live):
            if _alive(pid):
                os.kill(pid, 15)


@pytest.mark.slurm
def test_localtest_profile_is_accepted_and_unknown_accounts_are_not(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    import yaml

    profile = yaml.safe_load((TESTCLUSTER.parent / "profiles" / "localtest.yaml").read_text())
    args = [
        f"--partition={profile['partition']}", f"--account={profile['account']}", f"--qos={profile['qos']}",
        f"--gpus-per-node={profile['gpus_per_node']}", f"--cpus-per-task={profile['cpus_per_task']}",
        f"--mem={profile['mem_gb']}G", f"--time={profile['time_limit']}",
        f"--signal=USR2@{profile['signal_delay_s']}", f"--array=0-1%{profile['max_parallel']}",
        f"--output={tmp_path}/p-%a.out", f"--chdir={tmp_path}",
    ]
    body = "#!/bin/bash\n" + "\n".join(profile["setup"]) + "\necho task=$SLURM_ARRAY_TASK_ID omp=$OMP_NUM_THREADS\n"
    job = slurm_cluster.sbatch(*args, script=body)
    for task in (0, 1):
        assert slurm_cluster.wait_for_accounting(f"{job}_{task}", "COMPLETED") == "COMPLETED"
        assert (tmp_path / f"p-{task}.out").read_text() == f"task={task} omp=1\n"
    # Associations are enforced, as on a real cluster: a typo in a profile's account is refused at submission.
    with pytest.raises(SlurmCommandError, match="(?i)invalid account"):
        slurm_cluster.sbatch("--account=no_such_account", f"--chdir={tmp_path}", script="#!/bin/bash\ntrue\n")


@pytest.mark.parametrize("ci", ["true", "1"])
def test_unavailable_cluster_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="required under CI but cannot start: needs root"):
        _refuse("needs root")


def test_unavailable_cluster_is_skipped_with_the_reason_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="SLURM test cluster unavailable: needs root"):
        _refuse("needs root")
