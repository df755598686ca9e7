"""``python -m asr_core score``: other systems' transcripts scored as ``evaluate`` scores a model, its errors, and the
MLflow run that ``python -m analysis report`` lists beside the sweep's models (a real MLflow server)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from asr_core.__main__ import main
from asr_core.data.corpora import load_corpus
from asr_core.contract.metrics import metric_key
from asr_core.evaluation.evaluate import CSV_COLUMNS
from asr_core.scoring.score import Counts, corpus_wer, normalise, score
from asr_core.contract.trial import ROLE_EXTERNAL, TAG_SYSTEM

# reference, hypothesis, and the hand count (substitutions, deletions, insertions, reference words)
CASES = {
    "r1": ("The cat sat on the mat.", "the bat sat on the mat today", (1, 0, 1, 6)),
    "r2": ("Mr. Smith paid twenty-five dollars.", None, (0, 0, 0, 4)),  # hypothesis as .nlp, see below
    "r3": ("hello world again", None, (0, 3, 0, 3)),  # no hypothesis file: empty output
    "sub/r4": ("Okay, we're done here", "ok we are done", (1, 1, 0, 5)),  # an id with a folder; ok is not okay
}
R2_NLP = "token|speaker|ts|endTs|punctuation|prepunctuation|case|tags\n" + "\n".join(
    f"{t}|0|||||LC|[]" for t in ("mister", "<laugh>", "smith", "paid", "$25")) + "\n"
HAND_WER = 100 * (2 + 0 + 3 + 2) / (6 + 4 + 3 + 5)


@pytest.fixture
def pair(tmp_path: Path) -> dict:
    """A reference manifest (no audio files: score reads none) and a hypothesis folder in both formats."""
    ref = tmp_path / "ref" / "test.jsonl"
    ref.parent.mkdir()
    ref.write_text("".join(json.dumps({"id": i, "audio": f"audio/{i}.wav", "text": r}) + "\n"
                           for i, (r, _, _) in CASES.items()))
    hyp = tmp_path / "whisper"
    (hyp / "sub").mkdir(parents=True)
    (hyp / "r1.txt").write_text(CASES["r1"][1] + "\n")
    (hyp / "r2.nlp").write_text(R2_NLP)
    (hyp / "sub" / "r4.txt").write_text(CASES["sub/r4"][1])
    return {"ref": f"test=manifest:{ref}", "hyp": hyp, "tmp": tmp_path}



@pytest.fixture(autouse=True)
def _no_ambient_tracking_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    """``score`` records in MLflow when MLFLOW_TRACKING_URI is set; each test here says where, or nowhere."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

