"""The outbox never drops a result on an HTTP 400 (issue 30, item 1). MLflow answers 400 BAD_REQUEST for every
database error but OperationalError (e.g. a connection-pool timeout under load): such answers are outages, retried
like a 5xx, and no point is lost or doubled. Only what MLflow calls invalid (INVALID_PARAMETER_VALUE, e.g. a run
deleted meanwhile; RESOURCE_DOES_NOT_EXIST; INVALID_STATE) is set aside, and then it is kept, counted, shown by
``orchestrate status`` and sent again by ``python -m asr_core ship TRIAL_DIR`` once the cause is fixed.

Real pieces: a real ``mlflow server`` (the session's), and between it and the outbox a real HTTP proxy
(:class:`orchestrate.tools.flaky_proxy.FlakyProxy`) that answers MLflow's own error bodies for a while, some after
forwarding the request (the server did the work, the answer was lost)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from asr_core.contract.trial import TrialFolder
from asr_core.runtime.outbox import HTTP_DEFAULTS, Outbox
from asr_core.contract.folder.outbox_files import REJECTED_FILE, kept, pending
from asr_core.runtime.shipper import ship_pending
from orchestrate.tools.flaky_proxy import Fault, FlakyProxy

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("train/loss", "train/lr", "train/grad_norm")


@pytest.fixture()
def fail_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's client retries set low, as the trial job sets them: the outbox does the retrying."""
    for k, v in HTTP_DEFAULTS.items():
        monkeypatch.setenv(k, v)


@pytest.fixture()
def run(mlflow_server, tmp_path: Path) -> tuple[str, Path]:
    """(a fresh run id, an empty trial folder)."""
    client = mlflow_server.client()
    run_id = client.create_run(client.create_experiment(f"refusals-{uuid.uuid4().hex[:10]}")).info.run_id
    trial = tmp_path / "trial"
    trial.mkdir()
    return run_id, trial


def points(client, run_id: str, key: str) -> Counter:
    """{step: how many points the server holds}."""
    return Counter(m.step for m in client.get_metric_history(run_id, key))


def test_transient_400s_and_5xx_lose_and_double_no_point(mlflow_server, run, fail_fast) -> None:
    run_id, trial = run
    client = mlflow_server.client()
    with FlakyProxy(mlflow_server.uri) as proxy:
        box = Outbox(trial, segment=1, tracking_uri=proxy.uri, run_id=run_id).start()
        box.params({"model.d_model": "96", "train.lr": "0.001"})
        box.status("RUNNING", {"trial.segments": "1"})
        assert box.flush(30), box.last_error
        # in turn: 400 twice, 400 after the server did the work (its answer lost), 503, 500 after the work
        proxy.fail(3.5, [Fault(400, "BAD_REQUEST"), Fault(400, "BAD_REQUEST"), Fault(400, "BAD_REQUEST", forward=True),
                         Fault(503, "TEMPORARILY_UNAVAILABLE"), Fault(500, "INTERNAL_ERROR", forward=True)])
        steps = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4.5:  # training goes on through the faults and a second after
            steps += 1
            box.metrics(steps, {k: steps + i / 10 for i, k in enumerate(KEYS)})
            box.kick()
            time.sleep(0.02)
        box.tags({"trial.code": "3f2a9c1d0b7e"})
        box.status("FINISHED", time_ms=1_700_000_000_000)
        assert box.flush(60), box.last_error
        box.close()
        faulted = dict(proxy.by_status)
    assert faulted.get(400, 0) >= 2, faulted  # the phase did hit the shipper
    for i, key in enumerate(KEYS):
        counts = points(client, run_id, key)
        assert counts == Counter({s: 1 for s in range(1, steps + 1)}), (key, steps, sorted(
            s for s in range(1, steps + 1) if counts[s] != 1))
        assert {m.step: m.value for m in client.get_metric_history(run_id, key)}[steps] == steps + i / 10
    assert not (TrialFolder(trial).outbox_dir / REJECTED_FILE).exists()
    assert kept(trial) == 0 and pending(trial) == 0
    data = client.get_run(run_id)
    assert data.info.status == "FINISHED" and data.data.params["model.d_model"] == "96"
    assert data.data.tags["trial.code"] == "3f2a9c1d0b7e"


def test_mlflow_error_codes_are_sorted_into_outages_and_refusals() -> None:
    """What each error body means for the record (real mlflow exceptions, as its REST client raises them)."""
    import requests
    from mlflow.exceptions import MlflowException, RestException

    from asr_core.runtime.shipper import refused_for_good

    def rest(code: str) -> RestException:
        return RestException({"error_code": code, "message": "m"})

    for code in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "INVALID_STATE", "RESOURCE_ALREADY_EXISTS"):
        assert refused_for_good(rest(code)), code
    for code in ("BAD_REQUEST", "INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED",
                 "DEADLINE_EXCEEDED", "ENDPOINT_NOT_FOUND", "PERMISSION_DENIED", "UNAUTHENTICATED", "502"):
        assert not refused_for_good(rest(code)), code
    # a body that is not MLflow's JSON (a gateway's HTML page): the client names it after the HTTP status
    assert not refused_for_good(MlflowException("HTTP 400, Response body: '<html>'", error_code=1001))
    assert not refused_for_good(requests.exceptions.ConnectionError("refused"))
    assert not refused_for_good(ValueError("anything else"))


