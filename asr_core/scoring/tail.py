"""The tail-word error rate: errors on the rare words of a text only, as the long-tail LM paper reports it next to
the overall WER ("Tail-1" in its tables).

The paper's definition: tail tokens are the tokens "whose accumulated frequency in the training corpus is lower than
a threshold", set to 5% ("the frequency ratio of head and tail tokens is 95:5"); the tail token error rate is
computed "by only counting errors on tail tokens and ignoring errors on other tokens within the same testing
utterances". For English it takes 1-gram word-level tail tokens. A word the training text never says has frequency
0, the rarest there is: by that definition it is a tail word ("unseen" words: names, numbers and terms of other
texts), and so it is here by default (``unseen="tail"``); ``unseen="head"`` is the older count, where only words of
the training text can be tail words (the set records which, and so does the run's tag).

Here:

* :func:`tail_set` takes the rarest word types of a text (normalised with Whisper's normaliser,
  :func:`asr_core.scoring.score.normalise`, as the WER is) whose counts add up to at most ``share`` of its words:
  a :class:`TailSet`, kept as JSON next to the results (:meth:`TailSet.write`, :meth:`TailSet.read`).
* :func:`tail_counts` aligns a hypothesis with its reference as :func:`asr_core.scoring.score.align_counts` does
  (jiwer's Levenshtein alignment of the normalised words) and counts the errors on tail words only
  (:class:`TailCounts`); :func:`corpus_tail_rate` pools them over recordings.
* :func:`share_of` is the share of the test references' words that are tail words, recorded with the rates (the
  training text's tail need not make up 5% of a test set); :func:`describe` is that record, the run's tag
  ``eval.tail`` (:data:`asr_core.contract.metrics.TAIL_TAG`).

``python -m asr_core tailset TEXT --out FILE.json [--share 0.05]`` (:func:`cli`) writes the tail set of a text:
``TEXT`` is a plain text file (one sentence or document a line) or a corpus spec ``[NAME=]FORMAT:PATH`` (its
transcripts, read without audio). ``evaluate --tail FILE.json`` and ``score --tail FILE.json`` then report the
tail-word error rate beside the WER.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jiwer

from asr_core.scoring.score import normalise

DEFAULT_SHARE = 0.05  # the paper's threshold: head and tail tokens in the ratio 95:5
UNSEEN_TAIL = "tail"  # a word the training text never says is a tail word (frequency 0: the paper's definition)
UNSEEN_HEAD = "head"  # it is not (only the training text's rare words are): the older count
UNSEEN = (UNSEEN_TAIL, UNSEEN_HEAD)


@dataclass(frozen=True)
class TailSet:
    """The tail words of a text: ``words`` (normalised word types), ``source`` (the name or path of the text they
    were computed from), ``share`` (the threshold: the most of the text's words the tail may make up),
    ``total_words`` (the number of words of that text) and ``tail_share`` (the share of them that are tail words,
    at most ``share``); ``head``: the text's other word types (None for a set written before sets kept them), and
    ``unseen``: whether a word outside the text is a tail word (:data:`UNSEEN_TAIL`, needs ``head``) or not
    (:data:`UNSEEN_HEAD`). ``word in tail`` answers for any word; ``words`` lists the text's tail types only."""

    words: frozenset[str]
    source: str = ""
    share: float = DEFAULT_SHARE
    total_words: int = 0
    tail_share: float = 0.0
    head: frozenset[str] | None = None
    unseen: str = UNSEEN_HEAD

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", frozenset(self.words))
        if self.head is not None:
            object.__setattr__(self, "head", frozenset(self.head))
        if self.unseen not in UNSEEN:
            raise ValueError(f"unseen {self.unseen!r}: one of {', '.join(UNSEEN)}")
        if self.unseen == UNSEEN_TAIL and self.head is None:
            raise ValueError("unseen words can count as tail words only in a set that knows the text's other words "
                             "(head); recompute it with python -m asr_core tailset TEXT --out FILE")
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"tail share {self.share!r} must lie strictly between 0 and 1 (the paper uses 0.05)")
        if self.total_words < 0:
            raise ValueError(f"total_words {self.total_words!r} must not be negative")
        if not 0.0 <= self.tail_share <= 1.0:
            raise ValueError(f"tail_share {self.tail_share!r} must lie between 0 and 1")

    def __contains__(self, word: object) -> bool:
        if word in self.words:
            return True
        return self.unseen == UNSEEN_TAIL and self.head is not None and word not in self.head

    def __len__(self) -> int:
        return len(self.words)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, the words sorted (the same set gives the same file)."""
        out: dict[str, Any] = {"source": self.source, "share": self.share, "total_words": self.total_words,
                               "tail_share": self.tail_share, "words": sorted(self.words)}
        if self.head is not None:  # a set of before head words were kept reads and writes as it was
            out.update(unseen=self.unseen, head=sorted(self.head))
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "TailSet":
        """The inverse of :meth:`to_dict`; ValueError saying what is wrong when ``data`` is not such a dict."""
        if not isinstance(data, dict):
            raise ValueError(f"a tail set is a JSON object, not {type(data).__name__}")
        missing = [k for k in ("words", "share", "total_words", "tail_share") if k not in data]
        if missing:
            raise ValueError(f"a tail set needs the keys {missing}")
        words, share, total, covered = data["words"], data["share"], data["total_words"], data["tail_share"]
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError("a tail set's 'words' must be a list of strings")
        for name, value in (("share", share), ("tail_share", covered)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"a tail set's {name!r} must be a number, not {value!r}")
        if isinstance(total, bool) or not isinstance(total, int):
            raise ValueError(f"a tail set's 'total_words' must be an integer, not {total!r}")
        source = data.get("source", "")
        if not isinstance(source, str):
            raise ValueError(f"a tail set's 'source' must be a string, not {source!r}")
        head = data.get("head")
        if head is not None and (not isinstance(head, list) or not all(isinstance(w, str) for w in head)):
            raise ValueError("a tail set's 'head' must be a list of strings")
        unseen = data.get("unseen", UNSEEN_HEAD)
        return cls(frozenset(words), source, float(share), total, float(covered),
                   None if head is None else frozenset(head), unseen)

    def write(self, path: Path | str) -> Path:
        """Write the set as JSON to ``path`` (folders made); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def read(cls, path: Path | str) -> "TailSet":
        """The set :meth:`write` wrote to ``path``; a file that is not one raises ValueError naming it."""
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"{path} is not a tail set ({e}); recompute it from the training text with "
                             f"python -m asr_core tailset TEXT --out {path} (or asr_core.scoring.tail."
                             "tail_set(...).write(path))") from e


