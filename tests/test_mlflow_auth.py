"""Only a sweep's owner writes its ledger: slurm/mlflow-server.sh bound beyond loopback runs MLflow's basic-auth
app with credentials it makes once (0600 files, never on a command line or in a log) and hands to clients through
~/.mlflow/credentials. Against the real server: a write without credentials from the network is refused, the
owner's MlflowClient, a SLURM sweep's trial job and the load test (orchestrate.tools.loadtest) get in.

Every test runs with a temporary HOME, so the real ~/.mlflow is never touched."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrate.cli.commands import main
from orchestrate.ledger.ledger import Ledger, wait_for
from orchestrate.tools.loadtest import METRICS, TrainerReport, check_history, run_load
from tests.plugins.mlflow_server import (
    SCRIPT, MlflowServer, free_port, network_address, read_credentials, serving,
)
from tests.test_backend import ONE_TRIAL, smoke_corpus, write_profile  # noqa: F401 (smoke_corpus: a fixture)

pytestmark = pytest.mark.timeout(300)


def home_env(home: Path) -> dict[str, str]:
    """This process's environment with HOME=home and no MLFLOW_TRACKING_USERNAME/PASSWORD."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    env["HOME"] = str(home)
    return env


def use_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """Clients in this process (MlflowClient, orchestrate) read their credentials from home/.mlflow/credentials."""
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)


