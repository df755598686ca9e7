"""Decoding a finished model at other windows than its context (the context-or-fragmentation control): the decode
file's ``window_s``, ``evaluate --window-s`` / ``EvaluationRun(windows=...)``, the evaluation job's decoder dict, and
the report's list of window decoders."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
import torch

from analysis.ledger.collect import Sweep
from asr_core.config import preset
from asr_core.contract.evaluation import EvaluationSpec
from asr_core.contract.ledger import experiment_id
from asr_core.contract.trial import EVAL_DIR, ProgressLog, TrialFolder
from asr_core.evaluation.evaluate import Destination, EvaluationRun, evaluate
from asr_core.evaluation.evaluate_cli import parse_windows
from orchestrate.plan.decode_file import DecodeFileError, DecodeSpec, load_decode_file, parse_decode

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(2)
VALID = "positive numbers of seconds, each once"


# ---- (a) the decode file ----------------------------------------------------------------------------------------
def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "decode.yaml"
    path.write_text(text)
    return path


def test_a_window_file_decodes_greedily_at_each_window(tmp_path: Path) -> None:
    spec = load_decode_file(_file(tmp_path, "name: windows\nwindow_s: [5.12, 10.24, 20.48]\nstride: 0.25\n"))
    assert spec.windows == (5.12, 10.24, 20.48) and spec.fusion == () and spec.lm is None
    assert spec.decoders == ["window-5.12s", "window-10.24s", "window-20.48s"]
    assert spec.setting() == {"windows": [5.12, 10.24, 20.48], "stride": 0.25}
    assert spec.metric_keys("test") == ["wer_window-5.12s/test", "wer_window-10.24s/test", "wer_window-20.48s/test"]
    one = load_decode_file(_file(tmp_path, "name: w\nwindow_s: 5\n"))
    assert one.windows == (5.0,) and one.decoders == ["window-5s"]


def test_the_packaged_window_file_is_the_control_at_three_windows() -> None:
    spec = load_decode_file("grids/decode-windows.yaml")
    assert spec.name == "windows" and spec.windows == (5.12, 10.24, 20.48) and spec.stride is None
    assert "--where data.context_s=81.92" in (ROOT / "grids" / "decode-windows.yaml").read_text()


@pytest.mark.parametrize("value, named", [
    ("0", "0"), ("-5.12", "-5.12"), ("[5.12, 0]", "0"), ("[5.12, -1]", "-1"), ("'5.12'", "'5.12'"),
    ("[five]", "'five'"), ("true", "True"), ("[5.12, 5.12]", "repeats a window"), ("[]", "[]"), (".nan", "nan"),
])
def test_a_bad_window_is_refused_naming_the_file_key_value_and_what_is_valid(tmp_path: Path, value: str,
                                                                              named: str) -> None:
    path = _file(tmp_path, f"name: w\nwindow_s: {value}\n")
    with pytest.raises(DecodeFileError) as e:
        load_decode_file(path)
    assert all(s in str(e.value) for s in (str(path), "'window_s'", named, VALID)), e.value


@pytest.mark.parametrize("extra, named", [("alpha: 0.5\n", "'alpha' is a beam search setting"),
                                          ("lm: null\n", "'lm' is a beam search setting"),
                                          ("fusion: all\n", "'fusion' and 'window_s'")])
def test_a_window_file_takes_no_beam_setting_and_no_fusion(tmp_path: Path, extra: str, named: str) -> None:
    with pytest.raises(DecodeFileError, match=named):
        load_decode_file(_file(tmp_path, "name: w\nwindow_s: [5.12]\n" + extra))


def test_the_record_round_trips_and_beam_and_fusion_records_are_as_before(tmp_path: Path) -> None:
    spec = load_decode_file(_file(tmp_path, "name: w\nwindow_s: [5.12, 10.24]\n"))
    record = spec.to_dict()
    assert record["windows"] == [5.12, 10.24] and "fusion" not in record and "tail" not in record
    assert DecodeSpec.from_dict(json.loads(json.dumps(record))) == spec
    fusion = parse_decode({"name": "fusion", "fusion": ["chiu"]}, tmp_path / "f.yaml")
    assert list(fusion.to_dict()) == ["name", "lm", "alpha", "beta", "beam_width", "lm_context", "prompt", "datasets",
                                      "snrs", "stride", "source", "fusion"]
    assert fusion.setting() == {"fusion": ["chiu"], "stride": None}
    beam = DecodeSpec(name="beam", lm=None, alpha=0.0, beta=1.0, beam_width=4, lm_context=8)
    assert list(beam.to_dict()) == ["name", "lm", "alpha", "beta", "beam_width", "lm_context", "prompt", "datasets",
                                    "snrs", "stride", "source"]
    assert DecodeSpec.from_dict(beam.to_dict()) == beam and DecodeSpec.from_dict(fusion.to_dict()) == fusion


# ---- the command line and the evaluation's own checks -----------------------------------------------------------
def test_window_s_is_comma_separated_positive_seconds_each_once() -> None:
    assert parse_windows(None) == () and parse_windows("5.12, 10.24") == (5.12, 10.24)
    for bad in ("0", "-1", "x", "5.12,", "5.12,5.120", "nan", "inf"):
        with pytest.raises(ValueError, match="--window-s .*positive numbers of seconds, each once"):
            parse_windows(bad)


def test_the_evaluate_command_refuses_a_bad_window_before_any_work(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import asr_core.__main__ as main

    assert main.main(["evaluate", str(tmp_path / "absent.pt"), "--window-s", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evaluate: --window-s '0'") and "positive numbers of seconds" in err
    assert err.count("\n") == 1 and not (tmp_path / EVAL_DIR).exists()


@pytest.mark.parametrize("windows", [(0.0,), (-1.0,), (5.12, 5.12), ("5",), (True,), (float("inf"),)])
def test_evaluation_run_refuses_a_window_that_is_not_positive_seconds_each_once(windows: tuple[Any, ...]) -> None:
    with pytest.raises(ValueError, match="positive"):
        EvaluationRun(Path("x.pt"), ["t=podcast:x"], windows=windows)


# ---- (b) an evaluation on a tiny model -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from asr_core.data.synth.generate import synthesise
    from asr_core.data.synth.text import TOPICS, vocabulary
    from asr_core.data.tokenizer import Tokenizer
    from asr_core.model.acoustic import build_model
    from asr_core.training.checkpoint import save_checkpoint

    tmp = tmp_path_factory.mktemp("windows")
    corpus = tmp / "corpus"
    synthesise(corpus, 0.005, seed=1, eval_hours=0.005, min_minutes=0.15, max_minutes=0.2, jobs=2, splits=("test",))
    cfg = preset("tiny").with_overrides(["data.context_s=2.56", "data.batch_audio_s=10.24"])
    tok = Tokenizer.train([" ".join(vocabulary())] + [" ".join(t) for t in TOPICS.values()] * 20,
                          cfg.model.vocab_size)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data.features.n_mels)
    ckpt = save_checkpoint(tmp / "run" / "checkpoint.pt", {"config": cfg.to_dict(), "model": model.state_dict(),
                                                           "tokenizer": tok.to_bytes(), "format_version": 1,
                                                           "step": 0})
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    before = os.environ.get("MLFLOW_TRACKING_URI")
    client = mlflow.MlflowClient(uri)
    run = client.create_run(experiment_id(client, "windows-test")).info.run_id
    yield {"tmp": tmp, "data": [f"t=podcast:{corpus / 'test'}"], "ckpt": ckpt, "uri": uri, "run": run}
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


def _windows_run(line: str, decoder: str | None = None) -> int:
    """The windows a decoder ran, from evaluate's per-recording line (``<decoder> WER ...% (RTF ..., N windows)``;
    None: the model's own decoding, ``(W words, N windows)`` at the line's end)."""
    found = (re.search(r"\(\d+ words, (\d+) windows\)$", line) if decoder is None else
             re.search(rf"{re.escape(decoder)} WER [^;]*?\(RTF [\d.]+, (\d+) windows\)", line))
    assert found, (decoder, line)
    return int(found.group(1))


def test_windows_log_as_decoders_of_their_own_and_the_models_own_window_is_greedy(
        setup: dict, capsys: pytest.CaptureFixture[str]) -> None:
    out = setup["tmp"] / "logged"
    df = evaluate(EvaluationRun(setup["ckpt"], setup["data"], stride=0.25, windows=(2.56, 0.32)),
                  Destination(out_dir=out, run_id=setup["run"], tracking_uri=setup["uri"]))
    err = capsys.readouterr().err
    by = {d: rows.drop(columns="decoder").reset_index(drop=True) for d, rows in df.groupby("decoder")}
    assert set(by) == {"greedy", "window-2.56s", "window-0.32s"}
    # the model's own context decoded again: exactly the greedy rows, hypotheses included
    pd.testing.assert_frame_equal(by["window-2.56s"], by["greedy"])
    hyps = pd.read_json(out / "t.hyp.jsonl", lines=True)
    assert (hyps["hyp_window-2.56s"] == hyps["hyp"]).all()
    # the tables: one per decoder, the same recordings and conditions
    for decoder in ("window-2.56s", "window-0.32s"):
        table = pd.read_csv(out / f"t.{decoder}.csv", dtype={"recording": str})
        assert list(table["recording"]) == list(pd.read_csv(out / "t.csv", dtype={"recording": str})["recording"])
    # a shorter window runs more windows per recording: the window is the one asked for
    lines = [line for line in err.splitlines() if line.startswith("[eval] t ")]
    assert lines and all("window-0.32s WER" in line for line in lines)
    for line in lines:
        own = _windows_run(line)
        assert _windows_run(line, "window-2.56s") == own
        assert _windows_run(line, "window-0.32s") > 4 * own
    # logged as fusion decoders are: only the extra decoders, each with its tag
    client = mlflow.MlflowClient(setup["uri"])
    got = client.get_run(setup["run"]).data
    assert set(got.metrics) == {"wer_window-2.56s/t", "wer_window-0.32s/t"}
    assert {a.path for a in client.list_artifacts(setup["run"], EVAL_DIR)} == {
        f"{EVAL_DIR}/t.window-2.56s.csv", f"{EVAL_DIR}/t.window-0.32s.csv"}
    assert json.loads(got.tags["eval.decoder.window-0.32s"]) == {
        "window_s": "0.32", "stride": "0.25", "decoding": "greedy", "trained_context_s": "2.56"}


def test_a_short_window_decodes_its_own_posteriors(setup: dict) -> None:
    """The hypotheses at 0.32 s are greedy CTC of the posteriors made with 0.32 s windows, not the model's own."""
    from asr_core.data.audio import load_audio
    from asr_core.data.corpora import load_corpus
    from asr_core.data.features import FeatureExtractor
    from asr_core.decoding.decode import greedy_ids, posteriors, prepare_features, window_frames
    from asr_core.training.checkpoint import load_for_eval

    out = setup["tmp"] / "short"
    evaluate(EvaluationRun(setup["ckpt"], setup["data"], stride=0.25, windows=(0.32,)), Destination(out, log=False))
    hyps = pd.read_json(out / "t.hyp.jsonl", lines=True).set_index("recording")
    model, cfg, tok = load_for_eval(setup["ckpt"])
    fps, sub = cfg.data.features.frames_per_second, cfg.model.subsampling_factor
    rec = load_corpus(setup["data"][0].split("=", 1)[1])[0]
    feats = prepare_features(FeatureExtractor(cfg.data.features), load_audio(rec.audio), rec.ignore, fps)
    texts = {w: tok.decode(greedy_ids(posteriors(model, feats, window_frames(w, fps, sub), stride=0.25,
                                                 subsampling=sub), tok.blank_id)) for w in (0.32, 2.56)}
    assert texts[0.32] != texts[2.56]  # (the untrained model's outputs differ with the window: a check that can fail)
    assert hyps.loc[rec.id, "hyp_window-0.32s"] == texts[0.32]
    assert hyps.loc[rec.id, "hyp"] == texts[2.56]