def _words(texts: Iterable[str]) -> list[str]:
    """The normalised words of ``texts``, each normalised as a whole (a word, a line or a transcript)."""
    if isinstance(texts, str):
        texts = [texts]
    return [w for t in texts for w in normalise(t).split()]


def tail_set(words: Iterable[str], share: float = DEFAULT_SHARE, source: str = "", unseen: str = UNSEEN_TAIL
             ) -> TailSet:
    """The tail of a text: its rarest word types that together make up at most ``share`` of its words.

    ``words``: the text, as words, lines or transcripts (one string is one text); each item is normalised with
    Whisper's normaliser (:func:`~asr_core.scoring.score.normalise`, so "Hello," and "hello" are one type) and
    split into words. Pass lines or transcripts rather than single words where it matters: the normaliser reads
    numbers and spellings across words. ``source`` names the text (kept in the set).

    Word types are sorted by count, rarest first, ties alphabetically (so the set is deterministic), and taken while
    the cumulative count stays at most ``share`` × the number of words. The type whose count would take the
    cumulative count over that is *not* included (nor is any after it): the paper defines tail tokens as those
    whose accumulated frequency is *lower than* the threshold. A cumulative count exactly at the threshold is
    included (the paper's "95:5"). So the tail's share is at most ``share``, and of equally rare types on the
    threshold only the alphabetically first ones are taken. ``unseen``: whether words the text never says are tail
    words (:data:`UNSEEN_TAIL`, the paper's definition: frequency 0) or not (:data:`UNSEEN_HEAD`).

    An empty text, a share outside (0, 1) or another ``unseen`` raises ValueError.
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"tail share {share!r} must lie strictly between 0 and 1 (the paper uses 0.05)")
    if unseen not in UNSEEN:
        raise ValueError(f"unseen {unseen!r}: one of {', '.join(UNSEEN)}")
    counts = Counter(_words(words))
    total = sum(counts.values())
    if not total:
        raise ValueError(f"the text {source or '(unnamed)'} has no words after normalisation; pass the training "
                         "text's lines or transcripts")
    budget = share * total
    taken: list[str] = []
    cumulative = 0
    for word, n in sorted(counts.items(), key=lambda kv: (kv[1], kv[0])):
        if cumulative + n > budget:
            break
        cumulative += n
        taken.append(word)
    return TailSet(frozenset(taken), source, share, total, cumulative / total, frozenset(counts) - set(taken), unseen)


@dataclass(frozen=True)
class TailCounts:
    """Errors on the tail words of one hypothesis against its reference: ``words`` (tail words in the reference),
    ``substitutions`` and ``deletions`` (of them), ``insertions`` (inserted hypothesis words that are tail words)."""

    words: int
    substitutions: int
    deletions: int
    insertions: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def rate(self) -> float:
        """Percent of the reference's tail words; NaN when it has none (no rate is defined)."""
        return 100.0 * self.errors / self.words if self.words else math.nan

    def __add__(self, other: "TailCounts") -> "TailCounts":
        return TailCounts(self.words + other.words, self.substitutions + other.substitutions,
                          self.deletions + other.deletions, self.insertions + other.insertions)


