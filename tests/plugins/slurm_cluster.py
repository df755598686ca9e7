"""The `slurm_cluster` fixture: a real single-node SLURM cluster with accounting, for the whole test session.

The cluster is started by `slurm/testcluster/start.sh` under a temporary folder (or under the folder named by the
environment variable SLURM_TEST_STATE, which is then reused and left running for the next session), SLURM_CONF is
set in `os.environ` for the session so that every `sbatch`, `sacct` and submitit call in the tests talks to it,
and it is stopped when the session ends.

Without root the cluster cannot start: locally the SLURM tests are skipped with the reason; under CI (CI=true)
that is a failure, so that CI never passes without having run them.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTCLUSTER = REPO / "slurm" / "testcluster"

# Job states after which a job never runs again (sacct spellings; "CANCELLED by 0" is cut to its first word).
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)


class SlurmCommandError(RuntimeError):
    """A SLURM command exited non-zero; the message carries the command, its exit status and its stderr."""


@dataclass
class SlurmCluster:
    """A running test cluster. All helpers run the SLURM client commands against this cluster's SLURM_CONF."""

    state_dir: Path
    conf: Path
    node: str
    cluster_name: str = "testcluster"
    account: str = "asr"
    partition: str = "gpu"
    start_seconds: float = 0.0
    env: dict[str, str] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Runs a command with this cluster's SLURM_CONF; raises SlurmCommandError when `check` and it fails."""
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and proc.returncode != 0:
            raise SlurmCommandError(
                f"`{shlex.join(argv)}` exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    def scontrol(self, *args: str, check: bool = True) -> str:
        """`scontrol ARGS...`; returns stdout."""
        return self.run("scontrol", *args, check=check).stdout

    def sbatch(self, *args: str, script: str | None = None, cwd: Path | None = None) -> str:
        """Submits with `sbatch --parsable ARGS...` (the batch script on stdin when `script` is given); returns
        the job id (for an array, the array's job id). Without `cwd` or an `--output`, the job's output goes to
        the cluster's log folder, never into the folder the tests run from."""
        has_output = any(a.startswith(("--output", "-o")) for a in args)
        out = [] if has_output or cwd is not None else [f"--output={self.log_dir / 'sbatch-%j.out'}"]
        argv = ["sbatch", "--parsable", *out, *args]
        proc = subprocess.run(
            argv, input=script, capture_output=True, text=True, timeout=60, env=self.env, cwd=cwd
        )
        if proc.returncode != 0:
            raise SlurmCommandError(f"`{shlex.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def sacct(self, job_id: str, fields: Sequence[str] = ("JobID", "JobName", "State", "ExitCode")) -> list[dict[str, str]]:
        """One dict per job and step that `sacct -j JOB_ID` lists (empty until slurmdbd has recorded the job)."""
        out = self.run("sacct", "-n", "-P", "-j", job_id, "-o", ",".join(fields)).stdout
        return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line.strip()]

    def squeue_state(self, job_id: str) -> str | None:
        """The state squeue shows for JOB_ID (e.g. PENDING, RUNNING), or None when squeue no longer lists it."""
        out = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).stdout.split()
        return out[0] if out else None

    def job_state(self, job_id: str) -> str | None:
        """The job's current state: squeue's while the controller holds the job, else the allocation's state in
        accounting (first word only, e.g. CANCELLED for "CANCELLED by 0"); None when neither knows the job."""
        state = self.squeue_state(job_id)
        if state is not None:
            return state
        rows = [r for r in self.sacct(job_id) if r["JobID"] == job_id]
        return rows[0]["State"].split()[0] if rows else None

    def wait_for_state(self, job_id: str, states: str | Sequence[str], timeout: float = 60.0) -> str:
        """Polls until the job is in one of STATES; returns it. Raises TimeoutError (with the state seen last and
        the slurmctld log tail) after `timeout` s, or AssertionError when the job ends in another state."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in wanted:
                return state
            if state in TERMINAL_STATES and not wanted & TERMINAL_STATES:
                raise AssertionError(f"job {job_id} ended {state} while waiting for {sorted(wanted)}")
            time.sleep(0.25)
        raise TimeoutError(
            f"job {job_id} not in {sorted(wanted)} after {timeout:.0f}s (last state {state}); "
            f"slurmctld log tail:\n{self.log_tail('slurmctld')}"
        )

    def wait_for_accounting(self, job_id: str, states: str | Sequence[str], timeout: float = 60.0) -> str:
        """Polls sacct (not squeue) until it records the job's allocation in one of STATES; slurmdbd records
        completions a moment after the controller, so use this before asserting on sacct."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            rows = [r for r in self.sacct(job_id) if r["JobID"] == job_id]
            state = rows[0]["State"].split()[0] if rows else None
            if state in wanted:
                return state
            time.sleep(0.25)
        raise TimeoutError(f"sacct shows job {job_id} as {state}, not {sorted(wanted)}, after {timeout:.0f}s")

    def node_state(self) -> str:
        """The node's state as sinfo prints it (e.g. idle, mixed, down, idle*)."""
        return self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%T").stdout.split()[0]

    def wait_for_node(self, states: str | Sequence[str], timeout: float = 60.0) -> str:
        """Polls until the node's state is one of STATES; returns it."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            if state in wanted:
                return state
            time.sleep(0.25)
        raise TimeoutError(f"node {self.node} is {state!r}, not {sorted(wanted)}, after {timeout:.0f}s")

    def cancel_all(self) -> None:
        """Cancels every job the controller still holds (tests that leave jobs behind free the node for the next)."""
        ids = self.run("squeue", "-h", "-o", "%A").stdout.split()
        if ids:
            self.run("scancel", *ids, check=False)

    def log_tail(self, daemon: str, lines: int = 30) -> str:
        """The last lines of DAEMON's log (slurmctld, slurmd, slurmdbd, munged, mariadbd)."""
        path = self.log_dir / f"{daemon}.log"
        if not path.exists():
            return f"({path} does not exist)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


