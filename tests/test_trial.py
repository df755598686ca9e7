"""``python -m asr_core trial``: the exit-code contract with the schedulers, against a real MLflow sqlite store.

0 = trained, evaluated, run FINISHED; 75 = SIGUSR2 checkpointed, run back to SCHEDULED; 1 = run FAILED with the
error's last line; 2 = invalid config, run FAILED naming it; re-running a finished trial trains nothing. Each start
of the job is a segment (segments.jsonl, tags trial.segments and trial.code) and the job's progress records follow
it from start to its end.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from asr_core.training.checkpoint import load_checkpoint
from asr_core.config import preset
from asr_core.data.corpora import load_corpus
from asr_core.contract.provenance import code_version
from asr_core.scoring.score import normalise
from asr_core.contract.trial import (ENV_JOB_ID, TAG_CODE, TAG_PREEMPTIONS, TAG_SEGMENTS, TrialFolder, read_attempts,
                                     read_progress)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trial-corpus") / "c"
    subprocess.run([sys.executable, "-m", "asr_core", "synth", str(out), "--hours", "0.03", "--eval-hours", "0.01",
                    "--min-minutes", "0.5", "--max-minutes", "0.8", "--seed", "3", "--splits", "train,test"],
                   check=True, capture_output=True)
    return out


def make_trial(tmp_path: Path, overrides: list[str], experiment: str = "trial-test"
               ) -> tuple[Path, str, str, MlflowClient]:
    """A trial folder holding the ``config.json`` of the tiny preset with ``overrides``, and a SCHEDULED trial run
    in a sqlite ledger beside it: (trial folder, tracking URI, run id, client)."""
    cfg = preset("tiny").with_overrides(overrides)
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    (trial_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(experiment, artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(exp, run_name="t", tags={"sweep.role": "trial"})
    client.update_run(run.info.run_id, status="SCHEDULED")
    return trial_dir, uri, run.info.run_id, client


def _setup(tmp_path: Path, corpus: Path, *overrides: str) -> tuple[Path, str, str, MlflowClient]:
    return make_trial(tmp_path, [
        f"data.train=podcast:{corpus}/train", "data.batch_audio_s=20.48", "data.context_s=5.12",
        "data.seqlen_warmup=none", "train.max_steps=8", "train.warmup_steps=2", "train.checkpoint_every=2",
        f"eval.datasets=[test=podcast:{corpus}/test]", "eval.snrs=[0]", *overrides])


def trial_cmd(trial_dir: Path, uri: str, run_id: str) -> list[str]:
    """``python -m asr_core trial`` on the trial folder and run of :func:`make_trial`."""
    return [sys.executable, "-m", "asr_core", "trial", "--config", str(trial_dir / "config.json"), "--out",
            str(trial_dir), "--tracking-uri", uri, "--run-id", run_id]


def trial_env(job: str = "job-1", **extra: str) -> dict[str, str]:
    """The trial job's environment under the scheduler job id ``job`` (one thread, unbuffered), plus ``extra``."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", ENV_JOB_ID: job, **extra}


def _progress(trial_dir: Path) -> list[dict]:
    return [json.loads(line) for line in TrialFolder(trial_dir).progress.read_text().splitlines()]


def _segments(trial_dir: Path) -> list[dict]:
    return [json.loads(line) for line in TrialFolder(trial_dir).segments.read_text().splitlines()]


def _corpus_wer(table: pd.DataFrame) -> float:
    errors = table.substitutions + table.deletions + table.insertions
    return 100 * errors.sum() / table.ref_words.sum()