TAIL_ZERO = TailCounts(0, 0, 0, 0)


def tail_counts(ref: str, hyp: str, tail: TailSet, *, normalised: bool = False) -> TailCounts:
    """Errors on tail words of ``hyp`` against ``ref`` (both normalised here unless ``normalised``).

    The alignment is the one :func:`~asr_core.scoring.score.align_counts` counts (jiwer's, of the normalised
    words). Counted, as the paper counts "only errors on tail tokens":

    * a reference tail word the alignment substitutes (a substitution) or deletes (a deletion);
    * an inserted hypothesis word that is itself a tail word (an insertion). An inserted word has no reference word,
      so it is a tail error only when the word inserted is a tail word; other insertions are ignored.

    Ignored: every error on a reference word outside the tail, including a substitution of a head word by a tail
    word (that is an error on a head token).
    """
    if not normalised:
        ref, hyp = normalise(ref), normalise(hyp)
    r, h = ref.split(), hyp.split()
    words = sum(w in tail for w in r)
    if not r or not h:  # jiwer needs words on both sides; everything is deleted or inserted
        return TailCounts(words, 0, words, sum(w in tail for w in h))
    subs = dels = ins = 0
    for chunk in jiwer.process_words(" ".join(r), " ".join(h)).alignments[0]:
        if chunk.type == "substitute":
            subs += sum(w in tail for w in r[chunk.ref_start_idx:chunk.ref_end_idx])
        elif chunk.type == "delete":
            dels += sum(w in tail for w in r[chunk.ref_start_idx:chunk.ref_end_idx])
        elif chunk.type == "insert":
            ins += sum(w in tail for w in h[chunk.hyp_start_idx:chunk.hyp_end_idx])
    return TailCounts(words, subs, dels, ins)


def total_tail(counts: Iterable[TailCounts]) -> TailCounts:
    """The sum of ``counts``."""
    out = TAIL_ZERO
    for c in counts:
        out = out + c
    return out


def corpus_tail_rate(counts: Iterable[TailCounts]) -> float:
    """Percent: all tail errors over all reference tail words (pooled, not the mean of per-recording rates); NaN
    when the references have no tail word."""
    return total_tail(counts).rate


def share_of(references: Iterable[str], tail: TailSet) -> float:
    """The share (0 to 1) of the normalised words of ``references`` (one string is one reference) that are words
    of ``tail``; NaN when they have no words."""
    words = _words(references)
    return sum(w in tail for w in words) / len(words) if words else math.nan


