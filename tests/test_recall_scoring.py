"""Scoring the recall plant's slots (:mod:`asr_core.evaluation.scorers.slots`): per slot, the aligned hypothesis word against
the code word; the per-slot table and ``recall/`` metrics of ``evaluate``; nothing new for datasets without the
plant."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import asr_core.data.synth.cli as synth_cli
from asr_core.contract import metrics as m
from asr_core.contract.specs import CorpusError
from asr_core.data.corpora import load_corpus
from asr_core.data.corpora.base import Recording, Word
from asr_core.data.synth.recall import CODE_WORDS
from asr_core.data.synth.text import vocabulary
from asr_core.evaluation.scorers.slots import group_of as rc_group
from asr_core.evaluation.scorers.slots import (Slot, aligned_words, group_accuracy, marked_reference, merge_slot_tables,
                                        recall_metrics, recall_slots, slot_rows, slot_table, write_slot_table)
from asr_core.scoring.score import marked_counts

torch.set_num_threads(1)


# ---- by hand -------------------------------------------------------------------------------------------------------

WORDS = ("the code word is zebra then some talk remember the code word zebra more talk remember the code word "
         "zebra and remember the code word zebra end").split()
SLOTS = (Slot("r/0", 12, "zebra", "near", "masked", 2.5, 0.0, 1.0),
         Slot("r/1", 17, "zebra", "far", "masked", 30.0, 0.0, 1.0),
         Slot("r/2", 22, "zebra", "far", "unmasked", 41.0, 0.0, 1.0),
         Slot("r/3", 4, "zebra", "near", "no-key", None, 0.0, 1.0))  # a made-up index: any word may be a slot's


def test_aligned_words_by_hand() -> None:
    ref = "a b c d e".split()
    assert aligned_words(ref, "a x c e".split(), range(5)) == {0: "a", 1: "x", 2: "c", 3: "", 4: "e"}
    assert aligned_words(ref, "a b y c d e".split(), [2, 3]) == {2: "c", 3: "d"}  # an insertion is nobody's
    assert aligned_words(ref, [], [1]) == {1: ""}
    with pytest.raises(ValueError, match=r"indices \[5\] are outside the reference's 5 words"):
        aligned_words(ref, ref, [5])


def test_each_slot_is_scored_by_its_aligned_word() -> None:
    """Slot 0 right, slot 1 substituted (another code word), slot 2 deleted, slot 3 right; other words changed too."""
    hyp = list(WORDS)
    hyp[17] = "walrus"
    del hyp[22]
    hyp[6] = "tock"
    hyp.insert(0, "um")
    ref = marked_reference(WORDS, SLOTS)
    rows = slot_rows(ref, " ".join(hyp).upper(), "r", "snr10", extra={"key": "swap"}, scoring="window")
    assert [tuple(r[c] for c in m.SLOT_COLUMNS[:11]) for r in rows] == [
        ("r", "snr10", 10.0, "r/0", "zebra", "near", "masked", 2.5, "zebra", 1, "window"),
        ("r", "snr10", 10.0, "r/1", "zebra", "far", "masked", 30.0, "walrus", 0, "window"),
        ("r", "snr10", 10.0, "r/2", "zebra", "far", "unmasked", 41.0, "", 0, "window"),
        ("r", "snr10", 10.0, "r/3", "zebra", "near", "no-key", None, "zebra", 1, "window")]
    assert all(r["key"] == "swap" for r in rows) and slot_rows(ref, "", "r")[0]["scoring"] == "average"
    # wrong exactly where the marked-word count (the cue words' scoring) counts an error
    assert marked_counts(list(ref.words), " ".join(hyp).split(), ref.positions).errors == 2
    assert slot_rows(ref, "", "r")[0]["hyp"] == "" and not any(r["correct"] for r in slot_rows(ref, "", "r"))
    assert slot_rows(ref, "", "r")[0]["snr_db"] is None and slot_rows(ref, "", "r")[0]["condition"] == m.CLEAN


def test_group_accuracy_and_metrics_count_the_clean_condition_only() -> None:
    rows = [{"condition": c, "band": b, "kind": k, "correct": ok} for c, b, k, ok in (
        ("clean", "near", "masked", 1), ("clean", "near", "masked", 1), ("clean", "near", "masked", 0),
        ("clean", "far", "masked", 0), ("clean", "far", "masked", 1), ("clean", "far", "unmasked", 1),
        ("clean", "near", "no-key", 0), ("snr10", "far", "masked", 1), ("snr10", "far", "masked", 1))]
    assert group_accuracy(rows) == {"near": (2, 3), "far": (1, 2), "unmasked": (1, 1), "no-key": (0, 1)}
    assert group_accuracy(rows, "snr10") == {"far": (2, 2)}
    assert recall_metrics("syn", rows) == pytest.approx({"recall/syn/near": 200 / 3, "recall/syn/far": 50.0,
                                                         "recall/syn/unmasked": 100.0, "recall/syn/no-key": 0.0})
    assert set(recall_metrics("syn", rows, "beam")) == {f"recall_beam/syn/{g}" for g in m.RECALL_GROUPS}
    assert recall_metrics("syn", rows[7:]) == {}


def test_metric_keys_and_table_names_round_trip() -> None:
    for ds in ("test", "synth-recall", "a/b.c"):
        for dec in (m.GREEDY, "beam", "beam-lm64"):
            for g in m.RECALL_GROUPS:
                assert m.parse_recall_metric_key(m.recall_metric_key(ds, g, dec)) == (dec, ds, g)
                assert m.parse_cue_metric_key(m.recall_metric_key(ds, g, dec)) is None
                assert m.parse_decoder_metric_key(m.recall_metric_key(ds, g, dec)) is None
    assert m.recall_metric_key("syn", "far") == "recall/syn/far"
    assert m.parse_recall_metric_key("recall_greedy/syn/far") is None and m.parse_recall_metric_key("wer/syn") is None
    assert m.slot_table_file("syn") == "syn.slots.csv" and m.slot_table_file("syn", "beam") == "syn.beam.slots.csv"
    with pytest.raises(ValueError, match="recall group 'mid'"):
        m.recall_metric_key("syn", "mid")


def test_slot_tables_merge_by_condition_slot_and_scoring(tmp_path: Path) -> None:
    ref = marked_reference(WORDS, SLOTS)
    old = write_slot_table(tmp_path / "old.csv", slot_rows(ref, "", "r") + slot_rows(ref, "", "r", "snr10"))
    new = write_slot_table(tmp_path / "new.csv", slot_rows(ref, " ".join(WORDS), "r")
                           + slot_rows(ref, " ".join(WORDS), "r", scoring="window"))
    assert merge_slot_tables(new, [old, tmp_path / "missing.csv"]) == 4
    t = pd.read_csv(new)
    assert list(t.columns) == list(m.SLOT_COLUMNS) and len(t) == 12
    clean = t[t.condition == "clean"]
    assert clean.correct.tolist() == [1] * 8 and sorted(set(clean.scoring)) == ["average", "window"]
    assert t[t.condition == "snr10"].correct.sum() == 0
    # a table written before the scoring column holds moving-window rows: its clean rows are measured already
    legacy = tmp_path / "legacy.csv"
    write_slot_table(legacy, slot_rows(ref, "", "r") + slot_rows(ref, "", "r", "snr20"), m.SLOT_COLUMNS[:10])
    assert merge_slot_tables(new, [legacy]) == 4 and len(pd.read_csv(new)) == 16


def test_recall_slots_reads_the_metadata_and_refuses_a_mismatch(tmp_path: Path) -> None:
    (tmp_path / "test").mkdir()
    (tmp_path / "meta").mkdir()
    words = tuple(Word(w, float(i), i + 0.5) for i, w in enumerate(WORDS))
    rec, other = (Recording(i, tmp_path / "test" / f"{i}.wav", 30.0, words,
                            meta={"transcript": str(tmp_path / "test" / f"{i}.json")}) for i in ("r", "q"))
    assert recall_slots([rec, other]) is None
    (tmp_path / "meta" / "q.json").write_text(json.dumps({"topic": "x"}))
    assert recall_slots([rec, other]) is None  # metadata without the plant
    entry = {"slot": "r/0", "index": 12, "word": "zebra", "start": 8.0, "end": 12.5, "distance_s": 2.5,
             "band": "near", "kind": "masked"}
    (tmp_path / "meta" / "r.json").write_text(json.dumps({"recall_slots": [entry]}))
    assert recall_slots([rec, other]) == {"r": (Slot("r/0", 12, "zebra", "near", "masked", 2.5, 8.0, 12.5),),
                                          "q": ()}
    (tmp_path / "meta" / "r.json").write_text(json.dumps({"recall_slots": [{**entry, "index": 13}]}))
    with pytest.raises(CorpusError, match=r"r\.json: recall slot .* does not match"):
        recall_slots([rec])


# ---- a corpus with the plant on disk, read back by evaluate --------------------------------------------------------

@pytest.fixture(scope="module")
def recall_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small test split with the recall plant (real espeak-ng), made by the command line."""
    out = tmp_path_factory.mktemp("recall") / "corpus"
    with contextlib.redirect_stdout(io.StringIO()):
        assert synth_cli.cli(["--out", str(out), "--hours", "0.01", "--eval-hours", "0.022", "--min-minutes", "0.6",
                          "--max-minutes", "0.75", "--splits", "test", "--seed", "4", "--recall", "5",
                          "--jobs", "2"]) == 0
    return out / "test"


