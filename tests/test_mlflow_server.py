"""slurm/mlflow-server.sh starts a real tracking server: runs, metrics and artifacts round-trip through it, it
binds 127.0.0.1 (without credentials) unless told otherwise, and with another --host it accepts the machine's own
name. Credentials on a network bind: tests/test_mlflow_auth.py."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import time
from base64 import b64encode
from pathlib import Path

import pytest

from tests.plugins.mlflow_server import SCRIPT, MlflowServer, free_port, read_credentials

pytestmark = pytest.mark.timeout(300)


def _listen_addresses(port: int) -> set[str]:
    """Local addresses of the IPv4/IPv6 sockets listening on PORT, from /proc/net/tcp{,6}."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A = LISTEN
                if len(addr) == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
                else:
                    raw = b"".join(bytes.fromhex(addr[i : i + 8])[::-1] for i in range(0, 32, 8))
                    found.add(socket.inet_ntop(socket.AF_INET6, raw))
    return found


def _get(port: int, path: str, host_header: str, auth: tuple[str, str] | None = None) -> int:
    headers = {"Host": host_header}
    if auth:
        headers["Authorization"] = "Basic " + b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_runs_metrics_and_artifacts_round_trip(mlflow_server: MlflowServer, tmp_path: Path) -> None:
    client = mlflow_server.client()
    exp = client.create_experiment(f"roundtrip-{time.time_ns()}")
    run = client.create_run(exp, run_name="ctx10s-rope1.5M-6L768d6h-s0", tags={"sweep.role": "trial"})
    client.log_param(run.info.run_id, "data.context_s", "10.0")
    for step, loss in enumerate([3.0, 2.5, 2.25]):
        client.log_metric(run.info.run_id, "train/loss", loss, step=step)
    client.log_text(run.info.run_id, "recording,wer\nr1,12.5\n", "eval/dev.csv")
    client.set_terminated(run.info.run_id, "FINISHED")

    got = client.get_run(run.info.run_id)
    assert got.info.status == "FINISHED" and got.data.params["data.context_s"] == "10.0"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(0, 3.0), (1, 2.5), (2, 2.25)]
    # Artifacts go through the server (served artifacts) into its artifact root, not to the client's disk.
    assert got.info.artifact_uri.startswith("mlflow-artifacts:")
    local = client.download_artifacts(run.info.run_id, "eval/dev.csv", str(tmp_path))
    assert Path(local).read_text() == "recording,wer\nr1,12.5\n"
    assert list((mlflow_server.dir / "artifacts").rglob("dev.csv"))


def test_default_bind_is_loopback_only_and_takes_no_credentials(mlflow_server: MlflowServer) -> None:
    assert _listen_addresses(mlflow_server.port) == {"127.0.0.1"}
    assert _get(mlflow_server.port, "/api/2.0/mlflow/experiments/search?max_results=1", "127.0.0.1") == 200
    assert not (mlflow_server.dir / "credentials").exists() and not (mlflow_server.dir / "basic_auth.ini").exists()


def test_bad_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dir", str(tmp_path / "srv"), "--port", "http"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2
    assert "--port 'http' is not a port number" in proc.stderr
    assert not (tmp_path / "srv").exists()


def test_a_database_store_without_its_driver_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """A MySQL URI (no pymysql in the environment; PostgreSQL's psycopg is the `postgres` extra): exit 2 naming the
    missing driver and the extra, and no server."""
    uri = "mysql+pymysql://sweeps:s3cret-pw@db.example:3306/mlflow"
    proc = subprocess.run(["bash", str(SCRIPT), "--dir", str(tmp_path / "srv"), "--port", str(free_port()),
                           "--backend-store-uri", uri, "--detach"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--backend-store-uri: its driver is not installed" in proc.stderr and "pymysql" in proc.stderr
    assert ".[postgres]" in proc.stderr
    assert not (tmp_path / "srv" / "server.pid").exists()


def test_unknown_option_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--hots", "0.0.0.0"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown option '--hots'" in proc.stderr


@pytest.mark.slow
def test_detached_server_on_all_interfaces_accepts_this_machines_name_and_stops(tmp_path: Path) -> None:
    port = free_port()
    directory = tmp_path / "srv"
    base = ["bash", str(SCRIPT), "--dir", str(directory)]
    env = {**os.environ, "HOME": str(tmp_path / "home")}  # the credentials go to HOME/.mlflow, not the real one
    proc = subprocess.run(
        [*base, "--host", "0.0.0.0", "--port", str(port), "--workers", "1", "--detach"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=240, env=env,
    )
    pid = int((directory / "server.pid").read_text()) if (directory / "server.pid").exists() else None
    try:
        assert proc.returncode == 0, proc.stderr + (directory / "server.log").read_text()
        fqdn = subprocess.run(["hostname", "-f"], capture_output=True, text=True).stdout.strip()
        short = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
        assert proc.stdout.splitlines()[0] == f"MLFLOW_TRACKING_URI=http://{fqdn or short}:{port}"
        assert _listen_addresses(port) & {"0.0.0.0", "::"}
        # Jobs on other nodes address the server by this machine's name; MLflow's host check must let them in,
        # and still turn away a name it was not given.
        assert _get(port, "/health", f"{short}:{port}") == 200
        assert _get(port, "/health", f"{fqdn}:{port}") == 200
        auth = read_credentials(tmp_path / "home" / ".mlflow" / "credentials")
        assert _get(port, "/api/2.0/mlflow/experiments/search?max_results=1", f"{short}:{port}", auth) == 200
        assert _get(port, "/api/2.0/mlflow/experiments/search?max_results=1", "attacker.example.com", auth) >= 400
        # A second start finds the running server instead of starting another.
        again = subprocess.run([*base, "--port", str(port), "--detach"], capture_output=True, text=True, timeout=60,
                               env=env)
        assert again.returncode == 0 and "already running" in again.stderr
    finally:
        stop = subprocess.run([*base, "--stop"], capture_output=True, text=True, timeout=120, env=env)
    assert stop.returncode == 0 and "stopped the MLflow server" in stop.stderr
    assert pid is not None
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists()