def _evaluate_rows(spec: str, hyps: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The rows ``asr_core.evaluation.decoders`` computes for recordings whose decoded text is ``hyps`` (its own scoring code,
    with audio, features and the model replaced by the hypotheses)."""
    from asr_core.evaluation.scorers.base import CueScorer, WerScorer
    from tests.plugins.fake_decoding import fake_decode

    recordings = load_corpus(spec, audio=False)
    by_stem = {Path(i).name: h for i, h in hyps.items()}
    recordings = [type(r)(r.id, Path(f"{r.id.split('/')[-1]}.wav"), 1.0, r.words) for r in recordings]
    rows, _ = fake_decode(monkeypatch, recordings, lambda stem: by_stem.get(stem, ""), [WerScorer(), CueScorer()],
                          name="test")
    return rows["greedy"]


def test_score_equals_evaluates_scoring_and_a_hand_count(pair: dict, capsys, monkeypatch) -> None:
    out = pair["tmp"] / "out"
    assert main(["score", "--ref", pair["ref"], "--hyp", str(pair["hyp"]), "--system", "whisper", "--out", str(out),
                 "--verbose"]) == 0
    captured = capsys.readouterr()
    table = pd.read_csv(out / "test.csv", dtype={"recording": str})
    assert list(table.columns) == CSV_COLUMNS
    by_id = table.set_index("recording")
    for rec_id, (_, _, (s, d, i, n)) in CASES.items():  # the hand count
        row = by_id.loc[rec_id]
        assert (row.substitutions, row.deletions, row.insertions, row.ref_words) == (s, d, i, n), rec_id
    wer = corpus_wer(Counts(*r) for r in table[["ref_words", "substitutions", "deletions", "insertions",
                                                 "hyp_words"]].itertuples(index=False))
    assert wer == pytest.approx(HAND_WER)
    assert f"{HAND_WER:.2f}" in captured.out and "whisper" in captured.out
    assert "r3" in captured.err and "no hypothesis" in captured.err and "empty output" in captured.err
    # evaluate's own per-recording scoring of the same texts gives the same rows
    hyps = {"r1": CASES["r1"][1], "r2": "mister smith paid $25", "sub/r4": CASES["sub/r4"][1]}
    rows = _evaluate_rows(pair["ref"].split("=", 1)[1], hyps, monkeypatch)
    expected = pd.DataFrame(rows, columns=CSV_COLUMNS)
    pd.testing.assert_frame_equal(table, expected.astype(table.dtypes.to_dict()), check_exact=True)
    # and the scorer itself, called directly
    for rec_id, (ref, _, _) in CASES.items():
        c = score(normalise(ref), normalise(hyps.get(rec_id, "")), normalised=True)
        assert (c.substitutions, c.deletions, c.insertions, c.ref_words) == CASES[rec_id][2]


def test_earnings22_release_scored_without_its_media(tmp_path: Path, capsys) -> None:
    from tests.test_corpora_releases import earnings22_release

    root = earnings22_release(tmp_path / "earnings22", media="lfs")  # references read, media never opened
    hyp = tmp_path / "vendor"
    hyp.mkdir()
    (hyp / "4420696.txt").write_text("Greetings, I'm KBFG in 2021.")
    (hyp / "MP3-A.txt").write_text("thank you")
    assert main(["score", "--ref", f"e22=earnings22:{root}", "--hyp", f"e22={hyp}", "--system", "vendor",
                 "--out", str(tmp_path / "out")]) == 0
    t = pd.read_csv(tmp_path / "out" / "e22.csv", dtype={"recording": str}).set_index("recording")
    assert t.loc["4420696", "substitutions"] + t.loc["4420696", "deletions"] + t.loc["4420696", "insertions"] == 0
    assert t.loc["4453225", "deletions"] == 3 and t.loc["MP3-A", "ref_words"] == 2
    assert "4453225" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--ref", "nonsense", "--hyp", "{hyp}"], "--ref: dataset spec 'nonsense' must look like NAME=FORMAT:PATH"),
    (["--ref", "t=wav:/x", "--hyp", "{hyp}"], "unknown format 'wav'"),
    (["--ref", "t=manifest:{tmp}/nowhere.jsonl", "--hyp", "{hyp}"], "nowhere.jsonl does not exist"),
    (["--ref", "{ref}", "--hyp", "{tmp}/missing"], "hypothesis folder {tmp}/missing does not exist"),
    (["--ref", "{ref}", "--hyp", "{hyp}/r1.txt"], "{hyp}/r1.txt is not a folder"),
    (["--ref", "{ref}", "--hyp", "{tmp}/ref"], "holds no <recording id>.txt or .nlp files"),
    (["--ref", "{ref}", "--ref", "u=manifest:{tmp}/ref", "--hyp", "{hyp}"], "2 --ref but 1 --hyp"),
    (["--ref", "{ref}", "--hyp", "{hyp}", "--tracking-uri", "http://127.0.0.1:9"], "needs --sweep"),
])
def test_bad_arguments_exit_2_naming_what_is_wrong(pair: dict, capsys, monkeypatch, args, message) -> None:
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    fill = {"ref": pair["ref"], "hyp": pair["hyp"], "tmp": pair["tmp"]}
    assert main(["score", *[a.format(**fill) for a in args], "--system", "w"]) == 2
    assert message.format(**fill) in capsys.readouterr().err


def test_a_hypothesis_without_a_reference_with_strict_or_twice_is_an_error(pair: dict, capsys) -> None:
    (pair["hyp"] / "stray.txt").write_text("who am i")
    assert main(["score", "--ref", pair["ref"], "--hyp", str(pair["hyp"]), "--system", "w", "--strict"]) == 2
    err = capsys.readouterr().err
    assert "1 hypothesis has no reference recording in test" in err and str(pair["hyp"] / "stray.txt") in err
    (pair["hyp"] / "stray.txt").unlink()
    (pair["hyp"] / "r1.nlp").write_text(R2_NLP)
    assert main(["score", "--ref", pair["ref"], "--hyp", str(pair["hyp"]), "--system", "w"]) == 2
    assert "two hypotheses for recording 'r1'" in capsys.readouterr().err


def test_score_is_recorded_where_analysis_lists_it(pair: dict, mlflow_server, capsys, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep with one finished trial on dataset ``test``; the scored system lands in the same experiment and the
    report lists its WER in a table of its own, not among the trials or the problems. Without --out the tables go
    to MLflow through a temporary folder that is removed afterwards."""
    import sys
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    from mlflow.entities import Metric, Param

    from analysis.ledger.collect import collect
    from analysis.document.report import build_report

    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "analysis"))
    import synthetic_sweep as synth

    client = mlflow_server.client()
    experiment = f"score-{tmp_path.name}"
    exp_id = client.create_experiment(experiment)
    run = client.create_run(exp_id, tags={"sweep.role": "trial", "trial.seed": "0", "trial.subgrids": "context",
                                          "trial.label": "ctx10s-rope1.5M-2L96d4h-s0"}).info.run_id
    client.log_batch(run, metrics=[Metric("wer/test", 40.0, 0, 0)],
                     params=[Param(k, v) for k, v in synth.params(10.24, "rotary", 0).items()])
    client.set_terminated(run, "FINISHED")

    args = ["score", "--ref", pair["ref"], "--hyp", str(pair["hyp"]), "--system", "whisper-x",
            "--tracking-uri", mlflow_server.uri, "--experiment", experiment]
    assert main(args) == 0
    assert "recorded whisper-x in MLflow run" in capsys.readouterr().err
    (pair["hyp"] / "r3.txt").write_text("hello world again")  # scored again: the same run, the newest WER
    assert main(args) == 0
    runs = client.search_runs([exp_id], f"tags.`sweep.role` = '{ROLE_EXTERNAL}'")
    assert len(runs) == 1
    ext = runs[0]
    new_wer = 100 * 4 / 18  # r3 is right now
    assert ext.data.tags[TAG_SYSTEM] == "whisper-x" and ext.info.status == "FINISHED"
    assert ext.data.metrics[metric_key("test")] == pytest.approx(new_wer)
    assert ext.data.tags["external.missing.test"] == "0" and ext.data.tags["external.extra.test"] == "0"
    assert ext.data.tags["WER test"].strip() == f"{new_wer:.2f}"  # the saved view's column, rounded
    assert [f.path for f in client.list_artifacts(ext.info.run_id, "eval")] == ["eval/test.csv"]
    assert not list(scratch.iterdir())  # no asr-score-* folder left behind

    sweep = collect(experiment, mlflow_server.uri, progress=False)
    assert list(sweep.trials["run_id"]) == [run]
    assert not sweep.problems["problem"].str.contains("not a trial").any()
    (row,) = sweep.external.to_dict("records")
    assert (row["system"], row["dataset"], row["condition"]) == ("whisper-x", "test", "clean")
    assert row["wer"] == pytest.approx(new_wer) and math.isnan(row["snr_db"])
    report = build_report(sweep, tmp_path / "report", bootstrap_resamples=100)
    md = report.markdown.read_text()
    assert "WER (%) of other systems on the same test sets" in md
    assert f"| whisper-x | {new_wer:.2f} |" in md
    assert (tmp_path / "report" / "external.csv").is_file()


