"""The trainer's own rules for what it trains on (:mod:`asr_core.data.step_plan`: ``trainer_order``,
``training_stream``, ``corpus_durations``), which the trainer and the budget both call: one copy, so that the budget
replays the steps the trainer takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from asr_core.config import preset
from asr_core.data.corpora import load_corpus, manifest
from asr_core.data.corpora.base import Recording, Word
from asr_core.data.step_plan import REPEAT, corpus_durations, trainer_order, training_stream
from orchestrate.budget.corpus import training_corpus

# listed out of order on purpose: (id, seconds, every word timed)
LISTED = [("c", 2.0, True), ("a", 3.5, True), ("d", 1.0, False), ("b", 2.5, True)]


def _corpus(tmp_path: Path) -> Path:
    """A manifest corpus listing :data:`LISTED` in that order (audio of noise, one word each, timed or not)."""
    recs = []
    for rid, seconds, timed in LISTED:
        wav = tmp_path / f"{rid}.wav"
        sf.write(str(wav), np.random.default_rng(0).standard_normal(int(seconds * 16000)) * 0.01, 16000)
        word = Word("x", 0.1, 0.3) if timed else Word("x", None, None)
        recs.append(Recording(rid, wav, seconds, (word,)))
    manifest.write(tmp_path / "m.jsonl", recs)
    return tmp_path / "m.jsonl"


def test_trainer_order_is_by_id_whatever_order_the_reader_lists() -> None:
    recs = [Recording(rid, Path(f"{rid}.wav"), seconds, ()) for rid, seconds, _ in LISTED]
    assert [r.id for r in trainer_order(recs)] == ["a", "b", "c", "d"]
    assert [r.id for r in trainer_order(list(reversed(recs)))] == ["a", "b", "c", "d"]


def test_the_budget_reads_a_corpus_as_the_trainer_orders_it(tmp_path: Path) -> None:
    path = _corpus(tmp_path)
    recs = trainer_order(load_corpus(f"manifest:{path}", audio=False))
    durations, timed, how = corpus_durations("manifest", path)
    assert [r.id for r in recs] == ["a", "b", "c", "d"]
    assert durations.tolist() == [r.duration for r in recs] == [3.5, 2.5, 2.0, 1.0]
    assert timed.tolist() == [r.timed for r in recs] == [True, True, True, False]
    assert "transcripts" in how
    budget = training_corpus(f"manifest:{path}")
    assert budget.durations.durations.tolist() == durations.tolist() and not budget.assumed


def test_training_stream_takes_the_first_recordings_and_repeats_them_under_max_steps(tmp_path: Path) -> None:
    recs = trainer_order(load_corpus(f"manifest:{_corpus(tmp_path)}", audio=False))
    cfg = preset("tiny").with_overrides(["data.max_recordings=3", "train.epochs=2", "train.max_steps=0"])
    stream = training_stream(recs, cfg)
    assert [r.id for r in stream.recordings] == ["a", "b", "c"]
    assert (stream.epochs, stream.seed, stream.data) == (2, cfg.train.seed, cfg.data)
    assert [r.id for r in training_stream(recs[:3], cfg).recordings] == ["a", "b", "c"]  # cut twice: the same
    every = training_stream(recs, cfg.with_overrides(["data.max_recordings=0", "train.max_steps=10"]))
    assert len(every.recordings) == 4 and every.epochs == REPEAT
