"""The forced choice among a slot's candidates (asr_core.evaluation.scorers.slot_window: CTC likelihood of the window's
reference with each candidate, and posterior mass over the masked span), its columns in the slot tables (older
tables without them still read), the probe's summary and the copy plant's criteria (analysis.features.recall_choice)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from analysis.features import recall as rc
from analysis.features import recall_choice as ch
from analysis.ledger.collect import build_sweep
from analysis.ledger.fetch import RunRecord
from asr_core.contract import metrics as m
from asr_core.contract.specs import CorpusError
from asr_core.data.corpora.base import Recording, Word
from asr_core.data.synth.recall import CODE_WORDS
from asr_core.evaluation.scorers.slots import (CHOICE_COLUMNS, ForcedChoice, Slot, marked_reference, merge_slot_tables,
                                        onset_match, recall_slots, slot_rows, write_slot_table)
from asr_core.evaluation.scorers.slot_window import (WindowModel, ctc_choice, posterior_choice, score_recording,
                                               span_frames)

torch.set_num_threads(1)

CHOICE_NAMES = ("choice", "choice_correct", "onset_correct", "posterior_choice", "posterior_correct", "n_choices")


def test_the_columns_are_appended_to_the_slot_table() -> None:
    assert m.SLOT_COLUMNS[:11] == ("recording", "condition", "snr_db", "slot", "word", "band", "kind", "distance_s",
                                   "hyp", "correct", "scoring")
    assert CHOICE_COLUMNS == CHOICE_NAMES == m.SLOT_COLUMNS[11:]


# ---- by hand: posteriors where the choice is known ---------------------------------------------------------------

VOCAB = ("x", "y", "aa", "bb", "cc", "d", "e")  # ids 0..6; the blank is 7
BLANK = len(VOCAB)


def encode(text: str) -> list[int]:
    """Each word one piece, but "ddee" two (d, e)."""
    out: list[int] = []
    for w in text.split():
        out += [VOCAB.index("d"), VOCAB.index("e")] if w == "ddee" else [VOCAB.index(w)]
    return out


def posteriors(*frames: dict[str, float]) -> torch.Tensor:
    """(T', V) from one {piece: probability} a frame, the rest on the blank."""
    p = torch.zeros(len(frames), BLANK + 1)
    for t, f in enumerate(frames):
        for k, v in f.items():
            p[t, VOCAB.index(k)] = v
        p[t, BLANK] = 1.0 - sum(f.values())
    return p


def test_the_ctc_choice_is_the_candidate_the_posteriors_spell() -> None:
    p = posteriors({"x": 0.9}, {}, {"bb": 0.8, "aa": 0.1}, {}, {"y": 0.9})
    lp = p.clamp_min(1e-30).log()
    assert ctc_choice(lp, ["x", "MASK", "y"], 1, ("aa", "bb", "cc"), encode, BLANK) == "bb"
    # a candidate of two pieces, spelled by the frames
    q = posteriors({"x": 0.9}, {"d": 0.7, "cc": 0.2}, {"e": 0.7, "cc": 0.2}, {"y": 0.9})
    assert ctc_choice(q.clamp_min(1e-30).log(), ["x", "?", "y"], 1, ("cc", "ddee"), encode, BLANK) == "ddee"
    assert posterior_choice(q, (1, 3), ("cc", "ddee"), encode) == ""  # not every candidate is one piece
    # no candidate's text fits two frames: no choice
    assert ctc_choice(lp[:2], ["x", "?", "y"], 1, ("aa", "bb"), encode, BLANK) == ""


def test_the_posterior_choice_reads_the_masked_frames_and_the_ctc_choice_the_whole_window() -> None:
    """At the masked frame (1) the posteriors favour aa; the window as a whole is spelled best with bb (emitted a
    frame late): the posterior choice is aa, the forced choice bb."""
    p = posteriors({"x": 0.95}, {"aa": 0.4}, {"bb": 0.8}, {}, {"y": 0.95})
    assert posterior_choice(p, (1, 2), ("aa", "bb", "cc"), encode) == "aa"
    assert posterior_choice(p, (1, 3), ("aa", "bb", "cc"), encode) == "bb"
    assert ctc_choice(p.clamp_min(1e-30).log(), ["x", "?", "y"], 1, ("aa", "bb", "cc"), encode, BLANK) == "bb"
    # the reference decides too: these frames spell "x aa y" best, but after a reference word aa (frame 1) the slot
    # can only be frame 2's bb (a second aa would need a blank between)
    q = posteriors({"x": 0.95}, {"aa": 0.9}, {"bb": 0.3}, {"y": 0.95})
    assert ctc_choice(q.clamp_min(1e-30).log(), ["x", "?", "y"], 1, ("aa", "bb"), encode, BLANK) == "aa"
    assert ctc_choice(q.clamp_min(1e-30).log(), ["x", "aa", "?", "y"], 2, ("aa", "bb"), encode, BLANK) == "bb"


def test_span_frames_map_seconds_to_the_window_s_output_frames() -> None:
    # input frames 100-612 at 100 frames/s, 64 output frames: 8 input frames each
    assert span_frames(2.0, 2.8, (100, 612), 64, 100.0) == (12, 23)
    assert span_frames(2.0, 2.0, (100, 612), 64, 100.0) == (12, 13)  # at least one frame
    assert span_frames(0.0, 9.0, (100, 612), 64, 100.0) == (0, 64)  # clipped to the window
    with pytest.raises(ValueError):
        span_frames(1.0, 2.0, (5, 5), 1, 100.0)


def test_onset_match() -> None:
    assert [onset_match(h, "gecko") for h in ("gecko", "ge", "gxx", "walrus", "")] == [1, 1, 1, 0, 0]
    assert onset_match("zeb", "zebra") and not onset_match("ebra", "zebra")
    assert onset_match("apple", "ant") and not onset_match("", "ant")  # a vowel first: its first letter


def test_slot_rows_fill_the_choice_cells_only_when_given() -> None:
    words = "the code word is zebra remember the code word zebra".split()
    slot = Slot("r/0", 9, "zebra", "near", "masked", 2.0, 0.0, 1.0)
    ref = marked_reference(words, [slot])
    avg = slot_rows(ref, "the code word is zebra remember the code word zeb", "r")[0]
    assert [avg[c] for c in CHOICE_NAMES] == [""] * 6 and avg["correct"] == 0
    win = slot_rows(ref, "the code word is zebra remember the code word zeb", "r", scoring=m.WINDOW,
                    choices=[ForcedChoice("zebra", "walrus")])[0]
    assert [win[c] for c in CHOICE_NAMES] == ["zebra", 1, 1, "walrus", 0, len(CODE_WORDS)]
    none = slot_rows(ref, "the code word", "r", scoring=m.WINDOW, choices=[ForcedChoice()])[0]
    assert [none[c] for c in CHOICE_NAMES] == ["", "", 0, "", "", 8]
    with pytest.raises(ValueError, match="2 forced choices for 1 slots"):
        slot_rows(ref, "", "r", choices=[ForcedChoice(), ForcedChoice()])


# ---- one window per slot, a stand-in model ---------------------------------------------------------------------

TOKENS = ("kib", "lom", "nup", "vad")  # a copy corpus's candidates, one piece each


def _recording(tmp: Path) -> tuple[Recording, Slot]:
    text = "the key is lom and then we talk for a while remember lom ok".split()
    words = tuple(Word(w, 0.5 * i, 0.5 * i + 0.4) for i, w in enumerate(text))
    rec = Recording("r", tmp / "r.wav", 0.5 * len(text), words, meta={"transcript": str(tmp / "r.json")})
    slot = Slot("r/0", 12, "lom", "near", "masked", 2.0, words[11].start, words[12].end, TOKENS, True)
    return rec, slot


class Tok:
    """Every word one piece (or, with ``split``, the candidates two: their first letter and the rest)."""

    def __init__(self, words: list[str], split: bool = False) -> None:
        self.vocab = sorted(set(words) | set(TOKENS) | ({t[0] for t in TOKENS} | {t[1:] for t in TOKENS}))
        self.blank_id = len(self.vocab)
        self.split = split

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for w in text.split():
            out += [self.vocab.index(w[0]), self.vocab.index(w[1:])] if self.split and w in TOKENS \
                else [self.vocab.index(w)]
        return out

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.vocab[i] for i in ids)