def test_a_release_folder_with_an_extra_hypothesis_is_scored_and_the_extra_named(tmp_path: Path, capsys) -> None:
    """Earnings-21 as downloaded: ``output/google`` holds a hypothesis (4396498.nlp) of a call the references lack.
    The calls that have references are scored; the extra is named on stderr and in the summary; ``--strict`` makes
    it (and a missing one) an error."""
    from tests.test_corpora_releases import earnings22_release

    root = earnings22_release(tmp_path / "earnings21", media="lfs")
    hyp = tmp_path / "output" / "google"
    hyp.mkdir(parents=True)
    (hyp / "4420696.nlp").write_text(R2_NLP.replace("mister", "greetings"))
    (hyp / "4453225.txt").write_text("good morning everyone")
    (hyp / "MP3-A.txt").write_text("thank you")
    (hyp / "4396498.nlp").write_text(R2_NLP)  # no reference of that call
    args = ["score", "--ref", f"e21=earnings22:{root}", "--hyp", str(hyp), "--system", "google"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    t = pd.read_csv(tmp_path / "out" / "e21.csv", dtype={"recording": str})
    assert sorted(t.recording) == ["4420696", "4453225", "MP3-A"]
    assert "1 hypothesis has no reference recording in e21" in captured.err and "4396498.nlp" in captured.err
    summary = captured.out.splitlines()
    header, row = summary[0].split(), summary[1].split()
    assert dict(zip(header, row))["extra"] == "1" and dict(zip(header, row))["missing"] == "0"
    assert "e21: extra (no reference, left out): 4396498" in captured.out
    assert main([*args, "--strict"]) == 2
    err = capsys.readouterr().err
    assert "4396498.nlp" in err and "--strict" in err
    (hyp / "4396498.nlp").unlink()
    (hyp / "MP3-A.txt").unlink()  # a missing hypothesis is scored as empty output, fatal only with --strict
    assert main(args) == 0
    assert main([*args, "--strict"]) == 2
    assert "MP3-A" in capsys.readouterr().err
