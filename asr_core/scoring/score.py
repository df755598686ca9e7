"""Word error rates as the papers report them: Whisper's English normaliser on both sides, then a Levenshtein
alignment per recording (jiwer), and corpus WER = all errors / all reference words.

Per-recording substitution, deletion, insertion and reference-word counts are kept, not just rates: the
significance tests (recording as the unit, paired over models) and the per-recording CSV need them.

Errors on *marked* reference words only (:func:`marked_counts`, e.g. the planted cue words of the synthetic corpus,
:mod:`asr_core.data.synth.cues`): a marked word is an error when the same alignment substitutes or deletes it;
insertions are nobody's. :func:`normalise_marked` normalises a reference word by word so the marks follow.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
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


@dataclass(frozen=True)
class MarkedCounts:
    """Errors on the marked words of one reference."""

    words: int  # marked reference words
    errors: int  # of them, substituted or deleted

    @property
    def rate(self) -> float:
        """Percent; NaN when nothing is marked."""
        return 100.0 * self.errors / self.words if self.words else math.nan


def align_counts(ref: str, hyp: str) -> Counts:
    """S/D/I counts of ``hyp`` against ``ref``, both already normalised (whitespace-separated words)."""
    r, h = ref.split(), hyp.split()
    if not r or not h:  # jiwer needs words on both sides; the answer is plain here
        return Counts(len(r), 0, len(r), len(h), len(h))
    out = jiwer.process_words(" ".join(r), " ".join(h))
    return Counts(len(r), out.substitutions, out.deletions, out.insertions, len(h))


def marked_counts(ref: Sequence[str], hyp: Sequence[str], marked: Collection[int]) -> MarkedCounts:
    """Errors on the words of ``ref`` at the indices ``marked``: each is an error when the alignment of ``hyp``
    against ``ref`` (the one :func:`align_counts` counts, jiwer's) substitutes or deletes it. ``ref`` and ``hyp``
    are normalised words; an index outside ``ref`` raises ValueError."""
    marks = set(marked)
    bad = sorted(i for i in marks if not 0 <= i < len(ref))
    if bad:
        raise ValueError(f"marked indices {bad[:5]} are outside the reference's {len(ref)} words")
    if not marks:
        return MarkedCounts(0, 0)
    if not hyp:
        return MarkedCounts(len(marks), len(marks))
    wrong: set[int] = set()
    for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
        if chunk.type in ("substitute", "delete"):
            wrong.update(range(chunk.ref_start_idx, chunk.ref_end_idx))
    return MarkedCounts(len(marks), len(marks & wrong))


def normalise_marked(words: Sequence[str], marked: Iterable[int]) -> tuple[list[str], list[int]]:
    """``words`` normalised one by one (so that indices follow them; Whisper's normaliser joins nothing across the
    synthetic corpus's words) and the indices of the ``marked`` words among the result. A marked word must stay
    one word under the normaliser (ValueError naming it otherwise); other words may vanish or split."""
    out: list[str] = []
    where: dict[int, int] = {}
    marks = set(marked)
    for i, w in enumerate(words):
        tokens = normalise(w).split()
        if i in marks:
            if len(tokens) != 1:
                raise ValueError(f"marked word {i} {w!r} normalises to {tokens}, not to one word")
            where[i] = len(out)
        out.extend(tokens)
    missing = sorted(marks - set(where))
    if missing:
        raise ValueError(f"marked indices {missing[:5]} are outside the {len(words)} words")
    return out, [where[i] for i in sorted(where)]


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