_TIMINGS: dict[str, float] = {}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001 (pytest hook)
    """One line in the summary with how long the cluster took to start and stop, when a test used it."""
    if _TIMINGS:
        parts = [f"{k} {v:.1f} s" for k, v in _TIMINGS.items()]
        terminalreporter.write_line(f"SLURM test cluster: {', '.join(parts)}")


def _refuse(reason: str) -> None:
    """Fails under CI, skips elsewhere: CI must never pass with the SLURM tests quietly not run."""
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"the SLURM test cluster is required under CI but cannot start: {reason}", pytrace=False)
    pytest.skip(f"SLURM test cluster unavailable: {reason}")


def _node_name(conf: Path) -> str:
    for line in conf.read_text().splitlines():
        if line.startswith("NodeName="):
            return line.split()[0].split("=", 1)[1]
    raise RuntimeError(f"{conf} defines no NodeName")


def start_cluster(state_dir: Path, *, owner_pid: int | None, timeout: float = 180) -> SlurmCluster:
    """Runs start.sh on STATE_DIR and returns the cluster; raises RuntimeError with start.sh's output on failure."""
    env = dict(os.environ)
    env.pop("SLURM_CONF", None)
    if owner_pid is not None:
        env["TESTCLUSTER_OWNER_PID"] = str(owner_pid)
    t0 = time.monotonic()
    # stdout/stderr go to a file, not a pipe: the daemons are detached, but a pipe held open by any of them
    # would keep subprocess waiting.
    log = state_dir.parent / f"{state_dir.name}-start.log"
    with open(log, "w") as fh:
        proc = subprocess.run(
            ["bash", str(TESTCLUSTER / "start.sh"), str(state_dir)],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, timeout=timeout,
        )
    output = log.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"slurm/testcluster/start.sh {state_dir} exited {proc.returncode}:\n{output[-4000:]}")
    seconds = time.monotonic() - t0
    conf = state_dir / "etc" / "slurm.conf"
    env["SLURM_CONF"] = str(conf)
    return SlurmCluster(state_dir=state_dir, conf=conf, node=_node_name(conf), start_seconds=seconds, env=env)