def request(uri: str, path: str, body: dict | None = None, auth: tuple[str, str] | None = None) -> int:
    """The HTTP status of a GET (body None) or JSON POST to uri+path, with basic auth when given."""
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(uri + path, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def script(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory, home: Path) -> Iterator[MlflowServer]:
    """The sweep's server as on a cluster: bound to all interfaces, addressed by this machine's network address."""
    yield from serving(tmp_path_factory.mktemp("auth-server"), host="0.0.0.0", env=home_env(home))


@pytest.mark.slow
def test_credentials_are_private_files_never_on_a_command_line_or_in_the_log(auth_server: MlflowServer,
                                                                              home: Path) -> None:
    creds = home / ".mlflow" / "credentials"
    user, password = read_credentials(creds)
    assert user == subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert len(password) >= 32 and password.isalnum()
    assert read_credentials(auth_server.dir / "credentials") == (user, password)  # the copy beside the server
    for f in (creds, auth_server.dir / "credentials", auth_server.dir / "basic_auth.ini",
              auth_server.dir / "basic_auth.db", auth_server.dir / "flask-secret-key"):
        assert mode(f) == 0o600, f
    assert mode(home / ".mlflow") == 0o700
    ini = (auth_server.dir / "basic_auth.ini").read_text()
    assert "default_permission = NO_PERMISSIONS" in ini and f"admin_username = {user}\n" in ini
    log = auth_server.log.read_text(errors="replace")
    assert f"only user '{user}' may use this server" in log and str(creds) in log  # says where they are
    assert password not in log
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert password.encode() not in cmdline.read_bytes(), cmdline
        except OSError:  # the process ended
            pass


def test_a_write_without_credentials_from_the_network_is_refused(auth_server: MlflowServer, home: Path) -> None:
    name = f"intruder-{time.time_ns()}"
    assert request(auth_server.uri, "/api/2.0/mlflow/experiments/create", {"name": name}) in (401, 403)
    user, password = read_credentials(home / ".mlflow" / "credentials")
    assert request(auth_server.uri, "/api/2.0/mlflow/experiments/create", {"name": name},
                   auth=(user, "not-the-password")) in (401, 403)
    assert request(auth_server.uri, "/api/2.0/mlflow/experiments/search?max_results=1") in (401, 403)
    assert request(auth_server.uri, "/api/2.0/mlflow/users/create",
                   {"username": "eve", "password": "eve-password-1234"}) in (401, 403)
    assert request(auth_server.uri, "/health") == 200  # liveness stays open (orchestrate checks it first)
    # Nothing was created by the refused requests; the owner's credentials see that.
    assert request(auth_server.uri, f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={name}",
                   auth=(user, password)) == 404


def test_the_owners_mlflow_client_is_accepted(auth_server: MlflowServer, home: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    use_home(monkeypatch, home)
    client = auth_server.client()
    exp = client.create_experiment(f"owner-{time.time_ns()}")
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "train/loss", 2.5, step=1)
    client.set_terminated(run.info.run_id, "FINISHED")
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")] == [(1, 2.5)]
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_loadtest_4_trainers_10_s_every_point_arrives_once(auth_server: MlflowServer, home: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    use_home(monkeypatch, home)  # the load processes find the credentials as MLflow's client does
    result = run_load(auth_server.uri, processes=4, seconds=10, steps_per_second=4)
    assert result.ok, (result.table(), result.first_error)
    assert result.points_sent >= 4 * 10 * 1 * len(METRICS)  # at least a quarter of the step rate on a busy machine
    assert result.points_per_second > 0 and 0 < result.p50_ms <= result.p99_ms
    assert "points sent" in result.table() and "duplicated" in result.table()


def test_loadtest_check_counts_lost_and_duplicated_points(auth_server: MlflowServer, home: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    use_home(monkeypatch, home)
    from mlflow.entities import Metric

    client = auth_server.client()
    run_id = client.create_run(client.create_experiment(f"check-{time.time_ns()}")).info.run_id
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, 1.0, now, s) for k in METRICS for s in (1, 2)])
    client.log_batch(run_id, metrics=[Metric(METRICS[0], 1.0, now + 1, 2)])  # step 2 of one metric again
    report = TrainerReport(0, run_id, steps_ok=(1, 2, 3), steps_failed=(), latencies=(0.01,), retries=0,
                           status_errors=0, error="")
    lost, duplicated, unfinished = check_history(auth_server.uri, [report])
    assert (lost, duplicated, unfinished) == (len(METRICS), 1, 1)  # step 3 of every metric; the run is RUNNING


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_a_slurm_sweep_logs_to_the_authenticated_server(auth_server: MlflowServer, home: Path, tmp_path: Path,
                                                        smoke_corpus: Path, monkeypatch: pytest.MonkeyPatch,
                                                        request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("slurm_cluster")
    corpus = smoke_corpus
    use_home(monkeypatch, home)  # submit (here) and the job (its environment is exported) read home/.mlflow
    grid = tmp_path / "one.yaml"
    grid.write_text(textwrap.dedent(ONE_TRIAL % (corpus, 6)))
    args = ["submit", str(grid), "--backend", "slurm", "--sweep-root", str(tmp_path / "runs"), "--sweep", "auth",
            "--set", f"data.train=podcast:{corpus}/train", "--tracking-uri", auth_server.uri,
            "--profile", str(write_profile(tmp_path, "a100:1"))]
    assert main(args) == 0
    ledger = Ledger(auth_server.uri, "auth")
    runs = wait_for(ledger, list(ledger.trial_runs()), timeout=480)
    (run,) = runs.values()
    assert run.status == "FINISHED", run
    steps = sorted(m.step for m in ledger.client.get_metric_history(run.run_id, "train/loss"))
    assert steps == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_other_credentials_are_left_alone_exit_2_then_credentials_file_serves(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    theirs = home / ".mlflow" / "credentials"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("[mlflow]\nmlflow_tracking_username = alice\nmlflow_tracking_password = alices-password-1\n")
    directory, port = tmp_path / "srv", free_port()
    base = ["--dir", str(directory), "--host", "0.0.0.0", "--port", str(port), "--workers", "1"]
    env = home_env(home)
    try:
        refused = script(*base, "--detach", env=env, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert f"{theirs} holds other credentials (user 'alice')" in refused.stderr
        assert "--credentials-file PATH" in refused.stderr and "MLFLOW_TRACKING_PASSWORD" in refused.stderr
        assert theirs.read_text().count("alice") == 2  # untouched
        assert not (directory / "server.pid").exists() and not (directory / "basic_auth.ini").exists()

        ours = tmp_path / "sweep-credentials"
        started = script(*base, "--credentials-file", str(ours), "--detach", env=env)
        assert started.returncode == 0, started.stderr + (directory / "server.log").read_text(errors="replace")
        assert mode(ours) == 0o600 and theirs.read_text().count("alice") == 2
        # What the message says to do: export the credentials from that file; they win over ~/.mlflow/credentials.
        exported = subprocess.run(["bash", "-c", "sed -n 's/^mlflow_tracking_password *= *//p' \"$1\"", "-", str(ours)],
                                  capture_output=True, text=True, check=True).stdout.strip()
        user, password = read_credentials(ours)
        assert exported == password
        use_home(monkeypatch, home)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", exported)
        from mlflow.tracking import MlflowClient

        uri = f"http://{network_address() or '127.0.0.1'}:{port}"
        MlflowClient(uri).create_experiment("before-restart")
        # A restart keeps the password made the first time: the credentials handed out stay valid.
        assert script("--dir", str(directory), "--stop", env=env, timeout=120).returncode == 0
        again = script(*base, "--credentials-file", str(ours), "--detach", env=env)
        assert again.returncode == 0, again.stderr
        assert read_credentials(ours) == (user, password)
        assert MlflowClient(uri).get_experiment_by_name("before-restart") is not None
    finally:
        script("--dir", str(directory), "--stop", env=env, timeout=120)


@pytest.mark.slow
def test_no_auth_on_the_network_says_so_loudly_and_takes_no_credentials(tmp_path: Path) -> None:
    home, directory, port = tmp_path / "home", tmp_path / "srv", free_port()
    env = home_env(home)
    started = script("--dir", str(directory), "--host", "0.0.0.0", "--port", str(port), "--workers", "1",
                     "--no-auth", "--detach", env=env)
    try:
        assert started.returncode == 0, started.stderr
        assert "WARNING: --no-auth" in started.stderr and "every sweep's ledger" in started.stderr
        uri = f"http://{network_address() or '127.0.0.1'}:{port}"
        assert request(uri, "/api/2.0/mlflow/experiments/search?max_results=1") == 200
        assert not (home / ".mlflow").exists() and not (directory / "credentials").exists()
    finally:
        script("--dir", str(directory), "--stop", env=env, timeout=120)