def _model(rec: Recording, tok: Tok, fps: float, at_slot: str):
    """Features hold each frame's index; the model (8 input frames an output frame) emits each word at the first
    output frame inside it, ``at_slot`` (a candidate) at the masked word's, blank elsewhere."""
    def model(batch: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out_len = (lengths + 7) // 8
        logits = torch.full((len(batch), int(out_len.max()), tok.blank_id + 1), -10.0)
        logits[..., tok.blank_id] = 0.0
        for b in range(len(batch)):
            done = set()
            for k in range(int(out_len[b])):
                t = float(batch[b, 8 * k, 0]) / fps
                for i, w in enumerate(rec.words):
                    if i not in done and w.start <= t <= w.end:
                        done.add(i)
                        text = at_slot if i == 12 else w.text
                        logits[b, k, tok.encode(text)[0]] = 10.0
        return logits, out_len
    return model


def test_score_recording_makes_the_forced_choices(tmp_path: Path) -> None:
    rec, slot = _recording(tmp_path)
    fps = 100.0
    feats = torch.arange(int(rec.duration * fps) + 1, dtype=torch.float32)[:, None].repeat(1, 3)
    tok = Tok([w.text for w in rec.words])
    row = score_recording(WindowModel(_model(rec, tok, fps, "vad"), 512, fps, tok), feats, rec, [slot])[0]
    assert (row["hyp"], row["correct"], row["choice"], row["posterior_choice"]) == ("vad", 0, "vad", "vad")
    assert (row["choice_correct"], row["posterior_correct"], row["onset_correct"], row["n_choices"]) == (0, 0, 0, 4)
    row = score_recording(WindowModel(_model(rec, tok, fps, "lom"), 512, fps, tok), feats, rec, [slot])[0]
    assert (row["correct"], row["choice_correct"], row["posterior_correct"], row["onset_correct"]) == (1, 1, 1, 1)
    # candidates of two pieces: the forced choice still, no posterior choice
    two = Tok([w.text for w in rec.words], split=True)
    row = score_recording(WindowModel(_model(rec, two, fps, "nup"), 512, fps, two), feats, rec, [slot])[0]
    assert row["posterior_choice"] == "" and row["posterior_correct"] == ""
    assert row["choice"] in TOKENS
    # a tokenizer that cannot encode: no forced choice, exact match as before
    bare = SimpleNamespace(blank_id=tok.blank_id, decode=tok.decode)
    row = score_recording(WindowModel(_model(rec, tok, fps, "lom"), 512, fps, bare), feats, rec, [slot])[0]
    assert row["correct"] == 1 and row["choice"] == "" and row["choice_correct"] == ""


# ---- metadata --------------------------------------------------------------------------------------------------

def test_recall_slots_read_the_choices_and_refuse_a_word_not_among_them(tmp_path: Path) -> None:
    (tmp_path / "test").mkdir()
    (tmp_path / "meta").mkdir()
    rec, _ = _recording(tmp_path / "test")
    rec = dataclasses.replace(rec, meta={"transcript": str(tmp_path / "test" / "r.json")})
    entry = {"slot": "r/0", "index": 12, "word": "lom", "start": 5.5, "end": 6.4, "distance_s": 4.5,
             "band": "near", "kind": "masked", "key_index": 1}
    meta = tmp_path / "meta" / "r.json"
    meta.write_text(json.dumps({"recall_slots": [entry]}))
    old = recall_slots([rec])
    assert old is not None and old["r"][0].choices == CODE_WORDS and not old["r"][0].copy
    meta.write_text(json.dumps({"recall_slots": [entry], "recall_choices": list(TOKENS)}))
    new = recall_slots([rec])
    assert new is not None and new["r"][0].choices == TOKENS and new["r"][0].copy
    for bad in (["kib", "nup"], "kib lom", [], ["lom", "lom"]):
        meta.write_text(json.dumps({"recall_slots": [entry], "recall_choices": bad}))
        with pytest.raises(CorpusError, match=r"r\.json: recall"):
            recall_slots([rec])


# ---- tables without the columns ---------------------------------------------------------------------------------

def test_older_slot_tables_merge(tmp_path: Path) -> None:
    words = "the code word is zebra remember the code word zebra".split()
    ref = marked_reference(words, [Slot("r/0", 9, "zebra", "near", "masked", 2.0, 0.0, 1.0)])
    new = write_slot_table(tmp_path / "new.csv", slot_rows(ref, " ".join(words), "r", scoring=m.WINDOW,
                                                            choices=[ForcedChoice("zebra", "zebra")]))
    legacy = write_slot_table(tmp_path / "old.csv", slot_rows(ref, "", "r") + slot_rows(ref, "", "r", "snr10"),
                              m.SLOT_COLUMNS[:11])
    assert merge_slot_tables(new, [legacy]) == 2
    t = pd.read_csv(new, keep_default_na=False, dtype=str)
    assert list(t.columns) == list(m.SLOT_COLUMNS) and len(t) == 3
    assert (t[t.scoring == "average"][list(CHOICE_NAMES)] == "").all().all()
    assert t[t.scoring == "window"][list(CHOICE_NAMES)].values.tolist() == [["zebra", "1", "1", "zebra", "1", "8"]]


HEAD = "dataset,condition,snr_db,recording,ref_words,substitutions,deletions,insertions,hyp_words,wer"
N_REC = 10


def _slot_table(ctx: float, seed: int) -> str:
    """Per recording two near and two far masked slots, 16 candidates: both contexts choose every near slot right;
    at 81.92 s the far slots of recordings 0-5 (seed 1) or 0-4 (seed 2), at 10.24 s none. Exact match: never."""
    lines = [",".join(m.SLOT_COLUMNS)]
    for rec in range(N_REC):
        for k, (band, d) in enumerate((("near", 2.0), ("near", 3.0), ("far", 25.0), ("far", 40.0))):
            ok = band == "near" or (ctx > 20 and rec < (6 if seed == 1 else 5))
            cells = [f"rec{rec}", "clean", "", f"rec{rec}/{k}", "lom", band, "masked", str(d), "lo", "0", "window"]
            cells += ["lom" if ok else "kib", str(int(ok)), "1", "", "", "16"]
            lines.append(",".join(cells))
    return "\n".join(lines) + "\n"


def _records() -> list[RunRecord]:
    """Two contexts and two seeds of dense models on one dataset ``copy`` (:func:`_slot_table`)."""
    out = [RunRecord("parent", "RUNNING", {"sweep.role": "parent"}, {}, {})]
    for ctx in (10.24, 81.92):
        for seed in (1, 2):
            tags = {"sweep.role": "trial", "trial.label": f"ctx{ctx:.0f}s-s{seed}", "trial.seed": str(seed),
                    "trial.subgrids": "context", "mlflow.parentRunId": "parent"}
            params = {"data.context_s": str(ctx), "train.seed": str(seed), "model.layers": "2"}
            rows = [f"copy,clean,,rec{i},100,8,1,1,100,10" for i in range(N_REC)]
            tables = {"copy": "\n".join([HEAD, *rows]) + "\n", "copy.slots": _slot_table(ctx, seed)}
            out.append(RunRecord(f"r{ctx:.0f}-{seed}", "FINISHED", tags, params, {"wer/copy": 10.0}, tables))
    return out


def test_the_report_s_rates_hold_the_forced_choice_with_chance_and_a_binomial_test() -> None:
    from scipy.stats import binomtest

    sweep = build_sweep("copy", _records())
    rates = rc.rate_table(sweep)
    one = rates[rates["condition"] == "clean, one window per slot"]
    far = one[(one["group"] == "far") & np.isclose(one["context_s"], 81.92)].iloc[0]
    assert far["accuracy"] == 0 and far["choice"] == pytest.approx(55.0) and far["chance"] == pytest.approx(6.25)
    assert far["choice_sd"] == pytest.approx(np.std([60, 50], ddof=1)) and far["onset"] == 100
    assert (far["choice_hits"], far["choice_slots"]) == (22, 40) and math.isnan(far["posterior"])
    assert far["choice_p"] == pytest.approx(binomtest(22, 40, 1 / 16, alternative="greater").pvalue)
    assert math.isnan(far["attention_span_s"]) and math.isnan(far["field_s"])  # dense
    tests = rc.far_tests(sweep, rates, measure="choice_correct")
    assert len(tests) == 1 and (tests["far_shortest"].iloc[0], tests["far"].iloc[0]) == pytest.approx((0.0, 55.0))
    assert tests["p"].iloc[0] == pytest.approx(2 / 2 ** 6)  # six recordings gain, four the same
    assert rc.far_tests(sweep, rates).iloc[0]["far"] == 0  # exact match, as before
    (title, table), = [(t, d) for t, d in rc.display(rates, rc.far_tests(sweep, rates)) if "forced choice" in t]
    assert list(table["measure"][:4]) == ["exact match", "forced choice", "onset match", "exact match"]
    assert "55.0 ± 7.1 (p=" in " ".join(table["81.92 s"]) and set(table["chance %"]) == {"", "6.2"}
    shown, lines, csvs = rc.choice_part(sweep, rates, 0.05)
    assert "far-band forced-choice accuracy" in shown[0][0] and list(csvs) == ["recall_choice_tests"]
    assert any("N1 (" in x and "**met**" in x for x in lines)
    assert any("F1 (" in x and "**met**" in x and "Holm p = 0.031" in x for x in lines)


def test_tables_without_the_columns_read_as_before() -> None:
    sweep = build_sweep("copy", _records())
    slots = sweep.slots.drop(columns=[c for c in CHOICE_NAMES if c in sweep.slots.columns])
    old = dataclasses.replace(sweep, slots=slots)
    rates = rc.rate_table(old)
    assert len(rates) and rates["choice"].isna().all() and rates["chance"].isna().all()
    assert not ch.has_choice(rates) and rc.choice_part(old, rates, 0.05) == ([], [], {})
    assert rc.far_tests(old, rates, measure="choice_correct").empty and len(rc.far_tests(old, rates)) == 1
    assert all("forced choice" not in t for t, _ in rc.display(rates, rc.far_tests(old, rates)))


# ---- the copy plant's criteria --------------------------------------------------------------------------------

COND = "clean, one window per slot"


def _rates(near: tuple[float, float], far: tuple[float, float], banded: float | None = None, field: float = 8.0
           ) -> pd.DataFrame:
    rows = []
    models = [("d10", "dense 10 s", 10.24, math.nan, math.nan, near[0], far[0]),
              ("d82", "dense 82 s", 81.92, math.nan, math.nan, near[1], far[1])]
    if banded is not None:
        models.append(("b82", "banded 82 s", 81.92, 2.0, field, 90.0, banded))
    for cid, cfg, ctx, span, fld, n, f in models:
        for group, acc in (("near", n), ("far", f)):
            rows.append({"family": "context", "series": "s" if span != span else "b", "series_id": "s" if
                         span != span else "b", "dataset": "copy", "condition": COND, "config": cfg,
                         "config_id": cid, "context_s": ctx, "group": group, "choice": acc, "choice_p": 0.01,
                         "chance": 6.25, "attention_span_s": span, "field_s": fld})
    return pd.DataFrame(rows)


TESTS = pd.DataFrame([{"family": "context", "dataset": "copy", "condition": COND, "config": "dense 82 s",
                       "shortest_config": "dense 10 s", "p_holm": 0.003}])


def _line(lines: list[str], name: str) -> str:
    found = [x for x in lines if f": {name} (" in x]
    assert len(found) == 1, (name, lines)
    return found[0]


def _met(lines: list[str], name: str) -> bool:
    line = _line(lines, name)
    assert ("**met**" in line) != ("**not met**" in line)
    return "**met**" in line


def test_copy_verdicts_at_their_thresholds() -> None:
    v = ch.copy_verdicts
    assert _met(v(_rates((51.0, 60.0), (10.0, 40.0), 8.0), TESTS, None, 0.05), "N1")
    assert not _met(v(_rates((49.0, 60.0), (10.0, 40.0)), TESTS, None, 0.05), "N1")
    assert not _met(v(_rates((60.0, 49.0), (10.0, 40.0)), TESTS, None, 0.05), "N1")
    assert _met(v(_rates((50.0, 50.0), (10.0, 40.0)), TESTS, None, 0.05), "N1")  # inclusive
    # F1: at least 30% and 20 points above the short context
    lines = v(_rates((60, 60), (10.0, 30.0)), TESTS, None, 0.05)
    assert _met(lines, "F1") and "Holm p = 0.003, α = 0.05 significant" in _line(lines, "F1")
    assert not _met(v(_rates((60, 60), (10.0, 29.0)), TESTS, None, 0.05), "F1")
    assert not _met(v(_rates((60, 60), (11.0, 30.0)), TESTS, None, 0.05), "F1")  # 19 points
    # F2: the short context within 5 points of chance (6.25%)
    assert _met(v(_rates((60, 60), (11.25, 40.0)), TESTS, None, 0.05), "F2")
    assert _met(v(_rates((60, 60), (1.25, 40.0)), TESTS, None, 0.05), "F2")
    assert not _met(v(_rates((60, 60), (11.5, 40.0)), TESTS, None, 0.05), "F2")
    assert not _met(v(_rates((60, 60), (11.0, 40.0)), TESTS, 2.0, 0.05), "F2")  # chance given: 2%
    # F3: a banded model under 20 s of field near chance, and only while the dense long model meets F1
    assert _met(v(_rates((60, 60), (6.0, 40.0), 10.0), TESTS, None, 0.05), "F3")
    assert not _met(v(_rates((60, 60), (6.0, 40.0), 12.0), TESTS, None, 0.05), "F3")
    assert not _met(v(_rates((60, 60), (6.0, 25.0), 10.0), TESTS, None, 0.05), "F3")  # F1 not met
    lines = v(_rates((60, 60), (6.0, 40.0), 10.0, field=25.0), TESTS, None, 0.05)  # its field reaches 20 s
    assert not _met(lines, "F3") and "no banded" in _line(lines, "F3")
    lines = v(_rates((60, 60), (6.0, 40.0)), TESTS, None, 0.05)
    assert not _met(lines, "F3")
    assert ch.copy_verdicts(_rates((60, 60), (6.0, 40.0)).assign(choice=math.nan), TESTS, None, 0.05) == []


# ---- the probe ---------------------------------------------------------------------------------------------------

def test_the_probe_summary_and_the_copy_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    from asr_core.probes import recall as probe

    try:
        import asr_core.data.synth.copy_plant as plant
    except ImportError:
        plant = types.ModuleType("asr_core.data.synth.copy_plant")
        monkeypatch.setitem(sys.modules, plant.__name__, plant)
    monkeypatch.setattr(plant, "partner", lambda w: {"lom": "kib"}.get(w, "vad"), raising=False)
    slot = Slot("r/0", 1, "lom", "far", "masked", 30.0, 0.0, 1.0, TOKENS, True)
    assert probe.swap_for_slot(slot, "zebra") == "kib"
    assert probe.swap_for_slot(dataclasses.replace(slot, copy=False, choices=CODE_WORDS), "zebra") == "zebra"

    def row(key: str, choice: str, swap: str, post: str = "") -> dict:
        return {"key": key, "band": "far", "kind": "masked", "condition": "clean", "scoring": "window",
                "correct": int(choice == "lom"), "hyp": choice, "choice": choice, "n_choices": 4,
                "choice_correct": int(choice == "lom"), "onset_correct": int(choice.startswith("l")),
                "posterior_choice": post, "posterior_correct": int(post == "lom") if post else "",
                "swap_word": swap, "followed": int(bool(swap) and choice == swap),
                "followed_choice": int(bool(swap) and choice == swap)}

    rows = [row("as-is", "lom", "", "lom"), row("as-is", "kib", "", "lom"), row("swap", "kib", "kib"),
            row("swap", "lom", "kib"), row("swap", "vad", "kib")]
    out = {r["key"]: r for r in probe.summary_rows(Path("c.pt"), 81.92, 1, "copy", rows)}
    assert set(out["swap"]) == set(probe.SUMMARY_COLUMNS) and out["as-is"]["chance"] == 25.0
    assert (out["as-is"]["choice_accuracy"], out["as-is"]["posterior_accuracy"], out["as-is"]["onset_accuracy"]) \
        == (50.0, 100.0, 50.0)
    assert (out["swap"]["followed_choice"], out["swap"]["follow_choice_rate"]) == (1, 33.33)
    assert out["swap"]["posterior_accuracy"] == "" and out["as-is"]["followed_choice"] == ""
    line = probe.summary_line("copy", out["swap"], 81.92)
    assert line.startswith("copy swap far: 33.3%") and "forced choice 33.3%" in line and "chance 25.0%" in line
    assert "follow the swap, forced choice 33.3%" in line
    assert probe.COLUMNS[-2:] == ("followed", "followed_choice")


def test_the_report_gives_the_copy_criteria_and_their_table(tmp_path: Path) -> None:
    """The report's positive-control section: the forced-choice text, the N1/F1-F3 lines and the choice tests' csv."""
    from analysis.document.report import build_report

    rep = build_report(build_sweep("copy", _records()), tmp_path, bootstrap_resamples=100)
    md = rep.markdown.read_text()
    assert "**Forced choice.**" in md and "Copy control: criteria N1, F1-F3" in md
    assert "N1 (near band ≥ 50%" in md and "F3 (" in md  # F3 not met: no banded model in this sweep
    assert (tmp_path / "recall_choice_tests.csv").is_file()


def test_a_slot_table_written_before_the_forced_choice_is_read(tmp_path: Path) -> None:
    """A run evaluated before the columns existed keeps its slots in the report (its choice cells empty)."""
    old = _slot_table(10.24, 1).splitlines()
    width = m.SLOT_COLUMNS.index("choice")
    text = "\n".join(",".join(line.split(",")[:width]) for line in old) + "\n"
    records = _records()
    records[1] = dataclasses.replace(records[1], tables={**records[1].tables, "copy.slots": text})
    sweep = build_sweep("copy", records)
    assert sweep.problems.empty, sweep.problems
    assert len(sweep.slots) == 4 * N_REC * 4 and (sweep.slots["choice"].astype(str) == "").sum() == 4 * N_REC


def test_a_sweep_with_one_context_has_no_far_test_and_a_report(tmp_path: Path) -> None:
    """Only the 10.24 s models finished (the others still training): rates, no comparison, a report all the same."""
    from analysis.document.report import build_report

    records = [r for r in _records() if not r.run_id.startswith("r82")]
    sweep = build_sweep("copy", records)
    assert rc.far_tests(sweep).empty and rc.far_tests(sweep, measure="choice_correct").empty
    rep = build_report(sweep, tmp_path, bootstrap_resamples=100)
    assert "N1 (near band" in rep.markdown.read_text()