@pytest.mark.slow
def test_trial_trains_evaluates_and_finishes_once(tmp_path: Path, corpus: Path) -> None:
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus)
    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    # the logged WERs are the corpus WERs of the per-recording table: one row per test recording and condition
    table = pd.read_csv(trial_dir / "eval" / "test.csv")
    n_test = len(load_corpus(f"podcast:{corpus}/test"))
    assert sorted(table.condition.value_counts().items()) == [("clean", n_test), ("snr0", n_test)]
    assert (table.ref_words > 0).all()
    assert (table.ref_words - table.deletions + table.insertions == table.hyp_words).all()
    for cond, key in (("clean", "wer/test"), ("snr0", "wer/test/snr0")):
        assert run.data.metrics[key] == pytest.approx(_corpus_wer(table[table.condition == cond]))
    refs = sum(len(normalise(r.text).split()) for r in load_corpus(f"podcast:{corpus}/test"))
    assert table.groupby("condition").ref_words.sum().to_dict() == {"clean": refs, "snr0": refs}
    assert {a.path for a in client.list_artifacts(run_id, "eval")} == {"eval/test.csv"}
    assert run.data.params["model.d_model"] == str(preset("tiny").model.d_model)
    assert (trial_dir / "DONE").exists() and (trial_dir / "checkpoint.pt").exists()
    final = load_checkpoint(trial_dir / "checkpoint.pt")
    assert "optimizer" not in final and final["model"]  # trained: the optimizer state is dropped, the model kept
    assert "dropped the optimizer state from checkpoint.pt" in done.stdout
    # TRAINED holds the hash of the checkpoint as training left it, which every evaluation of the model checks
    sealed = json.loads((trial_dir / "TRAINED").read_text())["sha256"]
    assert sealed == hashlib.sha256((trial_dir / "checkpoint.pt").read_bytes()).hexdigest()
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
    assert steps == list(range(1, 9)) or steps == list(range(8)), steps

    # one segment, run by the code of this checkout; progress from start through training and evaluation to done
    code = code_version()
    (segment,) = _segments(trial_dir)
    assert (segment["segment"], segment["commit"], segment["job_id"]) == (1, code.commit, "job-1")
    assert segment["code"].startswith(code.commit[:12])  # (its dirty digest is of the tree when the job started)
    assert run.data.tags[TAG_SEGMENTS] == "1" and run.data.tags[TAG_CODE] == segment["code"]
    assert TrialFolder(trial_dir).segment_diff(1).exists() == segment["dirty"]
    records = _progress(trial_dir)
    phases = [r["phase"] for r in records]
    assert phases[0] == "start" and phases[-1] == "done" and "train" in phases
    assert phases.index("train") < phases.index("eval") and "preempted" not in phases and "failed" not in phases
    evals = [(r["dataset"], r["done"], r["total"]) for r in records if r["phase"] == "eval"]
    assert evals == [("test", k, 2 * n_test) for k in range(2 * n_test + 1)]
    assert read_progress(trial_dir).describe() == "done"

    again = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env(), timeout=120)
    assert again.returncode == 0 and "already finished" in again.stdout
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == steps  # nothing retrained
    assert len(_segments(trial_dir)) == 1 and _progress(trial_dir) == records  # a finished trial starts nothing


@pytest.mark.slow
def test_sigusr2_checkpoints_exits_75_and_the_rerun_finishes_the_same_run(tmp_path: Path, corpus: Path) -> None:
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus, "train.max_steps=16", "eval.snrs=[]")
    proc = subprocess.Popen(trial_cmd(trial_dir, uri, run_id), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=trial_env())
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
    assert run.info.status == "SCHEDULED" and run.data.tags[TAG_PREEMPTIONS] == "1"
    assert (trial_dir / "checkpoint.pt").exists() and not (trial_dir / "DONE").exists()
    assert read_progress(trial_dir).phase == "preempted" and run.data.tags[TAG_SEGMENTS] == "1"

    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env("job-2"),
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and "wer/test" in run.data.metrics
    # two segments of the same code: the count grows, the code list does not repeat itself
    assert [(s["segment"], s["job_id"]) for s in _segments(trial_dir)] == [(1, "job-1"), (2, "job-2")]
    labels = ",".join(dict.fromkeys(s["code"] for s in _segments(trial_dir)))  # one label when the code stayed
    assert run.data.tags[TAG_SEGMENTS] == "2" and run.data.tags[TAG_CODE] == labels
    phases = [r["phase"] for r in _progress(trial_dir)]
    assert phases[0] == "start" and phases[-1] == "done" and phases.count("start") == 2
    assert phases[phases.index("preempted") + 1] == "start"
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))
    assert steps == list(range(1, 17))  # one continuous history, one value per step, nothing lost
    # each segment's outcome, in the folder (the preemption count of the run is counted from these)
    assert [(a.outcome, a.segment, a.job_id, a.by) for a in read_attempts(trial_dir)] == [
        ("preempted", 1, "job-1", "job"), ("finished", 2, "job-2", "job")]


