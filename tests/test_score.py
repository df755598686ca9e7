"""Scoring: Whisper's normaliser, S/D/I counts per recording, corpus WER."""

from __future__ import annotations

import random

import pytest
from whisper.normalizers import EnglishTextNormalizer

from asr_core.scoring.score import Counts, align_counts, corpus_wer, normalise, score, total

TRICKY = ["Hello, Mr. Smith! It's twenty-five dollars.", "I'd say uh 3 o'clock, colour vs color", "<laugh> [noise] "
          "(inaudible) well... OK", "The 1st of March, 2021: 10% off", "Ünïcödé café naïve", ""]


@pytest.mark.parametrize("text", TRICKY)
def test_normalisation_is_whispers(text: str) -> None:
    assert normalise(text) == " ".join(EnglishTextNormalizer()(text).split())


def test_counts_of_a_known_alignment() -> None:
    c = align_counts("the cat sat on the mat", "the bat sat on the mat today")
    assert (c.ref_words, c.substitutions, c.deletions, c.insertions, c.hyp_words) == (6, 1, 0, 1, 7)
    assert c.errors == 2 and c.wer == pytest.approx(100 * 2 / 6)
    c = align_counts("the cat sat on the mat", "the sat on mat")
    assert (c.substitutions, c.deletions, c.insertions) == (0, 2, 0)


def test_normalisation_applies_to_both_sides() -> None:
    c = score("Mr. Smith paid twenty-five dollars.", "mister smith paid $25")
    assert c.errors == 0 and c.ref_words == 4


def test_empty_sides() -> None:
    assert align_counts("", "a b") == Counts(0, 0, 0, 2, 2)
    assert align_counts("a b c", "") == Counts(3, 0, 3, 0, 0)
    assert align_counts("", "") == Counts(0, 0, 0, 0, 0)


def _edit_distance(r: list[str], h: list[str]) -> int:
    d = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(h) + 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
    return d[-1]


def test_errors_equal_an_independent_edit_distance() -> None:
    rng = random.Random(0)
    vocab = "a b c d e".split()
    for _ in range(200):
        r = [rng.choice(vocab) for _ in range(rng.randint(1, 12))]
        h = [rng.choice(vocab) for _ in range(rng.randint(1, 12))]
        c = align_counts(" ".join(r), " ".join(h))
        assert c.errors == _edit_distance(r, h)
        assert c.ref_words - c.deletions + c.insertions == c.hyp_words


def test_per_recording_counts_sum_to_the_corpus_wer() -> None:
    pairs = [("we saw a red car and a blue van near home", "we saw a red car and a blue van near"),
             ("alpha beta", "gamma delta epsilon")]
    counts = [score(r, h) for r, h in pairs]
    t = total(counts)
    assert corpus_wer(counts) == pytest.approx(100 * sum(c.errors for c in counts) / sum(c.ref_words for c in counts))
    assert corpus_wer(counts) == pytest.approx(100 * 4 / 13)
    assert t.ref_words == 13 and t.errors == 4
    mean_of_rates = sum(c.wer for c in counts) / len(counts)
    assert mean_of_rates != pytest.approx(corpus_wer(counts))  # the corpus WER is not a mean of rates
