"""``python -m asr_core trial``: the exit-code contract with the schedulers, against a real MLflow sqlite store.

0 = trained, evaluated, run FINISHED; 75 = SIGUSR2 checkpointed, run back to SCHEDULED; 1 = run FAILED with the
error's last line; re-running a finished trial trains nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from asr_core.config import preset

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trial-corpus") / "c"
    subprocess.run([sys.executable, "-m", "asr_core", "synth", str(out), "--hours", "0.03", "--eval-hours", "0.01",
                    "--min-minutes", "0.5", "--max-minutes", "0.8", "--seed", "3", "--splits", "train,test"],
                   check=True, capture_output=True)
    return out


def _setup(tmp_path: Path, corpus: Path, *overrides: str) -> tuple[Path, str, str, MlflowClient]:
    cfg = preset("tiny").with_overrides([
        f"data.train=podcast:{corpus}/train", "data.batch_audio_s=20.48", "data.context_s=5.12",
        "data.seqlen_warmup=none", "train.max_steps=8", "train.warmup_steps=2", "train.checkpoint_every=2",
        f"eval.datasets=[test=podcast:{corpus}/test]", "eval.snrs=[0]", *overrides])
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    (trial_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("trial-test")
    run = client.create_run(exp, run_name="t", tags={"sweep.role": "trial"})
    client.update_run(run.info.run_id, status="SCHEDULED")
    return trial_dir, uri, run.info.run_id, client


def _cmd(trial_dir: Path, uri: str, run_id: str) -> list[str]:
    return [sys.executable, "-m", "asr_core", "trial", "--config", str(trial_dir / "config.json"), "--out",
            str(trial_dir), "--tracking-uri", uri, "--run-id", run_id]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def test_trial_trains_evaluates_and_finishes_once(tmp_path: Path, corpus: Path) -> None:
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus)
    done = subprocess.run(_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert {"wer/test", "wer/test/snr0"} <= set(run.data.metrics)
    assert run.data.metrics["wer/test"] >= 0.0
    assert run.data.params["model.d_model"] == str(preset("tiny").model.d_model)
    assert (trial_dir / "DONE").exists() and (trial_dir / "checkpoint.pt").exists()
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
    assert steps == list(range(1, 9)) or steps == list(range(8)), steps

    again = subprocess.run(_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=_env(), timeout=120)
    assert again.returncode == 0 and "already finished" in again.stdout
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == steps  # nothing retrained


def test_sigusr2_checkpoints_exits_75_and_the_rerun_finishes_the_same_run(tmp_path: Path, corpus: Path) -> None:
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus, "train.max_steps=16", "eval.snrs=[]")
    proc = subprocess.Popen(_cmd(trial_dir, uri, run_id), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_env())
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # wait until training is under way, then preempt
        lines.append(line)
        if "step 3/" in line:
            proc.send_signal(signal.SIGUSR2)
            break
    rest = proc.communicate(timeout=300)[0]
    assert proc.returncode == 75, "".join(lines) + rest
    run = client.get_run(run_id)
    assert run.info.status == "SCHEDULED" and run.data.tags["trial.preemptions"] == "1"
    assert (trial_dir / "checkpoint.pt").exists() and not (trial_dir / "DONE").exists()

    done = subprocess.run(_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "wer/test" in run.data.metrics
    steps = sorted({m.step for m in client.get_metric_history(run_id, "train/loss")})
    assert len(steps) == 16 and steps[-1] - steps[0] == 15  # one continuous history, nothing lost


def test_a_failing_trial_marks_the_run_failed_with_the_error(tmp_path: Path, corpus: Path) -> None:
    missing = tmp_path / "no-such-corpus"
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus, f"data.train=podcast:{missing}")
    done = subprocess.run(_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 1
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert "no-such-corpus" in run.data.tags["trial.error"]


def test_bad_config_is_a_usage_error_before_any_run_changes(tmp_path: Path, corpus: Path) -> None:
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus)
    (trial_dir / "config.json").write_text(json.dumps({"model": {"heads": 7}}))
    done = subprocess.run(_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=_env(), timeout=120)
    assert done.returncode == 2 and "model.heads" in done.stderr
    assert client.get_run(run_id).info.status == "SCHEDULED"