def ship(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asr_core", "ship", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)


def test_a_refused_record_is_kept_counted_and_sent_again_by_ship_after_the_fix(mlflow_server, run,
                                                                             fail_fast) -> None:
    """A run deleted meanwhile refuses everything (INVALID_PARAMETER_VALUE): the records are kept, not lost; once the
    run is restored, ``python -m asr_core ship TRIAL_DIR`` (run and server found in the trial folder) sends them,
    each point once, and a superseded status is not sent back over a later one."""
    run_id, trial = run
    client = mlflow_server.client()
    box = Outbox(trial, segment=1, tracking_uri=mlflow_server.uri, run_id=run_id)
    box.status("RUNNING")
    for s in range(1, 6):
        box.metrics(s, {"train/loss": float(s)})
    assert box.flush(30), box.last_error
    client.delete_run(run_id)  # by mistake, during training
    for s in range(6, 11):
        box.metrics(s, {"train/loss": float(s)})
    box.tags({"trial.code": "3f2a9c1d0b7e"})
    box.status("SCHEDULED")
    box.status("FINISHED", time_ms=1_700_000_000_000)
    assert box.flush(30), box.last_error  # what MLflow refused for good never blocks the job's end
    box.close()
    n = kept(trial)
    assert n >= 4 and pending(trial) == 0  # the metrics batch (or its records), the tags and two statuses

    still = ship(str(trial))  # the run is still deleted: nothing is lost, the records stay kept
    assert still.returncode == 1, still.stdout + still.stderr
    assert f"1 superseded, still kept {n - 1}" in still.stdout, still.stdout  # SCHEDULED, before FINISHED
    assert "INVALID_PARAMETER_VALUE" in still.stdout and kept(trial) == n - 1

    client.restore_run(run_id)
    done = ship(str(trial))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sent again" in done.stdout and kept(trial) == 0, done.stdout
    assert points(client, run_id, "train/loss") == Counter({s: 1 for s in range(1, 11)})
    data = client.get_run(run_id)
    assert data.info.status == "FINISHED" and data.data.tags["trial.code"] == "3f2a9c1d0b7e"
    assert ship(str(trial)).returncode == 0 and kept(trial) == 0  # nothing left: a second ship is a no-op
    assert points(client, run_id, "train/loss") == Counter({s: 1 for s in range(1, 11)})


def test_ship_sends_kept_records_to_the_run_named_and_refuses_without_one(mlflow_server, run, tmp_path: Path,
                                                                        fail_fast) -> None:
    """``--run-id``/``--tracking-uri`` name another destination; a folder that never recorded one and no
    ``--run-id`` is a user error (exit 2, one line saying what to pass). The old ``python -m asr_core.outbox`` form
    still ships the pending records."""
    run_id, trial = run
    client = mlflow_server.client()
    with FlakyProxy(mlflow_server.uri) as proxy:
        proxy.fail(600, [Fault(400, "INVALID_PARAMETER_VALUE")])  # a server that calls the values invalid
        box = Outbox(trial, segment=1, tracking_uri=proxy.uri, run_id=run_id)
        for s in range(1, 4):
            box.metrics(s, {"train/loss": float(s)})
        assert box.flush(30), box.last_error
        box.close()
    assert kept(trial) >= 1 and points(client, run_id, "train/loss") == Counter()
    other = client.create_run(client.create_experiment(f"refusals-{uuid.uuid4().hex[:10]}")).info.run_id
    done = ship(str(trial), "--tracking-uri", mlflow_server.uri, "--run-id", other)
    assert done.returncode == 0 and kept(trial) == 0, done.stdout + done.stderr
    assert points(client, other, "train/loss") == Counter({1: 1, 2: 1, 3: 1})

    bare = tmp_path / "bare"
    (bare / "outbox").mkdir(parents=True)
    (bare / "outbox" / "000001.jsonl").write_text('{"seq":1,"kind":"metrics","step":1,"time":1,"metrics":{"a":1}}\n')
    refused = ship(str(bare))
    assert refused.returncode == 2 and "--run-id" in refused.stderr and "Traceback" not in refused.stderr
    old = subprocess.run([sys.executable, "-m", "asr_core.outbox", str(bare), "--tracking-uri", mlflow_server.uri,
                          "--run-id", other], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert old.returncode == 0 and "shipped 1" in old.stdout, old.stdout + old.stderr
    assert points(client, other, "a") == Counter({1: 1})


def test_status_shows_kept_records_per_trial_and_in_json(mlflow_server, run, tmp_path: Path, fail_fast) -> None:
    from tests.test_status import build_sweep, status

    run_id, _ = run
    client = mlflow_server.client()
    built = build_sweep(tmp_path / "runs", "kept", f"sqlite:///{tmp_path / 'mlflow.db'}", backend="local")
    built.lease.release()
    finished = built.trials["finished"]
    trial = built.sweep.trial_dir(finished.key)
    client.delete_run(run_id)
    box = Outbox(trial, segment=3, tracking_uri=mlflow_server.uri, run_id=run_id)
    box.metrics(1, {"wer/test": 12.5})
    assert box.flush(30), box.last_error
    box.close()
    assert kept(trial) == 1 and ship_pending(trial, mlflow_server.uri, run_id).complete

    rows = {r["key"]: r for r in map(json.loads, status(tmp_path / "runs", "kept", "--json", "--no-reconcile")
                                      .stdout.splitlines())}
    assert rows[finished.key]["kept"] == 1 and rows[built.trials["failed"].key]["kept"] == 0
    text = status(tmp_path / "runs", "kept", "--no-reconcile").stdout
    line = next((x for x in text.splitlines() if finished.key in x and "kept" in x), "")
    assert "1 record" in line and "INVALID_PARAMETER_VALUE" in line, text
    assert f"python -m asr_core ship {trial}" in text, text
