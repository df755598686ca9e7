"""The trial's outbox (asr_core/runtime/outbox.py and shipper.py, asr_core/contract/folder/outbox_files.py) against a
real ``mlflow server``: records reach the run in order and in batches within MLflow's limits, the watermark survives
the process, a re-sent batch changes nothing (the server keeps one point per identical metric), a refused record
never blocks the ones behind it, an unreachable server never blocks the writer, and :func:`ship_pending` ships what a
dead job left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from asr_core.runtime.outbox import Outbox
from asr_core.contract.folder.outbox_files import REJECTED_FILE, WATERMARK_FILE, pending
from asr_core.runtime.shipper import MAX_METRICS, ShipResult, ship_pending
from asr_core.contract.trial import TrialFolder

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def run(mlflow_server, tmp_path: Path) -> tuple[str, str, Path]:
    """(tracking URI, a fresh run id, an empty trial folder)."""
    client = mlflow_server.client()
    exp = client.create_experiment(f"outbox-{uuid.uuid4().hex[:10]}")
    run_id = client.create_run(exp).info.run_id
    client.update_run(run_id, status="SCHEDULED")
    trial = tmp_path / "trial"
    trial.mkdir()
    return mlflow_server.uri, run_id, trial


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_an_identical_metric_point_sent_twice_is_kept_once_by_the_server(mlflow_server, run) -> None:
    """What the outbox's exactly-once rests on: MLflow's store keys a point by (key, value, timestamp, step)."""
    from mlflow.entities import Metric

    uri, run_id, _ = run
    client = mlflow_server.client()
    batch = [Metric("train/loss", 0.5, 1_700_000_000_123, 7), Metric("train/lr", 0.1, 1_700_000_000_123, 7)]
    client.log_batch(run_id, metrics=batch)
    client.log_batch(run_id, metrics=batch)
    assert _history(client, run_id, "train/loss") == [(7, 0.5)]
    # the same step with another timestamp is another point: why a metric record carries its own timestamp
    client.log_batch(run_id, metrics=[Metric("train/loss", 0.5, 1_700_000_000_999, 7)])
    assert len(client.get_metric_history(run_id, "train/loss")) == 2


@pytest.mark.slow
def test_records_arrive_in_order_within_the_batch_limits(mlflow_server, run) -> None:
    uri, run_id, trial = run
    client = mlflow_server.client()
    box = Outbox(trial, segment=1, tracking_uri=uri, run_id=run_id)
    box.params({f"p{i:03d}": i for i in range(250)})  # 3 records: log_batch takes 100 params at most
    box.tags({f"t{i:03d}": "first" for i in range(150)})
    box.status("RUNNING", {"trial.segments": "1"})
    for step in range(1, 401):  # 2,400 points: three batches at least
        box.metrics(step, {f"m{j}": step + j / 10 for j in range(6)})
    box.metrics(401, {f"wide{j}": float(j) for j in range(MAX_METRICS + 5)})  # one step wider than a batch
    box.tags({"t000": "second"})  # a later value of a tag wins
    box.status("SCHEDULED", {"trial.preemptions": "1"})
    box.status("RUNNING")
    box.status("FINISHED", time_ms=1_700_000_000_000)
    assert pending(trial) == box.seq > 10
    assert box.flush(120), box.last_error
    box.close()

    data = client.get_run(run_id)
    assert data.info.status == "FINISHED" and data.info.end_time == 1_700_000_000_000
    assert len(data.data.params) == 250 and data.data.params["p249"] == "249"
    assert data.data.tags["t000"] == "second" and data.data.tags["t149"] == "first"
    assert data.data.tags["trial.preemptions"] == "1"
    for j in range(6):
        assert _history(client, run_id, f"m{j}") == [(s, s + j / 10) for s in range(1, 401)]
    assert len(data.data.metrics) == 6 + MAX_METRICS + 5
    assert pending(trial) == 0 and not (TrialFolder(trial).outbox_dir / REJECTED_FILE).exists()
    marks = json.loads((TrialFolder(trial).outbox_dir / WATERMARK_FILE).read_text())["files"]
    path = TrialFolder(trial).outbox_dir / "000001.jsonl"
    assert marks == {"000001.jsonl": {"offset": path.stat().st_size, "seq": box.seq}}
    seqs = [json.loads(line)["seq"] for line in path.read_text().splitlines()]
    assert seqs == list(range(1, box.seq + 1))


def test_the_watermark_survives_the_process_and_a_lost_one_resends_harmlessly(mlflow_server, run) -> None:
    uri, run_id, trial = run
    client = mlflow_server.client()
    box = Outbox(trial, segment=1, tracking_uri=uri, run_id=run_id)
    box.tags({"marker": "from the outbox"})
    for step in range(1, 51):
        box.metrics(step, {"train/loss": 1 / step})
    box.status("RUNNING")
    assert box.flush(60), box.last_error
    box.close()
    watermark = TrialFolder(trial).outbox_dir / WATERMARK_FILE
    shipped = watermark.read_bytes()

    # something else changes the tag on the server; a next segment ships only its own records
    client.set_tag(run_id, "marker", "changed on the server")
    box = Outbox(trial, segment=2, tracking_uri=uri, run_id=run_id)
    for step in range(51, 61):
        box.metrics(step, {"train/loss": 1 / step})
    assert box.flush(60), box.last_error
    box.close()
    assert client.get_run(run_id).data.tags["marker"] == "changed on the server"  # segment 1 was not re-sent

    # a crash between a call and its watermark: the old watermark comes back and everything is sent again
    watermark.write_bytes(shipped)
    assert pending(trial) == 10
    result = ship_pending(trial, uri, run_id, deadline_s=60)
    assert result == ShipResult(shipped=10, left=0, error="", rejected=0)
    watermark.unlink()  # all of it, both segments, again
    assert pending(trial) == 50 + 1 + 1 + 10
    assert ship_pending(trial, uri, run_id, deadline_s=60).complete
    assert _history(client, run_id, "train/loss") == [(s, 1 / s) for s in range(1, 61)]  # one point per step
    assert client.get_run(run_id).info.status == "RUNNING"


def test_a_resumed_segment_keeps_the_first_value_of_each_step(mlflow_server, run) -> None:
    """A killed segment logged steps past its last checkpoint; the next one recomputes them: the first values stay."""
    uri, run_id, trial = run
    first = Outbox(trial, segment=1, tracking_uri=uri, run_id=run_id)
    for step in range(1, 11):
        first.metrics(step, {"train/loss": float(step)})
    first.close()  # killed: nothing shipped
    second = Outbox(trial, segment=2, tracking_uri=uri, run_id=run_id)
    assert second.last_step("train/loss") == 10
    for step in range(5, 16):  # resumed from the checkpoint of step 4, with other values
        second.metrics(step, {"train/loss": 100.0 + step})
    assert second.flush(60), second.last_error
    second.close()
    history = _history(mlflow_server.client(), run_id, "train/loss")
    assert history == [(s, float(s)) for s in range(1, 11)] + [(s, 100.0 + s) for s in range(11, 16)]


def test_refused_records_are_set_aside_and_clashing_params_keep_their_first_value(mlflow_server, run,
                                                                                  capfd: pytest.CaptureFixture) -> None:
    uri, run_id, trial = run
    client = mlflow_server.client()
    client.log_param(run_id, "data.num_workers", "0")  # the ledger's value at submission
    box = Outbox(trial, segment=1, tracking_uri=uri, run_id=run_id)
    box.params({"data.num_workers": "2", "model.d_model": "96"})
    box.metrics(1, {"bad key*": 1.0})  # MLflow refuses the name: HTTP 400
    box.metrics(1, {"train/loss": 0.5})
    box.status("FINISHED")
    assert box.flush(60), box.last_error
    box.close()
    data = client.get_run(run_id)
    assert data.data.params == {"data.num_workers": "0", "model.d_model": "96"}
    assert data.data.metrics == {"train/loss": 0.5} and data.info.status == "FINISHED"
    rejected = [json.loads(line) for line in (TrialFolder(trial).outbox_dir / REJECTED_FILE).read_text().splitlines()]
    assert [r["record"]["metrics"] for r in rejected] == [{"bad key*": 1.0}]
    err = capfd.readouterr().err
    assert "data.num_workers" in err and "keep the first values" in err and REJECTED_FILE in err
    assert pending(trial) == 0


def test_an_unreachable_server_never_blocks_the_writer_and_flush_keeps_its_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from asr_core.runtime.outbox import HTTP_DEFAULTS
    from tests.plugins.mlflow_server import free_port

    for k, v in HTTP_DEFAULTS.items():  # as the trial job sets them
        monkeypatch.setenv(k, v)
    uri = f"http://127.0.0.1:{free_port()}"  # nobody listens
    box = Outbox(tmp_path, segment=1, tracking_uri=uri, run_id="0" * 32).start()
    t0 = time.monotonic()
    for step in range(1, 2001):
        box.metrics(step, {"train/loss": 1.0, "train/lr": 0.1})
    box.status("FINISHED")
    appended = time.monotonic() - t0
    t0 = time.monotonic()
    assert not box.flush(2.0)
    waited = time.monotonic() - t0
    box.close()
    assert appended < 2.0 and 1.9 <= waited < 4.0, (appended, waited)
    assert pending(tmp_path) == 2001 and box.last_error
    result = ship_pending(tmp_path, uri, "0" * 32, deadline_s=3)
    assert result.left == 2001 and result.shipped == 0 and "unreachable" in result.error


def test_ship_pending_ships_what_a_killed_job_left(mlflow_server, run) -> None:
    """A job appends, is killed before its shipper sent anything; status/resume ship it later, with no mlflow import
    needed to count it."""
    uri, run_id, trial = run
    script = (
        "import os, sys\n"
        "from asr_core.runtime.outbox import Outbox\n"
        f"box = Outbox({str(trial)!r}, segment=1, tracking_uri={uri!r}, run_id={run_id!r})\n"
        "box.status('RUNNING', {'trial.segments': '1'})\n"
        "for s in range(1, 31): box.metrics(s, {'train/loss': s / 10})\n"
        "box.status('FAILED', {'trial.error': 'RuntimeError: the node went away'})\n"
        "os._exit(137)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 137, done.stderr
    count = subprocess.run([sys.executable, "-c", "import sys; from asr_core.contract.folder.outbox_files import pending; "
                            f"print(pending({str(trial)!r}), 'mlflow' in sys.modules)"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=True)
    assert count.stdout.split() == ["32", "False"]
    result = ship_pending(trial, uri, run_id, deadline_s=60)
    assert result.complete and result.shipped == 32
    client = mlflow_server.client()
    data = client.get_run(run_id)
    assert data.info.status == "FAILED" and data.data.tags["trial.error"] == "RuntimeError: the node went away"
    assert _history(client, run_id, "train/loss") == [(s, s / 10) for s in range(1, 31)]
    assert pending(trial) == 0 and ship_pending(trial, uri, run_id, 5) == ShipResult(0, 0)


def test_a_line_cut_short_by_a_crash_is_skipped_and_the_next_writer_starts_a_fresh_line(mlflow_server, run) -> None:
    uri, run_id, trial = run
    box = Outbox(trial, segment=1, tracking_uri=uri, run_id=run_id)
    box.metrics(1, {"train/loss": 1.0})
    box.close()
    path = TrialFolder(trial).outbox_dir / "000001.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"seq":2,"kind":"metrics","step":2,"ti')  # the write a crash interrupted
    assert pending(trial) == 1
    box = Outbox(trial, tracking_uri=uri, run_id=run_id)  # a start without a segment appends to the newest file
    assert box.path == path
    box.status("KILLED")
    assert box.flush(60), box.last_error
    box.close()
    client = mlflow_server.client()
    assert client.get_run(run_id).info.status == "KILLED"
    assert _history(client, run_id, "train/loss") == [(1, 1.0)] and pending(trial) == 0
    assert [json.loads(line)["seq"] for line in path.read_text().splitlines()[-1:]] == [2]


def test_a_run_id_given_later_ships_what_waited(mlflow_server, run) -> None:
    uri, run_id, trial = run
    box = Outbox(trial, segment=1, tracking_uri=uri).start()  # the trainer creates the run after this
    box.status("RUNNING", {"trial.segments": "1"})
    assert not box.flush(0.5)
    box.set_run(run_id)
    box.metrics(1, {"train/loss": 0.25})
    assert box.flush(60), box.last_error
    box.close()
    data = mlflow_server.client().get_run(run_id)
    assert data.info.status == "RUNNING" and data.data.metrics == {"train/loss": 0.25}


def test_the_job_sets_mlflows_http_retries_low_unless_the_user_set_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from asr_core.runtime.outbox import HTTP_DEFAULTS, fail_fast_http

    for k in HTTP_DEFAULTS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")
    fail_fast_http()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"
