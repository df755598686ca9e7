"""The tail-word error rate (paper 002) beside the WER: ``python -m asr_core tailset`` writes a text's tail set;
``evaluate`` and ``score`` given one (``--tail``, ``eval.tail``) add the columns ``tail_words``/``tail_errors``, the
metrics ``tail/...`` and the tag ``eval.tail``, and without one write exactly what they wrote before."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from asr_core.__main__ import main
from asr_core.contract import metrics as m
from asr_core.data.corpora import load_corpus
from asr_core.data.synth.generate import synthesise
from asr_core.data.synth.text import vocabulary
from asr_core.scoring.tail import TailSet, corpus_tail_rate, share_of, tail_counts, tail_set

torch.set_num_threads(1)

# 20 words: the x10, cat x5, plum x2, fig x1, kiwi x1, lime x1; the tail at 25%: fig, kiwi, lime, plum
HAND = "The cat, the cat. THE CAT the cat the cat!\nthe the the the the\nPlum plum, Fig. kiwi lime\n"


@pytest.fixture(autouse=True)
def _no_ambient_tracking_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    """``score`` records in MLflow when MLFLOW_TRACKING_URI is set; each test here says where, or nowhere."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic test split (real espeak-ng)."""
    out = tmp_path_factory.mktemp("tail") / "corpus"
    synthesise(out, 0.005, seed=1, eval_hours=0.005, min_minutes=0.15, max_minutes=0.2, jobs=2, splits=("test",))
    return out / "test"


# ---- python -m asr_core tailset ------------------------------------------------------------------------------------

def test_tailset_of_a_hand_text_is_exactly_this_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "text.txt"
    text.write_text(HAND)
    out = tmp_path / "sets" / "tail.json"
    assert main(["tailset", str(text), "--out", str(out), "--share", "0.25"]) == 0
    assert out.read_text() == ('{\n "source": "' + str(text) + '",\n "share": 0.25,\n "total_words": 20,\n'
                               ' "tail_share": 0.25,\n "words": [\n  "fig",\n  "kiwi",\n  "lime",\n  "plum"\n ],\n'
                               ' "unseen": "tail",\n "head": [\n  "cat",\n  "the"\n ]\n}\n')
    printed = capsys.readouterr().out
    assert "4 tail word types, 25.00% of the 20 words" in printed and str(out) in printed
    assert TailSet.read(out) == TailSet(frozenset({"fig", "kiwi", "lime", "plum"}), str(text), 0.25, 20, 0.25,
                                        frozenset({"cat", "the"}), "tail")
    assert "and every word it never says" in printed
    assert main(["tailset", str(text), "--out", str(out), "--share", "0.25", "--unseen", "head"]) == 0
    assert TailSet.read(out).unseen == "head" and "zebra" not in TailSet.read(out)
    assert "(words it never says are not)" in capsys.readouterr().out
    # the default share is the paper's 5%: one word of 20 at most (fig, alphabetically first of the rarest)
    assert main(["tailset", str(text), "--out", str(out)]) == 0
    assert TailSet.read(out).words == {"fig"} and TailSet.read(out).share == 0.05


def test_tailset_of_a_corpus_takes_its_transcripts(corpus: Path, tmp_path: Path) -> None:
    spec = f"podcast:{corpus}"
    out = tmp_path / "tail.json"
    assert main(["tailset", spec, "--out", str(out), "--share", "0.1"]) == 0
    texts = [r.text for r in load_corpus(spec, audio=False)]
    expected = tail_set(texts, 0.1, source=spec)
    assert TailSet.read(out) == expected and len(expected) > 0
    assert json.loads(out.read_text())["source"] == spec
    named = tmp_path / "named.json"  # a named spec reads the same corpus
    assert main(["tailset", f"test={spec}", "--out", str(named), "--share", "0.1"]) == 0
    assert TailSet.read(named).words == expected.words


