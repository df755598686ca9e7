"""Nothing lost, round three (issue 49): evaluation jobs of one model that run at once, or one killed during its merge
and run again beside another, leave every condition's rows in the run's tables exactly once and one metric point per
condition; a job's stale temporary tables are removed at its start.

A finished tiny model (untrained weights, a real checkpoint, ``TRAINED``, ``DONE``, its own evaluation of the clean
condition logged into a real MLflow run on sqlite) and evaluation jobs of it (``evaluation.json``), each run as the
trial command a scheduler runs (``python -m asr_core trial``), in real processes side by side.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from asr_core.config import preset
from asr_core.contract.evaluation import EvaluationSpec, greedy_setting
from asr_core.contract.ledger import experiment_id
from asr_core.contract.folder.trained import mark_trained
from asr_core.contract.trial import (EXIT_OK, TrialFolder, mark_done, mark_evaluated, read_progress, trial_command,
                                     write_config)
from asr_core.data.synth.generate import synthesise
from asr_core.data.synth.text import TOPICS, vocabulary
from asr_core.data.tokenizer import Tokenizer
from asr_core.evaluation.job import MERGE_PREFIX
from asr_core.contract.identity import evaluation_key
from asr_core.model.acoustic import build_model
from asr_core.training.checkpoint import save_checkpoint

pytestmark = pytest.mark.timeout(600)

STEPS = 2  # what the model's TRAINED record and checkpoint say


def model_state(cfg, tok: Tokenizer, seed: int, step: int = STEPS, run: tuple[str, str] | None = None) -> dict:
    """A finished training's checkpoint state (no optimizer state) of an untrained model of ``cfg``."""
    torch.manual_seed(seed)
    model = build_model(cfg.model, cfg.data.features.n_mels)
    state = {"config": cfg.to_dict(), "model": model.state_dict(), "tokenizer": tok.to_bytes(), "format_version": 1,
             "step": step, "schedule": {"total_steps": STEPS}}
    if run is not None:
        state.update({"mlflow_run_id": run[0], "tracking_uri": run[1]})
    return state


def dataset_and_tokenizer(tmp: Path) -> dict:
    """One short synthetic recording as the dataset ``dev`` (its spec), the tiny config and a tokenizer."""
    corpus = tmp / "corpus"
    synthesise(corpus, 0.003, seed=1, eval_hours=0.003, min_minutes=0.1, max_minutes=0.12, jobs=1, splits=("test",))
    wav = sorted((corpus / "test").glob("*.wav"))[0]
    dev = tmp / "dev"
    dev.mkdir()
    for p in (wav, wav.with_suffix(".json")):
        shutil.copy(p, dev / p.name)
    cfg = preset("tiny").with_overrides(["data.context_s=2.56", "data.batch_audio_s=10.24", "eval.stride=0.5",
                                         "train.device=cpu"])
    texts = [" ".join(vocabulary())] + [" ".join(t) for t in TOPICS.values()]
    return {"dev": f"dev=podcast:{dev}", "cfg": cfg, "tok": Tokenizer.train(texts * 20, cfg.model.vocab_size)}


def finished_model(tmp: Path, base: dict | None = None) -> dict:
    """A sweep folder holding one finished model (its own evaluation: ``dev`` clean, in its run) and what a test
    needs of it: ``cfg``, ``tok``, ``uri``, ``run_id``, ``model`` (its folder), ``dev`` (the dataset's spec);
    ``base``: :func:`dataset_and_tokenizer`'s (made here when None)."""
    from asr_core.evaluation.evaluate import Destination, EvaluationRun, evaluate

    tmp.mkdir(parents=True, exist_ok=True)
    base = base or dataset_and_tokenizer(tmp)
    cfg, tok, spec = base["cfg"], base["tok"], base["dev"]
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(experiment_id(client, "evj-faults")).info.run_id
    model = tmp / "sweep" / "trials" / cfg.key()
    write_config(model, cfg)
    ckpt = save_checkpoint(model / "checkpoint.pt", model_state(cfg, tok, 0, run=(run_id, uri)))
    mark_trained(model, ckpt, STEPS)
    evaluate(EvaluationRun.of(ckpt, cfg.eval, datasets=[spec], snrs=[]),
             Destination(out_dir=TrialFolder(model).eval_dir, run_id=run_id, tracking_uri=uri))
    mark_evaluated(model, "{}")
    mark_done(model)
    return {"cfg": cfg, "tok": tok, "uri": uri, "run_id": run_id, "model": model, "dev": spec, "tmp": tmp}


