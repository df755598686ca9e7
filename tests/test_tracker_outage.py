"""The trial job never waits for the tracker: a real ``python -m asr_core trial`` against a real ``mlflow server``
that the test stops and starts again (``slurm/mlflow-server.sh --detach`` / ``--stop``, same folder and port).

* A 90 s outage in the middle of training: training goes on through it, the trial ends FINISHED, MLflow holds every
  step exactly once, one segment trained every step once.
* SIGUSR2 while the server is down: the job checkpoints and exits 75 within seconds (before, the preemption's MLflow
  calls retried for minutes, past SLURM's signal delay, so the job was killed and never requeued); what it could
  not ship waits in its outbox, and ``ship_pending`` delivers it once the server is back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from asr_core.training.checkpoint import load_checkpoint
from asr_core.config import preset
from asr_core.contract.folder.outbox_files import pending
from asr_core.runtime.shipper import ship_pending
from asr_core.contract.folder.segments import read_segments
from asr_core.contract.trial import (EXIT_PREEMPTED, TAG_PREEMPTIONS, TrialFolder, progress_records, read_attempts)
from tests.plugins.mlflow_server import free_port
from tests.test_backend import smoke_corpus

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "slurm" / "mlflow-server.sh"
OUTAGE_S = 90.0
TRAIN_S = 150.0  # seconds of training asked for: the outage starts at a sixth and lasts 90 s
KEYS = ("train/loss", "train/lr", "train/seq_len_s", "train/batch_size", "train/grad_norm", "train/micro_batches")


class Server:
    """An ``mlflow server`` of slurm/mlflow-server.sh that a test can stop and start again on the same folder and
    port (a session-wide server cannot go down)."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.port = directory, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        t0 = time.monotonic()
        env = {**os.environ, "MLFLOW_SERVER_TIMEOUT": "240"}
        done = subprocess.run(["bash", str(SCRIPT), "--dir", str(self.dir), "--port", str(self.port), "--workers", "1",
                               "--detach"], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return time.monotonic() - t0

    def stop(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "--dir", str(self.dir), "--stop"], capture_output=True, timeout=120)


@pytest.fixture()
def server(tmp_path: Path):
    s = Server(tmp_path / "mlflow-server")
    s.start()
    try:
        yield s
    finally:
        s.stop()


def _overrides(corpus: Path, steps: int) -> list[str]:
    return [f"data.train=podcast:{corpus}/train", "data.batch_audio_s=20.48", "data.context_s=5.12",
            "data.seqlen_warmup=none", f"train.max_steps={steps}", "train.warmup_steps=4",
            "train.checkpoint_every=25", "train.log_every=5", "train.device=cpu", "train.precision=fp32",
            "eval.datasets=[]"]


def _env(job: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "ORCHESTRATE_JOB_ID": job}


