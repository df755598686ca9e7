"""The trial job's ends besides finishing: a stop signal honoured from the first line of the process (also while the
corpus loads), a cancelled trial that ends KILLED and is never requeued, a trainer that lost its lease, and the fault
injection other tests use. Real processes, a real MLflow sqlite store."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

import pytest
from mlflow.tracking import MlflowClient

from asr_core.training.checkpoint import load_checkpoint
from asr_core.data.corpora import load_corpus
from asr_core.contract.folder.outbox_files import pending
from asr_core.runtime.shipper import ship_pending
from asr_core.contract.trial import (EXIT_CANCELLED, EXIT_FAILED, EXIT_FENCED, EXIT_PREEMPTED, TAG_ERROR,
                                     TAG_PREEMPTIONS, TrialFolder, progress_records, read_attempts)
from asr_core.contract.folder.segments import read_segments
from tests.test_trial import make_trial, trial_cmd, trial_env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("signals-corpus") / "c"
    subprocess.run([sys.executable, "-m", "asr_core", "synth", str(out), "--hours", "0.02", "--min-minutes", "0.4",
                    "--max-minutes", "0.6", "--seed", "5", "--splits", "train"], check=True, capture_output=True)
    return out / "train"


def _setup(tmp_path: Path, train: str, *overrides: str) -> tuple[Path, str, str, MlflowClient]:
    return make_trial(tmp_path, [
        f"data.train={train}", "data.batch_audio_s=20.48", "data.context_s=5.12", "data.seqlen_warmup=none",
        "train.max_steps=6", "train.warmup_steps=2", "train.checkpoint_every=2", "train.log_every=1",
        "eval.datasets=[]", *overrides], "signals")


def _steps(client: MlflowClient, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))


def _wait_for_reader(fifo: Path, proc: subprocess.Popen, timeout: float = 300) -> int:
    """Block until ``proc`` has opened the FIFO for reading (it is inside the corpus reader); returns our write end,
    held open so that the reader stays blocked in read()."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        if proc.poll() is not None:
            pytest.fail(f"the trial ended (exit {proc.returncode}) before reading its corpus:\n{proc.stdout.read()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the trial never opened {fifo}")


T = TypeVar("T")


