"""The ledger catches up with the trial folders: :func:`orchestrate.ledger.reconcile.reconcile_ledger` ships the outbox
of trials whose job is gone and moves run states that lag their folder (DONE → FINISHED, CANCELLED → KILLED, a
failure nobody could report → FAILED with its reason); it never raises on an unreachable MLflow.

Real pieces: `mlflow server`s (the session's, and one this test starts and stops with slurm/mlflow-server.sh), a
real `python -m asr_core trial` that trains and evaluates while MLflow is down, and `orchestrate status` in fresh
processes.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from asr_core.config import preset
from asr_core.contract.folder.lease import Lease
from asr_core.contract.trial import (FAILED, FINISHED, KILLED, OUTCOME_FAILED, OUTCOME_FINISHED,
                                     OUTCOME_KILLED, RUNNING, SCHEDULED, TAG_ERROR, TrialFolder, record_attempt)
from orchestrate.tools.fake_sweep import fake_trials
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import Manifest, SweepDir
from orchestrate.sweep.trial import Trial
from orchestrate.ledger.reconcile import behind, read_sync, reconcile_ledger, record_mirrored
from orchestrate.sweep.trial_state import read_folder_states
from tests.plugins.mlflow_server import free_port
from tests.test_trial import corpus, trial_cmd, trial_env

__all__ = ["corpus"]  # the synthetic corpus fixture, shared with test_trial

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "slurm" / "mlflow-server.sh"


def _sweep(root: Path, name: str, uri: str, trials: list[Trial], backend: str = "local") -> SweepDir:
    sweep = SweepDir(root, name)
    sweep.write_manifest(Manifest(name=name, grid="grids/smoke.yaml", backend=backend, profile="", tracking_uri=uri,
                                  workdir=str(REPO), sweep_id=uuid.uuid4().hex))
    sweep.write_trials(trials)
    for t in trials:
        sweep.prepare_trial(t)
    return sweep


def _ledger(sweep: SweepDir, trials: list[Trial]) -> tuple[Ledger, dict[str, str]]:
    m = sweep.read_manifest()
    ledger = Ledger(m.tracking_uri, m.name)
    parent = ledger.ensure_sweep(m.grid, m.backend, m.sweep_id, str(sweep.path))
    return ledger, ledger.create_trial_runs(parent, trials, m.backend)


# ---- which runs move, and which stay -----------------------------------------------------------------------------
def test_reconcile_moves_exactly_the_runs_that_lag_their_folders(tmp_path: Path, mlflow_server) -> None:  # noqa: ANN001
    roles = ("done", "cancelled", "killed", "failed_queued_again", "gave_up", "held", "live", "finished_cancelled",
             "untouched")
    trials = {r: dataclasses.replace(t, label=f"{r}-{t.label}") for r, t in zip(roles, fake_trials(len(roles)))}
    sweep = _sweep(tmp_path, f"rec-{uuid.uuid4().hex[:8]}", mlflow_server.uri, list(trials.values()))
    ledger, ids = _ledger(sweep, list(trials.values()))
    d = {r: sweep.trial_dir(t.key) for r, t in trials.items()}
    run = {r: ids[t.key] for r, t in trials.items()}
    ledger.set_status([run[r] for r in ("done", "cancelled", "killed", "held", "live")], RUNNING)
    ledger.set_status([run["finished_cancelled"]], FINISHED)

    TrialFolder(d["done"]).done.write_text("finished\n")  # its FINISHED never reached MLflow
    record_attempt(d["done"], OUTCOME_FINISHED, segment=1, job_id="5_0", by="job")
    TrialFolder(d["cancelled"]).cancelled.write_text("{}\n")  # cancelled while MLflow was down
    TrialFolder(d["finished_cancelled"]).cancelled.write_text("{}\n")  # a FINISHED run is never un-finished
    record_attempt(d["killed"], OUTCOME_KILLED, "trainer killed by SIGKILL (out of memory or the system)",
                   segment=1, job_id="5_2", by="task")
    record_attempt(d["failed_queued_again"], OUTCOME_FAILED, "RuntimeError: boom", segment=1, job_id="5_3",
                   by="job")  # ledger SCHEDULED: resume already queued it again within the budget
    for n in (1, 2, 3):
        record_attempt(d["gave_up"], OUTCOME_KILLED, "killed by the system: out of memory", segment=n,
                       job_id=f"5_4.{n}", by="resume")
    record_attempt(d["held"], OUTCOME_KILLED, "NODE_FAIL", segment=1, job_id="5_5", by="resume")  # requeued
    record_attempt(d["live"], OUTCOME_KILLED, "NODE_FAIL", segment=1, job_id="5_6", by="resume")
    lease = Lease(d["live"], "5_6.again").acquire()  # ... and a new trainer already runs it
    try:
        keys = [t.key for t in trials.values()]
        states = read_folder_states(sweep, keys)
        held = {trials["held"].key}
        assert set(behind(states, read_sync(sweep), held)) == {trials[r].key for r in ("cancelled", "killed",
                                                                                     "gave_up",
                                                                                     "finished_cancelled")}
        result = reconcile_ledger(ledger, sweep, list(trials.values()), states, held=held, max_failures=3)
        assert not result.error and not result.behind, result
        assert result.moved == {trials["done"].key: FINISHED, trials["cancelled"].key: KILLED,
                                trials["killed"].key: FAILED, trials["gave_up"].key: FAILED}
        runs = ledger.trial_runs()
        got = {r: runs[t.key].status for r, t in trials.items()}
        assert got == {"done": FINISHED, "cancelled": KILLED, "killed": FAILED, "failed_queued_again": SCHEDULED,
                       "gave_up": FAILED, "held": RUNNING, "live": RUNNING, "finished_cancelled": FINISHED,
                       "untouched": SCHEDULED}
        assert runs[trials["killed"].key].error == ("1/3 failures: killed trainer killed by SIGKILL (out of "
                                                    "memory or the system)")
        assert runs[trials["gave_up"].key].error == "gave up after 3 failures: killed by the system: out of memory"
        assert runs[trials["cancelled"].key].error == "cancelled"
        assert {k: r.status for k, r in (result.runs or {}).items()} == {k: r.status for k, r in runs.items()}

        # the folders now say the ledger is in step, and a second reconciliation moves nothing
        states = read_folder_states(sweep, keys)
        assert behind(states, read_sync(sweep), held) == {}
        again = reconcile_ledger(ledger, sweep, list(trials.values()), states, held=held)
        assert again.moved == {} and not again.error
        assert {k: r.status for k, r in ledger.trial_runs().items()} == {k: r.status for k, r in runs.items()}
    finally:
        lease.release()


def test_reconcile_never_raises_on_an_unreachable_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    uri = f"http://127.0.0.1:{free_port()}"  # nobody listens
    trials = fake_trials(3)
    sweep = _sweep(tmp_path, "down", uri, trials)
    TrialFolder(sweep.trial_dir(trials[0].key)).cancelled.write_text("{}\n")
    states = read_folder_states(sweep, [t.key for t in trials])
    result = reconcile_ledger(Ledger(uri, "down"), sweep, trials, states, deadline_s=20)
    assert result.error and result.runs is None, result
    assert result.behind == (trials[0].key,)
    assert result.describe().startswith("ledger behind by 1 trials (MLflow unreachable: ")
    assert read_sync(sweep) == {}  # nothing is recorded as mirrored


def test_a_caller_that_wrote_the_ledger_itself_records_it_so_status_need_not_reconcile(tmp_path: Path) -> None:
    trials = fake_trials(2)
    sweep = _sweep(tmp_path, "mirrored", "sqlite:///nowhere.db", trials)
    sweep.cancel_trial(trials[0].key, "orchestrate cancel")
    keys = [t.key for t in trials]
    states = read_folder_states(sweep, keys)
    assert behind(states, read_sync(sweep)) == {trials[0].key: "KILLED not mirrored"}
    record_mirrored(sweep, states, keys)  # e.g. `cancel`, after it marked the runs KILLED
    assert behind(read_folder_states(sweep, keys), read_sync(sweep)) == {}


# ---- a job that ended while MLflow was down ----------------------------------------------------------------------
def _server(directory: Path, port: int, *flags: str) -> None:
    p = subprocess.run(["bash", str(SERVER), "--dir", str(directory), "--port", str(port), "--workers", "1",
                        *flags], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"mlflow-server.sh {' '.join(flags)} exited {p.returncode}: {p.stderr[-2000:]}"


def _status(sweep: SweepDir) -> str:
    p = subprocess.run([sys.executable, "-m", "orchestrate", "status", sweep.name, "--sweep-root",
                        str(sweep.path.parent)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.slow
def test_a_job_that_ended_while_mlflow_was_down_reaches_the_ledger_once(tmp_path: Path, corpus: Path) -> None:
    steps = 8
    cfg = preset("tiny").with_overrides([
        f"data.train=podcast:{corpus}/train", "data.batch_audio_s=20.48", "data.context_s=5.12",
        "data.seqlen_warmup=none", f"train.max_steps={steps}", "train.warmup_steps=2", "train.checkpoint_every=4",
        f"eval.datasets=[test=podcast:{corpus}/test]", "eval.snrs=[]"])
    trial = Trial.make(cfg, 0, "reconcile")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server_dir = tmp_path / "mlflow"
    _server(server_dir, port, "--detach")
    try:
        sweep = _sweep(tmp_path / "runs", f"outage-{uuid.uuid4().hex[:8]}", uri, [trial])
        _, ids = _ledger(sweep, [trial])
        run_id = ids[trial.key]
        _server(server_dir, port, "--stop")  # MLflow goes down before the job starts, and stays down

        trial_dir = sweep.trial_dir(trial.key)
        job = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True,
                             env=trial_env("77_0", ASR_CORE_FINAL_FLUSH_S="3"), cwd=REPO, timeout=600)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert TrialFolder(trial_dir).done.exists()

        out = _status(sweep)  # down: the folder says FINISHED, and that the ledger is behind
        assert "FINISHED" in out and "behind by 1 trials (MLflow unreachable" in out, out

        _server(server_dir, port, "--detach")
        out = _status(sweep)
        assert "reconciled (bounded at" in out and "shipped" in out, out
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        run = client.get_run(run_id)
        assert run.info.status == FINISHED, run.info
        history = client.get_metric_history(run_id, "train/loss")
        assert sorted(m.step for m in history) == sorted({m.step for m in history})  # one point per step
        assert len(history) == steps, [m.step for m in history]
        assert len(client.get_metric_history(run_id, "wer/test")) == 1
        assert TAG_ERROR not in run.data.tags or run.data.tags[TAG_ERROR] == ""

        out = _status(sweep)  # nothing more to ship: shipping again would have sent every point twice
        assert "in step with the trial folders" in out, out
        assert len(client.get_metric_history(run_id, "train/loss")) == steps
        assert json.loads((TrialFolder(trial_dir).outbox_dir / "shipped.json").read_text())["files"]
    finally:
        _server(server_dir, port, "--stop")