def test_evaluate_scores_exactly_the_planted_slots(recall_corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate's own decoding loop, fed hypotheses: the reference with every other slot's code word swapped for
    another code word scores exactly those slots wrong and the rest right."""
    from asr_core.evaluation.scorers.base import WerScorer
    from tests.plugins.fake_decoding import fake_decode

    recs = list(load_corpus(f"podcast:{recall_corpus}", audio=False))
    slots = recall_slots(recs)
    assert slots is not None and sum(map(len, slots.values())) >= 2
    hyps, wrong = {}, set()
    for rec in recs:
        words = [w.text for w in rec.words]
        for k, s in enumerate(slots[rec.id]):
            if k % 2:
                words[s.index] = "walrus" if s.word != "walrus" else "zebra"
                wrong.add(s.slot)
        hyps[rec.id] = " ".join(words)
    fed = [Recording(r.id, Path(f"{r.id}.wav"), 1.0, r.words, meta=r.meta) for r in recs]
    _, decoded = fake_decode(monkeypatch, fed, hyps.__getitem__, [WerScorer()])
    rows = slot_table(fed, decoded, slots)
    assert sorted(r["slot"] for r in rows) == sorted(s.slot for ss in slots.values() for s in ss)
    assert {r["slot"] for r in rows if not r["correct"]} == wrong
    assert all(r["hyp"] == ("walrus" if r["word"] != "walrus" else "zebra") for r in rows if not r["correct"])


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


def _logged(box) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in box.path.read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "metrics":
            out.update(rec["metrics"])
    return out


def test_evaluate_writes_the_slot_table_and_metrics_and_nothing_new_without_the_plant(
        recall_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from asr_core.evaluation import evaluate as ev
    from asr_core.runtime.outbox import Outbox

    ckpt = _checkpoint(tmp_path)
    plain = tmp_path / "plain" / "test"
    plain.mkdir(parents=True)
    for f in sorted(recall_corpus.iterdir())[:2]:  # one recording of the split, without the metadata beside it
        shutil.copy(f, plain / f.name)
    data = [f"rec=podcast:{recall_corpus}", f"plain=podcast:{plain}"]

    def run(out: str) -> tuple[pd.DataFrame, dict[str, float]]:
        box = Outbox(tmp_path / out / "trial", run_id="run-1")
        df = ev.evaluate(ev.EvaluationRun(ckpt, data, [10.0], stride=1.0, noisy=["rec"]),
                         ev.Destination(out_dir=tmp_path / out / "eval", outbox=box))
        return df, _logged(box)

    df, logged = run("a")
    slots = recall_slots(load_corpus(f"podcast:{recall_corpus}", audio=False))
    assert slots is not None
    table = pd.read_csv(tmp_path / "a" / "eval" / "rec.slots.csv", dtype={"recording": str, "hyp": str})
    assert list(table.columns) == list(m.SLOT_COLUMNS)
    n = sum(map(len, slots.values()))
    # the moving-window rows of both conditions, and one single-window row per slot on clean audio
    assert len(table) == 3 * n and set(table.condition) == {"clean", "snr10"}
    assert table.groupby(["condition", "scoring"]).size().to_dict() == {("clean", "average"): n,
                                                                        ("clean", "window"): n, ("snr10", "average"): n}
    assert sorted(table[table.condition == "clean"].slot) == sorted(2 * [s.slot for ss in slots.values() for s in ss])
    assert set(table.correct) <= {0, 1}
    clean = table[(table.condition == "clean") & (table.scoring == "average")].to_dict("records")
    expected = recall_metrics("rec", clean)
    assert expected and {k: v for k, v in logged.items() if k.startswith("recall")} == pytest.approx(expected)
    assert not (tmp_path / "a" / "eval" / "plain.slots.csv").exists()
    assert not any("plain" in k for k in logged if k.startswith("recall"))
    # without the slot scoring (the code before it), every per-recording table is the same, byte for byte
    from asr_core.evaluation.scorers import recall as recall_scorer

    monkeypatch.setattr(recall_scorer, "recall_slots", lambda recs: None)  # the scorer binds to no dataset
    df0, logged0 = run("b")
    for name in ("rec.csv", "plain.csv"):
        assert (tmp_path / "a" / "eval" / name).read_bytes() == (tmp_path / "b" / "eval" / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "b" / "eval").glob("*.csv")) == ["plain.csv", "rec.csv"]
    assert {k: v for k, v in logged.items() if not k.startswith("recall")} == logged0
    pd.testing.assert_frame_equal(df, df0)


# ---- single-window scoring (python -m asr_core recall) -------------------------------------------------------------

def test_slot_window_and_its_words() -> None:
    from asr_core.evaluation.scorers.slot_window import slot_window, window_words

    assert slot_window(12.345, 256, 5000, 100.0) == (1235 - 256, 1235)
    assert slot_window(1.0, 256, 5000, 100.0) == (0, 100)  # the recording starts later: a shorter window
    assert slot_window(49.999, 256, 4000, 100.0) == (4000 - 256, 4000)  # not past the recording's end
    words = [Word("a", 0.0, 0.5), Word("b", 0.9, 1.4), Word("c", 1.5, 2.0), Word("d", 2.0, 2.6), Word("e")]
    assert window_words(words, 1.0, 2.6) == [2, 3]  # b is cut by the window's start; e has no times


def test_each_slot_is_scored_from_its_own_window(recall_corpus: Path) -> None:
    """A stand-in model that writes the index of its window's first frame, and a tokenizer that turns it into the
    words lying inside that window, with every other slot's code word swapped: exactly those are wrong."""
    from asr_core.evaluation.scorers.slot_window import RIGHT_S, WindowModel, score_recording, slot_window, window_words

    recs = list(load_corpus(f"podcast:{recall_corpus}", audio=False))
    slots = recall_slots(recs)
    assert slots is not None
    rec = max(recs, key=lambda r: len(slots[r.id]))
    fps, window = 100.0, 512
    frames = int(rec.duration * fps) + 1
    features = torch.arange(frames, dtype=torch.float32)[:, None].repeat(1, 4)  # a frame's features: its index

    def model(batch: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.zeros(len(batch), 1, frames + 1)
        for i in range(len(batch)):
            logits[i, 0, int(batch[i, 0, 0])] = 1.0
        return logits, torch.ones(len(batch), dtype=torch.long)

    texts, wrong = {}, set()
    for k, s in enumerate(slots[rec.id]):
        a, e = slot_window(s.end + RIGHT_S, window, frames, fps)  # the window holds a second after the code word
        assert abs(e - min(frames, (s.end + RIGHT_S) * fps)) <= 1 and RIGHT_S == 1.0
        inside = window_words(rec.words, a / fps, e / fps)
        words = [rec.words[i].text if i != s.index or k % 2 == 0 else "gecko" if s.word != "gecko" else "banjo"
                 for i in inside]
        texts[a] = " ".join(words)
        wrong |= {s.slot} if k % 2 else set()
    tokenizer = SimpleNamespace(blank_id=frames, decode=lambda ids: texts[ids[0]])
    rows = score_recording(WindowModel(model, window, fps, tokenizer, batch_windows=3), features, rec, slots[rec.id])
    assert [r["slot"] for r in rows] == [s.slot for s in slots[rec.id]] and len(rows) >= 2
    assert {r["slot"] for r in rows if not r["correct"]} == wrong
    assert {r["scoring"] for r in rows} == {"window"} and {r["condition"] for r in rows} == {"clean"}


def test_recall_command_writes_the_table(recall_corpus: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from asr_core.probes import recall as probe
    from asr_core.probes import recall_args

    ckpt = _checkpoint(tmp_path)
    assert recall_args.cli([str(ckpt), "--data", f"rec=podcast:{recall_corpus}", "--device", "cpu", "--out",
                      str(tmp_path / "out"), "--key", "as-is,swap,silence"]) == 0
    table = pd.read_csv(tmp_path / "out" / "rec.slots.csv", dtype={"recording": str, "hyp": str, "swap_word": str},
                        keep_default_na=False)
    assert list(table.columns) == [*m.SLOT_COLUMNS, "key", "swap_word", "followed", "followed_choice"]
    assert set(table.scoring) == {"window"} and set(table.key) == {"as-is", "swap", "silence"}
    slots = recall_slots(load_corpus(f"podcast:{recall_corpus}", audio=False))
    assert slots is not None
    keyed = {r for r, ss in slots.items() if ss and ss[0].kind != "no-key"}  # its first recording says no key
    assert keyed and keyed != set(slots)
    assert sorted(table[table.key == "as-is"].slot) == sorted(s.slot for ss in slots.values() for s in ss)
    for key in ("swap", "silence"):  # every slot of a recording that says its key, once per edit
        assert sorted(table[table.key == key].slot) == sorted(s.slot for r in keyed for s in slots[r]), key
    swapped = table[table.key == "swap"]
    assert set(table[table.key != "swap"].swap_word) == {""} and (swapped.swap_word != swapped.word).all()
    assert set(swapped.swap_word) <= set(CODE_WORDS)
    assert (table.followed == ((table.key == "swap") & (table.hyp == table.swap_word)).astype(int)).all()
    out = capsys.readouterr().out
    assert "rec as-is near:" in out and "rec silence near:" in out and "follow the swap" in out
    assert recall_args.cli([str(ckpt), "--data", f"rec=podcast:{recall_corpus}", "--key", "swap,muffle"]) == 2
    assert "--key 'swap,muffle': a comma-separated list of as-is, swap, silence" in capsys.readouterr().err
    # several checkpoints: a folder each and the summary, one row per checkpoint, edit and group
    other = tmp_path / "other"
    other.mkdir()
    ckpt2 = _checkpoint(other)
    assert recall_args.cli([str(ckpt), str(ckpt2), "--data", f"rec=podcast:{recall_corpus}", "--device", "cpu", "--out",
                      str(tmp_path / "two"), "--key", "swap,silence"]) == 0
    summary = pd.read_csv(tmp_path / "two" / "summary.csv")
    assert list(summary.columns) == list(probe.SUMMARY_COLUMNS) and set(summary.checkpoint) == {str(ckpt), str(ckpt2)}
    assert set(summary.key) == {"swap", "silence"} and (summary.context_s == 2.56).all()
    swap = table[table.key == "swap"]
    for _, r in summary[(summary.checkpoint == str(ckpt)) & (summary.key == "swap")].iterrows():
        mine = swap[[rc_group(b, k) == r.group for b, k in zip(swap.band, swap.kind)]]
        assert (r.slots, r.correct, r.followed) == (len(mine), mine.correct.sum(), mine.followed.sum()), r.group
    assert summary[summary.key == "silence"].followed.isna().all()
    plain = tmp_path / "plain" / "test"
    plain.mkdir(parents=True)
    for f in sorted(recall_corpus.iterdir())[:2]:
        (plain / f.name).write_bytes(f.read_bytes())
    assert recall_args.cli([str(ckpt), "--data", f"plain=podcast:{plain}", "--out", str(tmp_path / "p")]) == 2
    assert "datasets ['plain'] have no recall slots" in capsys.readouterr().err


def test_recall_window_seconds_other_than_the_models_context(recall_corpus: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--window-s``: each slot decoded from a window of S seconds instead of the model's context (a long-context
    model asked with short windows, or here a short one with longer); the summary says both, and a window too short
    to hold a slot's code word and the second after it, or not a number, exits 2."""
    from asr_core.decoding.decode import window_frames
    from asr_core.probes import recall as probe
    from asr_core.probes import recall_args

    ckpt = _checkpoint(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    ckpt2 = _checkpoint(other)
    assert recall_args.cli([str(ckpt), str(ckpt2), "--data", f"rec=podcast:{recall_corpus}", "--device", "cpu", "--out",
                      str(tmp_path / "short"), "--window-s", "5.12"]) == 0
    captured = capsys.readouterr()
    frames = window_frames(5.12, 100.0, 4)
    assert frames != window_frames(2.56, 100.0, 4)
    assert f"context 2.56 s, windows of 5.12 s = {frames} frames" in captured.err
    assert "single window, context 2.56 s, windows of 5.12 s)" in captured.out
    summary = pd.read_csv(tmp_path / "short" / "summary.csv")
    assert (summary.context_s == 2.56).all() and (summary.window_s == 5.12).all()
    for bad in ("2.5", "0", "-1", "nan", "inf"):
        assert recall_args.cli([str(ckpt), "--data", f"rec=podcast:{recall_corpus}", "--window-s", bad]) == 2, bad
        err = capsys.readouterr().err
        assert err.startswith("recall: --window-s ") and "a number of seconds of at least 2.56" in err, err
    assert not (ckpt.parent / "recall").exists()  # refused before anything was written