def _act_at_step(cmd: list[str], job: str, step: int, act: Callable[[subprocess.Popen[str]], T],
                 timeout: float = 120) -> tuple[subprocess.Popen[str], T, str]:
    """Start the trial, call ``act(proc)`` when its log reaches ``step N/``, wait for it to exit; returns the
    process, what ``act`` returned and the whole log."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=trial_env(job))
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if f"step {step}/" in line:
            acted = act(proc)
            break
    else:
        raise AssertionError(f"the trial exited {proc.wait()} before step {step}:\n{''.join(lines)[-3000:]}")
    return proc, acted, "".join(lines) + proc.communicate(timeout=timeout)[0]


@pytest.mark.slow
def test_usr2_while_the_corpus_loads_exits_75_with_its_outcome_and_the_rerun_finishes(tmp_path: Path,
                                                                                      corpus: Path) -> None:
    """The corpus is a manifest behind a FIFO: the job blocks reading it, so the signal lands inside the reader.
    Before the handlers were installed at the first line, USR2 there killed the job (no exit 75, no requeue)."""
    manifest = "".join(json.dumps({"id": r.id, "audio": str(r.audio), "duration": r.duration,
                                   "words": [{"text": w.text, "start": w.start, "end": w.end} for w in r.words]})
                       + "\n" for r in load_corpus(f"podcast:{corpus}"))
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    trial_dir, uri, run_id, client = _setup(tmp_path, f"manifest:{fifo}")
    proc = subprocess.Popen(trial_cmd(trial_dir, uri, run_id), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=trial_env("job-1"))
    writer = _wait_for_reader(fifo, proc)
    try:
        time.sleep(0.5)  # the reader is now blocked in read()
        proc.send_signal(signal.SIGUSR2)
        log = proc.communicate(timeout=120)[0]
    finally:
        os.close(writer)
    assert proc.returncode == EXIT_PREEMPTED, log
    assert not TrialFolder(trial_dir).checkpoint.exists()  # nothing was trained: nothing to checkpoint
    (attempt,) = read_attempts(trial_dir)
    assert (attempt.outcome, attempt.segment, attempt.job_id, attempt.by) == ("preempted", 1, "job-1", "job")
    assert [r.phase for r in progress_records(trial_dir)] == ["start", "preempted"]
    if pending(trial_dir):  # the job waited 5 s for MLflow (it may still have been importing it); the rest
        assert ship_pending(trial_dir, uri, run_id, 60).complete  # is what orchestrate's status/resume ship
    run = client.get_run(run_id)
    assert run.info.status == "SCHEDULED" and run.data.tags.get(TAG_PREEMPTIONS) == "1", log

    def feed() -> None:  # the rerun reads the manifest through the same FIFO
        with open(fifo, "w") as f:
            f.write(manifest)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env("job-2"),
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and _steps(client, run_id) == list(range(1, 7))
    assert [(a.outcome, a.segment) for a in read_attempts(trial_dir)] == [("preempted", 1), ("finished", 2)]


def test_a_cancelled_trial_never_starts_and_its_run_is_killed(tmp_path: Path, corpus: Path) -> None:
    trial_dir, uri, run_id, client = _setup(tmp_path, f"podcast:{corpus}")
    TrialFolder(trial_dir).cancelled.write_text("cancelled by orchestrate\n")
    t0 = time.monotonic()
    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env("job-1"),
                          timeout=120)
    assert done.returncode == EXIT_CANCELLED, done.stdout + done.stderr
    assert "cancelled" in done.stdout and time.monotonic() - t0 < 60
    assert client.get_run(run_id).info.status == "KILLED"
    assert read_segments(trial_dir) == [] and not TrialFolder(trial_dir).checkpoint.exists()
    (attempt,) = read_attempts(trial_dir)
    assert (attempt.outcome, attempt.segment, attempt.job_id) == ("cancelled", None, "job-1")


@pytest.mark.slow
def test_term_on_a_cancelled_trial_checkpoints_kills_the_run_and_is_final(tmp_path: Path, corpus: Path) -> None:
    """`orchestrate cancel` writes CANCELLED, then the scheduler sends TERM: the job checkpoints, the run ends KILLED
    (not SCHEDULED, which a later submit would restart), exit 77; a later start changes nothing."""
    trial_dir, uri, run_id, client = _setup(tmp_path, f"podcast:{corpus}", "train.max_steps=40")
    def cancel(proc: subprocess.Popen[str]) -> None:
        TrialFolder(trial_dir).cancelled.write_text("cancelled by orchestrate\n")
        proc.send_signal(signal.SIGTERM)

    proc, _, log = _act_at_step(trial_cmd(trial_dir, uri, run_id), "job-1", 3, cancel)
    assert proc.returncode == EXIT_CANCELLED, log
    if pending(trial_dir):  # the job waits only 5 s for MLflow after a signal; orchestrate ships the rest
        assert ship_pending(trial_dir, uri, run_id, 60).complete
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and TAG_PREEMPTIONS not in run.data.tags
    state = load_checkpoint(TrialFolder(trial_dir).checkpoint)
    assert 3 <= state["step"] < 40
    assert [(a.outcome, a.segment) for a in read_attempts(trial_dir)] == [("cancelled", 1)]
    assert progress_records(trial_dir)[-1].phase == "cancelled"
    steps = _steps(client, run_id)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= state["step"]

    again = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env("job-2"),
                           timeout=120)
    assert again.returncode == EXIT_CANCELLED and len(read_segments(trial_dir)) == 1
    assert client.get_run(run_id).info.status == "KILLED"


@pytest.mark.slow
def test_an_injected_fault_fails_the_trial_at_the_same_step_every_time(tmp_path: Path, corpus: Path) -> None:
    """ASR_CORE_FAULT=raise-at-step:N (for the failure-budget tests): N is reached again after a resume."""
    trial_dir, uri, run_id, client = _setup(tmp_path, f"podcast:{corpus}")
    for job in ("job-1", "job-2"):
        done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True,
                              env=trial_env(job, ASR_CORE_FAULT="raise-at-step:4"), timeout=600)
        assert done.returncode == EXIT_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
        run = client.get_run(run_id)
        assert run.info.status == "FAILED" and run.data.tags[TAG_ERROR] == "RuntimeError: fault injected at step 4"
    fault = "RuntimeError: fault injected at step 4"
    assert [(a.outcome, a.segment, a.reason) for a in read_attempts(trial_dir)] == [("failed", 1, fault),
                                                                                   ("failed", 2, fault)]
    assert _steps(client, run_id) == [1, 2, 3]  # step 3 was logged once, by the first segment
    bad = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True,
                         env=trial_env("job-3", ASR_CORE_FAULT="explode"), timeout=600)
    assert bad.returncode == EXIT_FAILED and "ASR_CORE_FAULT='explode' is not a fault" in bad.stderr


@pytest.mark.slow
def test_a_trainer_that_lost_its_lease_stops_without_saving_and_exits_73(tmp_path: Path, corpus: Path) -> None:
    """Another job took the trial over (here: the same job id, as a requeued SLURM task does): the first trainer's
    next checkpoint save finds the lease gone, saves nothing and exits EXIT_FENCED, leaving folder and run alone."""
    from asr_core.contract.folder.lease import Lease

    trial_dir, uri, run_id, client = _setup(tmp_path, f"podcast:{corpus}", "train.max_steps=60")
    proc, (taker, taken), log = _act_at_step(
        trial_cmd(trial_dir, uri, run_id), "job-1", 3,
        lambda _: (Lease(trial_dir, "job-1", heartbeat_s=0).acquire(), time.time()))
    assert proc.returncode == EXIT_FENCED, log
    folder = TrialFolder(trial_dir)
    assert folder.checkpoint.stat().st_mtime <= taken and load_checkpoint(folder.checkpoint)["step"] <= 4
    assert taker.held()  # the first trainer's release left the new holder's lease alone
    assert [(a.outcome, a.segment) for a in read_attempts(trial_dir)] == [("fenced", 1)]
    assert [r.phase for r in progress_records(trial_dir)][-1] == "train"  # no preempted/failed/done of its own
    assert client.get_run(run_id).info.status != "FAILED"
    taker.release()
