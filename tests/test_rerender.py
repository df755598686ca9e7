"""The causal check's re-rendering (:mod:`asr_core.data.synth.rerender`): a recording of a corpus with the recall
plant rendered again from the corpus's stamp reproduces its audio; with the key swapped or silenced, only the clear
mentions' spans (and the room's reverberation tail after them) change; what cannot be re-rendered is refused."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

import asr_core.data.synth.generate as synth
import asr_core.data.synth.cli as synth_cli
from asr_core.contract.specs import CorpusError
from asr_core.data.audio import SAMPLE_RATE, load_audio
from asr_core.data.corpora import load_corpus
from asr_core.data.synth.recall import CODE_WORDS, KeyEdit, swap_word
from asr_core.data.synth.rerender import Rerenderer

TAIL_S = 0.6  # after an edited span: the room's reverberation (at most 0.25 s) and its filters


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rerender") / "corpus"
    with contextlib.redirect_stdout(io.StringIO()):
        assert synth_cli.cli(["--out", str(out), "--hours", "0.01", "--eval-hours", "0.022", "--min-minutes", "0.6",
                          "--max-minutes", "0.75", "--splits", "test", "--seed", "4", "--recall", "5"]) == 0
    return out / "test"


def _clear_spans(split: Path, rec_id: str, words: list) -> list[tuple[float, float]]:
    meta = json.loads((split.parent / "meta" / f"{rec_id}.json").read_text())
    assert meta["recall_key"] and meta["recall_clear"]
    return [(words[i].start, words[i].end) for i in meta["recall_clear"]]


def test_key_edits_change_only_the_clear_mentions(corpus: Path) -> None:
    first, rec = load_corpus(f"podcast:{corpus}")[:2]  # the first recording of a split says no key: nothing to edit
    assert Rerenderer(corpus).edit_for(first, "swap") is None
    stored = load_audio(rec.audio).numpy()
    rr = Rerenderer(corpus)
    wave, words, _, _ = synth.render(rr.plans[rec.id], recall=rr.recall)
    assert np.abs(wave - stored).max() < 1e-4  # the stamp makes the same recording (16-bit rounding aside)
    spans = _clear_spans(corpus, rec.id, list(rec.words))
    outside = np.ones(len(stored), dtype=bool)
    for a, e in spans:
        outside[int((a - 0.001) * SAMPLE_RATE): int((e + TAIL_S) * SAMPLE_RATE)] = False  # times: whole ms
    swap = rr.edit_for(rec, "swap")
    assert swap is not None and swap.word in CODE_WORDS and swap.word != words[clear_index(corpus, rec.id)].text
    for edit in (swap, rr.edit_for(rec, "silence")):
        assert edit is not None
        edited = rr.edited_audio(rec, edit)
        assert edited.shape == stored.shape
        assert np.abs(edited - stored)[outside].max() < 1e-4, edit  # all else equal
        for a, e in spans:
            span = slice(int(a * SAMPLE_RATE), int(e * SAMPLE_RATE))
            change = np.sqrt(np.mean((edited[span] - stored[span]) ** 2)) / np.sqrt(np.mean(stored[span] ** 2))
            assert change > 0.3, (edit, a, e, change)  # the word itself is said otherwise
            if edit.mode == "silence":
                assert np.sqrt(np.mean(edited[span] ** 2)) < 0.5 * np.sqrt(np.mean(stored[span] ** 2))


def clear_index(split: Path, rec_id: str) -> int:
    return json.loads((split.parent / "meta" / f"{rec_id}.json").read_text())["recall_clear"][0]


def test_key_edit_and_swap_word_rules() -> None:
    assert swap_word("banjo", {w: 100 + 10 * i for i, w in enumerate(CODE_WORDS)}) == "falcon"
    assert swap_word("gecko", {w: 100 for w in CODE_WORDS}) == "banjo"  # a tie: the earlier code word
    with pytest.raises(ValueError, match="key edit 'muffle'"):
        KeyEdit("muffle")
    with pytest.raises(ValueError, match="a swap names one of the code words"):
        KeyEdit("swap", "kettle")
    with pytest.raises(ValueError, match="silence names none"):
        KeyEdit("silence", "banjo")
    assert KeyEdit("silence").audio(5, None).tolist() == [0.0] * 5
    assert len(KeyEdit("swap", "zebra").audio(7, np.ones(10, dtype=np.float32))) == 7


def test_what_cannot_be_re_rendered_is_refused(corpus: Path, tmp_path: Path) -> None:
    copy = tmp_path / "c"
    for sub in ("test", "meta"):
        (copy / sub).mkdir(parents=True)
        for f in (corpus.parent / sub).iterdir():
            (copy / sub / f.name).write_bytes(f.read_bytes())
    with pytest.raises(CorpusError, match="no readable synth stamp"):
        Rerenderer(copy / "test")
    stamp = json.loads((corpus.parent / "synth.json").read_text())
    del stamp["args"]["recall"]
    (copy / "synth.json").write_text(json.dumps(stamp))
    with pytest.raises(CorpusError, match="has no recall plant"):
        Rerenderer(copy / "test")
    (copy / "synth.json").write_text((corpus.parent / "synth.json").read_text())
    transcript = sorted((copy / "test").glob("*.json"))[1]  # a recording that says its key
    doc = json.loads(transcript.read_text())
    first = doc["results"][0]["alternatives"][0]["words"][0]
    first["startTime"] = f"{float(first['startTime'][:-1]) + 0.2:.3f}s"  # a word time the audio does not have
    transcript.write_text(json.dumps(doc))
    rec = next(r for r in load_corpus(f"podcast:{copy / 'test'}") if Path(r.meta["transcript"]) == transcript)
    rr = Rerenderer(copy / "test")
    edit = rr.edit_for(rec, "silence")
    assert edit is not None
    with pytest.raises(CorpusError, match="does not reproduce its transcript"):
        rr.edited_audio(rec, edit)