def load_tail(path: Path | str, option: str = "--tail") -> TailSet:
    """The tail set in the file ``path`` (given as ``option``); a missing file raises FileNotFoundError and one that
    is no tail set ValueError, each naming the file and how to make one."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "not found"
        raise FileNotFoundError(f"{option} {path}: {what}; give a tail set's JSON file, made with "
                                f"python -m asr_core tailset TEXT --out {path}")
    try:
        return TailSet.read(path)
    except ValueError as e:
        raise ValueError(f"{option} {e}") from None


def describe(tail: TailSet, references: Mapping[str, Iterable[str]]) -> str:
    """The record of a tail set beside its rates (JSON, keys sorted): ``source``, ``share`` (the threshold),
    ``types`` (tail word types of the text), ``unseen`` (whether words outside the text count as tail words),
    ``share_of_text`` (of the text it was computed from) and ``share_of_refs`` (``{dataset: share}``,
    :func:`share_of` the dataset's ``references``; null where they have no words)."""
    refs = {name: share_of(list(texts), tail) for name, texts in references.items()}
    return json.dumps({"source": tail.source, "share": tail.share, "types": len(tail), "unseen": tail.unseen,
                       "share_of_text": tail.tail_share,
                       "share_of_refs": {k: None if math.isnan(v) else v for k, v in refs.items()}}, sort_keys=True)


def text_of(text: str) -> list[str]:
    """The lines of a plain text file ``text``, or the transcripts of a corpus spec ``[NAME=]FORMAT:PATH``. An
    existing file is read as text; errors name the file or spec (CorpusError, a ValueError, for a corpus)."""
    from asr_core.contract.specs import CORPUS_FORMATS, CorpusError, split_named_spec

    path = Path(text)
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"TEXT {text}: cannot be read as UTF-8 text ({e})") from None
    try:
        split_named_spec(text)
    except CorpusError:
        raise FileNotFoundError(f"TEXT {text}: no such file, nor a corpus spec [NAME=]FORMAT:PATH (formats: "
                                f"{', '.join(CORPUS_FORMATS)}); give a text file with one sentence or document a "
                                "line, or e.g. podcast:data/train") from None
    from asr_core.data.corpora import load_corpus

    return [r.text for r in load_corpus(text, audio=False)]


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m asr_core tailset",
                                 description="write the tail words of a text (paper 002: its rarest word types, "
                                             "making up at most --share of its words) as JSON, for evaluate --tail "
                                             "and score --tail")
    ap.add_argument("text", metavar="TEXT", help="a text file (one sentence or document a line) or a corpus spec "
                    "[NAME=]FORMAT:PATH (its transcripts, read without audio)")
    ap.add_argument("--out", type=Path, required=True, metavar="FILE.json", help="where the tail set is written")
    ap.add_argument("--share", type=float, default=DEFAULT_SHARE,
                    help=f"the most of the text's words the tail may make up (default {DEFAULT_SHARE:g}, the paper's)")
    ap.add_argument("--unseen", choices=UNSEEN, default=UNSEEN_TAIL,
                    help="a word the text never says is a tail word (tail, the default: frequency 0, the paper's "
                         "definition) or not (head: only the text's rare words are, the older count)")
    a = ap.parse_args(argv)
    from asr_core.contract.specs import CorpusError

    try:
        if not 0.0 < a.share < 1.0:
            raise ValueError(f"--share {a.share!r}: give a fraction strictly between 0 and 1 (the paper uses 0.05)")
        if a.out.is_dir():
            raise ValueError(f"--out {a.out} is a folder; give the path of a JSON file, e.g. {a.out / 'tail.json'}")
        tail = tail_set(text_of(a.text), a.share, source=a.text, unseen=a.unseen)
    except (CorpusError, ValueError, FileNotFoundError) as e:
        print(f"tailset: {e}", file=sys.stderr)
        return 2
    tail.write(a.out)
    if not len(tail):
        print(f"tailset: no word type of {a.text} is rare enough to fit in --share {a.share:g} of its "
              f"{tail.total_words} words: the tail is empty and its error rate undefined; give a larger text or "
              "a larger --share", file=sys.stderr)
    unseen = "and every word it never says" if tail.unseen == UNSEEN_TAIL else "(words it never says are not)"
    print(f"tailset: {len(tail)} tail word types, {tail.tail_share:.2%} of the {tail.total_words} words of "
          f"{a.text} (share {tail.share:g}), {unseen}; written to {a.out}")
    return 0