def stop_cluster(state_dir: Path, timeout: float = 120) -> str:
    """Runs stop.sh on STATE_DIR; returns its output."""
    proc = subprocess.run(
        ["bash", str(TESTCLUSTER / "stop.sh"), str(state_dir)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout,
    )
    return proc.stdout + proc.stderr


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real SLURM cluster (munged, MariaDB, slurmdbd, slurmctld, slurmd; node with gpu:a100:2) for the session.

    SLURM_CONF is set in os.environ while the session runs. With SLURM_TEST_STATE=DIR the cluster under DIR is
    started if needed and left running afterwards (fast reruns); otherwise it lives under a temporary folder and
    is stopped at the end of the session.
    """
    reuse = os.environ.get("SLURM_TEST_STATE")
    if reuse:
        state_dir = Path(reuse).resolve()
    else:
        # A short path: the MariaDB and MUNGE sockets live under it and unix socket paths are limited.
        state_dir = tmp_path_factory.mktemp("slurm")
    if os.geteuid() != 0:
        conf = state_dir / "etc" / "slurm.conf"
        if not (reuse and conf.exists() and _controller_up(conf)):
            _refuse(
                "starting it needs root (munged, MariaDB and the SLURM daemons are started by "
                "slurm/testcluster/start.sh); run the tests as root, or start a cluster as root with "
                "`sudo slurm/testcluster/start.sh DIR` and set SLURM_TEST_STATE=DIR"
            )
        env = {**os.environ, "SLURM_CONF": str(conf)}
        cluster = SlurmCluster(state_dir=state_dir, conf=conf, node=_node_name(conf), env=env)
    else:
        try:
            cluster = start_cluster(state_dir, owner_pid=None if reuse else os.getpid())
            _TIMINGS["start"] = cluster.start_seconds
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"the SLURM test cluster did not start: {exc}", pytrace=False)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if reuse:
            cluster.cancel_all()
        elif os.geteuid() == 0:
            t0 = time.monotonic()
            stop_cluster(state_dir)
            _TIMINGS["stop"] = time.monotonic() - t0


def _controller_up(conf: Path) -> bool:
    proc = subprocess.run(
        ["scontrol", "ping"], capture_output=True, text=True, timeout=30, env={**os.environ, "SLURM_CONF": str(conf)}
    )
    return proc.returncode == 0 and "is UP" in proc.stdout


def own_cluster(tmp_path_factory: pytest.TempPathFactory, suffix: str, env: dict[str, str | None],
                what: str) -> Iterator[SlurmCluster]:
    """A cluster of a module's own, beside the session's, started with the ``TESTCLUSTER_*`` settings in ``env``
    (a None value unsets one) under a temporary folder, or under ``$SLURM_TEST_STATE-<suffix>`` (reused and left
    running, its jobs cancelled after the module). Without root only a reusable one that is up can be used; else the
    tests skip, naming how to start it. ``what`` names the cluster in messages."""
    reuse = os.environ.get("SLURM_TEST_STATE")
    state = Path(f"{reuse}-{suffix}").resolve() if reuse else tmp_path_factory.mktemp(suffix)
    if os.geteuid() != 0:
        conf = state / "etc" / "slurm.conf"
        if not (reuse and conf.exists() and _controller_up(conf)):
            settings = " ".join(f"{k}={v}" for k, v in env.items() if v is not None)
            pytest.skip(f"{what} needs root (slurm/testcluster/start.sh), or one started as root under {state}"
                        f"{' with ' + settings if settings else ''}")
        yield SlurmCluster(state_dir=state, conf=conf, node=_node_name(conf),
                           env={**os.environ, "SLURM_CONF": str(conf)})
        return
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            if v is None:
                mp.delenv(k, raising=False)
            else:
                mp.setenv(k, v)
        try:
            cluster = start_cluster(state, owner_pid=None if reuse else os.getpid())
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            pytest.fail(f"{what} did not start: {e}", pytrace=False)
    print(f"{what} started in {cluster.start_seconds:.1f} s")
    try:
        yield cluster
    finally:
        if reuse:
            cluster.cancel_all()
        else:
            stop_cluster(state)
