"""The `mlflow_server` fixture: a real `mlflow server` for the test session, started by slurm/mlflow-server.sh.

It listens on a free port of 127.0.0.1 with a sqlite backend store and an artifact root under a temporary folder,
exactly as a sweep's server does on a cluster login node, and is stopped (its whole process group) at the end.
A loopback server takes no credentials; `start_server(..., host="0.0.0.0", env=...)` starts one that does (give it
a temporary HOME in `env`: the script writes the credentials to HOME/.mlflow/credentials).
"""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asr_core.runtime.signals import stop_group
from orchestrate.ledger.mlflow_rest import credentials

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "slurm" / "mlflow-server.sh"
START_TIMEOUT_S = 180.0  # a cold start on 2 busy cores (imports + sqlite migrations) has taken 40 s


@dataclass
class MlflowServer:
    """A running tracking server: `uri` is what clients and jobs get as their tracking URI."""

    uri: str
    port: int
    dir: Path
    log: Path
    process: subprocess.Popen[bytes]
    start_seconds: float

    def client(self):  # -> mlflow.tracking.MlflowClient (imported lazily: importing mlflow costs seconds)
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""


def network_address() -> str | None:
    """This machine's first non-loopback IPv4 address (`hostname -I`), or None when it has none."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return next((a for a in out.split() if "." in a and not a.startswith("127.")), None)


def read_credentials(path: Path) -> tuple[str, str]:
    """(user, password) from an MLflow credentials file alone (the environment is not read); both must be there."""
    user, password = credentials(env={}, path=path)
    assert user and password, f"{path} holds no complete [mlflow] credentials"
    return user, password


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's choice for an ephemeral bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(uri: str, process: subprocess.Popen[bytes], log: Path, timeout: float = START_TIMEOUT_S) -> None:
    """Polls URI/health until it answers OK; raises RuntimeError with the log tail if the server exits or
    `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"mlflow server at {uri} not healthy after {timeout:.0f}s:\n{log.read_text(errors='replace')[-3000:]}")


def start_server(directory: Path, *, port: int | None = None, workers: int = 1, extra: list[str] | None = None,
                 host: str = "127.0.0.1", env: dict[str, str] | None = None) -> MlflowServer:
    """Starts `slurm/mlflow-server.sh --dir DIRECTORY --host HOST --port PORT` in the foreground (its own process
    group, environment `env`) and waits for /health. A server bound to all interfaces is addressed by this
    machine's network address (as jobs on other nodes reach it), or by 127.0.0.1 when it has none."""
    port = port or free_port()
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "server.log"
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        process = subprocess.Popen(
            ["bash", str(SCRIPT), "--dir", str(directory), "--host", host, "--port", str(port), "--workers", str(workers),
             *(extra or [])],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
        )
    address = host if host not in ("0.0.0.0", "::") else (network_address() or "127.0.0.1")
    uri = f"http://{address}:{port}"
    try:
        wait_healthy(uri, process, log)
    except RuntimeError:
        stop_server(process)
        raise
    return MlflowServer(uri=uri, port=port, dir=directory, log=log, process=process, start_seconds=time.monotonic() - t0)


def stop_server(process: subprocess.Popen[bytes], timeout: float = 5) -> None:
    """TERM to the server's process group (uvicorn and its workers), KILL after `timeout` s (a graceful uvicorn
    shutdown takes 20 s; everything is committed to the store by then anyway)."""
    stop_group(process, timeout)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real `mlflow server` (sqlite store, served artifacts) on a free port of 127.0.0.1 for the session."""
    yield from serving(tmp_path_factory.mktemp("mlflow-server"))


def serving(directory: Path, **kwargs: Any) -> Iterator[MlflowServer]:
    """The body of a server fixture: :func:`start_server` (a start that fails fails the test, with the log), yield
    the server, stop it."""
    try:
        server = start_server(directory, **kwargs)
    except RuntimeError as exc:
        pytest.fail(f"the MLflow server did not start: {exc}", pytrace=False)
    try:
        yield server
    finally:
        stop_server(server.process)
