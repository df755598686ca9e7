"""Word error rates as the papers report them: Whisper's English normaliser on both sides, then a Levenshtein
alignment per recording (jiwer), and corpus WER = all errors / all reference words.

Per-recording substitution, deletion, insertion and reference-word counts are kept, not just rates: the
significance tests (recording as the unit, paired over models) and the per-recording CSV need them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import jiwer


@lru_cache(maxsize=1)
def _normaliser():  # importing whisper takes about a second; only pay for it when scoring
    from whisper.normalizers import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalise(text: str) -> str:
    """Whisper's ``EnglishTextNormalizer`` (spellings, numbers, contractions, fillers, punctuation), whitespace
    collapsed."""
    return " ".join(_normaliser()(text).split())


@dataclass(frozen=True)
class Counts:
    """Alignment counts of one hypothesis against its reference."""

    ref_words: int
    substitutions: int
    deletions: int
    insertions: int
    hyp_words: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        """Percent; NaN for an empty reference (no rate is defined)."""
        return 100.0 * self.errors / self.ref_words if self.ref_words else math.nan

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.ref_words + other.ref_words, self.substitutions + other.substitutions,
                      self.deletions + other.deletions, self.insertions + other.insertions,
                      self.hyp_words + other.hyp_words)


ZERO = Counts(0, 0, 0, 0, 0)


def align_counts(ref: str, hyp: str) -> Counts:
    """S/D/I counts of ``hyp`` against ``ref``, both already normalised (whitespace-separated words)."""
    r, h = ref.split(), hyp.split()
    if not r or not h:  # jiwer needs words on both sides; the answer is plain here
        return Counts(len(r), 0, len(r), len(h), len(h))
    out = jiwer.process_words(" ".join(r), " ".join(h))
    return Counts(len(r), out.substitutions, out.deletions, out.insertions, len(h))


def score(ref: str, hyp: str, *, normalised: bool = False) -> Counts:
    """Counts after Whisper normalisation of both sides (skipped when ``normalised``)."""
    if not normalised:
        ref, hyp = normalise(ref), normalise(hyp)
    return align_counts(ref, hyp)


def total(counts: Iterable[Counts]) -> Counts:
    out = ZERO
    for c in counts:
        out = out + c
    return out


def corpus_wer(counts: Iterable[Counts]) -> float:
    """Percent: the sum of errors over the sum of reference words (not the mean of per-recording WERs)."""
    return total(counts).wer