# ---- (c) the evaluation job -------------------------------------------------------------------------------------
def test_an_evaluation_job_with_windows_decodes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decoder dict `orchestrate evaluate` records for a window file reaches the evaluation as its windows."""
    import asr_core.evaluation.evaluate as ev
    import asr_core.evaluation.job as job

    spec = load_decode_file(_file(tmp_path, "name: windows\nwindow_s: [5.12, 10.24]\n"))
    decoder = {k: v for k, v in spec.to_dict().items() if k not in ("name", "datasets", "snrs", "source")}
    model_dir = tmp_path / "sweep" / "trials" / "m1"
    model_dir.mkdir(parents=True)
    ran: list[EvaluationRun] = []
    monkeypatch.setattr(job, "check_model", lambda s: model_dir / "checkpoint.pt")
    monkeypatch.setattr(ev, "evaluate", lambda run, to: ran.append(run))
    cfg = preset("tiny")
    for given, stride in (({}, cfg.eval.stride), ({"stride": 0.5}, 0.5)):
        ejob = EvaluationSpec(key="m1-0000abcd", model="m1", model_dir=str(model_dir), name="windows",
                              setting=spec.setting(), datasets=("t=podcast:/x",), conditions={"t": (None,)},
                              decoder=json.loads(json.dumps({**decoder, **given})))
        folder = TrialFolder(tmp_path / "sweep" / "trials" / ejob.key)
        job.run_evaluation(ejob, cfg, folder, None, None, ProgressLog(tmp_path), None)
        assert ran[-1].windows == (5.12, 10.24) and ran[-1].stride == stride
        assert ran[-1].fusion == () and ran[-1].beam is None


# ---- the report's list of decoders ------------------------------------------------------------------------------
def test_window_decoders_are_listed_by_seconds_and_are_no_beam_decoders() -> None:
    empty = pd.DataFrame()
    wer = pd.DataFrame({"decoder": ["greedy", "beam-lm8", "fusion-chiu", "window-20.48s", "window-5.12s",
                                    "window-10.24s"]})
    sweep = Sweep("x", empty, wer, empty, empty, empty)
    assert sweep.window_decoders == ["window-5.12s", "window-10.24s", "window-20.48s"]
    assert sweep.beam_decoders == ["beam-lm8"] and sweep.fusion_decoders == ["fusion-chiu"]