def _seconds_per_step(tmp_path: Path, corpus: Path) -> float:
    """This machine's pace for the config (a short standalone run without MLflow)."""
    cfg = tmp_path / "calibrate.json"
    cfg.write_text(json.dumps(preset("tiny").with_overrides(_overrides(corpus, 16)).to_dict()))
    out = tmp_path / "calibrate"
    proc = subprocess.Popen([sys.executable, "-m", "asr_core", "train", str(cfg), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env("calibrate"))
    assert proc.stdout is not None
    seen: dict[int, float] = {}
    for line in proc.stdout:
        if m := re.match(r"\[train\] step (\d+)/", line):
            seen[int(m.group(1))] = time.monotonic()
    assert proc.wait(timeout=600) == 0 and {5, 15} <= seen.keys(), seen
    return (seen[15] - seen[5]) / 10


def _trial(tmp_path: Path, corpus: Path, server: Server, steps: int) -> tuple[Path, str, MlflowClient, list[str]]:
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    cfg = preset("tiny").with_overrides(_overrides(corpus, steps))
    (trial_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    client = MlflowClient(tracking_uri=server.uri)
    exp = client.create_experiment(f"outage-{tmp_path.name}")
    run_id = client.create_run(exp, run_name="t").info.run_id
    client.update_run(run_id, status="SCHEDULED")
    cmd = [sys.executable, "-m", "asr_core", "trial", "--config", str(trial_dir / "config.json"), "--out",
           str(trial_dir), "--tracking-uri", server.uri, "--run-id", run_id]
    return trial_dir, run_id, client, cmd


def _trained(trial_dir: Path) -> int:
    return max((r.done for r in progress_records(trial_dir) if r.phase == "train"), default=0)


def _wait_trained(trial_dir: Path, proc: subprocess.Popen, step: int, timeout: float = 600) -> None:
    end = time.monotonic() + timeout
    while _trained(trial_dir) < step:
        if proc.poll() is not None:
            pytest.fail(f"the trial ended (exit {proc.returncode}) before step {step}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail(f"no step {step} after {timeout:g} s")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_90_s_outage_mid_training_loses_nothing_and_stops_nothing(tmp_path: Path, smoke_corpus: Path,
                                                                    server: Server) -> None:
    pace = _seconds_per_step(tmp_path, smoke_corpus)
    steps = max(150, min(5000, round(TRAIN_S / pace)))
    trial_dir, run_id, client, cmd = _trial(tmp_path, smoke_corpus, server, steps)
    log = open(tmp_path / "trial.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env("job-1"))
    try:
        _wait_trained(trial_dir, proc, steps // 6)
        server.stop()
        down, down_at = time.time(), _trained(trial_dir)
        time.sleep(OUTAGE_S)
        up_at = _trained(trial_dir)
        assert proc.poll() is None, "training ended during the outage: the test's step count is too small"
        restart_s = server.start()
        up = time.time()
        rc = proc.wait(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "trial.log").read_text()
    assert rc == 0, text[-4000:]
    print(f"{steps} steps at {pace:.2f} s/step; during the {OUTAGE_S:g} s outage steps {down_at} -> {up_at}; "
          f"restart took {restart_s:.0f} s")

    # training went on while MLflow was down: at least half the pace it kept before (it used to stop dead)
    assert up_at - down_at >= 0.5 * OUTAGE_S / pace / 2, (down_at, up_at, pace)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in KEYS:  # every step exactly once
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == list(range(1, steps + 1)), key
    # one segment, no step trained twice: the progress log never goes back
    assert len(read_segments(trial_dir)) == 1
    done = [r.done for r in progress_records(trial_dir) if r.phase == "train"]
    assert done == sorted(done) and done[-1] == steps
    assert [a.outcome for a in read_attempts(trial_dir)] == ["finished"]
    assert load_checkpoint(TrialFolder(trial_dir).checkpoint)["step"] == steps
    assert pending(trial_dir) == 0
    logged = [m.timestamp / 1000 for m in client.get_metric_history(run_id, "train/loss")]
    assert sum(down < t < up for t in logged) >= up_at - down_at - 5  # points keep their times through the outage


@pytest.mark.slow
def test_usr2_while_the_server_is_down_exits_75_within_seconds(tmp_path: Path, smoke_corpus: Path,
                                                               server: Server) -> None:
    trial_dir, run_id, client, cmd = _trial(tmp_path, smoke_corpus, server, 5000)
    log = open(tmp_path / "trial.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env("job-1"))
    try:
        _wait_trained(trial_dir, proc, 10)
        server.stop()
        stopped_at = _trained(trial_dir)
        _wait_trained(trial_dir, proc, stopped_at + 5, timeout=120)  # training goes on without the server
        t0 = time.monotonic()
        proc.send_signal(signal.SIGUSR2)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not exit within 120 s of SIGUSR2 while MLflow was down")
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "trial.log").read_text()
    assert rc == EXIT_PREEMPTED, text[-4000:]
    print(f"exit {rc} {took:.1f} s after SIGUSR2")
    assert took < 20, f"{took:.1f} s from SIGUSR2 to exit with MLflow down"
    step = load_checkpoint(TrialFolder(trial_dir).checkpoint)["step"]
    assert step >= stopped_at + 5
    assert [(a.outcome, a.segment) for a in read_attempts(trial_dir)] == [("preempted", 1)]
    assert progress_records(trial_dir)[-1].phase == "preempted"
    waiting = pending(trial_dir)
    assert waiting > 0  # at least the SCHEDULED status

    server.start()  # the job is gone: orchestrate's status/resume ship what it left
    result = ship_pending(trial_dir, server.uri, run_id, deadline_s=120)
    assert result.complete and result.shipped == waiting, result
    run = client.get_run(run_id)
    assert run.info.status == "SCHEDULED" and run.data.tags[TAG_PREEMPTIONS] == "1"
    logged = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
    assert logged == list(range(1, len(logged) + 1)) and len(logged) >= step
