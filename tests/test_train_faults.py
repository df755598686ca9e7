"""The trainer's faults (issue 30): a diverging trial, an unreadable ``TRAINED``, partial checkpoints, markers
written while the disk fills up.

* A step whose loss (or gradient) is not finite does not touch the weights or the optimiser; ``train.
  max_nonfinite_steps`` such steps in a row end the trial: exit :data:`EXIT_DIVERGED`, outcome ``diverged`` with the
  step and the loss, the run FAILED, the last finite checkpoint kept as it was.
* Markers are written atomically: a write that fails (the file-size limit stands in for a full disk: the same
  EFBIG/ENOSPC from ``write``) leaves the marker as it was, never empty or cut.
* An unreadable ``TRAINED`` is treated as absent: the next segment finds its trained checkpoint, says so and goes
  on without training again.
* A job that starts while holding the lease removes the partial checkpoints (``.checkpoint.pt.*.tmp``) a killed
  job left; one that finds the lease held leaves them alone.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from asr_core.config import preset
from asr_core.contract import trial as contract
from asr_core.contract.trial import TAG_ERROR, TrialFolder, read_attempts, record_attempt
from asr_core.contract.folder.lease import Lease
from asr_core.training.checkpoint import load_checkpoint
from tests.test_backend import smoke_corpus
from tests.test_trial import make_trial, trial_cmd, trial_env

__all__ = ["smoke_corpus"]  # the session fixture of test_backend: a synthetic corpus, made once and cached

RECORDINGS = "data.max_recordings=3"  # of the smoke corpus: a step or two of data, repeated


@pytest.fixture
def corpus(smoke_corpus: Path) -> Path:
    return smoke_corpus


def _setup(tmp_path: Path, corpus: Path, *overrides: str) -> tuple[Path, str, str, MlflowClient]:
    """A trial of the tiny preset on ``corpus`` that only trains (no evaluation datasets)."""
    return make_trial(tmp_path, [
        f"data.train=podcast:{corpus}/train", RECORDINGS, "data.batch_audio_s=20.48", "data.context_s=5.12",
        "data.seqlen_warmup=none", "train.max_steps=12", "train.warmup_steps=2", "train.checkpoint_every=2",
        *overrides])


def _finite(state: dict) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in state["model"].values() if t.is_floating_point())


# ---- divergence ------------------------------------------------------------------------------------------------
@pytest.mark.slow  # the trial job in a subprocess, against a sqlite ledger: about 20 s
def test_a_diverged_trial_fails_with_its_own_exit_code_and_keeps_the_last_finite_checkpoint(
        tmp_path: Path, corpus: Path) -> None:
    """lr=1e6: the loss (or its gradient) is not finite from step 2 or 3 on. Today's trainer trained to the end, saved
    NaN weights, exit 0."""
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus, "train.lr=1e6", "train.checkpoint_every=1")
    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env(),
                          timeout=300)
    assert done.returncode != 0, "a diverged trial exited 0:\n" + done.stdout[-2000:]
    assert done.returncode == contract.EXIT_DIVERGED, done.stdout[-2000:] + done.stderr[-2000:]
    folder = TrialFolder(trial_dir)
    assert not folder.trained.exists() and not folder.done.exists()
    (attempt,) = read_attempts(trial_dir)
    assert (attempt.outcome, attempt.segment, attempt.by) == (contract.OUTCOME_DIVERGED, 1, "job")
    assert re.match(r"diverged: the loss or its gradient was not finite for 5 steps in a row \(steps \d+-\d+, "
                    r"train.max_nonfinite_steps=5; at step \d+ loss \S+, gradient norm \S+\)", attempt.reason), \
        attempt.reason
    assert "nan" in attempt.reason or "inf" in attempt.reason, attempt.reason
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags[TAG_ERROR] == attempt.reason
    assert contract.failures(read_attempts(trial_dir)) == [attempt]  # the failure budget counts it
    state = load_checkpoint(folder.checkpoint)
    assert _finite(state), "the checkpoint holds non-finite weights"
    assert math.isfinite(state["schedule"]["last_loss"]) and state["step"] < 12
    assert f"step {state['step']}" in done.stdout  # the message names the checkpoint kept


def test_a_non_finite_step_leaves_the_weights_and_the_optimiser_alone(corpus: Path) -> None:
    """One step whose loss is NaN (its features are): no update, no optimiser state; the next finite step trains."""
    from asr_core.data.batching import BatchMaker, MicroBatch, Step
    from asr_core.data.chunking import WindowStream
    from asr_core.data.corpora import load_corpus
    from asr_core.data.features import FeatureExtractor
    from asr_core.data.tokenizer import Tokenizer
    from asr_core.model.acoustic import build_model
    from asr_core.training.step import build_optimizer, optimizer_step

    cfg = preset("tiny").with_overrides(["data.batch_audio_s=20.48", "data.context_s=5.12",
                                         "data.seqlen_warmup=none"])
    recs = sorted(load_corpus(f"podcast:{corpus}/train"), key=lambda r: r.id)[:3]
    tok = Tokenizer.train([r.text for r in recs], cfg.model.vocab_size, None)
    windows, pos = next(WindowStream(recs, cfg.data, 0).batches())
    good = BatchMaker(recs, FeatureExtractor(cfg.data.features), tok, windows=True)(windows)
    bad = MicroBatch(good.features * float("nan"), good.lengths, good.targets)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data.features.n_mels).train()
    opt = build_optimizer(model, cfg.train)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cpu = torch.device("cpu")

    values = optimizer_step(model, opt, Step(windows, [bad], pos), 0, 10, cfg.train, cfg.data, cpu, False)
    assert math.isnan(values["train/loss"])
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed == [], f"a NaN step changed {len(changed)} parameters, e.g. {changed[:3]}"
    assert not opt.state  # the optimiser never stepped
    assert values.get("train/update_skipped") == 1.0

    values = optimizer_step(model, opt, Step(windows, [good], pos), 1, 10, cfg.train, cfg.data, cpu, False)
    assert math.isfinite(values["train/loss"]) and "train/update_skipped" not in values
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_the_runner_takes_the_diverged_exit_for_a_failure_the_job_recorded(tmp_path: Path) -> None:
    """The scheduler task's side: exit 65 is the job's own failure (already recorded), not a kill by the system."""
    from orchestrate.backends.runner import trainer_ended

    folder = tmp_path / "t"
    folder.mkdir()
    (folder / contract.SEGMENTS_FILE).write_text(json.dumps({"segment": 1, "job_id": "7"}) + "\n")
    record_attempt(folder, contract.OUTCOME_DIVERGED, "diverged: loss nan", segment=1, job_id="7", by="job")
    end = trainer_ended(folder, contract.EXIT_DIVERGED, job_id="7", pid=2 ** 22 + 1, segments_before=0)
    assert end.kind == "failed", end
    assert [a.outcome for a in read_attempts(folder)] == [contract.OUTCOME_DIVERGED]


# ---- markers -----------------------------------------------------------------------------------------------------
_FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from asr_core.contract import trial as c
from asr_core.contract.folder.trained import mark_trained
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as one on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4, 4))
d = Path(sys.argv[1])
for name, write in (("TRAINED", lambda: mark_trained(d, d / "checkpoint.pt", 12)),
                    ("DONE", lambda: c.mark_done(d)),
                    ("EVALUATED", lambda: c.mark_evaluated(d, '{"datasets": ["test"]}')),
                    ("CANCELLED", lambda: c.mark_cancelled(d, "orchestrate cancel"))):
    try:
        write()
    except OSError as e:
        print(name, "failed:", e.strerror)
    else:
        print(name, "written")
"""