def evaluation_job(m: dict, snrs: tuple[float, ...], created: float | None = None) -> Path:
    """An evaluation job of ``m``'s model decoding ``dev`` at ``snrs``: its folder (``evaluation.json``, config)."""
    cfg = m["cfg"]
    setting = greedy_setting(cfg.eval.stride, cfg.eval.precision, cfg.eval.noise)
    conditions = {"dev": tuple(float(s) for s in snrs)}
    key = evaluation_key(cfg.key(), {"name": "greedy", "setting": setting, "conditions": {"dev": list(snrs)}})
    spec = EvaluationSpec(key=key, model=cfg.key(), model_dir=str(m["model"]), name="greedy", setting=setting,
                          datasets=(m["dev"],), conditions=conditions, created=created or time.time())
    folder = m["model"].parent / key
    spec.write(folder)
    write_config(folder, cfg)
    return folder


def start(m: dict, job: Path, fault: str = "", **extra: str) -> subprocess.Popen:
    env = {**os.environ, "ASR_CORE_FAULT": fault, "ASR_CORE_FINAL_FLUSH_S": "60", **extra}
    log = (job / "test.log").open("ab")
    return subprocess.Popen(trial_command(job, m["uri"], m["run_id"], python=sys.executable), env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def finish(*procs: subprocess.Popen, timeout: float = 400) -> list[int]:
    end = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1.0, end - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def run_table(m: dict, name: str = "dev.csv") -> list[dict[str, str]]:
    client = MlflowClient(m["uri"])
    dst = m["tmp"] / f"dl-{time.monotonic_ns()}"
    dst.mkdir()
    with open(client.download_artifacts(m["run_id"], f"eval/{name}", str(dst)), newline="") as fh:
        return list(csv.DictReader(fh))


def assert_every_condition_once(m: dict, conditions: set[str]) -> None:
    rows = run_table(m)
    recordings = {r["recording"] for r in rows}
    keys = [(r["condition"], r["recording"]) for r in rows]
    assert len(keys) == len(set(keys)), f"rows twice: {sorted(keys)}"
    assert set(keys) == {(c, rec) for c in conditions for rec in recordings}, sorted(keys)
    client = MlflowClient(m["uri"])
    metrics = client.get_run(m["run_id"]).data.metrics
    for c in conditions:
        key = "wer/dev" if c == "clean" else f"wer/dev/{c}"
        assert key in metrics, (key, sorted(metrics))
        assert len(client.get_metric_history(m["run_id"], key)) == 1, key


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return dataset_and_tokenizer(tmp_path_factory.mktemp("evmf"))


@pytest.fixture()
def model(base: dict, tmp_path: Path) -> dict:
    return finished_model(tmp_path / "m", base)


def test_two_evaluation_jobs_of_one_model_at_once_lose_no_row(model: dict) -> None:
    a, b = evaluation_job(model, (5.0,)), evaluation_job(model, (15.0,))
    # both wait 3 s after starting, so that they decode and merge at about the same time
    rcs = finish(start(model, a, "sleep-in-eval:3"), start(model, b, "sleep-in-eval:3"))
    assert rcs == [EXIT_OK, EXIT_OK], [(j / "test.log").read_text()[-3000:] for j in (a, b)]
    assert_every_condition_once(model, {"clean", "snr5", "snr15"})
    from asr_core.contract.evaluation import CHECKPOINT_COLUMN

    rows = run_table(model)
    # each job's rows say which checkpoint they were measured with; the model's own evaluation's rows cannot
    assert {r.get(CHECKPOINT_COLUMN) or "" for r in rows if r["condition"] == "clean"} == {""}
    assert len({r[CHECKPOINT_COLUMN] for r in rows if r["condition"] != "clean"}) == 1


def test_a_job_killed_during_its_merge_and_run_again_beside_another_loses_no_row(model: dict) -> None:
    a, b = evaluation_job(model, (5.0,)), evaluation_job(model, (15.0,))
    node_tmp = model["tmp"] / f"node-tmp-{time.monotonic_ns()}"  # the node's /tmp, as the job sees it
    node_tmp.mkdir()
    first = start(model, a, "sleep-in-merge:120", TMPDIR=str(node_tmp))
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end and first.poll() is None:
            p = read_progress(a)
            # in its merge: holding the model's lock, its table merged (eval/dev.csv is written there), not uploaded
            if (p is not None and p.dataset == "merge") or (a / "eval" / "dev.csv").exists():
                break
            time.sleep(0.01)
        assert first.poll() is None, (a / "test.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # what the kernel's OOM killer does
        first.wait()
    assert not (a / "DONE").exists()
    # the killed merge's work is in the job's own folder, not left behind in the node's /tmp
    assert not [p.name for p in node_tmp.iterdir()], "the killed job left its merge in the node's /tmp"
    assert len(list((a / "eval").glob(f"{MERGE_PREFIX}*"))) == 1
    stale = a / "eval" / ".dev.csv.0123456789ab.tmp"  # what a job killed while writing its table leaves
    stale.parent.mkdir(exist_ok=True)
    stale.write_text("condition,recording\nsnr5,cut sh")
    rcs = finish(start(model, a, "sleep-in-eval:3"), start(model, b, "sleep-in-eval:3"))
    assert rcs == [EXIT_OK, EXIT_OK], [(j / "test.log").read_text()[-3000:] for j in (a, b)]
    assert_every_condition_once(model, {"clean", "snr5", "snr15"})
    assert not stale.exists()
    assert not list((a / "eval").glob(f"{MERGE_PREFIX}*")) and not list((b / "eval").glob(f"{MERGE_PREFIX}*"))


def test_a_job_restores_rows_of_a_sibling_that_the_run_lost(model: dict) -> None:
    """A finished sibling's rows missing from the run (an upload lost before this fix) come back with the next job."""
    a, b = evaluation_job(model, (5.0,)), evaluation_job(model, (15.0,))
    assert finish(start(model, a)) == [EXIT_OK]
    own = model["model"] / "eval" / "dev.csv"
    MlflowClient(model["uri"]).log_artifact(model["run_id"], str(own), "eval")  # the run's table: clean rows only
    assert {r["condition"] for r in run_table(model)} == {"clean"}
    assert finish(start(model, b)) == [EXIT_OK]
    assert_every_condition_once(model, {"clean", "snr5", "snr15"})


def test_a_row_cut_short_is_not_merged(tmp_path: Path) -> None:
    """A table copy killed midway (a run's table uploaded in part) gives its whole rows and no half one."""
    from asr_core.contract.evaluation import merge_tables

    new, old = tmp_path / "dev.csv", tmp_path / "old.csv"
    new.write_text("condition,recording,wer\nsnr5,a,10.0\n")
    old.write_text("condition,recording,wer\nclean,a,5.0\nclean,b,6.0\nclean,c")
    assert merge_tables(new, [old]) == 2
    with open(new, newline="") as fh:
        assert [(r["condition"], r["recording"], r["wer"]) for r in csv.DictReader(fh)] == [
            ("clean", "a", "5.0"), ("clean", "b", "6.0"), ("snr5", "a", "10.0")]
