"""Train once, evaluate many ways (issue 28): a change of a sweep's evaluation never retrains a model.

A tiny real sweep (two models of the tiny preset, trained a few steps, evaluated greedily on a one-recording dev set)
is finished on the ``local`` backend. Its grid then gains a test set and an SNR: ``submit`` runs one evaluation job
per model and no training step (no new ``train/loss`` point, checkpoint bytes unchanged), the new WERs land in each
model's run (which stays FINISHED), ``status`` lists the evaluations, model keys stay, and ``submit`` again adds
nothing. A grid that changes the fixed setting of a finished evaluation (its stride) is refused with exit 2 before
anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from asr_core.contract.trial import FINISHED
from orchestrate.cli.commands import main
from orchestrate.ledger.ledger import Ledger
from orchestrate.sweep.folder import SweepDir
from tests.test_backend import smoke_corpus

__all__ = ["smoke_corpus"]

pytestmark = pytest.mark.timeout(900)

GRID = """
name: evj
seeds: [1]
base:
  preset: tiny
  data: {train: "podcast:%(corpus)s/train", batch_audio_s: 20.48, seqlen_warmup: none, context_s: 5.12}
  train: {max_steps: 2, warmup_steps: 2, checkpoint_every: 2, device: cpu, precision: fp32}
  eval: {datasets: [%(datasets)s], snrs: [%(snrs)s], stride: %(stride)s}
subgrids:
  heads:
    axes: {model.heads: [2, 4]}
"""


def _one_recording(corpus: Path, out: Path, which: int) -> Path:
    """A podcast folder holding one of the corpus's short recordings."""
    wavs = sorted(corpus.glob("train/*.wav"), key=lambda p: p.stat().st_size)
    out.mkdir(parents=True, exist_ok=True)
    for p in (wavs[which], wavs[which].with_suffix(".json")):
        shutil.copy(p, out / p.name)
    return out


def _grid(tmp: Path, corpus: Path, datasets: dict[str, Path], snrs: str = "", stride: str = "1.0") -> Path:
    g = tmp / f"grid-{len(list(tmp.glob('grid-*')))}.yaml"
    g.write_text(textwrap.dedent(GRID % {"corpus": corpus, "snrs": snrs, "stride": stride,
                                         "datasets": ", ".join(f'"{n}=podcast:{p}"' for n, p in datasets.items())}))
    return g


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _runs(sweep: SweepDir) -> dict[str, object]:
    return Ledger(sweep.read_manifest().tracking_uri, sweep.name).trial_runs()


