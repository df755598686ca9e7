"""``evaluate``: per-recording table, metrics and artifacts in the checkpoint's MLflow run (real sqlite store), the
datasets' content fingerprints on the run, and progress records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pandas as pd
import pytest
import torch

from asr_core.training.checkpoint import save_checkpoint
from asr_core.config import preset
from asr_core.data.corpora import load_corpus
from asr_core.data.synth.generate import synthesise
from asr_core.data.corpora.fingerprint import fingerprint
from asr_core.data.synth.text import TOPICS, vocabulary
from asr_core.contract.ledger import experiment_id
from asr_core.contract.metrics import metric_key
from asr_core.evaluation.evaluate import CSV_COLUMNS, Destination, EvaluationRun, evaluate
from asr_core.evaluation.stage_run import EvalDataChanged
from asr_core.model.acoustic import build_model
from asr_core.data.tokenizer import Tokenizer
from asr_core.contract.trial import EVAL_DIR, ProgressLog, TrialFolder, eval_fingerprint_tag

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("eval")
    corpus = tmp / "corpus"
    synthesise(corpus, 0.005, seed=1, eval_hours=0.005, min_minutes=0.15, max_minutes=0.2, jobs=2,
               splits=("test", "test-shifted"))
    cfg = preset("tiny").with_overrides(["data.context_s=2.56", "data.batch_audio_s=10.24"])
    texts = [" ".join(vocabulary())] + [" ".join(t) for t in TOPICS.values()]
    tok = Tokenizer.train(texts * 20, cfg.model.vocab_size)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data.features.n_mels)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    before = os.environ.get("MLFLOW_TRACKING_URI")  # read before set_tracking_uri, which sets it
    mlflow.set_tracking_uri(uri)
    run = mlflow.MlflowClient(uri).create_run(experiment_id(mlflow.MlflowClient(uri), "eval-test"))
    ckpt = save_checkpoint(tmp / "run" / "checkpoint.pt", {
        "config": cfg.to_dict(), "model": model.state_dict(), "tokenizer": tok.to_bytes(), "format_version": 1,
        "mlflow_run_id": run.info.run_id, "tracking_uri": uri, "step": 0})
    yield {"tmp": tmp, "corpus": corpus, "ckpt": ckpt, "uri": uri, "run_id": run.info.run_id, "cfg": cfg}
    # mlflow.set_tracking_uri also sets MLFLOW_TRACKING_URI for the whole process: leave it as it was
    mlflow.set_tracking_uri(before or "")
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)


def test_evaluate_writes_the_table_and_logs_into_the_checkpoints_run(setup: dict) -> None:
    out = setup["tmp"] / "out"
    datasets = [f"test=podcast:{setup['corpus'] / 'test'}", f"shifted=podcast:{setup['corpus'] / 'test-shifted'}"]
    df = evaluate(EvaluationRun(setup["ckpt"], datasets, [-7.5, 10.0], stride=0.25, batch_windows=4),
                  Destination(out_dir=out))
    assert list(df.columns) == CSV_COLUMNS
    n_test = len(load_corpus(f"podcast:{setup['corpus'] / 'test'}"))
    assert len(df) == 3 * (n_test + len(load_corpus(f"podcast:{setup['corpus'] / 'test-shifted'}")))
    assert set(df.condition) == {"clean", "snr-7.5", "snr10"}
    assert df[df.condition == "clean"].snr_db.isna().all() and set(df.snr_db.dropna()) == {-7.5, 10.0}
    errors = df.substitutions + df.deletions + df.insertions
    assert ((df.wer - 100 * errors / df.ref_words).abs() < 1e-9).all()
    assert (df.ref_words - df.deletions + df.insertions == df.hyp_words).all()

    client = mlflow.MlflowClient(setup["uri"])
    run = client.get_run(setup["run_id"])
    for name in ("test", "shifted"):
        table = pd.read_csv(out / f"{name}.csv")
        assert list(table.columns) == CSV_COLUMNS
        for cond, snr in (("clean", None), ("snr-7.5", -7.5), ("snr10", 10.0)):
            part = table[table.condition == cond]
            expected = 100 * (part.substitutions + part.deletions + part.insertions).sum() / part.ref_words.sum()
            assert run.data.metrics[metric_key(name, snr)] == pytest.approx(expected)
    assert set(run.data.metrics) == {"wer/test", "wer/test/snr-7.5", "wer/test/snr10", "wer/shifted",
                                     "wer/shifted/snr-7.5", "wer/shifted/snr10"}
    # the saved view's columns: each clean WER rounded to 2 decimals, as a tag beside it
    assert {k: v for k, v in run.data.tags.items() if k.startswith("WER ")} == {
        f"WER {n}": f"{run.data.metrics[f'wer/{n}']:.2f}" for n in ("test", "shifted")}
    artifacts = {a.path for a in client.list_artifacts(setup["run_id"], EVAL_DIR)}
    assert artifacts == {f"{EVAL_DIR}/test.csv", f"{EVAL_DIR}/shifted.csv"}
    for name, split in (("test", "test"), ("shifted", "test-shifted")):
        expected = fingerprint(load_corpus(f"podcast:{setup['corpus'] / split}"))
        assert run.data.tags[eval_fingerprint_tag(name)] == expected


def test_a_dataset_name_with_other_content_is_refused_before_any_work(setup: dict) -> None:
    client = mlflow.MlflowClient(setup["uri"])
    run_id = client.create_run(client.get_run(setup["run_id"]).info.experiment_id).info.run_id
    test, shifted = setup["corpus"] / "test", setup["corpus"] / "test-shifted"
    evaluate(EvaluationRun(setup["ckpt"], [f"t=podcast:{test}"], [], stride=1.0),
             Destination(out_dir=setup["tmp"] / "fp1", run_id=run_id))
    before = client.get_run(run_id).data
    evaluate(EvaluationRun(setup["ckpt"], [f"t=podcast:{test}"], [], stride=1.0),
             Destination(out_dir=setup["tmp"] / "fp2", run_id=run_id))
    with pytest.raises(EvalDataChanged) as err:  # the same name now points at other recordings
        evaluate(EvaluationRun(setup["ckpt"], [f"t=podcast:{shifted}"], [], stride=1.0),
                 Destination(out_dir=setup["tmp"] / "fp3", run_id=run_id))
    message = str(err.value)
    old, new = fingerprint(load_corpus(f"podcast:{test}")), fingerprint(load_corpus(f"podcast:{shifted}"))
    assert all(s in message for s in ("'t'", old, new, "another dataset name", "new sweep"))
    assert "\n" not in message  # the trial job's trial.error tag keeps only the last line
    after = client.get_run(run_id).data
    assert after.tags[eval_fingerprint_tag("t")] == old and after.metrics == before.metrics
    assert not (setup["tmp"] / "fp3").exists()  # refused before decoding anything


def test_evaluation_is_deterministic_and_noise_changes_the_input(setup: dict) -> None:
    spec = [f"t=podcast:{setup['corpus'] / 'test'}"]
    folder = setup["tmp"] / "progress"
    folder.mkdir()
    a = evaluate(EvaluationRun(setup["ckpt"], spec, [0.0], stride=1.0),
                 Destination(out_dir=setup["tmp"] / "a", log=False, progress=ProgressLog(folder)))
    b = evaluate(EvaluationRun(setup["ckpt"], spec, [0.0], stride=1.0),
                 Destination(out_dir=setup["tmp"] / "b", log=False))
    pd.testing.assert_frame_equal(a, b)
    # progress: recordings x conditions of the dataset, from none to all, one record per recording and condition
    records = [json.loads(line) for line in TrialFolder(folder).progress.read_text().splitlines()]
    assert [(r["phase"], r["dataset"], r["done"], r["total"]) for r in records] == [
        ("eval", "t", k, len(a)) for k in range(len(a) + 1)]
    hyps = pd.read_json(setup["tmp"] / "a" / "t.hyp.jsonl", lines=True)
    assert set(hyps.condition) == {"clean", "snr0"} and hyps.ref.str.len().min() > 0


def test_bad_arguments_fail_before_any_work(setup: dict, tmp_path: Path) -> None:
    good = f"t=podcast:{setup['corpus'] / 'test'}"
    with pytest.raises(ValueError, match="NAME=FORMAT:PATH"):
        evaluate(EvaluationRun(setup["ckpt"], ["podcast:x"], []))
    with pytest.raises(ValueError, match="unique"):
        evaluate(EvaluationRun(setup["ckpt"], [good, good], []))
    with pytest.raises(ValueError, match="stride"):
        evaluate(EvaluationRun(setup["ckpt"], [good], [], stride=0))
    with pytest.raises(FileNotFoundError, match="nowhere.wav"):
        evaluate(EvaluationRun(setup["ckpt"], [good], [0.0], noise=str(tmp_path / "nowhere.wav")))
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        evaluate(EvaluationRun(tmp_path / "none.pt", [good], []))


@pytest.mark.slow
def test_cli(setup: dict) -> None:
    out = setup["tmp"] / "cli"
    r = subprocess.run([sys.executable, "-m", "asr_core", "evaluate", str(setup["ckpt"]), "--data",
                        f"t=podcast:{setup['corpus'] / 'test'}", "--snr", "5", "--stride", "1", "--out", str(out),
                        "--no-log"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (out / "t.csv").exists() and "snr5" in r.stdout and "[eval] t 1/" in r.stderr
    # a checkpoint whose eval.snrs are set: --clean-only decodes no music, without it they are used
    state = torch.load(setup["ckpt"], map_location="cpu", weights_only=True)
    state["config"]["eval"]["snrs"] = [5.0]
    noisy_ckpt = save_checkpoint(out / "noisy" / "checkpoint.pt", state)
    for flag, conditions in ((["--clean-only"], {"clean"}), ([], {"clean", "snr5"})):
        r = subprocess.run([sys.executable, "-m", "asr_core", "evaluate", str(noisy_ckpt), "--data",
                            f"t=podcast:{setup['corpus'] / 'test'}", *flag, "--stride", "1", "--out",
                            str(out / f"c{len(flag)}"), "--no-log"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        assert set(pd.read_csv(out / f"c{len(flag)}" / "t.csv").condition) == conditions
    bad = subprocess.run([sys.executable, "-m", "asr_core", "evaluate", str(setup["ckpt"]), "--data", "t=wav:x"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown format 'wav'" in bad.stderr


# ---- which datasets get music, precision, and the window batch of the whole evaluation ----------------------------
def test_music_only_on_the_noisy_datasets(setup: dict) -> None:
    """eval.noisy: the named datasets get the SNR conditions, the others are decoded clean only; metrics, tables
    and progress totals follow (the paper: music on Rev16 only)."""
    client = mlflow.MlflowClient(setup["uri"])
    run_id = client.create_run(client.get_run(setup["run_id"]).info.experiment_id).info.run_id
    out = setup["tmp"] / "noisy"
    folder = setup["tmp"] / "noisy-progress"
    folder.mkdir()
    test, shifted = setup["corpus"] / "test", setup["corpus"] / "test-shifted"
    df = evaluate(EvaluationRun(setup["ckpt"], [f"test=podcast:{test}", f"shifted=podcast:{shifted}"], [-7.5, 10.0],
                                stride=1.0, noisy=["shifted"]),
                  Destination(out_dir=out, run_id=run_id, progress=ProgressLog(folder)))
    n_test, n_shifted = len(load_corpus(f"podcast:{test}")), len(load_corpus(f"podcast:{shifted}"))
    assert len(df) == n_test + 3 * n_shifted
    assert set(df[df.dataset == "test"].condition) == {"clean"}
    assert set(df[df.dataset == "shifted"].condition) == {"clean", "snr-7.5", "snr10"}
    assert list(pd.read_csv(out / "test.csv").columns) == CSV_COLUMNS
    assert set(pd.read_csv(out / "test.csv").condition) == {"clean"}
    assert set(client.get_run(run_id).data.metrics) == {"wer/test", "wer/shifted", "wer/shifted/snr-7.5",
                                                        "wer/shifted/snr10"}
    totals = {(r["dataset"], r["total"])
              for r in map(json.loads, TrialFolder(folder).progress.read_text().splitlines())}
    assert totals == {("test", n_test), ("shifted", 3 * n_shifted)}
    # the clean rows do not depend on which datasets are noisy
    every = evaluate(EvaluationRun(setup["ckpt"], [f"test=podcast:{test}"], [-7.5], stride=1.0),
                     Destination(out_dir=setup["tmp"] / "all", log=False))
    pd.testing.assert_frame_equal(every[every.condition == "clean"].reset_index(drop=True),
                                  df[df.dataset == "test"].reset_index(drop=True))


def test_noisy_precision_and_batch_arguments_are_checked_before_any_work(setup: dict, tmp_path: Path) -> None:
    good = f"t=podcast:{setup['corpus'] / 'test'}"
    with pytest.raises(ValueError, match=r"noisy names \['rev16'\].*\bt\b"):
        evaluate(EvaluationRun(setup["ckpt"], [good], [0.0], noisy=["rev16"]), Destination(out_dir=tmp_path / "a"))
    with pytest.raises(ValueError, match="needs CUDA"):
        evaluate(EvaluationRun(setup["ckpt"], [good], [], precision="bf16", device="cpu"),
                 Destination(out_dir=tmp_path / "b"))
    with pytest.raises(ValueError, match="batch_windows"):
        evaluate(EvaluationRun(setup["ckpt"], [good], [], batch_windows=-1), Destination(out_dir=tmp_path / "c"))
    assert not any((tmp_path / d).exists() for d in "abc")


def test_out_of_memory_halves_the_batch_once_for_the_whole_evaluation(setup: dict,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that runs out of memory above 3 windows: the evaluation finds the size once (the first recording's 6
    windows fail, then 3 at a time) and every later recording, condition and dataset starts from 3, with the same
    results."""
    import asr_core.training.checkpoint

    spec = [f"t=podcast:{setup['corpus'] / 'test'}", f"s=podcast:{setup['corpus'] / 'test-shifted'}"]
    want = evaluate(EvaluationRun(setup["ckpt"], spec, [0.0], stride=1.0, batch_windows=8),
                    Destination(out_dir=setup["tmp"] / "oom0", log=False))
    calls: list[int] = []
    load = asr_core.training.checkpoint.load_for_eval

    def load_oom(path, device):
        model, cfg, tok = load(path, device)

        def forward(features, lengths):
            calls.append(features.shape[0])
            if features.shape[0] > 3:
                raise torch.OutOfMemoryError("CUDA out of memory (mocked)")
            return model(features, lengths)
        return forward, cfg, tok

    monkeypatch.setattr(asr_core.training.checkpoint, "load_for_eval", load_oom)
    got = evaluate(EvaluationRun(setup["ckpt"], spec, [0.0], stride=1.0, batch_windows=8),
                   Destination(out_dir=setup["tmp"] / "oom1", log=False))
    pd.testing.assert_frame_equal(got, want)
    assert calls[:2] == [6, 3] and max(calls[1:]) <= 3
    assert sum(1 for c in calls if c > 3) == 1  # one failure in the whole evaluation, not one per recording
    assert len(got) == 8 and len(calls) > 8  # 2 datasets x 2 recordings x 2 conditions, all after the first


