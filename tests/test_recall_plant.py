"""The recall plant (``synth --recall``): a code word said clearly, asked for again with its audio masked by pink noise,
at near (1-4 s) and far (20-60 s) distances, with unmasked and no-key controls; ``--recall 0`` changes nothing."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import asr_core.data.synth.generate as synth
import asr_core.data.synth.cli as synth_cli
from asr_core.data.audio import SAMPLE_RATE, load_audio
from asr_core.data.corpora import load_corpus
from asr_core.data.corpora.fingerprint import fingerprint
from asr_core.data.synth.recall import (CODE_WORDS, FAR_S, KEY_WORDS, MASKER_S, NEAR_S, NO_KEY_SHARE, SLOT_WORDS,
                                          UNMASKED_SHARE, RecallConfig, check_code_words, masker, onset)
from asr_core.data.synth.generate import make_plans, render
from asr_core.data.synth.audio import Speaker
from asr_core.data.synth.text import CUE_GROUPS, vocabulary
from asr_core.scoring.score import normalise


def fake_espeak(text: str, speaker: Speaker) -> np.ndarray:
    """A stand-in for espeak-ng: deterministic audio, its length from the text."""
    n = 900 * len(text) + 1200
    return (0.1 * np.sin(np.arange(n) * (0.03 + 0.002 * len(text)))).astype(np.float32)


# ---- the words and the option -------------------------------------------------------------------------------------

def test_code_words_are_eight_new_words_with_distinct_onsets() -> None:
    lexicon = set(vocabulary()) | {w for g in CUE_GROUPS for w in g}
    assert len(CODE_WORDS) == 8 and not set(CODE_WORDS) & lexicon
    assert not set(CODE_WORDS) & set(KEY_WORDS + SLOT_WORDS)
    assert len({onset(w) for w in CODE_WORDS}) == 8 and all(normalise(w) == w for w in CODE_WORDS)
    check_code_words()
    # espeak-ng's first phoneme differs too (the onsets are heard, not only written)
    heard = {w: subprocess.run(["espeak-ng", "-q", "-x", "-v", "en-us", w], capture_output=True, text=True,
                               check=True).stdout.strip().lstrip("'") for w in CODE_WORDS}
    assert len({p[:2] if p[:2] in ("dZ", "tS") else p[:1] for p in heard.values()}) == 8, heard
    with pytest.raises(ValueError, match="'garden' is a word the generator says"):
        check_code_words(("banjo", "garden"))
    with pytest.raises(ValueError, match="'bongo'.*onset 'b'"):
        check_code_words(("banjo", "bongo"))


def test_recall_spec_parsing_and_the_cli_refuses_bad_rates(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert RecallConfig.parse("5") == RecallConfig(5.0) and RecallConfig.parse(" 4.5 ").spec() == "4.5"
    assert not RecallConfig.parse("0").active and RecallConfig(6).active
    for bad in ("x", "-1", "nan", "inf", "9", ""):
        with pytest.raises(ValueError, match=f"recall spec '{bad}'.*RATE"):
            RecallConfig.parse(bad)
    for bad in ("-1", "abc", "8.5"):
        with pytest.raises(SystemExit) as e:
            synth_cli.cli(["--out", str(tmp_path / "x"), "--hours", "0.01", "--recall", bad])
        assert e.value.code == 2 and f"--recall: recall spec '{bad}'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ---- a larger corpus, dry, with the stand-in synthesiser -------------------------------------------------------------

@pytest.fixture(scope="module")
def renders() -> list:
    """Two hours of recordings (1-4 min) rendered dry with the plant at 5 a minute."""
    mp = pytest.MonkeyPatch()
    mp.setattr(synth, "espeak", fake_espeak)
    plans = make_plans("train", 2.0, seed=21, min_minutes=1, max_minutes=4, meeting_fraction=0.3)
    out = [(p, render(p, dry=True, recall=RecallConfig(5))) for p in plans]
    mp.undo()
    return out


def test_code_words_occur_only_in_key_sentences_and_slots(renders: list) -> None:
    for plan, (_, words, _, meta) in renders:
        x = meta["recall_word"]
        assert x in CODE_WORDS
        texts = [w.text for w in words]
        slots = {s["index"] for s in meta["recall_slots"]}
        clear = set(meta["recall_clear"])
        assert slots & clear == {s["index"] for s in meta["recall_slots"] if s["kind"] == "unmasked"}
        for i, t in enumerate(texts):
            if t in CODE_WORDS:
                assert t == x and (i in slots or i in clear), (plan.id, i)
                before = texts[i - 4: i]
                assert before in (list(KEY_WORDS), list(SLOT_WORDS))
                assert before == list(SLOT_WORDS) or i in clear  # a key sentence's word is a clear mention
        keys = [i for i in range(4, len(texts)) if texts[i - 4: i] == list(KEY_WORDS)]
        assert bool(keys) == meta["recall_key"]
        assert set(keys) <= clear
        assert all(texts[s - 4: s] == list(SLOT_WORDS) for s in slots)


def test_slots_lie_in_their_bands_measured_from_the_words(renders: list) -> None:
    """Recomputed from the transcript: from the end of the latest clear mention to the start of the slot's code word,
    near slots 1-4 s and far slots 20-60 s; no clear mention in between."""
    n = Counter()
    for plan, (_, words, _, meta) in renders:
        clear = meta["recall_clear"]
        for s in meta["recall_slots"]:
            i, w = s["index"], words[s["index"]]
            assert s["word"] == w.text and s["end"] == w.end and s["start"] == words[i - 4].start
            assert s["slot"].startswith(plan.id + "/")
            if s["kind"] == "no-key":
                assert s["distance_s"] is None and not clear
                continue
            prev = max(c for c in clear if c < i)
            d = round(w.start - words[prev].end, 3)
            assert s["distance_s"] == pytest.approx(d, abs=1e-3)
            lo, hi = NEAR_S if s["band"] == "near" else FAR_S
            assert lo <= d <= hi, (plan.id, s)
            n[s["band"]] += 1
        if meta["recall_near_only"]:
            assert all(s["band"] == "near" for s in meta["recall_slots"])
    assert 0.4 < n["near"] / (n["near"] + n["far"]) < 0.6  # about half each


def test_controls_and_rate(renders: list) -> None:
    kinds = Counter(s["kind"] for _, (_, _, _, m) in renders for s in m["recall_slots"])
    total = sum(kinds.values())
    minutes = sum(m["duration"] for _, (_, _, _, m) in renders) / 60
    assert set(kinds) == {"masked", "unmasked", "no-key"}
    keyed = kinds["masked"] + kinds["unmasked"]
    assert 0.5 * UNMASKED_SHARE < kinds["unmasked"] / keyed < 1.6 * UNMASKED_SHARE
    assert 0.3 * NO_KEY_SHARE < kinds["no-key"] / total < 2.5 * NO_KEY_SHARE
    assert 4.0 < total / minutes < 6.0  # RATE 5 a minute, about
    for _, (_, _, _, m) in renders:  # a no-key recording's slots are all no-key, a keyed one has none
        assert all((s["kind"] == "no-key") != m["recall_key"] for s in m["recall_slots"])


def test_the_masker_covers_exactly_the_code_word_at_the_sentence_level(renders: list) -> None:
    n_masked = 0
    for plan, (wave, words, _, meta) in renders[:12]:
        for s in meta["recall_slots"]:
            if s["kind"] == "unmasked":
                assert s["masker"] is None and s["masker_samples"] is None
                continue
            a, b = s["masker_samples"]
            w = words[s["index"]]
            assert b - a == round(MASKER_S * SAMPLE_RATE)
            assert (w.start, w.end) == (round(a / SAMPLE_RATE, 3), round(b / SAMPLE_RATE, 3)) == tuple(s["masker"])
            assert wave[a - 1] == 0 and wave[b] == 0  # pauses on both sides: the masker is the word's audio
            others = np.concatenate([wave[int(round(v.start * SAMPLE_RATE)): int(round(v.end * SAMPLE_RATE))]
                                     for v in words[s["index"] - 4: s["index"]]])
            rms = float(np.sqrt(np.mean(others.astype(np.float64) ** 2)))
            span = wave[a: b].astype(np.float64)
            assert np.sqrt(np.mean(span ** 2)) == pytest.approx(rms, rel=0.1)
            assert np.mean(np.abs(span) < 1e-3 * rms) < 0.05  # noise, not silence
            assert np.allclose(span / np.sqrt(np.mean(span ** 2)), masker(1.0), atol=1e-4)  # the one fixed masker
            n_masked += 1
    assert n_masked > 20
    m = masker(1.0).astype(np.float64)  # pink: more power below 500 Hz than above 2 kHz, by far
    p = np.abs(np.fft.rfft(m)) ** 2
    f = np.fft.rfftfreq(len(m), 1 / SAMPLE_RATE)
    assert p[(f > 50) & (f < 500)].mean() > 5 * p[(f > 2000) & (f < 6000)].mean()
    assert np.array_equal(masker(0.3), masker(0.3))


def test_the_plant_is_deterministic_and_leaves_the_plans_alone(renders: list,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synth, "espeak", fake_espeak)
    plan, (wave, words, speakers, meta) = renders[0]
    again = render(plan, dry=True, recall=RecallConfig(5))
    assert np.array_equal(again[0], wave) and again[1:] == (words, speakers, meta)
    other = render(type(plan)(**{**plan.__dict__, "seed": plan.seed + 1}), dry=True, recall=RecallConfig(5))
    assert [s["index"] for s in other[3]["recall_slots"]] != [s["index"] for s in meta["recall_slots"]]
    plain = render(plan, dry=True)
    assert "recall_slots" not in plain[3] and not {w.text for w in plain[1]} & set(CODE_WORDS)
    assert render(plan, dry=True, recall=RecallConfig(0))[1] == plain[1]
    assert len({m["recall_word"] for _, (_, _, _, m) in renders}) == len(CODE_WORDS)  # every word is drawn


# ---- the command line, real espeak-ng --------------------------------------------------------------------------------

ARGS = ["--hours", "0.012", "--eval-hours", "0.012", "--min-minutes", "0.6", "--max-minutes", "0.75",
        "--splits", "train,test-shifted", "--seed", "4", "--meeting-fraction", "0.5", "--jobs", "2"]


def _cli(args: list[str]) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert synth_cli.cli(args) == 0
    return printed.getvalue()


def _without_timing(text: str) -> str:
    """A metadata file (or recordings.jsonl) without ``render_s``, the one field that measures time."""
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    return "\n".join(json.dumps({k: v for k, v in d.items() if k != "render_s"}) for d in lines)


def test_recall_zero_makes_the_corpus_byte_for_byte(tmp_path: Path) -> None:
    _cli(["--out", str(tmp_path / "a"), *ARGS])
    _cli(["--out", str(tmp_path / "b"), *ARGS, "--recall", "0"])
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert any(f.suffix == ".wav" for f in files)
    for f in files:
        a, b = (tmp_path / "a" / f).read_bytes(), (tmp_path / "b" / f).read_bytes()
        if f.name == "synth.json":  # it names the folder
            b = b.replace(str(tmp_path / "b").encode(), str(tmp_path / "a").encode())
        if f.parts[0] == "meta" or f.name == "recordings.jsonl":
            assert _without_timing(a.decode()) == _without_timing(b.decode()), f
        else:
            assert a == b, f
    for split in ("train", "test-shifted"):
        assert fingerprint(load_corpus(f"podcast:{tmp_path / 'a' / split}")) == \
            fingerprint(load_corpus(f"podcast:{tmp_path / 'b' / split}"))


def test_cli_plants_slots_recorded_beside_each_recording(tmp_path: Path) -> None:
    out = tmp_path / "r"
    printed = _cli(["--out", str(out), *ARGS, "--recall", "5"])
    stamp = json.loads((out / "synth.json").read_text())
    assert stamp["args"]["recall"] == "5" and "slots" in printed
    metas = [json.loads(line) for line in (out / "recordings.jsonl").read_text().splitlines()]
    for split in ("train", "test-shifted"):
        assert stamp["splits"][split]["recall_slots"] == sum(len(m["recall_slots"]) for m in metas
                                                             if m["split"] == split) > 0
        for rec in load_corpus(f"podcast:{out / split}", strict=True):
            meta = next(m for m in metas if m["id"] == rec.id)
            wave = np.asarray(load_audio(rec.audio), dtype=np.float64)
            for s in meta["recall_slots"]:
                assert rec.words[s["index"]].text == meta["recall_word"]
                lo, hi = NEAR_S if s["band"] == "near" else FAR_S
                assert s["kind"] == "no-key" or lo <= s["distance_s"] <= hi
                if s["masker_samples"] is not None:  # after the room: still noise at the speech's level
                    a, b = s["masker_samples"]
                    others = [wave[int(w.start * SAMPLE_RATE): int(w.end * SAMPLE_RATE)]
                              for w in rec.words[s["index"] - 4: s["index"]]]
                    level = np.sqrt(np.mean(np.concatenate(others) ** 2))
                    assert 0.2 * level < np.sqrt(np.mean(wave[a: b] ** 2)) < 5 * level


def test_the_plant_lives_beside_the_homophone_cue(monkeypatch: pytest.MonkeyPatch) -> None:
    """With --cue and --recall together both plants are made, and the cue's words keep their distances."""
    from asr_core.data.synth.cues import CueConfig, disambiguating

    monkeypatch.setattr(synth, "espeak", fake_espeak)
    cue = CueConfig(2, 5, 15)
    n_cues = n_slots = 0
    for plan in make_plans("train", 0.2, seed=3, min_minutes=1, max_minutes=3, cue=cue):
        _, words, _, meta = render(plan, dry=True, recall=RecallConfig(5))
        own = disambiguating(plan.topic)
        for c in meta["cues"]:
            w = words[c["index"]]
            before = [v.end for v in words if v.text in own and v.end <= w.start]
            after = [v.start for v in words if v.text in own and v.start >= w.end]
            assert w.text == c["word"] and before and 5 <= w.start - max(before) <= 15
            assert not after or min(after) - w.end >= 5
        n_cues += len(meta["cues"])
        n_slots += len(meta["recall_slots"])
    assert n_cues and n_slots


def test_every_split_holds_the_guess_rate_control(renders: list) -> None:
    """Recordings without a key are dealt by index (every 20th, the first included): a split of a dozen recordings
    still has one."""
    for plan, (_, _, _, meta) in renders:
        assert meta["recall_key"] == (int(plan.id.rsplit("-", 1)[1]) % 20 != 0), plan.id
    small = make_plans("test", 0.2, seed=5, min_minutes=1, max_minutes=1.2)
    assert 8 <= len(small) < 20
    mp = pytest.MonkeyPatch()
    mp.setattr(synth, "espeak", fake_espeak)
    metas = [render(p, dry=True, recall=RecallConfig(5))[3] for p in small]
    mp.undo()
    assert [m["recall_key"] for m in metas] == [False] + [True] * (len(small) - 1)
