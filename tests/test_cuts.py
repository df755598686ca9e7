"""data.cut: training windows cut at fixed multiples of the context (words straddling a cut dropped) or moved back
to the start of the word they would split (``pauses``); and lost_to_cuts, the share of words and speech that either
way drops, which every training run logs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from asr_core.config import DataConfig, preset
from asr_core.config.parse import ConfigError
from asr_core.data.chunking import (CUT_BOUND_S, MIN_TAIL_S, WindowStream, cut_windows, lost_to_cuts, pause_bounds,
                                    window_bounds)
from asr_core.data.corpora.base import Recording, Word
from asr_core.contract.identity import trial_key


def _speech(seed: int, duration: float, gap: tuple[float, float] = (0.05, 0.4)) -> Recording:
    """Words of 0.15-0.7 s separated by pauses drawn from ``gap``, to ``duration``."""
    rng = random.Random(seed)
    words, t = [], rng.uniform(0.0, 0.5)
    while True:
        end = t + rng.uniform(0.15, 0.7)
        if end > duration:
            break
        words.append(Word(f"w{len(words)}", round(t, 3), round(end, 3)))
        t = end + rng.uniform(*gap)
    return Recording(f"r{seed}", Path(f"/nowhere/r{seed}.wav"), duration, tuple(words))


def _inside(w: Word, bounds: list[tuple[float, float]]) -> bool:
    return any(a <= w.start + 1e-9 and w.end <= b + 1e-9 for a, b in bounds)


@pytest.mark.parametrize("seq", [5.12, 10.24, 20.48])
def test_pause_cuts_drop_no_word_and_keep_windows_within_the_context(seq: float) -> None:
    for seed in range(20):
        rec = _speech(seed, 95.0)
        bounds = pause_bounds(rec.words, rec.duration, seq)
        assert bounds[0][0] == 0.0 and bounds[-1][1] == rec.duration or rec.duration - bounds[-1][1] < MIN_TAIL_S
        assert all(b1 == a2 for (_, b1), (a2, _) in zip(bounds, bounds[1:]))  # contiguous
        assert all(b - a <= seq + 1e-9 for a, b in bounds)
        assert all(b - a >= seq - CUT_BOUND_S - 1e-9 for a, b in bounds[:-1])
        assert all(_inside(w, bounds) for w in rec.words), seed
        fixed = window_bounds(rec.duration, seq)
        assert sum(not _inside(w, fixed) for w in rec.words) > 0 or seq > 20  # fixed cuts do drop words


def test_a_cut_moves_to_the_start_of_the_word_it_splits_and_overlaps_are_followed() -> None:
    words = [Word("a", 0.2, 0.6), Word("b", 0.7, 1.3), Word("c", 1.2, 2.2), Word("d", 2.3, 2.9)]
    # the cut at 2.0 falls in c, which starts inside b: back to b's start
    assert pause_bounds(words, 4.0, 2.0)[0] == (0.0, 0.7)
    assert pause_bounds(words, 4.0, 2.0, bound_s=1.0)[0] == (0.0, 2.0)  # b began more than 1 s before: stays


def test_a_word_longer_than_the_bound_is_dropped_as_fixed_cuts_drop_it() -> None:
    words = [Word("long", 1.0, 4.5), Word("b", 4.6, 5.0)]
    assert pause_bounds(words, 8.0, 4.0) == [(0.0, 4.0), (4.0, 8.0)]
    assert lost_to_cuts([Recording("r", Path("/x"), 8.0, tuple(words))], 4.0, "pauses")["words_lost_pct"] == 50.0


def test_lost_to_cuts_by_hand() -> None:
    rec = Recording("r", Path("/x"), 4.0, (Word("a", 0.2, 0.6), Word("b", 0.7, 1.3), Word("c", 1.35, 2.2),
                                          Word("d", 2.3, 2.9), Word("e", 3.0, 3.8)))
    fixed = lost_to_cuts([rec], 1.0)
    assert fixed["words_lost_pct"] == pytest.approx(40.0)  # b and c straddle the cuts at 1 and 2 s
    assert fixed["speech_lost_pct"] == pytest.approx(100 * (0.6 + 0.85) / 3.25)
    assert lost_to_cuts([rec], 1.0, "pauses")["words_lost_pct"] == 0.0
    untimed = Recording("u", Path("/x"), 4.0, (Word("hi"),))
    assert lost_to_cuts([untimed], 1.0)["recordings"] == 0.0


def test_lost_to_cuts_samples_a_large_corpus_evenly() -> None:
    recs = [_speech(i, 30.0) for i in range(50)]
    assert lost_to_cuts(recs, 5.12, sample=10)["recordings"] == 10.0
    assert lost_to_cuts(recs, 5.12)["recordings"] == 50.0


@pytest.mark.parametrize("batching", ["interleaved", "consecutive"])
def test_a_pause_cut_stream_counts_the_steps_it_takes(batching: str) -> None:
    recs = [_speech(i, 20.0 + 9 * i) for i in range(8)]
    data = DataConfig(context_s=5.12, batch_audio_s=20.48, seqlen_warmup="none", batching=batching, cut="pauses")
    s = WindowStream(recs, data, seed=1)
    batches = list(s.batches())
    assert len(batches) == s.count_steps()
    texts = [w.text for step, _ in batches for w in step]
    assert sum(len(t.split()) for t in texts) == sum(len(r.words) for r in recs)  # every word trained
    fixed = WindowStream(recs, DataConfig(context_s=5.12, batch_audio_s=20.48, seqlen_warmup="none",
                                          batching=batching), seed=1)
    assert sum(len(w.text.split()) for step, _ in fixed.batches() for w in step) < sum(len(r.words) for r in recs)


def test_cut_is_science_validated_and_fixed_keeps_every_key() -> None:
    base = preset("tiny")
    assert trial_key(base) == trial_key(base.with_overrides(["data.cut=fixed"]))
    assert trial_key(base) != trial_key(base.with_overrides(["data.cut=pauses"]))
    with pytest.raises(ConfigError, match="data.cut.*'fixed', 'pauses'"):
        base.with_overrides(["data.cut=words"])


def test_cut_windows_in_pause_mode_keeps_each_words_text_once() -> None:
    rec = _speech(3, 40.0)
    wins = cut_windows(rec, 0, 5.12, "pauses")
    assert " ".join(w.text for w in wins).split() == [w.text for w in rec.words]


def test_pause_cuts_are_refused_for_a_corpus_without_word_times(tmp_path) -> None:
    from asr_core.contract.specs import CorpusError
    from asr_core.training.train import train

    untimed = [Recording(f"u{i}", Path(f"/nowhere/u{i}.wav"), 4.0, (Word("hi"), Word("there"))) for i in range(2)]
    cfg = preset("tiny").with_overrides(["data.cut=pauses", "data.context_s=5.12", "data.batch_audio_s=10.24",
                                         "data.seqlen_warmup=none", "train.max_steps=1"])
    with pytest.raises(CorpusError, match="data.cut=pauses needs word times.*'u0'"):
        train(cfg, tmp_path / "run", recordings=untimed)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["fixed", "pauses"])
def test_every_training_run_logs_what_its_cuts_drop(tmp_path, cut: str) -> None:
    from mlflow.tracking import MlflowClient

    from asr_core.contract.metrics import SPEECH_LOST, WORDS_LOST
    from asr_core.training.train import train
    from tests.test_train import make_corpus

    recs = make_corpus(tmp_path / "corpus", 6, words_per=(8, 12))  # 3-6 s recordings: cuts at 2.56 s split words
    cfg = preset("tiny").with_overrides(["data.context_s=2.56", "data.batch_audio_s=10.24", "data.seqlen_warmup=none",
                                         f"data.cut={cut}", "model.vocab_size=48", "train.max_steps=1",
                                         "train.warmup_steps=1", "train.checkpoint_every=100"])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = train(cfg, tmp_path / "run", recordings=recs, tracking_uri=uri, experiment="cuts")
    client = MlflowClient(uri)
    want = lost_to_cuts(recs, 2.56, cut)
    for key, name in ((WORDS_LOST, "words_lost_pct"), (SPEECH_LOST, "speech_lost_pct")):
        (m,) = client.get_metric_history(result.run_id, key)
        assert m.step == 0 and m.value == pytest.approx(want[name])
    if cut == "fixed":
        assert want["words_lost_pct"] > 0
    else:
        assert want["words_lost_pct"] == 0.0