def test_a_marker_write_that_fails_leaves_the_marker_as_it_was(tmp_path: Path) -> None:
    """A full disk at a marker's write (here: the file-size limit) leaves no empty or cut marker: the old one or
    none. Today's TRAINED and DONE were cut to the first 4 bytes."""
    old = tmp_path / "old"
    old.mkdir()
    before = {"TRAINED": json.dumps({"checkpoint": "x", "steps": 3}), "DONE": "finished\n", "EVALUATED": "{}",
              "CANCELLED": json.dumps({"time": 1.0, "by": "x"})}
    for name, text in before.items():
        (old / name).write_text(text)
    new = tmp_path / "new"
    new.mkdir()
    for d in (old, new):
        done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(d)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.count("failed") == 4, done.stdout
    assert {p.name: p.read_text() for p in old.iterdir()} == before
    assert sorted(p.name for p in new.iterdir()) == []


# ---- an unreadable TRAINED, partial checkpoints ---------------------------------------------------------------
@pytest.mark.slow  # the trial job in a subprocess, against a sqlite ledger: about 20 s
def test_an_empty_trained_marker_and_partial_checkpoints_are_survived(tmp_path: Path, corpus: Path) -> None:
    """A trained trial whose TRAINED is empty (a full disk at that write, before this fix) and whose folder holds
    the partial checkpoint of a killed job: the next segment warns, finds the trained checkpoint, trains nothing,
    removes the partial file (saying how many bytes) and finishes. A job that finds the lease held removes
    nothing."""
    trial_dir, uri, run_id, client = _setup(tmp_path, corpus, "train.max_steps=4")
    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env(),
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    folder = TrialFolder(trial_dir)
    trained = load_checkpoint(folder.checkpoint)
    assert trained["step"] == 4 and trained.get("optimizer") is None
    folder.done.unlink()
    folder.trained.write_text("")
    partial = trial_dir / ".checkpoint.pt.k1ll3d.tmp"
    partial.write_bytes(b"\0" * 300_000)

    held = Lease(trial_dir, "other-job").acquire()  # a live trainer of this trial elsewhere
    try:
        done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True,
                              env=trial_env("job-2"), timeout=300)
        assert done.returncode == contract.EXIT_FENCED
        assert partial.exists()  # its partial file may be the live trainer's own
    finally:
        held.release()

    done = subprocess.run(trial_cmd(trial_dir, uri, run_id), capture_output=True, text=True, env=trial_env("job-3"),
                          timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "TRAINED" in out and "unreadable" in out  # the warning
    assert not partial.exists() and "300000 bytes" in out.replace(",", ""), out[-3000:]
    assert not any(p.name.endswith(".tmp") for p in trial_dir.iterdir())
    assert json.loads(folder.trained.read_text())["steps"] == 4  # written again, whole
    assert folder.done.exists()
    again = load_checkpoint(folder.checkpoint)
    assert again["step"] == 4 and again["model"].keys() == trained["model"].keys()
    assert all(torch.equal(t, trained["model"][n]) for n, t in again["model"].items())
    assert "[train] step" not in done.stdout  # nothing trained again
    assert [a.outcome for a in read_attempts(trial_dir)][-1] == contract.OUTCOME_FINISHED
    assert client.get_run(run_id).info.status == "FINISHED"


def test_non_finite_steps_below_the_limit_are_skipped_and_training_goes_on(tmp_path: Path, corpus: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """With a limit above the run's non-finite steps the run ends normally: every such step skipped, its count in
    the checkpoint (a resumed run goes on counting), and no weight ever non-finite."""
    from asr_core.training.train import train

    cfg = preset("tiny").with_overrides([
        f"data.train=podcast:{corpus}/train", RECORDINGS, "data.batch_audio_s=20.48", "data.context_s=5.12",
        "data.seqlen_warmup=none", "train.max_steps=4", "train.warmup_steps=2", "train.checkpoint_every=1",
        "train.lr=1e6", "train.max_nonfinite_steps=50"])
    result = train(cfg, tmp_path / "run")
    skipped = [ln for ln in capsys.readouterr().out.splitlines() if "update skipped" in ln]
    state = load_checkpoint(result.checkpoint)
    assert result.steps == state["step"] == 4 and _finite(state)
    assert len(skipped) == state["schedule"]["nonfinite_steps"] >= 2, skipped


def test_an_evaluation_job_reads_an_unreadable_trained_marker_as_absent(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """An evaluation job's check of its model: an empty TRAINED is no proof (today it was taken for one); the
    checkpoint itself is: a finished training's (optimizer state dropped) is evaluated, a half-trained one is not."""
    from asr_core.contract.evaluation import EvaluationSpec
    from asr_core.evaluation.job import check_model
    from asr_core.training.checkpoint import save_checkpoint

    model = tmp_path / "model"
    model.mkdir()
    (model / contract.TRAINED_FILE).write_text("")
    spec = EvaluationSpec(key="m-1", model="m", model_dir=str(model), name="default", setting={}, datasets=(),
                          conditions={})
    state = {"format_version": 1, "config": {}, "model": {}, "tokenizer": b"1", "step": 2,
             "schedule": {"total_steps": 4}, "optimizer": {"state": {}}}
    save_checkpoint(spec.checkpoint, state)
    with pytest.raises(RuntimeError, match="has not finished training"):
        check_model(spec)
    assert "unreadable" in capsys.readouterr().err
    del state["optimizer"]  # what the model's job does once training finished
    save_checkpoint(spec.checkpoint, state)
    assert check_model(spec) == spec.checkpoint


@pytest.mark.parametrize("fault", ["sleep-in-eval:300", "sleep-in-merge:300", "kill-after-shards:1"])
def test_a_fault_of_another_stage_leaves_training_alone(tmp_path: Path, fault: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One environment reaches every job of a submission: a model trained beside evaluation jobs held by their
    fault trains as usual (it used to fail at once, naming the evaluation's fault as no fault of its own)."""
    from asr_core.training.train import train
    from tests.test_train import make_corpus, tiny_cfg

    monkeypatch.setenv("ASR_CORE_FAULT", fault)
    cfg = tiny_cfg(**{"train.max_steps": 1, "train.warmup_steps": 1, "model.vocab_size": 32})
    result = train(cfg, tmp_path / "run", recordings=make_corpus(tmp_path / "corpus", 3))
    assert result.steps == 1
