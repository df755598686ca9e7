"""``python -m asr_core repeats``: key-term occurrences classified as first mentions or repeats by distance, scored
against hand-written hypotheses on a tiny podcast-format corpus, the summary, the tables and the bad inputs."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from asr_core.__main__ import main
from asr_core.data.audio import save_audio
from asr_core.data.corpora import Word, load_corpus
from asr_core.data.corpora.podcast import write
from asr_core.probes.repeats import (BINS, FIRST, OCCURRENCE_COLUMNS, REPEAT, SUMMARY_COLUMNS, distance_bin,
                                     measure, occurrences)

# recording a: key terms drone, queen (index: text, start, end)
A_WORDS = [("the", 0.0, 0.3), ("drone", 0.4, 0.9), ("is", 1.0, 1.2), ("queen", 2.0, 2.5),  # firsts at 1, 3
           ("drone", 3.9, 4.4),  # repeat 3.0 s after drone@1 -> 0-5
           ("flew", 5.0, 5.3), ("drone", 12.4, 12.9),  # repeat 8.0 s -> 5-10
           ("queen", 30.0, 30.5),  # repeat 27.5 s -> 20-40
           ("the", 31.0, 31.2), ("queen", 130.5, 131.0),  # repeat 100.0 s -> 80+
           ("drone", 140.0, 140.5)]  # repeat 127.1 s -> 80+
# recording b: key term colony
B_WORDS = [("colony", 0.0, 0.5), ("and", 1.0, 1.2), ("colony", 15.5, 16.0),  # repeat 15.0 s -> 10-20
           ("then", 20.0, 20.3), ("colony", 60.0, 60.5)]  # repeat 44.0 s -> 40-80
# recording c: has metadata without key terms (not scored)
C_WORDS = [("hello", 0.0, 0.5), ("drone", 1.0, 1.5)]

EXPECTED_A = [(1, FIRST, None, FIRST), (3, FIRST, None, FIRST), (4, REPEAT, 3.0, "0-5"), (6, REPEAT, 8.0, "5-10"),
              (7, REPEAT, 27.5, "20-40"), (9, REPEAT, 100.0, "80+"), (10, REPEAT, 127.1, "80+")]
EXPECTED_B = [(0, FIRST, None, FIRST), (2, REPEAT, 15.0, "10-20"), (4, REPEAT, 44.0, "40-80")]


def _recording(split: Path, rid: str, words: list[tuple[str, float, float]], meta: dict | None) -> None:
    write(split / f"{rid}.json", [Word(t, s, e) for t, s, e in words])
    save_audio(split / f"{rid}.wav", np.zeros(1600, dtype=np.float32))
    if meta is not None:
        path = split.parent / "meta" / f"{rid}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(meta))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    split = tmp_path / "corpus" / "test"
    _recording(split, "rec-a", A_WORDS, {"topic": "bees", "key_terms": ["drone", "queen", "hive"]})
    _recording(split, "rec-b", B_WORDS, {"topic": "bees", "key_terms": ["colony"]})
    _recording(split, "rec-c", C_WORDS, {"topic": "bees"})
    return split


def _hyps(trial: Path, hyps: dict[str, str], config: dict | None = None) -> Path:
    path = trial / "eval" / "test.hyp.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for rid, text in hyps.items():
        lines.append({"recording": rid, "condition": "clean", "ref": "", "hyp": text})
        lines.append({"recording": rid, "condition": "snr10", "ref": "", "hyp": "nothing right here"})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    if config is not None:
        (trial / "config.json").write_text(json.dumps(config))
    return path


A_REF = " ".join(w for w, _, _ in A_WORDS)
B_REF = " ".join(w for w, _, _ in B_WORDS)
# model one: drone@6 substituted, queen@9 deleted; model two: the first drone and the first colony wrong
ONE = {"rec-a": "the drone is queen drone flew throne queen the drone", "rec-b": B_REF, "rec-c": "hello drone"}
TWO = {"rec-a": A_REF.replace("the drone", "the throne", 1), "rec-b": "colonel and colony then colony"}


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path]:
    one = _hyps(tmp_path / "trials" / "aaa111", ONE, {"data": {"context_s": 10.24}, "train": {"seed": 3},
                                                       "model": {}, "eval": {}})
    two = _hyps(tmp_path / "trials" / "bbb222", TWO)  # no config.json
    return one, two


def test_occurrences_classified_with_distances(corpus: Path) -> None:
    recs = {r.id: r for r in load_corpus(f"podcast:{corpus}", audio=False)}
    for rid, terms, expected in (("rec-a", ["drone", "queen", "hive"], EXPECTED_A), ("rec-b", ["colony"], EXPECTED_B)):
        got = occurrences(recs[rid], terms)
        assert [(o.index, o.kind, o.distance_s, o.bin) for o in got] == expected
        assert all(o.recording == rid and recs[rid].words[o.index].text == o.term for o in got)


def test_distance_bins() -> None:
    assert [b[0] for b in BINS] == ["0-5", "5-10", "10-20", "20-40", "40-80", "80+"]
    assert [distance_bin(d) for d in (-0.2, 0.0, 4.999, 5.0, 10.0, 19.9, 20.0, 40.0, 79.9, 80.0, 1e6)] == \
        ["0-5", "0-5", "0-5", "5-10", "10-20", "10-20", "20-40", "40-80", "40-80", "80+", "80+"]


def test_scores_and_summary(corpus: Path, models: tuple[Path, Path]) -> None:
    rows, summary = measure(f"test=podcast:{corpus}", list(models))
    one = [r for r in rows if r["model"] == "aaa111"]
    two = [r for r in rows if r["model"] == "bbb222"]
    assert [(r["recording"], r["index"], r["kind"], r["distance_s"], r["bin"]) for r in one] == \
        [("rec-a", *e) for e in EXPECTED_A] + [("rec-b", *e) for e in EXPECTED_B]
    assert [(r["recording"], r["index"]) for r in one if not r["correct"]] == [("rec-a", 6), ("rec-a", 9)]
    assert {(r["index"], r["hyp"]) for r in one if not r["correct"]} == {(6, "throne"), (9, "")}
    assert [(r["recording"], r["index"]) for r in two if not r["correct"]] == [("rec-a", 1), ("rec-b", 0)]
    assert {r["context_s"] for r in one} == {10.24} and {r["seed"] for r in one} == {3}
    assert all(math.isnan(r["context_s"]) and r["seed"] is None for r in two)
    assert all(r["dataset"] == "test" for r in rows)

    table = {(s["model"], s["bin"]): (s["n"], s["errors"], s["error_pct"]) for s in summary}
    assert [s["bin"] for s in summary if s["model"] == "aaa111"] == [FIRST, "0-5", "5-10", "10-20", "20-40",
                                                                     "40-80", "80+"]
    assert table[("aaa111", FIRST)] == (3, 0, 0.0)
    assert table[("aaa111", "5-10")] == (1, 1, 100.0)
    assert table[("aaa111", "80+")] == (2, 1, 50.0)
    assert table[("aaa111", "20-40")] == (1, 0, 0.0)
    assert table[("bbb222", FIRST)] == (3, 2, 66.67)
    assert all(table[("bbb222", b[0])][1] == 0 for b in BINS)


def test_cli_prints_and_writes_tables(corpus: Path, models: tuple[Path, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["repeats", *map(str, models), "--data", f"test=podcast:{corpus}", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "error %" in printed and "10.24s" in printed
    assert any(line.split()[:6] == ["aaa111", "10.24s", "3", "80+", "2", "50.0"] for line in printed.splitlines())
    with open(out / "repeats.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == OCCURRENCE_COLUMNS
        occ = list(reader)
    assert len(occ) == 2 * (len(EXPECTED_A) + len(EXPECTED_B))
    assert {r["seed"] for r in occ if r["model"] == "bbb222"} == {""}
    assert {r["context_s"] for r in occ if r["model"] == "bbb222"} == {""}
    with open(out / "summary.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == SUMMARY_COLUMNS
        summ = list(reader)
    assert len(summ) == 2 * (1 + len(BINS))
    first = next(r for r in summ if r["model"] == "bbb222" and r["bin"] == FIRST)
    assert (first["n"], first["errors"], first["error_pct"]) == ("3", "2", "66.67")


def test_dataset_without_meta_exits_2(tmp_path: Path, models: tuple[Path, Path],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    split = tmp_path / "bare" / "test"
    _recording(split, "rec-a", A_WORDS, None)
    assert main(["repeats", str(models[0]), "--data", f"test=podcast:{split}"]) == 2
    err = capsys.readouterr().err
    assert "key_terms" in err and "dataset test" in err and "Traceback" not in err


def test_missing_hyps_exits_2(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "trials" / "zzz" / "eval" / "test.hyp.jsonl"
    assert main(["repeats", str(missing), "--data", f"test=podcast:{corpus}"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "not found" in err


@pytest.mark.parametrize("content, words", [
    ('{"recording": "rec-a", "condition": "clean", "hyp": "x"}\n{not json\n', ":2: not valid JSON"),
    ('{"recording": "rec-a", "hyp": "x"}\n', ":1: a row needs the keys"),
    ('{"recording": "rec-a", "condition": "snr10", "hyp": "x"}\n', "no rows of condition 'clean'"),
    ('{"recording": "other", "condition": "clean", "hyp": "x"}\n', "not in dataset test"),
])
def test_bad_hyps_exit_2(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                         words: str) -> None:
    path = tmp_path / "trials" / "ccc" / "eval" / "test.hyp.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert main(["repeats", str(path), "--data", f"test=podcast:{corpus}"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and words in err


def test_bad_data_spec_exits_2(models: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["repeats", str(models[0]), "--data", "podcast:/nowhere"]) == 2
    assert "NAME=FORMAT:PATH" in capsys.readouterr().err