@pytest.mark.parametrize("args,message", [
    (["{missing}", "--out", "{out}"], "no such file, nor a corpus spec"),
    (["{text}", "--out", "{out}", "--share", "0"], "--share 0.0: give a fraction strictly between 0 and 1"),
    (["{text}", "--out", "{out}", "--share", "1.5"], "--share 1.5"),
    (["{text}", "--out", "{tmp}"], "is a folder; give the path of a JSON file"),
    (["{empty}", "--out", "{out}"], "has no words after normalisation"),
    (["podcast:{missing}", "--out", "{out}"], "does not exist"),
    (["{binary}", "--out", "{out}"], "cannot be read as UTF-8 text"),
])
def test_tailset_refuses_bad_input_before_writing(args: list[str], message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "text.txt").write_text(HAND)
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00bad")
    paths = {"text": tmp_path / "text.txt", "empty": tmp_path / "empty.txt", "binary": tmp_path / "binary.txt",
             "missing": tmp_path / "nothing", "out": tmp_path / "out.json", "tmp": tmp_path}
    assert main(["tailset", *(a.format(**paths) for a in args)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tailset: ") and message in err, err
    assert not (tmp_path / "out.json").exists()


# ---- evaluate ------------------------------------------------------------------------------------------------------

def _checkpoint(tmp: Path) -> Path:
    from asr_core.config import preset
    from asr_core.data.tokenizer import Tokenizer
    from asr_core.model.acoustic import build_model
    from asr_core.training.checkpoint import save_checkpoint

    cfg = preset("tiny").with_overrides(["data.context_s=2.56", "data.batch_audio_s=10.24", "model.layers=1",
                                         "model.d_model=32", "model.heads=2", "model.subsampling_channels=16"])
    tok = Tokenizer.train([" ".join(vocabulary())] * 20, cfg.model.vocab_size)
    torch.manual_seed(0)
    return save_checkpoint(tmp / "run" / "checkpoint.pt", {
        "config": cfg.to_dict(), "model": build_model(cfg.model, cfg.data.features.n_mels).state_dict(),
        "tokenizer": tok.to_bytes(), "format_version": 1, "step": 0})


def _outbox(box) -> tuple[dict[str, float], dict[str, str]]:
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    for line in box.path.read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "metrics":
            metrics.update(rec["metrics"])
        elif rec["kind"] == "tags":
            tags.update(rec["tags"])
    return metrics, tags


def test_evaluate_counts_exactly_the_tail_words_of_its_hypotheses(corpus: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate's own decoding loop, fed hypotheses: the reference with some tail words swapped, some head words
    dropped and a tail word inserted is counted as tail_counts counts it, and only with a tail set."""
    from asr_core.evaluation.scorers.base import CueScorer, WerScorer
    from asr_core.evaluation.scorers.tail import TailScorer
    from tests.plugins.fake_decoding import fake_decode

    recs = list(load_corpus(f"podcast:{corpus}", audio=False))
    tail = tail_set([r.text for r in recs], 0.2, source="refs")
    hyps: dict[str, str] = {}
    for rec in recs:
        words = [w.text for w in rec.words]
        tails = [i for i, w in enumerate(words) if w.lower() in tail]
        for i in tails[::2]:
            words[i] = "walrus"
        heads = [i for i, w in enumerate(words) if w.lower() not in tail and w != "walrus"]
        for i in reversed(heads[1::5]):
            del words[i]
        hyps[rec.id] = " ".join([sorted(tail.words)[0], *words])
    fed = [type(r)(r.id, Path(f"{r.id}.wav"), 1.0, r.words, meta=r.meta) for r in recs]
    rows = fake_decode(monkeypatch, fed, hyps.__getitem__, [WerScorer(), CueScorer(), TailScorer(tail)])[0][m.GREEDY]
    plain = fake_decode(monkeypatch, fed, hyps.__getitem__, [WerScorer(), CueScorer()])[0][m.GREEDY]
    counted = []
    for rec, row, before in zip(recs, rows, plain, strict=True):
        expected = tail_counts(rec.text, hyps[rec.id], tail)
        assert (row["tail_words"], row["tail_errors"]) == (expected.words, expected.errors)
        assert {k: v for k, v in row.items() if k not in m.TAIL_COLUMNS} == before
        assert not set(m.TAIL_COLUMNS) & set(before)
        counted.append(expected)
    together = sum(counted[1:], counted[0])
    assert together.words and together.substitutions and together.insertions  # each kind of error was made


def test_evaluate_with_a_tail_set_adds_columns_metrics_and_tag_and_nothing_else(
        corpus: Path, tmp_path: Path) -> None:
    from asr_core.evaluation import evaluate as ev
    from asr_core.runtime.outbox import Outbox

    ckpt = _checkpoint(tmp_path)
    texts = {r.id: r.text for r in load_corpus(f"podcast:{corpus}", audio=False)}
    tail = tail_set(list(texts.values()), 0.3, source="the references").write(tmp_path / "tail.json")
    data = [f"test=podcast:{corpus}"]

    def run(out: str, tail_file: Path | None) -> tuple[pd.DataFrame, dict[str, float], dict[str, str]]:
        box = Outbox(tmp_path / out / "trial", run_id="run-1")
        df = ev.evaluate(ev.EvaluationRun(ckpt, data, [10.0], stride=1.0, tail=tail_file),
                         ev.Destination(out_dir=tmp_path / out / "eval", outbox=box))
        return (df, *_outbox(box))

    df, metrics, tags = run("a", tail)
    table = pd.read_csv(tmp_path / "a" / "eval" / "test.csv", dtype={"recording": str})
    assert list(table.columns) == [*ev.CSV_COLUMNS, *m.TAIL_COLUMNS] == list(df.columns)
    tail_words = TailSet.read(tail)
    hyps = [json.loads(line) for line in (tmp_path / "a" / "eval" / "test.hyp.jsonl").read_text().splitlines()]
    assert len(hyps) == len(table) == 2 * len(texts)
    for h, row in zip(hyps, table.itertuples()):
        expected = tail_counts(texts[h["recording"]], h["hyp"], tail_words)
        assert (row.recording, row.condition) == (h["recording"], h["condition"])
        assert (row.tail_words, row.tail_errors) == (expected.words, expected.errors)
    for cond, snr in (("clean", None), ("snr10", 10.0)):
        part = [tail_counts(texts[h["recording"]], h["hyp"], tail_words) for h in hyps if h["condition"] == cond]
        assert metrics[m.tail_metric_key("test", snr)] == pytest.approx(corpus_tail_rate(part))
    assert {k for k in metrics if m.parse_tail_metric_key(k)} == {"tail/test", "tail/test/snr10"}
    assert json.loads(tags[m.TAIL_TAG]) == {
        "source": "the references", "share": 0.3, "types": len(tail_words), "share_of_text": tail_words.tail_share,
        "unseen": tail_words.unseen, "share_of_refs": {"test": pytest.approx(share_of(list(texts.values()), tail_words))}}

    # without a tail set: the tables are what they were, byte for byte, with no tail column, metric or tag
    df0, metrics0, tags0 = run("b", None)
    a_lines = (tmp_path / "a" / "eval" / "test.csv").read_text().splitlines()
    b_text = (tmp_path / "b" / "eval" / "test.csv").read_bytes()
    assert "\n".join(line.rsplit(",", 2)[0] for line in a_lines).encode() + b"\n" == b_text
    assert b"tail" not in b_text and list(df0.columns) == ev.CSV_COLUMNS
    pd.testing.assert_frame_equal(df.drop(columns=list(m.TAIL_COLUMNS)), df0)
    assert {k: v for k, v in metrics.items() if not k.startswith("tail/")} == metrics0
    assert m.TAIL_TAG not in tags0 and {k: v for k, v in tags.items() if k != m.TAIL_TAG} == tags0
    assert (tmp_path / "a" / "eval" / "test.hyp.jsonl").read_bytes() == \
        (tmp_path / "b" / "eval" / "test.hyp.jsonl").read_bytes()


def test_a_beam_decoder_logs_its_own_tail_rate(corpus: Path, tmp_path: Path) -> None:
    from asr_core.evaluation import evaluate as ev
    from asr_core.evaluation.decoders import beam_decoding
    from asr_core.runtime.outbox import Outbox

    ckpt = _checkpoint(tmp_path)
    texts = {r.id: r.text for r in load_corpus(f"podcast:{corpus}", audio=False)}
    tail = tail_set(list(texts.values()), 0.3, source="refs")
    box = Outbox(tmp_path / "trial", run_id="run-1")
    ev.evaluate(ev.EvaluationRun(ckpt, [f"test=podcast:{corpus}"], stride=1.0, beam=beam_decoding("beam", beam_width=2),
                                 tail=tail.write(tmp_path / "tail.json")),
                ev.Destination(out_dir=tmp_path / "eval", outbox=box))
    metrics, tags = _outbox(box)
    hyps = [json.loads(line) for line in (tmp_path / "eval" / "test.hyp.jsonl").read_text().splitlines()]
    table = pd.read_csv(tmp_path / "eval" / "test.beam.csv", dtype={"recording": str})
    assert list(table[list(m.TAIL_COLUMNS)].itertuples(index=False, name=None)) == [
        (c.words, c.errors) for c in (tail_counts(texts[h["recording"]], h["hyp_beam"], tail) for h in hyps)]
    part = [tail_counts(texts[h["recording"]], h["hyp_beam"], tail) for h in hyps]
    # only the beam's rates are logged (the greedy ones are the trial's own); the greedy table has the columns too
    assert {k for k in metrics if m.parse_tail_metric_key(k)} == {"tail_beam/test"}
    assert metrics["tail_beam/test"] == pytest.approx(corpus_tail_rate(part))
    assert list(pd.read_csv(tmp_path / "eval" / "test.csv").columns)[-2:] == list(m.TAIL_COLUMNS)
    assert m.TAIL_TAG in tags and m.decoder_tag("beam") in tags


def test_evaluate_refuses_a_missing_or_malformed_tail_set_before_any_work(
        corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asr_core.config import EvalConfig
    from asr_core.config.parse import ConfigError
    from asr_core.evaluation import evaluate as ev

    ckpt = _checkpoint(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"words": "fig"}))
    data = [f"test=podcast:{corpus}"]
    for tail_file, message in ((tmp_path / "none.json", "not found"), (bad, "is not a tail set"),
                               (tmp_path, "is a folder")):
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            ev.evaluate(ev.EvaluationRun(ckpt, data, tail=tail_file), ev.Destination(out_dir=tmp_path / "out"))
        assert not (tmp_path / "out").exists()
        assert main(["evaluate", str(ckpt), "--data", data[0], "--tail", str(tail_file), "--no-log", "--out",
                     str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert f"evaluate: tail set (--tail, eval.tail) {tail_file}" in err and message in err, err
        assert not (tmp_path / "out").exists()
    # eval.tail reaches the evaluation as --tail does; "" is none
    assert ev.EvaluationRun.of(ckpt, EvalConfig(tail=str(bad))).tail == bad
    assert ev.EvaluationRun.of(ckpt, EvalConfig()).tail is None
    with pytest.raises(ConfigError, match="eval.tail"):
        EvalConfig(tail=3)  # type: ignore[arg-type]


# ---- score ---------------------------------------------------------------------------------------------------------

REFS = {"r1": "The cat sat on the fig mat with kiwi.", "r2": "Plum plum and lime, the cat said.", "r3": "fig fig"}
HYPS = {"r1": "the cat sat on the fog mat with kiwi lime", "r2": "plum and line the cat said"}  # r3: missing


@pytest.fixture
def scored(tmp_path: Path) -> dict:
    ref = tmp_path / "ref" / "test.jsonl"
    ref.parent.mkdir()
    ref.write_text("".join(json.dumps({"id": i, "audio": f"audio/{i}.wav", "text": t}) + "\n" for i, t in REFS.items()))
    hyp = tmp_path / "sys"
    hyp.mkdir()
    for i, t in HYPS.items():
        (hyp / f"{i}.txt").write_text(t)
    tail = TailSet(frozenset({"fig", "kiwi", "lime", "plum"}), "hand", 0.25, 20, 0.25).write(tmp_path / "tail.json")
    return {"args": ["score", "--ref", f"test=manifest:{ref}", "--hyp", str(hyp), "--system", "sys"], "tail": tail,
            "tmp": tmp_path}


def test_score_with_a_tail_set_adds_the_columns_and_prints_the_rate(scored: dict,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from asr_core.evaluation.evaluate import CSV_COLUMNS

    tail = TailSet.read(scored["tail"])
    out = scored["tmp"] / "out"
    assert main([*scored["args"], "--out", str(out), "--tail", str(scored["tail"])]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out / "test.csv", dtype={"recording": str})
    assert list(table.columns) == [*CSV_COLUMNS, *m.TAIL_COLUMNS]
    counts = {i: tail_counts(t, HYPS.get(i, ""), tail) for i, t in REFS.items()}
    # r1: fig->fog (S), lime inserted (I); r2: one plum deleted (D), lime->line (S); r3: both figs deleted
    assert {i: (c.words, c.substitutions, c.deletions, c.insertions) for i, c in counts.items()} == {
        "r1": (2, 1, 0, 1), "r2": (3, 1, 1, 0), "r3": (2, 0, 2, 0)}
    assert table.set_index("recording")[list(m.TAIL_COLUMNS)].to_dict("index") == {
        i: {"tail_words": c.words, "tail_errors": c.errors} for i, c in counts.items()}
    rate = corpus_tail_rate(counts.values())
    assert rate == pytest.approx(100 * 6 / 7)
    header, line = [s.split() for s in printed.strip().splitlines()[:2]]
    assert header[-3:] == ["tail_words", "tail_errors", "tail"] and line[-3:] == ["7", "6", f"{rate:.2f}"]
    # without --tail: evaluate's columns only, and no tail in the summary
    plain = scored["tmp"] / "plain"
    assert main([*scored["args"], "--out", str(plain)]) == 0
    assert "tail" not in capsys.readouterr().out and "tail" not in (plain / "test.csv").read_text()
    assert pd.read_csv(plain / "test.csv").equals(pd.read_csv(out / "test.csv")[CSV_COLUMNS])


def test_score_records_the_tail_rate_and_tag(scored: dict, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import mlflow

    monkeypatch.chdir(scored["tmp"])  # the sqlite store keeps artifacts under ./mlruns
    uri = f"sqlite:///{scored['tmp'] / 'mlflow.db'}"
    assert main([*scored["args"], "--tail", str(scored["tail"]), "--tracking-uri", uri, "--sweep", "s"]) == 0
    run = mlflow.MlflowClient(uri).search_runs([mlflow.MlflowClient(uri).get_experiment_by_name("s").experiment_id])[0]
    assert run.data.metrics["tail/test"] == pytest.approx(100 * 6 / 7)
    tag = json.loads(run.data.tags[m.TAIL_TAG])
    assert tag["source"] == "hand" and tag["types"] == 4 and tag["share_of_text"] == 0.25
    assert tag["share_of_refs"]["test"] == pytest.approx(7 / 18)  # tail words of the 18 reference words
    capsys.readouterr()


@pytest.mark.parametrize("content,message", [(None, "not found"), ("[1, 2]", "is not a tail set"),
                                             ("{not json", "is not a tail set")])
def test_score_refuses_a_bad_tail_set(scored: dict, content: str | None, message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = scored["tmp"] / "given.json"
    if content is not None:
        path.write_text(content)
    out = scored["tmp"] / "out"
    assert main([*scored["args"], "--out", str(out), "--tail", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("score: ") and str(path) in err and message in err, err
    assert not out.exists()


# ---- the metric's name -----------------------------------------------------------------------------------------------

def test_the_tail_metric_key_round_trips() -> None:
    for decoder in (m.GREEDY, "beam", "beam-lm64"):
        for snr in (None, -5.0, 10.0):
            dec, ds, cond, s = m.parse_tail_metric_key(m.tail_metric_key("rev16", snr, decoder))
            assert (dec, ds, cond) == (decoder, "rev16", m.condition_name(snr))
            assert math.isnan(s) if snr is None else s == snr
    assert m.tail_metric_key("rev16", 10.0) == "tail/rev16/snr10"
    assert m.parse_tail_metric_key("wer/rev16") is None and m.parse_decoder_metric_key("tail/rev16") is None
