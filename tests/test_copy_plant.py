"""The copy plant (``synth --copy near[,far]``): one-piece identity tokens said clearly and asked for again masked,
every episode inside one 5.12 s cell (near) or one 81.92 s block (far), so every training window of a context
5.12 * 2^k s holds an episode whole or not at all; the corpus without ``--copy`` is as before."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import asr_core.data.synth.generate as synth
from asr_core.data.audio import SAMPLE_RATE, load_audio
from asr_core.data.chunking import window_bounds
from asr_core.data.corpora import load_corpus
from asr_core.data.synth.copy_plant import (BLOCK_S, CARRIER, CELL_S, FAR_S, IDENTITY_TOKENS, MARGIN_S, NEAR_S,
                                              CopyConfig, CopyEdit, check_tokens, one_piece_words, partner,
                                              swap_of_slot)
from asr_core.data.synth.recall import CODE_WORDS, KEY_WORDS, SLOT_WORDS, RecallConfig
from asr_core.data.synth.rerender import Rerenderer
from asr_core.data.synth.generate import make_plans, render, synthesise
from asr_core.data.synth.audio import Speaker
from asr_core.data.synth.text import CUE_GROUPS, vocabulary
from asr_core.data.tokenizer import Tokenizer
from asr_core.evaluation.scorers.slots import recall_slots
from asr_core.scoring.score import normalise

NEAR_FAR = CopyConfig(("near", "far"))
EPS = 1e-6
TAIL_S = 0.6  # after an edited span: the room's reverberation and its filters


def fake_espeak(text: str, speaker: Speaker) -> np.ndarray:
    """A stand-in for espeak-ng: deterministic audio, its length from the text (as test_recall_plant's)."""
    n = 900 * len(text) + 1200
    return (0.1 * np.sin(np.arange(n) * (0.03 + 0.002 * len(text)))).astype(np.float32)


def fake_espeak_spelt(text: str, speaker: Speaker) -> np.ndarray:
    """As :func:`fake_espeak`, its pitch from the letters too: words of the same length sound different."""
    n = 900 * len(text) + 1200
    return (0.1 * np.sin(np.arange(n) * (0.03 + 0.0005 * (sum(map(ord, text)) % 37)))).astype(np.float32)


def _espeak_wav(text: str) -> bytes:
    return subprocess.run(["espeak-ng", "-v", "en", "--stdout", text], capture_output=True, check=True).stdout


# ---- the tokens ---------------------------------------------------------------------------------------------------

def test_tokens_are_new_words_prefix_free_and_heard_distinctly() -> None:
    lexicon = set(vocabulary()) | {w for g in CUE_GROUPS for w in g} | set(CODE_WORDS) | set(KEY_WORDS) \
        | set(SLOT_WORDS) | {CARRIER}
    assert len(IDENTITY_TOKENS) == len(set(IDENTITY_TOKENS)) == 16
    for t in IDENTITY_TOKENS:
        assert normalise(t) == t and t.isalpha()
        assert not [w for w in lexicon if w.startswith(t)], t
        assert not [u for u in IDENTITY_TOKENS if u != t and u.startswith(t)], t
    check_tokens()
    with pytest.raises(ValueError, match="'garden' is, or begins, a word"):
        check_tokens(("kay", "garden"))
    with pytest.raises(ValueError, match="'gar' is, or begins, a word.*'garden'"):
        check_tokens(("gar",))
    with pytest.raises(ValueError, match="'kay' is the prefix of another token 'kayo'"):
        check_tokens(("kay", "kayo"), lexicon=())
    audio = {t: _espeak_wav(t) for t in IDENTITY_TOKENS}
    assert len({hashlib.sha256(a).digest() for a in audio.values()}) == 16
    heard = {subprocess.run(["espeak-ng", "-q", "-x", "-v", "en", t], capture_output=True, text=True,
                            check=True).stdout.strip() for t in IDENTITY_TOKENS}
    assert len(heard) == 16, heard  # different phonemes, not only different samples


def test_partners_are_a_derangement_of_close_lengths() -> None:
    for t in IDENTITY_TOKENS:
        assert partner(t) != t and partner(partner(t)) == t and partner(t) in IDENTITY_TOKENS
    assert sorted(partner(t) for t in IDENTITY_TOKENS) == sorted(IDENTITY_TOKENS)
    length = {t: len(_espeak_wav(t)) / 2 / 22050 for t in IDENTITY_TOKENS}  # 16-bit samples at 22.05 kHz
    spread = max(length.values()) - min(length.values())
    assert all(abs(length[t] - length[partner(t)]) < 0.5 * spread for t in IDENTITY_TOKENS), length
    with pytest.raises(ValueError, match="not an identity token"):
        partner("banjo")
    assert swap_of_slot({"recall": "copy:near"}, {"word": "ell"}) == partner("ell")
    with pytest.raises(ValueError, match="not of a copy plant"):
        swap_of_slot({"recall": "5"}, {"word": "banjo"})


def test_copy_spec_parsing() -> None:
    assert CopyConfig.parse("near") == CopyConfig(("near",)) and CopyConfig.parse("near, far").spec() == "near,far"
    assert NEAR_FAR.far and not CopyConfig(("near",)).far and not CopyConfig().active
    for bad in ("far", "", "near,near", "far,near", "x", "near,far:0-3", "near,far:9", "near,far:x", "near:3-4",
                "near,far:5-3", "far:2-3"):
        with pytest.raises(ValueError, match="valid: near or near,far, or near,far:LO-HI"):
            CopyConfig.parse(bad)
    dense = CopyConfig.parse("near,far:6-8")
    assert dense.far_slots == (6, 8) and dense.spec() == "near,far:6-8" and CopyConfig.parse(dense.spec()) == dense
    assert CopyConfig.parse("near,far:4").far_slots == (4, 4)
    assert CopyConfig.parse("near,far:2-3") == NEAR_FAR and NEAR_FAR.spec() == "near,far"  # the default, as before


def test_more_far_slots_keep_every_invariant() -> None:
    """near,far:6-8: the far episodes ask more slots (as many as their block's cells allow), each in its own cell
    and the band, with no other identity token in the block; the near band is drawn as before."""
    dense = _render("train", 0.3, 11, 3.0, 4.0, CopyConfig.parse("near,far:6-8"))
    plain = _render("train", 0.3, 11, 3.0, 4.0)
    counts: Counter = Counter()
    per_episode = Counter()
    for _, (_, words, _, meta) in dense:
        counts += check_recording(words, meta)
        assert meta["recall"] == "copy:near,far:6-8"
        for s in meta["recall_slots"]:
            if s["band"] == "far":
                per_episode[(meta["id"], s["key_index"])] += 1
    base: Counter = Counter()
    for _, (_, words, _, meta) in plain:
        base += check_recording(words, meta)
    far = sum(v for (band, _), v in counts.items() if band == "far")
    assert far >= 2 * sum(v for (band, _), v in base.items() if band == "far") > 0
    assert max(per_episode.values()) >= 6


# ---- rendered recordings, dry, with the stand-in synthesiser -------------------------------------------------------

def _render(split: str, hours: float, seed: int, lo: float, hi: float, copy: CopyConfig = NEAR_FAR) -> list:
    mp = pytest.MonkeyPatch()
    mp.setattr(synth, "espeak", fake_espeak_spelt)
    plans = make_plans(split, hours, seed=seed, min_minutes=lo, max_minutes=hi, meeting_fraction=0.5)
    out = [(p, render(p, dry=True, copy=copy)) for p in plans]
    mp.undo()
    return out


@pytest.fixture(scope="module")
def renders() -> list:
    """About 25 minutes of training recordings (1-3.3 min) and a test split, near and far."""
    return _render("train", 0.4, 11, 1.0, 3.3) + _render("test", 0.25, 12, 1.0, 3.0)


def _in_one_cell(a: float, b: float, size: float = CELL_S, margin: float = MARGIN_S) -> int:
    """The cell of [a, b], asserting it lies inside one, ``margin`` from both ends."""
    k = int(a // size)
    assert k * size + margin - EPS <= a and b <= (k + 1) * size - margin + EPS, (a, b, k)
    return k


def check_recording(words: list, meta: dict) -> dict[str, int]:
    """Every invariant of one recording's episodes; returns counts by band and kind."""
    slots = meta["recall_slots"]
    tokens = [i for i, w in enumerate(words) if w.text in IDENTITY_TOKENS]
    said = {s["index"] for s in slots} | {s["key_index"] for s in slots if s["key_index"] is not None}
    assert set(tokens) == said | set(meta["recall_clear"])  # tokens only in keys and slots
    assert all(words[i - 1].text == CARRIER for i in tokens)
    assert meta["recall_word"] is None and meta["recall_choices"] == list(IDENTITY_TOKENS)
    assert meta["recall"].startswith("copy:")
    episode_cells: dict[int, float] = {}  # cell -> end of what the episode says in it
    counts: Counter = Counter()
    for s in slots:
        i, k = s["index"], s["key_index"]
        counts[(s["band"], s["kind"])] += 1
        slot_cell = _in_one_cell(s["start"], s["end"])
        assert s["start"] == words[i - 1].start and s["end"] == words[i].end
        episode_cells[slot_cell] = max(episode_cells.get(slot_cell, 0.0), s["end"])
        if s["kind"] == "no-key":
            assert k is None and s["distance_s"] is None and not meta["recall_key"]
        else:
            assert meta["recall_key"] and words[k].text == s["word"] and k in meta["recall_clear"]
            d = round(words[i].start - words[k].end, 3)
            assert d == s["distance_s"]
            lo, hi = NEAR_S if s["band"] == "near" else FAR_S
            assert lo <= d <= hi, s
            key_cell = _in_one_cell(words[k - 1].start, words[k].end)
            episode_cells[key_cell] = max(episode_cells.get(key_cell, 0.0), words[k].end)
            if s["band"] == "near":
                assert key_cell == slot_cell  # the whole episode in one cell
                _in_one_cell(words[k - 1].start, s["end"])
            else:
                assert int(words[k].start // BLOCK_S) == int(s["end"] // BLOCK_S)
                assert slot_cell != key_cell
        if s["kind"] == "unmasked":
            assert s["masker"] is None and i in meta["recall_clear"]
        else:
            assert s["masker"] == [words[i].start, words[i].end] and i not in meta["recall_clear"]
    # nothing else in an episode's cell before the episode has said its last word there
    for cell, end in episode_cells.items():
        inside = [j for j, w in enumerate(words) if w.end > cell * CELL_S and w.start < end]
        assert all(words[j].text in IDENTITY_TOKENS or (j + 1 < len(words) and words[j + 1].text in IDENTITY_TOKENS
                                                        and words[j].text == CARRIER) for j in inside), cell
    # far: no other identity token in the block of a far episode
    for s in slots:
        if s["band"] == "far":
            block = int(s["end"] // BLOCK_S)
            mine = {x["index"] for x in slots if x["band"] == "far" and int(x["end"] // BLOCK_S) == block}
            mine |= {x["key_index"] for x in slots if x["band"] == "far" and int(x["end"] // BLOCK_S) == block}
            in_block = {j for j in tokens if int(words[j].start // BLOCK_S) == block}
            assert in_block == mine - {None}
    return counts


def test_every_episode_lies_in_its_cell_and_band(renders: list) -> None:
    total: Counter = Counter()
    for plan, (_, words, _, meta) in renders:
        total += check_recording(words, meta)
        near_cells = {int(s["start"] // CELL_S) for s in meta["recall_slots"] if s["band"] == "near"}
        assert all(c % 2 == 1 for c in near_cells)  # near episodes in the odd cells
        far_blocks = {int(s["start"] // BLOCK_S) for s in meta["recall_slots"] if s["band"] == "far"}
        assert all(b % 2 == 1 for b in far_blocks)  # far blocks are the odd ones
        # a far block once the recording reaches its 14th cell
        assert meta["recall_near_only"] == (plan.target_s < BLOCK_S + 14 * CELL_S) == (not far_blocks)
        # near blocks: an episode in every odd cell that ends before the recording's target
        expected = {c for c in range(1, int(plan.target_s // CELL_S), 2)
                    if int(c * CELL_S // BLOCK_S) not in far_blocks and (c + 1) * CELL_S <= plan.target_s}
        assert near_cells == expected, plan.id
    assert total[("near", "masked")] > 100 and total[("far", "masked")] >= 8
    assert total[("near", "unmasked")] + total[("far", "unmasked")] > 5 and total[("near", "no-key")] > 5
    share = (total[("near", "unmasked")] + total[("far", "unmasked")]) / sum(
        n for (b, k), n in total.items() if k != "no-key")
    assert 0.03 < share < 0.2


def test_training_windows_of_every_aligned_context_hold_episodes_whole(renders: list) -> None:
    """Windows [kL, (k+1)L) from the recording's start (the training cut) for L = 5.12 * 2^k: a near episode lies in
    one of each length; a far episode in one of 81.92 s."""
    for _, (_, words, _, meta) in renders:
        for s in meta["recall_slots"]:
            first = words[s["key_index"] - 1].start if s["key_index"] is not None else s["start"]
            for k in range(5):
                length = CELL_S * 2 ** k
                whole = [w for w in window_bounds(meta["duration"], length) if w[0] <= first and s["end"] <= w[1]]
                if s["band"] == "near" or k == 4:
                    assert len(whole) == 1, (s, length)


def test_tokens_are_drawn_afresh_for_every_episode(renders: list) -> None:
    keys: list[str] = []
    for _, (_, words, _, meta) in renders:
        keys += [words[i].text for i in sorted({s["key_index"] for s in meta["recall_slots"]} - {None})]
    counts = Counter(keys)
    assert len(counts) == 16 and min(counts.values()) >= len(keys) / 16 / 3
    pairs = list(zip(keys, keys[1:]))
    assert 0 < sum(a == b for a, b in pairs) < len(pairs) / 4  # consecutive episodes: independent draws


def test_no_key_recordings_only_in_evaluation_splits(renders: list) -> None:
    for plan, (_, words, _, meta) in renders:
        index = int(plan.id.rsplit("-", 1)[1])
        assert meta["recall_key"] == (plan.split == "train" or index % 5 != 0), plan.id
        if not meta["recall_key"]:
            assert meta["recall_slots"] and all(s["kind"] == "no-key" for s in meta["recall_slots"])
            assert not meta["recall_clear"]
            assert sum(w.text in IDENTITY_TOKENS for w in words) == len(meta["recall_slots"])
    assert sum(not m["recall_key"] for p, (_, _, _, m) in renders if p.split == "test") >= 1


def test_real_voices_at_the_slowest_rates_keep_cells_and_bands() -> None:
    """espeak-ng itself, in the shifted split's slow voices (its tokens up to 0.9 s, "letter" up to 0.8 s): a
    recording without its key and one with near and far episodes."""
    plans = make_plans("test-shifted", 0.1, seed=7, min_minutes=2.7, max_minutes=3.0, meeting_fraction=0.5)[:2]
    keyed = []
    for plan in plans:
        _, words, _, meta = render(plan, dry=True, copy=NEAR_FAR)
        counts = check_recording(words, meta)
        assert counts[("near", "masked" if meta["recall_key"] else "no-key")] >= 5
        assert sum(n for (band, _), n in counts.items() if band == "far") >= 2
        keyed.append(meta["recall_key"])
    assert keyed == [False, True]


def test_near_only_and_a_short_recording() -> None:
    (plan, (_, words, _, meta)), = _render("train", 0.02, 4, 1.0, 1.2, CopyConfig(("near",)))
    assert meta["recall"] == "copy:near" and meta["recall_near_only"]
    assert {s["band"] for s in meta["recall_slots"]} == {"near"}
    check_recording(words, meta)


def test_meeting_holds_the_turn_through_a_near_episode(renders: list) -> None:
    for plan, (_, words, speakers, meta) in renders:
        for s in meta["recall_slots"]:
            if s["band"] == "near" and s["key_index"] is not None:
                assert len({speakers[j] for j in range(s["key_index"] - 1, s["index"] + 1)}) == 1


def test_the_corpus_without_copy_is_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashes of renderings made by the code before the copy plant existed (the stand-in synthesiser, dry)."""
    monkeypatch.setattr(synth, "espeak", fake_espeak)
    plans = make_plans("test", 0.05, seed=7, min_minutes=1, max_minutes=1.5, meeting_fraction=0.5)
    expected = {("test-0000", False): "bfef919f2e21c3c8", ("test-0000", True): "1ceb0510a852d917",
                ("test-0001", False): "675ca6e9275293ba", ("test-0001", True): "d886c7964465dd10"}
    for p in plans[:2]:
        for recalled in (False, True):
            wave, words, spk, meta = render(p, dry=True, recall=RecallConfig(5) if recalled else None)
            h = hashlib.sha256(wave.tobytes() + json.dumps([[w.text, w.start, w.end] for w in words]).encode()
                               + json.dumps(spk).encode() + json.dumps(meta, sort_keys=True).encode()).hexdigest()
            assert h[:16] == expected[(p.id, recalled)], (p.id, recalled)
            assert render(p, dry=True, copy=CopyConfig())[1] == render(p, dry=True)[1]


# ---- a small corpus on disk: stamp, metadata, tokenizer, causal check ---------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("copy") / "corpus"
    mp = pytest.MonkeyPatch()
    mp.setattr(synth, "espeak", fake_espeak_spelt)  # the worker processes are forked: they inherit it
    synthesise(out, 0.04, 3, eval_hours=0.05, min_minutes=1.0, max_minutes=1.5, jobs=1, splits=("train", "test"),
               copy=NEAR_FAR)
    mp.undo()
    return out


def test_stamp_records_copy_only_when_given(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stamp = json.loads((corpus / "synth.json").read_text())
    assert stamp["args"]["copy"] == "near,far" and stamp["splits"]["train"]["recall_slots"] > 0
    assert one_piece_words(corpus / "train") == IDENTITY_TOKENS
    monkeypatch.setattr(synth, "espeak", fake_espeak)
    plain = tmp_path / "plain"
    synthesise(plain, 0.01, 3, eval_hours=0.01, min_minutes=0.5, max_minutes=0.6, jobs=1, splits=("test",))
    args = json.loads((plain / "synth.json").read_text())["args"]
    assert list(args) == ["format_version", "hours", "eval_hours", "seed", "min_minutes", "max_minutes",
                          "meeting_fraction", "splits"]
    assert one_piece_words(plain / "test") == () and one_piece_words(tmp_path / "none" / "test") == ()
    meta = json.loads(next((plain / "meta").glob("*.json")).read_text())
    assert not [k for k in meta if k.startswith("recall")]
    with pytest.raises(ValueError, match="neither"):
        synthesise(tmp_path / "both", 0.01, 3, copy=NEAR_FAR, recall=RecallConfig(5))


def test_recall_slots_reads_the_metadata(corpus: Path) -> None:
    for split in ("train", "test"):
        recs = load_corpus(f"podcast:{corpus / split}", strict=True)
        slots = recall_slots(recs)
        assert slots is not None and sum(len(v) for v in slots.values()) > 0
        for rec in recs:
            meta = json.loads((corpus / "meta" / f"{rec.id}.json").read_text())
            check_recording(list(rec.words), meta)
            assert [s.index for s in slots[rec.id]] == [s["index"] for s in meta["recall_slots"]]


def test_a_tokenizer_keeps_every_identity_token_one_piece(corpus: Path, tmp_path: Path) -> None:
    recs = load_corpus(f"podcast:{corpus / 'train'}")
    texts = [" ".join(w.text for w in r.words) for r in recs]
    tok = Tokenizer.train(texts, 48, tmp_path / "t.model", symbols=one_piece_words(corpus / "train"))
    for t in IDENTITY_TOKENS:
        assert tok.sp.encode(t, out_type=str) == ["\u2581" + t], t
        assert tok.sp.encode(f"the {t} letter", out_type=str).count("\u2581" + t) == 1
    assert tok.decode(tok.encode("letter zed")) == "letter zed"
    plain = Tokenizer.train(texts, 48)
    assert Tokenizer.train(texts, 48, symbols=()).to_bytes() == plain.to_bytes()


def test_tokenizer_without_symbols_is_byte_identical() -> None:
    """Hashes of models the tokenizer wrote before ``symbols`` existed (sentencepiece 0.2.3)."""
    import random

    from asr_core.data.synth.text import SentenceMaker

    maker = SentenceMaker(random.Random(3), "music")
    texts = [" ".join(maker.sentence()) for _ in range(300)]
    for size, h in ((48, "6ee0eede5b404269"), (200, "c0605fee3a3510c0")):
        assert hashlib.sha256(Tokenizer.train(texts, size).to_bytes()).hexdigest()[:16] == h
    with pytest.raises(ValueError, match="not one word"):
        Tokenizer.train(texts, 48, symbols=("two words",))


def test_key_edits_change_only_the_key_tokens(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(synth, "espeak", fake_espeak_spelt)
    split = corpus / "test"
    recs = load_corpus(f"podcast:{split}")
    rr = Rerenderer(split)
    assert rr.copy == NEAR_FAR and rr.recall is None
    assert rr.edit_for(recs[0], "swap") is None  # index 0 of an evaluation split: no key
    rec = recs[1]
    meta = json.loads((corpus / "meta" / f"{rec.id}.json").read_text())
    keys = sorted({s["key_index"] for s in meta["recall_slots"]})
    assert keys and None not in keys
    stored = load_audio(rec.audio).numpy()
    outside = np.ones(len(stored), dtype=bool)
    for i in keys:
        outside[int((rec.words[i].start - 0.001) * SAMPLE_RATE): int((rec.words[i].end + TAIL_S) * SAMPLE_RATE)] = 0
    swap = rr.edit_for(rec, "swap")
    assert isinstance(swap, CopyEdit) and swap.word == "" and swap.instead("ell") == partner("ell")
    for edit in (swap, rr.edit_for(rec, "silence")):
        assert edit is not None
        edited = rr.edited_audio(rec, edit)  # reproduces the transcript (else CorpusError)
        assert edited.shape == stored.shape
        assert np.abs(edited - stored)[outside].max() < 1e-4, edit
        for i in keys:
            span = slice(int(rec.words[i].start * SAMPLE_RATE), int(rec.words[i].end * SAMPLE_RATE))
            change = np.sqrt(np.mean((edited[span] - stored[span]) ** 2)) / np.sqrt(np.mean(stored[span] ** 2))
            assert change > 0.3, (edit, i, change)
    with pytest.raises(ValueError, match="names no word"):
        CopyEdit("swap", "ell")
    with pytest.raises(ValueError, match="key edit 'muffle'"):
        CopyEdit("muffle")


# ---- the command line ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,says", [(["--copy", "far"], "--copy: copy spec 'far'; valid: near or near,far"),
                                        (["--copy", "near,far:0-9"], "--copy: copy spec 'near,far:0-9'; valid"),
                                        (["--copy", "near,x"], "valid: near or near,far"),
                                        (["--copy", "near", "--recall", "5"], "--copy: not with --recall"),
                                        (["--copy", "near,far", "--cue", "2"], "--copy: not with --cue")])
def test_cli_refuses_bad_copy_options(tmp_path: Path, extra: list[str], says: str) -> None:
    run = subprocess.run([sys.executable, "-m", "asr_core", "synth", "--out", str(tmp_path / "x"), "--hours", "0.01",
                          *extra], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "x").exists()
