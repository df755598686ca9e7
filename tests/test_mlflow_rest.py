"""The ledger's REST client (orchestrate.ledger.mlflow_rest) against a real `mlflow server`: what it writes is what
MlflowClient reads back, the ledger over it never imports mlflow, failures become LedgerError naming the URI, and
it authenticates the way MLflow's own clients do.

Faults a healthy server never shows (a 503 under load, an answer lost after the server carried the request out)
come from a small forwarding server in front of the real one, which changes nothing else ("relay" in the test
names)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from base64 import b64decode, b64encode
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from asr_core.contract import trial as tc
from orchestrate.plan.grid import load_grid
from orchestrate.ledger.ledger import Ledger, LedgerError, run_names
from orchestrate.ledger.mlflow_rest import MlflowRest, RestError, UncertainWrite, auth_header, credentials
from tests.plugins.mlflow_server import MlflowServer, free_port, read_credentials, start_server, stop_server

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "grids" / "smoke.yaml"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"  # the session's server is shared with other tests


# ---- a relay that injects faults in front of the real server ---------------------------------------------------------
class Relay:
    """Forwards every request to the real server and its answer back, except where ``faults`` says otherwise.

    ``faults[endpoint]`` is a list consumed one request at a time: ``"503"`` or ``"429"`` answers so without
    forwarding (the server turned the request away), ``"lost"`` forwards it and then answers 502 (the server did the work but the
    answer never arrived). ``seen`` holds (path, Authorization header) of every request."""

    def __init__(self, target: str) -> None:
        self.target = urlparse(target)
        self.faults: dict[str, list[str]] = {}
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                endpoint = self.path.split("/api/2.0/mlflow/", 1)[-1].split("?", 1)[0]
                with relay.lock:
                    relay.seen.append((self.path, self.headers.get("Authorization", "")))
                    plan = relay.faults.get(endpoint) or []
                    fault = plan.pop(0) if plan else ""
                if fault in ("503", "429"):
                    return self._answer(int(fault), b'{"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy"}')
                conn = http.client.HTTPConnection(relay.target.hostname, relay.target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                if fault == "lost":
                    return self._answer(502, b"<html>bad gateway</html>")
                self._answer(r.status, data)

            def _answer(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self, endpoint: str) -> int:
        return sum(1 for p, _ in self.seen if p.split("?", 1)[0].endswith("/" + endpoint))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def relay(mlflow_server: MlflowServer) -> Iterator[Relay]:
    r = Relay(mlflow_server.uri)
    try:
        yield r
    finally:
        r.close()


# ---- round trips -----------------------------------------------------------------------------------------------------
def test_rest_round_trips_match_what_mlflow_client_reads_back(mlflow_server: MlflowServer) -> None:
    rest = MlflowRest(mlflow_server.uri)
    client = mlflow_server.client()
    name = _name("rest")
    assert rest.get_experiment_by_name(name) is None
    eid = rest.create_experiment(name, {"sweep.id": "id-a", "sweep.root": "/runs/a"})
    assert eid is not None and rest.create_experiment(name) is None  # the name is taken now
    rest.set_experiment_tag(eid, "sweep.root", "/runs/moved")
    exp, theirs = rest.get_experiment_by_name(name), client.get_experiment_by_name(name)
    assert exp is not None and (exp.experiment_id, exp.name, exp.lifecycle_stage) == (
        theirs.experiment_id, theirs.name, theirs.lifecycle_stage)
    assert dict(exp.tags) == dict(theirs.tags) and exp.tags["sweep.root"] == "/runs/moved"

    params = {f"cfg.p{i:03d}": str(i * 0.5) for i in range(230)}  # three batches of at most 100
    tags = {f"trial.t{i:03d}": f"v{i}" for i in range(150)}  # two batches
    made = [rest.create_run(eid, f"run-{i}", {"sweep.role": "trial", "trial.key": f"k{i}"}) for i in range(7)]
    assert {r.status for r in made} == {"RUNNING"}  # MLflow creates every run RUNNING
    rest.log_batch(made[0].run_id, params=params, tags=tags)
    rest.update_run(made[0].run_id, "SCHEDULED")
    rest.set_terminated(made[1].run_id, "FAILED")
    rest.update_run(made[2].run_id, "SCHEDULED")
    rest.update_run(made[2].run_id, "RUNNING")

    pages, token, mine = 0, None, []
    while True:  # page tokens: three runs a page
        page, token = rest.search_runs([eid], "tags.`sweep.role` = 'trial'", max_results=3,
                                       order_by=["attributes.start_time ASC"], page_token=token)
        mine += page
        pages += 1
        if not token:
            break
    assert pages == 3
    assert [r.run_id for r in rest.search_all_runs([eid], page_size=2, order_by=["attributes.start_time ASC"])] \
        == [r.run_id for r in mine]
    theirs_runs = client.search_runs([eid], "tags.`sweep.role` = 'trial'", max_results=100,
                                     order_by=["attributes.start_time ASC"])
    assert [r.run_id for r in mine] == [r.info.run_id for r in theirs_runs] == [r.run_id for r in made]
    for a, b in zip(mine, theirs_runs):
        assert (a.run_name, a.status, a.start_time, a.end_time, a.lifecycle_stage) == (
            b.info.run_name, b.info.status, b.info.start_time, b.info.end_time, b.info.lifecycle_stage)
        assert dict(a.tags) == b.data.tags and dict(a.params) == b.data.params
    first = client.get_run(made[0].run_id)
    assert first.info.status == "SCHEDULED" and first.info.end_time is None
    assert first.data.params == params and tags.items() <= first.data.tags.items()
    assert client.get_run(made[1].run_id).info.status == "FAILED" and mine[1].end_time
    assert client.get_run(made[2].run_id).info.status == "RUNNING"


def test_the_ledger_over_rest_writes_the_schema_and_never_imports_mlflow(mlflow_server: MlflowServer,
                                                                          tmp_path: Path) -> None:
    """A whole submission's ledger calls in a fresh process: mlflow is never imported (it costs seconds), and
    MlflowClient reads back the schema of docs/ARCHITECTURE.md."""
    name = _name("schema")
    out = tmp_path / "ids.json"
    code = textwrap.dedent(f"""
        import json, sys
        from orchestrate.plan.grid import load_grid
        from orchestrate.ledger.ledger import Ledger
        ledger = Ledger({mlflow_server.uri!r}, {name!r})
        ledger.check_owner("id-a", "/runs/a")
        trials = list(load_grid({str(SMOKE)!r}).trials)
        parent = ledger.ensure_sweep("grids/smoke.yaml", "slurm", "id-a", "/runs/a")
        assert ledger.ensure_sweep("grids/smoke.yaml", "slurm", "id-a", "/runs/a") == parent
        ids = ledger.create_trial_runs(parent, trials, "slurm")
        assert ledger.create_trial_runs(parent, trials, "slurm") == ids  # idempotent
        a, b, c = (t.key for t in trials[:3])
        ledger.tag_runs({{ids[a]: {{"trial.job_id": "12_0"}}, ids[b]: {{"trial.job_id": "12_1"}}}})
        ledger.set_status([ids[b]], "FAILED", tags={{"trial.error": "ValueError: loss is nan"}})
        ledger.set_status([ids[c]], "KILLED")
        runs = ledger.trial_runs()
        json.dump({{"parent": parent, "ids": ids, "runs": {{k: [r.status, r.job_id, r.error] for k, r in runs.items()}},
                   "mlflow": sorted(m for m in sys.modules if m == "mlflow" or m.startswith("mlflow."))}},
                  open({str(out)!r}, "w"))
        """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    got = json.loads(out.read_text())
    assert got["mlflow"] == []
    trials = list(load_grid(SMOKE).trials)
    ids, runs = got["ids"], got["runs"]
    a, b, c = (t.key for t in trials[:3])
    assert runs[a] == ["SCHEDULED", "12_0", ""] and runs[b] == ["FAILED", "12_1", "ValueError: loss is nan"]
    assert runs[c][0] == "KILLED" and {runs[t.key][0] for t in trials[3:]} == {"SCHEDULED"}

    client = mlflow_server.client()
    exp = client.get_experiment_by_name(name)
    assert exp.tags[tc.TAG_SWEEP_ID] == "id-a" and exp.tags[tc.TAG_SWEEP_ROOT] == "/runs/a"
    assert len(client.search_runs([exp.experiment_id], max_results=100)) == len(trials) + 1
    p = client.get_run(got["parent"])
    assert p.info.run_name == name and p.data.tags[tc.TAG_ROLE] == tc.ROLE_PARENT
    assert p.data.tags[tc.TAG_SWEEP_GRID] == "grids/smoke.yaml" and p.data.tags[tc.TAG_SWEEP_BACKEND] == "slurm"
    for t in trials:
        r = client.get_run(ids[t.key])
        assert r.info.run_name == run_names(trials)[t.key]
        tags = r.data.tags
        assert tags["mlflow.parentRunId"] == got["parent"] and tags[tc.TAG_ROLE] == tc.ROLE_TRIAL
        assert tags[tc.TAG_KEY] == t.key and tags[tc.TAG_LABEL] == t.label and tags[tc.TAG_SEED] == str(t.seed)
        assert tags[tc.TAG_SUBGRIDS] == ",".join(t.subgrids) and tags[tc.TAG_BACKEND] == "slurm"
        assert r.data.params == {}  # the trial job logs its config when it first starts
    assert client.get_run(ids[c]).info.end_time and client.get_run(ids[a]).info.end_time is None


# ---- failures --------------------------------------------------------------------------------------------------------
def test_an_unreachable_server_is_a_ledger_error_naming_the_uri_quickly() -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(LedgerError) as err:
        Ledger(uri, "nowhere").trial_runs()
    took = time.monotonic() - t0
    msg = str(err.value)
    assert uri in msg and "unreachable" in msg and "asr-study mlflow-server" in msg and "--tracking-uri" in msg
    assert took < 8.0, f"{took:.1f} s to give up on a refused connection"


def test_an_http_error_is_a_ledger_error_naming_the_uri_and_the_servers_words(mlflow_server: MlflowServer) -> None:
    rest = MlflowRest(mlflow_server.uri)
    with pytest.raises(RestError) as err:
        rest.search_runs(["0"], "this is not a filter")
    e = err.value
    assert isinstance(e, LedgerError) and e.status == 400 and e.error_code == "INVALID_PARAMETER_VALUE"
    assert mlflow_server.uri in str(e) and "runs/search" in str(e) and "filter" in str(e).lower()
    with pytest.raises(RestError) as err:  # not MLflow's API at all
        MlflowRest(mlflow_server.uri + "/no/such/prefix").get_experiment_by_name("x")
    assert err.value.status == 404 and "is it an MLflow server" in str(err.value)


def test_a_relay_answering_503_and_429_is_asked_again_until_it_recovers(relay: Relay) -> None:
    name = _name("retry")
    relay.faults = {"experiments/create": ["503", "503"], "runs/search": ["503"], "runs/create": ["429"]}
    ledger = Ledger(relay.uri, name)
    parent = ledger.ensure_sweep("g", "slurm", "id-a", "/runs/a")
    assert relay.count("experiments/create") == 3 and relay.count("runs/create") == 2
    assert ledger.parent_run_id() == parent
    relay.faults, relay.seen = {"runs/search": ["503"] * 10}, []
    t0 = time.monotonic()
    with pytest.raises(LedgerError) as err:  # bounded: five attempts, then an error that says what to do
        ledger.trial_runs()
    assert relay.count("runs/search") == 5 and time.monotonic() - t0 < 15
    assert relay.uri in str(err.value) and "HTTP 503" in str(err.value) and "5 attempts" in str(err.value)


def test_a_run_whose_creation_answer_was_lost_is_found_not_created_twice_relay(relay: Relay,
                                                                              mlflow_server: MlflowServer) -> None:
    """The server creates the run but its answer never arrives (a 502 from a proxy, a broken connection): asking
    again would make a second run for the trial, whose job would continue one while the ledger reads the other.
    The ledger looks for the run first."""
    name = _name("lost")
    trials = list(load_grid(SMOKE).trials)[:4]
    ledger = Ledger(relay.uri, name)
    parent = ledger.ensure_sweep("g", "slurm", "id-a", "/runs/a")
    relay.faults = {"runs/create": ["lost", "", "lost"]}
    ids = ledger.create_trial_runs(parent, trials, "slurm")
    client = mlflow_server.client()
    eid = client.get_experiment_by_name(name).experiment_id
    runs = client.search_runs([eid], "tags.`sweep.role` = 'trial'", max_results=100)
    assert sorted(r.data.tags["trial.key"] for r in runs) == sorted(t.key for t in trials)  # one run per trial
    assert relay.count("runs/create") == 1 + 4  # the parent, then one request per trial: none repeated
    assert {r.info.run_id for r in runs} == set(ids.values())
    assert {r.info.status for r in runs} == {"SCHEDULED"}
    with pytest.raises(UncertainWrite):  # the client itself never repeats such a write
        relay.faults = {"runs/create": ["lost"]}
        MlflowRest(relay.uri).create_run(eid, "x")


# ---- credentials -----------------------------------------------------------------------------------------------------
def test_credentials_come_from_the_environment_then_the_credentials_file(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    assert credentials({}, creds) == (None, None) and auth_header({}, creds) is None
    creds.write_text("[mlflow]\nmlflow_tracking_username = ann\nmlflow_tracking_password = file-secret\n")
    assert credentials({}, creds) == ("ann", "file-secret")
    assert b64decode(auth_header({}, creds).removeprefix("Basic ")) == b"ann:file-secret"
    env = {"MLFLOW_TRACKING_USERNAME": "bob", "MLFLOW_TRACKING_PASSWORD": "env-secret"}
    assert auth_header(env, creds) == "Basic " + "Ym9iOmVudi1zZWNyZXQ="  # base64 of bob:env-secret
    assert credentials({"MLFLOW_TRACKING_PASSWORD": "env-secret"}, creds) == ("ann", "env-secret")  # field by field
    assert auth_header({"MLFLOW_TRACKING_USERNAME": "bob"}, tmp_path / "none") is None  # no password: no basic
    assert auth_header({"MLFLOW_TRACKING_TOKEN": "t0k"}, tmp_path / "none") == "Bearer t0k"
    creds.write_text("[other]\nmlflow_tracking_username = eve\n")
    assert credentials({}, creds) == (None, None)


def test_the_basic_auth_header_reaches_the_server_relay(relay: Relay, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials of the real user
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ann")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret:with:colons")
    Ledger(relay.uri, _name("auth")).ensure_sweep("g", "slurm", "id-a", "/runs/a")
    assert {h for _, h in relay.seen} == {"Basic " + b64encode(b"ann:s3cret:with:colons").decode()}


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MlflowServer, Path]]:
    """slurm/mlflow-server.sh bound beyond loopback: MLflow's basic-auth app, credentials in HOME/.mlflow."""
    home = tmp_path_factory.mktemp("home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env["HOME"] = str(home)
    try:
        server = start_server(tmp_path_factory.mktemp("auth-server"), host="0.0.0.0", env=env)
    except RuntimeError as exc:
        pytest.fail(f"the MLflow server did not start: {exc}", pytrace=False)
    try:
        yield server, home
    finally:
        stop_server(server.process)


@pytest.mark.slow
def test_an_authenticating_server_takes_the_ledger_with_credentials_and_refuses_it_without(
        auth_server: tuple[MlflowServer, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    server, home = auth_server
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    name = _name("authed")
    monkeypatch.setenv("HOME", str(tmp_path))  # no credentials at all
    with pytest.raises(LedgerError) as err:
        Ledger(server.uri, name).ensure_sweep("g", "slurm", "id-a", "/runs/a")
    msg = str(err.value)
    assert server.uri in msg and "HTTP 401" in msg and "MLFLOW_TRACKING_USERNAME" in msg and "credentials" in msg

    monkeypatch.setenv("HOME", str(home))  # the credentials file the server's script wrote
    ledger = Ledger(server.uri, name)
    ids = ledger.create_trial_runs(ledger.ensure_sweep("g", "slurm", "id-a", "/runs/a"),
                                   list(load_grid(SMOKE).trials)[:2], "slurm")
    assert {r.status for r in ledger.trial_runs().values()} == {"SCHEDULED"} and len(ids) == 2

    user, password = read_credentials(home / ".mlflow" / "credentials")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    assert set(Ledger(server.uri, name).trial_runs()) == set(ids)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-password")
    with pytest.raises(LedgerError, match="HTTP 401"):
        Ledger(server.uri, name).trial_runs()