@pytest.mark.slow
def test_cli_noisy_and_precision(setup: dict) -> None:
    out = setup["tmp"] / "cli-noisy"
    test, shifted = setup["corpus"] / "test", setup["corpus"] / "test-shifted"
    r = subprocess.run([sys.executable, "-m", "asr_core", "evaluate", str(setup["ckpt"]), "--data",
                        f"t=podcast:{test}", "--data", f"s=podcast:{shifted}", "--snr", "5", "--noisy", "s",
                        "--precision", "fp32", "--batch-windows", "0", "--stride", "1", "--out", str(out),
                        "--no-log"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert set(pd.read_csv(out / "t.csv").condition) == {"clean"}
    assert set(pd.read_csv(out / "s.csv").condition) == {"clean", "snr5"}
    assert "fp32, 8 windows at a time (sized from free memory)" in r.stderr
    bad = subprocess.run([sys.executable, "-m", "asr_core", "evaluate", str(setup["ckpt"]), "--data",
                          f"t=podcast:{test}", "--precision", "bf16", "--device", "cpu", "--no-log"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "needs CUDA" in bad.stderr


# ---- beam search as a decoder (paper 004): from the same posteriors, logged beside the greedy figures --------------
@pytest.mark.slow
def test_beam_decoding_logs_its_own_metrics_and_table_beside_greedy(setup: dict, tmp_path: Path) -> None:
    from asr_core.decoding.beam import BeamConfig
    from asr_core.evaluation.decoders import BeamDecoding
    from asr_core.lm import TransformerLM, preset as lm_preset

    data = [f"beamset=podcast:{setup['corpus'] / 'test'}"]
    client = mlflow.MlflowClient(setup["uri"])
    run = client.create_run(client.get_experiment_by_name("eval-test").experiment_id).info.run_id
    greedy = evaluate(EvaluationRun(setup["ckpt"], data, [], stride=0.5),
                      Destination(out_dir=tmp_path / "g", run_id=run, log=False))
    wide = BeamConfig(beam_width=8, alpha=0.0, beta=0.0, prune_threshold=float("inf"), token_threshold=8.0)
    no_lm = evaluate(EvaluationRun(setup["ckpt"], data, [], stride=0.5, beam=BeamDecoding(wide)),
                     Destination(out_dir=tmp_path / "b", run_id=run, tracking_uri=setup["uri"]))
    assert set(no_lm.decoder) == {"greedy", "beam"}
    # the greedy rows are the greedy evaluation's: one set of posteriors serves both decoders
    pd.testing.assert_frame_equal(no_lm[no_lm.decoder == "greedy"][CSV_COLUMNS].reset_index(drop=True), greedy)
    metrics = client.get_run(run).data.metrics
    assert set(metrics) == {"wer_beam/beamset"}  # only what is new: the greedy figures are the trial's own
    beam_rows = no_lm[no_lm.decoder == "beam"]
    expected = 100 * (beam_rows.substitutions + beam_rows.deletions + beam_rows.insertions).sum() / \
        beam_rows.ref_words.sum()
    assert metrics["wer_beam/beamset"] == pytest.approx(expected)
    assert {a.path for a in client.list_artifacts(run, EVAL_DIR)} == {f"{EVAL_DIR}/beamset.beam.csv"}
    assert json.loads(client.get_run(run).data.tags["eval.decoder.beam"]) == {}
    # an LM at alpha 0 changes nothing the search chooses
    vocab = setup["cfg"].model.vocab_size
    torch.manual_seed(0)
    lm = TransformerLM(lm_preset("tiny", vocab_size=vocab)).eval()
    with_lm = evaluate(EvaluationRun(setup["ckpt"], data, [], stride=0.5, beam=BeamDecoding(wide, lm=lm, name="lm0")),
                       Destination(out_dir=tmp_path / "l", log=False))
    assert (with_lm[with_lm.decoder == "lm0"].wer.to_numpy() == beam_rows.wer.to_numpy()).all()
    wrong = TransformerLM(lm_preset("tiny", vocab_size=vocab + 1))
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate(EvaluationRun(setup["ckpt"], data, [], stride=0.5, beam=BeamDecoding(wide, lm=wrong)),
                 Destination(out_dir=tmp_path / "w", log=False))


def test_window_fusion_methods_log_as_decoders_of_their_own(setup: dict, tmp_path: Path) -> None:
    """Paper 001's fusion methods beside the greedy averaging: metrics, tables and tags of their own; where windows
    do not overlap (stride 1) selection and block-wise by frames are exactly the averaging."""
    from asr_core.contract.metrics import FUSION_METHODS

    data = [f"fused=podcast:{setup['corpus'] / 'test'}"]
    client = mlflow.MlflowClient(setup["uri"])
    run = client.create_run(client.get_experiment_by_name("eval-test").experiment_id).info.run_id
    side_by_side = evaluate(EvaluationRun(setup["ckpt"], data, [], stride=1.0,
                                          fusion=("select", "blockwise-frames")),
                            Destination(out_dir=tmp_path / "s", log=False))
    by = {d: rows.drop(columns="decoder").reset_index(drop=True) for d, rows in side_by_side.groupby("decoder")}
    assert set(by) == {"greedy", "fusion-select", "fusion-blockwise-frames"}
    pd.testing.assert_frame_equal(by["fusion-select"], by["greedy"])
    pd.testing.assert_frame_equal(by["fusion-blockwise-frames"], by["greedy"])

    every = evaluate(EvaluationRun(setup["ckpt"], data, [], stride=0.125, fusion=FUSION_METHODS),
                     Destination(out_dir=tmp_path / "a", run_id=run, tracking_uri=setup["uri"]))
    got = client.get_run(run).data
    assert set(got.metrics) == {f"wer_fusion-{m}/fused" for m in FUSION_METHODS}  # greedy is the trial's own
    assert {a.path for a in client.list_artifacts(run, EVAL_DIR)} == {
        f"{EVAL_DIR}/fused.fusion-{m}.csv" for m in FUSION_METHODS}
    assert json.loads(got.tags["eval.decoder.fusion-chiu"]) == {"method": "chiu", "stride": "0.5",
                                                                "decoding": "greedy", "confidence": "position"}
    assert json.loads(got.tags["eval.decoder.fusion-chiu-seconds"])["confidence"] == "seconds"
    assert json.loads(got.tags["eval.decoder.fusion-blockwise"])["join"] == "words"
    assert json.loads(got.tags["eval.decoder.fusion-blockwise-frames"])["join"] == "frames"
    assert json.loads(got.tags["eval.decoder.fusion-rover"])["phases"] == "8"
    again = evaluate(EvaluationRun(setup["ckpt"], data, [], stride=0.125, fusion=FUSION_METHODS),
                     Destination(out_dir=tmp_path / "b", log=False))
    pd.testing.assert_frame_equal(again, every)  # every method is deterministic
    for bad in (("median",), ("average",), ("chiu", "chiu")):
        with pytest.raises(ValueError, match="valid are|each at most once"):
            EvaluationRun(setup["ckpt"], data, fusion=bad)