@pytest.mark.slow
def test_a_new_test_set_and_snr_evaluate_finished_models_without_training_them(tmp_path: Path, smoke_corpus: Path,
                                                                                 capsys: pytest.CaptureFixture) -> None:
    dev = _one_recording(smoke_corpus, tmp_path / "dev", 0)
    other = _one_recording(smoke_corpus, tmp_path / "other", 1)
    root = tmp_path / "runs"
    first = _grid(tmp_path, smoke_corpus, {"dev": dev})
    assert main(["submit", str(first), "--backend", "local", "--sweep-root", str(root)]) == 0
    sweep = SweepDir(root, "evj")
    uri = sweep.read_manifest().tracking_uri
    client = MlflowClient(uri)
    runs = _runs(sweep)
    assert len(runs) == 2 and {r.status for r in runs.values()} == {FINISHED}
    models = sorted(runs)
    ckpt = {k: _sha(sweep.trial_dir(k) / "checkpoint.pt") for k in models}
    loss = {k: len(client.get_metric_history(runs[k].run_id, "train/loss")) for k in models}
    assert all(loss.values())

    # the fixed setting of a finished evaluation cannot change under its name: exit 2, nothing written
    before = (sweep.path / "trials.json").read_bytes(), (sweep.path / "sweep.json").read_bytes()
    capsys.readouterr()
    bad = _grid(tmp_path, smoke_corpus, {"dev": dev}, stride="0.5")
    assert main(["submit", str(bad), "--backend", "local", "--sweep-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "eval.stride" in err and "1.0 there, 0.5 here" in err and "--spec" in err and "Traceback" not in err
    assert ((sweep.path / "trials.json").read_bytes(), (sweep.path / "sweep.json").read_bytes()) == before

    # one more test set, and music at 5 dB on both: evaluation jobs only
    more = _grid(tmp_path, smoke_corpus, {"dev": dev, "other": other}, snrs="5")
    assert main(["submit", str(more), "--backend", "local", "--sweep-root", str(root)]) == 0
    trials = json.loads((sweep.path / "trials.json").read_text())
    evals = [t for t in trials if t.get("evaluation")]
    assert sorted(t["key"] for t in trials if not t.get("evaluation")) == models  # model keys unchanged
    assert sorted(t["evaluation"]["model"] for t in evals) == models  # one evaluation job per model
    for t in evals:
        assert t["evaluation"]["conditions"] == {"dev": [5.0], "other": [None, 5.0]}  # only what is lacking
        assert (sweep.trial_dir(t["key"]) / "DONE").exists()
    after = _runs(sweep)
    for k in models:
        assert _sha(sweep.trial_dir(k) / "checkpoint.pt") == ckpt[k]  # never written
        assert len(client.get_metric_history(runs[k].run_id, "train/loss")) == loss[k]  # no training step
        assert after[k].status == FINISHED and after[k].run_id == runs[k].run_id
        metrics = client.get_run(runs[k].run_id).data.metrics
        assert {"wer/dev", "wer/dev/snr5", "wer/other", "wer/other/snr5"} <= set(metrics)
        assert len(client.get_metric_history(runs[k].run_id, "wer/dev")) == 1  # not measured again
        # the run's table holds every condition measured: the training job's clean rows and the new SNR
        table = Path(client.download_artifacts(runs[k].run_id, "eval/dev.csv", str(tmp_path / f"dl-{k}")))
        assert {ln.split(",")[1] for ln in table.read_text().splitlines()[1:]} == {"clean", "snr5"}

    # analysis reads every evaluation of each model and says which one its tables use
    from analysis.ledger.collect import collect
    from analysis.significance.werr import evaluation_notes

    sw = collect("evj", uri, progress=False)
    greedy = sw.wer[sw.wer["decoder"] == "greedy"]
    assert set(zip(greedy["dataset"], greedy["condition"])) == {("dev", "clean"), ("dev", "snr5"),
                                                               ("other", "clean"), ("other", "snr5")}
    # two-step models have learned nothing (a problem the report names), but no table lacks a condition
    assert len(greedy) == 8 and not any("eval/" in p for p in sw.problems["problem"]), sw.problems["problem"]
    assert set(sw.evaluations["job"]) == {"own", *(t["key"].rsplit("-", 1)[1] for t in evals)}
    (note,) = evaluation_notes(sw)
    assert "stride 1.0" in note and "evaluation jobs measured dev snr5, other clean, other snr5 on 2" in note

    capsys.readouterr()
    assert main(["status", "evj", "--sweep-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert all(t["label"] in out for t in evals)

    # submit again: nothing new
    capsys.readouterr()
    assert main(["submit", str(more), "--backend", "local", "--sweep-root", str(root)]) == 0
    assert json.loads((sweep.path / "trials.json").read_text()) == trials
    assert "0 new" in capsys.readouterr().out


SPEC = """
name: %s
lm: null
beta: %s
beam_width: 4
stride: 1.0
"""


@pytest.mark.slow
def test_a_spec_is_scheduled_as_evaluation_jobs_and_cancel_where_stops_only_its_subset(
        tmp_path: Path, smoke_corpus: Path, capsys: pytest.CaptureFixture) -> None:
    dev = _one_recording(smoke_corpus, tmp_path / "dev", 0)
    root = tmp_path / "runs"
    grid = _grid(tmp_path, smoke_corpus, {"dev": dev})
    assert main(["submit", str(grid), "--backend", "local", "--sweep-root", str(root)]) == 0
    sweep = SweepDir(root, "evj")
    client = MlflowClient(sweep.read_manifest().tracking_uri)
    runs = _runs(sweep)
    models = sorted(runs)
    spec = tmp_path / "b1.yaml"
    spec.write_text(textwrap.dedent(SPEC % ("b1", "0.5")))

    # bad input: an unknown field, a dataset that does not exist: exit 2, nothing written
    before = (sweep.path / "trials.json").read_bytes()
    for text, says in (("name: b1\nlm: null\nbeta: 1\nbeam: 4\n", "unknown key 'beam'"),
                       ("name: b1\nlm: null\nbeta: 1\ndatasets: [x=podcast:nowhere]\n", "x=podcast:nowhere")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        capsys.readouterr()
        assert main(["evaluate", "evj", "--spec", str(bad), "--sweep-root", str(root)]) == 2
        err = capsys.readouterr().err
        assert says in err and str(bad) in err and "Traceback" not in err
    assert (sweep.path / "trials.json").read_bytes() == before

    # the jobs are prepared and the submitter dies before running them; cancel --where stops one model's only
    died = subprocess.run([sys.executable, "-m", "orchestrate", "evaluate", "evj", "--spec", str(spec),
                           "--sweep-root", str(root)], env={**os.environ, "ORCHESTRATE_FAULT": "after-runs"},
                          capture_output=True, text=True, timeout=300)
    assert died.returncode == 137, died.stderr
    jobs = {t["evaluation"]["model"]: t["key"] for t in json.loads((sweep.path / "trials.json").read_text())
            if t.get("evaluation")}
    assert sorted(jobs) == models
    assert main(["cancel", "evj", "--where", f"key={jobs[models[0]]}", "--sweep-root", str(root)]) == 0
    assert (sweep.trial_dir(jobs[models[0]]) / "CANCELLED").exists()
    assert not (sweep.trial_dir(jobs[models[1]]) / "CANCELLED").exists()
    assert not any((sweep.trial_dir(k) / "CANCELLED").exists() for k in models)
    assert main(["resume", "evj", "--sweep-root", str(root)]) == 0
    assert (sweep.trial_dir(jobs[models[1]]) / "DONE").exists()
    assert not (sweep.trial_dir(jobs[models[0]]) / "DONE").exists()
    m0, m1 = (client.get_run(runs[k].run_id).data.metrics for k in models)
    assert "wer_b1/dev" in m1 and "wer_b1/dev" not in m0
    assert {r.status for r in _runs(sweep).values()} == {FINISHED}  # the models' runs are the training's

    # retry --cancelled --where runs the cancelled one; evaluate again adds nothing
    assert main(["retry", "evj", "--cancelled", "--where", "evaluation=b1", "--sweep-root", str(root)]) == 0
    assert "wer_b1/dev" in client.get_run(runs[models[0]].run_id).data.metrics
    trials = (sweep.path / "trials.json").read_bytes()
    capsys.readouterr()
    assert main(["evaluate", "evj", "--spec", str(spec), "--sweep-root", str(root)]) == 0
    assert "0 new evaluation jobs" in capsys.readouterr().out
    assert (sweep.path / "trials.json").read_bytes() == trials

    # one name, one setting
    other = tmp_path / "b1-other.yaml"
    other.write_text(textwrap.dedent(SPEC % ("b1", "0.9")))
    capsys.readouterr()
    assert main(["evaluate", "evj", "--spec", str(other), "--sweep-root", str(root)]) == 2
    assert "beta" in capsys.readouterr().err


@pytest.mark.slow
def test_an_evaluation_job_killed_by_sigkill_is_retried_within_the_budget_and_never_writes_the_checkpoint(
        tmp_path: Path, smoke_corpus: Path, capsys: pytest.CaptureFixture) -> None:
    from asr_core.contract.folder.lease import read_lease
    from asr_core.contract.trial import OUTCOME_KILLED, failures, read_attempts, read_progress
    from tests.test_backend import wait_until

    dev = _one_recording(smoke_corpus, tmp_path / "dev", 0)
    other = _one_recording(smoke_corpus, tmp_path / "other", 1)
    root = tmp_path / "runs"
    assert main(["submit", str(_grid(tmp_path, smoke_corpus, {"dev": dev})), "--backend", "local",
                 "--sweep-root", str(root)]) == 0
    sweep = SweepDir(root, "evj")
    client = MlflowClient(sweep.read_manifest().tracking_uri)
    runs = _runs(sweep)
    ckpt = {k: _sha(sweep.trial_dir(k) / "checkpoint.pt") for k in runs}
    more = _grid(tmp_path, smoke_corpus, {"dev": dev, "other": other})
    submit = subprocess.Popen([sys.executable, "-m", "orchestrate", "submit", str(more), "--backend", "local",
                               "--sweep-root", str(root)], env={**os.environ, "ASR_CORE_FAULT": "sleep-in-eval:30"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def sleeping() -> Path | None:
            for d in (sweep.path / "trials").glob("*-*"):
                p, lease = read_progress(d), read_lease(d)
                if p is not None and p.dataset == "fault" and lease is not None and lease.alive():
                    return d
            return None

        job = wait_until(sleeping, 300, "no evaluation job reached its sleep")
        lease = read_lease(job)
        os.kill(lease.pid, signal.SIGKILL)  # what the kernel's OOM killer does
        out, _ = submit.communicate(timeout=600)
    finally:
        if submit.poll() is None:
            submit.kill()
    (killed,) = failures(read_attempts(job))
    assert killed.outcome == OUTCOME_KILLED, (killed, out)
    assert not (job / "DONE").exists()
    capsys.readouterr()
    assert main(["resume", "evj", "--sweep-root", str(root)]) == 0  # 1 failure of 3: run again, to the end
    assert "failed/killed (resubmitted)" in capsys.readouterr().out
    assert (job / "DONE").exists()
    assert [a.outcome for a in failures(read_attempts(job))] == [OUTCOME_KILLED]  # counted once
    for k, r in runs.items():
        assert _sha(sweep.trial_dir(k) / "checkpoint.pt") == ckpt[k]
        assert "wer/other" in client.get_run(r.run_id).data.metrics
    assert {r.status for r in _runs(sweep).values()} == {FINISHED}


def test_a_model_recorded_under_an_older_key_is_matched_by_science_not_by_its_evaluation_jobs(tmp_path: Path
                                                                                               ) -> None:
    """An evaluation job carries its model's config: matching a sweep's trials to a grid's by science must find the
    model, never the job, or the job would take the grid's config and the model would be trained again."""
    import dataclasses

    from asr_core.config import resolve
    from orchestrate.plan.evaluations import evaluation_trial
    from orchestrate.sweep.folder import merge_trials
    from orchestrate.sweep.trial import Trial

    recorded = Trial.make(resolve({"preset": "tiny", "eval": {"datasets": ["dev=podcast:/d"]}}), 1, "x")
    old = dataclasses.replace(recorded, key="0123456789ab")  # the key an older version gave it
    job = evaluation_trial(SweepDir(tmp_path, "s"), old, "b1", {"decoder": "beam"}, {"dev": (None,)},
                           {"dev": "dev=podcast:/d"})
    # the grid now evaluates on one more test set: the same model
    grid_trial = Trial.make(resolve({"preset": "tiny", "eval": {"datasets": ["dev=podcast:/d", "t=podcast:/t"]}}),
                            1, "x")
    assert grid_trial.key == recorded.key
    merged = merge_trials([old, job], [grid_trial])
    assert [t.key for t in merged] == [old.key, job.key]  # nothing new to train
    assert merged[0].config == grid_trial.config  # the model takes the grid's eval section
    assert merged[1] == job
