"""The fence, end to end: two ``python -m asr_core trial`` processes for one trial folder (smoke corpus, a real
``mlflow server``). One trains and finishes; the other exits ``EXIT_FENCED`` (73) within seconds, names the holder
on its stdout and changes nothing: the checkpoint is the winner's, the run's metric history has one value per
step, only one segment was recorded, the run carries no error and no lease generation of its own.

``at_once``: both start together (a double submission). ``mid_training``: the second starts while the first is
training with a checkpoint on disk (``orchestrate resume`` while the first job is hidden by ``PrivateData=jobs`` or
still COMPLETING)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from asr_core.training.checkpoint import load_checkpoint
from asr_core.config import preset
from asr_core.contract.folder.lease import read_lease
from asr_core.contract.trial import (ENV_JOB_ID, EXIT_FENCED, EXIT_OK, FINISHED, SCHEDULED, TAG_ERROR, TAG_SEGMENTS,
                                     TrialFolder, failures, progress_records, read_attempts, trial_command,
                                     write_config)
from asr_core.contract.folder.segments import read_segments
from tests.plugins.mlflow_server import MlflowServer
from tests.test_backend import smoke_corpus

__all__ = ["smoke_corpus"]  # the session fixture, shared with test_backend

ROOT = Path(__file__).resolve().parents[1]
STEPS = 16
FENCED_WITHIN_S = 60  # from its start to its exit: imports on 2 busy cores, then the lease check


def _trial(tmp_path: Path, corpus: Path, server: MlflowServer, name: str) -> tuple[Path, str]:
    cfg = preset("tiny").with_overrides([
        f"data.train=podcast:{corpus}/train", "data.batch_audio_s=20.48", "data.context_s=5.12",
        "data.seqlen_warmup=none", f"train.max_steps={STEPS}", "train.warmup_steps=2", "train.checkpoint_every=2",
        "eval.datasets=[]"])
    trial_dir = tmp_path / "trial"
    write_config(trial_dir, cfg)
    client = server.client()
    exp = client.create_experiment(f"fence-{name}-{time.time_ns()}")
    run = client.create_run(exp, run_name=name, tags={"sweep.role": "trial"})
    client.update_run(run.info.run_id, status=SCHEDULED)
    return trial_dir, run.info.run_id


class Trainer:
    """One ``python -m asr_core trial`` process, its stdout and stderr in files."""

    def __init__(self, trial_dir: Path, uri: str, run_id: str, job: str, logs: Path) -> None:
        self.job = job
        self.out, self.err = logs / f"{job}.out", logs / f"{job}.err"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", ENV_JOB_ID: job}
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(trial_command(trial_dir, uri, run_id), stdout=out, stderr=err, env=env,
                                         cwd=ROOT)
        self.started = time.monotonic()
        self.ended: float | None = None

    def poll(self) -> int | None:
        rc = self.proc.poll()
        if rc is not None and self.ended is None:
            self.ended = time.monotonic()
        return rc

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def logs(self) -> str:
        return f"--- {self.job} stdout\n{self.stdout()[-3000:]}\n--- {self.job} stderr\n" + \
            self.err.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("when", ["at_once", "mid_training"])
def test_a_second_trainer_is_fenced_and_changes_nothing(tmp_path: Path, smoke_corpus: Path,
                                                        mlflow_server: MlflowServer, when: str) -> None:
    trial_dir, run_id = _trial(tmp_path, smoke_corpus, mlflow_server, when)
    folder = TrialFolder(trial_dir)
    logs = tmp_path / "logs"
    logs.mkdir()
    first = Trainer(trial_dir, mlflow_server.uri, run_id, "job-A", logs)
    trainers = [first]
    try:
        if when == "mid_training":  # the first has trained and saved at least one checkpoint
            deadline = time.monotonic() + 300
            while not folder.checkpoint.exists() and first.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert folder.checkpoint.exists() and first.poll() is None, first.logs()
        trainers.append(Trainer(trial_dir, mlflow_server.uri, run_id, "job-B", logs))
        deadline = time.monotonic() + 500
        while None in [t.poll() for t in trainers] and time.monotonic() < deadline:  # each polled: its end time
            time.sleep(0.05)
        codes = {t.job: t.poll() for t in trainers}
        assert sorted(codes.values(), key=str) == sorted([EXIT_OK, EXIT_FENCED], key=str), \
            f"{codes}\n" + "\n".join(t.logs() for t in trainers)
    finally:
        for t in trainers:
            t.kill()

    (winner,) = [t for t in trainers if t.proc.returncode == EXIT_OK]
    (loser,) = [t for t in trainers if t.proc.returncode == EXIT_FENCED]
    if when == "mid_training":
        assert winner is first
    both = "\n".join(t.logs() for t in trainers)
    # fenced within seconds, while the holder was still at work: it did not wait for the lease
    assert loser.ended is not None and winner.ended is not None
    assert loser.ended - loser.started < FENCED_WITHIN_S and loser.ended < winner.ended, both
    assert f"job {winner.job}" in loser.stdout(), both  # its stdout names the holder

    # the winner's trial, whole: one segment, one checkpoint of the last step, one value per step
    assert [s.job_id for s in read_segments(trial_dir)] == [winner.job], both
    assert folder.done.exists() and load_checkpoint(folder.checkpoint)["step"] == STEPS
    client = mlflow_server.client()
    run = client.get_run(run_id)
    assert run.info.status == FINISHED and run.data.tags[TAG_SEGMENTS] == "1", both
    assert run.data.tags.get(TAG_ERROR, "") == "", run.data.tags[TAG_ERROR]
    for key in ("train/loss", "train/lr"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(1, STEPS + 1)), (key, steps)
    assert "failed" not in [p.phase for p in progress_records(trial_dir)]
    assert failures(read_attempts(trial_dir)) == []
    # the lease: the winner's, released at its end; the loser created no generation of its own
    lease = read_lease(trial_dir)
    assert lease is not None and (lease.job_id, lease.released) == (winner.job, True)
    assert {json.loads(p.read_text())["job_id"] for p in folder.lease_dir.glob("*.json")} == {winner.job}