def test_a_failing_trial_marks_the_run_failed_with_the_error(tmp_path: Path, corpus: Path) -> None:
    missing = tmp_path / "no-such-corpus"
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus, f"data.train=podcast:{missing}")
    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env(), timeout=300)
    assert done.returncode == 1
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert "no-such-corpus" in run.data.tags["trial.error"]
    assert [r["phase"] for r in _progress(trial_dir)] == ["start", "failed"]
    assert run.data.tags[TAG_SEGMENTS] == "1"
    (attempt,) = read_attempts(trial_dir)
    assert (attempt.outcome, attempt.segment, attempt.job_id) == ("failed", 1, "job-1")
    assert attempt.reason == run.data.tags["trial.error"]


def test_bad_config_is_a_usage_error_that_fails_the_run_with_the_reason(tmp_path: Path, corpus: Path) -> None:
    """Nothing runs, and the run says why: left SCHEDULED it would look lost and be resubmitted without a reason."""
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus)
    config = trial_dir / "config.json"
    config.write_text(json.dumps({"model": {"heads": 7}}))
    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env(), timeout=120)
    assert done.returncode == 2 and "model.heads" in done.stderr
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    error = run.data.tags["trial.error"]
    assert error.startswith(f"config {config} invalid: ") and "model.heads" in error and "\n" not in error
    assert error.count(str(config)) == 1
    assert not TrialFolder(trial_dir).segments.exists()  # no segment: nothing started
    assert [r["phase"] for r in _progress(trial_dir)] == ["failed"]

    (attempt,) = read_attempts(trial_dir)  # a failure of the job's own, for the failure budget
    assert (attempt.outcome, attempt.reason, attempt.segment, attempt.by) == ("failed", error, None, "job")

    # without a run id there is no run to mark: still exit 2, and nothing reaches an outbox
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model": {"heads": 7}}))
    done = subprocess.run([sys.executable, "-m", "asr_core", "trial", "--config", str(bare / "config.json"),
                           "--out", str(bare)], capture_output=True, text=True, env=trial_env(), timeout=120)
    assert done.returncode == 2 and "model.heads" in done.stderr
    assert sorted(p.name for p in bare.iterdir()) == ["attempts.jsonl", "config.json", "lease", "progress.jsonl"]


@pytest.mark.slow
def test_a_checkout_edited_while_the_trial_trains_does_not_reach_its_evaluation(tmp_path: Path, corpus: Path) -> None:
    """A user pulls or edits the checkout while a trial job trains: the job evaluates with the code it started with.
    A copy of the package runs the trial (PYTHONPATH); while the trainer sleeps at step 3 (ASR_CORE_FAULT), the copy's
    evaluate module is replaced by one that cannot be imported. The job must still evaluate and finish."""
    import shutil

    code = tmp_path / "code"
    shutil.copytree(ROOT / "asr_core", code / "asr_core", ignore=shutil.ignore_patterns("__pycache__"))
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus)
    env = trial_env(PYTHONPATH=str(code), ASR_CORE_FAULT="sleep-at-step:3:6", PYTHONDONTWRITEBYTECODE="1")
    job = subprocess.Popen(trial_cmd(trial_dir, uri, run_id), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env=env, cwd=tmp_path)
    assert job.stdout is not None
    seen = []
    for line in job.stdout:
        seen.append(line)
        if "sleeping" in line:
            break
    assert any("sleeping" in x for x in seen), "".join(seen)[-2000:]
    (code / "asr_core" / "evaluation" / "evaluate.py").write_text('raise ImportError("the checkout was edited")\n')
    out, _ = job.communicate(timeout=600)
    text = "".join(seen) + out
    assert job.returncode == 0, text[-3000:]
    assert "the checkout was edited" not in text
    assert client.get_run(run_id).info.status == "FINISHED" and (trial_dir / "eval" / "test.csv").exists()
